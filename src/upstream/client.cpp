#include "sluice/upstream/client.hpp"

#include <openssl/ssl.h>

#include <algorithm>
#include <array>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/buffer.hpp>
#include <boost/asio/ssl/host_name_verification.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core/error.hpp>
#include <boost/beast/http/read.hpp>
#include <span>

#include "sluice/http/http_head.hpp"
#include "sluice/http/http_read.hpp"
#include "sluice/http/relay_socket.hpp"

namespace sluice::upstream {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using net::as_tuple;
using net::use_awaitable;

namespace {

void close_connection(void* connection) { static_cast<Connection*>(connection)->close(); }
void interrupt_resolve(void* wait) { static_cast<ResolveWait*>(wait)->interrupt(); }

}  // namespace

// The request's bytes as one gather write: the head, then the body's pieces.
struct Http1Client::OutgoingRequest {
  explicit OutgoingRequest(const Request& request)
      : wire{net::const_buffer(),          net::buffer(request.body[0]),
             net::buffer(request.body[1]), net::buffer(request.body[2]),
             net::buffer(request.body[3]), net::buffer(request.body[4])} {
    for (auto part : request.body) body_size += part.size();
  }

  // Moves the head out of the client's scratch, for a write that has to
  // wait while other requests write theirs there.
  void keep_head(const std::string& scratch) {
    waiting_head = scratch;
    wire[0] = net::buffer(waiting_head);
  }

