// The seam between the gateway and the ways of carrying its requests: a
// transport that is no HTTP/1.1 client (here one that answers from memory)
// is started, aborted and relayed through the interfaces alone, and the
// registry names the HTTP/1.1 client "http1" (the default) and the HTTP/2
// one "http2".
#include "sluice/upstream/transport.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/string_body.hpp>
#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "sluice/http/socket_deadline.hpp"
#include "sluice/stream/relay.hpp"
#include "sluice/upstream/client.hpp"
#include "sluice/upstream/transports.hpp"
#include "support/socket_pair.hpp"

namespace sluice::testing {
namespace {

namespace net = boost::asio;
namespace http = boost::beast::http;
using namespace std::chrono_literals;
using upstream::Failure;

// An answer held in memory, handed out in the pieces it was given: the
// first as if it had come with the head, each of the others only after a
// wait, as a stream's events come over a transport with no socket of its
// own to lend. It offers none of the zero-copy members, so whoever reads
// it must take the general path.
class CannedExchange final : public upstream::Exchange {
 public:
  CannedExchange(std::vector<std::string> pieces, upstream::Timing timing)
      : pieces_(std::move(pieces)), timing_(timing) {}

  unsigned status() const override { return 200; }
  std::string_view forwarded_fields() const override { return "Content-Type: text/plain\r\n"; }
  std::string_view content_type() const override { return "text/plain"; }
  bool is_event_stream() const override { return false; }
  std::optional<std::chrono::milliseconds> retry_after() const override { return std::nullopt; }
  std::optional<std::uint64_t> content_length() const override { return std::nullopt; }
  bool finished() const override { return next_ == pieces_.size(); }
  const upstream::Timing& timing() const override { return timing_; }
  void note_finished(TimePoint) override {}
  bool reusable() const override { return finished() && !aborted_; }

  std::optional<Result<std::size_t, upstream::UpstreamError>> read_buffered_body(
      char* data, std::size_t capacity) override {
    ++buffered_reads;
    if (finished()) return std::size_t{0};
    if (!arrived_) return std::nullopt;
    arrived_ = false;
    return hand_out(data, capacity);
  }
  net::awaitable<Result<std::size_t, upstream::UpstreamError>> read_body(
      char* data, std::size_t capacity) override {
    ++awaited_reads;
    co_await net::post(co_await net::this_coro::executor, net::use_awaitable);
    if (aborted_) co_return upstream::UpstreamError{Failure::aborted, {}};
    if (finished()) co_return std::size_t{0};
    co_return hand_out(data, capacity);
  }
  void abort() override { aborted_ = true; }

  int buffered_reads = 0;
  int awaited_reads = 0;

 private:
  std::size_t hand_out(char* data, std::size_t capacity) {
    const auto& piece = pieces_[next_++];
    const std::size_t n = std::min(piece.size(), capacity);
    std::memcpy(data, piece.data(), n);
    return n;
  }

  std::vector<std::string> pieces_;
  upstream::Timing timing_;
  std::size_t next_ = 0;
  bool arrived_ = true;
  bool aborted_ = false;
};

// Answers every request with a CannedExchange after `head_wait`; an abort
// ends that wait through the AbortHandle, as a real transport would end its
// read or lookup.
class CannedTransport final : public upstream::Transport {
 public:
  explicit CannedTransport(std::chrono::milliseconds head_wait = 0ms) : head_wait_(head_wait) {}

  net::awaitable<Result<std::unique_ptr<upstream::Exchange>, upstream::UpstreamError>> start(
      const upstream::Origin&, const upstream::Request& request, const upstream::Limits& limits,
      upstream::AbortHandle& abort_handle) override {
    upstream::Timing timing;
    timing.started = known_or_now(limits.started);
    requests.emplace_back(request.body[0]);
    abort_handle.notify_sent();

    net::steady_timer head(co_await net::this_coro::executor, head_wait_);
    abort_handle.stop_with([](void* timer) { static_cast<net::steady_timer*>(timer)->cancel(); },
                           &head);
    co_await head.async_wait(net::as_tuple(net::use_awaitable));
    abort_handle.clear_stop(&head);
    if (abort_handle.aborted()) co_return upstream::UpstreamError{Failure::aborted, {}};

    timing.first_byte = Clock::now();
    co_return std::make_unique<CannedExchange>(
        std::vector<std::string>{"first piece, ", "second, ", "last"}, timing);
  }

  net::awaitable<std::optional<upstream::UpstreamError>> warm(const upstream::Origin&,
                                                              const upstream::Limits&) override {
    ++warmed;
    co_return std::nullopt;
  }

  std::vector<std::string> requests;
  int warmed = 0;

