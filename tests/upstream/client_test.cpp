// The upstream client against raw upstreams on 127.0.0.1: interim heads
// (1xx) never stand for the answer, and an attempt aborted while its
// connection is being replaced, or while its upstream is looked up, stops at
// once and touches no connection it no longer has.
#include "sluice/upstream/client.hpp"

#include <gtest/gtest.h>

#include <array>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include "support/scripted_dns.hpp"
#include "support/scripted_upstream.hpp"
#include "support/socket_pair.hpp"

namespace sluice::testing {
namespace {

namespace net = boost::asio;
using namespace std::chrono_literals;
using upstream::Failure;

const std::string kEarlyHints =
    "HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\n\r\n";

// A final answer that names the request it answers (its x-request-id).
std::string answer_naming(const std::string& head) {
  const std::string body = "answer to " + field_value(head, "x-request-id");
  return "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: " +
         std::to_string(body.size()) + "\r\n\r\n" + body;
}

upstream::Origin origin_at(const std::string& host, std::uint16_t port) {
  config::Deployment deployment;
  deployment.base_url.scheme = "http";
  deployment.base_url.host = host;
  deployment.base_url.port = port;
  return upstream::Origin::from(deployment);
}

// A client of its own pool, over `dns`.
struct ClientUnderTest {
  explicit ClientUnderTest(upstream::DnsCache& dns) : client({pool, dns, tls}) {}

