#pragma once

#include <atomic>
#include <boost/container/small_vector.hpp>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "sluice/common/clock.hpp"
#include "sluice/common/xorshift.hpp"
#include "sluice/config/config.hpp"
#include "sluice/router/deployment_state.hpp"

// The router decides, the pipeline acts: nothing here touches a socket, so
// every decision is testable with plain calls and a fake clock.
namespace sluice::router {

// Per plan: choosing among deployments draws without touching shared state.
using RandomBits = Xorshift64Star;
using Micros = std::chrono::microseconds;
using Millis = std::chrono::milliseconds;
// A request's lists of deployments are as short as its model's: kept
// inline, they cost no allocation per request.
using DeploymentList = boost::container::small_vector<const config::Deployment*, 2>;

struct Attempt {
  const config::Model* model = nullptr;  // the group the deployment belongs to
  const config::Deployment* deployment = nullptr;
  DeploymentState* state = nullptr;
  Millis wait{0};         // sleep this long before sending (backoff, Retry-After)
  bool fallback = false;  // model is a fallback of the requested one
  bool hedge = false;     // started by next_hedge
  bool probe = false;     // the one request let through after a cooldown ran out
  // The plan's (kNoPromptClass: none); one byte, in what was padding.
  std::uint8_t prompt_class = kNoPromptClass;
  // With router.diagnosis: the requests in flight to the deployment once
  // this one was let through (in_flight_bucket), also in what was padding.
  std::uint8_t in_flight_bucket = 0;
  std::optional<Millis> hedge_after;  // start a hedge if no first byte by then
};

enum class ResultKind {
  success,                  // a first byte of a 2xx/3xx response arrived
  retriable,                // connect/TLS error, timeout before first byte, 408/409/429/5xx
  client_error,             // other 4xx: returned to the client as is, never retried
  context_window_exceeded,  // go to context_window_fallbacks
};

struct AttemptResult {
  ResultKind kind = ResultKind::success;
  bool timed_out = false;             // a timeout before the first byte
  std::optional<Micros> ttft;         // request sent -> first response byte, when it arrived
  std::optional<Millis> retry_after;  // from the upstream's Retry-After
  // A first-byte timeout under an adaptive deadline: the TTFT window takes
  // the deadline as a lower bound of the time the answer would have taken.
  std::optional<Micros> censored_ttft;
};

// Maps an upstream status (and the start of its error body) to a result kind.
ResultKind classify_status(unsigned status, std::string_view error_body);

class Router;

// The attempts for one request, decided one at a time as results come in.
// Used by one coroutine only; the shared per-deployment state it reads and
// updates is thread-safe.
class Plan {
 public:
  // Gives back the slots (and probes) of attempts that never got their
  // report(), finish(), abandon(), lost_race() or left_by_client(): an
  // exception unwinding the request must not leave a deployment looking
  // busier than it is.
  ~Plan();
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;

  // The next attempt, or nullopt when the attempts are spent (retries + 1 in
  // all) or a result ended the request. Takes an in-flight slot on the
  // deployment it returns; report() or finish() gives it back.
  std::optional<Attempt> next(TimePoint now);
  // An attempt on another deployment of the same group than those in flight,
  // at most once per request; does not count against retries.
  std::optional<Attempt> next_hedge(TimePoint now);
  // The first-byte result of an attempt. For anything but success the slot is
  // released here; a success keeps it until finish().
  void report(const Attempt& attempt, const AttemptResult& result, TimePoint now);
  // A successful attempt's response has ended: `ok` false for a mid-stream
  // failure. `total` feeds the non-streaming window when !stream.
  void finish(const Attempt& attempt, bool ok, Micros total, TimePoint now);
  // An attempt given up without a result (client gone, or both racers
  // answered at once).
  void abandon(const Attempt& attempt);
  // An attempt the deployment's limits shared with other instances refused
  // before it was sent: given up like abandon(), counted as no attempt, and
  // the deployment is not chosen again by this plan.
  void at_shared_limit(const Attempt& attempt);
  // An attempt stopped because the other one of its race answered first,
  // `waited` after it began. A primary that lost to its hedge is the slow
  // tail the hedge was for, so its wait feeds the TTFT window as a lower
  // bound of its time (not as a failure); without it, the window's P95
  // would sink with every hedge won and fire hedges ever sooner. A losing
  // hedge began late, so its wait says nothing of its deployment.
  void lost_race(const Attempt& attempt, Micros waited, TimePoint now);
  // With router.diagnosis: the winning attempt opened a new connection,
  // which took `connect` (TCP) and `tls` (0 for plain HTTP).
  bool diagnosing() const { return diagnosis_; }
  void note_new_connection(const Attempt& attempt, Micros connect, Micros tls, TimePoint now) const;
  // A successful attempt's response was cut short by its client (gone, or
  // too slow to read): says nothing of the deployment, so no failure and no
  // total time; its TTFT, from report(), stands.
  void left_by_client(const Attempt& attempt);

