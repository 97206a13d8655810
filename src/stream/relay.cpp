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
#include "sluice/openai/api_error.hpp"

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

std::span<const std::string_view> Relay::take_pieces(const RelayOptions& options, std::size_t n,
                                                     bool body_ended, bool read_to_length,
                                                     RelayOutcome& outcome) {
  const auto& pieces = buffers_.pieces;
  if (options.capture && !outcome.capture_overflowed && n > 0) {
    outcome.capture_overflowed = options.capture->size() + n > options.capture_limit;
    if (outcome.capture_overflowed) {
      options.capture->clear();
    } else {
      for (auto piece : pieces) options.capture->append(piece);
    }
  }
  if (!scanner_) {
    auto& tail = buffers_.json_tail;
    if (read_to_length && tail.empty() && pieces.size() == 1) {
      // The whole body in one piece (the usual case): its usage is read
      // where it lies, before the next read reuses the buffer.
      outcome.usage = usage_from_json_tail(pieces.front());
      json_usage_read_ = true;
    } else {
      for (auto piece : pieces) keep_tail(tail, piece);
    }
    if (body_ended && !json_usage_read_) outcome.usage = usage_from_json_tail(tail);
    return pieces;
  }
  auto& spans = buffers_.spans;
  spans.clear();
  if (n > 0) {
    if (options.gaps) {
      options.gaps->on_event(Clock::now());
      if (auto gap = options.gaps->last_gap()) {
        options.gap_histogram.observe(options.shard, std::chrono::duration<double>(*gap).count());
      }
    }
    // The spans of every piece stay valid until this read is written.
    scanner_->feed(pieces.front(), spans);
    for (std::size_t i = 1; i < pieces.size(); ++i) scanner_->feed_more(pieces[i], spans);
  }
  if (body_ended) {
    scanner_->finish(spans);
    outcome.usage = scanner_->usage();
    outcome.events = scanner_->events();
  }
  return spans;
}

net::awaitable<RelayOutcome> Relay::run(upstream::Exchange& exchange, std::string_view head_fields,
                                        bool keep_alive, const RelayOptions& options) {
  RelayOutcome outcome;
  const bool event_stream = exchange.is_event_stream();
  const auto length = relayed_length(exchange);
  const bool chunked = !length && options.client_reads_chunks;
  outcome.close_delimited = !length && !options.client_reads_chunks;

  HeadWriter head(buffers_.head);
  head.status_line(exchange.status());
  head.raw_fields(exchange.forwarded_fields());
  head.raw_fields(head_fields);
  if (chunked) {
    head.field("Transfer-Encoding", "chunked");
  } else if (length && !has_no_body(exchange.status())) {
    head.field("Content-Length", static_cast<std::size_t>(*length));
  }
  if (!keep_alive || outcome.close_delimited) head.field("Connection", "close");
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
    progress = sluice::write_now(&client_, wire);
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
    progress = co_await sluice::write_rest_within(client_, client_deadline_, write_timeout_,
                                                  buffers_.wire, progress);
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
  buffers_.json_tail.clear();
  json_usage_read_ = false;
  std::uint64_t body_read = 0;
  bool completion_reported = false;
  auto report_completion = [&] {
    if (completion_reported || !options.on_upstream_complete) return;
    completion_reported = true;
    options.on_upstream_complete(outcome);
  };

  // A plain upstream's body is relayed from its connection's read buffer; a
  // TLS upstream's is copied into buffers_.read.
  const bool in_place = exchange.reads_in_place();
  bool filled_buffer = false;
  for (;;) {
    buffers_.pieces.clear();
    if (!in_place) {
      // Grown between reads, never while a write still points into it.
      buffers_.copy_buffer();
      if (filled_buffer && buffers_.read.size() < kLargestRead) {
        buffers_.read.resize(std::min(buffers_.read.size() * 2, kLargestRead));
      }
    }
    // Named once: every local of this frame takes a slot of its own.
    auto read = in_place ? exchange.read_buffered_body(buffers_.pieces)
                         : exchange.read_buffered_body(buffers_.read.data(), buffers_.read.size());
    while (!read) {
      if (!in_place) {
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
    if (!in_place) {
      filled_buffer = n == buffers_.read.size();
      if (n > 0) buffers_.pieces.emplace_back(buffers_.read.data(), n);
    }
    // The body's last piece goes out with the body's end (the last chunk) in
    // one write, rather than waiting for the read that reports the end.
    const bool body_ended = n == 0 || exchange.finished();
    body_read += n;
    const bool read_to_length = length && body_read >= *length;
    const auto spans = take_pieces(options, n, body_ended, read_to_length, outcome);
    // A Content-Length body's last piece is written after this report (and
    // after its capture), as is a chunked body's end.
    if (body_ended || read_to_length) report_completion();
    // A piece that only completed a stripped event leaves nothing to write.
    std::optional<bool> written = true;
    if (body_ended || !spans.empty()) written = write_now(spans, body_ended);
    if (!written) written = co_await write_rest();
    if (body_ended) {
      outcome.complete = *written;
      co_return outcome;
    }
    if (!*written) co_return outcome;
  }
}

}  // namespace sluice::stream
