#include "sluice/state/redis_client.hpp"

#include <hiredis/hiredis.h>
#include <openssl/evp.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509_vfy.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/connect.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <charconv>
#include <cstring>

namespace sluice::state {

namespace net = boost::asio;
using net::as_tuple;
using net::use_awaitable;

namespace {

constexpr std::chrono::milliseconds kBackoffBase{100};
constexpr std::chrono::milliseconds kBackoffMax{5000};
constexpr std::size_t kReadSize = 16 * 1024;

Reply to_reply(const redisReply& raw) {
  Reply reply;
  switch (raw.type) {
    case REDIS_REPLY_STRING:
      reply.type = Reply::Type::string;
      reply.text.assign(raw.str, raw.len);
      break;
    case REDIS_REPLY_STATUS:
      reply.type = Reply::Type::status;
      reply.text.assign(raw.str, raw.len);
      break;
    case REDIS_REPLY_ERROR:
      reply.type = Reply::Type::error;
      reply.text.assign(raw.str, raw.len);
      break;
    case REDIS_REPLY_INTEGER:
      reply.type = Reply::Type::integer;
      reply.integer = raw.integer;
      break;
    case REDIS_REPLY_ARRAY:
      reply.type = Reply::Type::array;
      reply.elements.reserve(raw.elements);
      for (std::size_t i = 0; i < raw.elements; ++i) {
        reply.elements.push_back(to_reply(*raw.element[i]));
      }
      break;
    default:
      reply.type = Reply::Type::nil;
  }
  return reply;
}

}  // namespace

// Written here rather than by hiredis's formatters: those print every length
// through a printf-like routine and grow an sds string piece by piece, which
// cost 6,000 to 8,500 instructions for a script call of a dozen arguments,
// more than the rest of a proxied request. A command is the simple half of
// RESP (the replies, the hard half, are still read by hiredis), and the
// tests check this against redisFormatCommandArgv byte for byte.
void append_command(std::string& out, std::span<const std::string_view> args) {
  // Room for every header's digits at their longest; the string is cut to
  // what was written at the end, so it grows once per command.
  constexpr std::size_t kLongestHeader = 1 + 20 + 2;  // kind, digits, CRLF
  std::size_t most = kLongestHeader;
  for (const auto& arg : args) most += kLongestHeader + arg.size() + 2;
  const std::size_t start = out.size();
  out.resize(start + most);
  char* at = out.data() + start;
  const auto put_header = [&at](char kind, std::size_t count) {
    *at++ = kind;
    at = std::to_chars(at, at + 20, count).ptr;
    *at++ = '\r';
    *at++ = '\n';
  };
  put_header('*', args.size());
  for (const auto& arg : args) {
    put_header('$', arg.size());
    if (!arg.empty()) std::memcpy(at, arg.data(), arg.size());
    at += arg.size();
    *at++ = '\r';
    *at++ = '\n';
  }
  out.resize(static_cast<std::size_t>(at - out.data()));
}

namespace {

std::vector<std::string_view> eval_arguments(std::string_view verb, std::string_view script,
                                             std::span<const std::string_view> keys,
                                             std::span<const std::string_view> args,
                                             std::string& key_count) {
  key_count = std::to_string(keys.size());
  std::vector<std::string_view> all;
  all.reserve(3 + keys.size() + args.size());
  all.push_back(verb);
  all.push_back(script);
  all.push_back(key_count);
  all.insert(all.end(), keys.begin(), keys.end());
  all.insert(all.end(), args.begin(), args.end());
  return all;
}

bool is_noscript(const std::optional<Reply>& reply) {
  return reply && reply->is_error() && reply->text.starts_with("NOSCRIPT");
}

}  // namespace

Script::Script(std::string text) : source(std::move(text)) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  EVP_Digest(source.data(), source.size(), digest, &length, EVP_sha1(), nullptr);
  static constexpr char kDigits[] = "0123456789abcdef";
  for (unsigned i = 0; i < length; ++i) {
    sha1 += kDigits[digest[i] >> 4];
    sha1 += kDigits[digest[i] & 0xf];
  }
}

std::string tagged_key(std::string_view prefix, std::string_view tag, std::string_view suffix) {
  std::string key;
  key.reserve(prefix.size() + tag.size() + suffix.size() + 2);
  key.append(prefix).append("{").append(tag).append("}").append(suffix);
  return key;
}

// ---------------------------------------------------------------------------
// BackendStatus

BackendStatus::BackendStatus(unsigned connections, std::string url)
    : connections_(connections), url_(std::move(url)) {}

std::string BackendStatus::last_error() const {
  std::lock_guard lock(error_mutex_);
  return up() ? std::string() : last_error_;
}

