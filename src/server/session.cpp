#include "sluice/server/session.hpp"

#include <spdlog/spdlog.h>
#include <array>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/status.hpp>
#include <optional>

#include "sluice/http/eager_write.hpp"
#include "sluice/http/http_read.hpp"
#include "sluice/http/network_errors.hpp"
#include "sluice/http/relay_socket.hpp"
#include "sluice/http/socket_deadline.hpp"
#include "sluice/openai/api_error.hpp"
#include "sluice/server/gateway.hpp"
#include "sluice/server/pipeline.hpp"
#include "sluice/stream/relay.hpp"

namespace sluice::server {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using net::as_tuple;
using net::use_awaitable;

namespace {

// A client-supplied id is kept when it is short and printable; otherwise one
// is made up. Written over `id`.
void assign_request_id(std::string& id, const ClientRequest& request, Worker& worker) {
  auto given = request["x-request-id"];
  if (!given.empty() && given.size() <= 128) {
    bool printable = true;
    for (char c : given) printable = printable && c > 0x20 && c < 0x7f;
    if (printable) {
      id.assign(given.data(), given.size());
      return;
    }
  }
  // "req_" and 16 hex digits, written by hand: snprintf cost more than the
  // rest of reading a request's head.
  char made[] = "req_0000000000000000";
  auto value = worker.next_random();
  for (std::size_t digit = sizeof made - 2; digit >= 4; --digit) {
    made[digit] = "0123456789abcdef"[value & 0xf];
    value >>= 4;
  }
  id.assign(made, sizeof made - 1);
}

// Which error a failed read of a request maps to; nullopt = close quietly
// (the client left or was too slow).
std::optional<ApiError> read_error_response(const error_code& ec, const config::Server& limits) {
  if (ec == http::error::header_limit) return ApiError::headers_too_large();
  if (ec == http::error::body_limit) return ApiError::body_too_large(limits.max_body_bytes);
  if (ec == beast::error::timeout || is_benign_network_error(ec)) return std::nullopt;
  return ApiError::invalid_request("Malformed HTTP request: " + ec.message() + ".", "",
                                   "bad_request");
}

// An answer to a connection being turned away (unreadable, or over the
// connection limit) gets a short while to leave, whatever server.write_timeout
// allows answers the gateway means to give.
constexpr std::chrono::seconds kRefusalWriteLimit{5};

// Answers before any request has been parsed (no RequestContext yet).
net::awaitable<void> write_plain_error(net::ip::tcp::socket& client, SocketDeadline& deadline,
                                       const ApiError& error) {
  std::string body = error.to_json();
  std::string response =
      "HTTP/1.1 " + std::to_string(error.status) + " " +
      std::string(http::obsolete_reason(static_cast<http::status>(error.status))) +
      "\r\nContent-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
      "\r\nConnection: close\r\n\r\n" + body;
  co_await write_eagerly(client, deadline, kRefusalWriteLimit, net::buffer(response));
}

// Answers a request that could not be read, unless the client just left or
// stalled. A coroutine of its own: the connection's frame lives as long as
// the connection, and should not carry the error's slots.
net::awaitable<void> answer_unreadable(net::ip::tcp::socket& client, SocketDeadline& deadline,
                                       const error_code& ec, const config::Server& limits) {
  if (auto error = read_error_response(ec, limits)) {
    co_await write_plain_error(client, deadline, *error);
  }
}

// Closing right after an error answer while the client is still sending
// would make the kernel reset the connection and discard the answer: send
// FIN, then read and drop what is still coming for a short while.
net::awaitable<void> close_gracefully(net::ip::tcp::socket& client, SocketDeadline& deadline) {
  error_code ignored;
  client.shutdown(net::ip::tcp::socket::shutdown_send, ignored);
  deadline.expires_after(std::chrono::seconds(1));
  std::array<char, 4096> sink;
  for (std::size_t drained = 0; drained < std::size_t{1024} * 1024;) {
    auto [ec, n] = co_await client.async_read_some(net::buffer(sink), as_tuple(use_awaitable));
    if (ec) break;
    drained += n;
  }
  client.close(ignored);
}

// The connection's place in Gateway::open_connections, taken by admit():
// given back however the connection ends, an exception unwinding it
// included, or the gateway would drift toward refusing every connection.
class OpenConnectionCount {
 public:
  explicit OpenConnectionCount(std::atomic<unsigned>& count) : count_(count) {}
  ~OpenConnectionCount() { count_.fetch_sub(1, std::memory_order_relaxed); }
  OpenConnectionCount(const OpenConnectionCount&) = delete;
  OpenConnectionCount& operator=(const OpenConnectionCount&) = delete;

