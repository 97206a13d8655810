#include "sluice/upstream/http2_client.hpp"

#include <nghttp2/nghttp2.h>

#include <algorithm>
#include <array>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <charconv>
#include <cstring>

#include "sluice/common/ascii.hpp"
#include "sluice/http/http_head.hpp"
#include "sluice/upstream/response_parser.hpp"

namespace sluice::upstream {

namespace net = boost::asio;
using net::as_tuple;
using net::use_awaitable;

namespace {

// Windows large enough that a streamed answer is never held up by them;
// they are given back only as the relay takes the bytes, so a slow client
// still throttles its own stream.
constexpr std::int32_t kStreamWindow = 4 * 1024 * 1024;
constexpr std::int32_t kConnectionWindow = 64 * 1024 * 1024;
// What a connection is assumed to allow before the peer's SETTINGS say.
constexpr std::uint32_t kAssumedMaxStreams = 100;
constexpr std::size_t kReadBufferSize = 16 * 1024;
constexpr std::size_t kWriteBatch = 64 * 1024;
// A request refused by one connection (GOAWAY, REFUSED_STREAM) is tried on
// another this many times in all.
constexpr int kRounds = 3;

// ALPN's wire format: h2, then http/1.1.
constexpr std::string_view kAlpnH2OrHttp11("\x02h2\x08http/1.1", 12);
constexpr std::string_view kAlpnH2("\x02h2", 3);

std::optional<std::uint64_t> whole_number(std::string_view value) {
  std::uint64_t number = 0;
  auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), number);
  if (ec != std::errc() || end != value.data() + value.size()) return std::nullopt;
  return number;
}

nghttp2_nv name_value(std::string_view name, std::string_view value) {
  return {reinterpret_cast<std::uint8_t*>(const_cast<char*>(name.data())),
          reinterpret_cast<std::uint8_t*>(const_cast<char*>(value.data())), name.size(),
          value.size(), NGHTTP2_NV_FLAG_NONE};
}

bool alpn_chose_h2(Connection& connection) {
  auto* tls = connection.tls_stream();
  if (tls == nullptr) return false;
  const unsigned char* chosen = nullptr;
  unsigned int size = 0;
  SSL_get0_alpn_selected(tls->native_handle(), &chosen, &size);
  return size == 2 && std::memcmp(chosen, "h2", 2) == 0;
}

void cancel_timer(void* timer) { static_cast<net::steady_timer*>(timer)->cancel(); }

}  // namespace

Http2Counters& http2_counters() {
  static Http2Counters counters;
  return counters;
}

// One request's stream: what its response has brought so far. Owned by its
// exchange; the session reaches it through nghttp2's stream user data until
// the exchange lets go (Http2Session::detach).
struct H2Stream {
  explicit H2Stream(const net::any_io_executor& executor) : wake(executor) {}

  std::shared_ptr<Http2Session> session;
  std::int32_t id = -1;
  AbortHandle* abort_handle = nullptr;
  Timing* timing = nullptr;
  // The request body's pieces, written in order without joining them.
  std::array<std::string_view, 5> body{};
  std::size_t piece = 0;

  unsigned status = 0;
  std::string fields;
  std::size_t content_type_at = 0;
  std::size_t content_type_size = 0;
  std::optional<std::uint64_t> content_length;
  std::optional<std::chrono::milliseconds> retry_after;
  std::optional<std::chrono::milliseconds> retry_after_ms;
  bool head_done = false;

  std::string data;  // DATA received and not yet taken by the relay
  std::size_t data_taken = 0;
  bool ended = false;  // END_STREAM received
  bool closed = false;
  bool refused = false;  // never processed by the peer: may go to another connection
  bool reset = false;    // closed with an error code by either side
  error_code failure;    // the connection failed under it
  bool aborted = false;
  // The coroutine waiting for this stream (head or body) is woken by a
  // cancel; it never expires otherwise than at its deadline.
  net::steady_timer wake;

  std::size_t buffered() const { return data.size() - data_taken; }
};

class Http2Session : public std::enable_shared_from_this<Http2Session> {
 public:
  Http2Session(std::unique_ptr<Connection> connection, Pool& pool, const Origin& origin)
      : connection_(std::move(connection)),
        pool_(pool),
        write_wanted_(connection_->get_executor()),
        settings_wait_(connection_->get_executor()),
        health_timer_(connection_->get_executor()),
        scheme_(origin.tls ? "https" : "http"),
        authority_(origin.host_header()),
        ping_after_(origin.http2_ping_after),
        ping_timeout_(origin.http2_ping_timeout),
        idle_expiry_(pool.options().idle_expiry) {
    read_buffer_.resize(kReadBufferSize);
    auto& counters = http2_counters();
    counters.connections.fetch_add(1, std::memory_order_relaxed);
    counters.opened.fetch_add(1, std::memory_order_relaxed);
    pool_.note_streams_ended();
  }

