// The worker's event loop with and without busy polling: polling lasts its
// window after the last handler and no longer, and every kind of event still
// gets handled. Asserted on the loop's counters and the wall clock, not on
// CPU time: a polling thread yields its core, so on a loaded machine it may
// get next to none.
#include "sluice/server/event_loop.hpp"

#include <gtest/gtest.h>
#include <pthread.h>
#include <time.h>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/steady_timer.hpp>
#include <future>
#include <string>
#include <thread>

#include "support/gateway_fixture.hpp"
#include "support/http_client.hpp"
#include "support/socket_pair.hpp"

namespace sluice::testing {
namespace {

using namespace std::chrono_literals;
namespace net = boost::asio;
using Clock = std::chrono::steady_clock;

// A thread running run_event_loop on a context that always has work, until
// the fixture stops it.
class LoopThread {
 public:
  LoopThread(net::io_context& context, std::chrono::microseconds busy_poll)
      : context_(context), guard_(net::make_work_guard(context)) {
    thread_ = std::thread([this, busy_poll] {
      server::run_event_loop(context_, busy_poll, counters_);
      returned_.set_value();
    });
  }
  ~LoopThread() {
    context_.stop();
    thread_.join();
  }

  std::uint64_t idle_polls() const { return counters_.idle_polls.load(); }
  std::uint64_t sleeps() const { return counters_.sleeps.load(); }

  // CPU the loop's thread uses over `span` of wall time.
  std::chrono::nanoseconds cpu_over(std::chrono::milliseconds span) {
    auto before = cpu_time();
    std::this_thread::sleep_for(span);
    return cpu_time() - before;
  }

  std::future<void> returned() { return returned_.get_future(); }

 private:
  std::chrono::nanoseconds cpu_time() {
    clockid_t clock{};
    EXPECT_EQ(pthread_getcpuclockid(thread_.native_handle(), &clock), 0);
    timespec now{};
    EXPECT_EQ(clock_gettime(clock, &now), 0);
    return std::chrono::seconds(now.tv_sec) + std::chrono::nanoseconds(now.tv_nsec);
  }

