#pragma once

#include <exception>
#include <string_view>

// Nothing on the data path throws by design: its errors are values. An
// exception that escapes anyway is a bug, and must cost one connection, not
// the gateway: a coroutine spawned `detached` would drop it silently, with
// whatever its request held (in-flight counts, slots) never given back.
// Those are held by guards that unwinding releases, and the coroutines end
// at this barrier, which counts and logs what reached it.
namespace sluice::server {

class Worker;

// Counts `error` in sluice_internal_errors_total and logs it: the first at
// once, then at most one line a minute with how many came since, so that a
// bug every request runs into cannot flood the log.
void report_internal_error(Worker& worker, std::string_view where,
                           const std::exception_ptr& error) noexcept;

// The completion handler for co_spawn of a data-plane coroutine, in place of
// `detached`. `where` names the coroutine and must outlive it (a literal).
class InternalErrorBarrier {
 public:
  InternalErrorBarrier(Worker& worker, std::string_view where) : worker_(&worker), where_(where) {}
  void operator()(const std::exception_ptr& error) const {
    if (error) [[unlikely]]
      report_internal_error(*worker_, where_, error);
  }

 private:
  Worker* worker_;
  std::string_view where_;
};

// Where a test may make the request path throw, to see that the barrier
// and the guards hold.
enum class FaultPoint {
  attempt_failed,       // an upstream attempt failed; its deployment slot is held
  hedge_launched,       // a hedge was planned while its primary runs
  hedge_attempt,        // in the coroutine of a hedge's attempt
  connection_accepted,  // a connection was accepted, before a worker takes it
};
// Null outside tests. Set it before the gateway starts and clear it after
// it stopped. Only rare paths check it, so the common case pays nothing.
extern void (*fault_injection)(FaultPoint point);
inline void inject_fault(FaultPoint point) {
  if (fault_injection != nullptr) [[unlikely]]
    fault_injection(point);
}

}  // namespace sluice::server
