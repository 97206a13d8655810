#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace sluice::stream {

// Token counts of one request. Responses API counts (`input_tokens`,
// `output_tokens`) are reported as prompt and completion tokens.
struct Usage {
  std::uint64_t prompt_tokens = 0;
  std::uint64_t completion_tokens = 0;
  std::uint64_t total_tokens = 0;

  friend bool operator==(const Usage&, const Usage&) = default;
};

namespace detail {

// Reads the start of a `data:` payload as it arrives and tells, as early as
// the bytes allow, that the event cannot be a usage-only chunk: the payload is
// not an object, or its top-level "choices" is anything but an empty array.
// It errs towards "cannot tell yet", which only delays bytes and never drops
// a wrong event.
class UsageOnlyProbe {
 public:
  void reset() { *this = UsageOnlyProbe{}; }
  // Consumes the next payload bytes; returns true once ruled out.
  bool rules_out(std::string_view bytes);

 private:
  enum class Stage : std::uint8_t {
    before_object,
    in_object,
    choices_value,       // after `"choices":`
    choices_first_item,  // after `"choices":[`
    after_object,
    ruled_out,
  };
  Stage stage_ = Stage::before_object;
  std::uint32_t depth_ = 0;
  bool in_string_ = false;
  bool escaped_ = false;
  bool expect_key_ = false;
  bool reading_key_ = false;
  bool key_is_choices_ = false;
  std::uint8_t key_matched_ = 0;  // leading bytes of the key that match "choices"
  bool key_mismatch_ = false;
};

// Where a line that starts at `from` ends (its first '\n' or '\r', or the
// end of `text`), and where the first quote followed by 'u' or 'e' before
// that end is. Every `"usage"` and `"error"` key begins so, and most token
// chunks have neither, so one pass over an event's bytes both ends its line
// and tells where a search for those keys can start, if anywhere. A quote
// that is the text's last byte counts too (the byte after it is unknown).
struct DataLine {
  static constexpr std::size_t kNone = static_cast<std::size_t>(-1);
  std::size_t end = 0;
  std::size_t first_key_start = kNone;

  // first_key_start counted from `line_start`, where the line's value
  // begins, or kNone.
  std::size_t key_from(std::size_t line_start) const {
    return first_key_start == kNone ? kNone : first_key_start - line_start;
  }
};
DataLine scan_data_line(std::string_view text, std::size_t from);
// The two ways scan_data_line reads, exposed so that tests can hold each to
// the same answers: sixteen bytes at a time (any x86-64, else byte by byte),
// and thirty-two, used where the processor has AVX2.
DataLine scan_data_line_sse2(std::string_view text, std::size_t from);
#if defined(__x86_64__)
bool has_avx2_line_scan();
DataLine scan_data_line_avx2(std::string_view text, std::size_t from);
#endif

}  // namespace detail

// Watches an OpenAI-style server-sent event stream as the relay forwards it,
// piece by piece, with split points anywhere (mid-line, between '\r' and
// '\n'). It never rebuilds the stream: `feed` answers with spans of the piece
// itself, and only bytes that must wait for the end of their event are copied
// aside.
//
// What it finds: the last usage object (chat and completions chunks, a
// Responses API `response.completed`, or any `usage` object nested a few
// levels deep), whether an error event went by (`event: error`, or a payload
// with a non-null top-level "error" or "type":"error"), whether `data: [DONE]`
// arrived, and the number of events. Only payloads that contain `"usage":{`
// or `"error"` are parsed as JSON; ordinary token chunks are scanned, not parsed.
//
// Stripping: with set_strip_usage_only_chunks(true), a `data:` event whose
// top-level "choices" is an empty array and whose top-level "usage" is an
// object is recorded and not passed on (the gateway asked the upstream for
// usage the client did not ask for). Bytes of an event that may still turn
// out to be such a chunk wait in a carry until its end; an event that goes
// on past the piece is released with the piece if its payload so far shows
// otherwise (e.g. `"choices":[{`), so token chunks are never delayed past
// their own piece. Without stripping nothing
// is ever held back and `feed` answers with exactly `{piece}`.
//
// Carry cap: an event that has to be carried across pieces is inspected only
// while its carried bytes stay within `max_carry`. Past that it is still
// counted but not inspected or stripped, its held bytes are released, and it
// passes through untouched; inspection resumes with the next event. An event
// contained in one piece is always inspected, whatever its size.
//
// An event left incomplete at the end of the stream is not dispatched (as SSE
// clients discard it too); finish() returns its held bytes, if any.
//
// Memory: the carry buffers are reserved on first use and reused, so a long
// stream costs no allocation per piece once they have grown to its event
// size. One scanner per stream; not thread-safe.
class SseScanner {
 public:
  static constexpr std::size_t kDefaultMaxCarry = std::size_t{1} << 20;

  explicit SseScanner(std::size_t max_carry = kDefaultMaxCarry) : max_carry_(max_carry) {}

  // Set before the first feed; a change applies from the next event on.
  void set_strip_usage_only_chunks(bool on) { strip_ = on; }

  // Scans `piece` and appends to `out` the spans to write to the client, in
  // order. They point into `piece` or into the scanner, and those into the
  // scanner stay valid until the next call to feed().
  void feed(std::string_view piece, std::vector<std::string_view>& out);
  // Scans the next piece of the same write (a read that brought several
  // chunks): as feed(), but the spans handed out since the last feed() stay
  // valid too.
  void feed_more(std::string_view piece, std::vector<std::string_view>& out);

