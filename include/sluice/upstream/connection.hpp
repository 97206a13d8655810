#pragma once

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/ssl/context.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/ssl/ssl_stream.hpp>
#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "sluice/common/clock.hpp"
#include "sluice/http/socket_deadline.hpp"

namespace sluice::upstream {

// One upstream socket, plain or TLS, with the read buffer that belongs to it.
// It models Asio's AsyncReadStream/AsyncWriteStream, so Beast's HTTP
// algorithms run on it without caring which of the two it is.
class Connection {
 public:
  using executor_type = boost::asio::any_io_executor;

  // A plain connection reads up to this much at once, where Beast would
  // start at 512 bytes: a stream's head with its first events (or a short
  // stream whole) then takes one read and one write to the client, not two
  // of each. A held stream pays 512 bytes more for it. TLS connections read
  // from the TLS layer's own buffer, so theirs stays at Beast's default.
  static constexpr std::size_t kPlainReadBufferSize = 1024;

  Connection(const executor_type& executor, std::string origin_key);
  Connection(executor_type executor, std::string origin_key, boost::asio::ssl::context& tls);

  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  executor_type get_executor() { return socket().get_executor(); }

  template <class MutableBuffers, class Token>
  auto async_read_some(const MutableBuffers& buffers, Token&& token) {
    if (tls_) return tls_->async_read_some(buffers, std::forward<Token>(token));
    return plain_->async_read_some(buffers, std::forward<Token>(token));
  }

  template <class ConstBuffers, class Token>
  auto async_write_some(const ConstBuffers& buffers, Token&& token) {
    if (tls_) return tls_->async_write_some(buffers, std::forward<Token>(token));
    return plain_->async_write_some(buffers, std::forward<Token>(token));
  }

  // The TCP socket, under TLS or not.
  boost::asio::ip::tcp::socket& socket() { return tls_ ? tls_->next_layer().socket() : *plain_; }
  boost::beast::ssl_stream<boost::beast::tcp_stream>* tls_stream() {
    return tls_ ? &*tls_ : nullptr;
  }
  // The socket bytes go to as they are, or null for TLS.
  boost::asio::ip::tcp::socket* plain_socket() { return plain_ ? &*plain_ : nullptr; }
  // The deadline of the connect, and of a plain connection's reads and
  // writes (TLS reads and writes go through the stream and its expiry).
  SocketDeadline& deadline() { return *deadline_; }
  // Bounds what is read and written from now on, through the connection or
  // plain_socket(): the TLS stream's expiry, or a plain connection's deadline.
  void expires_at(TimePoint when);
  void expires_never() { expires_at(TimePoint::max()); }
  boost::beast::flat_buffer& read_buffer() { return read_buffer_; }
  // Lets go of a read buffer that a large body grew, so that a connection
  // waiting in the pool costs what a fresh one does. Only for an empty
  // buffer.
  void trim_read_buffer();
  const std::string& origin_key() const { return origin_key_; }

  // Closes the socket; pending operations complete with operation_aborted.
  void close();
  bool is_open();
  // For an idle connection: whether the peer has closed it (or sent
  // anything, which an HTTP/1.1 server only does on its way out). Does not
  // block. TLS records that carry no data (session tickets) are read and
  // taken by the TLS layer on the way.
  bool peer_closed();

  TimePoint idle_since{};
  unsigned exchanges = 0;  // completed request/response pairs
  // The pool's idle stack for this connection's origin, once the pool has
  // looked it up: giving the connection back then costs no hashing of its key.
  std::vector<std::unique_ptr<Connection>>* idle_stack = nullptr;

 private:
  std::string origin_key_;
  std::optional<boost::asio::ip::tcp::socket> plain_;
  std::optional<boost::beast::ssl_stream<boost::beast::tcp_stream>> tls_;
  std::optional<SocketDeadline> deadline_;
  boost::beast::flat_buffer read_buffer_;
};

}  // namespace sluice::upstream