  net::io_context& context_;
  net::executor_work_guard<net::io_context::executor_type> guard_;
  server::EventLoopCounters counters_;
  std::promise<void> returned_;
  std::thread thread_;
};

// Waits (up to 10 s) for the loop to have slept `count` times; returns when.
Clock::time_point when_slept(const LoopThread& loop, std::uint64_t count) {
  EXPECT_TRUE(eventually([&] { return loop.sleeps() >= count; }, 10s))
      << "slept " << loop.sleeps() << " times, expected " << count;
  return Clock::now();
}

TEST(EventLoop, WithoutBusyPollAnIdleThreadSleepsAtOnce) {
  net::io_context context(1);
  LoopThread loop(context, std::chrono::microseconds(0));
  // A thread blocked in epoll_wait uses no CPU, however loaded the machine.
  EXPECT_LT(loop.cpu_over(150ms), 15ms);
  EXPECT_EQ(loop.idle_polls(), 0u);
}

TEST(EventLoop, BusyPollPollsThroughItsWindowThenSleeps) {
  net::io_context context(1);
  const auto started = Clock::now();
  LoopThread loop(context, std::chrono::microseconds(300ms));
  EXPECT_TRUE(eventually([&] { return loop.idle_polls() > 0; }, 10s));
  // The window is wall time from the first empty poll: it cannot sleep
  // sooner, whatever the machine's load.
  EXPECT_GE(when_slept(loop, 1) - started, 300ms);
  const auto polls_when_asleep = loop.idle_polls();
  std::this_thread::sleep_for(150ms);
  EXPECT_EQ(loop.idle_polls(), polls_when_asleep);
  EXPECT_EQ(loop.sleeps(), 1u);
}

TEST(EventLoop, EachHandlerStartsANewWindow) {
  net::io_context context(1);
  LoopThread loop(context, std::chrono::microseconds(200ms));
  when_slept(loop, 1);
  const auto polls_before = loop.idle_polls();
  std::promise<void> ran;
  const auto posted = Clock::now();
  net::post(context, [&ran] { ran.set_value(); });
  ASSERT_EQ(ran.get_future().wait_for(5s), std::future_status::ready);
  EXPECT_GE(when_slept(loop, 2) - posted, 200ms);
  EXPECT_GT(loop.idle_polls(), polls_before);
}

TEST(EventLoop, SocketsAndTimersAreServedWhilePollingAndAfterItsWindow) {
  SocketPair pair;
  LoopThread loop(pair.context, std::chrono::microseconds(100ms));
  // First while it polls, then once it sleeps: both must wake the handler.
  for (bool asleep : {false, true}) {
    std::promise<std::string> received;
    auto buffer = std::make_shared<std::string>(5, '\0');
    net::post(pair.context, [&] {
      net::async_read(pair.ours, net::buffer(*buffer),
                      [&received, buffer](error_code ec, std::size_t) {
                        received.set_value(ec ? ec.message() : *buffer);
                      });
    });
    if (asleep) when_slept(loop, loop.sleeps() + 1);
    // From another thread, as a peer would: the loop must notice by itself.
    boost::asio::ip::tcp::socket& theirs = pair.theirs;
    error_code write_error;
    net::write(theirs, net::buffer(std::string("hello")), write_error);
    ASSERT_FALSE(write_error) << write_error.message();
    auto future = received.get_future();
    ASSERT_EQ(future.wait_for(5s), std::future_status::ready);
    EXPECT_EQ(future.get(), "hello");

    std::promise<void> fired;
    net::steady_timer timer(pair.context, 30ms);
    net::post(pair.context, [&] { timer.async_wait([&fired](error_code) { fired.set_value(); }); });
    ASSERT_EQ(fired.get_future().wait_for(5s), std::future_status::ready);
  }
  EXPECT_GT(loop.idle_polls(), 0u);
}

TEST(EventLoop, StopEndsTheLoopWhilePolling) {
  net::io_context context(1);
  auto loop = std::make_unique<LoopThread>(context, std::chrono::microseconds(10s));
  auto returned = loop->returned();
  EXPECT_TRUE(eventually([&] { return loop->idle_polls() > 0; }, 10s));
  context.stop();
  EXPECT_EQ(returned.wait_for(5s), std::future_status::ready);
  EXPECT_EQ(loop->sleeps(), 0u);
  loop.reset();
}

TEST(EventLoop, ReturnsWhenItRunsOutOfWorkLikeRun) {
  net::io_context context(1);
  server::EventLoopCounters counters;
  std::promise<void> returned;
  bool ran = false;
  net::post(context, [&ran] { ran = true; });
  std::thread thread([&] {
    server::run_event_loop(context, std::chrono::microseconds(10s), counters);
    returned.set_value();
  });
  auto done = returned.get_future().wait_for(5s);
  if (done != std::future_status::ready) context.stop();
  thread.join();
  EXPECT_EQ(done, std::future_status::ready);
  EXPECT_TRUE(ran);
}

TEST(EventLoop, AGatewayWithBusyPollProxiesRequestsAndPolls) {
  auto upstream = start_mock({});
  TestGateway gateway(
      "server:\n  listen: 127.0.0.1:0\n  threads: 2\n  busy_poll_us: 1000\n"
      "models:\n  - name: chat\n    deployments:\n" +
      deployment_yaml("d1", upstream->base_url()));
  HttpConnection client(gateway.port());
  for (int i = 0; i < 20; ++i) {
    auto response = client.request("POST", "/v1/chat/completions", chat_body("chat", false));
    ASSERT_EQ(response.status, 200u) << response.body;
    EXPECT_NE(response.body.find("chat.completion"), std::string::npos);
  }
  // The setting reached the workers: they polled, and they went to sleep.
  auto total = [&](auto counter) {
    std::uint64_t sum = 0;
    for (auto& worker : gateway.gateway().workers())
      sum += (worker->loop_counters().*counter).load();
    return sum;
  };
  EXPECT_TRUE(eventually(
      [&] {
        return total(&server::EventLoopCounters::idle_polls) > 0 &&
               total(&server::EventLoopCounters::sleeps) >= gateway.gateway().workers().size();
      },
      10s));
}

}  // namespace
}  // namespace sluice::testing
