#include "sluice/upstream/connection.hpp"

#include "sluice/http/http_read.hpp"
#include "sluice/http/network_errors.hpp"

namespace sluice::upstream {

Connection::Connection(const executor_type& executor, std::string origin_key)
    : origin_key_(std::move(origin_key)) {
  plain_.emplace(executor);
  deadline_.emplace(*plain_);
  read_buffer_.reserve(kPlainReadBufferSize);
}

Connection::Connection(executor_type executor, std::string origin_key,
                       boost::asio::ssl::context& tls)
    : origin_key_(std::move(origin_key)) {
  tls_.emplace(boost::beast::tcp_stream(std::move(executor)), tls);
  deadline_.emplace(tls_->next_layer().socket());
}

void Connection::expires_at(TimePoint when) {
  if (!tls_) {
    deadline_->expires_at(when);
  } else if (when == TimePoint::max()) {
    tls_->next_layer().expires_never();
  } else {
    tls_->next_layer().expires_at(when);
  }
}

void Connection::trim_read_buffer() {
  if (release_grown_buffer(read_buffer_) && plain_) read_buffer_.reserve(kPlainReadBufferSize);
}

void Connection::close() {
  // close alone sends the FIN (or, with unread bytes, the reset an abandoned
  // answer deserves); a shutdown first would be one more system call.
  error_code ignored;
  socket().close(ignored);
}

bool Connection::is_open() { return socket().is_open(); }

bool Connection::peer_closed() {
  auto& socket = this->socket();
  if (!socket.is_open()) return true;
  error_code ec;
  bool was_non_blocking = socket.non_blocking();
  if (!was_non_blocking) socket.non_blocking(true, ec);
  if (ec) return false;
  char byte = 0;
  if (tls_) {
    // A TLS 1.3 server sends session tickets after the handshake, so an idle
    // connection has bytes waiting that are no data. Read through the TLS
    // layer, OpenSSL takes them and the read finds the socket empty; only
    // data, a close_notify, the end of the stream or a reset end it.
    tls_->read_some(boost::asio::buffer(&byte, 1), ec);
  } else {
    socket.receive(boost::asio::buffer(&byte, 1), boost::asio::socket_base::message_peek, ec);
  }
  if (!was_non_blocking) {
    error_code ignored;
    socket.non_blocking(false, ignored);
  }
  return ec != boost::asio::error::would_block;
}

}  // namespace sluice::upstream