  ~Http2Session() {
    close({});
    if (session_) nghttp2_session_del(session_);
  }

  Http2Session(const Http2Session&) = delete;
  Http2Session& operator=(const Http2Session&) = delete;

  bool begin() {
    nghttp2_session_callbacks* callbacks = nullptr;
    if (nghttp2_session_callbacks_new(&callbacks) != 0) return false;
    nghttp2_session_callbacks_set_on_header_callback(callbacks, &on_header);
    nghttp2_session_callbacks_set_on_frame_recv_callback(callbacks, &on_frame_recv);
    nghttp2_session_callbacks_set_on_data_chunk_recv_callback(callbacks, &on_data_chunk);
    nghttp2_session_callbacks_set_on_stream_close_callback(callbacks, &on_stream_close);
    nghttp2_session_callbacks_set_on_frame_send_callback(callbacks, &on_frame_send);
    nghttp2_session_callbacks_set_on_frame_not_send_callback(callbacks, &on_frame_not_send);
    nghttp2_option* option = nullptr;
    nghttp2_option_new(&option);
    nghttp2_option_set_no_auto_window_update(option, 1);
    nghttp2_option_set_peer_max_concurrent_streams(option, kAssumedMaxStreams);
    const int rv = nghttp2_session_client_new2(&session_, callbacks, this, option);
    nghttp2_option_del(option);
    nghttp2_session_callbacks_del(callbacks);
    if (rv != 0) return false;
    const nghttp2_settings_entry settings[] = {
        {NGHTTP2_SETTINGS_ENABLE_PUSH, 0},
        {NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, static_cast<std::uint32_t>(kStreamWindow)},
    };
    if (nghttp2_submit_settings(session_, NGHTTP2_FLAG_NONE, settings, 2) != 0) return false;
    if (nghttp2_session_set_local_window_size(session_, NGHTTP2_FLAG_NONE, 0, kConnectionWindow) !=
        0) {
      return false;
    }
    last_received_ = last_used_ = Clock::now();
    auto executor = connection_->get_executor();
    net::co_spawn(executor, read_loop(shared_from_this()), net::detached);
    net::co_spawn(executor, write_loop(shared_from_this()), net::detached);
    net::co_spawn(executor, health_loop(shared_from_this()), net::detached);
    return true;
  }

  bool is_open() const { return !closed_; }

  // Waits for the server's first SETTINGS, which say how many streams the
  // connection may carry; false if they did not come by `until`.
  net::awaitable<bool> settled(TimePoint until) {
    auto self = shared_from_this();
    while (!settings_received_ && !closed_ && !settling_stopped_) {
      settings_wait_.expires_at(until);
      auto [ec] = co_await settings_wait_.async_wait(as_tuple(use_awaitable));
      if (ec != net::error::operation_aborted) break;
    }
    co_return settings_received_ && !closed_;
  }
  // For an opener whose request is aborted: a hedge that won must not wait
  // for this one's connection to settle.
  static void stop_settling(void* session) {
    auto& me = *static_cast<Http2Session*>(session);
    me.settling_stopped_ = true;
    me.settings_wait_.cancel();
  }
  bool accepts_streams() const {
    if (closed_ || going_away_) return false;
    const auto limit =
        nghttp2_session_get_remote_settings(session_, NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS);
    return in_flight_ < limit;
  }

