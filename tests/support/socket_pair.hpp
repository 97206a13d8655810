#pragma once

#include <gtest/gtest.h>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>
#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "sluice/http/network_errors.hpp"

namespace sluice::testing {

// Runs `task` on `context` to completion, or fails after `limit`.
inline void run_to_end(boost::asio::io_context& context, boost::asio::awaitable<void> task,
                       std::chrono::milliseconds limit = std::chrono::seconds(5)) {
  bool done = false;
  context.restart();
  boost::asio::co_spawn(
      context,
      [&]() -> boost::asio::awaitable<void> {
        co_await std::move(task);
        done = true;
        context.stop();  // timers still armed are not waited for
      },
      boost::asio::detached);
  context.run_for(limit);
  ASSERT_TRUE(done) << "did not finish within " << limit.count() << " ms";
}

// A connected pair of sockets on 127.0.0.1, on one io_context.
struct SocketPair {
  boost::asio::io_context context;
  boost::asio::ip::tcp::socket ours{context};
  boost::asio::ip::tcp::socket theirs{context};

  SocketPair() {
    boost::asio::ip::tcp::acceptor acceptor(context,
                                            {boost::asio::ip::make_address("127.0.0.1"), 0});
    ours.connect(acceptor.local_endpoint());
    theirs = acceptor.accept();
  }

  // Runs `action` on the context's thread after `delay`.
  void after(std::chrono::milliseconds delay, std::function<void()> action) {
    auto timer = std::make_shared<boost::asio::steady_timer>(context, delay);
    timer->async_wait([timer, action = std::move(action)](error_code) { action(); });
  }

  // Sends `bytes` from their side after `delay`.
  void write_after(std::chrono::milliseconds delay, std::string bytes) {
    after(delay, [this, bytes = std::move(bytes)] {
      boost::asio::write(theirs, boost::asio::buffer(bytes));
    });
  }

  // Runs `task` to completion, or fails after `limit`.
  void run(boost::asio::awaitable<void> task,
           std::chrono::milliseconds limit = std::chrono::seconds(5)) {
    run_to_end(context, std::move(task), limit);
  }
};

}  // namespace sluice::testing
