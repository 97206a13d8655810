#pragma once

#include <array>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/buffer.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/system/errc.hpp>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "sluice/common/clock.hpp"
#include "sluice/common/result.hpp"
#include "sluice/http/network_errors.hpp"

// What the gateway sees of an upstream request, whatever carries it: the
// attempts loop and the relay know these types only, so a transport is added
// without touching them (upstream/transports.hpp).
namespace sluice::upstream {

enum class Failure {
  dns,                 // name did not resolve
  connect,             // refused, unreachable
  connect_timeout,     // connect (with DNS and TLS) took longer than timeouts.connect
  tls,                 // handshake or certificate verification failed
  send,                // the request could not be written
  first_byte_timeout,  // no response byte within timeouts.ttft
  no_response,         // the connection closed before any response byte
  bad_response,        // bytes that are not an HTTP response
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
// (the client went away, a hedge won): whatever the exchange awaits then
// completes at once. The transport says what stopping means for the step it
// is in (close a socket, end the wait for a lookup, reset a stream) as a
// plain function and its argument: an abort is rare, and a request sets and
// clears what is to stop a few times, which must cost no allocation.
class AbortHandle {
 public:
  using Stop = void (*)(void* target);

  void abort() {
    aborted_ = true;
    if (stop_) stop_(stop_target_);
  }
  bool aborted() const { return aborted_; }

  // For the transport: what abort() stops from now on, replacing what was
  // set before. The target must outlive the setting: clear it (or set
  // another) before it goes.
  void stop_with(Stop stop, void* target) {
    stop_ = stop;
    stop_target_ = target;
  }
  void clear_stop() { stop_with(nullptr, nullptr); }
  // Clears the setting only if it still stops `target`, for an owner that
  // goes and does not know whether a later step replaced it.
  void clear_stop(const void* target) {
    if (stop_target_ == target) clear_stop();
  }

  // `hook(argument)` is called each time the request has been written; null
  // calls nothing. A watcher of the client starts its own reading then,
  // rather than on the way to the upstream.
  void call_when_sent(void (*hook)(void*), void* argument) {
    sent_hook_ = hook;
    sent_argument_ = argument;
  }
  // The transport calls this once the request is written.
  void notify_sent() const {
    if (sent_hook_) sent_hook_(sent_argument_);
  }

 private:
  Stop stop_ = nullptr;
  void* stop_target_ = nullptr;
  bool aborted_ = false;
  void (*sent_hook_)(void*) = nullptr;
  void* sent_argument_ = nullptr;
};

// A request in flight whose response head has arrived, as a transport
// (upstream/transport.hpp) hands it over. Destroying it ends the exchange:
// what carried it is kept for another request only if the response was read
// to its end (reusable()).
//
// The body is read with read_buffered_body first, in plain code, and with
// read_body only when that finds nothing: a relay reads thousands of times a
// second, and awaiting a coroutine costs a frame each time. The zero-copy
// members (reads_in_place, the views overloads, begin/finish_plain_body_read)
// are for a transport whose body lies in one socket's read buffer; their
// defaults say "not offered", and a caller then takes the general path
// above.
class Exchange {
 public:
  Exchange() = default;
  virtual ~Exchange() = default;
  Exchange(const Exchange&) = delete;
  Exchange& operator=(const Exchange&) = delete;

  virtual unsigned status() const = 0;
  // The response's end-to-end fields as "Name: value\r\n" lines.
  virtual std::string_view forwarded_fields() const = 0;
  virtual std::string_view content_type() const = 0;
  virtual bool is_event_stream() const = 0;
  // How long the upstream asked to be left alone (retry-after-ms, or
  // Retry-After's seconds), to the millisecond.
  virtual std::optional<std::chrono::milliseconds> retry_after() const = 0;
  virtual std::optional<std::uint64_t> content_length() const = 0;
  // The body has been read to its end.
  virtual bool finished() const = 0;
  virtual const Timing& timing() const = 0;
  // When the caller saw the exchange end; what carried it counts its idle
  // time from there.
  virtual void note_finished(TimePoint when) = 0;
  // Whether what carried the exchange can carry another request once this
  // one is destroyed, as things stand now.
  virtual bool reusable() const = 0;

  // The next part of the body, into [data, data + capacity): the number of
  // bytes, 0 once the body is complete. Only from what has arrived already:
  // nullopt when read_body must wait for more.
  virtual std::optional<Result<std::size_t, UpstreamError>> read_buffered_body(
      char* data, std::size_t capacity) = 0;
  // The same, but the body is appended to `views` rather than copied: they
  // stay valid until the next read or the exchange ends. Only called when
  // reads_in_place().
  virtual std::optional<Result<std::size_t, UpstreamError>> read_buffered_body(
      std::vector<std::string_view>& views) {
    (void)views;
    return std::nullopt;
  }
  virtual bool reads_in_place() const { return false; }
  // Waits for the next part of the body, when read_buffered_body returned
  // nullopt (it does not look at what arrived before it waits).
  virtual boost::asio::awaitable<Result<std::size_t, UpstreamError>> read_body(
      char* data, std::size_t capacity) = 0;

  // read_body's socket read, in two plain steps for a caller that awaits
  // the read in its own coroutine: a stream's relay reads once per event,
  // and a coroutine of the exchange's would cost a frame each time.
  // begin_plain_body_read sets the read deadline and says where to read
  // (nullopt when the exchange reads no socket of its own: read_body reads
  // then); finish_plain_body_read takes the read's outcome and answers as
  // read_body does, or nullopt when the socket must be read again. Always
  // available when reads_in_place().
  struct PlainBodyRead {
    boost::asio::ip::tcp::socket& socket;
    boost::asio::mutable_buffer room;  // empty when the buffer is full
  };
  virtual std::optional<PlainBodyRead> begin_plain_body_read() { return std::nullopt; }
  virtual std::optional<Result<std::size_t, UpstreamError>> finish_plain_body_read(
      error_code ec, std::size_t bytes, char* data, std::size_t capacity) {
    (void)ec, (void)bytes, (void)data, (void)capacity;
    return not_reading_a_socket();
  }
  virtual std::optional<Result<std::size_t, UpstreamError>> finish_plain_body_read(
      error_code ec, std::size_t bytes, std::vector<std::string_view>& views) {
    (void)ec, (void)bytes, (void)views;
    return not_reading_a_socket();
  }

  // Ends the exchange now, from our side; what carried it is not reused.
  virtual void abort() = 0;

 private:
  // What the socket steps answer for an exchange that reads no socket: a
  // caller that skipped begin_plain_body_read's nullopt gets an error, not
  // a wait that never ends.
  static UpstreamError not_reading_a_socket() {
    return {Failure::body_interrupted,
            make_error_code(boost::system::errc::operation_not_supported)};
  }
};

}  // namespace sluice::upstream