  std::array<net::const_buffer, 6> wire;
  std::size_t body_size = 0;
  // Only a head whose write has to wait is kept here: nothing of the request
  // is needed once the response has begun.
  std::string waiting_head;
};

net::awaitable<Result<std::unique_ptr<Connection>, UpstreamError>> Http1Client::connect(
    const Origin& origin, const Limits& limits, AbortHandle& abort_handle, Timing& timing,
    std::string_view alpn) {
  auto connect_deadline = std::min(Clock::now() + limits.connect, limits.deadline);
  // An address in the URL is the endpoint itself: no lookup, not even the
  // cache's.
  Endpoints resolved;
  std::span<const net::ip::tcp::endpoint> endpoints;
  if (origin.address) {
    endpoints = std::span(&*origin.address, 1);
  } else {
    ResolveWait resolving;
    abort_handle.stop_with(&interrupt_resolve, &resolving);
    auto lookup =
        co_await deps_.dns.resolve(origin.host, origin.port, connect_deadline, &resolving);
    abort_handle.clear_stop();
    if (abort_handle.aborted()) co_return UpstreamError{Failure::aborted, {}};
    if (!lookup) {
      auto failure =
          lookup.error() == net::error::timed_out ? Failure::connect_timeout : Failure::dns;
      co_return UpstreamError{failure, lookup.error()};
    }
    resolved = std::move(lookup.value());
    endpoints = resolved;
  }

  auto executor = co_await net::this_coro::executor;
  std::unique_ptr<Connection> connection;
  try {
    connection = origin.tls
                     ? std::make_unique<Connection>(
                           executor, origin.key(), deps_.tls.get(origin.tls_verify, origin.ca_file))
                     : std::make_unique<Connection>(executor, origin.key());
  } catch (const std::exception&) {
    co_return UpstreamError{Failure::tls, {}};
  }
  abort_handle.stop_with(&close_connection, connection.get());

  connection->deadline().expires_at(connect_deadline);
  auto connect_ec =
      co_await connect_relay_socket(connection->socket(), endpoints, connection->deadline());
  connection->deadline().expires_never();
  if (connect_ec) {
    abort_handle.clear_stop();
    if (abort_handle.aborted()) co_return UpstreamError{Failure::aborted, connect_ec};
    auto failure =
        connect_ec == beast::error::timeout ? Failure::connect_timeout : Failure::connect;
    co_return UpstreamError{failure, connect_ec};
  }
  timing.connected = Clock::now();

  if (auto* tls = connection->tls_stream()) {
    if (!origin.address) SSL_set_tlsext_host_name(tls->native_handle(), origin.host.c_str());
    if (origin.tls_verify) tls->set_verify_callback(net::ssl::host_name_verification(origin.host));
    if (!alpn.empty()) {
      SSL_set_alpn_protos(tls->native_handle(), reinterpret_cast<const unsigned char*>(alpn.data()),
                          static_cast<unsigned>(alpn.size()));
    }
    connection->expires_at(connect_deadline);
    auto [tls_ec] =
        co_await tls->async_handshake(net::ssl::stream_base::client, as_tuple(use_awaitable));
    connection->expires_never();
    if (tls_ec) {
      abort_handle.clear_stop();
      connection->close();
      if (abort_handle.aborted()) co_return UpstreamError{Failure::aborted, tls_ec};
      auto failure = tls_ec == beast::error::timeout ? Failure::connect_timeout : Failure::tls;
      co_return UpstreamError{failure, tls_ec};
    }
  }
  timing.secured = Clock::now();
  deps_.pool.note_opened();
  co_return std::move(connection);
}

std::unique_ptr<Connection> Http1Client::take_pooled(const Origin& origin, Timing& timing) {
  auto connection = deps_.pool.take(origin.key(), timing.started);
  // Taking a pooled connection costs nothing worth a clock read.
  if (connection) timing.connected = timing.secured = timing.started;
  return connection;
}

WriteProgress Http1Client::send_now(Http1Exchange& exchange, const Origin& origin,
                                    const Request& request, OutgoingRequest& outgoing) {
  // Written here, with no wait between this and the write below.
  HeadWriter(head_scratch_)
      .request_line(request.method, request.target)
      .field("Host", origin.host_header())
      .field("Content-Length", outgoing.body_size)
      .raw_fields(request.fields[0])
      .raw_fields(request.fields[1])
      .raw_fields(request.fields[2])
      .finish();
  outgoing.wire[0] = net::buffer(head_scratch_);
  return write_now(exchange.connection().plain_socket(), outgoing.wire);
}

// The steps that await stay in this one coroutine, and the rest are plain
// calls: a coroutine of their own would cost a frame per request.
net::awaitable<Result<std::unique_ptr<Exchange>, UpstreamError>> Http1Client::start(
    const Origin& origin, const Request& request, const Limits& limits, AbortHandle& abort_handle) {
  auto exchange = std::make_unique<Http1Exchange>(deps_.pool, limits, abort_handle);
  auto& timing = exchange->timing_;
  timing.started = known_or_now(limits.started);
  OutgoingRequest outgoing(request);

  // A second round only when the first one's pooled connection was dead
  // (drop_dead_pooled_connection); it takes a fresh connection.
  for (const bool may_reuse : {true, false}) {
    auto connection = may_reuse ? take_pooled(origin, timing) : nullptr;
    timing.reused = connection != nullptr;
    if (!connection) {
      auto opened = co_await connect(origin, limits, abort_handle, timing);
      if (!opened) co_return opened.error();
      connection = std::move(opened.value());
    }
    exchange->begin_round(std::move(connection));
    auto& conn = exchange->connection();

    auto sent = send_now(*exchange, origin, request, outgoing);
    // Sent whole without a wait: the answer can only come after it, and the
    // head read below may wait for it without trying first.
    const auto first_read =
        sent.finished && !sent.ec ? ReadStart::awaiting_reply : ReadStart::try_at_once;
    if (!sent.finished) {
      outgoing.keep_head(head_scratch_);
      sent = co_await write_rest(conn, outgoing.wire, sent);
    }
    if (auto error = exchange->settle_send(sent.ec)) {
      if (exchange->drop_dead_pooled_connection(*error, /*request_written=*/false)) continue;
      co_return *error;
    }

    error_code read_ec;
    for (auto read_start = first_read;; read_start = ReadStart::try_at_once) {
      if (auto* socket = conn.plain_socket()) {
        read_ec = co_await read_http(*socket, conn.read_buffer(), exchange->parser(), false,
                                     conn.deadline(), read_start);
      } else {
        auto [tls_ec, head_bytes] = co_await http::async_read_header(
            conn, conn.read_buffer(), exchange->parser().beast_parser(), as_tuple(use_awaitable));
        read_ec = tls_ec;
      }
      if (read_ec) break;
      const auto head = exchange->take_head();
      if (head == Http1Exchange::Head::final) break;
      if (head == Http1Exchange::Head::unreadable) {
        co_return UpstreamError{Failure::bad_response, {}};
      }
    }
    if (auto error = exchange->settle_head(read_ec)) {
      if (exchange->drop_dead_pooled_connection(*error, /*request_written=*/true)) continue;
      co_return *error;
    }
    co_return std::move(exchange);
  }
  co_return UpstreamError{Failure::no_response, {}};
}

net::awaitable<std::optional<UpstreamError>> Http1Client::warm(const Origin& origin,
                                                               const Limits& limits) {
  AbortHandle abort_handle;
  Timing timing;
  auto opened = co_await connect(origin, limits, abort_handle, timing);
  if (!opened) co_return opened.error();
  deps_.pool.give_back(std::move(opened.value()), Clock::now());
  co_return std::nullopt;
}

}  // namespace sluice::upstream
