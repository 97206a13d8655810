#include "sluice/stream/relay.hpp"

#include <algorithm>
#include <array>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/buffer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <charconv>
#include <cstring>
#include <span>

#include "sluice/http/drain_aware_read.hpp"
#include "sluice/http/eager_write.hpp"
#include "sluice/http/http_head.hpp"
#include "sluice/stream/finish_reason.hpp"

namespace sluice::stream {

namespace net = boost::asio;
using net::as_tuple;
using net::use_awaitable;

namespace {

constexpr std::string_view kUsageKey = "\"usage\"";

// Where the last `"usage"` starts. string_view::rfind compares the whole key
// at every position from the end; this jumps between the key's rarest letter
// with memrchr, and the usage object is at the very end of a body.
std::size_t last_usage_key(std::string_view text) {
  constexpr std::size_t g_at = 4;  // kUsageKey[g_at] == 'g'
  std::size_t searched = text.size();
  while (searched > 0) {
    const auto* g = static_cast<const char*>(memrchr(text.data(), 'g', searched));
    if (g == nullptr) break;
    const auto at = static_cast<std::size_t>(g - text.data());
    if (at >= g_at && text.substr(at - g_at, kUsageKey.size()) == kUsageKey) return at - g_at;
    searched = at;
  }
  return std::string_view::npos;
}

}  // namespace

std::optional<Usage> usage_from_json_tail(std::string_view tail) {
  auto key = last_usage_key(tail);
  if (key == std::string_view::npos) return std::nullopt;
  auto colon = tail.find_first_not_of(" \t\r\n", key + kUsageKey.size());
  if (colon == std::string_view::npos || tail[colon] != ':') return std::nullopt;
  auto open = tail.find_first_not_of(" \t\r\n", colon + 1);
  if (open == std::string_view::npos || tail[open] != '{') return std::nullopt;
  // The object is read up to its closing brace; what follows it is not.
  return usage_from_usage_object(tail.substr(open));
}

namespace {

// Enough of a JSON body's end to hold its usage object.
constexpr std::size_t kUsageTailBytes = 2048;

void keep_tail(std::string& tail, std::string_view piece) {
  if (piece.size() >= kUsageTailBytes) {
    tail.assign(piece.substr(piece.size() - kUsageTailBytes));
    return;
  }
  tail.append(piece);
  if (tail.size() > kUsageTailBytes) tail.erase(0, tail.size() - kUsageTailBytes);
}

bool ends_object(std::string_view body) {
  const auto last = body.find_last_not_of(" \t\r\n");
  return last != std::string_view::npos && body[last] == '}';
}

// Writes a chunk's size line into `text`, which outlives the write.
net::const_buffer chunk_size_line(std::array<char, 20>& text, std::size_t size) {
  auto [end, ec] = std::to_chars(text.data(), text.data() + text.size() - 2, size, 16);
  *end++ = '\r';
  *end++ = '\n';
  return {text.data(), static_cast<std::size_t>(end - text.data())};
}

constexpr std::string_view kCrlf = "\r\n";
constexpr std::string_view kLastChunk = "0\r\n\r\n";

// Past these a buffer is not kept for the next connection.
constexpr std::size_t kKeptHeadBytes = 4096;
constexpr std::size_t kKeptViews = 64;

template <class Container>
void release_if_over(Container& container, std::size_t kept) {
  if (container.capacity() > kept) Container().swap(container);
}

// These never have a body (RFC 9110 §15.3.5, §15.4.5), whatever framing
// the upstream's fields give them.
bool has_no_body(unsigned status) { return status == 204 || status == 304; }

// The length of the body relayed; nullopt when it is not known ahead, as a
// stream's never is: it is relayed as it is read.
std::optional<std::uint64_t> relayed_length(const upstream::Exchange& exchange) {
  if (has_no_body(exchange.status())) return 0;
  if (exchange.is_event_stream()) return std::nullopt;
  return exchange.content_length();
}

}  // namespace

void Relay::Buffers::release_grown() {
  release_if_over(read, kFirstReadSize);
  release_if_over(head, kKeptHeadBytes);
  release_if_over(json_tail, 2 * kUsageTailBytes);
  release_if_over(pieces, kKeptViews);
  release_if_over(spans, kKeptViews);
  release_if_over(wire, kKeptViews);
}

namespace {

// One answer as Relay::run relays it: what is known of it so far, and the
// steps run() takes between its awaits. A local of run(), so its state lies
// in run()'s frame as the locals and lambdas it stands for did; every step is
// plain code but write_rest, which is awaited only when a write must wait.
// Local to this file, so that the steps called once are inlined into run().
class Answer {
 public:
  using BodyRead = std::optional<Result<std::size_t, upstream::UpstreamError>>;