void BackendStatus::connected() {
  if (up_.fetch_add(1, std::memory_order_relaxed) + 1 == connections_ &&
      reported_down_.exchange(false, std::memory_order_relaxed)) {
    spdlog::info("state: Redis at {} answers again; limits, cooldowns and the cache are shared",
                 url_);
  }
}

void BackendStatus::disconnected(const std::string& why) {
  up_.fetch_sub(1, std::memory_order_relaxed);
  attempt_failed(why);
}

void BackendStatus::attempt_failed(const std::string& why) {
  {
    std::lock_guard lock(error_mutex_);
    last_error_ = why;
  }
  if (!reported_down_.exchange(true, std::memory_order_relaxed)) {
    spdlog::warn(
        "state: Redis at {} is unavailable ({}); each instance uses its own state until "
        "it answers again",
        url_, why);
  }
}

// ---------------------------------------------------------------------------
// RedisClient

RedisClient::RedisClient(net::io_context& context, const config::RedisState& settings,
                         BackendStatus& status, std::uint64_t seed)
    : context_(context),
      settings_(settings),
      status_(status),
      random_(seed),
      backoff_(context),
      reader_done_(context) {
  if (settings_.transport == config::RedisState::Transport::tls) {
    // As an upstream's: the system store and the configured CA file, the
    // certificate's chain and name checked. A CA file that does not load
    // stops the start, as a config error does.
    namespace ssl = net::ssl;
    tls_context_ = std::make_unique<ssl::context>(ssl::context::tls_client);
    tls_context_->set_options(ssl::context::default_workarounds | ssl::context::no_sslv2 |
                              ssl::context::no_sslv3 | ssl::context::no_tlsv1 |
                              ssl::context::no_tlsv1_1);
    tls_context_->set_default_verify_paths();
    if (!settings_.ca_file.empty()) tls_context_->load_verify_file(settings_.ca_file);
    tls_context_->set_verify_mode(ssl::verify_peer);
  }
}

RedisClient::~RedisClient() = default;

void RedisClient::start() { net::co_spawn(context_, run(), net::detached); }

void RedisClient::stop() {
  stopped_ = true;
  backoff_.cancel();
  drop_connection();
}

void RedisClient::drop_connection() {
  if (has_socket() && socket().is_open()) {
    // No TLS close_notify: the connection is given up, not ended politely.
    boost::system::error_code ignored;
    socket().shutdown(Socket::shutdown_both, ignored);
    socket().close(ignored);
  }
}

void RedisClient::fail_pending() {
  auto pending = std::move(pending_);
  pending_.clear();
  for (auto& each : pending) each->finish();
}

net::awaitable<void> RedisClient::run() {
  // The first failure of a run of them is logged as a warning (through the
  // status), later ones only at debug: a Redis away for an hour is one line.
  unsigned failures = 0;
  while (!stopped_) {
    std::optional<std::string> failure = co_await connect();
    if (!failure) failure = co_await handshake();
    if (!failure) {
      failures = 0;
      ready_ = true;
      status_.connected();
      if (open_) {
        reader_done_.expires_at(std::chrono::steady_clock::time_point::max());
        co_await reader_done_.async_wait(as_tuple(use_awaitable));
      }
      ready_ = false;
      if (stopped_) break;  // shutting down: not an outage to report
      status_.disconnected(last_failure_.empty() ? "connection lost" : last_failure_);
    } else {
      drop_connection();
      if (open_) {
        reader_done_.expires_at(std::chrono::steady_clock::time_point::max());
        co_await reader_done_.async_wait(as_tuple(use_awaitable));
      }
      if (failures == 0) {
        status_.attempt_failed(*failure);
      } else {
        spdlog::debug("state: Redis at {}: {}", settings_.url, *failure);
      }
    }
    if (stopped_) break;
    // Exponential backoff with jitter, so that every worker of every
    // instance does not knock on a restarted Redis in the same millisecond.
    auto ceiling = std::min<std::chrono::milliseconds>(
        kBackoffMax, kBackoffBase * (1u << std::min(failures, 6u)));
    auto half = ceiling.count() / 2;
    auto delay = std::chrono::milliseconds(half + static_cast<long>(random_() % (half + 1)));
    ++failures;
    backoff_.expires_after(delay);
    co_await backoff_.async_wait(as_tuple(use_awaitable));
  }
}

