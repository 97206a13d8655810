#include "sluice/server/listener_tls.hpp"

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <boost/asio/ssl/stream.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <cerrno>
#include <chrono>

#include "sluice/http/network_errors.hpp"
#include "sluice/http/socket_deadline.hpp"
#include "sluice/server/gateway.hpp"
#include "sluice/server/internal_errors.hpp"
#include "sluice/server/session.hpp"

namespace sluice::server {

namespace net = boost::asio;
namespace ssl = net::ssl;
using net::as_tuple;
using net::use_awaitable;
using net::ip::tcp;

namespace {

// ALPN: HTTP/1.1 is all the session speaks. A client that offers only
// other protocols is answered without ALPN rather than refused, as servers
// without ALPN do.
int select_http11(SSL*, const unsigned char** out, unsigned char* out_size,
                  const unsigned char* offered, unsigned int offered_size, void*) {
  static constexpr unsigned char kOurs[] = "\x08http/1.1";
  unsigned char* chosen = nullptr;
  if (SSL_select_next_proto(&chosen, out_size, kOurs, sizeof kOurs - 1, offered, offered_size) !=
      OPENSSL_NPN_NEGOTIATED) {
    return SSL_TLSEXT_ERR_NOACK;
  }
  *out = chosen;
  return SSL_TLSEXT_ERR_OK;
}

}  // namespace

std::shared_ptr<ssl::context> make_listener_tls(const config::ListenerTls& tls,
                                                std::string_view yaml_path) {
  // Errors a failed load queued on this thread would fail its next TLS
  // operation.
  struct ClearErrors {
    ~ClearErrors() { ERR_clear_error(); }
  } clear_errors;
  auto context = std::make_shared<ssl::context>(ssl::context::tls_server);
  const auto fail = [&](std::string_view what, const std::string& file, const error_code& ec) {
    throw config::ConfigError(std::string(yaml_path) + "." + std::string(what) + ": cannot use '" +
                              file + "': " + ec.message());
  };
  SSL_CTX* native = context->native_handle();
  SSL_CTX_set_min_proto_version(native, TLS1_2_VERSION);
  context->set_options(ssl::context::default_workarounds | ssl::context::no_compression |
                       ssl::context::single_dh_use);
  error_code ec;
  context->use_certificate_chain_file(tls.cert, ec);
  if (ec) fail("cert", tls.cert, ec);
  context->use_private_key_file(tls.key, ssl::context::pem, ec);
  if (ec) fail("key", tls.key, ec);
  if (SSL_CTX_check_private_key(native) != 1) {
    throw config::ConfigError(std::string(yaml_path) + ".key: the key in '" + tls.key +
                              "' does not match the certificate in '" + tls.cert + "'");
  }
  if (!tls.client_ca.empty()) {
    context->load_verify_file(tls.client_ca, ec);
    if (ec) fail("client_ca", tls.client_ca, ec);
    // The names a client is told to pick its certificate by.
    if (STACK_OF(X509_NAME)* names = SSL_load_client_CA_file(tls.client_ca.c_str())) {
      SSL_CTX_set_client_CA_list(native, names);
    }
    context->set_verify_mode(ssl::verify_peer | ssl::verify_fail_if_no_peer_cert);
    // A resumed session skips the client's certificate: OpenSSL refuses to
    // resume one without a context id once peers are verified.
    static constexpr unsigned char kSessionContext[] = "sluice";
    SSL_CTX_set_session_id_context(native, kSessionContext, sizeof kSessionContext - 1);
  }
  SSL_CTX_set_alpn_select_cb(native, select_http11, nullptr);
  return context;
}

namespace {

// A TLS record's plaintext at most: one read takes a record whole.
constexpr std::size_t kBridgeBuffer = 16 * 1024;
// How long the client gets to answer the gateway's close_notify.
constexpr std::chrono::seconds kCloseNotifyWait{1};

// A TLS connection and the socket pair end that joins it to the session.
struct Bridge {
  Bridge(tcp::socket socket, ssl::context& context)
      : tls(std::move(socket), context),
        deadline(tls.next_layer()),
        session_side(tls.get_executor()),
        client_side_done(tls.get_executor(), std::chrono::steady_clock::time_point::max()) {}