  // The buffers, scanner, socket and write limit are the Relay's.
  Answer(Relay::Buffers& buffers, std::optional<SseScanner>& scanner, net::ip::tcp::socket& client,
         SocketDeadline& client_deadline, std::chrono::milliseconds write_timeout,
         upstream::Exchange& exchange, const RelayOptions& options)
      : buffers_(buffers),
        scanner_(scanner),
        client_(client),
        client_deadline_(client_deadline),
        write_timeout_(write_timeout),
        exchange_(exchange),
        options_(options),
        length_(relayed_length(exchange)),
        chunked_(!length_ && options.client_reads_chunks),
        in_place_(exchange.reads_in_place()) {
    outcome.close_delimited = !length_ && !options.client_reads_chunks;
  }

  // The head goes out with the first body bytes; until then it waits in
  // Buffers::head.
  void format_head(std::string_view head_fields, bool keep_alive);
  // Streams are scanned beside the relay (usage, stripping); a JSON body
  // keeps only its tail for the usage object.
  void prepare_body_scan();

  bool reads_in_place() const { return in_place_; }
  // What the upstream connection holds of the body already; nullopt when
  // its socket must be read (in run(), or through read_body for TLS).
  BodyRead read_buffered();
  // Takes a read of `n` bytes and offers it to the client: whether it was
  // written, or nullopt when the rest must be awaited with write_rest.
  std::optional<bool> relay_read(std::size_t n);
  bool body_ended() const { return body_ended_; }
  // The upstream failed before the body's end: recorded, and a stream the
  // client has begun to read gets a last error event. Answers as relay_read.
  std::optional<bool> end_on_upstream_error(const upstream::UpstreamError& error);
  // The part of a write the socket did not take at once.
  net::awaitable<bool> write_rest();

  RelayOutcome outcome;

 private:
  void capture(std::size_t n);
  std::span<const std::string_view> take_json_pieces(bool read_to_length);
  std::span<const std::string_view> take_event_pieces(std::size_t n);
  void report_completion();
  std::optional<bool> write_now(std::span<const std::string_view> spans, bool last);
  bool settle();
  // RelayOptions::inspect_end: the finish_reason of each read, and at the
  // body's end what they came to.
  void watch_finish_reason(std::span<const std::string_view> pieces);