net::awaitable<std::optional<std::string>> RedisClient::connect() {
  last_failure_.clear();
  if (tls_context_) {
    tls_ = std::make_unique<TlsStream>(context_, *tls_context_);
  } else {
    socket_ = std::make_unique<Socket>(context_);
  }
  Socket& lowest = socket();
  net::steady_timer deadline(context_, std::max<std::chrono::milliseconds>(
                                           settings_.timeout, std::chrono::milliseconds(1000)));
  bool expired = false;
  deadline.async_wait([this, &expired](boost::system::error_code ec) {
    if (ec) return;
    expired = true;
    drop_connection();
  });
  boost::system::error_code ec;
  if (settings_.transport == config::RedisState::Transport::unix_socket) {
    net::local::stream_protocol::endpoint endpoint(settings_.socket_path);
    std::tie(ec) = co_await lowest.async_connect(endpoint, as_tuple(use_awaitable));
  } else {
    net::ip::tcp::resolver resolver(context_);
    auto port = std::to_string(settings_.port);
    auto [resolve_ec, results] =
        co_await resolver.async_resolve(settings_.host, port, as_tuple(use_awaitable));
    ec = resolve_ec;
    if (!ec) {
      ec = net::error::host_not_found;
      for (const auto& entry : results) {
        net::generic::stream_protocol::endpoint endpoint(entry.endpoint());
        if (lowest.is_open()) lowest.close(ec);
        std::tie(ec) = co_await lowest.async_connect(endpoint, as_tuple(use_awaitable));
        if (!ec || expired) break;
      }
    }
    if (!ec) {
      boost::system::error_code ignored;
      lowest.set_option(net::ip::tcp::no_delay(true), ignored);
    }
  }
  if (!ec && !expired && tls_) {
    const std::string& host = settings_.host;
    boost::system::error_code parse_ec;
    // OpenSSL checks the name (or address) itself, so that a mismatch is
    // named in the verify result, which the message below quotes.
    SSL* ssl = tls_->native_handle();
    net::ip::make_address(host, parse_ec);
    if (parse_ec) {
      SSL_set_tlsext_host_name(ssl, host.c_str());
      SSL_set1_host(ssl, host.c_str());
    } else {
      X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl), host.c_str());
    }
    std::tie(ec) =
        co_await tls_->async_handshake(net::ssl::stream_base::client, as_tuple(use_awaitable));
    if (ec && !expired) {
      deadline.cancel();
      const long verified = SSL_get_verify_result(tls_->native_handle());
      if (verified != X509_V_OK) {
        co_return "TLS certificate verification failed: " +
            std::string(X509_verify_cert_error_string(verified));
      }
      co_return "TLS handshake failed: " + ec.message();
    }
  }
  deadline.cancel();
  if (expired) co_return "connecting timed out";
  if (ec) co_return "cannot connect: " + ec.message();
  open_ = true;
  loaded_.clear();
  net::co_spawn(context_, read_loop(), net::detached);
  co_return std::nullopt;
}

net::awaitable<std::optional<std::string>> RedisClient::handshake() {
  if (!settings_.password.empty()) {
    std::vector<std::string_view> auth{"AUTH"};
    if (!settings_.username.empty()) auth.push_back(settings_.username);
    auth.push_back(settings_.password);
    auto reply = co_await exchange(auth);
    if (!reply) co_return "no answer to AUTH within " + std::to_string(timeout().count()) + "ms";
    if (reply->is_error()) co_return "authentication refused: " + reply->text;
  }
  if (settings_.database != 0) {
    auto database = std::to_string(settings_.database);
    std::array<std::string_view, 2> select{"SELECT", database};
    auto reply = co_await exchange(select);
    if (!reply) co_return "no answer to SELECT within " + std::to_string(timeout().count()) + "ms";
    if (reply->is_error()) co_return "SELECT " + database + " refused: " + reply->text;
  }
  std::array<std::string_view, 1> ping{"PING"};
  auto reply = co_await exchange(ping);
  if (!reply) co_return "no answer to PING within " + std::to_string(timeout().count()) + "ms";
  // NOAUTH when a password is needed and none is configured.
  if (reply->is_error()) co_return reply->text;
  co_return std::nullopt;
}

net::awaitable<void> RedisClient::read_loop() {
  std::unique_ptr<redisReader, decltype(&redisReaderFree)> reader(redisReaderCreate(),
                                                                  &redisReaderFree);
  std::vector<char> buffer(kReadSize);
  Socket* plain = &socket();
  TlsStream* tls = tls_.get();
  for (;;) {
    boost::system::error_code ec;
    std::size_t n = 0;
    if (tls != nullptr) {
      std::tie(ec, n) = co_await tls->async_read_some(net::buffer(buffer), as_tuple(use_awaitable));
    } else {
      std::tie(ec, n) =
          co_await plain->async_read_some(net::buffer(buffer), as_tuple(use_awaitable));
    }
    if (ec) {
      if (last_failure_.empty()) last_failure_ = "connection lost: " + ec.message();
      break;
    }
    if (redisReaderFeed(reader.get(), buffer.data(), n) != REDIS_OK) break;
    bool broken = false;
    for (;;) {
      void* raw = nullptr;
      if (redisReaderGetReply(reader.get(), &raw) != REDIS_OK) {
        last_failure_ = "protocol error in a reply";
        broken = true;
        break;
      }
      if (raw == nullptr) break;
      Reply reply = to_reply(*static_cast<redisReply*>(raw));
      freeReplyObject(raw);
      if (pending_.empty()) continue;  // a reply nobody asked for: ignore it
      auto pending = std::move(pending_.front());
      pending_.pop_front();
      pending->reply = std::move(reply);
      pending->finish();
    }
    if (broken) break;
  }
  drop_connection();
  open_ = false;
  // Before the pending ones hear: what they send next must not go on this
  // connection's queue.
  ready_ = false;
  out_.clear();
  fail_pending();
  reader_done_.cancel();
}

