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

#include "sluice/common/errors.hpp"

namespace sluice {

// Writes all of `buffers` to `stream`, offering them to `socket` first
// without waiting. A write the socket takes whole (nearly every response
// head, event and upstream request) then costs one system call: an Asio
// operation that completes at once still goes through the event loop, and a
// Beast stream with an expiry sets and cancels its timer, each a further
// trip. What the socket does not take is written asynchronously under the
// stream's expiry. `socket` is the stream's own TCP socket, or null where
// bytes must pass through the stream (TLS); one not in non-blocking mode is
// never written to directly, since that write could block the thread.
template <class Stream, class ConstBuffers>
boost::asio::awaitable<std::tuple<error_code, std::size_t>> write_eagerly(
    Stream& stream, boost::asio::ip::tcp::socket* socket, const ConstBuffers& buffers) {
  std::size_t written = 0;
  if (socket && socket->non_blocking()) {
    error_code ec;
    written = socket->write_some(buffers, ec);
    if (ec == boost::asio::error::would_block || ec == boost::asio::error::try_again) {
      ec = {};
      written = 0;
    }
    if (ec || written == boost::asio::buffer_size(buffers)) co_return std::tuple{ec, written};
  }
  boost::beast::buffers_suffix<ConstBuffers> rest(buffers);
  rest.consume(written);
  auto [ec, more] = co_await boost::asio::async_write(
      stream, rest, boost::asio::as_tuple(boost::asio::use_awaitable));
  co_return std::tuple{ec, written + more};
}

}  // namespace sluice
