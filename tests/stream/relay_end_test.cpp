// How a response's end leaves the relay. A body that the gateway reads
// whole leaves in one write, its end (the last chunk) included, rather than
// in a second write after the read that reports the end: every write is a
// system call, and a short stream pays for each. And what the scanner still
// holds back when the body ends reaches the client intact. An answer that
// has no body ends with its head, and one an HTTP/1.0 client cannot be told
// the length of ends with the connection.
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <atomic>
#include <cctype>
#include <chrono>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "sluice/upstream/connection.hpp"
#include "support/canned_upstream.hpp"
#include "support/gateway_fixture.hpp"
#include "support/http_client.hpp"

// Counts the gateway's writes to clients (sendmsg on sockets whose local
// port is the gateway's listening port) and its reads of an upstream's
// answers (recvmsg on sockets whose peer's port is the upstream's).
namespace {
std::atomic<int> watched_local_port{-1};
std::atomic<int> writes_to_clients{0};
std::atomic<int> watched_peer_port{-1};
std::atomic<int> reads_from_upstream{0};

int port_of(int descriptor, bool peer) {
  sockaddr_in address{};
  socklen_t size = sizeof address;
  auto* name = reinterpret_cast<sockaddr*>(&address);
  const int status =
      peer ? ::getpeername(descriptor, name, &size) : ::getsockname(descriptor, name, &size);
  if (status != 0 || address.sin_family != AF_INET) return -1;
  return ntohs(address.sin_port);
}
}  // namespace

extern "C" ssize_t sendmsg(int descriptor, const msghdr* message, int flags) {
  using Real = ssize_t (*)(int, const msghdr*, int);
  static const auto real = reinterpret_cast<Real>(dlsym(RTLD_NEXT, "sendmsg"));
  const int watched = watched_local_port.load();
  if (watched >= 0 && port_of(descriptor, false) == watched) ++writes_to_clients;
  return real(descriptor, message, flags);
}

extern "C" ssize_t recvmsg(int descriptor, msghdr* message, int flags) {
  using Real = ssize_t (*)(int, msghdr*, int);
  static const auto real = reinterpret_cast<Real>(dlsym(RTLD_NEXT, "recvmsg"));
  const int watched = watched_peer_port.load();
  if (watched >= 0 && port_of(descriptor, true) == watched) ++reads_from_upstream;
  return real(descriptor, message, flags);
}

