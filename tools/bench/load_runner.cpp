#include "load_runner.hpp"

#include <algorithm>
#include <atomic>
#include <memory>
#include <thread>
#include <vector>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>

#include "response_parser.hpp"

namespace sluice::bench {

namespace {

// The first of `slot`, `slot + period`, `slot + 2 * period` ... not before `now`.
Clock::time_point next_slot(Clock::time_point slot, Clock::duration period, Clock::time_point now) {
  if (now <= slot) return slot;
  const auto periods = (now - slot + period - Clock::duration(1)) / period;
  return slot + periods * period;
}

namespace asio = boost::asio;
using asio::awaitable;
using asio::ip::tcp;

constexpr auto use_tuple = asio::as_tuple(asio::use_awaitable);

constexpr std::size_t kReadBufferBytes = 64 * 1024;
// Due open-loop requests waiting for a free connection; past this the load
// is hopeless for the target and further requests count as backlog errors.
constexpr std::size_t kBacklogCapacity = 1 << 16;
// Connections an open-loop thread opens before the first request is due, so
// that the first measured requests do not all pay for a handshake.
constexpr unsigned kPreconnectedWorkers = 4;
// How often timeouts are checked; a timeout fires up to this much late.
constexpr auto kWatchdogPeriod = std::chrono::milliseconds(50);
// A closed-loop connection that cannot connect waits this long before it
// tries again, so a dead target is not hammered in a tight loop.
constexpr auto kReconnectBackoff = std::chrono::milliseconds(100);

Clock::time_point saturating_add(Clock::time_point point, Clock::duration duration) {
  if (point > Clock::time_point::max() - duration) return Clock::time_point::max();
  return point + duration;
}

// What every thread of one run shares; read-only once the threads start,
// except the request budget.
struct SharedPlan {
  const LoadOptions* options = nullptr;
  const std::string* request = nullptr;
  tcp::endpoint endpoint;
  Clock::time_point start;
  Clock::time_point warmup_end;
  Clock::time_point deadline;  // no new request starts after it; max() in --requests mode
  // --requests in closed loop: measured requests left to start, all threads
  // together. Goes negative once exhausted.
  std::atomic<std::int64_t> closed_loop_budget{0};
};

struct Connection {
  explicit Connection(asio::io_context& io)
      : socket(io), wake(io), buffer(std::make_unique<char[]>(kReadBufferBytes)) {}

  tcp::socket socket;
  // An idle open-loop worker sleeps on this timer until given a request.
  asio::steady_timer wake;
  std::unique_ptr<char[]> buffer;
  ResponseParser parser;
  SseEventScanner scanner;
  Clock::time_point deadline;
  bool busy = false;
  bool timed_out = false;
  bool error_status = false;  // the last answer's status was not 2xx
  Clock::time_point job;      // the scheduled start of the request assigned to it
  bool has_job = false;
};

// The part of a run that one thread drives, on its own io_context: no locks
// and no cross-thread wakeups in the measured path.
class ThreadRun {
 public:
  ThreadRun(SharedPlan& plan, unsigned index, unsigned thread_count, RunResult& result)
      : plan_(plan),
        options_(*plan.options),
        index_(index),
        thread_count_(thread_count),
        result_(result),
        io_(1),
        watchdog_timer_(io_),
        schedule_timer_(io_) {}

  void run() {
    if (options_.open_loop()) {
      start_open_loop();
    } else {
      start_closed_loop();
    }
    launch(watchdog(), /*counts_as_active=*/false);
    io_.run();
  }

 private:
  // ---------------------------------------------------------------- closed
  void start_closed_loop() {
    unsigned connections = options_.concurrency / thread_count_;
    if (index_ < options_.concurrency % thread_count_) ++connections;
    for (unsigned i = 0; i < connections; ++i) {
      // Connection i of this thread is connection index_ + i * threads of
      // the whole run.
      const auto position = static_cast<double>(index_ + i * thread_count_);
      const auto start_after = std::chrono::duration_cast<Clock::duration>(
          options_.ramp * (position / static_cast<double>(options_.concurrency)));
      launch(closed_loop_worker(add_connection(), start_after), true);
    }
  }

