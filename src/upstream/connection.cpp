#include "sluice/upstream/connection.hpp"

#include "sluice/common/errors.hpp"

namespace sluice::upstream {

Connection::Connection(executor_type executor, std::string origin_key)
    : origin_key_(std::move(origin_key)) {
  plain_.emplace(std::move(executor));
}

Connection::Connection(executor_type executor, std::string origin_key,
                       boost::asio::ssl::context& tls)
    : origin_key_(std::move(origin_key)) {
  tls_.emplace(boost::beast::tcp_stream(std::move(executor)), tls);
}

void Connection::close() {
  error_code ignored;
  auto& socket = tcp().socket();
  socket.shutdown(boost::asio::ip::tcp::socket::shutdown_both, ignored);
  socket.close(ignored);
}

bool Connection::is_open() { return tcp().socket().is_open(); }

}  // namespace sluice::upstream