  // Sends the request on a new stream. False when the session cannot take it.
  bool submit(H2Stream& stream, const Request& request) {
    if (!accepts_streams()) return false;
    path_.clear();
    for (auto part : request.target) path_.append(part);
    std::size_t body_size = 0;
    for (auto part : request.body) body_size += part.size();
    content_length_.clear();
    content_length_.append(std::to_string(body_size));

    // HTTP/2 names are lowercase, and the hop-by-hop ones have no place in
    // it: the preformatted lines are read once more, names copied in lower
    // case into one buffer that is large enough not to move while the
    // name/value pairs point into it.
    std::size_t names_size = 0;
    for (auto lines : request.fields) names_size += lines.size();
    names_.clear();
    names_.reserve(names_size);
    fields_.clear();
    fields_.push_back(name_value(":method", request.method));
    fields_.push_back(name_value(":scheme", scheme_));
    fields_.push_back(name_value(":authority", authority_));
    fields_.push_back(name_value(":path", path_));
    for (auto lines : request.fields) {
      for_each_field_line(lines, [&](const FieldLine& field) {
        std::string_view name = field.name;
        while (!name.empty() && name.back() == ' ') name.remove_suffix(1);
        if (name.empty() || is_hop_by_hop_header(name)) return;
        std::string_view value = field.line.substr(field.name.size() + 1);
        while (!value.empty() && (value.back() == '\n' || value.back() == '\r')) {
          value.remove_suffix(1);
        }
        while (!value.empty() && (value.front() == ' ' || value.front() == '\t')) {
          value.remove_prefix(1);
        }
        const std::size_t at = names_.size();
        for (char c : name) names_.push_back(to_lower_ascii(c));
        fields_.push_back(name_value(std::string_view(names_).substr(at, name.size()), value));
      });
    }
    fields_.push_back(name_value("content-length", content_length_));

    stream.body = request.body;
    stream.piece = 0;
    nghttp2_data_provider provider{};
    provider.source.ptr = &stream;
    provider.read_callback = &read_request_body;
    const std::int32_t id =
        nghttp2_submit_request(session_, nullptr, fields_.data(), fields_.size(),
                               body_size > 0 ? &provider : nullptr, &stream);
    if (id < 0) return false;
    stream.id = id;
    if (in_flight_++ == 0) pool_.note_streams_began();
    http2_counters().streams.fetch_add(1, std::memory_order_relaxed);
    live_.push_back(&stream);
    wake_writer();
    return true;
  }

  // The relay has taken `bytes` of the stream's body: the peer may send as
  // much again.
  void consume(H2Stream& stream, std::size_t bytes) {
    if (closed_ || bytes == 0) return;
    if (stream.closed) {
      nghttp2_session_consume_connection(session_, bytes);
    } else {
      nghttp2_session_consume(session_, stream.id, bytes);
    }
    wake_writer();
  }

  // Resets the stream (CANCEL) unless it has closed; the connection and its
  // other streams carry on.
  void cancel(H2Stream& stream) {
    if (closed_ || stream.closed || stream.id < 0) return;
    nghttp2_submit_rst_stream(session_, NGHTTP2_FLAG_NONE, stream.id, NGHTTP2_CANCEL);
    wake_writer();
  }

  // The stream's exchange is going: nothing reaches it from now on.
  void detach(H2Stream& stream) {
    if (stream.id < 0) return;
    cancel(stream);
    if (!closed_) {
      nghttp2_session_set_stream_user_data(session_, stream.id, nullptr);
      if (stream.buffered() > 0) {
        nghttp2_session_consume_connection(session_, stream.buffered());
        wake_writer();
      }
    }
    std::erase(live_, &stream);
    stream.id = -1;
    if (live_.empty()) last_used_ = Clock::now();
  }

  // Fails every stream in flight with `ec`; an empty one is a close of our
  // own.
  void close(error_code ec) {
    if (closed_) return;
    closed_ = true;
    auto& counters = http2_counters();
    counters.connections.fetch_sub(1, std::memory_order_relaxed);
    for (auto* stream : live_) {
      if (!stream->closed) {
        stream->failure = ec ? ec : net::error::operation_aborted;
        stream->closed = true;
      }
      stream->wake.cancel();
    }
    counters.streams.fetch_sub(in_flight_, std::memory_order_relaxed);
    if (in_flight_ == 0) pool_.note_streams_began();  // so that the discard below counts it
    in_flight_ = 0;
    write_wanted_.cancel();
    settings_wait_.cancel();
    health_timer_.cancel();
    connection_->close();
    pool_.note_discarded();
  }

 private:
  static Http2Session& of(void* user_data) { return *static_cast<Http2Session*>(user_data); }
  H2Stream* stream_of(std::int32_t id) {
    return static_cast<H2Stream*>(nghttp2_session_get_stream_user_data(session_, id));
  }

  void wake_writer() { write_wanted_.cancel(); }

  static net::awaitable<void> read_loop(std::shared_ptr<Http2Session> self) {
    auto& me = *self;
    while (!me.closed_) {
      auto [ec, bytes] = co_await me.connection_->async_read_some(net::buffer(me.read_buffer_),
                                                                  as_tuple(use_awaitable));
      if (me.closed_) co_return;
      if (ec) {
        me.close(ec);
        co_return;
      }
      me.last_received_ = Clock::now();
      const auto used = nghttp2_session_mem_recv(
          me.session_, reinterpret_cast<const std::uint8_t*>(me.read_buffer_.data()), bytes);
      if (used < 0) {
        me.close(make_error_code(boost::system::errc::protocol_error));
        co_return;
      }
      me.wake_writer();
    }
  }

