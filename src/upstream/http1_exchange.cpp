#include "sluice/upstream/http1_exchange.hpp"

#include <algorithm>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core/error.hpp>
#include <boost/beast/http/read.hpp>

#include "sluice/http/drain_aware_read.hpp"
#include "sluice/http/http_read.hpp"

namespace sluice::upstream {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using net::as_tuple;
using net::use_awaitable;

namespace {

void close_connection(void* connection) { static_cast<Connection*>(connection)->close(); }

// What a read of the body came to: the bytes taken, or 0 once the body is
// complete (a last piece is returned first); nullopt when there is nothing
// to return yet.
std::optional<std::size_t> body_produced(const ResponseParser& parser) {
  const std::size_t produced = parser.body_taken();
  if (produced > 0 || parser.is_done()) return produced;
  return std::nullopt;
}

}  // namespace

Http1Exchange::Http1Exchange(Pool& pool, Limits limits, AbortHandle& abort_handle)
    : pool_(pool), limits_(limits), abort_handle_(abort_handle) {
  reset_parser();
}

void Http1Exchange::reset_parser() {
  parser_.emplace();
  parser_->body_limit(boost::none);  // relayed as it arrives, never held whole
  parser_->header_limit(64 * 1024);
}

bool Http1Exchange::reusable() const {
  return connection_ && !failed_ && !abort_handle_.aborted() && parser_->is_done() &&
         parser_->keep_alive() && connection_->read_buffer().size() == 0 && connection_->is_open();
}

Http1Exchange::~Http1Exchange() {
  // An abort from now on must not reach a connection that is gone.
  abort_handle_.clear_stop(connection_.get());
  if (!connection_) return;
  if (reusable()) {
    ++connection_->exchanges;
    connection_->trim_read_buffer();
    connection_->expires_never();
    pool_.give_back(std::move(connection_), known_or_now(finished_at_));
  } else {
    connection_->close();
    pool_.note_discarded();
  }
}

void Http1Exchange::begin_round(std::unique_ptr<Connection> connection) {
  abort_handle_.stop_with(&close_connection, connection.get());
  connection_ = std::move(connection);
  reset_parser();
  failed_ = false;
  got_interim_ = false;
  // The wait for the head starts once the connection is ready to send, and
  // bounds the request's write and the head's read together.
  connection_->expires_at(std::min(timing_.secured + limits_.ttft, limits_.deadline));
}

std::optional<UpstreamError> Http1Exchange::settle_send(error_code ec) {
  ec = connection_->deadline().translate(ec);
  timing_.sent = Clock::now();
  if (!ec) {
    abort_handle_.notify_sent();
    return std::nullopt;
  }
  failed_ = true;
  auto error = classify(ec, true);
  if (error.failure != Failure::aborted && !error.is_timeout()) error.failure = Failure::send;
  return error;
}

Http1Exchange::Head Http1Exchange::take_head() {
  // An interim head is complete as it stands, and the final one follows on
  // the same connection, under the same deadline: relayed, or pooled with
  // that still to come, it would reach another request.
  if (parser_->status() / 100 != 1) return Head::final;
  if (parser_->status() == 101) {
    failed_ = true;
    return Head::unreadable;
  }
  got_interim_ = true;
  reset_parser();
  return Head::interim;
}

std::optional<UpstreamError> Http1Exchange::settle_head(error_code ec) {
  if (ec) {
    failed_ = true;
    return classify(ec, true);
  }
  timing_.first_byte = Clock::now();
  return std::nullopt;
}

bool Http1Exchange::drop_dead_pooled_connection(const UpstreamError& error, bool request_written) {
  // Until the request is written whole any failure but our own abort shows
  // a dead connection; after that only an end before any response byte
  // does, since a live upstream may take its time or answer badly.
  if (!timing_.reused || error.failure == Failure::aborted) return false;
  if (request_written && error.failure != Failure::no_response) return false;
  abort_handle_.clear_stop();
  connection_->close();
  connection_.reset();
  pool_.note_discarded();
  return true;
}

void Http1Exchange::abort() {
  failed_ = true;
  if (connection_) connection_->close();
}

UpstreamError Http1Exchange::classify(const error_code& ec, bool expecting_head) const {
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

std::optional<Result<std::size_t, UpstreamError>> Http1Exchange::read_buffered_body(
    char* data, std::size_t capacity) {
  parser_->set_body_buffer(data, capacity);
  return take_buffered_body();
}

std::optional<Result<std::size_t, UpstreamError>> Http1Exchange::read_buffered_body(
    std::vector<std::string_view>& views) {
  parser_->set_body_views(views);
  return take_buffered_body();
}

std::optional<Result<std::size_t, UpstreamError>> Http1Exchange::take_buffered_body() {
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

TimePoint Http1Exchange::body_read_deadline() const {
  return std::min(Clock::now() + limits_.idle, limits_.deadline);
}

std::optional<Exchange::PlainBodyRead> Http1Exchange::begin_plain_body_read() {
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

error_code Http1Exchange::settle_plain_body_read(error_code ec, std::size_t bytes) {
  auto& buffered = connection_->read_buffer();
  // A read into no room completes at once with nothing.
  if (!ec && bytes == 0 && read_room(buffered) == 0) return http::error::buffer_overflow;
  return settle_read(ec, bytes, buffered, *parser_, connection_->deadline());
}

std::optional<Result<std::size_t, UpstreamError>> Http1Exchange::finish_plain_body_read(
    error_code ec, std::size_t bytes, char* data, std::size_t capacity) {
  ec = settle_plain_body_read(ec, bytes);
  if (!ec) return read_buffered_body(data, capacity);
  failed_ = true;
  return classify(ec, false);
}

std::optional<Result<std::size_t, UpstreamError>> Http1Exchange::finish_plain_body_read(
    error_code ec, std::size_t bytes, std::vector<std::string_view>& views) {
  ec = settle_plain_body_read(ec, bytes);
  if (!ec) return read_buffered_body(views);
  failed_ = true;
  return classify(ec, false);
}

net::awaitable<Result<std::size_t, UpstreamError>> Http1Exchange::read_body(char* data,
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

}  // namespace sluice::upstream