namespace sluice::testing {
namespace {

std::string gateway_yaml(const CannedUpstream& upstream) {
  return "models:\n  - name: chat\n    deployments:\n" +
         deployment_yaml("canned", upstream.base_url(), kNoWarmConnections);
}

// Sends one request and returns the response with the number of writes the
// gateway made to the client for it.
std::pair<HttpResponse, int> request_counting_writes(TestGateway& gateway, bool stream) {
  HttpConnection client(gateway.port());
  writes_to_clients = 0;
  watched_local_port = gateway.port();
  auto response = client.request("POST", "/v1/chat/completions", chat_body("chat", stream));
  watched_local_port = -1;
  return {response, writes_to_clients.load()};
}

const std::string kEvent =
    R"(data: {"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":null}]})"
    "\n\n";
const std::string kStreamHead =
    "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n";
const std::string kLastChunk = "0\r\n\r\n";

// Three requests on one connection, each answered with `response` in one
// upstream write: each reaches the client as `expected_body`, in one write.
void expect_one_write_each(const std::string& response, bool stream,
                           const std::string& expected_body) {
  CannedUpstream upstream(response);
  TestGateway gateway(gateway_yaml(upstream));
  for (int round = 0; round < 3; ++round) {
    auto [answer, writes] = request_counting_writes(gateway, stream);
    ASSERT_EQ(answer.status, 200u);
    EXPECT_EQ(answer.body, expected_body) << "round " << round;
    EXPECT_EQ(writes, 1) << "round " << round;
  }
}

TEST(RelayWrites, AStreamReadWholeLeavesInOneWriteWithItsEnd) {
  expect_one_write_each(kStreamHead + chunk(kEvent) + chunk("data: [DONE]\n\n") + kLastChunk, true,
                        kEvent + "data: [DONE]\n\n");
}

// Longer than Beast's first read of 512 bytes, within the connection's.
TEST(RelayWrites, AStreamOfNearlyAKibibyteIsReadAndWrittenAtOnce) {
  std::string events;
  std::string body;
  while (events.size() + chunk(kEvent).size() < 800) {
    events += chunk(kEvent);
    body += kEvent;
  }
  const std::string response = kStreamHead + events + chunk("data: [DONE]\n\n") + kLastChunk;
  ASSERT_GT(response.size(), 800u);
  ASSERT_LE(response.size(), upstream::Connection::kPlainReadBufferSize);
  expect_one_write_each(response, true, body + "data: [DONE]\n\n");
}

TEST(RelayWrites, AChunkedJsonBodyReadWholeLeavesInOneWriteWithItsEnd) {
  const std::string body =
      R"({"id":"c1","object":"chat.completion","choices":[],"usage":{"prompt_tokens":1,"completion_tokens":2,"total_tokens":3}})";
  expect_one_write_each(
      "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n" +
          chunk(body.substr(0, 40)) + chunk(body.substr(40)) + kLastChunk,
      false, body);
}

// An answer of known length is read in reads as large as what is still to
// come, and written on in pieces that grow with it: an embedding of some 30
// KB takes a few of each, not one per kilobyte.
TEST(RelayWrites, ALargeJsonBodyTakesAFewReadsAndWrites) {
  mock::Behaviour behaviour;
  behaviour.dims = 12000;
  auto upstream = start_mock(behaviour);
  TestGateway gateway("models:\n  - name: embed\n    deployments:\n" +
                      deployment_yaml("d1", upstream->base_url(), kNoWarmConnections));
  HttpConnection client(gateway.port());
  for (int round = 0; round < 3; ++round) {
    writes_to_clients = 0;
    reads_from_upstream = 0;
    watched_local_port = gateway.port();
    watched_peer_port = upstream->port();
    auto response =
        client.request("POST", "/v1/embeddings", R"({"model":"embed","input":"hello"})");
    watched_local_port = -1;
    watched_peer_port = -1;
    ASSERT_EQ(response.status, 200u) << response.body;
    ASSERT_GT(response.body.size(), 20000u);
    auto answer = nlohmann::json::parse(response.body, nullptr, false);
    ASSERT_TRUE(answer.is_object());
    EXPECT_EQ(answer["data"][0]["embedding"].size(), 12000u);
    // A kilobyte at a time would be some 30 reads and as many writes.
    EXPECT_LE(reads_from_upstream.load(), 8) << "round " << round;
    EXPECT_LE(writes_to_clients.load(), 8) << "round " << round;
  }
}

// Three streamed requests with a key that has a token budget, for which the
// gateway asks for the usage chunk itself and strips it: each reaches the
// client as `expected_body`.
void expect_budgeted_streams_arrive_as(const CannedUpstream& upstream,
                                       const std::string& expected_body) {
  const std::string key = "sk-team-a-0123456789";
  TestGateway gateway("auth:\n  keys:\n    - name: team-a\n      key: " + key +
                      "\n      tpm: 100000\n" + gateway_yaml(upstream));
  for (int round = 0; round < 3; ++round) {
    auto response = http_request(gateway.port(), "POST", "/v1/chat/completions",
                                 chat_body("chat", true), bearer(key));
    ASSERT_EQ(response.status, 200u) << response.body;
    EXPECT_EQ(response.body, expected_body) << "round " << round;
  }
}

// For a key with a token budget the gateway asks for the usage chunk itself
// and holds back each event until it knows the event is not that chunk. An
// event held over from one read and released in the next, followed in that
// read by a truncated last event that is still held when the body ends: both
// reach the client intact, the first no longer pointing into a buffer that
// handing out the second reuses.
TEST(RelayEnd, AnEventReleasedLateAndATruncatedLastOneArriveIntact) {
  const std::string first_start = R"(data: {"id":"a",)";
  const std::string first_rest =
      R"("choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":null}]})"
      "\n\n";
  const std::string truncated = R"(data: {"id":"b","choices":[])";
  CannedUpstream upstream(std::vector<std::string>{
      kStreamHead + chunk(first_start), chunk(first_rest) + chunk(truncated) + kLastChunk});
  expect_budgeted_streams_arrive_as(upstream, first_start + first_rest + truncated);
}

// A plain upstream's read that brings many chunks is relayed from the
// connection's own buffer, chunk by chunk, in one write. Events split
// across chunks are held back and released chunk after chunk within that
// read: each must reach the client as it was sent, and the usage-only chunk
// the gateway asked for must not.
TEST(RelayEnd, EventsSplitAcrossTheChunksOfOneReadArriveIntact) {
  const std::string usage_only =
      R"(data: {"id":"u","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":4,"total_tokens":7}})"
      "\n\n";
  std::string chunks;
  std::string expected;
  for (const char* text : {"one", "two", "three", "four"}) {
    const std::string event =
        R"(data: {"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":")" +
        std::string(text) + R"("},"finish_reason":null}]})" + "\n\n";
    // The event's first bytes cannot tell whether it is the usage-only one.
    chunks += chunk(event.substr(0, 20)) + chunk(event.substr(20));
    expected += event;
  }
  chunks +=
      chunk(usage_only.substr(0, 20)) + chunk(usage_only.substr(20)) + chunk("data: [DONE]\n\n");
  expected += "data: [DONE]\n\n";
  CannedUpstream upstream(kStreamHead + chunks + kLastChunk);
  expect_budgeted_streams_arrive_as(upstream, expected);
}