  static net::awaitable<void> write_loop(std::shared_ptr<Http2Session> self) {
    auto& me = *self;
    while (!me.closed_) {
      me.out_.clear();
      for (;;) {
        const std::uint8_t* data = nullptr;
        const auto size = nghttp2_session_mem_send(me.session_, &data);
        if (size < 0) {
          me.close(make_error_code(boost::system::errc::protocol_error));
          co_return;
        }
        if (size == 0) break;
        me.out_.append(reinterpret_cast<const char*>(data), static_cast<std::size_t>(size));
        if (me.out_.size() >= kWriteBatch) break;
      }
      if (me.out_.empty()) {
        // After a GOAWAY whose streams have all ended, nothing is left to do.
        if (!nghttp2_session_want_read(me.session_) && !nghttp2_session_want_write(me.session_)) {
          me.close({});
          co_return;
        }
        me.write_wanted_.expires_at(TimePoint::max());
        co_await me.write_wanted_.async_wait(as_tuple(use_awaitable));
        continue;
      }
      auto [ec, written] =
          co_await net::async_write(*me.connection_, net::buffer(me.out_), as_tuple(use_awaitable));
      if (ec && !me.closed_) {
        me.close(ec);
        co_return;
      }
    }
  }

  // A PING once nothing has arrived for ping_after, and the connection
  // closed when its answer takes longer than ping_timeout; a connection
  // without streams for the pool's idle_expiry is closed too.
  static net::awaitable<void> health_loop(std::shared_ptr<Http2Session> self) {
    auto& me = *self;
    while (!me.closed_) {
      const auto now = Clock::now();
      TimePoint next;
      if (me.ping_outstanding_) {
        if (now - me.ping_sent_ >= me.ping_timeout_) {
          me.close(make_error_code(boost::system::errc::timed_out));
          co_return;
        }
        next = me.ping_sent_ + me.ping_timeout_;
      } else if (me.live_.empty() && now - me.last_used_ >= me.idle_expiry_) {
        nghttp2_session_terminate_session(me.session_, NGHTTP2_NO_ERROR);
        me.wake_writer();
        co_return;
      } else if (now - me.last_received_ >= me.ping_after_) {
        nghttp2_submit_ping(me.session_, NGHTTP2_FLAG_NONE, nullptr);
        me.ping_outstanding_ = true;
        me.ping_sent_ = now;
        me.wake_writer();
        next = now + me.ping_timeout_;
      } else {
        next = me.last_received_ + me.ping_after_;
        if (me.live_.empty()) next = std::min(next, me.last_used_ + me.idle_expiry_);
      }
      me.health_timer_.expires_at(next);
      co_await me.health_timer_.async_wait(as_tuple(use_awaitable));
    }
  }

  static ssize_t read_request_body(nghttp2_session*, std::int32_t, std::uint8_t* buffer,
                                   std::size_t length, std::uint32_t* flags,
                                   nghttp2_data_source* source, void*) {
    auto& stream = *static_cast<H2Stream*>(source->ptr);
    std::size_t written = 0;
    while (stream.piece < stream.body.size() && written < length) {
      auto& piece = stream.body[stream.piece];
      const std::size_t size = std::min(piece.size(), length - written);
      // An empty piece may have no data at all (a default string_view).
      if (size > 0) std::memcpy(buffer + written, piece.data(), size);
      written += size;
      piece.remove_prefix(size);
      if (piece.empty()) ++stream.piece;
    }
    if (stream.piece == stream.body.size()) *flags |= NGHTTP2_DATA_FLAG_EOF;
    return static_cast<ssize_t>(written);
  }

