// The response cache behind the gateway, against mock upstreams whose
// request counters show what reached them.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "support/gateway_fixture.hpp"
#include "support/http_client.hpp"

namespace sluice::testing {
namespace {

using namespace std::chrono_literals;
using nlohmann::json;

std::string cached_model(const std::string& base_url, const std::string& cache_yaml) {
  return "models:\n  - name: chat\n    cache: " + cache_yaml + "\n    deployments:\n" +
         deployment_yaml("d1", base_url);
}

std::string question(const std::string& text, const std::string& extra = "") {
  std::string body = R"({"model":"chat","temperature":0,"messages":[{"role":"user","content":)" +
                     json(text).dump() + "}]";
  if (!extra.empty()) body += "," + extra;
  return body + "}";
}

HttpResponse ask(TestGateway& gateway, const std::string& body, const Headers& headers = {}) {
  return http_request(gateway.port(), "POST", "/v1/chat/completions", body, headers);
}

std::string streamed_text(const std::string& body) {
  std::string text;
  for (const auto& event : sse_data(body)) {
    if (event == "[DONE]") continue;
    auto chunk = json::parse(event);
    if (chunk["choices"].empty()) continue;
    auto& delta = chunk["choices"][0]["delta"];
    if (delta.contains("content") && delta["content"].is_string()) {
      text += delta["content"].get<std::string>();
    }
  }
  return text;
}

TEST(Cache, JsonHitIsAnsweredWithoutTheUpstream) {
  auto upstream = start_mock();
  TestGateway gateway(cached_model(upstream->base_url(), "{mode: exact}"));

  auto first = ask(gateway, question("Hello?"));
  ASSERT_EQ(first.status, 200u) << first.body;
  EXPECT_EQ(first.header("x-sluice-cache"), "miss");
  ASSERT_EQ(upstream->stats().requests, 1u);

  auto second = ask(gateway, question("Hello?"));
  ASSERT_EQ(second.status, 200u) << second.body;
  EXPECT_EQ(second.header("x-sluice-cache"), "hit");
  EXPECT_EQ(second.header("content-type"), "application/json");
  EXPECT_EQ(second.body, first.body);
  EXPECT_EQ(upstream->stats().requests, 1u);
  EXPECT_TRUE(second.has_header("x-request-id"));
  EXPECT_FALSE(second.has_header("x-sluice-deployment"));
}

TEST(Cache, StreamingHitIsReplayedAsEvents) {
  auto upstream = start_mock();
  TestGateway gateway(cached_model(upstream->base_url(), "{mode: exact}"));

  auto first = ask(gateway, question("Hello?", R"("stream":true)"));
  ASSERT_EQ(first.status, 200u) << first.body;
  EXPECT_EQ(first.header("x-sluice-cache"), "miss");
  const std::string expected = "tok0 tok1 tok2 tok3 tok4 tok5 tok6 tok7 ";
  ASSERT_EQ(streamed_text(first.body), expected);
  // The upstream, asked for usage, sends "usage":null with every chunk (as
  // OpenAI does), which is what a client that did not ask sees too; the
  // usage chunk itself is not the client's.
  for (const auto& event : sse_data(first.body)) {
    if (event == "[DONE]") continue;
    const auto chunk = json::parse(event);
    EXPECT_TRUE(!chunk.contains("usage") || chunk["usage"].is_null()) << event;
    EXPECT_FALSE(chunk["choices"].empty()) << event;
  }

  auto replay =
      ask(gateway, question("Hello?", R"("stream":true,"stream_options":{"include_usage":true})"));
  ASSERT_EQ(replay.status, 200u) << replay.body;
  EXPECT_EQ(replay.header("x-sluice-cache"), "hit");
  EXPECT_EQ(replay.header("content-type"), "text/event-stream");
  auto events = sse_data(replay.body);
  ASSERT_GE(events.size(), 4u) << replay.body;
  EXPECT_EQ(events.back(), "[DONE]");
  EXPECT_EQ(streamed_text(replay.body), expected);
  auto first_chunk = json::parse(events[0]);
  EXPECT_EQ(first_chunk["object"], "chat.completion.chunk");
  EXPECT_EQ(first_chunk["model"], "mock-model");
  EXPECT_EQ(first_chunk["choices"][0]["delta"]["role"], "assistant");
  auto finish = json::parse(events[events.size() - 3]);
  EXPECT_EQ(finish["choices"][0]["finish_reason"], "stop");
  auto usage = json::parse(events[events.size() - 2]);
  EXPECT_EQ(usage["usage"]["completion_tokens"], 8) << "the usage the upstream reported";

  // The same entry answers a non-streaming request as a chat.completion.
  auto as_json = ask(gateway, question("Hello?"));
  ASSERT_EQ(as_json.status, 200u);
  EXPECT_EQ(as_json.header("x-sluice-cache"), "hit");
  auto completion = json::parse(as_json.body);
  EXPECT_EQ(completion["object"], "chat.completion");
  EXPECT_EQ(completion["choices"][0]["message"]["content"], expected);
  EXPECT_EQ(completion["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(upstream->stats().requests, 1u);
}

TEST(Cache, JsonFilledEntryIsReplayedToAStreamingClient) {
  auto upstream = start_mock();
  TestGateway gateway(cached_model(upstream->base_url(), "{mode: exact}"));
  ASSERT_EQ(ask(gateway, question("Hi")).status, 200u);
  auto replay = ask(gateway, question("Hi", R"("stream":true)"));
  EXPECT_EQ(replay.header("x-sluice-cache"), "hit");
  EXPECT_EQ(streamed_text(replay.body), "tok0 tok1 tok2 tok3 tok4 tok5 tok6 tok7 ");
  EXPECT_EQ(sse_data(replay.body).back(), "[DONE]");
  EXPECT_EQ(upstream->stats().requests, 1u);
}

TEST(Cache, AChangedParameterMissesAndTheUserFieldDoesNot) {
  auto upstream = start_mock();
  TestGateway gateway(cached_model(upstream->base_url(), "{mode: exact}"));
  ASSERT_EQ(ask(gateway, question("Hi", R"("max_tokens":10)")).status, 200u);
  auto changed = ask(gateway, question("Hi", R"("max_tokens":11)"));
  EXPECT_EQ(changed.header("x-sluice-cache"), "miss");
  EXPECT_EQ(upstream->stats().requests, 2u);
  auto other_user = ask(gateway, question("Hi", R"("max_tokens":10,"user":"bob")"));
  EXPECT_EQ(other_user.header("x-sluice-cache"), "hit");
  auto other_text = ask(gateway, question("Hi!", R"("max_tokens":10)"));
  EXPECT_EQ(other_text.header("x-sluice-cache"), "miss");
  EXPECT_EQ(upstream->stats().requests, 3u);
}

TEST(Cache, OnlyZeroTemperatureOrTheCacheFlagIsCacheableAndTheFlagIsNotForwarded) {
  auto upstream = start_mock();
  TestGateway gateway(cached_model(upstream->base_url(), "{mode: exact}"));
  const std::string warm =
      R"({"model":"chat","temperature":0.7,"messages":[{"role":"user","content":"Hi"}]})";
  for (int i = 0; i < 2; ++i) {
    auto response = ask(gateway, warm);
    ASSERT_EQ(response.status, 200u);
    EXPECT_FALSE(response.has_header("x-sluice-cache"));
  }
  EXPECT_EQ(upstream->stats().requests, 2u);

  const std::string flagged =
      R"({"model":"chat","cache":true,"messages":[{"role":"user","content":"Hi"}]})";
  EXPECT_EQ(ask(gateway, flagged).header("x-sluice-cache"), "miss");
  EXPECT_EQ(ask(gateway, flagged).header("x-sluice-cache"), "hit");
  EXPECT_EQ(upstream->stats().requests, 3u);
  auto forwarded = json::parse(upstream->recent_requests().back().body);
  EXPECT_FALSE(forwarded.contains("cache")) << forwarded.dump();
  EXPECT_EQ(forwarded["model"], "mock-model");

  // An explicit false opts a zero-temperature request out.
  auto opted_out = ask(gateway, question("Hi", R"("cache":false)"));
  EXPECT_FALSE(opted_out.has_header("x-sluice-cache"));
  EXPECT_EQ(upstream->stats().requests, 4u);
  EXPECT_FALSE(json::parse(upstream->recent_requests().back().body).contains("cache"));
}

TEST(Cache, EntriesExpireAfterTheTtl) {
  auto upstream = start_mock();
  TestGateway gateway(cached_model(upstream->base_url(), "{mode: exact, ttl: 200ms}"));
  ASSERT_EQ(ask(gateway, question("Hi")).status, 200u);
  EXPECT_EQ(ask(gateway, question("Hi")).header("x-sluice-cache"), "hit");
  std::this_thread::sleep_for(300ms);
  EXPECT_EQ(ask(gateway, question("Hi")).header("x-sluice-cache"), "miss");
  EXPECT_EQ(upstream->stats().requests, 2u);
}

TEST(Cache, StaysWithinMaxEntries) {
  auto upstream = start_mock();
  TestGateway gateway(cached_model(upstream->base_url(), "{mode: exact, max_entries: 2}"));
  for (const char* text : {"a", "b", "c"}) ASSERT_EQ(ask(gateway, question(text)).status, 200u);
  EXPECT_EQ(upstream->stats().requests, 3u);
  EXPECT_EQ(ask(gateway, question("c")).header("x-sluice-cache"), "hit");
  EXPECT_EQ(ask(gateway, question("b")).header("x-sluice-cache"), "hit");
  EXPECT_EQ(ask(gateway, question("a")).header("x-sluice-cache"), "miss") << "evicted";
  EXPECT_EQ(upstream->stats().requests, 4u);
  auto* cache = gateway.gateway().snapshot()->caches->find("chat");
  ASSERT_NE(cache, nullptr);
  EXPECT_EQ(cache->size(), 2u);
}

TEST(Cache, NoCacheHeaderSkipsLookupAndStore) {
  auto upstream = start_mock();
  TestGateway gateway(cached_model(upstream->base_url(), "{mode: exact}"));
  auto bypass = ask(gateway, question("Hi"), {{"Cache-Control", "max-age=0, No-Cache"}});
  EXPECT_EQ(bypass.header("x-sluice-cache"), "bypass");
  EXPECT_EQ(ask(gateway, question("Hi")).header("x-sluice-cache"), "miss") << "nothing was stored";
  EXPECT_EQ(ask(gateway, question("Hi")).header("x-sluice-cache"), "hit");
  EXPECT_EQ(ask(gateway, question("Hi"), {{"Cache-Control", "no-cache"}}).header("x-sluice-cache"),
            "bypass");
  EXPECT_EQ(upstream->stats().requests, 3u);
}

TEST(Cache, ErrorsAndBrokenStreamsAreNeverCached) {
  auto upstream = start_mock();
  TestGateway gateway(cached_model(upstream->base_url(), "{mode: exact}"));
  auto error = ask(gateway, question("Hi"), {{"x-mock-fail", "400"}});
  ASSERT_EQ(error.status, 400u);
  auto after_error = ask(gateway, question("Hi"));
  EXPECT_EQ(after_error.status, 200u);
  EXPECT_EQ(after_error.header("x-sluice-cache"), "miss");
  EXPECT_EQ(upstream->stats().requests, 2u);

  auto broken =
      ask(gateway, question("Stream", R"("stream":true)"), {{"x-mock-fail", "reset-mid"}});
  ASSERT_EQ(broken.status, 200u);
  ASSERT_NE(broken.body.find("error"), std::string::npos) << broken.body;
  auto after_broken = ask(gateway, question("Stream", R"("stream":true)"));
  EXPECT_EQ(after_broken.header("x-sluice-cache"), "miss");
  EXPECT_EQ(upstream->stats().requests, 4u);
  EXPECT_EQ(ask(gateway, question("Stream")).header("x-sluice-cache"), "hit");
}

TEST(Cache, ModelsWithoutACacheAreUntouched) {
  auto upstream = start_mock();
  TestGateway gateway("models:\n  - name: chat\n    deployments:\n" +
                      deployment_yaml("d1", upstream->base_url()));
  for (int i = 0; i < 2; ++i) {
    auto response = ask(gateway, question("Hi", R"("cache":true)"));
    ASSERT_EQ(response.status, 200u);
    EXPECT_FALSE(response.has_header("x-sluice-cache"));
  }
  EXPECT_EQ(upstream->stats().requests, 2u);
  EXPECT_FALSE(json::parse(upstream->recent_requests().back().body).contains("cache"))
      << "sluice's own field never goes upstream";
}

TEST(Cache, HitIsLoggedAndChargesNoTokens) {
  auto upstream = start_mock();
  TempFile log_file("");
  TestGateway gateway(
      "server:\n  listen: 127.0.0.1:0\n  threads: 2\nlog:\n  access_log: " + log_file.path() +
      "\nauth:\n  keys:\n    - name: team\n      key: sk-team-secret\n"
      "      tpm: 100000\n" +
      cached_model(upstream->base_url(), "{mode: exact}"));
  Headers auth = bearer("sk-team-secret");
  // One connection: each request is settled and logged before the next is read.
  HttpConnection client(gateway.port());
  auto send = [&] { return client.request("POST", "/v1/chat/completions", question("Hi"), auth); };
  ASSERT_EQ(send().header("x-sluice-cache"), "miss");
  // Each request reserves its estimate on arrival (the header shows what is
  // left then); a hit gives it all back, so the next one sees no less.
  auto hit = send();
  ASSERT_EQ(hit.header("x-sluice-cache"), "hit");
  auto again = send();
  ASSERT_EQ(again.header("x-sluice-cache"), "hit");
  EXPECT_GE(std::stoull(again.header("x-ratelimit-remaining-tokens")),
            std::stoull(hit.header("x-ratelimit-remaining-tokens")));

  std::vector<json> lines;
  ASSERT_TRUE(eventually(
      [&] {
        lines.clear();
        std::ifstream in(log_file.path());
        std::string line;
        while (std::getline(in, line)) lines.push_back(json::parse(line));
        return lines.size() >= 3;
      },
      3s));
  EXPECT_EQ(lines[0]["cache"], "miss");
  EXPECT_EQ(lines[1]["cache"], "hit");
  EXPECT_TRUE(lines[1]["prompt_tokens"].is_null());
  EXPECT_EQ(lines[1]["deployment"], "");
}

// Two gateways' worth of semantic tests share this: a chat upstream and an
// embeddings upstream whose bag-of-words vectors make similarity predictable.
class SemanticCache : public ::testing::Test {
 protected:
  void SetUp() override {
    chat_ = start_mock();
    mock::Behaviour embeddings;
    embeddings.dims = 512;  // few hash collisions between different words
    embedder_ = start_mock(embeddings);
  }

  std::string config(double threshold) {
    return "models:\n  - name: chat\n    cache: {mode: semantic, semantic: {embedding_model: "
           "embed, "
           "threshold: " +
           std::to_string(threshold) + "}}\n    deployments:\n" +
           deployment_yaml("d1", chat_->base_url()) + "  - name: embed\n    deployments:\n" +
           deployment_yaml("e1", embedder_->base_url());
  }

  // The similarity the embeddings upstream gives two texts.
  double similarity(const std::string& a, const std::string& b) {
    auto vector = [&](const std::string& text) {
      auto response = http_request(embedder_->port(), "POST", "/v1/embeddings",
                                   json{{"model", "e"}, {"input", text}}.dump());
      return json::parse(response.body)["data"][0]["embedding"].get<std::vector<double>>();
    };
    auto x = vector(a), y = vector(b);
    double dot = 0;
    for (std::size_t i = 0; i < x.size(); ++i) dot += x[i] * y[i];
    return dot;
  }

  std::unique_ptr<mock::MockServer> chat_;
  std::unique_ptr<mock::MockServer> embedder_;
};

TEST_F(SemanticCache, SameWordsHitDifferentWordsMiss) {
  TestGateway gateway(config(0.95));
  auto first = ask(gateway, question("What is the capital of France?"));
  EXPECT_EQ(first.header("x-sluice-cache"), "miss");
  EXPECT_EQ(embedder_->stats().requests, 1u);
  auto embed_request = json::parse(embedder_->recent_requests().back().body);
  EXPECT_EQ(embed_request["input"], "What is the capital of France?");
  EXPECT_EQ(embed_request["model"], "mock-model");

  auto rephrased = ask(gateway, question("France: the capital of, what is?"));
  EXPECT_EQ(rephrased.header("x-sluice-cache"), "hit");
  EXPECT_EQ(rephrased.header("x-sluice-cache-similarity"), "1.0000");
  EXPECT_EQ(rephrased.body, first.body);

  auto different = ask(gateway, question("How long should bread dough rise?"));
  EXPECT_EQ(different.header("x-sluice-cache"), "miss");
  EXPECT_EQ(chat_->stats().requests, 2u);
  EXPECT_EQ(embedder_->stats().requests, 3u);
}

TEST_F(SemanticCache, HitAndMissAroundTheThreshold) {
  const std::string asked = "What is the capital city of France";
  const std::string near = "What is the capital city of France please";
  double cosine = similarity(asked, near);
  ASSERT_GT(cosine, 0.5);
  ASSERT_LT(cosine, 0.99);
  {
    TestGateway gateway(config(cosine - 0.01));
    ASSERT_EQ(ask(gateway, question(asked)).header("x-sluice-cache"), "miss");
    auto hit = ask(gateway, question(near));
    EXPECT_EQ(hit.header("x-sluice-cache"), "hit");
    EXPECT_NEAR(std::stod(hit.header("x-sluice-cache-similarity")), cosine, 1e-3);
  }
  {
    TestGateway gateway(config(cosine + 0.01));
    ASSERT_EQ(ask(gateway, question(asked)).header("x-sluice-cache"), "miss");
    EXPECT_EQ(ask(gateway, question(near)).header("x-sluice-cache"), "miss");
  }
  EXPECT_EQ(chat_->stats().requests, 3u);
}

TEST_F(SemanticCache, RequestsWithToolsAreOnlyMatchedExactly) {
  TestGateway gateway(config(0.9));
  const std::string tools =
      R"("tools":[{"type":"function","function":{"name":"f","parameters":{}}}])";
  ASSERT_EQ(ask(gateway, question("What is the capital of France?", tools)).status, 200u);
  EXPECT_EQ(
      ask(gateway, question("France: the capital of, what is?", tools)).header("x-sluice-cache"),
      "miss");
  EXPECT_EQ(
      ask(gateway, question("What is the capital of France?", tools)).header("x-sluice-cache"),
      "hit");
  EXPECT_EQ(embedder_->stats().requests, 0u) << "no embedding is needed for tool requests";
}

TEST_F(SemanticCache, AFailingEmbeddingModelMakesAnOrdinaryMiss) {
  embedder_->stop();
  TestGateway gateway(config(0.9));
  auto first = ask(gateway, question("What is the capital of France?"));
  ASSERT_EQ(first.status, 200u);
  EXPECT_EQ(first.header("x-sluice-cache"), "miss");
  EXPECT_EQ(ask(gateway, question("What is the capital of France?")).header("x-sluice-cache"),
            "hit")
      << "the exact match still works";
}

// The embedding request goes through the same attempts as a client's: a
// broken deployment of the embedding model is failed over and, once it has
// failed `cooldown.fails` times, left alone; none of it shows in the client
// request's own attempts.
TEST_F(SemanticCache, TheEmbeddingRequestFailsOverAndCoolsABrokenDeploymentDown) {
  mock::Behaviour broken_behaviour;
  broken_behaviour.fail = "500";
  auto broken = start_mock(broken_behaviour);
  TestGateway gateway(
      "router:\n  cooldown: {fails: 1, within: 60s, for: 60s}\n  backoff: {base: 1ms, max: 1ms}\n"
      "models:\n  - name: chat\n    cache: {mode: semantic, semantic: {embedding_model: embed, "
      "threshold: 0.95}}\n    deployments:\n" +
      deployment_yaml("d1", chat_->base_url()) +
      "  - name: embed\n    strategy: priority\n    deployments:\n" +
      deployment_yaml("e-broken", broken->base_url()) +
      deployment_yaml("e1", embedder_->base_url()));

  auto first = ask(gateway, question("What is the capital of France?"));
  ASSERT_EQ(first.status, 200u);
  EXPECT_EQ(first.header("x-sluice-cache"), "miss");
  EXPECT_EQ(broken->stats().requests, 1u);
  EXPECT_EQ(embedder_->stats().requests, 1u) << "the failed embedding was retried on e1";
  EXPECT_EQ(first.header("x-sluice-attempts"), "1") << "the embedding's attempts are its own";
  EXPECT_EQ(first.header("x-sluice-deployment"), "d1");

  auto rephrased = ask(gateway, question("France: the capital of, what is?"));
  EXPECT_EQ(rephrased.header("x-sluice-cache"), "hit");
  EXPECT_EQ(broken->stats().requests, 1u) << "e-broken cools down after its failure";
  EXPECT_EQ(embedder_->stats().requests, 2u);

  auto routes = http_request(gateway.gateway().admin_port(), "GET", "/admin/routes");
  auto embed = json::parse(routes.body)["models"][1]["deployments"][0];
  EXPECT_EQ(embed["id"], "e-broken") << embed;
  EXPECT_EQ(embed["cooling_down"], true) << embed;
}

}  // namespace
}  // namespace sluice::testing
