#include "sluice/upstream/client.hpp"

#include <openssl/ssl.h>

#include <algorithm>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/buffer.hpp>
#include <boost/asio/ssl/host_name_verification.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core/error.hpp>
#include <boost/beast/http/read.hpp>
#include <span>

#include "sluice/http/drain_aware_read.hpp"
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

const char* to_string(Failure failure) {
  switch (failure) {
    case Failure::dns:
      return "dns";
    case Failure::connect:
      return "connect";
    case Failure::connect_timeout:
      return "connect_timeout";
    case Failure::tls:
      return "tls";
    case Failure::send:
      return "send";
    case Failure::first_byte_timeout:
      return "first_byte_timeout";
    case Failure::no_response:
      return "no_response";
    case Failure::bad_response:
      return "bad_response";
    case Failure::idle_timeout:
      return "idle_timeout";
    case Failure::total_timeout:
      return "total_timeout";
    case Failure::body_interrupted:
      return "body_interrupted";
    case Failure::aborted:
      return "aborted";
  }
  return "unknown";
}

std::string UpstreamError::describe() const {
  std::string text = to_string(failure);
  if (ec) {
    text += ": ";
    text += ec.message();
  }
  return text;
}

void AbortHandle::abort() {
  aborted_ = true;
  if (connection_) connection_->close();
  resolving_.interrupt();
}

Exchange::Exchange(Pool& pool, Limits limits, AbortHandle& abort_handle)
    : pool_(pool), limits_(limits), abort_handle_(abort_handle) {
  reset_parser();
}

void Exchange::reset_parser() {
  parser_.emplace();
  parser_->body_limit(boost::none);  // relayed as it arrives, never held whole
  parser_->header_limit(64 * 1024);
}

Exchange::~Exchange() {
  if (abort_handle_.connection_ == connection_.get()) abort_handle_.connection_ = nullptr;
  if (!connection_) return;
  bool reusable = !failed_ && !abort_handle_.aborted() && parser_->is_done() &&
                  parser_->keep_alive() && connection_->read_buffer().size() == 0 &&
                  connection_->is_open();
  if (reusable) {
    ++connection_->exchanges;
    connection_->trim_read_buffer();
    connection_->expires_never();
    pool_.give_back(std::move(connection_), known_or_now(finished_at_));
  } else {
    connection_->close();
    pool_.note_discarded();
  }
}

void Exchange::drop_dead_connection() {
  abort_handle_.connection_ = nullptr;
  connection_->close();
  connection_.reset();
  pool_.note_discarded();
}

void Exchange::abort() {
  failed_ = true;
  if (connection_) connection_->close();
}

UpstreamError Exchange::classify(const error_code& ec, bool expecting_head) const {
  if (abort_handle_.aborted()) return {Failure::aborted, ec};
  if (ec == beast::error::timeout) {
    // The socket's expiry was the earlier of the stage limit and the total
    // deadline; whichever has passed names the failure.
    if (Clock::now() >= limits_.deadline) return {Failure::total_timeout, ec};
    return {expecting_head ? Failure::first_byte_timeout : Failure::idle_timeout, ec};
  }
  if (expecting_head) {
    bool got_nothing =
        !got_interim_ && !parser_->got_some() && connection_->read_buffer().size() == 0;
    if (got_nothing && (is_benign_network_error(ec) || ec == http::error::end_of_stream)) {
      return {Failure::no_response, ec};
    }
    return {Failure::bad_response, ec};
  }
  return {Failure::body_interrupted, ec};
}

namespace {

// What a read of the body came to: the bytes taken, or 0 once the body is
// complete (a last piece is returned first); nullopt when there is nothing
// to return yet.
std::optional<std::size_t> body_produced(const ResponseParser& parser) {
  const std::size_t produced = parser.body_taken();
  if (produced > 0 || parser.is_done()) return produced;
  return std::nullopt;
}

}  // namespace

std::optional<Result<std::size_t, UpstreamError>> Exchange::read_buffered_body(
    char* data, std::size_t capacity) {
  parser_->set_body_buffer(data, capacity);
  return take_buffered_body();
}

std::optional<Result<std::size_t, UpstreamError>> Exchange::read_buffered_body(
    std::vector<std::string_view>& views) {
  parser_->set_body_views(views);
  return take_buffered_body();
}

std::optional<Result<std::size_t, UpstreamError>> Exchange::take_buffered_body() {
  auto& buffered = connection_->read_buffer();
  while (!parser_->is_done() && buffered.size() > 0) {
    error_code ec;
    const std::size_t used = parser_->put(buffered.data(), ec);
    // Views of the body stay valid: consuming moves no bytes, only the next
    // read of the socket (prepare) does.
    buffered.consume(used);
    // A parser that waits has taken all it can of what is buffered (an
    // event's chunk leaves the CRLF after its data for the next read).
    const bool waits = parser_waits(ec);
    if (waits) ec = {};
    if (ec) {
      failed_ = true;
      return classify(ec, false);
    }
    // Pieces that arrived together (chunks, events) leave as one write.
    if (waits || used == 0 || buffered.size() == 0 || parser_->body_buffer_full()) break;
  }
  if (auto produced = body_produced(*parser_)) return *produced;
  return std::nullopt;
}