  upstream::Pool pool{upstream::PoolOptions{}};
  upstream::TlsContexts tls;
  upstream::Client client;
};

// A request whose x-request-id is `id`; the strings it points to live as
// long as it.
struct NamedRequest {
  explicit NamedRequest(const std::string& id) : id_field("x-request-id: " + id + "\r\n") {
    request.target = {"/v1", "/chat/completions", ""};
    request.fields = {id_field, "", ""};
    request.body = {"{}", "", "", "", ""};
  }
  std::string id_field;
  upstream::Request request;
};

upstream::Limits limits_with_ttft(std::chrono::milliseconds ttft) {
  upstream::Limits limits;
  limits.connect = 2s;
  limits.ttft = ttft;
  limits.idle = 2s;
  return limits;
}

using Started = Result<std::unique_ptr<upstream::Exchange>, upstream::UpstreamError>;

// Reads the exchange's body to its end; "<failure>" if it breaks off.
net::awaitable<std::string> read_whole_body(upstream::Exchange& exchange) {
  std::string body;
  std::array<char, 256> piece{};
  for (;;) {
    auto read = exchange.read_buffered_body(piece.data(), piece.size());
    if (!read) read = co_await exchange.read_body(piece.data(), piece.size());
    if (!*read) co_return "<" + std::string(to_string(read->error().failure)) + ">";
    if (read->value() == 0) co_return body;
    body.append(piece.data(), read->value());
  }
}

class UpstreamClient : public ::testing::Test {
 protected:
  net::io_context context_;
  // Never asked: an origin given by address is not looked up.
  upstream::DnsCache dns_{std::chrono::seconds(60)};
  ClientUnderTest under_test_{dns_};
  upstream::Client& client_ = under_test_.client;
  upstream::Pool& pool_ = under_test_.pool;
};

TEST_F(UpstreamClient, InterimHeadsAreDroppedAndEachRequestGetsItsOwnAnswer) {
  ScriptedUpstream upstream([](const std::string& head) {
    return ScriptedUpstream::Reply{{kEarlyHints, answer_naming(head)}, 200ms};
  });
  const auto origin = origin_at("127.0.0.1", upstream.port());
  const auto limits = limits_with_ttft(2s);
  struct Seen {
    unsigned status = 0;
    std::string body;
    bool forwarded_link = false;
    bool reused = false;
  };
  std::array<Seen, 2> seen;
  std::array<std::size_t, 2> idle_after{};
  run_to_end(context_, [&]() -> net::awaitable<void> {
    for (std::size_t round = 0; round < 2; ++round) {
      NamedRequest named(round == 0 ? "first" : "second");
      upstream::AbortHandle abort_handle;
      {
        auto started = co_await client_.start(origin, named.request, limits, abort_handle);
        if (!started) {
          ADD_FAILURE() << started.error().describe();
          co_return;
        }
        auto& exchange = *started.value();
        seen[round].status = exchange.status();
        seen[round].forwarded_link = exchange.forwarded_fields().find("Link") != std::string::npos;
        seen[round].reused = exchange.timing().reused;
        seen[round].body = co_await read_whole_body(exchange);
      }
      idle_after[round] = pool_.idle_count(origin.key());
    }
  }());
  EXPECT_EQ(seen[0].status, 200u);
  EXPECT_EQ(seen[0].body, "answer to first");
  EXPECT_FALSE(seen[0].forwarded_link) << "the interim head's fields are not the answer's";
  EXPECT_EQ(seen[1].status, 200u);
  EXPECT_EQ(seen[1].body, "answer to second");
  EXPECT_TRUE(seen[1].reused);
  EXPECT_EQ(idle_after, (std::array<std::size_t, 2>{1, 1}));
  EXPECT_EQ(upstream.connections_accepted(), 1u);
}

TEST_F(UpstreamClient, TheFinalHeadIsWaitedForWithinTheFirstByteDeadline) {
  ScriptedUpstream upstream([](const std::string& head) {
    return ScriptedUpstream::Reply{{kEarlyHints, answer_naming(head)}, 1000ms};
  });
  const auto origin = origin_at("127.0.0.1", upstream.port());
  std::optional<Started> started;
  Clock::duration took{};
  run_to_end(context_, [&]() -> net::awaitable<void> {
    NamedRequest named("late");
    upstream::AbortHandle abort_handle;
    const auto began = Clock::now();
    started = co_await client_.start(origin, named.request, limits_with_ttft(200ms), abort_handle);
    took = Clock::now() - began;
  }());
  ASSERT_TRUE(started);
  ASSERT_FALSE(*started) << "status " << started->value()->status();
  EXPECT_EQ(started->error().failure, Failure::first_byte_timeout);
  EXPECT_LT(took, 700ms);
  EXPECT_EQ(pool_.idle_count(origin.key()), 0u);
}

TEST_F(UpstreamClient, SwitchingProtocolsIsABadResponse) {
  ScriptedUpstream upstream([](const std::string&) {
    return ScriptedUpstream::Reply{
        {"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n"}};
  });
  const auto origin = origin_at("127.0.0.1", upstream.port());
  std::optional<Started> started;
  run_to_end(context_, [&]() -> net::awaitable<void> {
    NamedRequest named("upgrade");
    upstream::AbortHandle abort_handle;
    started = co_await client_.start(origin, named.request, limits_with_ttft(2s), abort_handle);
  }());
  ASSERT_TRUE(started);
  ASSERT_FALSE(*started) << "status " << started->value()->status();
  EXPECT_EQ(started->error().failure, Failure::bad_response);
  EXPECT_EQ(pool_.idle_count(origin.key()), 0u);
}

// An upstream given by name whose cached address has expired, and whose
// pooled connection it closed: the attempt finds that connection dead,
// closes it and looks the name up again for a fresh one. An abort in that
// lookup must neither touch the connection it let go (freed memory, whose
// place a new connection may hold by then) nor wait for the lookup.
class UpstreamClientByName : public UpstreamClient {
 protected:
  UpstreamClientByName()
      : upstream_([](const std::string& head) {
          return ScriptedUpstream::Reply{{answer_naming(head)}, 0ms, /*then_close=*/true};
        }),
        dns_by_name_(0ms,
                     {net::ip::tcp::endpoint(net::ip::make_address("127.0.0.1"), upstream_.port())},
                     /*ttl=*/0ms),
        by_name_(dns_by_name_),
        origin_(origin_at("upstream.test", upstream_.port())) {}