  Relay::Buffers& buffers_;
  std::optional<SseScanner>& scanner_;
  net::ip::tcp::socket& client_;
  SocketDeadline& client_deadline_;
  const std::chrono::milliseconds write_timeout_;
  upstream::Exchange& exchange_;
  const RelayOptions& options_;
  const std::optional<std::uint64_t> length_;
  FinishReasonWatch finish_reason_;
  std::uint64_t body_read_ = 0;
  WriteProgress progress_;
  const bool chunked_;
  // A plain upstream's body is relayed from its connection's read buffer; a
  // TLS upstream's is copied into Buffers::read.
  const bool in_place_;
  bool filled_buffer_ = false;  // the last read filled buffers_.read
  bool body_ended_ = false;
  bool head_pending_ = true;
  bool completion_reported_ = false;
  // A JSON body's usage was read from the whole body at once.
  bool json_usage_read_ = false;
};

void Answer::format_head(std::string_view head_fields, bool keep_alive) {
  HeadWriter head(buffers_.head);
  head.status_line(exchange_.status());
  head.raw_fields(exchange_.forwarded_fields());
  head.raw_fields(head_fields);
  if (chunked_) {
    head.field("Transfer-Encoding", "chunked");
  } else if (length_ && !has_no_body(exchange_.status())) {
    head.field("Content-Length", static_cast<std::size_t>(*length_));
  }
  if (!keep_alive || outcome.close_delimited) head.field("Connection", "close");
  head.finish();
}

void Answer::prepare_body_scan() {
  scanner_.reset();
  if (exchange_.is_event_stream()) {
    scanner_.emplace();
    scanner_->set_strip_usage_only_chunks(options_.strip_usage_only_chunks);
  }
  buffers_.json_tail.clear();
}

Answer::BodyRead Answer::read_buffered() {
  buffers_.pieces.clear();
  if (in_place_) return exchange_.read_buffered_body(buffers_.pieces);
  // Grown between reads, never while a write still points into it.
  buffers_.copy_buffer();
  if (filled_buffer_ && buffers_.read.size() < Relay::kLargestRead) {
    buffers_.read.resize(std::min(buffers_.read.size() * 2, Relay::kLargestRead));
  }
  return exchange_.read_buffered_body(buffers_.read.data(), buffers_.read.size());
}

std::optional<bool> Answer::relay_read(std::size_t n) {
  if (!in_place_) {
    filled_buffer_ = n == buffers_.read.size();
    if (n > 0) buffers_.pieces.emplace_back(buffers_.read.data(), n);
  }
  // The body's last piece goes out with the body's end (the last chunk) in
  // one write, rather than waiting for the read that reports the end.
  body_ended_ = n == 0 || exchange_.finished();
  body_read_ += n;
  const bool read_to_length = length_ && body_read_ >= *length_;
  capture(n);
  const auto spans = scanner_ ? take_event_pieces(n) : take_json_pieces(read_to_length);
  // A Content-Length body's last piece is written after this report (and
  // after its capture), as is a chunked body's end.
  if (body_ended_ || read_to_length) report_completion();
  // A piece that only completed a stripped event leaves nothing to write.
  if (!body_ended_ && spans.empty()) return true;
  return write_now(spans, body_ended_);
}

// Appends the read to the cache's capture, which is dropped once the body
// outgrows its limit.
void Answer::capture(std::size_t n) {
  if (!options_.capture || outcome.capture_overflowed || n == 0) return;
  outcome.capture_overflowed = options_.capture->size() + n > options_.capture_limit;
  if (outcome.capture_overflowed) {
    options_.capture->clear();
    return;
  }
  for (auto piece : buffers_.pieces) options_.capture->append(piece);
}

// A JSON body is written as it was read; only its usage is looked for.
std::span<const std::string_view> Answer::take_json_pieces(bool read_to_length) {
  const auto& pieces = buffers_.pieces;
  auto& tail = buffers_.json_tail;
  if (read_to_length && tail.empty() && pieces.size() == 1) {
    // The whole body in one piece (the usual case): its usage is read
    // where it lies, before the next read reuses the buffer.
    outcome.usage = usage_from_json_tail(pieces.front());
    if (options_.inspect_end) outcome.json_ends_object = ends_object(pieces.front());
    json_usage_read_ = true;
  } else {
    for (auto piece : pieces) keep_tail(tail, piece);
  }
  if (body_ended_ && !json_usage_read_) {
    outcome.usage = usage_from_json_tail(tail);
    if (options_.inspect_end) outcome.json_ends_object = ends_object(tail);
  }
  if (options_.inspect_end) watch_finish_reason(pieces);
  return pieces;
}

// A stream is written as the scanner cuts it into events, less those it
// strips; its usage and event count are the scanner's.
std::span<const std::string_view> Answer::take_event_pieces(std::size_t n) {
  auto& scanner = *scanner_;
  const auto& pieces = buffers_.pieces;
  auto& spans = buffers_.spans;
  spans.clear();
  if (n > 0) {
    if (options_.gaps) {
      options_.gaps->on_event(Clock::now());
      if (auto gap = options_.gaps->last_gap()) {
        options_.gap_histogram.observe(options_.shard, std::chrono::duration<double>(*gap).count());
      }
    }
    if (options_.inspect_end) watch_finish_reason(pieces);
    // The spans of every piece stay valid until this read is written.
    scanner.feed(pieces.front(), spans);
    for (std::size_t i = 1; i < pieces.size(); ++i) scanner.feed_more(pieces[i], spans);
  }
  if (body_ended_) {
    scanner.finish(spans);
    outcome.usage = scanner.usage();
    outcome.events = scanner.events();
    outcome.saw_done = scanner.saw_done();
    if (options_.inspect_end) watch_finish_reason({});
  }
  return spans;
}

void Answer::watch_finish_reason(std::span<const std::string_view> pieces) {
  for (auto piece : pieces) finish_reason_.feed(piece);
  if (body_ended_) {
    outcome.finish_length = finish_reason_.saw_length();
    outcome.saw_finish_reason = finish_reason_.saw_reason();
  }
}

void Answer::report_completion() {
  if (completion_reported_ || !options_.on_upstream_complete) return;
  completion_reported_ = true;
  options_.on_upstream_complete(outcome);
}

std::optional<bool> Answer::end_on_upstream_error(const upstream::UpstreamError& error) {
  outcome.upstream_error = error;
  if (scanner_) {
    outcome.usage = scanner_->usage();
    outcome.events = scanner_->events();
  }
  // Nothing reached the client: the caller may still fail over.
  if (outcome.nothing_sent && error.failure != upstream::Failure::aborted) return true;
  if (!scanner_ || outcome.client_failed || error.failure == upstream::Failure::aborted) {
    return true;
  }
  // A partial event already sent is ended first, so the error event stands
  // on its own. It is written from the head's buffer, which went out with
  // the first body bytes.
  auto& event = buffers_.head;
  event.assign(scanner_->at_event_boundary() ? "" : "\n\n");
  event += options_.error_event("The upstream stream was interrupted: " + error.describe(),
                                error.is_timeout() ? "upstream_timeout" : "stream_interrupted");
  const std::string_view data = event;
  return write_now(std::span<const std::string_view>(&data, 1), true);
}

// Writes the pending head (once), then `spans` as one HTTP chunk (or as raw
// bytes for a Content-Length body), then the last chunk if `last`. Offered
// to the socket at once: whether it was written, or nullopt when the rest
// must be awaited with write_rest. Plain code, not a coroutine: that would
// cost a frame for every write of a stream.
std::optional<bool> Answer::write_now(std::span<const std::string_view> spans, bool last) {
  auto& wire = buffers_.wire;
  wire.clear();
  if (head_pending_) wire.push_back(net::buffer(buffers_.head));
  std::size_t size = 0;
  for (auto span : spans) size += span.size();
  if (size > 0) {
    if (chunked_) wire.push_back(chunk_size_line(buffers_.chunk_size_line, size));
    for (auto span : spans) {
      if (!span.empty()) wire.push_back(net::buffer(span));
    }
    if (chunked_) wire.push_back(net::buffer(kCrlf));
  }
  if (last && chunked_) wire.push_back(net::buffer(kLastChunk));
  if (wire.empty()) return true;
  progress_ = sluice::write_now(&client_, wire);
  if (head_pending_) outcome.first_write = Clock::now();
  head_pending_ = false;
  outcome.nothing_sent = false;
  if (!progress_.finished) return std::nullopt;
  return settle();
}

net::awaitable<bool> Answer::write_rest() {
  // The write timeout only guards a wait, so the clock is read only here
  // and not for every write the socket takes at once.
  progress_ = co_await sluice::write_rest_within(client_, client_deadline_, write_timeout_,
                                                 buffers_.wire, progress_);
  co_return settle();
}

bool Answer::settle() {
  outcome.bytes_out += progress_.written;
  if (progress_.ec) outcome.client_failed = true;
  return !progress_.ec;
}

}  // namespace

net::awaitable<RelayOutcome> Relay::run(upstream::Exchange& exchange, std::string_view head_fields,
                                        bool keep_alive, const RelayOptions& options) {
  Answer answer(buffers_, scanner_, client_, client_deadline_, write_timeout_, exchange, options);
  answer.format_head(head_fields, keep_alive);
  answer.prepare_body_scan();
  for (;;) {
    // Named once: every local of this frame takes a slot of its own.
    auto read = answer.read_buffered();
    while (!read) {
      if (!answer.reads_in_place()) {
        read = co_await exchange.read_body(buffers_.read.data(), buffers_.read.size());
        break;
      }
      // A plain connection's read is awaited here, not through read_body's
      // coroutine: that would be a frame more for every event of a stream.
      auto plain = exchange.begin_plain_body_read();
      auto [read_ec, bytes] =
          co_await drain_aware_read_some(plain->socket, plain->room, as_tuple(use_awaitable));
      read = exchange.finish_plain_body_read(read_ec, bytes, buffers_.pieces);
    }
    if (!read->ok()) {
      if (!answer.end_on_upstream_error(read->error())) co_await answer.write_rest();
      co_return std::move(answer.outcome);
    }
    auto written = answer.relay_read(read->value());
    if (!written) written = co_await answer.write_rest();
    if (answer.body_ended()) answer.outcome.complete = *written;
    if (answer.body_ended() || !*written) co_return std::move(answer.outcome);
  }
}

}  // namespace sluice::stream
