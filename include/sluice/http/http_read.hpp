#pragma once

#include <algorithm>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core/error.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/read_size.hpp>
#include <boost/beast/http/error.hpp>
#include <cstdint>
#include <optional>
#include <utility>

#include "sluice/http/drain_aware_read.hpp"
#include "sluice/http/network_errors.hpp"
#include "sluice/http/plain_head.hpp"
#include "sluice/http/socket_deadline.hpp"

namespace sluice {

// Beast's HTTP reads, without their composed operations: these parse what
// the buffer already holds with no trip through the event loop, read from
// the socket only when the parser needs more, and take their deadline from a
// SocketDeadline. Errors are Beast's (timeout, end_of_stream, the parser's).

// How much one read may add to `buffer`; 0 when the buffer is full.
inline std::size_t read_room(const boost::beast::flat_buffer& buffer) {
  return boost::beast::read_size(buffer, 65536);
}

// The most a read of a body of known length asks for at once.
constexpr std::size_t kLargestBodyRead = 65536;
// What a connection's read buffer may keep while it waits for its next
// message; one that a large body grew past this lets it go.
constexpr std::size_t kIdleReadBufferLimit = 4096;

// Frees a buffer that a large body grew past kIdleReadBufferLimit, once it
// holds nothing; true if it did.
inline bool release_grown_buffer(boost::beast::flat_buffer& buffer) {
  if (buffer.capacity() <= kIdleReadBufferLimit || buffer.size() != 0) return false;
  buffer.shrink_to_fit();
  return true;
}

// How much a read of a body may add to `buffer`, with `to_come` bytes of it
// known to be still on their way: all of them (up to kLargestBodyRead)
// rather than read_room's share, so that a body of many kilobytes takes a
// few reads, not one per buffer's worth. 0 when the buffer is full.
inline std::size_t body_read_room(const boost::beast::flat_buffer& buffer, std::uint64_t to_come) {
  const std::size_t room = read_room(buffer);
  if (room == 0 || to_come <= buffer.size()) return room;
  return std::max(room, static_cast<std::size_t>(
                            std::min<std::uint64_t>(to_come - buffer.size(), kLargestBodyRead)));
}

// Settles one read: calls commit() to take its bytes, or says what the
// error means. The end of the stream completes a message that ends with its
// connection, ends a started one with the parser's error, and is
// end_of_stream before any byte.
template <class Parser, class Commit>
error_code settle_read_with(error_code ec, Parser& parser, const SocketDeadline& deadline,
                            Commit&& commit) {
  ec = deadline.translate(ec);
  if (ec && ec == boost::asio::error::eof) {
    if (!parser.got_some()) return boost::beast::http::error::end_of_stream;
    error_code eof_ec;
    parser.put_eof(eof_ec);
    return eof_ec;
  }
  if (!ec) commit();
  return ec;
}

// The same for a read of `bytes` into the space `buffer` prepared.
template <class Parser>
error_code settle_read(error_code ec, std::size_t bytes, boost::beast::flat_buffer& buffer,
                       Parser& parser, const SocketDeadline& deadline) {
  return settle_read_with(ec, parser, deadline, [&] { buffer.commit(bytes); });
}

// Parses what `buffer` holds already, in plain code: the outcome when that
// settles the read (the head, or with `whole` the whole message, or an
// error), nullopt when the socket must be read (read_http). A request or
// response usually arrives whole with its first read, and awaiting a
// coroutine that has nothing to wait for would cost a frame.
template <class Parser>
std::optional<error_code> parse_buffered(boost::beast::flat_buffer& buffer, Parser& parser,
                                         bool whole) {
  auto finished = [&] { return whole ? parser.is_done() : parser.is_header_done(); };
  // A read that ended the message (the end of the stream) leaves nothing to parse.
  if (finished()) return error_code{};
  while (buffer.size() > 0) {
    error_code ec;
    const std::size_t used = parser.put(buffer.data(), ec);
    buffer.consume(used);
    if (ec && ec != parse_wait::need_more) return ec;
    if (finished()) return error_code{};
    // The head parsed, now the body.
    if (ec || used == 0 || buffer.size() == 0) break;
  }
  return std::nullopt;
}

// Reads until the parser has the head, or with `whole` the whole message.
// `first_read` says how the first read from the socket starts
// (drain_aware_read.hpp); later ones always try at once. With `deadline`
// expired already, what is buffered is still parsed, but nothing is read.
template <class Parser>
boost::asio::awaitable<error_code> read_http(boost::asio::ip::tcp::socket& socket,
                                             boost::beast::flat_buffer& buffer, Parser& parser,
                                             bool whole, const SocketDeadline& deadline,
                                             ReadStart first_read = ReadStart::try_at_once) {
  for (;;) {
    if (auto settled = parse_buffered(buffer, parser, whole)) co_return *settled;
    // A deadline that passed while nothing was pending cancelled nothing: a
    // read started now would wait with no deadline at all.
    if (deadline.expired()) co_return boost::beast::error::timeout;
    // The socket's reads are awaited here, not through a coroutine of its
    // own: that would be one frame more per read.
    // A parser that keeps the body in a place of its own has the rest of
    // a body of known length read straight into it, once the buffer holds
    // no more of the message.
    if constexpr (requires { parser.body_read_space(); }) {
      const boost::asio::mutable_buffer space =
          whole && buffer.size() == 0 ? parser.body_read_space() : boost::asio::mutable_buffer{};
      if (space.size() > 0) {
        auto [read_ec, n] = co_await drain_aware_read_some(
            socket, space, boost::asio::as_tuple(boost::asio::use_awaitable),
            std::exchange(first_read, ReadStart::try_at_once));
        if (auto ec = settle_read_with(read_ec, parser, deadline,
                                       [&, n = n] { parser.commit_body_read(n); })) {
          co_return ec;
        }
        continue;
      }
    }
    // Otherwise a body of known length (a prompt of many kilobytes) is read in reads
    // as large as what is still to come, not 512 bytes at a time.
    std::uint64_t to_come = 0;
    if constexpr (requires { parser.body_bytes_to_come(); }) {
      if (whole) to_come = parser.body_bytes_to_come();
    }
    const std::size_t size = body_read_room(buffer, to_come);
    if (size == 0) co_return boost::beast::http::error::buffer_overflow;
    auto [read_ec, n] = co_await drain_aware_read_some(
        socket, buffer.prepare(size), boost::asio::as_tuple(boost::asio::use_awaitable),
        std::exchange(first_read, ReadStart::try_at_once));
    if (auto ec = settle_read(read_ec, n, buffer, parser, deadline)) co_return ec;
  }
}

}  // namespace sluice