  awaitable<void> closed_loop_worker(Connection& connection, Clock::duration start_after) {
    const Clock::time_point slot = plan_.start + start_after;
    asio::steady_timer ramp(io_);
    for (;;) {
      // A ramped connection keeps to its place in the ramp: each request
      // waits for the connection's next slot (its offset, plus whole
      // ramps). Left to the closed loop alone, streams that a proxy ends
      // in one batch start their next requests together, and over a few
      // rounds the ramp's spread gathers back into bursts.
      if (options_.ramp > Clock::duration::zero()) {
        ramp.expires_at(next_slot(slot, options_.ramp, Clock::now()));
        co_await ramp.async_wait(use_tuple);
      }
      const auto now = Clock::now();
      if (now >= plan_.deadline) break;
      const bool measured = now >= plan_.warmup_end;
      if (measured && options_.requests > 0 &&
          plan_.closed_loop_budget.fetch_sub(1, std::memory_order_relaxed) <= 0) {
        break;
      }
      co_await exchange(connection, now, /*from_schedule=*/false, measured);
      if (connection.error_status && options_.pause_after_error > Clock::duration::zero()) {
        asio::steady_timer backoff(io_, options_.pause_after_error);
        co_await backoff.async_wait(use_tuple);
      }
    }
    close(connection);
  }

  // ------------------------------------------------------------------ open
  void start_open_loop() {
    const unsigned per_thread = std::max(1u, options_.max_connections / thread_count_);
    max_workers_ = per_thread;
    backlog_.resize(kBacklogCapacity);
    idle_.reserve(per_thread);
    if (options_.requests > 0) {
      measured_share_ = options_.requests / thread_count_;
      if (index_ < options_.requests % thread_count_) ++measured_share_;
    }
    for (unsigned i = 0; i < std::min(kPreconnectedWorkers, max_workers_); ++i) {
      spawn_open_loop_worker(add_connection(), /*preconnect=*/true);
    }
    launch(scheduler(), true);
  }

  // Hands out requests at fixed times. Thread t of T owns the slots
  // t, t+T, t+2T... of one global schedule with 1/rate spacing, so the
  // threads together send at exactly the requested rate.
  awaitable<void> scheduler() {
    const double interval_ns = 1e9 * thread_count_ / options_.rate;
    const double offset_ns = 1e9 * index_ / options_.rate;
    std::uint64_t measured_scheduled = 0;
    for (std::uint64_t slot = 0;; ++slot) {
      const auto due = plan_.start + std::chrono::duration_cast<Clock::duration>(
                                         std::chrono::duration<double, std::nano>(
                                             offset_ns + interval_ns * static_cast<double>(slot)));
      if (due >= plan_.deadline) break;
      const bool measured = due >= plan_.warmup_end;
      if (measured && options_.requests > 0 && measured_scheduled >= measured_share_) break;
      // A due time already past still goes through the timer, which yields
      // to the workers instead of starving them while catching up.
      schedule_timer_.expires_at(due);
      co_await schedule_timer_.async_wait(use_tuple);
      if (measured) ++measured_scheduled;
      dispatch(due, measured);
    }
    scheduling_done_ = true;
    for (Connection* idle : idle_) idle->wake.cancel();
    idle_.clear();
  }

  void dispatch(Clock::time_point due, bool measured) {
    if (!idle_.empty()) {
      Connection* worker = idle_.back();
      idle_.pop_back();
      worker->job = due;
      worker->has_job = true;
      worker->wake.cancel();
    } else if (worker_count_ < max_workers_) {
      Connection& worker = add_connection();
      worker.job = due;
      worker.has_job = true;
      spawn_open_loop_worker(worker, /*preconnect=*/false);
    } else if (backlog_size_ < backlog_.size()) {
      backlog_[(backlog_head_ + backlog_size_) % backlog_.size()] = due;
      ++backlog_size_;
    } else if (measured) {
      count_error(ErrorKind::backlog);
    }
  }

  // Counted here rather than when the coroutine starts, so that dispatches
  // made before it runs see the limit.
  void spawn_open_loop_worker(Connection& connection, bool preconnect) {
    ++worker_count_;
    result_.peak_connections = std::max(result_.peak_connections, worker_count_);
    launch(open_loop_worker(connection, preconnect), true);
  }

