#include "sluice/server/internal_errors.hpp"

#include <spdlog/spdlog.h>

#include <atomic>
#include <cstdint>
#include <limits>
#include <string>

#include "sluice/common/clock.hpp"
#include "sluice/server/gateway.hpp"

namespace sluice::server {

void (*fault_injection)(FaultPoint point) = nullptr;

namespace {

constexpr std::chrono::minutes kLogAtMostEvery{1};

// Process-wide: a bug reached from every worker should still log one line.
std::atomic<std::int64_t> next_line_at{std::numeric_limits<std::int64_t>::min()};
std::atomic<std::uint64_t> not_logged{0};

std::string describe(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& escaped) {
    return escaped.what();
  } catch (...) {
    return "an exception that is no std::exception";
  }
}

}  // namespace

void report_internal_error(Worker& worker, std::string_view where,
                           const std::exception_ptr& error) noexcept {
  worker.gateway().metrics().internal_errors.add(worker.index());
  const auto now = Clock::now().time_since_epoch().count();
  auto due = next_line_at.load(std::memory_order_relaxed);
  const auto next = now + std::chrono::duration_cast<Clock::duration>(kLogAtMostEvery).count();
  if (now < due || !next_line_at.compare_exchange_strong(due, next, std::memory_order_relaxed)) {
    not_logged.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  try {
    spdlog::error(
        "internal error in {}, its connection closed: {} ({} more since the last such line; "
        "see sluice_internal_errors_total)",
        where, describe(error), not_logged.exchange(0, std::memory_order_relaxed));
  } catch (...) {
    // A log line that cannot be written is not worth a second failure.
  }
}

}  // namespace sluice::server