  ssl::stream<tcp::socket> tls;
  // The handshake's, then each write to the client's. Declared after `tls`,
  // whose socket it names.
  SocketDeadline deadline;
  net::local::stream_protocol::socket session_side;
  // Cancelled when the client's bytes stop (carry_client_bytes ended).
  net::steady_timer client_side_done;
  bool client_side_running = false;
  std::array<char, kBridgeBuffer> from_client;
  std::array<char, kBridgeBuffer> to_client;
};

void note_client_error(const error_code& ec, std::string_view during) {
  // Scanners, health checks that speak plain HTTP, clients that do not trust
  // the certificate: all the client's doing, and frequent on an open port.
  if (is_benign_network_error(ec) || ec.category() == net::error::get_ssl_category() ||
      ec == boost::beast::error::timeout) {
    spdlog::debug("TLS client connection, {}: {}", during, ec.message());
  } else {
    spdlog::info("TLS client connection, {}: {}", during, ec.message());
  }
}

// The client's bytes, decrypted, to the session; its end of stream as the
// session's.
net::awaitable<void> carry_client_bytes(std::shared_ptr<Bridge> bridge) {
  for (;;) {
    auto [ec, n] = co_await bridge->tls.async_read_some(net::buffer(bridge->from_client),
                                                        as_tuple(use_awaitable));
    if (ec) {
      if (ec != net::error::operation_aborted) note_client_error(ec, "reading");
      break;
    }
    auto [written_ec, written] = co_await net::async_write(
        bridge->session_side, net::buffer(bridge->from_client.data(), n), as_tuple(use_awaitable));
    if (written_ec) break;
  }
  error_code ignored;
  bridge->session_side.shutdown(net::socket_base::shutdown_send, ignored);
  bridge->client_side_running = false;
  bridge->client_side_done.cancel();
}

// The connection's place in Gateway::open_connections until the session
// takes it over.
class HeldConnectionCount {
 public:
  HeldConnectionCount(std::atomic<unsigned>& count, bool held) : count_(count), held_(held) {}
  ~HeldConnectionCount() {
    if (held_) count_.fetch_sub(1, std::memory_order_relaxed);
  }
  HeldConnectionCount(const HeldConnectionCount&) = delete;
  HeldConnectionCount& operator=(const HeldConnectionCount&) = delete;
  void hand_over() { held_ = false; }

 private:
  std::atomic<unsigned>& count_;
  bool held_;
};

}  // namespace

net::awaitable<void> serve_tls_connection(Worker& worker, tcp::socket socket,
                                          std::shared_ptr<ssl::context> tls, bool refused) {
  HeldConnectionCount count(worker.gateway().open_connections(), !refused);
  // Copied: the connection may outlive many snapshots, and holds none.
  const auto header_timeout = worker.snapshot()->config->server.header_timeout;
  const auto write_timeout = worker.snapshot()->config->server.write_timeout;
  auto bridge = std::make_shared<Bridge>(std::move(socket), *tls);
  // A client that opens the connection and never completes its handshake
  // is a request that never sends its head.
  bridge->deadline.expires_after(header_timeout);
  auto [handshake_ec] =
      co_await bridge->tls.async_handshake(ssl::stream_base::server, as_tuple(use_awaitable));
  handshake_ec = bridge->deadline.translate(handshake_ec);
  bridge->deadline.expires_never();
  if (handshake_ec) {
    note_client_error(handshake_ec, "handshake");
    co_return;
  }

  int pair[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, pair) != 0) {
    spdlog::warn("TLS client connection: no socket pair for it: {}",
                 error_code(errno, boost::system::system_category()).message());
    co_return;
  }
  error_code ec;
  bridge->session_side.assign(net::local::stream_protocol(), pair[0], ec);
  tcp::socket session_socket(worker.context());
  if (!ec) {
    // The session reads and writes it as it does an accepted TCP socket;
    // nothing it does asks for an address or a TCP option.
    session_socket.assign(tcp::v4(), pair[1], ec);
  } else {
    ::close(pair[1]);
  }
  if (ec) {
    spdlog::warn("TLS client connection: cannot take its socket pair: {}", ec.message());
    co_return;
  }
  if (refused) {
    net::co_spawn(worker.context(), refuse_connection(std::move(session_socket)),
                  InternalErrorBarrier(worker, "refusing a connection"));
  } else {
    count.hand_over();
    net::co_spawn(worker.context(), serve_connection(worker, std::move(session_socket)),
                  InternalErrorBarrier(worker, "a client connection"));
  }
  bridge->client_side_running = true;
  net::co_spawn(worker.context(), carry_client_bytes(bridge),
                InternalErrorBarrier(worker, "reading a TLS client"));

  // The session's answers, encrypted, to the client, each write under
  // server.write_timeout as the session's own writes are.
  for (;;) {
    auto [read_ec, n] = co_await bridge->session_side.async_read_some(
        net::buffer(bridge->to_client), as_tuple(use_awaitable));
    if (read_ec) break;
    bridge->deadline.expires_after(write_timeout);
    auto [written_ec, written] = co_await net::async_write(
        bridge->tls, net::buffer(bridge->to_client.data(), n), as_tuple(use_awaitable));
    written_ec = bridge->deadline.translate(written_ec);
    bridge->deadline.expires_never();
    if (written_ec) {
      note_client_error(written_ec, "writing");
      break;
    }
  }
  // The session ended the connection (or the client stopped taking its
  // answers): stop reading the client, then end TLS with close_notify.
  if (bridge->client_side_running) {
    error_code ignored;
    bridge->tls.next_layer().cancel(ignored);
    bridge->session_side.cancel(ignored);
    co_await bridge->client_side_done.async_wait(as_tuple(use_awaitable));
  }
  {
    error_code ignored;
    bridge->session_side.close(ignored);
  }
  bridge->deadline.expires_after(kCloseNotifyWait);
  co_await bridge->tls.async_shutdown(as_tuple(use_awaitable));
  bridge->deadline.expires_never();
  error_code ignored;
  bridge->tls.next_layer().close(ignored);
}

}  // namespace sluice::server
