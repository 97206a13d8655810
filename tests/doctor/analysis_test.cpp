#include "sluice/doctor/analysis.hpp"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "sluice/config/config.hpp"
#include "sluice/doctor/plan.hpp"

namespace sluice::doctor {
namespace {

TEST(DoctorArithmetic, QuantilesInterpolateBetweenRanks) {
  EXPECT_DOUBLE_EQ(quantile({}, 0.5), 0);
  EXPECT_DOUBLE_EQ(quantile({7}, 0.95), 7);
  EXPECT_DOUBLE_EQ(quantile({4, 1, 3, 2}, 0.5), 2.5);
  EXPECT_DOUBLE_EQ(quantile({1, 2, 3, 4, 5}, 0.25), 2);
  EXPECT_DOUBLE_EQ(quantile({1, 2, 3, 4, 5}, 1.0), 5);
  const auto s = spread({10, 20, 30, 40, 50});
  EXPECT_EQ(s.samples, 5u);
  EXPECT_DOUBLE_EQ(s.median, 30);
  EXPECT_DOUBLE_EQ(s.iqr, 20);
  EXPECT_DOUBLE_EQ(s.p95, 48);
  EXPECT_DOUBLE_EQ(s.mean, 30);
}

TEST(DoctorArithmetic, FitRecoversSlopeInterceptAndRSquared) {
  std::vector<PromptSample> exact;
  for (double tokens : {16.0, 256.0, 1024.0, 4096.0}) exact.push_back({tokens, 20 + 0.05 * tokens});
  const auto fit = fit_prefill(exact);
  ASSERT_TRUE(fit.valid);
  EXPECT_NEAR(fit.ms_per_1k_tokens(), 50, 1e-9);
  EXPECT_NEAR(fit.intercept_ms, 20, 1e-9);
  EXPECT_NEAR(fit.r_squared, 1, 1e-12);

  // Noise that does not follow the size lowers R².
  const auto noisy = fit_prefill({{16, 30}, {256, 10}, {1024, 35}, {4096, 12}});
  ASSERT_TRUE(noisy.valid);
  EXPECT_LT(noisy.r_squared, 0.3);
  // One size only: no slope to fit.
  EXPECT_FALSE(fit_prefill({{16, 30}, {16, 31}}).valid);
}

// A burst of c requests into n slots of service time t: wave k waits k * t.
std::vector<double> burst(unsigned c, unsigned n, double t) {
  std::vector<double> ttfts;
  for (unsigned i = 0; i < c; ++i) ttfts.push_back(t * (i / n + 1));
  return ttfts;
}

TEST(DoctorArithmetic, KneeIsTheFirstLevelHalfAgainSlowerAndCapacityIsRecovered) {
  std::vector<LevelSamples> levels;
  for (unsigned c : {1u, 2u, 4u, 8u, 16u}) levels.push_back({c, burst(c, 3, 50)});
  const auto q = analyse_queueing(levels);
  ASSERT_EQ(q.levels.size(), 5u);
  ASSERT_TRUE(q.knee.has_value());
  // c=4 into 3 slots: [50, 50, 50, 100], median 50; c=8: median 100.
  EXPECT_EQ(*q.knee, 8u);
  ASSERT_TRUE(q.capacity.has_value());
  EXPECT_NEAR(*q.capacity, 3, 0.6);
  EXPECT_NEAR(q.queueing_ms, q.levels.back().ttft.median - 50, 1e-9);

  std::vector<LevelSamples> flat;
  for (unsigned c : {1u, 2u, 4u}) flat.push_back({c, std::vector<double>(c, 40)});
  const auto none = analyse_queueing(flat);
  EXPECT_FALSE(none.knee.has_value());
  EXPECT_FALSE(none.capacity.has_value());
  EXPECT_DOUBLE_EQ(none.queueing_ms, 0);
}

TEST(DoctorArithmetic, NetworkSetupIsFreshMinusPooled) {
  NetworkSamples samples;
  samples.dns_ms = {1, 1, 1};
  samples.connect_ms = {2, 2, 2};
  samples.fresh_ttfb_ms = {200, 210, 190};
  samples.pooled_ttfb_ms = {48, 50, 52};
  samples.fresh_ttft_ms = {250, 260, 240};
  samples.pooled_ttft_ms = {48, 50, 52};
  const auto n = analyse_network(samples);
  EXPECT_DOUBLE_EQ(n.setup_ms, 200);
  EXPECT_NEAR(n.share_fresh, 202.0 / 250, 1e-9);
  EXPECT_NEAR(n.share_pooled, 2.0 / 50, 1e-9);
}

NetworkFindings network_of(double fresh, double pooled) {
  NetworkSamples samples;
  samples.connect_ms = {0.2};
  samples.fresh_ttft_ms = {fresh};
  samples.pooled_ttft_ms = {pooled};
  return analyse_network(samples);
}

PrefillFindings prefill_of(double ms_per_token, double intercept) {
  std::vector<PromptSample> samples;
  for (double tokens : {16.0, 256.0, 1024.0, 4096.0}) {
    samples.push_back({tokens, intercept + ms_per_token * tokens});
  }
  return analyse_prefill(samples);
}

QueueFindings queue_of(unsigned slots, double t) {
  std::vector<LevelSamples> levels;
  for (unsigned c : {1u, 2u, 4u, 8u}) levels.push_back({c, burst(c, slots, t)});
  return analyse_queueing(levels);
}

TEST(DoctorVerdict, NamesTheCauseThatDominates) {
  const auto network = judge(network_of(250, 20), prefill_of(0, 20), queue_of(100, 20), 20);
  EXPECT_EQ(network.dominant, Cause::network);
  EXPECT_NE(network.text.find("mostly network"), std::string::npos);
  EXPECT_NE(network.text.find("a new connection adds 230 ms"), std::string::npos);

  const auto prefill = judge(network_of(21, 20), prefill_of(0.1, 20), queue_of(100, 20), 20);
  EXPECT_EQ(prefill.dominant, Cause::prefill);
  EXPECT_NE(prefill.text.find("prefill costs 100 ms per 1k tokens"), std::string::npos);
  EXPECT_NE(prefill.text.find("a 4096-token prompt spends 410 ms"), std::string::npos);

  const auto queueing = judge(network_of(21, 20), prefill_of(0, 20), queue_of(1, 20), 20);
  EXPECT_EQ(queueing.dominant, Cause::queueing);
  EXPECT_NE(queueing.text.find("queueing starts at 4 concurrent requests"), std::string::npos);

  const auto healthy = judge(network_of(21, 20), prefill_of(0.0001, 20), queue_of(100, 20), 20);
  EXPECT_EQ(healthy.dominant, Cause::none);
  EXPECT_NE(healthy.text.find("no added cause"), std::string::npos);
}

TEST(DoctorVerdict, SuggestionsFollowFromTheNumbers) {
  const auto lines = [](const std::vector<Suggestion>& suggestions) {
    std::string all;
    for (const auto& s : suggestions) all += s.line + "\n";
    return all;
  };
  // A slow handshake: warm connections; a queue of 2: max_parallel 2.
  const auto slow =
      suggest(network_of(250, 20), prefill_of(0, 20), queue_of(2, 20), SuggestionInputs{1, 400});
  const auto text = lines(slow);
  EXPECT_NE(text.find("warm_connections: "), std::string::npos) << text;
  EXPECT_NE(text.find("max_parallel: 2\n"), std::string::npos) << text;
  EXPECT_NE(text.find("timeouts: {ttft: 800ms}"), std::string::npos) << text;
  EXPECT_EQ(text.find("trim_history"), std::string::npos) << text;

  // Prefill dominating: a trim budget, under the model.
  const auto long_prompts =
      suggest(network_of(21, 20), prefill_of(0.1, 20), queue_of(100, 20), SuggestionInputs{1, 0});
  ASSERT_EQ(long_prompts.size(), 1u);
  EXPECT_EQ(long_prompts[0].line, "shaping: {trim_history: {max_prompt_tokens: 1000}}");
  EXPECT_TRUE(long_prompts[0].under_model);
}

TEST(DoctorVerdict, SuggestedDurationsParseAsConfigDurations) {
  const auto suggestions =
      suggest(std::nullopt, std::nullopt, std::nullopt, SuggestionInputs{1, 12345});
  ASSERT_EQ(suggestions.size(), 1u);
  const auto& line = suggestions[0].line;
  const auto start = line.find("ttft: ") + 6;
  const auto value = line.substr(start, line.find('}') - start);
  EXPECT_EQ(value, "25s");
  EXPECT_TRUE(config::parse_duration(value).has_value());
}

TEST(DoctorPlan, DefaultFitsSixtyRequestsAndSizesAreCapped) {
  std::string why;
  const auto plan = make_plan(PlanLimits{}, why);
  ASSERT_TRUE(plan.has_value()) << why;
  EXPECT_LE(plan->requests(), 60u);
  EXPECT_GE(plan->requests(), 50u);
  EXPECT_EQ(plan->prompt_sizes, (std::vector<unsigned>{16, 256, 1024, 4096, 16384}));
  EXPECT_EQ(plan->levels, (std::vector<unsigned>{1, 2, 4, 8, 16}));
  EXPECT_GT(plan->input_tokens(), 16384u);

  const auto capped = make_plan(PlanLimits{40, 3000, 6}, why);
  ASSERT_TRUE(capped.has_value()) << why;
  EXPECT_EQ(capped->prompt_sizes, (std::vector<unsigned>{16, 256, 1024, 3000}));
  EXPECT_EQ(capped->levels, (std::vector<unsigned>{1, 2, 4, 6}));
  EXPECT_LE(capped->requests(), 40u);
}

TEST(DoctorPlan, TooSmallABudgetIsRefusedWithTheReason) {
  std::string why;
  EXPECT_FALSE(make_plan(PlanLimits{0, 16384, 16}, why).has_value());
  EXPECT_NE(why.find("--max-requests 0"), std::string::npos);
  EXPECT_FALSE(make_plan(PlanLimits{3, 16384, 16}, why).has_value());
  EXPECT_NE(why.find("smallest diagnosis needs"), std::string::npos);
  // A small budget loses the highest levels, then the largest prompts.
  const auto small = make_plan(PlanLimits{8, 16384, 16}, why);
  ASSERT_TRUE(small.has_value()) << why;
  EXPECT_EQ(small->levels, (std::vector<unsigned>{1, 2}));
  EXPECT_EQ(small->prompt_sizes, (std::vector<unsigned>{16, 256, 1024}));
  EXPECT_EQ(small->requests(), 8u);
}

TEST(DoctorPlan, SyntheticPromptsHaveTheirSizeAndDiffer) {
  const auto a = synthetic_prompt(256, 1);
  const auto b = synthetic_prompt(256, 2);
  EXPECT_EQ(a.size(), 256u * 4);
  EXPECT_NE(a, b);
  const auto body = probe_body("\"m\"", a);
  EXPECT_NE(body.find(R"("max_tokens":1,"stream":true)"), std::string::npos);
  EXPECT_EQ(body.rfind(R"({"model":"m","messages":[{"role":"user","content":")", 0), 0u);
}

}  // namespace
}  // namespace sluice::doctor
