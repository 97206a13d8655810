#include "sluice/stream/relay.hpp"

#include <array>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/buffer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <charconv>

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

struct ChunkSize {
  char text[20];
  std::size_t length = 0;
  explicit ChunkSize(std::size_t size) {
    auto [end, ec] = std::to_chars(text, text + sizeof text - 2, size, 16);
    *end++ = '\r';
    *end++ = '\n';
    length = static_cast<std::size_t>(end - text);
  }
  net::const_buffer buffer() const { return {text, length}; }
};

constexpr std::string_view kCrlf = "\r\n";
constexpr std::string_view kLastChunk = "0\r\n\r\n";

}  // namespace

net::awaitable<RelayOutcome> Relay::run(upstream::Exchange& exchange,
                                        std::string_view head_fields, bool keep_alive) {
  RelayOutcome outcome;
  const bool event_stream = exchange.is_event_stream();
  const auto content_length = exchange.content_length();
  const bool chunked = event_stream || !content_length;

  HeadWriter head(head_);
  head.status_line(exchange.status());
  for (const auto& field : exchange.head()) {
    auto name = field.name_string();
    if (is_hop_by_hop_header(std::string_view(name.data(), name.size()))) continue;
    head.field(std::string_view(name.data(), name.size()),
               std::string_view(field.value().data(), field.value().size()));
  }
  head.raw_fields(head_fields);
  if (chunked) {
    head.field("Transfer-Encoding", "chunked");
  } else {
    head.field("Content-Length", static_cast<std::size_t>(*content_length));
  }
  if (!keep_alive) head.field("Connection", "close");
  head.finish();

  bool head_pending = true;
  auto write = [&](std::string_view data, bool last) -> net::awaitable<bool> {
    std::array<net::const_buffer, 5> wire;
    std::size_t count = 0;
    if (head_pending) wire[count++] = net::buffer(head_);
    ChunkSize size(data.size());
    if (!data.empty()) {
      if (chunked) wire[count++] = size.buffer();
      wire[count++] = net::buffer(data);
      if (chunked) wire[count++] = net::buffer(kCrlf);
    }
    if (last && chunked) wire[count++] = net::buffer(kLastChunk);
    if (count == 0) co_return true;
    client_.expires_after(write_timeout_);
    auto [ec, n] = co_await net::async_write(
        client_, std::span<const net::const_buffer>(wire.data(), count), as_tuple(use_awaitable));
    if (head_pending) outcome.first_write = Clock::now();
    head_pending = false;
    outcome.nothing_sent = false;
    outcome.bytes_out += n;
    if (ec) outcome.client_failed = true;
    co_return !ec;
  };

  for (;;) {
    auto read = co_await exchange.read_body(buffer_.data(), buffer_.size());
    if (!read) {
      outcome.upstream_error = read.error();
      if (outcome.nothing_sent && read.error().failure != upstream::Failure::aborted) {
        // Nothing reached the client: the caller may still fail over.
        co_return outcome;
      }
      if (event_stream && !outcome.client_failed &&
          read.error().failure != upstream::Failure::aborted) {
        std::string event = stream_error_event(
            "The upstream stream was interrupted: " + read.error().describe(),
            read.error().is_timeout() ? "upstream_timeout" : "stream_interrupted");
        co_await write(event, true);
      }
      co_return outcome;
    }
    std::size_t n = read.value();
    if (n == 0) {
      outcome.complete = co_await write({}, true);
      co_return outcome;
    }
    if (!co_await write(std::string_view(buffer_.data(), n), false)) co_return outcome;
  }
}

}  // namespace sluice::stream