  static int on_header(nghttp2_session*, const nghttp2_frame* frame, const std::uint8_t* name_data,
                       std::size_t name_size, const std::uint8_t* value_data,
                       std::size_t value_size, std::uint8_t, void* user_data) {
    auto* stream = of(user_data).stream_of(frame->hd.stream_id);
    if (stream == nullptr || stream->head_done) return 0;  // trailers are not relayed
    const std::string_view name(reinterpret_cast<const char*>(name_data), name_size);
    const std::string_view value(reinterpret_cast<const char*>(value_data), value_size);
    if (name == ":status") {
      stream->status = static_cast<unsigned>(whole_number(value).value_or(0));
      return 0;
    }
    if (name.starts_with(':')) return 0;
    if (name == "content-length") {
      stream->content_length = whole_number(value);
      return 0;
    }
    if (is_hop_by_hop_header(name)) return 0;
    if (name == "retry-after") {
      if (auto seconds = whole_number(value)) stream->retry_after = std::chrono::seconds(*seconds);
    } else if (name == "retry-after-ms") {
      if (auto millis = whole_number(value)) {
        stream->retry_after_ms = std::chrono::milliseconds(*millis);
      }
    } else if (name == "content-type") {
      stream->content_type_at = stream->fields.size() + name.size() + 2;
      stream->content_type_size = value.size();
    }
    auto& fields = stream->fields;
    if (is_renamed_from_upstream(name)) fields.append(kRenamedPrefix);
    fields.append(name).append(": ").append(value).append("\r\n");
    return 0;
  }

  static int on_frame_recv(nghttp2_session*, const nghttp2_frame* frame, void* user_data) {
    auto& me = of(user_data);
    switch (frame->hd.type) {
      case NGHTTP2_GOAWAY:
        // Streams above last_stream_id are closed as refused by nghttp2; the
        // ones below finish here, and new ones go elsewhere.
        me.going_away_ = true;
        return 0;
      case NGHTTP2_PING:
        if ((frame->hd.flags & NGHTTP2_FLAG_ACK) != 0) me.ping_outstanding_ = false;
        return 0;
      case NGHTTP2_SETTINGS:
        if ((frame->hd.flags & NGHTTP2_FLAG_ACK) == 0) {
          me.settings_received_ = true;
          me.settings_wait_.cancel();
        }
        return 0;
      case NGHTTP2_HEADERS:
      case NGHTTP2_DATA:
        break;
      default:
        return 0;
    }
    auto* stream = me.stream_of(frame->hd.stream_id);
    if (stream == nullptr) return 0;
    if (frame->hd.type == NGHTTP2_HEADERS && !stream->head_done) {
      if (stream->status / 100 == 1) {
        // An interim head: dropped, the final one follows.
        stream->status = 0;
        stream->fields.clear();
        stream->content_type_size = 0;
        stream->retry_after.reset();
        stream->retry_after_ms.reset();
        stream->content_length.reset();
      } else {
        stream->head_done = true;
        if (stream->timing) stream->timing->first_byte = Clock::now();
      }
    }
    if ((frame->hd.flags & NGHTTP2_FLAG_END_STREAM) != 0) stream->ended = true;
    stream->wake.cancel();
    return 0;
  }

  static int on_data_chunk(nghttp2_session* session, std::uint8_t, std::int32_t stream_id,
                           const std::uint8_t* data, std::size_t size, void* user_data) {
    auto* stream = of(user_data).stream_of(stream_id);
    if (stream == nullptr) {
      // Nobody reads it: its room in the connection's window is given back.
      nghttp2_session_consume_connection(session, size);
      return 0;
    }
    if (stream->data_taken == stream->data.size()) {
      stream->data.clear();
      stream->data_taken = 0;
    }
    stream->data.append(reinterpret_cast<const char*>(data), size);
    stream->wake.cancel();
    return 0;
  }

  static int on_stream_close(nghttp2_session*, std::int32_t stream_id, std::uint32_t error_code,
                             void* user_data) {
    auto& me = of(user_data);
    if (me.in_flight_ > 0) {
      if (--me.in_flight_ == 0) me.pool_.note_streams_ended();
      http2_counters().streams.fetch_sub(1, std::memory_order_relaxed);
    }
    auto* stream = me.stream_of(stream_id);
    if (stream == nullptr) return 0;
    stream->closed = true;
    if (error_code != NGHTTP2_NO_ERROR) {
      stream->reset = true;
      stream->refused = error_code == NGHTTP2_REFUSED_STREAM;
    }
    stream->wake.cancel();
    return 0;
  }

  static int on_frame_send(nghttp2_session*, const nghttp2_frame* frame, void* user_data) {
    if ((frame->hd.flags & NGHTTP2_FLAG_END_STREAM) == 0) return 0;
    if (frame->hd.type != NGHTTP2_HEADERS && frame->hd.type != NGHTTP2_DATA) return 0;
    auto* stream = of(user_data).stream_of(frame->hd.stream_id);
    if (stream == nullptr) return 0;
    if (stream->timing) stream->timing->sent = Clock::now();
    if (stream->abort_handle) stream->abort_handle->notify_sent();
    return 0;
  }