 private:
  std::atomic<unsigned>& count_;
};

}  // namespace

net::awaitable<void> serve_connection(Worker& worker, net::ip::tcp::socket client) {
  auto& gateway = worker.gateway();
  const OpenConnectionCount counted(gateway.open_connections());
  // The next read after a request (most often the watch's, started before
  // the client could send more) then waits for readiness without trying.
  prepare_accepted_relay_socket(client);
  beast::flat_buffer buffer;
  const auto relay_buffers = worker.lend_relay_buffers();
  // The deadline of the request reads, and of any write that has to wait.
  SocketDeadline deadline(client);
  stream::ClientWatch watch(client, buffer);
  auth::KeyMemo key_memo;
  ConnectionStrings strings;
  ClientConnection tracked;
  tracked.socket = &client;
  worker.track(tracked);

  // Whether the client ended the connection between requests.
  bool client_left = false;
  // Whether the client asked for the connection to end with its last answer
  // and sent nothing after that request.
  bool client_asked_to_close = false;
  for (bool first = true;; first = false) {
    auto snapshot = worker.snapshot();
    const auto& limits = snapshot->config->server;
    ClientRequest request;
    request.header_limit(static_cast<std::uint32_t>(limits.max_header_bytes));
    request.body_limit(limits.max_body_bytes);

    const auto wait_started = Clock::now();
    deadline.expires_at(wait_started + (first || buffer.size() > 0 ? limits.header_timeout
                                                                   : limits.keepalive_timeout));
    tracked.idle = buffer.size() == 0;
    // A request starts with its first bytes, not with the wait for them: a
    // kept-alive connection may sit idle for minutes, and that is no part of
    // the next request's duration, TTFT or log time. A new connection's
    // first request most often came with it. Unset: not seen yet.
    std::optional<TimePoint> first_bytes_at;
    if (first || !tracked.idle) first_bytes_at = wait_started;
    if (tracked.idle && gateway.draining()) break;
    // The next request of a kept-alive connection is waited for through the
    // watch, whose read may have begun during the last answer already.
    if (!first_bytes_at) watch.read_next();
    error_code head_ec;
    if (watch.reading()) {
      // Bytes of the next request came with the last one: parse them first
      // instead of waiting for more.
      const bool pipelined = buffer.size() > 0;
      if (pipelined) watch.cancel();
      auto [taken] = co_await watch.async_take_read(as_tuple(use_awaitable));
      head_ec = taken;
      if (pipelined && head_ec == net::error::operation_aborted) head_ec = {};
    } else {
      head_ec = watch.take_read_result();
    }
    head_ec = deadline.translate(head_ec);
    if (head_ec == net::error::eof) head_ec = http::error::end_of_stream;
    if (!head_ec) {
      auto settled = parse_buffered(buffer, request, false);
      if (!settled) {
        if (!first_bytes_at) {
          // Part of a head came after an idle wait: the request has begun,
          // and its head gets the header timeout, not what was left of the
          // idle one.
          first_bytes_at = Clock::now();
          deadline.expires_at(*first_bytes_at + limits.header_timeout);
        }
        settled = co_await read_http(client, buffer, request, false, deadline);
      }
      head_ec = *settled;
    }
    tracked.idle = false;
    if (head_ec) {
      client_left = head_ec == http::error::end_of_stream;
      co_await answer_unreadable(client, deadline, head_ec, limits);
      break;
    }

    if (!request.is_done()) {
      auto expect = request["expect"];
      if (expect.size() == 12 && beast::iequals(expect, "100-continue")) {
        co_await write_eagerly(client, deadline, limits.write_timeout,
                               net::buffer("HTTP/1.1 100 Continue\r\n\r\n", 25));
      }
      auto body_ec = parse_buffered(buffer, request, true);
      if (!body_ec) {
        if (!first_bytes_at) first_bytes_at = Clock::now();
        deadline.expires_after(limits.body_timeout);
        body_ec = co_await read_http(client, buffer, request, true, deadline);
      }
      if (*body_ec) {
        co_await answer_unreadable(client, deadline, *body_ec, limits);
        break;
      }
    }
    deadline.expires_never();
    // A large body grew the buffer; the connection keeps no more than a
    // head's worth while it waits for its next request.
    if (!watch.reading()) release_grown_buffer(buffer);

    strings.reset();
    RequestContext context{
        worker,         snapshot, request,  client,  deadline,
        *relay_buffers, watch,    key_memo, strings, request.keep_alive() && !gateway.draining()};
    assign_request_id(context.request_id, request, worker);
    context.body_read = Clock::now();
    // A request read whole at once started when that read came, which the
    // clock reading just taken stands for.
    context.head_started = first_bytes_at.value_or(context.body_read);

    bool keep_alive = co_await Pipeline::handle(context);
    if (!keep_alive) {
      client_asked_to_close = !request.keep_alive() && buffer.size() == 0;
      break;
    }
  }

  Worker::untrack(tracked);
  watch.cancel();
  if (client_left || client_asked_to_close) {
    // Nothing more can come that would turn the close into a reset (a client
    // that sent "Connection: close" sends no further request): no half-close
    // and draining first, which would hold the connection until the client's
    // own close and cost a wake-up and two system calls.
    error_code ignored;
    client.close(ignored);
  } else {
    co_await close_gracefully(client, deadline);
  }
}

net::awaitable<void> refuse_connection(net::ip::tcp::socket client) {
  SocketDeadline deadline(client);
  co_await write_plain_error(
      client, deadline,
      ApiError::overloaded("The gateway is at its connection limit; retry shortly."));
  co_await close_gracefully(client, deadline);
}

}  // namespace sluice::server
