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
#include "sluice/protocol/dialect.hpp"
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

// Answers before any request has been parsed (no RequestContext yet), in
// the dialect of the endpoint the request's head named, if it was read.
net::awaitable<void> write_plain_error(net::ip::tcp::socket& client, SocketDeadline& deadline,
                                       const ApiError& error,
                                       protocol::Dialect dialect = protocol::Dialect::openai) {
  std::string body = protocol::error_json(dialect, error);
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
                                       const error_code& ec, const config::Server& limits,
                                       protocol::Dialect dialect) {
  if (auto error = read_error_response(ec, limits)) {
    co_await write_plain_error(client, deadline, *error, dialect);
  }
}

// The dialect of the endpoint a request's target names (its body may be
// what could not be read).
protocol::Dialect dialect_of_target(std::string_view target) {
  const auto path = target.substr(0, target.find('?'));
  return protocol::messages_endpoint(path) ? protocol::Dialect::anthropic
                                           : protocol::Dialect::openai;
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

const net::const_buffer kContinueResponse("HTTP/1.1 100 Continue\r\n\r\n", 25);

bool expects_continue(const ClientRequest& request) {
  auto expect = request["expect"];
  return expect.size() == 12 && beast::iequals(expect, "100-continue");
}

// A client connection from one request to the next: what it keeps between
// them, and the plain steps serve_connection takes around its awaits. A local
// of that coroutine: a step that awaited in a coroutine of its own would cost
// a frame for every request, so the steps that wait return what is awaited.
class Connection {
 public:
  Connection(Worker& worker, net::ip::tcp::socket& client)
      : worker_(worker),
        client_(client),
        relay_buffers_(worker.lend_relay_buffers()),
        deadline_(client),
        watch_(client, buffer_) {
    tracked_.socket = &client;
    worker.track(tracked_);
  }

  // Readies the wait for the next request's first bytes; false when the
  // connection is idle and the gateway drains.
  bool begin_wait(ClientRequest& request, const config::Server& limits, bool first);
  bool watch_reading() const { return watch_.reading(); }
  // The watch's read of the next request, to be awaited; its bytes that came
  // with the last request are parsed first instead of waiting for more.
  auto take_watch_read() {
    pipelined_ = buffer_.size() > 0;
    if (pipelined_) watch_.cancel();
    return watch_.async_take_read(as_tuple(use_awaitable));
  }
  // What the wait (`taken`, when the watch's read was awaited) came to, and
  // the head parsed from what is buffered: nullopt when the socket must be
  // read for the rest (read_rest, under the header timeout).
  std::optional<error_code> parse_head(ClientRequest& request, const config::Server& limits,
                                       std::optional<error_code> taken);
  // Whether the head was read; if not, whether the client just left.
  bool head_read(const error_code& ec);
  // The body parsed from what is buffered, as parse_head.
  std::optional<error_code> parse_body(ClientRequest& request, const config::Server& limits);
  auto read_rest(ClientRequest& request, bool whole) {
    return read_http(client_, buffer_, request, whole, deadline_);
  }
  auto send_continue(const config::Server& limits) {
    return write_eagerly(client_, deadline_, limits.write_timeout, kContinueResponse);
  }
  auto answer_unreadable(const error_code& ec, const config::Server& limits,
                         protocol::Dialect dialect) {
    return server::answer_unreadable(client_, deadline_, ec, limits, dialect);
  }
  // The request read whole: the connection's waits end, and the pipeline
  // gets the request's context.
  RequestContext hand_over(const std::shared_ptr<const Snapshot>& snapshot, ClientRequest& request);
  // The pipeline ended the connection with the answer to `request`.
  void note_last_answer(const ClientRequest& request) {
    client_asked_to_close_ = !request.keep_alive() && buffer_.size() == 0;
  }
  // Leaves the worker's connections, and closes the socket unless the
  // client may still be sending: then false, and close_gracefully is to be
  // awaited.
  bool close_at_once();
  auto close_gracefully() { return server::close_gracefully(client_, deadline_); }

