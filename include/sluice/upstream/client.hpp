#pragma once

#include <array>
#include <boost/asio/awaitable.hpp>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "sluice/common/clock.hpp"
#include "sluice/common/result.hpp"
#include "sluice/http/network_errors.hpp"
#include "sluice/upstream/connection.hpp"
#include "sluice/upstream/dns_cache.hpp"
#include "sluice/upstream/origin.hpp"
#include "sluice/upstream/pool.hpp"
#include "sluice/upstream/response_parser.hpp"
#include "sluice/upstream/tls_contexts.hpp"

namespace sluice::upstream {

enum class Failure {
  dns,                 // name did not resolve
  connect,             // refused, unreachable
  connect_timeout,     // connect (with DNS and TLS) took longer than timeouts.connect
  tls,                 // handshake or certificate verification failed
  send,                // the request could not be written
  first_byte_timeout,  // no response byte within timeouts.ttft
  no_response,         // the connection closed before any response byte
  bad_response,        // bytes that are not an HTTP/1.1 response
  idle_timeout,        // a gap between two body reads longer than timeouts.idle
  total_timeout,       // the whole exchange took longer than timeouts.total
  body_interrupted,    // reset or truncated after the head
  aborted,             // stopped from our side (client gone, hedge lost)
};

struct UpstreamError {
  Failure failure;
  error_code ec;

  bool is_timeout() const {
    return failure == Failure::connect_timeout || failure == Failure::first_byte_timeout ||
           failure == Failure::idle_timeout || failure == Failure::total_timeout;
  }
  std::string describe() const;
};

const char* to_string(Failure failure);

// What to send. The body is given in up to five pieces that are written as
// one gather write, so a body with a field replaced or added needs no copy.
struct Request {
  std::string_view method = "POST";
  // The deployment's path prefix, the endpoint's path and the query: written
  // one after the other, so no attempt has to join them first.
  std::array<std::string_view, 3> target{};
  // Preformatted "Name: value\r\n" lines: the client's forwarded ones, the
  // gateway's (request id, trace) and the deployment's own.
  std::array<std::string_view, 3> fields{};
  std::array<std::string_view, 5> body{};
};

struct Limits {
  std::chrono::milliseconds connect{2000};
  std::chrono::milliseconds ttft{10000};
  std::chrono::milliseconds idle{30000};
  TimePoint deadline = TimePoint::max();  // from timeouts.total
  // When the caller began the attempt, if it has read the clock already.
  TimePoint started{};
};

struct Timing {
  TimePoint started{};
  TimePoint connected{};  // TCP established (== started when reused)
  TimePoint secured{};    // TLS handshake done (== connected for plain)
  TimePoint sent{};
  TimePoint first_byte{};  // response head received
  bool reused = false;
};

// Lets another coroutine on the same thread stop the exchange that is running
// (the client went away, a hedge won): the socket is closed, or the wait for
// a lookup ended, so whatever the exchange awaits completes at once.
class AbortHandle {
 public:
  void abort();
  bool aborted() const { return aborted_; }

  // `hook(argument)` is called each time the request has been written; null
  // calls nothing. A watcher of the client starts its own reading then,
  // rather than on the way to the upstream.
  void call_when_sent(void (*hook)(void*), void* argument) {
    sent_hook_ = hook;
    sent_argument_ = argument;
  }
  // The client calls this once the request is written.
  void notify_sent() const {
    if (sent_hook_) sent_hook_(sent_argument_);
  }

 private:
  friend class Client;
  friend class Exchange;

  // Null whenever the exchange holds no open connection, so that an abort
  // never reaches one that is gone.
  Connection* connection_ = nullptr;
  ResolveWait resolving_;
  bool aborted_ = false;
  void (*sent_hook_)(void*) = nullptr;
  void* sent_argument_ = nullptr;
};

// A request in flight whose response head has arrived. The body is read with
// read_body; when the Exchange is destroyed the connection goes back to the
// pool only if the response was read to its end and the upstream keeps it
// alive — otherwise it is closed.
class Exchange {
 public:
  Exchange(Pool& pool, Limits limits, AbortHandle& abort_handle);
  ~Exchange();
  Exchange(const Exchange&) = delete;
  Exchange& operator=(const Exchange&) = delete;

  unsigned status() const { return parser_->status(); }
  // The response's end-to-end fields as "Name: value\r\n" lines.
  std::string_view forwarded_fields() const { return parser_->forwarded_fields(); }
  std::string_view content_type() const { return parser_->content_type(); }
  bool is_event_stream() const { return parser_->is_event_stream(); }
  std::optional<std::chrono::seconds> retry_after() const { return parser_->retry_after(); }
  std::optional<std::uint64_t> content_length() const {
    auto length = parser_->content_length();
    return length ? std::optional<std::uint64_t>(*length) : std::nullopt;
  }
  bool finished() const { return parser_->is_done(); }
  const Timing& timing() const { return timing_; }
  // When the caller saw the exchange end; the connection's idle time in the
  // pool counts from there.
  void note_finished(TimePoint when) { finished_at_ = when; }

