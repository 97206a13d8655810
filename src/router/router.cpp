#include "sluice/router/router.hpp"

#include <algorithm>
#include <boost/container/small_vector.hpp>
#include <cctype>
#include <limits>

namespace sluice::router {

namespace {

// Candidates and the like, on the stack for any realistic model.
using Deployments = boost::container::small_vector<const config::Deployment*, 8>;

// Samples older than this describe a deployment as it was, not as it is.
constexpr std::chrono::milliseconds kFreshFor{60'000};
// Fewer samples than this make a P95 little more than the maximum.
constexpr std::size_t kMinSamplesForP95 = 5;
// A prompt-size class with fewer fresh samples than this borrows a
// neighbour's window.
constexpr std::size_t kMinClassSamples = 5;

template <typename List>
bool contains(const List& list, const config::Deployment* deployment) {
  return std::find(list.begin(), list.end(), deployment) != list.end();
}

// Built in the parameter it is passed to: moving a small_vector out of its
// inline storage makes GCC 12 warn of an overread it cannot rule out.
DeploymentList with_one_more(const DeploymentList& list, const config::Deployment* deployment) {
  DeploymentList extended;
  extended.reserve(list.size() + 1);
  extended.assign(list.begin(), list.end());
  extended.push_back(deployment);
  return extended;
}

bool same_upstream(const config::Deployment& a, const config::Deployment& b) {
  return a.base_url.scheme == b.base_url.scheme && a.base_url.host == b.base_url.host &&
         a.base_url.port == b.base_url.port && a.base_url.path_prefix == b.base_url.path_prefix &&
         a.upstream_model == b.upstream_model;
}

const config::Deployment* pick_uniform(const Deployments& among, RandomBits& random) {
  if (among.size() == 1) return among.front();
  std::uniform_int_distribution<std::size_t> index(0, among.size() - 1);
  return among[index(random)];
}

bool contains_ignoring_case(std::string_view text, std::string_view needle) {
  const auto lower = [](unsigned char c) { return std::tolower(c); };
  const auto found = std::search(text.begin(), text.end(), needle.begin(), needle.end(),
                                 [&](char a, char b) { return lower(a) == lower(b); });
  return found != text.end();
}

bool mentions_context_window(std::string_view body) {
  return contains_ignoring_case(body, "context_length_exceeded") ||
         contains_ignoring_case(body, "maximum context length") ||
         contains_ignoring_case(body, "context window") ||
         // Anthropic's words for it.
         contains_ignoring_case(body, "prompt is too long");
}

}  // namespace

ResultKind classify_status(unsigned status, std::string_view error_body) {
  if (status >= 200 && status < 400) return ResultKind::success;
  if (status == 408 || status == 409 || status == 429 || status >= 500) {
    return ResultKind::retriable;
  }
  if (status >= 400) {
    if ((status == 400 || status == 413 || status == 422) && mentions_context_window(error_body)) {
      return ResultKind::context_window_exceeded;
    }
    return ResultKind::client_error;
  }
  // A 1xx as a final status is a broken upstream, not the client's fault.
  return ResultKind::retriable;
}

// ---------------------------------------------------------------------------
// Router

Router::Router(std::shared_ptr<const config::Config> config, const Router* previous)
    : config_(std::move(config)) {
  std::unordered_map<std::string_view, const config::Deployment*> previous_deployments;
  if (previous != nullptr) {
    for (const auto& model : previous->config_->models) {
      for (const auto& deployment : model.deployments) {
        previous_deployments.emplace(deployment.id, &deployment);
      }
    }
  }

  for (const auto& model : config_->models) {
    round_robin_.emplace(model.name, std::make_unique<std::atomic<std::uint64_t>>(0));
    for (const auto& deployment : model.deployments) {
      auto& state = states_[deployment.id];
      if (!state) {
        if (auto old = previous_deployments.find(deployment.id);
            old != previous_deployments.end() && same_upstream(*old->second, deployment)) {
          if (auto kept = previous->states_.find(deployment.id); kept != previous->states_.end()) {
            state = kept->second;
          }
        }
        if (!state) {
          state = std::make_shared<DeploymentState>(config_->router.window, Clock::now(),
                                                    config_->router.adaptive.concurrency);
        }
      }
      by_deployment_.emplace(&deployment, state.get());
    }
  }
}

Plan Router::plan(const config::Model& model, bool stream, std::uint64_t seed,
                  std::size_t prompt_class) const {
  return Plan(
      *this, model, stream, seed,
      config_->router.prompt_classes ? std::min(prompt_class, kNoPromptClass) : kNoPromptClass);
}

DeploymentState* Router::state(const std::string& deployment_id) const {
  auto it = states_.find(deployment_id);
  return it == states_.end() ? nullptr : it->second.get();
}

DeploymentState* Router::state(const config::Deployment& deployment) const {
  // State belongs to a deployment id: one of another config is found by it.
  auto it = by_deployment_.find(&deployment);
  return it != by_deployment_.end() ? it->second : state(deployment.id);
}

const config::Deployment* Router::choose(const config::Model& group, bool stream,
                                         std::span<const config::Deployment* const> exclude,
                                         TimePoint now, RandomBits& random,
                                         std::size_t prompt_class) const {
  return choose_among(group, stream, exclude, now, random, /*allow_cooling=*/true, prompt_class)
      .deployment;
}

namespace {

// The deployments of a group a request may go to now, and, when cooldowns
// keep some out, the one closest to coming back.
struct Usable {
  Deployments candidates;
  const config::Deployment* soonest_back = nullptr;
};

Usable usable_deployments(const Router& router, const config::Model& group,
                          std::span<const config::Deployment* const> exclude, TimePoint now) {
  Usable usable;
  usable.candidates.reserve(group.deployments.size());
  TimePoint soonest_until = TimePoint::max();
  for (const auto& deployment : group.deployments) {
    if (contains(exclude, &deployment)) continue;
    DeploymentState* state = router.state(deployment);
    if (state == nullptr) continue;
    if (const unsigned cap = state->max_parallel(deployment);
        cap != 0 && state->in_flight() >= static_cast<int>(std::min<unsigned>(cap, INT32_MAX))) {
      continue;
    }
    if (!state->rpm_available(deployment.rpm, now)) continue;
    // A cooldown that ran out while another request's probe is still out is
    // not over yet either.
    if (state->cooling_down(now) || (state->awaiting_probe(now) && !state->probe_available(now))) {
      const TimePoint until = state->cooldown_until().value_or(now);
      if (usable.soonest_back == nullptr || until < soonest_until) {
        usable.soonest_back = &deployment;
        soonest_until = until;
      }
      continue;
    }
    usable.candidates.push_back(&deployment);
  }
  return usable;
}

// strategy: latency. The lowest P50 wins, and every deployment within
// `latency_buffer` of it ties with it.
const config::Deployment* pick_fastest(const Router& router, const Deployments& candidates,
                                       bool stream, TimePoint now, double latency_buffer,
                                       RandomBits& random, std::size_t prompt_class) {
  Deployments unsampled;
  boost::container::small_vector<std::pair<const config::Deployment*, Micros>, 8> measured;
  for (const auto* deployment : candidates) {
    DeploymentState* state = router.state(*deployment);
    // A non-streaming client waits for the whole body, so that is the
    // latency it feels; first-byte times stand in until there are any.
    if (!stream) {
      const auto total = state->total.summary(now, kFreshFor);
      if (total.samples > 0) {
        measured.emplace_back(deployment, total.p50);
        continue;
      }
    }
    // Nothing yet of the request's size: like an unsampled deployment, it
    // goes first, or one that looked slow on other sizes would never get
    // the chance to show it is fast on this one.
    if (prompt_class != kNoPromptClass &&
        state->ttft_by_class[prompt_class].fresh_samples(now, kFreshFor) == 0) {
      unsampled.push_back(deployment);
      continue;
    }
    const auto ttft = prompt_class == kNoPromptClass
                          ? state->ttft.summary(now, kFreshFor)
                          : ttft_summary(*state, prompt_class, now, kFreshFor, kMinClassSamples);
    if (ttft.samples > 0) {
      measured.emplace_back(deployment, ttft.p50);
    } else {
      unsampled.push_back(deployment);
    }
  }
  // Without a fresh measurement a deployment could never win back
  // traffic, so it goes first and earns one.
  if (!unsampled.empty()) return pick_uniform(unsampled, random);
  auto best = std::min_element(measured.begin(), measured.end(), [](auto& a, auto& b) {
                return a.second < b.second;
              })->second;
  const double limit = static_cast<double>(best.count()) * (1.0 + std::max(0.0, latency_buffer));
  Deployments close_enough;
  for (const auto& [deployment, p50] : measured) {
    if (static_cast<double>(p50.count()) <= limit) close_enough.push_back(deployment);
  }
  return pick_uniform(close_enough, random);
}

// strategy: round_robin. The group's next usable deployment in turn; `turn`
// is shared by all threads.
const config::Deployment* pick_in_turn(const config::Model& group, const Deployments& candidates,
                                       std::atomic<std::uint64_t>& turn) {
  const std::size_t count = group.deployments.size();
  const std::size_t start = turn.fetch_add(1, std::memory_order_relaxed) % count;
  for (std::size_t step = 0; step < count; ++step) {
    const auto* deployment = &group.deployments[(start + step) % count];
    if (contains(candidates, deployment)) return deployment;
  }
  return candidates.front();
}

// strategy: weighted. A draw in proportion to the weights; all-zero weights
// draw uniformly.
const config::Deployment* pick_by_weight(const Deployments& candidates, RandomBits& random) {
  std::uint64_t total_weight = 0;
  for (const auto* deployment : candidates) total_weight += deployment->weight;
  if (total_weight == 0) return pick_uniform(candidates, random);
  std::uniform_int_distribution<std::uint64_t> ticket(0, total_weight - 1);
  std::uint64_t drawn = ticket(random);
  for (const auto* deployment : candidates) {
    if (drawn < deployment->weight) return deployment;
    drawn -= deployment->weight;
  }
  return candidates.back();
}

// strategy: least_busy. The fewest requests in flight, ties drawn uniformly.
const config::Deployment* pick_least_busy(const Router& router, const Deployments& candidates,
                                          RandomBits& random) {
  int fewest = std::numeric_limits<int>::max();
  Deployments idlest;
  for (const auto* deployment : candidates) {
    const int busy = router.state(*deployment)->in_flight();
    if (busy < fewest) {
      fewest = busy;
      idlest.clear();
    }
    if (busy == fewest) idlest.push_back(deployment);
  }
  return pick_uniform(idlest, random);
}

}  // namespace

Router::Choice Router::choose_among(const config::Model& group, bool stream,
                                    std::span<const config::Deployment* const> exclude,
                                    TimePoint now, RandomBits& random, bool allow_cooling,
                                    std::size_t prompt_class) const {
  const auto usable = usable_deployments(*this, group, exclude, now);
  const auto& candidates = usable.candidates;
  if (candidates.empty()) {
    // Everything left is cooling down: try the one closest to coming back
    // rather than failing the group without a single attempt.
    if (allow_cooling && usable.soonest_back != nullptr) return {usable.soonest_back, true};
    return {};
  }
  // Nothing to weigh: every strategy would pick it.
  if (candidates.size() == 1) return {candidates.front()};

  switch (group.strategy) {
    case config::Strategy::latency:
      return {pick_fastest(*this, candidates, stream, now, config_->router.latency_buffer, random,
                           prompt_class)};
    case config::Strategy::round_robin: {
      auto turn = round_robin_.find(group.name);
      if (turn == round_robin_.end()) return {candidates.front()};
      return {pick_in_turn(group, candidates, *turn->second)};
    }
    case config::Strategy::weighted:
      return {pick_by_weight(candidates, random)};
    case config::Strategy::least_busy:
      return {pick_least_busy(*this, candidates, random)};
    case config::Strategy::priority:
      return {candidates.front()};
  }
  return {candidates.front()};
}

// ---------------------------------------------------------------------------
// Plan

Plan::Plan(const Router& router, const config::Model& model, bool stream, std::uint64_t seed,
           std::size_t prompt_class)
    : router_(&router),
      requested_(&model),
      stream_(stream),
      prompt_class_(static_cast<std::uint8_t>(std::min(prompt_class, kNoPromptClass))),
      diagnosis_(router.config().router.diagnosis),
      random_(seed) {
  groups_.push_back(&model);
  resolve_groups(model.fallbacks);
}

Plan::~Plan() {
  for (const auto& held : held_) {
    held.state->release();
    if (held.probe) held.state->release_probe();
  }
}

void Plan::forget_slot(const DeploymentState* state) {
  for (auto it = held_.begin(); it != held_.end(); ++it) {
    if (it->state == state) {
      held_.erase(it);
      return;
    }
  }
}

void Plan::forget_probe(const DeploymentState* state) {
  for (auto& held : held_) {
    if (held.state == state) held.probe = false;
  }
}

void Plan::resolve_groups(const std::vector<std::string>& names) {
  for (const auto& name : names) {
    const config::Model* group = router_->config().find_model(name);
    if (group == nullptr) continue;
    if (std::find(groups_.begin(), groups_.end(), group) != groups_.end()) continue;
    groups_.push_back(group);
  }
}

std::optional<Plan::Taken> Plan::take_in_group(const config::Model& group, DeploymentList exclude,
                                               bool allow_cooling, TimePoint now) {
  for (const config::Deployment* refused : at_shared_limit_) {
    if (!contains(exclude, refused)) exclude.push_back(refused);
  }
  // Every pass excludes one more deployment, so this ends.
  for (;;) {
    const auto choice = router_->choose_among(group, stream_, {exclude.data(), exclude.size()}, now,
                                              random_, allow_cooling, prompt_class_);
    const config::Deployment* deployment = choice.deployment;
    if (deployment == nullptr) return std::nullopt;
    DeploymentState* state = router_->state(*deployment);

    if (!state->try_acquire(state->max_parallel(*deployment))) {
      exclude.push_back(deployment);
      continue;
    }
    bool probe = false;
    if (!choice.despite_cooldown && state->awaiting_probe(now)) {
      if (!state->claim_probe(now)) {
        state->release();
        exclude.push_back(deployment);
        continue;
      }
      probe = true;
    }
    if (!state->try_take_rpm(deployment->rpm, now)) {
      if (probe) state->release_probe();
      state->release();
      exclude.push_back(deployment);
      continue;
    }
    return Taken{deployment, state, probe};
  }
}

unsigned& Plan::attempts_on(const config::Deployment* deployment) {
  for (auto& [tried, count] : attempts_per_deployment_) {
    if (tried == deployment) return count;
  }
  return attempts_per_deployment_.emplace_back(deployment, 0u).second;
}

Millis Plan::backoff_wait(unsigned previous_attempts_on_deployment) {
  if (previous_attempts_on_deployment == 0) return Millis{0};
  const auto& backoff = router_->config().router.backoff;
  const std::int64_t ceiling = std::max<std::int64_t>(backoff.max.count(), 0);
  std::int64_t cap = std::max<std::int64_t>(backoff.base.count(), 0);
  for (unsigned doubling = 1; doubling < previous_attempts_on_deployment && cap < ceiling;
       ++doubling) {
    cap *= 2;
  }
  cap = std::min(cap, ceiling);
  // Full jitter: retries from many requests that failed together spread out
  // instead of arriving together again.
  std::uniform_int_distribution<std::int64_t> wait(0, cap);
  return Millis{wait(random_)};
}

std::optional<Millis> Plan::hedge_delay(const config::Model& group, DeploymentState& state,
                                        TimePoint now) const {
  if (hedged_ || group.deployments.size() < 2) return std::nullopt;
  const auto& hedge = router_->config().router.hedge;
  switch (hedge.mode) {
    case config::Hedge::Mode::off:
      return std::nullopt;
    case config::Hedge::Mode::fixed:
      return hedge.after;
    case config::Hedge::Mode::p95: {
      const auto window =
          prompt_class_ == kNoPromptClass
              ? state.ttft.summary(now, kFreshFor)
              : ttft_summary(state, prompt_class_, now, kFreshFor, kMinSamplesForP95);
      if (window.samples < kMinSamplesForP95) return std::nullopt;
      // Rounded up so a hedge never starts before the P95 has passed.
      return std::chrono::ceil<Millis>(window.p95);
    }
  }
  return std::nullopt;
}

std::optional<Attempt> Plan::next(TimePoint now) {
  const auto& policy = router_->config().router;
  if (ended_ || attempts_made_ >= policy.retries + 1 || groups_.empty()) return std::nullopt;

  // From the current group to the last, then every group once more from the
  // first with nothing tried: at most twice the number of groups.
  for (std::size_t visits = 0; visits < 2 * groups_.size(); ++visits) {
    const config::Model& group = *groups_[group_index_];
    // A group that has not been tried in this round may use a cooling
    // deployment when nothing else is left; after one attempt, moving on to
    // the next group is the better bet.
    const bool allow_cooling = tried_in_group_.empty();

    std::optional<Taken> taken;
    const bool avoid_timed_out = last_failed_timed_out_ && last_failed_ != nullptr &&
                                 !contains(tried_in_group_, last_failed_);
    if (avoid_timed_out) {
      taken =
          take_in_group(group, with_one_more(tried_in_group_, last_failed_), allow_cooling, now);
    }
    if (!taken) taken = take_in_group(group, tried_in_group_, allow_cooling, now);

    if (taken) {
      unsigned& on_deployment = attempts_on(taken->deployment);
      Attempt attempt;
      attempt.model = &group;
      attempt.deployment = taken->deployment;
      attempt.state = taken->state;
      attempt.probe = taken->probe;
      attempt.fallback = group_index_ > 0 || switched_to_context_fallbacks_;
      attempt.wait = backoff_wait(on_deployment);
      // Retry-After speaks for the deployment that sent it; another one can
      // be asked at once.
      if (pending_retry_after_ && last_failed_ == taken->deployment) {
        attempt.wait = std::max(attempt.wait, std::min(*pending_retry_after_, policy.backoff.max));
      }
      attempt.hedge_after = hedge_delay(group, *taken->state, now);
      attempt.prompt_class = prompt_class_;
      if (diagnosis_) {
        attempt.in_flight_bucket =
            static_cast<std::uint8_t>(in_flight_bucket(taken->state->in_flight()));
      }

      pending_retry_after_.reset();
      ++on_deployment;
      ++attempts_made_;
      tried_in_group_.push_back(taken->deployment);
      held_.push_back({taken->state, taken->probe});
      return attempt;
    }

    tried_in_group_.clear();
    group_index_ = (group_index_ + 1) % groups_.size();
  }

  // Nothing in any group can take a request right now.
  ended_ = true;
  return std::nullopt;
}

std::optional<Attempt> Plan::next_hedge(TimePoint now) {
  if (ended_ || hedged_ || groups_.empty()) return std::nullopt;
  const config::Model& group = *groups_[group_index_];
  // Hedging onto a deployment that is cooling down only doubles the load on
  // something already known to struggle.
  auto taken = take_in_group(group, tried_in_group_, /*allow_cooling=*/false, now);
  if (!taken) return std::nullopt;

  hedged_ = true;
  ++attempts_on(taken->deployment);
  tried_in_group_.push_back(taken->deployment);
  held_.push_back({taken->state, taken->probe});

  Attempt attempt;
  attempt.model = &group;
  attempt.deployment = taken->deployment;
  attempt.state = taken->state;
  attempt.probe = taken->probe;
  attempt.fallback = group_index_ > 0 || switched_to_context_fallbacks_;
  attempt.hedge = true;
  attempt.prompt_class = prompt_class_;
  if (diagnosis_) {
    attempt.in_flight_bucket =
        static_cast<std::uint8_t>(in_flight_bucket(taken->state->in_flight()));
  }
  return attempt;
}

void Plan::report(const Attempt& attempt, const AttemptResult& result, TimePoint now) {
  DeploymentState& state = *attempt.state;
  switch (result.kind) {
    case ResultKind::success:
      // Settles a probe: the success ends the cooldown it was let through.
      state.record_success(now);
      forget_probe(&state);
      if (result.ttft) {
        add_ttft(state, *result.ttft, now);
        if (diagnosis_) state.ttft_by_in_flight[attempt.in_flight_bucket].add(*result.ttft, now);
        if (attempt.deployment->max_parallel_auto) {
          state.concurrency.on_sample(*result.ttft, state.in_flight(), now,
                                      router_->config().router.adaptive.concurrency);
        }
      }
      ended_ = true;
      return;

    case ResultKind::retriable:
      // A failed probe restarts the cooldown, which settles it.
      forget_slot(&state);
      state.release();
      state.record_failure(router_->config().router.cooldown, now);
      if (result.censored_ttft) add_ttft(state, *result.censored_ttft, now);
      last_failed_ = attempt.deployment;
      last_failed_timed_out_ = result.timed_out;
      pending_retry_after_ = result.retry_after;
      return;

    case ResultKind::client_error:
      forget_slot(&state);
      state.release();
      // The upstream answered, but a rejected request says nothing about
      // whether it is healthy; let another request probe it.
      if (attempt.probe) state.release_probe();
      ended_ = true;
      return;

    case ResultKind::context_window_exceeded:
      forget_slot(&state);
      state.release();
      if (attempt.probe) state.release_probe();
      if (!switched_to_context_fallbacks_ && !requested_->context_window_fallbacks.empty()) {
        switched_to_context_fallbacks_ = true;
        groups_.clear();
        resolve_groups(requested_->context_window_fallbacks);
        group_index_ = 0;
        tried_in_group_.clear();
        last_failed_ = nullptr;
        last_failed_timed_out_ = false;
        pending_retry_after_.reset();
        if (groups_.empty()) ended_ = true;
      } else {
        ended_ = true;
      }
      return;
  }
}

void Plan::finish(const Attempt& attempt, bool ok, Micros total, TimePoint now) {
  DeploymentState& state = *attempt.state;
  forget_slot(&state);
  state.release();
  if (ok) {
    // A broken-off response's duration is not a latency anyone would get.
    if (!stream_) state.total.add(total, now);
  } else {
    state.record_midstream_failure(router_->config().router.cooldown, now);
  }
}

void Plan::abandon(const Attempt& attempt) {
  forget_slot(attempt.state);
  attempt.state->release();
  if (attempt.probe) attempt.state->release_probe();
}

void Plan::at_shared_limit(const Attempt& attempt) {
  abandon(attempt);
  --attempts_made_;
  --attempts_on(attempt.deployment);
  at_shared_limit_.push_back(attempt.deployment);
}

void Plan::lost_race(const Attempt& attempt, Micros waited, TimePoint now) {
  if (!attempt.hedge) add_ttft(*attempt.state, waited, now);
  abandon(attempt);
}

void Plan::left_by_client(const Attempt& attempt) {
  forget_slot(attempt.state);
  attempt.state->release();
}

void Plan::add_ttft(DeploymentState& state, Micros ttft, TimePoint now) const {
  state.ttft.add(ttft, now);
  if (prompt_class_ != kNoPromptClass) state.ttft_by_class[prompt_class_].add(ttft, now);
}

void Plan::note_new_connection(const Attempt& attempt, Micros connect, Micros tls,
                               TimePoint now) const {
  attempt.state->connect_times.add(connect, now);
  if (tls.count() > 0) attempt.state->tls_times.add(tls, now);
}

bool Plan::can_retry() const {
  return !ended_ && attempts_made_ < router_->config().router.retries + 1;
}

}  // namespace sluice::router