 private:
  Worker& worker_;
  net::ip::tcp::socket& client_;
  beast::flat_buffer buffer_;
  const Worker::RelayBuffersLoan relay_buffers_;
  // The deadline of the request reads, and of any write that has to wait.
  SocketDeadline deadline_;
  stream::ClientWatch watch_;
  auth::KeyMemo key_memo_;
  ConnectionStrings strings_;
  ClientConnection tracked_;
  // A request starts with its first bytes, not with the wait for them: a
  // kept-alive connection may sit idle for minutes, and that is no part of
  // the next request's duration, TTFT or log time. A new connection's
  // first request most often came with it. Unset: not seen yet.
  std::optional<TimePoint> first_bytes_at_;
  // Bytes of the next request came with the last one.
  bool pipelined_ = false;
  // Whether the client ended the connection between requests.
  bool client_left_ = false;
  // Whether the client asked for the connection to end with its last answer
  // and sent nothing after that request.
  bool client_asked_to_close_ = false;
};

bool Connection::begin_wait(ClientRequest& request, const config::Server& limits, bool first) {
  request.header_limit(static_cast<std::uint32_t>(limits.max_header_bytes));
  request.body_limit(limits.max_body_bytes);
  const auto wait_started = Clock::now();
  deadline_.expires_at(wait_started + (first || buffer_.size() > 0 ? limits.header_timeout
                                                                   : limits.keepalive_timeout));
  tracked_.idle = buffer_.size() == 0;
  first_bytes_at_.reset();
  if (first || !tracked_.idle) first_bytes_at_ = wait_started;
  pipelined_ = false;
  if (tracked_.idle && worker_.gateway().draining()) return false;
  // The next request of a kept-alive connection is waited for through the
  // watch, whose read may have begun during the last answer already.
  if (!first_bytes_at_) watch_.read_next();
  return true;
}

std::optional<error_code> Connection::parse_head(ClientRequest& request,
                                                 const config::Server& limits,
                                                 std::optional<error_code> taken) {
  auto ec = taken ? *taken : watch_.take_read_result();
  if (pipelined_ && ec == net::error::operation_aborted) ec = {};
  ec = deadline_.translate(ec);
  if (ec == net::error::eof) ec = http::error::end_of_stream;
  if (ec) return ec;
  auto settled = parse_buffered(buffer_, request, false);
  if (!settled && !first_bytes_at_) {
    // Part of a head came after an idle wait: the request has begun, and
    // its head gets the header timeout, not what was left of the idle one.
    first_bytes_at_ = Clock::now();
    deadline_.expires_at(*first_bytes_at_ + limits.header_timeout);
  }
  return settled;
}

bool Connection::head_read(const error_code& ec) {
  tracked_.idle = false;
  client_left_ = ec == http::error::end_of_stream;
  return !ec;
}

std::optional<error_code> Connection::parse_body(ClientRequest& request,
                                                 const config::Server& limits) {
  auto settled = parse_buffered(buffer_, request, true);
  if (!settled) {
    if (!first_bytes_at_) first_bytes_at_ = Clock::now();
    deadline_.expires_after(limits.body_timeout);
  }
  return settled;
}

RequestContext Connection::hand_over(const std::shared_ptr<const Snapshot>& snapshot,
                                     ClientRequest& request) {
  deadline_.expires_never();
  // A large body grew the buffer; the connection keeps no more than a
  // head's worth while it waits for its next request.
  if (!watch_.reading()) release_grown_buffer(buffer_);
  strings_.reset();
  assign_request_id(strings_.request_id, request, worker_);
  const auto body_read = Clock::now();
  return RequestContext{
      .worker = worker_,
      .snapshot = snapshot,
      .request = request,
      .client = client_,
      .client_deadline = deadline_,
      .relay_buffers = *relay_buffers_,
      .watch = watch_,
      .key_memo = key_memo_,
      .strings = strings_,
      .keep_alive = request.keep_alive() && !worker_.gateway().draining(),
      // A request read whole at once started when that read came, which
      // the clock reading just taken stands for.
      .head_started = first_bytes_at_.value_or(body_read),
      .body_read = body_read,
  };
}

bool Connection::close_at_once() {
  Worker::untrack(tracked_);
  watch_.cancel();
  // Nothing more can come that would turn the close into a reset (a client
  // that sent "Connection: close" sends no further request): no half-close
  // and draining first, which would hold the connection until the client's
  // own close and cost a wake-up and two system calls.
  if (!client_left_ && !client_asked_to_close_) return false;
  error_code ignored;
  client_.close(ignored);
  return true;
}

}  // namespace

net::awaitable<void> serve_connection(Worker& worker, net::ip::tcp::socket client) {
  const OpenConnectionCount counted(worker.gateway().open_connections());
  // The next read after a request (most often the watch's, started before
  // the client could send more) then waits for readiness without trying.
  prepare_accepted_relay_socket(client);
  Connection connection(worker, client);
  for (bool first = true;; first = false) {
    auto snapshot = worker.snapshot();
    const auto& limits = snapshot->config->server;
    ClientRequest request;
    if (!connection.begin_wait(request, limits, first)) break;
    std::optional<error_code> taken;
    if (connection.watch_reading()) {
      auto [ec] = co_await connection.take_watch_read();
      taken = ec;
    }
    auto settled = connection.parse_head(request, limits, taken);
    if (!settled) settled = co_await connection.read_rest(request, false);
    if (!connection.head_read(*settled)) {
      // The target is known when the head was whole but refused (a body
      // announced over the limit); empty otherwise.
      co_await connection.answer_unreadable(*settled, limits, dialect_of_target(request.target()));
      break;
    }
    if (!request.is_done()) {
      if (expects_continue(request)) co_await connection.send_continue(limits);
      settled = connection.parse_body(request, limits);
      if (!settled) settled = co_await connection.read_rest(request, true);
      if (*settled) {
        co_await connection.answer_unreadable(*settled, limits,
                                              dialect_of_target(request.target()));
        break;
      }
    }
    auto context = connection.hand_over(snapshot, request);
    Pipeline::Request pipeline(context);
    const bool keep_alive = co_await pipeline.answer();
    pipeline.account(keep_alive);
    if (!keep_alive) {
      connection.note_last_answer(request);
      break;
    }
  }
  if (!connection.close_at_once()) co_await connection.close_gracefully();
}

net::awaitable<void> refuse_connection(net::ip::tcp::socket client) {
  SocketDeadline deadline(client);
  co_await write_plain_error(
      client, deadline,
      ApiError::overloaded("The gateway is at its connection limit; retry shortly."));
  co_await close_gracefully(client, deadline);
}

}  // namespace sluice::server
