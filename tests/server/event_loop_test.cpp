// The worker's event loop with and without busy polling: polling keeps the
// core only for its window, and every kind of event still gets handled.
#include "sluice/server/event_loop.hpp"

#include <gtest/gtest.h>
#include <pthread.h>
#include <sys/resource.h>
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

// A thread running run_event_loop on a context that always has work, until
// the fixture stops it.
class LoopThread {
 public:
  LoopThread(net::io_context& context, std::chrono::microseconds busy_poll)
      : context_(context), guard_(net::make_work_guard(context)) {
    thread_ = std::thread([this, busy_poll] {
      server::run_event_loop(context_, busy_poll);
      returned_.set_value();
    });
  }
  ~LoopThread() {
    context_.stop();
    thread_.join();
  }

  // CPU time the loop's thread has used so far.
  std::chrono::nanoseconds cpu_time() {
    clockid_t clock{};
    EXPECT_EQ(pthread_getcpuclockid(thread_.native_handle(), &clock), 0);
    timespec now{};
    EXPECT_EQ(clock_gettime(clock, &now), 0);
    return std::chrono::seconds(now.tv_sec) + std::chrono::nanoseconds(now.tv_nsec);
  }

  // CPU the loop's thread uses over `span` of wall time.
  std::chrono::nanoseconds cpu_over(std::chrono::milliseconds span) {
    auto before = cpu_time();
    std::this_thread::sleep_for(span);
    return cpu_time() - before;
  }

  std::future<void> returned() { return returned_.get_future(); }

 private:
  net::io_context& context_;
  net::executor_work_guard<net::io_context::executor_type> guard_;
  std::promise<void> returned_;
  std::thread thread_;
};

// A thread that polls holds its core (minus what yields give away); one that
// sleeps uses next to nothing. 30 ms of 150 leaves room for a busy machine.
constexpr auto kWindow = 150ms;
constexpr auto kPolling = 30ms;
constexpr auto kSleeping = 15ms;

TEST(EventLoop, WithoutBusyPollAnIdleThreadSleepsAtOnce) {
  net::io_context context(1);
  LoopThread loop(context, std::chrono::microseconds(0));
  EXPECT_LT(loop.cpu_over(kWindow), kSleeping);
}

TEST(EventLoop, BusyPollKeepsPollingThroughItsWindowThenSleeps) {
  net::io_context context(1);
  LoopThread loop(context, std::chrono::microseconds(400ms));
  // The window starts when the loop first finds nothing to do.
  EXPECT_GT(loop.cpu_over(kWindow), kPolling);
  std::this_thread::sleep_for(400ms);
  EXPECT_LT(loop.cpu_over(kWindow), kSleeping);
}

TEST(EventLoop, EachHandlerStartsANewWindow) {
  net::io_context context(1);
  LoopThread loop(context, std::chrono::microseconds(200ms));
  std::this_thread::sleep_for(300ms);  // past the first window: asleep
  ASSERT_LT(loop.cpu_over(kWindow), kSleeping);
  std::promise<void> ran;
  net::post(context, [&ran] { ran.set_value(); });
  ASSERT_EQ(ran.get_future().wait_for(5s), std::future_status::ready);
  EXPECT_GT(loop.cpu_over(kWindow), kPolling);
}

TEST(EventLoop, SocketsAndTimersAreServedWhilePollingAndAfterItsWindow) {
  SocketPair pair;
  LoopThread loop(pair.context, std::chrono::microseconds(100ms));
  // First while it polls, then once it sleeps: both must wake the handler.
  for (auto delay : {20ms, 300ms}) {
    std::promise<std::string> received;
    auto buffer = std::make_shared<std::string>(5, '\0');
    net::post(pair.context, [&] {
      net::async_read(pair.ours, net::buffer(*buffer),
                      [&received, buffer](error_code ec, std::size_t) {
                        received.set_value(ec ? ec.message() : *buffer);
                      });
    });
    std::this_thread::sleep_for(delay);
    net::post(pair.context, [&pair] {
      error_code ignored;
      net::write(pair.theirs, net::buffer(std::string("hello")), ignored);
    });
    auto future = received.get_future();
    ASSERT_EQ(future.wait_for(5s), std::future_status::ready);
    EXPECT_EQ(future.get(), "hello");

    std::promise<void> fired;
    net::steady_timer timer(pair.context, 30ms);
    net::post(pair.context, [&] { timer.async_wait([&fired](error_code) { fired.set_value(); }); });
    ASSERT_EQ(fired.get_future().wait_for(5s), std::future_status::ready);
  }
}

TEST(EventLoop, StopEndsTheLoopWhilePolling) {
  net::io_context context(1);
  auto loop = std::make_unique<LoopThread>(context, std::chrono::microseconds(10s));
  auto returned = loop->returned();
  std::this_thread::sleep_for(20ms);
  context.stop();
  EXPECT_EQ(returned.wait_for(5s), std::future_status::ready);
  loop.reset();
}

TEST(EventLoop, ReturnsWhenItRunsOutOfWorkLikeRun) {
  net::io_context context(1);
  std::promise<void> returned;
  net::post(context, [] {});
  std::thread thread([&] {
    server::run_event_loop(context, std::chrono::microseconds(10s));
    returned.set_value();
  });
  auto done = returned.get_future().wait_for(5s);
  if (done != std::future_status::ready) context.stop();
  thread.join();
  EXPECT_EQ(done, std::future_status::ready);
}

// Process CPU (every thread) over `span` of wall time.
std::chrono::microseconds process_cpu_over(std::chrono::milliseconds span) {
  auto used = [] {
    rusage usage{};
    EXPECT_EQ(getrusage(RUSAGE_SELF, &usage), 0);
    auto total = [](const timeval& t) {
      return std::chrono::seconds(t.tv_sec) + std::chrono::microseconds(t.tv_usec);
    };
    return total(usage.ru_utime) + total(usage.ru_stime);
  };
  auto before = used();
  std::this_thread::sleep_for(span);
  return used() - before;
}

TEST(EventLoop, AGatewayWithBusyPollProxiesRequestsAndPolls) {
  auto upstream = start_mock({});
  TestGateway gateway(
      "server:\n  listen: 127.0.0.1:0\n  threads: 2\n  busy_poll_us: 600000\n"
      "models:\n  - name: chat\n    deployments:\n" +
      deployment_yaml("d1", upstream->base_url()));
  HttpConnection client(gateway.port());
  for (int i = 0; i < 20; ++i) {
    auto response = client.request("POST", "/v1/chat/completions", chat_body("chat", false));
    ASSERT_EQ(response.status, 200u) << response.body;
    EXPECT_NE(response.body.find("chat.completion"), std::string::npos);
  }
  // Its workers keep polling after the last request: the setting reached them.
  EXPECT_GT(process_cpu_over(kWindow), kPolling);
}

}  // namespace
}  // namespace sluice::testing