  // Ends the stream: appends any bytes still held back (a truncated last
  // event) to `out`, valid, as those handed out since the last feed(), until
  // the scanner is destroyed or fed again. When
  // the upstream broke off, a caller that is about to write an error event of
  // its own may skip this instead: held bytes are an unfinished event that
  // would run into the error event's first line.
  void finish(std::vector<std::string_view>& out);

  std::optional<Usage> usage() const { return usage_; }
  bool saw_error() const { return saw_error_; }
  bool saw_done() const { return saw_done_; }
  // Dispatched events (those with at least one `data:` line), including
  // stripped ones; comments and blank lines are not events.
  std::size_t events() const { return events_; }
  std::size_t stripped_events() const { return stripped_events_; }
  // True between events: no byte of a next event (or comment block) seen yet.
  bool at_event_boundary() const { return !in_block_; }

 private:
  enum class LineState : std::uint8_t { start, name, space, value, skip };
  enum class Field : std::uint8_t { data, event, other };
  static constexpr std::size_t kNameCapacity = 8;
  static constexpr std::size_t kNoRun = static_cast<std::size_t>(-1);

  void scan(std::string_view piece, std::vector<std::string_view>& out);
  void begin_block(std::size_t position);
  // Nearly every read of a stream brings whole events of one `data:` line
  // each ("data: {...}\n\n"). From the start of a piece that begins
  // between events, each such event is counted, inspected and, if it is to
  // be stripped, left out straight from its line's scan, with none of the
  // line-by-line bookkeeping or holding back; the rest of the piece is read
  // as any other. Returns where that reading starts.
  std::size_t take_whole_data_events();
  // Nearly every line of a stream is a `data:` line, and a blank line that
  // ends the event follows it: from its name at `start` in the piece, such a
  // line is read in one step, and that blank line with it when it ends in
  // '\n'. The outcome is the byte-by-byte reading's; returns where the
  // reading goes on.
  std::size_t take_data_line(std::size_t start);
  // Takes a data line's value from `value` in the piece to its end or the
  // piece's, and ends the line if it ended; returns where the reading goes
  // on.
  std::size_t take_data_value(std::size_t value);
  void start_field();
  void end_line(std::size_t position);
  void take_value(std::string_view bytes, bool line_complete);
  // `key_from`: where in `bytes` a "usage" or "error" key may first start
  // (detail::DataLine::kNone: none does).
  void take_data(std::string_view bytes, bool line_complete, std::size_t key_from);
  void start_data_line();
  void move_data_to_buffer();
  // The event's data so far: the view into the piece, or the joined buffer.
  std::string_view data() const { return data_in_buffer_ ? std::string_view(data_) : data_view_; }
  void append_data(std::string_view bytes);
  void give_up_on_event();
  // The buffer a held event's bytes go to.
  std::string& hold_buffer();
  void release_held();
  void drop_held(std::size_t end, bool ended_with_cr);
  void dispatch(std::size_t end, bool ended_with_cr);
  bool inspect(std::string_view payload, bool want_usage_only, std::size_t key_from);
  void take_usage(const Usage& found);
  void end_of_piece();
  void reset_block();

  std::size_t max_carry_;
  bool strip_ = false;

  std::optional<Usage> usage_;
  bool saw_error_ = false;
  bool saw_done_ = false;
  std::size_t events_ = 0;
  std::size_t stripped_events_ = 0;

  // Line tokenizer, carried across pieces.
  LineState line_state_ = LineState::start;
  Field field_ = Field::other;
  bool after_cr_ = false;         // a '\n' right after belongs to the same line end
  bool swallow_lf_ = false;       // ...and to a dropped event, so it is dropped too
  bool value_continued_ = false;  // the current value began in an earlier piece
  char name_[kNameCapacity] = {};
  std::size_t name_length_ = 0;
  char event_type_[kNameCapacity] = {};
  std::size_t event_type_length_ = 0;

  // The pending event (a block of lines up to a blank line).
  bool in_block_ = false;
  bool event_is_error_ = false;
  bool overflowed_ = false;  // past the carry cap: no longer inspected
  std::size_t data_lines_ = 0;
  // The data is either one value inside the current piece (no copy) or, once
  // it spans lines or pieces, joined in data_.
  std::string_view data_view_;
  // Where in data() a "usage" or "error" key may first start, or
  // DataLine::kNone where none can.
  std::size_t data_key_from_ = detail::DataLine::kNone;
  bool data_in_buffer_ = false;
  std::string data_;

  // Hold-back for stripping. A held event's bytes wait in the buffer at
  // held_[handed_out_]; the buffers before it were handed out since the last
  // feed() and stay untouched until the next one. Each buffer is allocated
  // on its own, so that adding one moves none of the others' bytes.
  bool holding_ = false;
  detail::UsageOnlyProbe probe_;
  std::size_t probed_ = 0;  // bytes of the event's data the probe has read
  std::vector<std::unique_ptr<std::string>> held_;
  std::size_t handed_out_ = 0;

  // Valid during one feed()/finish() call.
  std::string_view piece_;
  std::vector<std::string_view>* out_ = nullptr;
  std::size_t run_start_ = 0;   // start of the piece bytes being passed on
  std::size_t hold_start_ = 0;  // where the held event begins in the piece
};

// The usage object of a complete, non-streaming JSON response body (chat,
// completions, embeddings, responses), or nullopt when there is none.
std::optional<Usage> usage_from_json_body(std::string_view body);

// The counters of a usage object's own text (`{"prompt_tokens":...}`), read
// by a scan instead of a parse: a non-streaming response's usage is found at
// the end of every body relayed. Text after the object's closing brace is
// not looked at.
std::optional<Usage> usage_from_usage_object(std::string_view usage_object);

}  // namespace sluice::stream