  awaitable<void> open_loop_worker(Connection& connection, bool preconnect) {
    if (preconnect) co_await connect(connection);
    // Requests still queued this long after the end will not be sent: they
    // count as timeouts, which bounds how long an overloaded run drains.
    const auto give_up = saturating_add(plan_.deadline, options_.timeout);
    for (;;) {
      if (!connection.has_job) {
        if (backlog_size_ > 0) {
          connection.job = backlog_[backlog_head_];
          connection.has_job = true;
          backlog_head_ = (backlog_head_ + 1) % backlog_.size();
          --backlog_size_;
        } else if (scheduling_done_) {
          break;
        } else {
          idle_.push_back(&connection);
          connection.wake.expires_at(Clock::time_point::max());
          co_await connection.wake.async_wait(use_tuple);
          continue;
        }
      }
      connection.has_job = false;
      const bool measured = connection.job >= plan_.warmup_end;
      if (Clock::now() > give_up) {
        if (measured) count_error(ErrorKind::timeout);
        continue;
      }
      co_await exchange(connection, connection.job, /*from_schedule=*/true, measured);
    }
    close(connection);
  }

  // ------------------------------------------------------------- exchange
  awaitable<bool> connect(Connection& connection) {
    auto [error] = co_await connection.socket.async_connect(plan_.endpoint, use_tuple);
    if (error) {
      boost::system::error_code ignored;
      connection.socket.close(ignored);
      co_return false;
    }
    boost::system::error_code ignored;
    connection.socket.set_option(tcp::no_delay(true), ignored);
    co_return true;
  }

  // One request and its response. `origin` is when the request was due: the
  // scheduled time in open loop (so a stall delays and is charged to every
  // request behind it) or the moment of sending in closed loop.
  awaitable<void> exchange(Connection& connection, Clock::time_point origin, bool from_schedule,
                           bool measured) {
    connection.deadline = Clock::now() + options_.timeout;
    connection.timed_out = false;
    connection.error_status = false;
    connection.busy = true;
    if (!connection.socket.is_open() && !co_await connect(connection)) {
      connection.busy = false;
      if (measured) count_error(connection.timed_out ? ErrorKind::timeout : ErrorKind::connect);
      if (!from_schedule) {
        asio::steady_timer backoff(io_, kReconnectBackoff);
        co_await backoff.async_wait(use_tuple);
      }
      co_return;
    }
    const auto sent_at = Clock::now();
    if (!from_schedule) origin = sent_at;

    auto [write_error, written] =
        co_await asio::async_write(connection.socket, asio::buffer(*plan_.request), use_tuple);
    if (write_error) {
      fail(connection, measured, connection.timed_out ? ErrorKind::timeout : ErrorKind::send);
      co_return;
    }
    ++result_.exchanges;

    ResponseParser& parser = connection.parser;
    SseEventScanner& scanner = connection.scanner;
    parser.reset();
    scanner.reset();
    const bool record_gaps = measured && options_.stream;
    Clock::time_point now{};
    Clock::time_point first_body_at{};
    Clock::time_point last_event_at{};
    Clock::time_point last_sent_at{};  // the previous event's stamp, if it had one
    bool have_body = false;
    bool have_event = false;
    std::uint64_t body_bytes = 0;
    std::uint64_t events = 0;
    bool extra_bytes = false;

    // Called for every piece of body; `now` is the arrival of the read that
    // carried it, so events arriving together share one timestamp.
    auto on_body = [&](const char* data, std::size_t size) {
      if (!have_body) {
        have_body = true;
        first_body_at = now;
      }
      body_bytes += size;
      scanner.scan(data, size, [&](std::uint64_t sent_ns) {
        ++events;
        const bool recording = record_gaps && parser.status() / 100 == 2;
        const Clock::time_point sent_at{std::chrono::nanoseconds(sent_ns)};
        if (recording && have_event) {
          result_.gap.record(nanoseconds_between(last_event_at, now));
        }
        if (recording && sent_ns != 0) {
          result_.delay.record(nanoseconds_between(sent_at, now));
          // Measured from when the event would have arrived had the path
          // kept the gap it was sent with. A gap that arrived shorter (two
          // events in one read) is no stall: nothing added.
          if (have_event && last_sent_at != Clock::time_point{}) {
            const Clock::time_point kept_gap_at = last_event_at + (sent_at - last_sent_at);
            const std::uint64_t stretch = nanoseconds_between(kept_gap_at, now);
            result_.stretch.record(stretch);
            if (options_.keep_sample_times) {
              result_.stretch_samples.push_back({last_event_at, now, stretch});
            }
          }
        }
        have_event = true;
        last_event_at = now;
        last_sent_at = sent_ns != 0 ? sent_at : Clock::time_point{};
      });
    };

    for (;;) {
      auto [read_error, received] = co_await connection.socket.async_read_some(
          asio::buffer(connection.buffer.get(), kReadBufferBytes), use_tuple);
      now = Clock::now();
      if (read_error) {
        if (connection.timed_out) {
          fail(connection, measured, ErrorKind::timeout);
          co_return;
        }
        if (read_error == asio::error::eof &&
            parser.finish_at_eof() == ResponseParser::Progress::complete) {
          break;
        }
        fail(connection, measured,
             read_error == asio::error::eof ? ErrorKind::closed : ErrorKind::receive);
        co_return;
      }
      std::size_t consumed = 0;
      const auto progress = parser.feed(connection.buffer.get(), received, consumed, on_body);
      if (progress == ResponseParser::Progress::failed) {
        fail(connection, measured, ErrorKind::protocol);
        co_return;
      }
      if (progress == ResponseParser::Progress::complete) {
        // Nothing was pipelined, so anything more is the server's mistake;
        // the connection cannot be trusted for the next exchange.
        extra_bytes = consumed < received;
        break;
      }
    }
    connection.busy = false;
    if (!parser.keep_alive() || extra_bytes) close(connection);

    const unsigned status = parser.status();
    if (status / 100 != 2) {
      connection.error_status = true;
      if (measured) {
        count_error(status / 100 == 4   ? ErrorKind::http_4xx
                    : status / 100 == 5 ? ErrorKind::http_5xx
                                        : ErrorKind::http_other);
      }
      co_return;
    }
    if (now >= plan_.warmup_end && now <= plan_.deadline) ++result_.completed_in_window;
    if (!measured) co_return;
    ++result_.ok;
    const Clock::time_point first_byte_at = have_body ? first_body_at : now;
    const std::uint64_t ttft = nanoseconds_between(origin, first_byte_at);
    result_.ttft.record(ttft);
    if (options_.keep_sample_times) result_.ttft_samples.push_back({origin, first_byte_at, ttft});
    result_.total.record(nanoseconds_between(origin, now));
    result_.body_bytes += body_bytes;
    result_.events += events;
    result_.first_start = std::min(result_.first_start, origin);
    result_.last_end = std::max(result_.last_end, now);
  }