  // The next part of the body, into [data, data + capacity): the number of
  // bytes, 0 once the body is complete. First from what the connection has
  // buffered already, in plain code: nullopt when the socket must be read.
  // Most bodies come with their head, and most events whole: awaiting a
  // coroutine for them would cost a frame each.
  std::optional<Result<std::size_t, UpstreamError>> read_buffered_body(char* data,
                                                                       std::size_t capacity);
  // The same, but the body is appended to `views` as views of the
  // connection's read buffer rather than copied: they stay valid until the
  // socket is read again (begin_plain_body_read) or the exchange ends. Only
  // for a connection that reads_in_place: a TLS connection's reads go
  // through Beast's, which may move buffered bytes while it reads.
  std::optional<Result<std::size_t, UpstreamError>> read_buffered_body(
      std::vector<std::string_view>& views);
  bool reads_in_place() const { return connection_->plain_socket() != nullptr; }
  // Then from the socket, when read_buffered_body returned nullopt (it does
  // not look at the buffer again before it reads).
  boost::asio::awaitable<Result<std::size_t, UpstreamError>> read_body(char* data,
                                                                       std::size_t capacity);

  // read_body's socket read of a plain connection, in two plain steps for a
  // caller that awaits the read in its own coroutine: a stream's relay reads
  // once per event, and a coroutine of the exchange's would cost a frame
  // each time. begin_plain_body_read sets the read deadline and says where
  // to read (nullopt for a TLS connection: read_body reads those);
  // finish_plain_body_read takes the read's outcome and answers as
  // read_body does, or nullopt when the socket must be read again.
  struct PlainBodyRead {
    boost::asio::ip::tcp::socket& socket;
    boost::asio::mutable_buffer room;  // empty when the buffer is full
  };
  std::optional<PlainBodyRead> begin_plain_body_read();
  std::optional<Result<std::size_t, UpstreamError>> finish_plain_body_read(error_code ec,
                                                                           std::size_t bytes,
                                                                           char* data,
                                                                           std::size_t capacity);
  std::optional<Result<std::size_t, UpstreamError>> finish_plain_body_read(
      error_code ec, std::size_t bytes, std::vector<std::string_view>& views);

  // Closes the connection now; it will not be reused.
  void abort();

 private:
  friend class Client;
  UpstreamError classify(const error_code& ec, bool expecting_head) const;
  // When the next body read gives up: timeouts.idle from now, or the total
  // deadline if that comes first.
  TimePoint body_read_deadline() const;
  // read_buffered_body into the buffer or views set on the parser.
  std::optional<Result<std::size_t, UpstreamError>> take_buffered_body();
  // A plain socket read's outcome, settled into the read buffer.
  error_code settle_plain_body_read(error_code ec, std::size_t bytes);
  void reset_parser();
  // Closes a pooled connection that turned out dead before the response,
  // for a fresh one to take its place.
  void drop_dead_connection();

  Pool& pool_;
  Limits limits_;
  AbortHandle& abort_handle_;
  std::unique_ptr<Connection> connection_;
  std::optional<ResponseParser> parser_;  // fresh for every round of Client::start
  Timing timing_;
  TimePoint finished_at_{};
  bool failed_ = false;
  // An interim head (1xx) came on this round: the upstream has the request,
  // and a close now is no sign of a connection that was dead already.
  bool got_interim_ = false;
};

struct ClientDeps {
  Pool& pool;
  DnsCache& dns;
  TlsContexts& tls;
};

// A generic HTTP/1.1 client over the pool: knows nothing of routing or auth.
// One per worker thread: its requests interleave only where they wait.
class Client {
 public:
  explicit Client(ClientDeps deps) : deps_(deps) {}

  // Sends the request and waits for the final response head: interim heads
  // (103 Early Hints, 100 Continue) are read and dropped within the
  // first-byte deadline, and a 101 is a bad_response. A pooled connection
  // that turns out dead before any response byte is replaced by a fresh one
  // once.
  boost::asio::awaitable<Result<std::unique_ptr<Exchange>, UpstreamError>> start(
      const Origin& origin, const Request& request, const Limits& limits,
      AbortHandle& abort_handle);

  // Opens a connection and parks it in the pool, so the first request pays no
  // handshake.
  boost::asio::awaitable<std::optional<UpstreamError>> warm(const Origin& origin,
                                                            const Limits& limits);

  Pool& pool() { return deps_.pool; }

 private:
  boost::asio::awaitable<Result<std::unique_ptr<Connection>, UpstreamError>> connect(
      const Origin& origin, const Limits& limits, AbortHandle& abort_handle, Timing& timing);

  ClientDeps deps_;
  // Where each request's head is written just before it is sent: a head
  // sent without a wait needs no string of its own. One that has to wait is
  // copied out first, since other requests write theirs here meanwhile.
  std::string head_scratch_;
};

}  // namespace sluice::upstream