net::awaitable<void> RedisClient::write_loop() {
  writing_ = true;
  Socket* plain = &socket();
  TlsStream* tls = tls_.get();
  while (!out_.empty() && open_ && plain == &socket()) {
    std::swap(out_, sending_);
    boost::system::error_code ec;
    if (tls != nullptr) {
      std::tie(ec, std::ignore) =
          co_await net::async_write(*tls, net::buffer(sending_), as_tuple(use_awaitable));
    } else {
      std::tie(ec, std::ignore) =
          co_await net::async_write(*plain, net::buffer(sending_), as_tuple(use_awaitable));
    }
    sending_.clear();
    if (ec) {
      drop_connection();
      break;
    }
  }
  writing_ = false;
}

void RedisClient::enqueue(std::span<const std::string_view> args,
                          std::shared_ptr<Pending> pending) {
  append_command(out_, args);
  pending_.push_back(std::move(pending));
  if (!writing_) net::co_spawn(context_, write_loop(), net::detached);
}

net::awaitable<std::optional<Reply>> RedisClient::exchange(std::span<const std::string_view> args) {
  if (!open_) co_return std::nullopt;
  auto pending = std::make_shared<Pending>();
  net::steady_timer timer(context_, settings_.timeout);
  pending->waiter = &timer;
  enqueue(args, pending);
  co_await timer.async_wait(as_tuple(use_awaitable));
  pending->waiter = nullptr;
  if (!pending->done) {
    // A Redis that takes longer than the timeout is stalled or overloaded:
    // drop the connection so that the requests behind this one find it down
    // at once instead of each waiting the timeout out.
    last_failure_ = "no answer within " + std::to_string(timeout().count()) + "ms";
    drop_connection();
    co_return std::nullopt;
  }
  co_return std::move(pending->reply);
}

net::awaitable<std::optional<Reply>> RedisClient::command(std::span<const std::string_view> args) {
  if (!ready_) co_return std::nullopt;
  co_return co_await exchange(args);
}

net::awaitable<std::optional<Reply>> RedisClient::eval(const Script& script,
                                                       std::span<const std::string_view> keys,
                                                       std::span<const std::string_view> args) {
  if (!ready_) co_return std::nullopt;
  std::string key_count;
  auto by_sha = eval_arguments("EVALSHA", script.sha1, keys, args, key_count);
  auto reply = co_await exchange(by_sha);
  if (!is_noscript(reply)) co_return reply;
  auto in_full = eval_arguments("EVAL", script.source, keys, args, key_count);
  co_return co_await exchange(in_full);
}

void RedisClient::send(std::span<const std::string_view> args) {
  if (!ready_) return;
  enqueue(args, std::make_shared<Pending>());
}

bool RedisClient::send_eval(const Script& script, std::span<const std::string_view> keys,
                            std::span<const std::string_view> args, Completion done) {
  if (!ready_) return false;
  // Nobody waits to resend it on NOSCRIPT: in full the first time on this
  // connection, by its digest after that.
  std::string key_count;
  const bool loaded = std::find(loaded_.begin(), loaded_.end(), &script) != loaded_.end();
  auto arguments = loaded ? eval_arguments("EVALSHA", script.sha1, keys, args, key_count)
                          : eval_arguments("EVAL", script.source, keys, args, key_count);
  if (!loaded) loaded_.push_back(&script);
  auto pending = std::make_shared<Pending>();
  pending->completion = done;
  enqueue(arguments, std::move(pending));
  return true;
}

std::optional<std::string> RedisClient::probe(const config::RedisState& settings) {
  net::io_context context;
  config::RedisState bounded = settings;
  bounded.timeout = std::max<std::chrono::milliseconds>(settings.timeout, std::chrono::seconds(1));
  BackendStatus status(1, settings.url);
  RedisClient client(context, bounded, status, 1);
  std::optional<std::string> outcome = "no answer";
  net::co_spawn(
      context,
      [&]() -> net::awaitable<void> {
        outcome = co_await client.connect();
        if (!outcome) outcome = co_await client.handshake();
        client.stopped_ = true;
        client.drop_connection();
      },
      net::detached);
  context.run_for(std::chrono::seconds(5));
  return outcome;
}

}  // namespace sluice::state
