#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "router/router_fixtures.hpp"
#include "sluice/router/router.hpp"

namespace sluice::router {
namespace {

using namespace std::chrono_literals;
using std::chrono::milliseconds;

config::Deployment deployment(std::string id) {
  config::Deployment d;
  d.id = std::move(id);
  d.base_url = config::Url{"http", "127.0.0.1", 9000, "/v1"};
  d.upstream_model = "upstream-model";
  return d;
}

config::Model model(std::string name, config::Strategy strategy,
                    std::vector<config::Deployment> deployments) {
  config::Model m;
  m.name = std::move(name);
  m.strategy = strategy;
  m.deployments = std::move(deployments);
  return m;
}

// A router over one model named "m" with the given deployments.
struct Fixture {
  explicit Fixture(config::Strategy strategy, std::vector<config::Deployment> deployments,
                   config::Router policy = {})
      : config(make_config({model("m", strategy, std::move(deployments))}, policy)),
        router(config) {}

  const config::Model& group() const { return config->models[0]; }
  const config::Deployment* find(const std::string& id) const {
    for (const auto& d : group().deployments) {
      if (d.id == id) return &d;
    }
    return nullptr;
  }
  DeploymentState& state(const std::string& id) const { return *router.state(id); }
  void samples(const std::string& id, milliseconds latency, TimePoint at, int count = 5) {
    for (int i = 0; i < count; ++i) state(id).ttft.add(latency, at);
  }
  std::string choose(TimePoint now, RandomBits& random, bool stream = true,
                     const std::vector<const config::Deployment*>& exclude = {}) const {
    const auto* chosen = router.choose(group(), stream, exclude, now, random);
    return chosen == nullptr ? "" : chosen->id;
  }