 private:
  std::chrono::milliseconds head_wait_;
};

upstream::Request request_with_body(std::string_view body) {
  upstream::Request request;
  request.target = {"/v1", "/chat/completions", ""};
  request.body = {body, "", "", "", ""};
  return request;
}

TEST(Transport, AnotherTransportsExchangeIsRelayedThroughTheGeneralPath) {
  SocketPair pair;
  CannedTransport canned;
  upstream::Transport& transport = canned;
  SocketDeadline client_deadline(pair.ours);
  stream::Relay::Buffers buffers;
  stream::RelayOutcome outcome;
  int awaited_reads = 0;
  int sent = 0;

  pair.run([&]() -> net::awaitable<void> {
    const auto request = request_with_body("{}");
    upstream::AbortHandle abort_handle;
    abort_handle.call_when_sent([](void* count) { ++*static_cast<int*>(count); }, &sent);
    auto started =
        co_await transport.start(upstream::Origin{}, request, upstream::Limits{}, abort_handle);
    EXPECT_TRUE(started.ok());
    if (!started) co_return;
    const stream::RelayOptions options;
    stream::Relay relay(pair.ours, client_deadline, buffers, 1s);
    outcome = co_await relay.run(*started.value(), "", true, options);
    EXPECT_TRUE(started.value()->reusable());
    awaited_reads = static_cast<CannedExchange&>(*started.value()).awaited_reads;
  }());

  EXPECT_EQ(sent, 1);
  EXPECT_EQ(canned.requests, std::vector<std::string>{"{}"});
  EXPECT_TRUE(outcome.complete);
  EXPECT_FALSE(outcome.upstream_error);
  // The pieces after the first were waited for with read_body.
  EXPECT_GE(awaited_reads, 2);

  boost::beast::flat_buffer received;
  http::response<http::string_body> response;
  http::read(pair.theirs, received, response);
  EXPECT_EQ(response.result_int(), 200u);
  EXPECT_EQ(response[http::field::content_type], "text/plain");
  EXPECT_EQ(response.body(), "first piece, second, last");
}

TEST(Transport, AnAbortStopsWhatTheTransportRegistered) {
  SocketPair pair;
  CannedTransport canned(10s);
  upstream::Transport& transport = canned;
  upstream::AbortHandle abort_handle;
  pair.after(20ms, [&] { abort_handle.abort(); });

  const auto began = std::chrono::steady_clock::now();
  pair.run([&]() -> net::awaitable<void> {
    const auto request = request_with_body("{}");
    auto started =
        co_await transport.start(upstream::Origin{}, request, upstream::Limits{}, abort_handle);
    EXPECT_FALSE(started.ok());
    if (started) co_return;
    EXPECT_EQ(started.error().failure, Failure::aborted);
  }());
  EXPECT_LT(std::chrono::steady_clock::now() - began, 2s);
  EXPECT_TRUE(abort_handle.aborted());
}

TEST(Transport, AbortHandleForgetsATargetOnlyWhenItIsStillTheOneSet) {
  int first = 0;
  int second = 0;
  const auto count = [](void* counter) { ++*static_cast<int*>(counter); };
  upstream::AbortHandle handle;
  handle.stop_with(count, &first);
  handle.stop_with(count, &second);  // a later step replaced the first
  handle.clear_stop(&first);         // the first's owner goes: nothing to clear
  handle.abort();
  EXPECT_EQ(first, 0);
  EXPECT_EQ(second, 1);

  upstream::AbortHandle cleared;
  cleared.stop_with(count, &first);
  cleared.clear_stop(&first);
  cleared.abort();
  EXPECT_EQ(first, 0);
  EXPECT_TRUE(cleared.aborted());
}

TEST(Transports, Http1IsTheDefaultAndHttp2TheOtherNameKnown) {
  ASSERT_TRUE(upstream::find_transport("http1"));
  EXPECT_EQ(*upstream::find_transport("http1"), upstream::default_transport());
  EXPECT_EQ(upstream::find_transport(upstream::kDefaultTransport), upstream::default_transport());
  EXPECT_FALSE(upstream::find_transport("h3"));
  EXPECT_FALSE(upstream::find_transport(""));
  EXPECT_FALSE(upstream::find_transport("HTTP1"));
  ASSERT_TRUE(upstream::find_transport("http2"));
  const auto registered = upstream::registered_transports();
  ASSERT_EQ(registered.size(), 2u);
  EXPECT_EQ(registered[upstream::default_transport()].name, "http1");
}

TEST(Transports, AnOriginGoesToHttp2OnlyWhereItMayBeSpoken) {
  config::Deployment deployment;
  deployment.base_url = {"http", "127.0.0.1", 8000, ""};
  const auto http2 = *upstream::find_transport("http2");
  // auto on http:// is HTTP/1.1, as before HTTP/2 was known.
  EXPECT_EQ(upstream::transport_for(upstream::Origin::from(deployment)),
            upstream::default_transport());
  deployment.http2 = config::Http2Mode::prior_knowledge;
  EXPECT_EQ(upstream::transport_for(upstream::Origin::from(deployment)), http2);
  deployment.base_url = {"https", "example.com", 443, ""};
  deployment.http2 = config::Http2Mode::automatic;
  EXPECT_EQ(upstream::transport_for(upstream::Origin::from(deployment)), http2);
  deployment.http2 = config::Http2Mode::off;
  EXPECT_EQ(upstream::transport_for(upstream::Origin::from(deployment)),
            upstream::default_transport());
}

TEST(Transports, EachWorkerGetsItsOwnInstanceOfEveryRegisteredTransport) {
  upstream::Pool pool{upstream::PoolOptions{}};
  upstream::DnsCache dns{60s};
  upstream::TlsContexts tls;
  upstream::Transports first({pool, dns, tls});
  upstream::Transports second({pool, dns, tls});

  upstream::Transport* http1 = first.find("http1");
  ASSERT_NE(http1, nullptr);
  EXPECT_NE(dynamic_cast<upstream::Http1Client*>(http1), nullptr);
  EXPECT_EQ(http1, &first[upstream::default_transport()]);
  EXPECT_NE(http1, second.find("http1"));
  EXPECT_EQ(first.find("h2"), nullptr);
}

}  // namespace
}  // namespace sluice::testing