  void fail(Connection& connection, bool measured, ErrorKind kind) {
    connection.busy = false;
    close(connection);
    if (measured) count_error(kind);
  }

  void count_error(ErrorKind kind) { ++result_.errors[static_cast<std::size_t>(kind)]; }

  void close(Connection& connection) {
    boost::system::error_code ignored;
    connection.socket.close(ignored);
  }

  // ------------------------------------------------------------- plumbing
  Connection& add_connection() {
    connections_.push_back(std::make_unique<Connection>(io_));
    if (!options_.open_loop()) {
      result_.peak_connections = static_cast<unsigned>(connections_.size());
    }
    return *connections_.back();
  }

  // Runs a coroutine; the watchdog stops once no counted coroutine is left.
  void launch(awaitable<void> work, bool counts_as_active) {
    if (counts_as_active) ++active_;
    asio::co_spawn(io_, supervise(std::move(work), counts_as_active), asio::detached);
  }

  awaitable<void> supervise(awaitable<void> work, bool counts_as_active) {
    co_await std::move(work);
    if (counts_as_active && --active_ == 0) watchdog_timer_.cancel();
  }

  // Closes the sockets of exchanges past their deadline; the pending read or
  // write then fails and the exchange counts a timeout.
  awaitable<void> watchdog() {
    while (active_ > 0) {
      watchdog_timer_.expires_after(kWatchdogPeriod);
      co_await watchdog_timer_.async_wait(use_tuple);
      const auto now = Clock::now();
      for (auto& connection : connections_) {
        if (connection->busy && !connection->timed_out && now > connection->deadline) {
          connection->timed_out = true;
          close(*connection);
        }
      }
    }
  }