TimePoint Exchange::body_read_deadline() const {
  return std::min(Clock::now() + limits_.idle, limits_.deadline);
}

std::optional<Exchange::PlainBodyRead> Exchange::begin_plain_body_read() {
  auto* socket = connection_->plain_socket();
  if (socket == nullptr) return std::nullopt;
  connection_->deadline().expires_at(body_read_deadline());
  auto& buffered = connection_->read_buffer();
  // A body of known length (an embedding of tens of kilobytes) is read in
  // reads as large as what is still to come, not a buffer's worth at a time.
  const std::size_t room = body_read_room(buffered, parser_->body_bytes_to_come());
  if (room == 0) return PlainBodyRead{*socket, {}};
  return PlainBodyRead{*socket, buffered.prepare(room)};
}

error_code Exchange::settle_plain_body_read(error_code ec, std::size_t bytes) {
  auto& buffered = connection_->read_buffer();
  // A read into no room completes at once with nothing.
  if (!ec && bytes == 0 && read_room(buffered) == 0) return http::error::buffer_overflow;
  return settle_read(ec, bytes, buffered, *parser_, connection_->deadline());
}

std::optional<Result<std::size_t, UpstreamError>> Exchange::finish_plain_body_read(
    error_code ec, std::size_t bytes, char* data, std::size_t capacity) {
  ec = settle_plain_body_read(ec, bytes);
  if (!ec) return read_buffered_body(data, capacity);
  failed_ = true;
  return classify(ec, false);
}

std::optional<Result<std::size_t, UpstreamError>> Exchange::finish_plain_body_read(
    error_code ec, std::size_t bytes, std::vector<std::string_view>& views) {
  ec = settle_plain_body_read(ec, bytes);
  if (!ec) return read_buffered_body(views);
  failed_ = true;
  return classify(ec, false);
}

net::awaitable<Result<std::size_t, UpstreamError>> Exchange::read_body(char* data,
                                                                       std::size_t capacity) {
  // The caller found nothing buffered to return (read_buffered_body), so
  // the socket is read first.
  for (;;) {
    if (auto plain = begin_plain_body_read()) {
      auto [read_ec, n] =
          co_await drain_aware_read_some(plain->socket, plain->room, as_tuple(use_awaitable));
      if (auto produced = finish_plain_body_read(read_ec, n, data, capacity)) co_return *produced;
      continue;
    }
    // Beast's read parses into the body buffer set here.
    parser_->set_body_buffer(data, capacity);
    connection_->expires_at(body_read_deadline());
    auto [tls_ec, unused] = co_await http::async_read_some(
        *connection_, connection_->read_buffer(), parser_->beast_parser(), as_tuple(use_awaitable));
    const error_code ec = tls_ec == http::error::need_buffer ? error_code{} : tls_ec;
    if (ec) {
      failed_ = true;
      co_return classify(ec, false);
    }
    if (auto produced = body_produced(*parser_)) co_return *produced;
  }
}

net::awaitable<Result<std::unique_ptr<Connection>, UpstreamError>> Client::connect(
    const Origin& origin, const Limits& limits, AbortHandle& abort_handle, Timing& timing) {
  auto connect_deadline = std::min(Clock::now() + limits.connect, limits.deadline);
  // An address in the URL is the endpoint itself: no lookup, not even the
  // cache's.
  Endpoints resolved;
  std::span<const net::ip::tcp::endpoint> endpoints;
  if (origin.address) {
    endpoints = std::span(&*origin.address, 1);
  } else {
    auto lookup = co_await deps_.dns.resolve(origin.host, origin.port, connect_deadline,
                                             &abort_handle.resolving_);
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
  abort_handle.connection_ = connection.get();

  connection->deadline().expires_at(connect_deadline);
  auto connect_ec =
      co_await connect_relay_socket(connection->socket(), endpoints, connection->deadline());
  connection->deadline().expires_never();
  if (connect_ec) {
    abort_handle.connection_ = nullptr;
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
      abort_handle.connection_ = nullptr;
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

net::awaitable<Result<std::unique_ptr<Exchange>, UpstreamError>> Client::start(
    const Origin& origin, const Request& request, const Limits& limits, AbortHandle& abort_handle) {
  auto exchange = std::make_unique<Exchange>(deps_.pool, limits, abort_handle);
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
    abort_handle.connection_ = connection.get();
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

net::awaitable<std::optional<UpstreamError>> Client::warm(const Origin& origin,
                                                          const Limits& limits) {
  AbortHandle abort_handle;
  Timing timing;
  auto opened = co_await connect(origin, limits, abort_handle, timing);
  if (!opened) co_return opened.error();
  deps_.pool.give_back(std::move(opened.value()), Clock::now());
  co_return std::nullopt;
}

}  // namespace sluice::upstream