  ScriptedUpstream upstream_;
  ScriptedDns dns_by_name_;
  ClientUnderTest by_name_;
  upstream::Origin origin_;
};

TEST_F(UpstreamClientByName, AnAbortDuringTheLookupForAFreshConnectionTouchesNoOther) {
  const auto limits = limits_with_ttft(2s);
  std::string first_body;
  std::optional<Started> second;
  bool other_open_after_abort = false;
  run_to_end(context_, [&]() -> net::awaitable<void> {
    {
      NamedRequest named("first");
      upstream::AbortHandle abort_handle;
      auto first = co_await by_name_.client.start(origin_, named.request, limits, abort_handle);
      if (!first) {
        ADD_FAILURE() << first.error().describe();
        co_return;
      }
      first_body = co_await read_whole_body(*first.value());
    }
    // The upstream closes the pooled connection; the next lookup never ends.
    net::steady_timer settle(context_, 100ms);
    co_await settle.async_wait(net::use_awaitable);
    dns_by_name_.answer_after(std::nullopt);

    upstream::AbortHandle abort_handle;
    std::unique_ptr<upstream::Connection> other;
    net::co_spawn(
        context_,
        [&]() -> net::awaitable<void> {
          net::steady_timer later(context_, 100ms);
          co_await later.async_wait(net::use_awaitable);
          // Another connection, opened while the attempt waits: the one the
          // attempt let go was freed, and this one may take its memory.
          other = std::make_unique<upstream::Connection>(context_.get_executor(), "other");
          other->socket().open(net::ip::tcp::v4());
          abort_handle.abort();
          other_open_after_abort = other->is_open();
        },
        net::detached);
    NamedRequest named("second");
    second = co_await by_name_.client.start(origin_, named.request, limits, abort_handle);
  }());
  EXPECT_EQ(first_body, "answer to first");
  EXPECT_EQ(dns_by_name_.lookups, 2);
  EXPECT_TRUE(other_open_after_abort) << "the abort closed a connection not its own";
  ASSERT_TRUE(second);
  ASSERT_FALSE(*second);
  EXPECT_EQ(second->error().failure, Failure::aborted);
}

TEST_F(UpstreamClientByName, AnAbortEndsTheWaitForALookupAtOnce) {
  dns_by_name_.answer_after(std::nullopt);
  auto limits = limits_with_ttft(2s);
  limits.connect = 3s;
  std::optional<Started> started;
  Clock::duration took{};
  run_to_end(context_, [&]() -> net::awaitable<void> {
    upstream::AbortHandle abort_handle;
    net::steady_timer later(context_, 50ms);
    later.async_wait([&](error_code) { abort_handle.abort(); });
    NamedRequest named("aborted");
    const auto began = Clock::now();
    started = co_await by_name_.client.start(origin_, named.request, limits, abort_handle);
    took = Clock::now() - began;
  }());
  ASSERT_TRUE(started);
  ASSERT_FALSE(*started);
  EXPECT_EQ(started->error().failure, Failure::aborted);
  EXPECT_LT(took, 1s) << "waited for the connect timeout";
  EXPECT_EQ(upstream_.connections_accepted(), 0u);
}

// Two attempts look the same name up at once and one of them is aborted: the
// other still gets its answer, which the cache keeps for the next.
TEST_F(UpstreamClientByName, AnAbortedLookupLeavesOthersOfTheNameAndTheCacheAlone) {
  ScriptedDns slow_dns(
      300ms, {net::ip::tcp::endpoint(net::ip::make_address("127.0.0.1"), upstream_.port())});
  ClientUnderTest slow(slow_dns);
  const auto limits = limits_with_ttft(2s);
  std::optional<Started> aborted;
  Clock::duration aborted_took{};
  std::string kept_body, cached_body;
  run_to_end(context_, [&]() -> net::awaitable<void> {
    upstream::AbortHandle abort_handle;
    net::co_spawn(
        context_,
        [&]() -> net::awaitable<void> {
          NamedRequest named("aborted");
          const auto began = Clock::now();
          aborted = co_await slow.client.start(origin_, named.request, limits, abort_handle);
          aborted_took = Clock::now() - began;
        },
        net::detached);
    net::steady_timer later(context_, 50ms);
    later.async_wait([&](error_code) { abort_handle.abort(); });
    for (auto* body : {&kept_body, &cached_body}) {
      NamedRequest named(body == &kept_body ? "kept" : "cached");
      upstream::AbortHandle own;
      auto started = co_await slow.client.start(origin_, named.request, limits, own);
      if (!started) {
        ADD_FAILURE() << started.error().describe();
        co_return;
      }
      *body = co_await read_whole_body(*started.value());
    }
  }());
  ASSERT_TRUE(aborted);
  ASSERT_FALSE(*aborted);
  EXPECT_EQ(aborted->error().failure, Failure::aborted);
  EXPECT_LT(aborted_took, 250ms);
  EXPECT_EQ(kept_body, "answer to kept");
  EXPECT_EQ(cached_body, "answer to cached");
  EXPECT_EQ(slow_dns.lookups, 2) << "the answer kept for the third attempt was looked up again";
}

}  // namespace
}  // namespace sluice::testing
