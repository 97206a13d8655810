#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/ssl/context.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/ssl/ssl_stream.hpp>
#include <chrono>
#include <cstdint>
#include <string>

#include "support/certificates.hpp"
#include "support/http_client.hpp"

namespace sluice::testing {

// What a test client trusts and, for mutual TLS, presents.
struct TlsClientIdentity {
  std::string trusted_ca_pem;  // the server's certificate must chain to it
  Certificate client;          // presented when its cert_pem is set
};

// A blocking HTTPS/1.1 client for tests, as HttpConnection is for HTTP: one
// keep-alive connection to 127.0.0.1 (name checked: localhost), every
// operation bounded by `timeout`. Throws std::runtime_error when the
// connection, its handshake or a request fails.
class TlsConnection {
 public:
  TlsConnection(std::uint16_t port, const TlsClientIdentity& identity,
                std::chrono::milliseconds timeout = std::chrono::seconds(10));
  ~TlsConnection();

  // The whole answer (a stream is read to its end).
  HttpResponse request(const std::string& method, const std::string& target,
                       const std::string& body = {}, const Headers& headers = {});

  // The server certificate's subject common name, and the protocol ALPN
  // agreed ("" when none).
  std::string peer_common_name();
  std::string alpn();

 private:
  template <class Start>
  boost::system::error_code run(Start&& start);

  boost::asio::io_context context_;
  boost::asio::ssl::context tls_;
  boost::beast::ssl_stream<boost::beast::tcp_stream> stream_;
  boost::beast::flat_buffer buffer_;
  std::chrono::milliseconds timeout_;
};

}  // namespace sluice::testing