  static int on_frame_not_send(nghttp2_session*, const nghttp2_frame* frame, int, void* user_data) {
    if (frame->hd.type != NGHTTP2_HEADERS) return 0;
    auto* stream = of(user_data).stream_of(frame->hd.stream_id);
    if (stream == nullptr) return 0;
    // Never sent: the peer never saw it.
    stream->closed = true;
    stream->refused = true;
    stream->wake.cancel();
    return 0;
  }

  std::unique_ptr<Connection> connection_;
  Pool& pool_;
  nghttp2_session* session_ = nullptr;
  net::steady_timer write_wanted_;
  net::steady_timer settings_wait_;
  net::steady_timer health_timer_;
  std::string scheme_;
  std::string authority_;
  std::chrono::milliseconds ping_after_;
  std::chrono::milliseconds ping_timeout_;
  std::chrono::milliseconds idle_expiry_;
  std::string read_buffer_;
  std::string out_;
  // Scratch for submit(): nghttp2 copies what they hold.
  std::string path_;
  std::string names_;
  std::string content_length_;
  std::vector<nghttp2_nv> fields_;
  std::vector<H2Stream*> live_;  // streams whose exchanges hold them
  std::uint32_t in_flight_ = 0;  // streams open on the connection
  TimePoint last_received_{};
  TimePoint last_used_{};
  TimePoint ping_sent_{};
  bool ping_outstanding_ = false;
  bool going_away_ = false;
  bool settings_received_ = false;
  bool settling_stopped_ = false;
  bool closed_ = false;
};

namespace {

void abort_stream(void* target) {
  auto& stream = *static_cast<H2Stream*>(target);
  stream.aborted = true;
  if (stream.session) stream.session->cancel(stream);
  stream.wake.cancel();
}

// Waits for the stream's next news until `until`: false when the deadline
// passed first.
net::awaitable<bool> await_news(H2Stream& stream, TimePoint until) {
  stream.wake.expires_at(until);
  auto [ec] = co_await stream.wake.async_wait(as_tuple(use_awaitable));
  co_return ec == net::error::operation_aborted;
}

}  // namespace

class Http2Exchange final : public Exchange {
 public:
  Http2Exchange(const Limits& limits, AbortHandle& abort_handle)
      : limits_(limits), abort_handle_(abort_handle) {}

  ~Http2Exchange() override { let_go(); }

  unsigned status() const override { return stream_->status; }
  std::string_view forwarded_fields() const override { return stream_->fields; }
  std::string_view content_type() const override {
    if (stream_->content_type_size == 0) return {};
    return std::string_view(stream_->fields)
        .substr(stream_->content_type_at, stream_->content_type_size);
  }
  bool is_event_stream() const override {
    const auto type = content_type();
    constexpr std::string_view kEventStream = "text/event-stream";
    return type.size() >= kEventStream.size() &&
           iequals(type.substr(0, kEventStream.size()), kEventStream);
  }
  std::optional<std::chrono::milliseconds> retry_after() const override {
    return stream_->retry_after_ms ? stream_->retry_after_ms : stream_->retry_after;
  }
  std::optional<std::uint64_t> content_length() const override { return stream_->content_length; }
  bool finished() const override { return stream_->ended && stream_->buffered() == 0; }
  const Timing& timing() const override { return timing_; }
  void note_finished(TimePoint) override {}
  bool reusable() const override {
    return stream_->session && stream_->session->is_open() && !stream_->aborted;
  }

  std::optional<Result<std::size_t, UpstreamError>> read_buffered_body(
      char* data, std::size_t capacity) override {
    auto& stream = *stream_;
    if (const std::size_t buffered = stream.buffered(); buffered > 0) {
      const std::size_t size = std::min(buffered, capacity);
      std::memcpy(data, stream.data.data() + stream.data_taken, size);
      stream.data_taken += size;
      stream.session->consume(stream, size);
      return size;
    }
    if (stream.ended) return std::size_t{0};
    if (stream.aborted) return UpstreamError{Failure::aborted, net::error::operation_aborted};
    if (stream.closed) {
      const error_code ec = stream.failure ? stream.failure : net::error::connection_reset;
      return UpstreamError{Failure::body_interrupted, ec};
    }
    return std::nullopt;
  }

  net::awaitable<Result<std::size_t, UpstreamError>> read_body(char* data,
                                                               std::size_t capacity) override {
    const auto until = std::min(Clock::now() + limits_.idle, limits_.deadline);
    for (;;) {
      if (auto ready = read_buffered_body(data, capacity)) co_return *ready;
      const bool news = co_await await_news(*stream_, until);
      if (!news) {
        stream_->session->cancel(*stream_);
        const auto failure =
            Clock::now() >= limits_.deadline ? Failure::total_timeout : Failure::idle_timeout;
        co_return UpstreamError{failure, net::error::timed_out};
      }
    }
  }