  std::shared_ptr<config::Config> config;
  Router router;
};

std::vector<config::Deployment> deployments(std::initializer_list<const char*> ids) {
  std::vector<config::Deployment> result;
  for (const char* id : ids) result.push_back(deployment(id));
  return result;
}

config::Cooldown one_failure_cools_for_30s() {
  config::Cooldown cooldown;
  cooldown.fails = 1;
  cooldown.within = 60s;
  cooldown.duration = 30s;
  return cooldown;
}

// ---------------------------------------------------------------------------
// latency

TEST(RouterLatency, PlansPreferTheLowerP50) {
  Fixture f(config::Strategy::latency, deployments({"fast", "slow"}));
  f.samples("fast", 20ms, kBase, 10);
  f.samples("slow", 200ms, kBase, 10);

  int fast = 0;
  for (std::uint64_t seed = 0; seed < 1000; ++seed) {
    Plan plan = f.router.plan(f.group(), true, seed);
    auto attempt = plan.next(kBase + 1s);
    ASSERT_TRUE(attempt.has_value());
    if (attempt->deployment->id == "fast") ++fast;
    plan.abandon(*attempt);
  }
  EXPECT_GE(fast, 900);
  EXPECT_EQ(f.state("fast").in_flight(), 0);
}

TEST(RouterLatency, UnsampledDeploymentsComeFirst) {
  Fixture f(config::Strategy::latency, deployments({"measured", "new"}));
  f.samples("measured", 1ms, kBase);
  for (std::uint64_t seed = 0; seed < 100; ++seed) {
    RandomBits random(seed);
    ASSERT_EQ(f.choose(kBase, random), "new");
  }
}

TEST(RouterLatency, UnsampledAreChosenAtRandom) {
  Fixture f(config::Strategy::latency, deployments({"a", "b", "c"}));
  std::map<std::string, int> picks;
  for (std::uint64_t seed = 0; seed < 300; ++seed) {
    RandomBits random(seed);
    ++picks[f.choose(kBase, random)];
  }
  EXPECT_GT(picks["a"], 50);
  EXPECT_GT(picks["b"], 50);
  EXPECT_GT(picks["c"], 50);
}

TEST(RouterLatency, BufferSpreadsLoadBetweenNearEqualDeployments) {
  config::Router policy;
  policy.latency_buffer = 0.10;
  Fixture f(config::Strategy::latency, deployments({"a", "b", "far"}), policy);
  f.samples("a", 100ms, kBase);
  f.samples("b", 105ms, kBase);
  f.samples("far", 150ms, kBase);

  std::map<std::string, int> picks;
  for (std::uint64_t seed = 0; seed < 400; ++seed) {
    RandomBits random(seed);
    ++picks[f.choose(kBase, random)];
  }
  EXPECT_GT(picks["a"], 120);
  EXPECT_GT(picks["b"], 120);
  EXPECT_EQ(picks["far"], 0);
}

TEST(RouterLatency, ZeroBufferAlwaysTakesTheBest) {
  config::Router policy;
  policy.latency_buffer = 0.0;
  Fixture f(config::Strategy::latency, deployments({"a", "b"}), policy);
  f.samples("a", 100ms, kBase);
  f.samples("b", 105ms, kBase);
  for (std::uint64_t seed = 0; seed < 200; ++seed) {
    RandomBits random(seed);
    ASSERT_EQ(f.choose(kBase, random), "a");
  }
}

TEST(RouterLatency, StaleSamplesMakeADeploymentUnsampledAgain) {
  Fixture f(config::Strategy::latency, deployments({"slow", "fast"}));
  f.samples("slow", 500ms, kBase);
  f.samples("fast", 20ms, kBase + 30s);

  RandomBits random(1);
  EXPECT_EQ(f.choose(kBase + 40s, random), "fast");
  // 61 s later nothing is known about "slow" any more, so it gets a chance.
  for (std::uint64_t seed = 0; seed < 50; ++seed) {
    RandomBits r(seed);
    ASSERT_EQ(f.choose(kBase + 61s, r), "slow");
  }
}

TEST(RouterLatency, NonStreamingRequestsUseTheTotalWindow) {
  Fixture f(config::Strategy::latency, deployments({"quick-start", "quick-finish"}));
  f.samples("quick-start", 20ms, kBase);
  f.samples("quick-finish", 100ms, kBase);
  for (int i = 0; i < 5; ++i) {
    f.state("quick-start").total.add(5000ms, kBase);
    f.state("quick-finish").total.add(1000ms, kBase);
  }
  RandomBits random(3);
  EXPECT_EQ(f.choose(kBase, random, /*stream=*/true), "quick-start");
  EXPECT_EQ(f.choose(kBase, random, /*stream=*/false), "quick-finish");
}

TEST(RouterLatency, NonStreamingFallsBackToTtftWithoutTotals) {
  Fixture f(config::Strategy::latency, deployments({"a", "b"}));
  f.samples("a", 300ms, kBase);
  f.samples("b", 30ms, kBase);
  f.state("a").total.add(40ms, kBase);  // "b" has no total samples yet
  for (std::uint64_t seed = 0; seed < 50; ++seed) {
    RandomBits random(seed);
    ASSERT_EQ(f.choose(kBase, random, /*stream=*/false), "b");
  }
}

// ---------------------------------------------------------------------------
// other strategies

TEST(RouterStrategy, RoundRobinCycles) {
  Fixture f(config::Strategy::round_robin, deployments({"a", "b", "c"}));
  RandomBits random(0);
  std::vector<std::string> order;
  for (int i = 0; i < 6; ++i) order.push_back(f.choose(kBase, random));
  EXPECT_EQ(order, (std::vector<std::string>{"a", "b", "c", "a", "b", "c"}));
}

TEST(RouterStrategy, RoundRobinSkipsDeploymentsThatCannotTakeARequest) {
  auto list = deployments({"a", "b", "c"});
  list[1].max_parallel = 1;
  Fixture f(config::Strategy::round_robin, list);
  ASSERT_TRUE(f.state("b").try_acquire(1));
  RandomBits random(0);
  std::vector<std::string> order;
  for (int i = 0; i < 4; ++i) order.push_back(f.choose(kBase, random));
  EXPECT_EQ(order, (std::vector<std::string>{"a", "c", "c", "a"}));
}

TEST(RouterStrategy, WeightedFollowsTheWeights) {
  auto list = deployments({"heavy", "light"});
  list[0].weight = 3;
  list[1].weight = 1;
  Fixture f(config::Strategy::weighted, list);
  RandomBits random(42);
  int heavy = 0;
  constexpr int kPicks = 8000;
  for (int i = 0; i < kPicks; ++i) {
    if (f.choose(kBase, random) == "heavy") ++heavy;
  }
  const double share = static_cast<double>(heavy) / kPicks;
  EXPECT_GT(share, 0.72);
  EXPECT_LT(share, 0.78);
}

TEST(RouterStrategy, WeightedNeverPicksZeroWeightWhenOthersHaveWeight) {
  auto list = deployments({"zero", "one"});
  list[0].weight = 0;
  Fixture f(config::Strategy::weighted, list);
  RandomBits random(5);
  for (int i = 0; i < 200; ++i) ASSERT_EQ(f.choose(kBase, random), "one");
}

TEST(RouterStrategy, LeastBusyTakesTheFewestInFlight) {
  Fixture f(config::Strategy::least_busy, deployments({"a", "b", "c"}));
  f.state("a").try_acquire(0);
  f.state("a").try_acquire(0);
  f.state("c").try_acquire(0);
  RandomBits random(0);
  for (int i = 0; i < 20; ++i) ASSERT_EQ(f.choose(kBase, random), "b");

  f.state("b").try_acquire(0);
  f.state("b").try_acquire(0);
  for (int i = 0; i < 20; ++i) ASSERT_EQ(f.choose(kBase, random), "c");
}

TEST(RouterStrategy, LeastBusyBreaksTiesAtRandom) {
  Fixture f(config::Strategy::least_busy, deployments({"a", "b"}));
  std::map<std::string, int> picks;
  for (std::uint64_t seed = 0; seed < 200; ++seed) {
    RandomBits random(seed);
    ++picks[f.choose(kBase, random)];
  }
  EXPECT_GT(picks["a"], 50);
  EXPECT_GT(picks["b"], 50);
}

TEST(RouterStrategy, PriorityFollowsListOrder) {
  Fixture f(config::Strategy::priority, deployments({"first", "second", "third"}));
  RandomBits random(0);
  EXPECT_EQ(f.choose(kBase, random), "first");
  EXPECT_EQ(f.choose(kBase, random, true, {f.find("first")}), "second");
  EXPECT_EQ(f.choose(kBase, random, true, {f.find("first"), f.find("second")}), "third");
  EXPECT_EQ(f.choose(kBase, random, true, {f.find("first"), f.find("second"), f.find("third")}),
            "");
}

// ---------------------------------------------------------------------------
// availability

TEST(RouterAvailability, FullDeploymentIsSkipped) {
  auto list = deployments({"a", "b"});
  list[0].max_parallel = 2;
  Fixture f(config::Strategy::priority, list);
  RandomBits random(0);
  f.state("a").try_acquire(2);
  EXPECT_EQ(f.choose(kBase, random), "a");
  f.state("a").try_acquire(2);
  EXPECT_EQ(f.choose(kBase, random), "b");
  f.state("a").release();
  EXPECT_EQ(f.choose(kBase, random), "a");
}

TEST(RouterAvailability, SpentRpmBudgetIsSkippedUntilTheNextMinute) {
  auto list = deployments({"a", "b"});
  list[0].rpm = 1;
  Fixture f(config::Strategy::priority, list);
  // Rpm minutes count from when the state was built, so the test clock
  // starts there rather than at kBase.
  const TimePoint start = Clock::now();
  RandomBits random(0);
  ASSERT_TRUE(f.state("a").try_take_rpm(1, start));
  EXPECT_EQ(f.choose(start + 1s, random), "b");
  EXPECT_EQ(f.choose(start + 61s, random), "a");
}

TEST(RouterAvailability, CoolingDeploymentIsSkipped) {
  config::Router policy;
  policy.cooldown = one_failure_cools_for_30s();
  Fixture f(config::Strategy::priority, deployments({"a", "b"}), policy);
  f.state("a").record_failure(policy.cooldown, kBase);
  RandomBits random(0);
  EXPECT_EQ(f.choose(kBase + 10s, random), "b");
}

TEST(RouterAvailability, ExpiredCooldownIsACandidateOnlyWhileItsProbeIsFree) {
  config::Router policy;
  policy.cooldown = one_failure_cools_for_30s();
  Fixture f(config::Strategy::priority, deployments({"a", "b"}), policy);
  f.state("a").record_failure(policy.cooldown, kBase);
  RandomBits random(0);
  const TimePoint after = kBase + 31s;
  EXPECT_EQ(f.choose(after, random), "a");
  EXPECT_TRUE(f.state("a").probe_available(after));  // choose does not claim
  ASSERT_TRUE(f.state("a").claim_probe(after));
  EXPECT_EQ(f.choose(after, random), "b");
}

TEST(RouterAvailability, AllCoolingReturnsTheOneBackSoonest) {
  config::Router policy;
  policy.cooldown = one_failure_cools_for_30s();
  Fixture f(config::Strategy::priority, deployments({"a", "b", "c"}), policy);
  f.state("a").record_failure(policy.cooldown, kBase);
  f.state("b").record_failure(policy.cooldown, kBase + 5s);
  f.state("c").record_failure(policy.cooldown, kBase + 1s);
  RandomBits random(0);
  EXPECT_EQ(f.choose(kBase + 10s, random), "a");
  EXPECT_EQ(f.choose(kBase + 10s, random, true, {f.find("a")}), "c");
}

TEST(RouterAvailability, DeploymentsWithoutStateAreIgnored) {
  Fixture f(config::Strategy::priority, deployments({"a"}));
  config::Model outsider = model("x", config::Strategy::priority, deployments({"unknown", "a"}));
  RandomBits random(0);
  const auto* chosen = f.router.choose(outsider, true, {}, kBase, random);
  ASSERT_NE(chosen, nullptr);
  EXPECT_EQ(chosen->id, "a");
}

// A deployment's state is its id's, whichever way it is looked up: by the
// deployment of the router's own config, by id, or by an equal deployment
// of another config. Two models that list the same id share one state.
TEST(RouterAvailability, StateIsTheSameByDeploymentAndById) {
  auto config = make_config({model("m", config::Strategy::priority, deployments({"a", "b"})),
                             model("n", config::Strategy::priority, deployments({"b"}))});
  Router router(config);
  const auto& m = config->models[0].deployments;
  const auto& n = config->models[1].deployments;
  ASSERT_NE(router.state(m[0]), nullptr);
  EXPECT_EQ(router.state(m[0]), router.state("a"));
  EXPECT_EQ(router.state(m[1]), router.state("b"));
  EXPECT_EQ(router.state(n[0]), router.state("b"));
  EXPECT_NE(router.state(m[0]), router.state(m[1]));
  const config::Deployment copy_of_a = m[0];
  EXPECT_EQ(router.state(copy_of_a), router.state("a"));
  EXPECT_EQ(router.state(deployment("unknown")), nullptr);
}

// ---------------------------------------------------------------------------
// reload

TEST(RouterReload, UnchangedDeploymentsKeepTheirStateChangedOnesStartFresh) {
  auto before = make_config({model("m", config::Strategy::latency,
                                   deployments({"same", "moved", "renamed-upstream", "gone"}))});
  Router old_router(before);
  for (const char* id : {"same", "moved", "renamed-upstream"}) {
    old_router.state(id)->ttft.add(50ms, kBase);
  }

  auto list = deployments({"same", "moved", "renamed-upstream", "added"});
  list[1].base_url.port = 9001;
  list[2].upstream_model = "other-model";
  list[0].api_key = "rotated";  // credentials do not make it another upstream
  auto after = make_config({model("m", config::Strategy::latency, list)});
  Router new_router(after, &old_router);

  EXPECT_EQ(new_router.state("same"), old_router.state("same"));
  EXPECT_EQ(new_router.state("same")->ttft.summary(kBase, 60s).samples, 1u);

  EXPECT_NE(new_router.state("moved"), old_router.state("moved"));
  EXPECT_EQ(new_router.state("moved")->ttft.summary(kBase, 60s).samples, 0u);
  EXPECT_NE(new_router.state("renamed-upstream"), old_router.state("renamed-upstream"));
  EXPECT_EQ(new_router.state("gone"), nullptr);
  ASSERT_NE(new_router.state("added"), nullptr);
}

TEST(RouterReload, PathPrefixChangeIsAnotherUpstream) {
  auto before = make_config({model("m", config::Strategy::latency, deployments({"a"}))});
  Router old_router(before);
  auto list = deployments({"a"});
  list[0].base_url.path_prefix = "/v2";
  Router new_router(make_config({model("m", config::Strategy::latency, list)}), &old_router);
  EXPECT_NE(new_router.state("a"), old_router.state("a"));
}

TEST(RouterReload, InFlightCountsCarryOver) {
  auto before = make_config({model("m", config::Strategy::latency, deployments({"a"}))});
  Router old_router(before);
  old_router.state("a")->try_acquire(0);
  Router new_router(make_config({model("m", config::Strategy::latency, deployments({"a"}))}),
                    &old_router);
  EXPECT_EQ(new_router.state("a")->in_flight(), 1);
}

// ---------------------------------------------------------------------------
// classify_status

TEST(ClassifyStatus, SuccessAndRedirects) {
  EXPECT_EQ(classify_status(200, ""), ResultKind::success);
  EXPECT_EQ(classify_status(204, ""), ResultKind::success);
  EXPECT_EQ(classify_status(302, ""), ResultKind::success);
}

TEST(ClassifyStatus, RetriableStatuses) {
  for (unsigned status : {408u, 409u, 429u, 500u, 502u, 503u, 504u, 529u}) {
    EXPECT_EQ(classify_status(status, ""), ResultKind::retriable) << status;
  }
}

TEST(ClassifyStatus, ClientErrors) {
  for (unsigned status : {400u, 401u, 403u, 404u, 413u, 422u}) {
    EXPECT_EQ(classify_status(status, R"({"error":{"message":"bad"}})"), ResultKind::client_error)
        << status;
  }
}

TEST(ClassifyStatus, ContextWindowErrors) {
  EXPECT_EQ(classify_status(400, R"({"error":{"code":"context_length_exceeded"}})"),
            ResultKind::context_window_exceeded);
  EXPECT_EQ(classify_status(400, "This model's Maximum Context Length is 8192 tokens"),
            ResultKind::context_window_exceeded);
  EXPECT_EQ(classify_status(413, "input exceeds the CONTEXT WINDOW"),
            ResultKind::context_window_exceeded);
  EXPECT_EQ(classify_status(422, "context window"), ResultKind::context_window_exceeded);
  EXPECT_EQ(classify_status(400, R"({"type":"error","error":{"type":"invalid_request_error",)"
                                 R"("message":"prompt is too long: 210000 tokens > 200000"}})"),
            ResultKind::context_window_exceeded)
      << "Anthropic's words";
  // Only the statuses an upstream uses for it.
  EXPECT_EQ(classify_status(404, "context_length_exceeded"), ResultKind::client_error);
  EXPECT_EQ(classify_status(500, "context_length_exceeded"), ResultKind::retriable);
}

// Anthropic's 529 (overloaded_error) is tried elsewhere, as a 503 is.
TEST(ClassifyStatus, AnthropicOverloadedIsRetriable) {
  EXPECT_EQ(classify_status(529, R"({"error":{"type":"server_error","code":"overloaded"}})"),
            ResultKind::retriable);
  EXPECT_EQ(classify_status(503, ""), ResultKind::retriable);
}

}  // namespace
}  // namespace sluice::router