  // Whether next() could still return an attempt after a retriable failure.
  bool can_retry() const;
  unsigned attempts_made() const { return attempts_made_; }
  std::size_t prompt_class() const { return prompt_class_; }

 private:
  friend class Router;

  Plan(const Router& router, const config::Model& model, bool stream, std::uint64_t seed,
       std::size_t prompt_class);
  // Feeds a first-byte time to the deployment's windows.
  void add_ttft(DeploymentState& state, Micros ttft, TimePoint now) const;

  struct Taken {
    const config::Deployment* deployment;
    DeploymentState* state;
    bool probe;
  };
  // Chooses in `group` and takes the slot, rpm unit and probe the choice
  // needs; a deployment another request raced us to is excluded and the
  // choice made again.
  std::optional<Taken> take_in_group(const config::Model& group, DeploymentList exclude,
                                     bool allow_cooling, TimePoint now);
  std::optional<Millis> hedge_delay(const config::Model& group, DeploymentState& state,
                                    TimePoint now) const;
  Millis backoff_wait(unsigned previous_attempts_on_deployment);
  unsigned& attempts_on(const config::Deployment* deployment);
  void resolve_groups(const std::vector<std::string>& names);
  // The slot of `state` is given back: it no longer needs the destructor.
  void forget_slot(const DeploymentState* state);
  void forget_probe(const DeploymentState* state);

  const Router* router_;
  const config::Model* requested_;
  bool stream_;
  std::uint8_t prompt_class_;  // kNoPromptClass when off; in what was padding
  bool diagnosis_;             // router.diagnosis; in what was padding
  RandomBits random_;
  // Groups in the order they are tried: the requested model, then its
  // fallbacks (or context-window fallbacks once one is needed).
  boost::container::small_vector<const config::Model*, 2> groups_;
  std::size_t group_index_ = 0;
  DeploymentList tried_in_group_;
  boost::container::small_vector<std::pair<const config::Deployment*, unsigned>, 2>
      attempts_per_deployment_;
  const config::Deployment* last_failed_ = nullptr;
  bool last_failed_timed_out_ = false;
  std::optional<Millis> pending_retry_after_;
  unsigned attempts_made_ = 0;
  bool hedged_ = false;
  bool ended_ = false;
  bool switched_to_context_fallbacks_ = false;
  // The slots this plan's attempts hold now: a primary and its hedge at
  // most, in the gateway.
  struct HeldSlot {
    DeploymentState* state;
    bool probe;  // a probe claim not settled yet
  };
  boost::container::small_vector<HeldSlot, 2> held_;
  DeploymentList at_shared_limit_;  // empty but with state.backend redis
};

// Holds the live state of every deployment in a config snapshot. Built per
// snapshot; on reload the state of deployments whose id and upstream are
// unchanged is carried over, so latency windows survive.
class Router {
 public:
  explicit Router(std::shared_ptr<const config::Config> config, const Router* previous = nullptr);

  // `prompt_class`: of the request's estimated input tokens
  // (prompt_class_of), or kNoPromptClass.
  Plan plan(const config::Model& model, bool stream, std::uint64_t seed,
            std::size_t prompt_class = kNoPromptClass) const;

  DeploymentState* state(const std::string& deployment_id) const;
  // The same, without hashing the id when the deployment is of this
  // router's config.
  DeploymentState* state(const config::Deployment& deployment) const;
  const config::Config& config() const { return *config_; }

  // Chooses among the usable deployments of a group by its strategy.
  // Exposed for tests; `exclude` are skipped.
  const config::Deployment* choose(const config::Model& group, bool stream,
                                   std::span<const config::Deployment* const> exclude,
                                   TimePoint now, RandomBits& random,
                                   std::size_t prompt_class = kNoPromptClass) const;

 private:
  friend class Plan;

  struct Choice {
    const config::Deployment* deployment = nullptr;
    // Chosen only because every remaining deployment is cooling down.
    bool despite_cooldown = false;
  };
  Choice choose_among(const config::Model& group, bool stream,
                      std::span<const config::Deployment* const> exclude, TimePoint now,
                      RandomBits& random, bool allow_cooling, std::size_t prompt_class) const;

  std::shared_ptr<const config::Config> config_;
  std::unordered_map<std::string, std::shared_ptr<DeploymentState>> states_;
  std::unordered_map<const config::Deployment*, DeploymentState*> by_deployment_;
  // Round-robin position per model, shared by all threads.
  std::unordered_map<std::string, std::unique_ptr<std::atomic<std::uint64_t>>> round_robin_;
};

}  // namespace sluice::router
