// An upstream that sends an interim head (103 Early Hints) before its answer:
// each client gets its own answer and never the interim head, even when one
// worker sends every request over the same pooled connection.
#include <gtest/gtest.h>

#include <string>

#include "support/gateway_fixture.hpp"
#include "support/http_client.hpp"
#include "support/scripted_upstream.hpp"

namespace sluice::testing {
namespace {

using namespace std::chrono_literals;

std::string answer_body_for(const std::string& request_id) {
  return R"({"answer_to":")" + request_id + R"("})";
}

TEST(InterimHeads, EachClientGetsItsOwnAnswerAfterEarlyHints) {
  ScriptedUpstream upstream([](const std::string& head) {
    const std::string body = answer_body_for(field_value(head, "x-request-id"));
    return ScriptedUpstream::Reply{
        {"HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\n\r\n",
         "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: " +
             std::to_string(body.size()) + "\r\n\r\n" + body},
        200ms};
  });
  TestGateway gateway(
      "server:\n  listen: 127.0.0.1:0\n  threads: 1\nrouter:\n  retries: 0\n"
      "models:\n  - name: chat\n    deployments:\n" +
      deployment_yaml("early", upstream.base_url(), kNoWarmConnections));
  for (const std::string id : {"first", "second"}) {
    auto response = http_request(gateway.port(), "POST", "/v1/chat/completions",
                                 chat_body("chat", false), {{"x-request-id", id}});
    EXPECT_EQ(response.status, 200u) << id;
    EXPECT_EQ(response.body, answer_body_for(id)) << id;
    EXPECT_FALSE(response.has_header("Link")) << id;
  }
  EXPECT_EQ(upstream.requests(), 2u);
  EXPECT_EQ(upstream.connections_accepted(), 1u) << "the connection was not reused";
}

}  // namespace
}  // namespace sluice::testing