  SharedPlan& plan_;
  const LoadOptions& options_;
  const unsigned index_;
  const unsigned thread_count_;
  RunResult& result_;
  asio::io_context io_;
  asio::steady_timer watchdog_timer_;
  asio::steady_timer schedule_timer_;
  std::vector<std::unique_ptr<Connection>> connections_;
  unsigned active_ = 0;

  // Open loop only.
  unsigned max_workers_ = 0;
  unsigned worker_count_ = 0;
  std::uint64_t measured_share_ = 0;
  std::vector<Connection*> idle_;
  std::vector<Clock::time_point> backlog_;  // a ring of due times
  std::size_t backlog_head_ = 0;
  std::size_t backlog_size_ = 0;
  bool scheduling_done_ = false;
};

tcp::endpoint resolve(const HttpUrl& url) {
  asio::io_context io;
  tcp::resolver resolver(io);
  boost::system::error_code error;
  auto endpoints =
      resolver.resolve(url.host, std::to_string(url.port), tcp::resolver::numeric_service, error);
  if (error || endpoints.empty()) {
    throw UsageError{"cannot resolve " + url.host + ": " + error.message()};
  }
  return endpoints.begin()->endpoint();
}

}  // namespace

std::string_view error_name(ErrorKind kind) {
  static constexpr std::string_view kNames[kErrorKindCount] = {
      "connect", "send",     "receive",  "closed",     "protocol",
      "timeout", "http_4xx", "http_5xx", "http_other", "backlog",
  };
  return kNames[static_cast<std::size_t>(kind)];
}

void RunResult::merge(const RunResult& other) {
  ttft.merge(other.ttft);
  total.merge(other.total);
  gap.merge(other.gap);
  delay.merge(other.delay);
  stretch.merge(other.stretch);
  ttft_samples.insert(ttft_samples.end(), other.ttft_samples.begin(), other.ttft_samples.end());
  stretch_samples.insert(stretch_samples.end(), other.stretch_samples.begin(),
                         other.stretch_samples.end());
  ttft_untouched.merge(other.ttft_untouched);
  ttft_touched += other.ttft_touched;
  stretch_untouched.merge(other.stretch_untouched);
  stretch_touched += other.stretch_touched;
  ok += other.ok;
  body_bytes += other.body_bytes;
  events += other.events;
  for (std::size_t i = 0; i < kErrorKindCount; ++i) errors[i] += other.errors[i];
  completed_in_window += other.completed_in_window;
  exchanges += other.exchanges;
  first_start = std::min(first_start, other.first_start);
  last_end = std::max(last_end, other.last_end);
  peak_connections += other.peak_connections;
}

std::uint64_t RunResult::error_count() const {
  std::uint64_t count = 0;
  for (auto errors_of_kind : errors) count += errors_of_kind;
  return count;
}

RunResult run_load(const HttpUrl& url, const LoadOptions& options, const std::string& request) {
  SharedPlan plan;
  plan.options = &options;
  plan.request = &request;
  plan.endpoint = resolve(url);
  plan.start = Clock::now();
  plan.warmup_end = plan.start + options.warmup;
  plan.deadline =
      options.requests > 0 ? Clock::time_point::max() : plan.warmup_end + options.duration;
  plan.closed_loop_budget = static_cast<std::int64_t>(options.requests);

  const unsigned thread_count = std::max(1u, options.threads);
  std::vector<std::unique_ptr<RunResult>> results;
  for (unsigned i = 0; i < thread_count; ++i) results.push_back(std::make_unique<RunResult>());
  std::vector<std::thread> threads;
  for (unsigned i = 0; i < thread_count; ++i) {
    threads.emplace_back([&plan, &results, i, thread_count] {
      ThreadRun(plan, i, thread_count, *results[i]).run();
    });
  }
  for (auto& thread : threads) thread.join();

  RunResult merged = std::move(*results.front());
  for (std::size_t i = 1; i < results.size(); ++i) merged.merge(*results[i]);

  if (options.requests > 0) {
    merged.measured_seconds =
        merged.ok > 0 ? std::chrono::duration<double>(merged.last_end - merged.first_start).count()
                      : 0;
    merged.requests_per_second =
        merged.measured_seconds > 0 ? merged.ok / merged.measured_seconds : 0;
  } else {
    merged.measured_seconds = std::chrono::duration<double>(options.duration).count();
    merged.requests_per_second = merged.completed_in_window / merged.measured_seconds;
  }
  return merged;
}

}  // namespace sluice::bench
