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

#include "sluice/http/eager_write.hpp"
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

net::awaitable<Result<std::unique_ptr<Connection>, UpstreamError>> Http1Client::connect(
    const Origin& origin, const Limits& limits, AbortHandle& abort_handle, Timing& timing) {
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

net::awaitable<Result<std::unique_ptr<Exchange>, UpstreamError>> Http1Client::start(
    const Origin& origin, const Request& request, const Limits& limits, AbortHandle& abort_handle) {
  auto exchange = std::make_unique<Http1Exchange>(deps_.pool, limits, abort_handle);
  exchange->timing_.started = known_or_now(limits.started);

  std::size_t body_size = 0;
  for (auto part : request.body) body_size += part.size();
  std::array<net::const_buffer, 6> wire = {
      net::const_buffer(),          net::buffer(request.body[0]), net::buffer(request.body[1]),
      net::buffer(request.body[2]), net::buffer(request.body[3]), net::buffer(request.body[4])};
  // Only a head whose write has to wait is kept here: nothing of the request
  // is needed once the response has begun.
  std::string waiting_head;

  // The second round only happens when a pooled connection was dead.
  for (int round = 0; round < 2; ++round) {
    auto& timing = exchange->timing_;
    auto connection = round == 0 ? deps_.pool.take(origin.key(), timing.started) : nullptr;
    timing.reused = connection != nullptr;
    if (connection) {
      // Taking a pooled connection costs nothing worth a clock read.
      timing.connected = timing.secured = timing.started;
    } else {
      auto opened = co_await connect(origin, limits, abort_handle, timing);
      if (!opened) co_return opened.error();
      connection = std::move(opened.value());
    }
    abort_handle.stop_with(&close_connection, connection.get());
    exchange->connection_ = std::move(connection);
    exchange->reset_parser();
    exchange->failed_ = false;
    exchange->got_interim_ = false;

    auto& conn = *exchange->connection_;
    // The wait for the head starts once the connection is ready to send, and
    // bounds the request's write and the head's read together.
    const auto head_deadline = std::min(timing.secured + limits.ttft, limits.deadline);
    conn.expires_at(head_deadline);
    // Written here, with no wait between this and the write below.
    HeadWriter(head_scratch_)
        .request_line(request.method, request.target)
        .field("Host", origin.host_header())
        .field("Content-Length", body_size)
        .raw_fields(request.fields[0])
        .raw_fields(request.fields[1])
        .raw_fields(request.fields[2])
        .finish();
    wire[0] = net::buffer(head_scratch_);
    auto sent = write_now(conn.plain_socket(), wire);
    // Sent whole without a wait: the answer can only come after it, and the
    // head read below may wait for it without trying first.
    const auto first_read =
        sent.finished && !sent.ec ? ReadStart::awaiting_reply : ReadStart::try_at_once;
    if (!sent.finished) {
      waiting_head = head_scratch_;
      wire[0] = net::buffer(waiting_head);
      sent = co_await write_rest(conn, wire, sent);
    }
    const error_code write_ec = conn.deadline().translate(sent.ec);
    timing.sent = Clock::now();
    if (write_ec) {
      exchange->failed_ = true;
      if (timing.reused && !abort_handle.aborted()) {
        exchange->drop_dead_connection();
        continue;
      }
      auto error = exchange->classify(write_ec, true);
      if (error.failure != Failure::aborted && !error.is_timeout()) error.failure = Failure::send;
      co_return error;
    }
    abort_handle.notify_sent();

    error_code read_ec;
    for (auto read_start = first_read;; read_start = ReadStart::try_at_once) {
      if (auto* socket = conn.plain_socket()) {
        read_ec = co_await read_http(*socket, conn.read_buffer(), *exchange->parser_, false,
                                     conn.deadline(), read_start);
      } else {
        auto [tls_ec, head_bytes] = co_await http::async_read_header(
            conn, conn.read_buffer(), exchange->parser_->beast_parser(), as_tuple(use_awaitable));
        read_ec = tls_ec;
      }
      // An interim head is complete as it stands, and the final one follows
      // on the same connection, under the same deadline: relayed, or pooled
      // with that still to come, it would reach another request.
      if (read_ec || exchange->parser_->status() / 100 != 1) break;
      if (exchange->parser_->status() == 101) {
        // Switching protocols: nothing this client could read or relay.
        exchange->failed_ = true;
        co_return UpstreamError{Failure::bad_response, {}};
      }
      exchange->got_interim_ = true;
      exchange->reset_parser();
    }
    if (read_ec) {
      exchange->failed_ = true;
      auto error = exchange->classify(read_ec, true);
      if (timing.reused && error.failure == Failure::no_response) {
        exchange->drop_dead_connection();
        continue;
      }
      co_return error;
    }
    timing.first_byte = Clock::now();
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
