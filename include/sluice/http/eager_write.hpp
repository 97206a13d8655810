#pragma once

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/buffer.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/buffers_suffix.hpp>
#include <cstddef>
#include <tuple>

#include "sluice/http/network_errors.hpp"
#include "sluice/http/socket_deadline.hpp"

namespace sluice {

// Writes are offered to the socket first, without waiting. A write the
// socket takes whole (nearly every response head, event and upstream
// request) then costs one system call: an Asio operation that completes at
// once still goes through the event loop, and a Beast stream with an expiry
// sets and cancels its timer, each a further trip. What the socket does not
// take is written asynchronously: under the stream's expiry, or under a
// SocketDeadline set for that wait only.
//
// The two halves are separate so that a hot path can make the first a plain
// call and await the second only when it is needed: awaiting a coroutine
// costs a frame even when it has nothing to wait for.

// How far a write has come.
struct WriteProgress {
  error_code ec;
  std::size_t written = 0;
  bool finished = false;  // all written, or failed: nothing is left to await
};

// Offers `buffers` to `socket` without waiting. `socket` is the stream's own
// TCP socket, or null where bytes must pass through the stream (TLS); one
// not in non-blocking mode is never written to directly, since that write
// could block the thread.
template <class ConstBuffers>
WriteProgress write_now(boost::asio::ip::tcp::socket* socket, const ConstBuffers& buffers) {
  WriteProgress progress;
  if (socket && socket->non_blocking()) {
    progress.written = socket->write_some(buffers, progress.ec);
    if (progress.ec == boost::asio::error::would_block ||
        progress.ec == boost::asio::error::try_again) {
      progress.ec = {};
      progress.written = 0;
    }
    progress.finished = progress.ec || progress.written == boost::asio::buffer_size(buffers);
  }
  return progress;
}

// Writes what write_now left of `buffers` to `stream`.
template <class Stream, class ConstBuffers>
boost::asio::awaitable<WriteProgress> write_rest(Stream& stream, const ConstBuffers& buffers,
                                                 WriteProgress progress) {
  boost::beast::buffers_suffix<ConstBuffers> rest(buffers);
  rest.consume(progress.written);
  auto [ec, more] = co_await boost::asio::async_write(
      stream, rest, boost::asio::as_tuple(boost::asio::use_awaitable));
  co_return WriteProgress{ec, progress.written + more, true};
}

// Writes what write_now left of `buffers` to `socket`, giving up after
// `limit` (beast's error::timeout). `deadline` is `socket`'s and has no
// other wait armed; it is disarmed again after the write.
template <class ConstBuffers>
boost::asio::awaitable<WriteProgress> write_rest_within(boost::asio::ip::tcp::socket& socket,
                                                        SocketDeadline& deadline,
                                                        Clock::duration limit,
                                                        const ConstBuffers& buffers,
                                                        WriteProgress progress) {
  deadline.expires_after(limit);
  progress = co_await write_rest(socket, buffers, progress);
  progress.ec = deadline.translate(progress.ec);
  deadline.expires_never();
  co_return progress;
}

// Both halves, where a frame more does not matter.
template <class ConstBuffers>
boost::asio::awaitable<std::tuple<error_code, std::size_t>> write_eagerly(
    boost::asio::ip::tcp::socket& socket, SocketDeadline& deadline, Clock::duration limit,
    const ConstBuffers& buffers) {
  auto progress = write_now(&socket, buffers);
  if (!progress.finished) {
    progress = co_await write_rest_within(socket, deadline, limit, buffers, progress);
  }
  co_return std::tuple{progress.ec, progress.written};
}

}  // namespace sluice