  void abort() override {
    stream_->aborted = true;
    if (stream_->session) stream_->session->cancel(*stream_);
  }

 private:
  friend class Http2Client;

  // A fresh stream for a round of Http2Client::start on `session`.
  void begin_round(const std::shared_ptr<Http2Session>& session, const net::any_io_executor& ex) {
    let_go();
    stream_ = std::make_unique<H2Stream>(ex);
    stream_->session = session;
    stream_->abort_handle = &abort_handle_;
    stream_->timing = &timing_;
    abort_handle_.stop_with(&abort_stream, stream_.get());
  }

  void let_go() {
    if (!stream_) return;
    abort_handle_.clear_stop(stream_.get());
    if (stream_->session) stream_->session->detach(*stream_);
  }

  Limits limits_;
  AbortHandle& abort_handle_;
  Timing timing_;
  std::unique_ptr<H2Stream> stream_;
};

Http2Client::Http2Client(const TransportDeps& deps) : deps_(deps), http1_(deps) {}

Http2Client::~Http2Client() { shut_down(); }

void Http2Client::shut_down() {
  for (auto& [key, sessions] : sessions_) {
    for (auto& session : sessions) session->close({});
  }
  sessions_.clear();
  for (auto& [key, signal] : opening_) signal->cancel();
  opening_.clear();
}

std::size_t Http2Client::connection_count(const std::string& origin_key) const {
  auto it = sessions_.find(origin_key);
  if (it == sessions_.end()) return 0;
  return static_cast<std::size_t>(std::count_if(it->second.begin(), it->second.end(),
                                                [](const auto& s) { return s->is_open(); }));
}

std::shared_ptr<Http2Session> Http2Client::usable_session(const std::string& origin_key) {
  auto it = sessions_.find(origin_key);
  if (it == sessions_.end()) return nullptr;
  auto& sessions = it->second;
  std::erase_if(sessions, [](const auto& session) { return !session->is_open(); });
  for (auto& session : sessions) {
    if (session->accepts_streams()) return session;
  }
  return nullptr;
}

net::awaitable<Result<std::shared_ptr<Http2Session>, UpstreamError>> Http2Client::open_session(
    const Origin& origin, const Limits& limits, AbortHandle& abort_handle, Timing& timing) {
  // On https h2 is offered by ALPN, with http/1.1 beside it unless the
  // deployment said prior_knowledge.
  const auto alpn = origin.http2 == config::Http2Mode::prior_knowledge ? kAlpnH2 : kAlpnH2OrHttp11;
  // Requests that find no connection meanwhile wait for this one (start):
  // woken by the cancel when it is ready, or on their own at the deadline.
  auto signal = std::make_shared<net::steady_timer>(co_await net::this_coro::executor);
  signal->expires_at(std::min(Clock::now() + limits.connect, limits.deadline));
  auto& slot = opening_[origin.key()];
  const bool first_opener = slot == nullptr;
  if (first_opener) slot = signal;
  struct Opened {
    std::unordered_map<std::string, std::shared_ptr<net::steady_timer>>& opening;
    const std::string& key;
    std::shared_ptr<net::steady_timer> signal;
    bool first;
    ~Opened() {
      if (!first) return;
      opening.erase(key);
      signal->cancel();
    }
  } opened_guard{opening_, origin.key(), signal, first_opener};
  auto opened = co_await http1_.connect(origin, limits, abort_handle, timing, alpn);
  if (!opened) co_return opened.error();
  auto connection = std::move(opened.value());
  // An abort from here on stops the request's stream, never the connection
  // that other requests share (or the one the pool keeps).
  abort_handle.clear_stop(connection.get());
  if (origin.tls && !alpn_chose_h2(*connection)) {
    // The server speaks HTTP/1.1: this connection and every later request
    // to the origin go to the HTTP/1.1 transport.
    http1_origins_.insert(origin.key());
    deps_.pool.give_back(std::move(connection), Clock::now());
    co_return std::shared_ptr<Http2Session>();
  }
  auto session = std::make_shared<Http2Session>(std::move(connection), deps_.pool, origin);
  if (!session->begin()) {
    session->close({});
    co_return UpstreamError{Failure::connect, make_error_code(boost::system::errc::protocol_error)};
  }
  // The server's SETTINGS come with its first bytes; a server that sends
  // none within the connect deadline speaks no HTTP/2.
  const auto settle_by = std::min(timing.secured + limits.connect, limits.deadline);
  abort_handle.stop_with(&Http2Session::stop_settling, session.get());
  const bool settled = co_await session->settled(settle_by);
  abort_handle.clear_stop(session.get());
  if (!settled) {
    session->close({});
    if (abort_handle.aborted()) co_return UpstreamError{Failure::aborted, {}};
    co_return UpstreamError{Failure::connect_timeout, net::error::timed_out};
  }
  sessions_[origin.key()].push_back(session);
  co_return session;
}