// Sends `request` on a fresh connection and returns everything the gateway
// sends back until it closes the connection, split at the end of the head;
// the head lower-cased, so that names can be looked for in any spelling.
std::pair<std::string, std::string> head_and_rest_until_close(TestGateway& gateway,
                                                              const std::string& request) {
  HttpConnection client(gateway.port(), std::chrono::seconds(3));
  client.send_raw(request);
  const std::string raw = client.read_until_close();
  const auto head_end = raw.find("\r\n\r\n");
  if (head_end == std::string::npos) return {raw, ""};
  std::string head = raw.substr(0, head_end + 4);
  for (char& c : head) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return {head, raw.substr(head_end + 4)};
}

std::string chat_request(std::string_view version, const std::string& fields, bool stream) {
  const std::string body = chat_body("chat", stream);
  return "POST /v1/chat/completions " + std::string(version) + "\r\nHost: x\r\n" + fields +
         "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
         "\r\n\r\n" + body;
}

// A 204 or a 304 never has a body: the client gets the head alone, with no
// length or chunked framing that would promise one, and the connection goes
// on to the next request.
TEST(RelayEnd, ANoContentOrNotModifiedAnswerEndsWithItsHead) {
  for (const std::string status : {"204 No Content", "304 Not Modified"}) {
    SCOPED_TRACE(status);
    CannedUpstream upstream("HTTP/1.1 " + status + "\r\nX-Upstream: kept\r\n\r\n");
    TestGateway gateway(gateway_yaml(upstream));
    auto [head, rest] = head_and_rest_until_close(
        gateway, chat_request("HTTP/1.1", "Connection: close\r\n", false));
    EXPECT_TRUE(head.starts_with("http/1.1 " + status.substr(0, 3))) << head;
    EXPECT_NE(head.find("\r\nx-upstream: kept\r\n"), std::string::npos) << head;
    EXPECT_EQ(head.find("transfer-encoding"), std::string::npos) << head;
    EXPECT_EQ(head.find("content-length"), std::string::npos) << head;
    EXPECT_EQ(rest, "");

    HttpConnection client(gateway.port(), std::chrono::seconds(3));
    for (int round = 0; round < 2; ++round) {
      auto response = client.request("POST", "/v1/chat/completions", chat_body("chat", false));
      EXPECT_EQ(std::to_string(response.status), status.substr(0, 3)) << "round " << round;
      EXPECT_EQ(response.body, "") << "round " << round;
    }
  }
}

// An HTTP/1.0 client knows no chunked encoding: an answer of unknown length
// (a stream) is sent as it comes, and the connection's close ends it, even
// for a client that asked to keep the connection. An answer of known length
// keeps its Content-Length.
TEST(RelayEnd, AnHttp10ClientGetsAStreamEndedByTheConnectionsClose) {
  CannedUpstream upstream(kStreamHead + chunk(kEvent) + chunk("data: [DONE]\n\n") + kLastChunk);
  TestGateway gateway(gateway_yaml(upstream));
  for (const std::string fields : {"", "Connection: keep-alive\r\n"}) {
    SCOPED_TRACE(fields);
    auto [head, rest] = head_and_rest_until_close(gateway, chat_request("HTTP/1.0", fields, true));
    EXPECT_TRUE(head.starts_with("http/1.1 200")) << head;
    EXPECT_EQ(head.find("transfer-encoding"), std::string::npos) << head;
    EXPECT_EQ(head.find("content-length"), std::string::npos) << head;
    EXPECT_NE(head.find("\r\nconnection: close\r\n"), std::string::npos) << head;
    EXPECT_EQ(rest, kEvent + "data: [DONE]\n\n");
  }

  const std::string body = R"({"id":"c1","object":"chat.completion","choices":[]})";
  CannedUpstream sized("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: " +
                       std::to_string(body.size()) + "\r\n\r\n" + body);
  TestGateway sized_gateway(gateway_yaml(sized));
  auto [head, rest] = head_and_rest_until_close(sized_gateway, chat_request("HTTP/1.0", "", false));
  EXPECT_NE(head.find("\r\ncontent-length: " + std::to_string(body.size()) + "\r\n"),
            std::string::npos)
      << head;
  EXPECT_EQ(rest, body);
}

}  // namespace
}  // namespace sluice::testing
