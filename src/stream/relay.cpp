#include "sluice/stream/relay.hpp"

#include <algorithm>
#include <array>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/buffer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <charconv>
#include <cstring>
#include <span>

#include "sluice/common/drain_aware_read.hpp"
#include "sluice/common/eager_write.hpp"
#include "sluice/common/errors.hpp"
#include "sluice/common/http_head.hpp"

namespace sluice::stream {

namespace net = boost::asio;
using net::as_tuple;
using net::use_awaitable;

std::string stream_error_event(std::string_view message, std::string_view code) {
  ApiError error{502, std::string(message), "upstream_error", "", std::string(code)};
  return "data: " + error.to_json() + "\n\n";
}

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

// Writes a chunk's size line into `text`, which outlives the write.
net::const_buffer chunk_size_line(std::array<char, 20>& text, std::size_t size) {
  auto [end, ec] = std::to_chars(text.data(), text.data() + text.size() - 2, size, 16);
  *end++ = '\r';
  *end++ = '\n';
  return {text.data(), static_cast<std::size_t>(end - text.data())};
}

constexpr std::string_view kCrlf = "\r\n";
constexpr std::string_view kLastChunk = "0\r\n\r\n";

}  // namespace

net::awaitable<RelayOutcome> Relay::run(upstream::Exchange& exchange, std::string_view head_fields,
                                        bool keep_alive, const RelayOptions& options) {
  RelayOutcome outcome;
  const bool event_stream = exchange.is_event_stream();
  const auto content_length = exchange.content_length();
  const bool chunked = event_stream || !content_length;

  HeadWriter head(buffers_.head);
  head.status_line(exchange.status());
  head.raw_fields(exchange.forwarded_fields());
  head.raw_fields(head_fields);
  if (chunked) {
    head.field("Transfer-Encoding", "chunked");
  } else {
    head.field("Content-Length", static_cast<std::size_t>(*content_length));
  }
  if (!keep_alive) head.field("Connection", "close");
  head.finish();

  bool head_pending = true;
  // Writes the pending head (once), then `spans` as one HTTP chunk (or as
  // raw bytes for a Content-Length body), then the last chunk if `last`.
  // Offered to the socket at once: whether it was written, or nullopt when
  // the rest must be awaited with write_rest. Plain code, not a coroutine:
  // that would cost a frame for every write of a stream.
  WriteProgress progress;
  auto settle = [&] {
    outcome.bytes_out += progress.written;
    if (progress.ec) outcome.client_failed = true;
    return !progress.ec;
  };
  auto write_now = [&](std::span<const std::string_view> spans, bool last) -> std::optional<bool> {
    auto& wire = buffers_.wire;
    wire.clear();
    if (head_pending) wire.push_back(net::buffer(buffers_.head));
    std::size_t size = 0;
    for (auto span : spans) size += span.size();
    if (size > 0) {
      if (chunked) wire.push_back(chunk_size_line(buffers_.chunk_size_line, size));
      for (auto span : spans) {
        if (!span.empty()) wire.push_back(net::buffer(span));
      }
      if (chunked) wire.push_back(net::buffer(kCrlf));
    }
    if (last && chunked) wire.push_back(net::buffer(kLastChunk));
    if (wire.empty()) return true;
    progress = sluice::write_now(&client_.socket(), wire);
    if (head_pending) outcome.first_write = Clock::now();
    head_pending = false;
    outcome.nothing_sent = false;
    if (!progress.finished) return std::nullopt;
    return settle();
  };
  // The part of a write the socket did not take at once.
  auto write_rest = [&]() -> net::awaitable<bool> {
    // The write timeout only guards a wait, so the clock is read only here
    // and not for every write the socket takes at once.
    client_.expires_after(write_timeout_);
    progress = co_await sluice::write_rest(client_, buffers_.wire, progress);
    co_return settle();
  };
  auto write_one = [&](std::string_view data, bool last) {
    return write_now(std::span<const std::string_view>(&data, data.empty() ? 0 : 1), last);
  };

  // Streams are scanned beside the relay (usage, stripping); a JSON body
  // keeps only its tail for the usage object.
  scanner_.reset();
  if (event_stream) {
    scanner_.emplace();
    scanner_->set_strip_usage_only_chunks(options.strip_usage_only_chunks);
  }
  auto& tail = buffers_.json_tail;
  tail.clear();
  bool json_usage_read = false;  // into outcome.usage, from a body read whole at once
  std::uint64_t body_read = 0;
  bool completion_reported = false;
  auto report_completion = [&] {
    if (completion_reported || !options.on_upstream_complete) return;
    completion_reported = true;
    options.on_upstream_complete(outcome);
  };

  bool filled_buffer = false;
  for (;;) {
    // Grown between reads, never while a write still points into it.
    if (filled_buffer && buffers_.read.size() < kLargestRead) {
      buffers_.read.resize(std::min(buffers_.read.size() * 2, kLargestRead));
    }
    // Named once: every local of this frame takes a slot of its own.
    auto read = exchange.read_buffered_body(buffers_.read.data(), buffers_.read.size());
    while (!read) {
      // A plain connection's read is awaited here, not through read_body's
      // coroutine: that would be a frame more for every event of a stream.
      auto plain = exchange.begin_plain_body_read();
      if (!plain) {
        read = co_await exchange.read_body(buffers_.read.data(), buffers_.read.size());
        break;
      }
      auto [read_ec, bytes] =
          co_await drain_aware_read_some(plain->socket, plain->room, as_tuple(use_awaitable));
      read = exchange.finish_plain_body_read(read_ec, bytes, buffers_.read.data(),
                                             buffers_.read.size());
    }
    if (!read->ok()) {
      outcome.upstream_error = read->error();
      if (scanner_) {
        outcome.usage = scanner_->usage();
        outcome.events = scanner_->events();
      }
      if (outcome.nothing_sent && read->error().failure != upstream::Failure::aborted) {
        // Nothing reached the client: the caller may still fail over.
        co_return outcome;
      }
      if (event_stream && !outcome.client_failed &&
          read->error().failure != upstream::Failure::aborted) {
        // A partial event already sent is ended first, so the error event
        // stands on its own.
        std::string event = scanner_->at_event_boundary() ? "" : "\n\n";
        event += stream_error_event(
            "The upstream stream was interrupted: " + read->error().describe(),
            read->error().is_timeout() ? "upstream_timeout" : "stream_interrupted");
        if (!write_one(event, true)) co_await write_rest();
      }
      co_return outcome;
    }
    const std::size_t n = read->value();
    filled_buffer = n == buffers_.read.size();
    // The body's last piece goes out with the body's end (the last chunk) in
    // one write, rather than waiting for the read that reports the end.
    bool body_ended = n == 0 || exchange.finished();
    const std::string_view piece(buffers_.read.data(), n);
    if (options.capture && !outcome.capture_overflowed && n > 0) {
      outcome.capture_overflowed = options.capture->size() + n > options.capture_limit;
      if (outcome.capture_overflowed) {
        options.capture->clear();
      } else {
        options.capture->append(piece);
      }
    }
    body_read += n;
    // A Content-Length body's last piece is written after this report, as
    // is a chunked body's end.
    if (body_ended || (!chunked && body_read >= *content_length)) report_completion();
    buffers_.spans.clear();
    if (scanner_) {
      if (n > 0) {
        if (options.gaps) {
          auto now = Clock::now();
          options.gaps->on_event(now);
          auto gap = options.gaps->last_gap();
          if (gap) {
            options.gap_histogram.observe(options.shard,
                                          std::chrono::duration<double>(*gap).count());
          }
        }
        scanner_->feed(piece, buffers_.spans);
        // A truncated last event still held back would come out of
        // finish() in a buffer that this piece's spans may point into:
        // the piece is written first, and the end with the next turn.
        if (!scanner_->at_event_boundary()) body_ended = false;
      }
      if (body_ended) {
        scanner_->finish(buffers_.spans);
        outcome.usage = scanner_->usage();
        outcome.events = scanner_->events();
      }
    } else {
      if (n > 0) {
        if (!chunked && body_read >= *content_length && tail.empty()) {
          // The whole body in one piece (the usual case): its usage is read
          // where it lies, before the next read reuses the buffer.
          outcome.usage = usage_from_json_tail(piece);
          json_usage_read = true;
        } else {
          keep_tail(tail, piece);
        }
        buffers_.spans.push_back(piece);
      }
      if (body_ended && !json_usage_read) outcome.usage = usage_from_json_tail(tail);
    }
    // A piece that only completed a stripped event leaves nothing to write.
    std::optional<bool> written = true;
    if (body_ended || !buffers_.spans.empty()) written = write_now(buffers_.spans, body_ended);
    if (!written) written = co_await write_rest();
    if (body_ended) {
      outcome.complete = *written;
      co_return outcome;
    }
    if (!*written) co_return outcome;
  }
}

}  // namespace sluice::stream
