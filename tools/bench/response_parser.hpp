#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <utility>

namespace sluice::bench {

// An incremental HTTP/1.1 response parser that hands out the de-chunked body
// as it arrives. It keeps no per-response heap state, so a connection reuses
// one parser for every exchange; it understands exactly what the benchmark
// meets: Content-Length, chunked, read-until-close, and interim 1xx heads.
class ResponseParser {
 public:
  enum class Progress { need_more, complete, failed };

  void reset();

  // Consumes `data`; every body byte range goes to on_body(const char*,
  // std::size_t). Bytes after the end of the response are left unconsumed;
  // `consumed` tells how many were used.
  template <class OnBody>
  Progress feed(const char* data, std::size_t size, std::size_t& consumed, OnBody&& on_body) {
    consumed = 0;
    if (size > 0) started_ = true;
    while (consumed < size && progress_ == Progress::need_more) {
      if (state_ == State::body_sized || state_ == State::chunk_data) {
        const std::size_t take =
            static_cast<std::size_t>(std::min<std::uint64_t>(remaining_, size - consumed));
        on_body(data + consumed, take);
        consumed += take;
        remaining_ -= take;
        if (remaining_ == 0) {
          if (state_ == State::body_sized) {
            progress_ = Progress::complete;
          } else {
            state_ = State::chunk_data_end;
          }
        }
      } else if (state_ == State::body_until_close) {
        on_body(data + consumed, size - consumed);
        consumed = size;
      } else {
        consumed += consume_line_bytes(data + consumed, size - consumed);
      }
    }
    return progress_;
  }

  // The peer closed the connection: completes a read-until-close body.
  Progress finish_at_eof();

  Progress progress() const { return progress_; }
  unsigned status() const { return status_; }
  // False when the server asked to close, or the body ran until close.
  bool keep_alive() const { return keep_alive_; }
  // True once any byte of the response has been seen.
  bool started() const { return started_; }
  std::string_view failure() const { return failure_; }

 private:
  enum class State {
    status_line,
    header_line,
    body_sized,
    body_until_close,
    chunk_size_line,
    chunk_data,
    chunk_data_end,
    trailer_line,
  };

  // Accumulates one CRLF-terminated line (head, chunk size, trailer) and
  // handles it once complete; returns the bytes used.
  std::size_t consume_line_bytes(const char* data, std::size_t size);
  void handle_line(std::string_view line);
  void handle_status_line(std::string_view line);
  void handle_header_line(std::string_view line);
  void handle_end_of_head();
  void handle_chunk_size_line(std::string_view line);
  void fail(std::string_view why);

  State state_ = State::status_line;
  Progress progress_ = Progress::need_more;
  std::array<char, 8192> line_{};
  std::size_t line_size_ = 0;
  unsigned status_ = 0;
  bool http_1_0_ = false;
  bool keep_alive_ = true;
  bool chunked_ = false;
  bool has_content_length_ = false;
  bool started_ = false;
  std::uint64_t content_length_ = 0;
  std::uint64_t remaining_ = 0;
  std::string_view failure_;
};

// Finds the ends of server-sent events (a blank line after a non-empty
// event), and the mock's send stamps in them, in a body delivered in
// arbitrary pieces.
class SseEventScanner {
 public:
  void reset() {
    at_line_start_ = true;
    event_has_content_ = false;
    line_ = LineState::other;
    stamp_ns_ = 0;
  }

  // Calls on_event_end(sent_ns) once for every event completed inside the
  // range. sent_ns is the stamp the mock puts first in an event's JSON
  // (`data: {"sent_ns":N,...`, asked for with x-mock-stamp: 1), 0 when the
  // event has none.
  template <class OnEventEnd>
  void scan(const char* data, std::size_t size, OnEventEnd&& on_event_end) {
    for (std::size_t i = 0; i < size; ++i) {
      const char c = data[i];
      if (c == '\n') {
        if (line_ == LineState::stamp_digits) stamp_ns_ = digits_;
        line_ = LineState::other;
        if (at_line_start_ && event_has_content_) {
          event_has_content_ = false;
          on_event_end(std::exchange(stamp_ns_, 0));
        }
        at_line_start_ = true;
        continue;
      }
      if (c == '\r') continue;
      if (at_line_start_) {
        at_line_start_ = false;
        line_ = LineState::stamp_prefix;
        matched_ = 0;
      }
      event_has_content_ = true;
      if (line_ != LineState::other) read_stamp(c);
    }
  }

 private:
  // A line is read for a stamp until it proves not to carry one.
  enum class LineState : unsigned char { other, stamp_prefix, stamp_digits };
  static constexpr std::string_view kStampPrefix = R"(data: {"sent_ns":)";

  void read_stamp(char c) {
    if (line_ == LineState::stamp_prefix) {
      if (c != kStampPrefix[matched_]) {
        line_ = LineState::other;
      } else if (++matched_ == kStampPrefix.size()) {
        line_ = LineState::stamp_digits;
        digits_ = 0;
      }
    } else if (c >= '0' && c <= '9') {
      digits_ = digits_ * 10 + static_cast<std::uint64_t>(c - '0');
    } else {
      stamp_ns_ = digits_;
      line_ = LineState::other;
    }
  }

  bool at_line_start_ = true;
  bool event_has_content_ = false;
  LineState line_ = LineState::other;
  std::size_t matched_ = 0;
  std::uint64_t digits_ = 0;
  std::uint64_t stamp_ns_ = 0;
};

}  // namespace sluice::bench
