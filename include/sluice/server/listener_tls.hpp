#pragma once

#include <boost/asio/awaitable.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl/context.hpp>
#include <memory>
#include <string_view>

#include "sluice/config/config.hpp"

namespace sluice::server {

class Worker;

// The OpenSSL context of a listener (server.tls or server.admin_tls), read
// from its files: TLS 1.2 or later, ALPN http/1.1 only, and with client_ca a
// client certificate chaining to it is required. Read again for every
// snapshot, so that a reload picks up rotated files while connections made
// with the old context keep it. Throws config::ConfigError naming
// `yaml_path` when a file no longer reads.
std::shared_ptr<boost::asio::ssl::context> make_listener_tls(const config::ListenerTls& tls,
                                                             std::string_view yaml_path);

// Serves a connection accepted on a listener with server.tls: the handshake,
// under server.header_timeout, then the connection's requests as
// serve_connection serves them (or its refusal, as refuse_connection's, when
// `refused`). The session and the pipeline below it write to a plain socket;
// the decrypted bytes reach them through a socket pair that this coroutine
// carries both ways, so the plain path has no branch or indirection for TLS.
// When not `refused`, the connection holds its place in
// Gateway::open_connections, as serve_connection's does.
boost::asio::awaitable<void> serve_tls_connection(Worker& worker,
                                                  boost::asio::ip::tcp::socket socket,
                                                  std::shared_ptr<boost::asio::ssl::context> tls,
                                                  bool refused);

}  // namespace sluice::server