net::awaitable<Result<std::unique_ptr<Exchange>, UpstreamError>> Http2Client::start(
    const Origin& origin, const Request& request, const Limits& limits, AbortHandle& abort_handle) {
  if (http1_origins_.contains(origin.key())) {
    co_return co_await http1_.start(origin, request, limits, abort_handle);
  }
  auto executor = co_await net::this_coro::executor;
  auto exchange = std::make_unique<Http2Exchange>(limits, abort_handle);
  auto& timing = exchange->timing_;
  timing.started = known_or_now(limits.started);

  for (int round = 0; round < kRounds; ++round) {
    auto session = usable_session(origin.key());
    // Another request is opening a connection to the origin: its streams
    // go there rather than on one more connection.
    while (!session) {
      auto opening = opening_.find(origin.key());
      if (opening == opening_.end()) break;
      auto signal = opening->second;
      // An abort wakes every waiter; the others find the opening still
      // under way and wait again.
      abort_handle.stop_with(&cancel_timer, signal.get());
      auto [ec] = co_await signal->async_wait(as_tuple(use_awaitable));
      abort_handle.clear_stop(signal.get());
      if (abort_handle.aborted()) co_return UpstreamError{Failure::aborted, {}};
      if (ec != net::error::operation_aborted) break;
      session = usable_session(origin.key());
      if (http1_origins_.contains(origin.key())) {
        co_return co_await http1_.start(origin, request, limits, abort_handle);
      }
    }
    timing.reused = session != nullptr;
    if (session) {
      timing.connected = timing.secured = round == 0 ? timing.started : Clock::now();
    } else {
      auto opened = co_await open_session(origin, limits, abort_handle, timing);
      if (!opened) co_return opened.error();
      session = std::move(opened.value());
      if (!session) co_return co_await http1_.start(origin, request, limits, abort_handle);
    }
    if (abort_handle.aborted()) co_return UpstreamError{Failure::aborted, {}};
    exchange->begin_round(session, executor);
    auto& stream = *exchange->stream_;
    if (!session->submit(stream, request)) continue;

    const auto until = std::min(timing.secured + limits.ttft, limits.deadline);
    while (!stream.head_done) {
      if (stream.aborted) co_return UpstreamError{Failure::aborted, net::error::operation_aborted};
      if (stream.closed) break;
      const bool news = co_await await_news(stream, until);
      if (!news) {
        session->cancel(stream);
        const auto failure =
            Clock::now() >= limits.deadline ? Failure::total_timeout : Failure::first_byte_timeout;
        co_return UpstreamError{failure, net::error::timed_out};
      }
    }
    if (stream.head_done) co_return std::move(exchange);
    // Closed before its head. Refused (GOAWAY, REFUSED_STREAM): the peer
    // never processed it, and another connection may carry it.
    if (stream.refused) continue;
    const error_code ec = stream.failure ? stream.failure : net::error::connection_reset;
    co_return UpstreamError{Failure::no_response, ec};
  }
  co_return UpstreamError{Failure::no_response, net::error::connection_refused};
}

net::awaitable<std::optional<UpstreamError>> Http2Client::warm(const Origin& origin,
                                                               const Limits& limits) {
  // A connection being opened decides for this one too: HTTP/2 needs no
  // second, an origin that chose HTTP/1.1 gets a connection for its pool.
  if (auto opening = opening_.find(origin.key()); opening != opening_.end()) {
    auto signal = opening->second;
    co_await signal->async_wait(as_tuple(use_awaitable));
  }
  if (http1_origins_.contains(origin.key())) co_return co_await http1_.warm(origin, limits);
  if (usable_session(origin.key())) co_return std::nullopt;
  AbortHandle abort_handle;
  Timing timing;
  auto opened = co_await open_session(origin, limits, abort_handle, timing);
  if (!opened) co_return opened.error();
  co_return std::nullopt;
}

}  // namespace sluice::upstream
