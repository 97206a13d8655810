#pragma once

#include <atomic>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/generic/stream_protocol.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ssl/context.hpp>
#include <boost/asio/ssl/stream.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "sluice/common/xorshift.hpp"
#include "sluice/config/config.hpp"

// The shared state backend's connection to Redis (or Valkey): one per worker
// event loop, commands pipelined on it, every wait bounded by
// state.redis.timeout. hiredis formats the commands and reads the replies;
// the socket is Asio's, so no thread ever blocks on Redis.
namespace sluice::state {

struct Reply {
  enum class Type { string, array, integer, nil, status, error };
  Type type = Type::nil;
  std::string text;  // string, status, error
  long long integer = 0;
  std::vector<Reply> elements;

  bool is_error() const { return type == Type::error; }
};

// A Lua script, sent by its SHA-1 (EVALSHA) and in full (EVAL) only when
// the server answers NOSCRIPT: after a restart or a failover.
struct Script {
  explicit Script(std::string source);
  std::string source;
  std::string sha1;  // lower-case hex
};

// Whether every worker's connection is up: what sluice_state_backend_up and
// /admin/routes show. Going down is logged once, by the first connection
// that loses Redis, and coming back once, by the last that finds it again.
class BackendStatus {
 public:
  BackendStatus(unsigned connections, std::string url);

  bool up() const { return up_.load(std::memory_order_relaxed) == connections_; }
  const std::string& url() const { return url_; }
  // Why the last attempt failed, for /admin/routes; "" when up.
  std::string last_error() const;

  void connected();
  void disconnected(const std::string& why);
  void attempt_failed(const std::string& why);

 private:
  const unsigned connections_;
  const std::string url_;
  std::atomic<unsigned> up_{0};
  std::atomic<bool> reported_down_{false};
  mutable std::mutex error_mutex_;  // off the request path: connection events only
  std::string last_error_;
};

// What RedisClient::send_eval calls once the reply is in, or will not come
// (the connection is lost), on the client's loop.
struct Completion {
  void (*call)(void* context) = nullptr;
  void* context = nullptr;
};

class RedisClient {
 public:
  RedisClient(boost::asio::io_context& context, const config::RedisState& settings,
              BackendStatus& status, std::uint64_t seed);
  ~RedisClient();
  RedisClient(const RedisClient&) = delete;
  RedisClient& operator=(const RedisClient&) = delete;

  // Connects, and keeps reconnecting with backoff and jitter until stop().
  void start();
  void stop();
  bool up() const { return ready_; }
  std::chrono::milliseconds timeout() const { return settings_.timeout; }

  // The reply, or nullopt when Redis is down or did not answer within the
  // timeout (which also drops the connection, so that the requests behind
  // this one do not each wait it out).
  boost::asio::awaitable<std::optional<Reply>> command(std::span<const std::string_view> args);
  boost::asio::awaitable<std::optional<Reply>> eval(const Script& script,
                                                    std::span<const std::string_view> keys,
                                                    std::span<const std::string_view> args);
  // Sent without waiting for the reply: releases and settlements. False
  // when Redis is down: nothing was sent, and `done` is not called.
  void send(std::span<const std::string_view> args);
  bool send_eval(const Script& script, std::span<const std::string_view> keys,
                 std::span<const std::string_view> args, Completion done = {});

  // One connection and its handshake (AUTH, SELECT, PING), on a context of
  // its own, bounded by a second at least: what the gateway logs at start.
  // nullopt when Redis answered, else why not.
  static std::optional<std::string> probe(const config::RedisState& settings);

 private:
  struct Pending {
    std::optional<Reply> reply;
    bool done = false;
    boost::asio::steady_timer* waiter = nullptr;  // null when nobody waits
    Completion completion;

    void finish() {
      done = true;
      if (waiter != nullptr) waiter->cancel();
      if (completion.call != nullptr) completion.call(completion.context);
    }
  };
  using Socket = boost::asio::generic::stream_protocol::socket;
  using TlsStream = boost::asio::ssl::stream<Socket>;

  // The connection's socket, under TLS or not.
  Socket& socket() { return tls_ ? tls_->next_layer() : *socket_; }
  bool has_socket() const { return tls_ || socket_; }

  boost::asio::awaitable<void> run();
  boost::asio::awaitable<std::optional<std::string>> connect();
  boost::asio::awaitable<std::optional<std::string>> handshake();
  boost::asio::awaitable<void> read_loop();
  boost::asio::awaitable<void> write_loop();
  boost::asio::awaitable<std::optional<Reply>> exchange(std::span<const std::string_view> args);
  void enqueue(std::span<const std::string_view> args, std::shared_ptr<Pending> pending);
  void drop_connection();
  void fail_pending();

  boost::asio::io_context& context_;
  const config::RedisState settings_;
  BackendStatus& status_;
  Xorshift64Star random_;
  std::unique_ptr<Socket> socket_;  // redis:// and unix://
  // rediss://: the context made once (trust anchors loaded at start), a
  // stream per connection.
  std::unique_ptr<boost::asio::ssl::context> tls_context_;
  std::unique_ptr<TlsStream> tls_;
  bool open_ = false;   // the socket is connected (the handshake may still run)
  bool ready_ = false;  // handshake done: requests may use it
  bool stopped_ = false;
  bool writing_ = false;
  std::string out_;      // commands formatted, not yet written
  std::string sending_;  // being written
  std::deque<std::shared_ptr<Pending>> pending_;
  // Scripts this connection sent in full: Redis keeps them until it
  // restarts, which is a new connection.
  std::vector<const Script*> loaded_;
  boost::asio::steady_timer backoff_;
  boost::asio::steady_timer reader_done_;
  std::string last_failure_;
};

// Appends one command, as RESP's array of bulk strings, to `out`.
void append_command(std::string& out, std::span<const std::string_view> args);

// Lua strings for the key names: prefix + "{" + tag + "}" + suffix, so that
// every key of one client key (or one deployment) lies on one slot of a
// Redis Cluster.
std::string tagged_key(std::string_view prefix, std::string_view tag, std::string_view suffix);

}  // namespace sluice::state
