#include "support/tls_client.hpp"

#include <openssl/ssl.h>
#include <openssl/x509.h>

#include <boost/asio/ip/address.hpp>
#include <boost/asio/ssl/host_name_verification.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/string_body.hpp>
#include <boost/beast/http/write.hpp>
#include <stdexcept>

namespace sluice::testing {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using error_code = boost::system::error_code;

namespace {
net::ssl::context client_context(const TlsClientIdentity& identity) {
  net::ssl::context tls(net::ssl::context::tls_client);
  tls.add_certificate_authority(net::buffer(identity.trusted_ca_pem));
  if (!identity.client.cert_pem.empty()) {
    tls.use_certificate_chain(net::buffer(identity.client.cert_pem));
    tls.use_private_key(net::buffer(identity.client.key_pem), net::ssl::context::pem);
  }
  return tls;
}
}  // namespace

TlsConnection::TlsConnection(std::uint16_t port, const TlsClientIdentity& identity,
                             std::chrono::milliseconds timeout)
    : tls_(client_context(identity)), stream_(context_, tls_), timeout_(timeout) {
  stream_.set_verify_mode(net::ssl::verify_peer);
  stream_.set_verify_callback(net::ssl::host_name_verification("localhost"));
  SSL_set_tlsext_host_name(stream_.native_handle(), "localhost");
  static constexpr unsigned char kAlpn[] = "\x02h2\x08http/1.1";
  SSL_set_alpn_protos(stream_.native_handle(), kAlpn, sizeof kAlpn - 1);
  net::ip::tcp::endpoint endpoint(net::ip::make_address("127.0.0.1"), port);
  auto ec = run([&](auto handler) {
    beast::get_lowest_layer(stream_).async_connect(endpoint,
                                                   [handler](error_code e) mutable { handler(e); });
  });
  if (ec) throw std::runtime_error("connect: " + ec.message());
  ec = run([&](auto handler) {
    stream_.async_handshake(net::ssl::stream_base::client,
                            [handler](error_code e) mutable { handler(e); });
  });
  if (ec) throw std::runtime_error("handshake: " + ec.message());
}

TlsConnection::~TlsConnection() {
  error_code ignored;
  beast::get_lowest_layer(stream_).socket().close(ignored);
}

template <class Start>
error_code TlsConnection::run(Start&& start) {
  error_code result = net::error::timed_out;
  bool done = false;
  start([&](error_code ec) {
    result = ec;
    done = true;
  });
  context_.restart();
  context_.run_for(timeout_);
  if (!done) {
    beast::get_lowest_layer(stream_).cancel();
    context_.restart();
    context_.run();
    return net::error::timed_out;
  }
  return result;
}

HttpResponse TlsConnection::request(const std::string& method, const std::string& target,
                                    const std::string& body, const Headers& headers) {
  http::request<http::string_body> request(http::string_to_verb(method), target, 11);
  request.set(http::field::host, "localhost");
  for (const auto& [name, value] : headers) request.set(name, value);
  if (!body.empty() && request[http::field::content_type].empty()) {
    request.set(http::field::content_type, "application/json");
  }
  request.body() = body;
  request.prepare_payload();
  auto ec = run([&](auto handler) {
    http::async_write(stream_, request,
                      [handler](error_code e, std::size_t) mutable { handler(e); });
  });
  if (ec) throw std::runtime_error("send: " + ec.message());
  http::response_parser<http::string_body> parser;
  parser.body_limit(boost::none);
  ec = run([&](auto handler) {
    http::async_read(stream_, buffer_, parser,
                     [handler](error_code e, std::size_t) mutable { handler(e); });
  });
  if (ec) throw std::runtime_error("read: " + ec.message());
  auto response = parser.release();
  HttpResponse out;
  out.status = response.result_int();
  for (const auto& field : response) {
    out.headers.emplace_back(std::string(field.name_string()), std::string(field.value()));
  }
  out.body = std::move(response.body());
  return out;
}

std::string TlsConnection::peer_common_name() {
  X509* peer = SSL_get0_peer_certificate(stream_.native_handle());
  if (!peer) return "";
  char name[256] = {};
  X509_NAME_get_text_by_NID(X509_get_subject_name(peer), NID_commonName, name, sizeof name);
  return name;
}

std::string TlsConnection::alpn() {
  const unsigned char* chosen = nullptr;
  unsigned int size = 0;
  SSL_get0_alpn_selected(stream_.native_handle(), &chosen, &size);
  return chosen ? std::string(reinterpret_cast<const char*>(chosen), size) : "";
}

}  // namespace sluice::testing
