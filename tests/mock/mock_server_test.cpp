// Tests of sluice-mock over real sockets on 127.0.0.1. Every network
// operation in the client below carries a timeout, so a misbehaving server
// fails a test instead of hanging it.

#include "mock/mock_server.hpp"

#include <signal.h>
#include <unistd.h>

#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "mock/anthropic.hpp"
#include "support/child_process.hpp"

namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = boost::beast::http;
namespace ssl = boost::asio::ssl;
using namespace std::chrono_literals;
using sluice::mock::Behaviour;
using sluice::mock::MockServer;
using sluice::mock::Stats;
using Clock = std::chrono::steady_clock;
using Json = nlohmann::json;
using Response = http::response<http::string_body>;
using Headers = std::vector<std::pair<std::string, std::string>>;

constexpr auto kIoTimeout = 5s;

std::unique_ptr<MockServer> start_mock(Behaviour behaviour = {}, std::string cert_pem = {},
                                       std::string key_pem = {}) {
  MockServer::Options options;
  options.behaviour = std::move(behaviour);
  options.tls_cert_pem = std::move(cert_pem);
  options.tls_key_pem = std::move(key_pem);
  auto server = std::make_unique<MockServer>(std::move(options));
  server->start();
  return server;
}

Json chat_body(std::string model = "gpt-test", bool stream = false, bool include_usage = false,
               std::string content = "hello") {
  Json body = {{"model", std::move(model)},
               {"messages", Json::array({{{"role", "user"}, {"content", std::move(content)}}})}};
  if (stream) body["stream"] = true;
  if (include_usage) body["stream_options"] = {{"include_usage", true}};
  return body;
}

std::string expected_content(unsigned tokens) {
  std::string content;
  for (unsigned i = 0; i < tokens; ++i) content += "tok" + std::to_string(i) + " ";
  return content;
}

// The JSON payload of an SSE event ("data: {...}\n\n"), or null for [DONE].
Json event_data(const std::string& event) {
  const auto data = event.find("data: ");
  if (data == std::string::npos) return Json::object({{"missing_data", event}});
  std::string payload = event.substr(data + 6);
  while (!payload.empty() && payload.back() == '\n') payload.pop_back();
  if (payload == "[DONE]") return nullptr;
  return Json::parse(payload);
}

// A small blocking HTTP/1.1 client. Each operation runs the private
// io_context until the operation completes; the tcp_stream expiry bounds it.
class TestClient {
 public:
  explicit TestClient(std::uint16_t port, bool tls = false) : port_(port) {
    if (tls) {
      tls_context_.set_verify_mode(ssl::verify_none);
      secure_ = std::make_unique<beast::ssl_stream<beast::tcp_stream>>(io_, tls_context_);
    } else {
      plain_ = std::make_unique<beast::tcp_stream>(io_);
    }
  }

  boost::system::error_code connect() {
    const asio::ip::tcp::endpoint endpoint(asio::ip::make_address("127.0.0.1"), port_);
    auto error = run([&](auto handler) { lowest().async_connect(endpoint, handler); });
    if (!error && secure_) {
      error =
          run([&](auto handler) { secure_->async_handshake(ssl::stream_base::client, handler); });
    }
    return error;
  }

  boost::system::error_code send(http::verb method, std::string target, std::string body = {},
                                 const Headers& headers = {}) {
    http::request<http::string_body> request{method, target, 11};
    request.set(http::field::host, "127.0.0.1");
    if (method == http::verb::post) request.set(http::field::content_type, "application/json");
    for (const auto& [name, value] : headers) request.set(name, value);
    request.body() = std::move(body);
    request.prepare_payload();
    return run([&](auto handler) {
      with_stream([&](auto& stream) { http::async_write(stream, request, handler); });
    });
  }

  // Reads one whole response; on failure the error is in last_error().
  Response read_response() {
    http::response_parser<http::string_body> parser;
    parser.body_limit(std::numeric_limits<std::uint64_t>::max());
    last_error_ = run([&](auto handler) {
      with_stream([&](auto& stream) { http::async_read(stream, buffer_, parser, handler); });
    });
    return last_error_ ? Response{} : parser.release();
  }

  Response request(http::verb method, std::string target, std::string body = {},
                   const Headers& headers = {}) {
    if (!connected_) {
      last_error_ = connect();
      if (last_error_) return {};
      connected_ = true;
    }
    last_error_ = send(method, std::move(target), std::move(body), headers);
    if (last_error_) return {};
    return read_response();
  }

  Response post(std::string target, const Json& body, const Headers& headers = {}) {
    return request(http::verb::post, std::move(target), body.dump(), headers);
  }

  // Starts reading a streamed response: the head, and whatever arrived with it.
  boost::system::error_code read_stream_head() {
    stream_parser_.emplace();
    stream_parser_->body_limit(std::numeric_limits<std::uint64_t>::max());
    consumed_ = 0;
    reads_ = 0;
    last_error_ = run([&](auto handler) {
      with_stream([&](auto& stream) {
        http::async_read_header(stream, buffer_, *stream_parser_, handler);
      });
    });
    return last_error_;
  }

  const http::response_parser<http::string_body>::value_type& stream_message() const {
    return stream_parser_->get();
  }

  // The next complete SSE event ("...\n\n"), or nullopt at the end of the
  // body or on an error (see last_error()).
  std::optional<std::string> next_event(std::chrono::milliseconds timeout = kIoTimeout) {
    for (;;) {
      const std::string& body = stream_parser_->get().body();
      if (auto end = body.find("\n\n", consumed_); end != std::string::npos) {
        std::string event = body.substr(consumed_, end + 2 - consumed_);
        consumed_ = end + 2;
        return event;
      }
      if (stream_parser_->is_done()) return std::nullopt;
      last_error_ = run(
          [&](auto handler) {
            with_stream([&](auto& stream) {
              http::async_read_some(stream, buffer_, *stream_parser_, handler);
            });
          },
          timeout);
      ++reads_;
      if (last_error_) return std::nullopt;
    }
  }

  bool stream_done() const { return stream_parser_ && stream_parser_->is_done(); }
  std::size_t stream_reads() const { return reads_; }
  boost::system::error_code last_error() const { return last_error_; }

  // Closes the socket right away (no TLS close_notify), like a client that
  // gives up on a request.
  void close() {
    boost::system::error_code ignored;
    lowest().socket().shutdown(asio::ip::tcp::socket::shutdown_both, ignored);
    lowest().socket().close(ignored);
  }

  boost::system::error_code write_raw(const std::string& bytes) {
    return run([&](auto handler) {
      with_stream([&](auto& stream) { asio::async_write(stream, asio::buffer(bytes), handler); });
    });
  }

  // Reads raw bytes until the peer closes or the timeout passes.
  std::string read_raw_until_close(boost::system::error_code& error) {
    std::string raw(static_cast<const char*>(buffer_.data().data()), buffer_.size());
    buffer_.consume(buffer_.size());
    char chunk[4096];
    for (;;) {
      std::size_t got = 0;
      error = run([&](auto handler) {
        with_stream([&](auto& stream) {
          stream.async_read_some(asio::buffer(chunk), [&, handler](auto ec, std::size_t n) {
            got = n;
            handler(ec, n);
          });
        });
      });
      raw.append(chunk, got);
      if (error) return raw;
    }
  }

 private:
  beast::tcp_stream& lowest() { return secure_ ? beast::get_lowest_layer(*secure_) : *plain_; }

  template <class F>
  void with_stream(F&& use) {
    if (secure_) {
      use(*secure_);
    } else {
      use(*plain_);
    }
  }

  template <class Start>
  boost::system::error_code run(Start&& start, std::chrono::milliseconds timeout = kIoTimeout) {
    boost::system::error_code result;
    bool completed = false;
    lowest().expires_after(timeout);
    start([&](boost::system::error_code error, auto&&...) {
      result = error;
      completed = true;
    });
    io_.restart();
    io_.run();
    lowest().expires_never();
    if (!completed) result = asio::error::timed_out;
    return result;
  }

  std::uint16_t port_;
  asio::io_context io_;
  ssl::context tls_context_{ssl::context::tls_client};
  std::unique_ptr<beast::tcp_stream> plain_;
  std::unique_ptr<beast::ssl_stream<beast::tcp_stream>> secure_;
  beast::flat_buffer buffer_;
  std::optional<http::response_parser<http::string_body>> stream_parser_;
  std::size_t consumed_ = 0;
  std::size_t reads_ = 0;
  bool connected_ = false;
  boost::system::error_code last_error_;
};

double cosine(const std::vector<double>& a, const std::vector<double>& b) {
  double dot = 0, norm_a = 0, norm_b = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    dot += a[i] * b[i];
    norm_a += a[i] * a[i];
    norm_b += b[i] * b[i];
  }
  return dot / std::sqrt(norm_a * norm_b);
}

template <class Predicate>
bool eventually(Predicate&& predicate, std::chrono::milliseconds limit) {
  const auto deadline = Clock::now() + limit;
  while (Clock::now() < deadline) {
    if (predicate()) return true;
    std::this_thread::sleep_for(1ms);
  }
  return predicate();
}

// ---------------------------------------------------------------------------

TEST(MockServer, ChatCompletionHasOpenAiShapeAndEchoesModel) {
  auto mock = start_mock();
  EXPECT_EQ(mock->base_url(), "http://127.0.0.1:" + std::to_string(mock->port()) + "/v1");
  TestClient client(mock->port());
  // 40 characters of content: an estimate of 10 prompt tokens.
  const Response response = client.post(
      "/v1/chat/completions", chat_body("rewritten-model", false, false, std::string(40, 'x')));
  ASSERT_FALSE(client.last_error()) << client.last_error().message();
  EXPECT_EQ(response.result_int(), 200);
  EXPECT_EQ(response[http::field::content_type], "application/json");
  EXPECT_FALSE(response.chunked());
  EXPECT_EQ(response[http::field::content_length], std::to_string(response.body().size()));

  const Json body = Json::parse(response.body());
  EXPECT_EQ(body["object"], "chat.completion");
  EXPECT_EQ(body["model"], "rewritten-model");
  EXPECT_TRUE(body["id"].get<std::string>().starts_with("chatcmpl-"));
  ASSERT_EQ(body["choices"].size(), 1u);
  EXPECT_EQ(body["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(body["choices"][0]["message"]["content"], expected_content(8));
  EXPECT_EQ(body["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(body["usage"]["prompt_tokens"], 10);
  EXPECT_EQ(body["usage"]["completion_tokens"], 8);
  EXPECT_EQ(body["usage"]["total_tokens"], 18);
}

TEST(MockServer, AnyPathPrefixIsServedAndUnknownPathsAre404) {
  auto mock = start_mock();
  TestClient client(mock->port());
  const Response prefixed = client.post("/openai/v1/chat/completions", chat_body());
  EXPECT_EQ(prefixed.result_int(), 200);
  EXPECT_EQ(Json::parse(prefixed.body())["object"], "chat.completion");

  const Response unknown = client.request(http::verb::get, "/v1/does-not-exist");
  EXPECT_EQ(unknown.result_int(), 404);
  const Json error = Json::parse(unknown.body())["error"];
  EXPECT_EQ(error["type"], "invalid_request_error");
  EXPECT_EQ(error["code"], "unknown_url");
  EXPECT_TRUE(error["param"].is_null());
  EXPECT_FALSE(error["message"].get<std::string>().empty());

  const Response models = client.request(http::verb::get, "/v1/models");
  EXPECT_EQ(models.result_int(), 200);
  const Json list = Json::parse(models.body());
  EXPECT_EQ(list["object"], "list");
  EXPECT_EQ(list["data"][0]["id"], "mock-model");
  EXPECT_EQ(list["data"][0]["owned_by"], "sluice-mock");

  const Response wrong_method = client.request(http::verb::get, "/v1/chat/completions");
  EXPECT_EQ(wrong_method.result_int(), 405);
}

TEST(MockServer, InvalidJsonBodyIs400WithOpenAiError) {
  auto mock = start_mock();
  TestClient client(mock->port());
  const Response response = client.request(http::verb::post, "/v1/chat/completions", "{not json");
  EXPECT_EQ(response.result_int(), 400);
  EXPECT_EQ(Json::parse(response.body())["error"]["type"], "invalid_request_error");
  // The connection stays usable after a client error.
  EXPECT_EQ(client.post("/v1/chat/completions", chat_body()).result_int(), 200);
}

TEST(MockServer, StreamEventsArriveOneByOneAtTheInterval) {
  Behaviour behaviour;
  behaviour.tokens = 3;
  behaviour.interval = 300ms;
  auto mock = start_mock(behaviour);
  TestClient client(mock->port());
  ASSERT_FALSE(client.connect());

  const auto sent = Clock::now();
  ASSERT_FALSE(client.send(http::verb::post, "/v1/chat/completions",
                           chat_body("stream-model", true).dump()));
  ASSERT_FALSE(client.read_stream_head()) << client.last_error().message();
  EXPECT_EQ(client.stream_message().result_int(), 200);
  EXPECT_EQ(client.stream_message()[http::field::content_type], "text/event-stream");
  EXPECT_TRUE(client.stream_message().chunked());

  std::vector<Json> chunks;
  std::vector<Clock::duration> arrivals;
  while (auto event = client.next_event()) {
    arrivals.push_back(Clock::now() - sent);
    chunks.push_back(event_data(*event));
  }
  ASSERT_FALSE(client.last_error()) << client.last_error().message();
  EXPECT_TRUE(client.stream_done());

  // 3 tokens, the finish chunk, [DONE].
  ASSERT_EQ(chunks.size(), 5u);
  // The first event comes with the head, long before the second is due.
  EXPECT_LT(arrivals[0], 200ms);
  for (std::size_t i = 1; i < arrivals.size(); ++i) {
    EXPECT_GE(arrivals[i] - arrivals[i - 1], 200ms) << "event " << i << " came too early";
  }
  for (unsigned i = 0; i < 3; ++i) {
    EXPECT_EQ(chunks[i]["object"], "chat.completion.chunk");
    EXPECT_EQ(chunks[i]["model"], "stream-model");
    EXPECT_EQ(chunks[i]["choices"][0]["delta"]["content"], "tok" + std::to_string(i) + " ");
    EXPECT_TRUE(chunks[i]["choices"][0]["finish_reason"].is_null());
  }
  EXPECT_EQ(chunks[0]["choices"][0]["delta"]["role"], "assistant");
  EXPECT_FALSE(chunks[1]["choices"][0]["delta"].contains("role"));
  EXPECT_EQ(chunks[3]["choices"][0]["finish_reason"], "stop");
  EXPECT_FALSE(chunks[3].contains("usage"));
  EXPECT_TRUE(chunks[4].is_null());  // [DONE]
  EXPECT_TRUE(eventually([&] { return mock->stats().streams_completed == 1; }, 1s));
}

TEST(MockServer, StampedEventsOpenWithTheirSendTime) {
  Behaviour behaviour;
  behaviour.tokens = 3;
  behaviour.interval = 50ms;
  auto mock = start_mock(behaviour);
  TestClient client(mock->port());
  ASSERT_FALSE(client.connect());
  auto steady_ns = [] {
    return static_cast<std::uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
            .count());
  };

  const std::uint64_t before = steady_ns();
  ASSERT_FALSE(client.send(http::verb::post, "/v1/chat/completions",
                           chat_body("stamped", true).dump(), {{"x-mock-stamp", "1"}}));
  ASSERT_FALSE(client.read_stream_head()) << client.last_error().message();
  std::vector<std::string> events;
  std::vector<std::uint64_t> arrivals;
  while (auto event = client.next_event()) {
    arrivals.push_back(steady_ns());
    events.push_back(*event);
  }
  ASSERT_TRUE(client.stream_done()) << client.last_error().message();

  ASSERT_EQ(events.size(), 5u);  // 3 tokens, finish, [DONE]
  std::uint64_t previous = before;
  for (std::size_t i = 0; i < 4; ++i) {
    ASSERT_TRUE(events[i].starts_with(R"(data: {"sent_ns":)")) << events[i];
    const Json chunk = event_data(events[i]);
    const auto sent = chunk["sent_ns"].get<std::uint64_t>();
    // Sent after the request and the event before it, before its arrival.
    EXPECT_GE(sent, previous) << "event " << i;
    EXPECT_LE(sent, arrivals[i]) << "event " << i;
    if (i > 0) {
      EXPECT_GE(sent - previous, 40'000'000u) << "event " << i << ": 50 ms apart";
    }
    previous = sent;
    // The rest of the chunk is untouched.
    EXPECT_EQ(chunk["object"], "chat.completion.chunk");
    EXPECT_EQ(chunk["model"], "stamped");
  }
  EXPECT_TRUE(event_data(events[4]).is_null());  // [DONE]

  // Unasked, events carry no stamp; a value other than 0 or 1 is refused.
  ASSERT_FALSE(
      client.send(http::verb::post, "/v1/chat/completions", chat_body("plain", true).dump()));
  ASSERT_FALSE(client.read_stream_head());
  auto plain = client.next_event();
  ASSERT_TRUE(plain);
  EXPECT_FALSE(event_data(*plain).contains("sent_ns"));
  while (client.next_event()) {
  }
  EXPECT_EQ(client.post("/v1/chat/completions", chat_body("m", true), {{"x-mock-stamp", "yes"}})
                .result_int(),
            400);
  // POST /mock/behaviour turns it on for every later stream.
  EXPECT_EQ(client.post("/mock/behaviour", {{"stamp", true}}).result_int(), 204);
  EXPECT_TRUE(mock->behaviour().stamp);
  EXPECT_EQ(client.post("/mock/behaviour", {{"stamp", 1}}).result_int(), 400);
}

TEST(MockServer, SkipBodyAnswersWithoutParsingTheBody) {
  auto mock = start_mock();
  TestClient client(mock->port());
  ASSERT_FALSE(client.connect());
  // Not JSON at all: refused unless the body is to be skipped.
  const std::string not_json(4000, 'x');
  EXPECT_EQ(client.request(http::verb::post, "/v1/chat/completions", not_json).result_int(), 400);
  const Response skipped = client.request(http::verb::post, "/v1/chat/completions", not_json,
                                          {{"x-mock-skip-body", "1"}});
  ASSERT_EQ(skipped.result_int(), 200) << skipped.body();
  const Json answer = Json::parse(skipped.body());
  EXPECT_EQ(answer["object"], "chat.completion");
  EXPECT_EQ(answer["model"], "mock-model");
  EXPECT_EQ(answer["usage"]["prompt_tokens"], 1000);  // bytes / 4
  // A streaming body is answered unstreamed: its `stream` is never read.
  const Response unstreamed =
      client.request(http::verb::post, "/v1/chat/completions", chat_body("asked", true).dump(),
                     {{"x-mock-skip-body", "1"}});
  ASSERT_EQ(unstreamed.result_int(), 200);
  EXPECT_EQ(Json::parse(unstreamed.body())["model"], "mock-model");
  // Embeddings need their input: the header does not apply to them.
  EXPECT_EQ(
      client.request(http::verb::post, "/v1/embeddings", not_json, {{"x-mock-skip-body", "1"}})
          .result_int(),
      400);
  EXPECT_EQ(client
                .request(http::verb::post, "/v1/chat/completions", chat_body().dump(),
                         {{"x-mock-skip-body", "yes"}})
                .result_int(),
            400);
  EXPECT_EQ(mock->stats().requests, 5u);
}

TEST(MockServer, IncludeUsageAddsAUsageChunkBeforeDone) {
  Behaviour behaviour;
  behaviour.tokens = 2;
  auto mock = start_mock(behaviour);
  TestClient client(mock->port());
  ASSERT_FALSE(client.connect());
  ASSERT_FALSE(client.send(http::verb::post, "/v1/chat/completions",
                           chat_body("m", true, true, std::string(20, 'a')).dump()));
  ASSERT_FALSE(client.read_stream_head());
  std::vector<Json> chunks;
  while (auto event = client.next_event()) chunks.push_back(event_data(*event));
  ASSERT_TRUE(client.stream_done()) << client.last_error().message();

  ASSERT_EQ(chunks.size(), 5u);  // 2 tokens, finish, usage, [DONE]
  for (unsigned i = 0; i < 3; ++i) {
    ASSERT_TRUE(chunks[i].contains("usage")) << i;
    EXPECT_TRUE(chunks[i]["usage"].is_null()) << i;
  }
  EXPECT_EQ(chunks[2]["choices"][0]["finish_reason"], "stop");
  EXPECT_TRUE(chunks[3]["choices"].empty());
  EXPECT_EQ(chunks[3]["usage"]["prompt_tokens"], 5);
  EXPECT_EQ(chunks[3]["usage"]["completion_tokens"], 2);
  EXPECT_EQ(chunks[3]["usage"]["total_tokens"], 7);
  EXPECT_TRUE(chunks[4].is_null());

  // The connection is kept alive after a completed stream.
  EXPECT_EQ(client.post("/v1/chat/completions", chat_body()).result_int(), 200);
  EXPECT_EQ(mock->stats().connections_accepted, 1u);
}

TEST(MockServer, CompletionsServeTextCompletionObjects) {
  Behaviour behaviour;
  behaviour.tokens = 2;
  auto mock = start_mock(behaviour);
  TestClient client(mock->port());
  const Json request = {{"model", "legacy"}, {"prompt", "say something"}};
  const Response response = client.post("/v1/completions", request);
  ASSERT_EQ(response.result_int(), 200);
  const Json body = Json::parse(response.body());
  EXPECT_EQ(body["object"], "text_completion");
  EXPECT_EQ(body["model"], "legacy");
  EXPECT_EQ(body["choices"][0]["text"], "tok0 tok1 ");
  EXPECT_EQ(body["usage"]["completion_tokens"], 2);

  Json stream_request = request;
  stream_request["stream"] = true;
  ASSERT_FALSE(client.send(http::verb::post, "/v1/completions", stream_request.dump()));
  ASSERT_FALSE(client.read_stream_head());
  std::vector<Json> chunks;
  while (auto event = client.next_event()) chunks.push_back(event_data(*event));
  ASSERT_EQ(chunks.size(), 4u);
  EXPECT_EQ(chunks[0]["object"], "text_completion");
  EXPECT_EQ(chunks[1]["choices"][0]["text"], "tok1 ");
  EXPECT_EQ(chunks[2]["choices"][0]["finish_reason"], "stop");
  EXPECT_TRUE(chunks[3].is_null());
}

TEST(MockServer, ResponsesApiServesObjectsAndNamedEvents) {
  Behaviour behaviour;
  behaviour.tokens = 2;
  auto mock = start_mock(behaviour);
  TestClient client(mock->port());
  const Json request = {{"model", "resp-model"}, {"input", "abcdefgh"}};
  const Response response = client.post("/v1/responses", request);
  ASSERT_EQ(response.result_int(), 200);
  const Json body = Json::parse(response.body());
  EXPECT_EQ(body["object"], "response");
  EXPECT_TRUE(body["id"].get<std::string>().starts_with("resp_"));
  EXPECT_EQ(body["model"], "resp-model");
  EXPECT_EQ(body["output"][0]["type"], "message");
  EXPECT_EQ(body["output"][0]["role"], "assistant");
  EXPECT_EQ(body["output"][0]["content"][0]["type"], "output_text");
  EXPECT_EQ(body["output"][0]["content"][0]["text"], "tok0 tok1 ");
  EXPECT_EQ(body["usage"]["input_tokens"], 2);
  EXPECT_EQ(body["usage"]["output_tokens"], 2);
  EXPECT_EQ(body["usage"]["total_tokens"], 4);

  Json stream_request = request;
  stream_request["stream"] = true;
  ASSERT_FALSE(client.send(http::verb::post, "/v1/responses", stream_request.dump()));
  ASSERT_FALSE(client.read_stream_head());
  std::vector<std::string> events;
  while (auto event = client.next_event()) events.push_back(*event);
  ASSERT_TRUE(client.stream_done());
  ASSERT_EQ(events.size(), 3u);
  EXPECT_TRUE(events[0].starts_with("event: response.output_text.delta\ndata: "));
  EXPECT_EQ(event_data(events[1])["delta"], "tok1 ");
  EXPECT_TRUE(events[2].starts_with("event: response.completed\ndata: "));
  EXPECT_EQ(event_data(events[2])["response"]["output"][0]["content"][0]["text"], "tok0 tok1 ");
}

TEST(MockServer, EmbeddingsAreDeterministicNormalisedAndSimilarForSimilarTexts) {
  auto mock = start_mock();
  TestClient client(mock->port());
  const Json request = {{"model", "embed-model"},
                        {"input",
                         {"The quick brown fox jumps over the lazy dog",
                          "the quick brown fox jumped over the lazy dog!",
                          "Quarterly revenue projections exceeded analyst expectations"}}};
  const Headers dims = {{"x-mock-dims", "256"}};
  const Response first = client.post("/v1/embeddings", request, dims);
  const Response second = client.post("/v1/embeddings", request, dims);
  ASSERT_EQ(first.result_int(), 200);
  EXPECT_EQ(first.body(), second.body());

  const Json body = Json::parse(first.body());
  EXPECT_EQ(body["object"], "list");
  EXPECT_EQ(body["model"], "embed-model");
  EXPECT_GT(body["usage"]["prompt_tokens"], 0);
  ASSERT_EQ(body["data"].size(), 3u);
  std::vector<std::vector<double>> vectors;
  for (std::size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(body["data"][i]["object"], "embedding");
    EXPECT_EQ(body["data"][i]["index"], i);
    auto vector = body["data"][i]["embedding"].get<std::vector<double>>();
    ASSERT_EQ(vector.size(), 256u);
    double norm = 0;
    for (double component : vector) norm += component * component;
    EXPECT_NEAR(std::sqrt(norm), 1.0, 1e-5);
    vectors.push_back(std::move(vector));
  }
  EXPECT_GT(cosine(vectors[0], vectors[1]), 0.75);
  EXPECT_LT(cosine(vectors[0], vectors[2]), 0.3);

  // A single string and the default dimensions.
  const Response single = client.post("/v1/embeddings", {{"model", "e"}, {"input", "hello"}});
  const Json single_body = Json::parse(single.body());
  ASSERT_EQ(single_body["data"].size(), 1u);
  EXPECT_EQ(single_body["data"][0]["embedding"].size(), 16u);
}

TEST(MockServer, HeaderOverridesApplyToThatRequestOnly) {
  auto mock = start_mock();
  TestClient client(mock->port());
  const Response overridden =
      client.post("/v1/chat/completions", chat_body(), {{"X-Mock-Tokens", "3"}});
  EXPECT_EQ(Json::parse(overridden.body())["choices"][0]["message"]["content"],
            expected_content(3));
  const Response normal = client.post("/v1/chat/completions", chat_body());
  EXPECT_EQ(Json::parse(normal.body())["choices"][0]["message"]["content"], expected_content(8));

  const Response failing =
      client.post("/v1/chat/completions", chat_body(), {{"x-mock-fail", "503"}});
  EXPECT_EQ(failing.result_int(), 503);
  EXPECT_EQ(Json::parse(failing.body())["error"]["type"], "server_error");

  const Response invalid =
      client.post("/v1/chat/completions", chat_body(), {{"x-mock-tokens", "many"}});
  EXPECT_EQ(invalid.result_int(), 400);
  const Response unknown_mode =
      client.post("/v1/chat/completions", chat_body(), {{"x-mock-fail", "explode"}});
  EXPECT_EQ(unknown_mode.result_int(), 400);
}

TEST(MockServer, TtftDelaysTheResponse) {
  auto mock = start_mock();
  TestClient client(mock->port());
  ASSERT_FALSE(client.connect());
  auto started = Clock::now();
  EXPECT_EQ(
      client.post("/v1/chat/completions", chat_body(), {{"x-mock-ttft-ms", "250"}}).result_int(),
      200);
  EXPECT_GE(Clock::now() - started, 240ms);

  // 400 characters = 100 estimated prompt tokens, at 2 ms each.
  started = Clock::now();
  EXPECT_EQ(client
                .post("/v1/chat/completions", chat_body("m", false, false, std::string(400, 'y')),
                      {{"x-mock-ttft-per-token-us", "2000"}})
                .result_int(),
            200);
  EXPECT_GE(Clock::now() - started, 190ms);
}

TEST(MockServer, AcceptDelayHoldsOnlyAFreshConnection) {
  Behaviour behaviour;
  behaviour.accept_delay = 150ms;
  auto mock = start_mock(behaviour);
  TestClient client(mock->port());
  auto started = Clock::now();
  EXPECT_EQ(client.post("/v1/chat/completions", chat_body()).result_int(), 200);
  EXPECT_GE(Clock::now() - started, 140ms);

  // The same connection again: the hold was paid once, on arrival.
  started = Clock::now();
  EXPECT_EQ(client.post("/v1/chat/completions", chat_body()).result_int(), 200);
  EXPECT_LT(Clock::now() - started, 100ms);
  EXPECT_EQ(mock->stats().connections_accepted, 1u);
}

TEST(MockServer, ScriptedErrorStatusesFollowOpenAiConventions) {
  auto mock = start_mock();
  TestClient client(mock->port());

  const Response server_error =
      client.post("/v1/chat/completions", chat_body(), {{"x-mock-fail", "500"}});
  EXPECT_EQ(server_error.result_int(), 500);
  EXPECT_EQ(Json::parse(server_error.body())["error"]["type"], "server_error");

  const Response limited = client.post("/v1/chat/completions", chat_body(),
                                       {{"x-mock-fail", "429"}, {"x-mock-retry-after", "7"}});
  EXPECT_EQ(limited.result_int(), 429);
  EXPECT_EQ(limited[http::field::retry_after], "7");
  EXPECT_EQ(Json::parse(limited.body())["error"]["code"], "rate_limit_exceeded");

  const Response context =
      client.post("/v1/chat/completions", chat_body(), {{"x-mock-fail", "context"}});
  EXPECT_EQ(context.result_int(), 400);
  const Json context_error = Json::parse(context.body())["error"];
  EXPECT_EQ(context_error["code"], "context_length_exceeded");
  EXPECT_EQ(context_error["type"], "invalid_request_error");
  EXPECT_TRUE(context_error["message"].get<std::string>().starts_with(
      "This model's maximum context length is 8192 tokens"));

  const Response rejected =
      client.post("/v1/chat/completions", chat_body(), {{"x-mock-fail", "400"}});
  EXPECT_EQ(rejected.result_int(), 400);
  EXPECT_EQ(Json::parse(rejected.body())["error"]["type"], "invalid_request_error");

  // Like OpenAI's, the 401 quotes the key it was sent.
  const Response unauthorized =
      client.post("/v1/chat/completions", chat_body(),
                  {{"x-mock-fail", "401"}, {"Authorization", "Bearer sk-quoted-123"}});
  EXPECT_EQ(unauthorized.result_int(), 401);
  const Json unauthorized_error = Json::parse(unauthorized.body())["error"];
  EXPECT_EQ(unauthorized_error["code"], "invalid_api_key");
  EXPECT_NE(unauthorized_error["message"].get<std::string>().find("sk-quoted-123"),
            std::string::npos);

  // A streaming request fails the same way, with a JSON error instead of a stream.
  const Response stream_error =
      client.post("/v1/chat/completions", chat_body("m", true), {{"x-mock-fail", "500"}});
  EXPECT_EQ(stream_error.result_int(), 500);
  EXPECT_EQ(stream_error[http::field::content_type], "application/json");
}

TEST(MockServer, FailRateFailsOnlySomeRequests) {
  Behaviour behaviour;
  behaviour.fail = "500";
  behaviour.fail_rate = 0.5;
  auto mock = start_mock(behaviour);
  TestClient client(mock->port());
  int failures = 0;
  int successes = 0;
  for (int i = 0; i < 60; ++i) {
    const unsigned status = client.post("/v1/chat/completions", chat_body()).result_int();
    failures += status == 500;
    successes += status == 200;
  }
  EXPECT_EQ(failures + successes, 60);
  EXPECT_GT(failures, 10);
  EXPECT_GT(successes, 10);

  const Response never =
      client.post("/v1/chat/completions", chat_body(), {{"x-mock-fail-rate", "0"}});
  EXPECT_EQ(never.result_int(), 200);
}

TEST(MockServer, StatsCountConnectionsAndRequests) {
  auto mock = start_mock();
  {
    TestClient client(mock->port());
    EXPECT_EQ(client.post("/v1/chat/completions", chat_body()).result_int(), 200);
    EXPECT_EQ(client.post("/v1/chat/completions", chat_body()).result_int(), 200);
    const Stats stats = mock->stats();
    EXPECT_EQ(stats.connections_accepted, 1u);
    EXPECT_EQ(stats.open_connections, 1u);
    EXPECT_EQ(stats.requests, 2u);

    // The control endpoint reports the same numbers and is not counted itself.
    const Response reported = client.request(http::verb::get, "/mock/stats");
    ASSERT_EQ(reported.result_int(), 200);
    const Json json = Json::parse(reported.body());
    EXPECT_EQ(json["connections_accepted"], 1);
    EXPECT_EQ(json["open_connections"], 1);
    EXPECT_EQ(json["requests"], 2);
    EXPECT_EQ(json["streams_completed"], 0);
    EXPECT_EQ(json["streams_cancelled"], 0);
    client.close();
  }
  EXPECT_TRUE(eventually([&] { return mock->stats().open_connections == 0; }, 1s));
  TestClient second(mock->port());
  EXPECT_EQ(second.request(http::verb::get, "/v1/models").result_int(), 200);
  EXPECT_EQ(mock->stats().connections_accepted, 2u);
  EXPECT_EQ(mock->stats().requests, 3u);
}

TEST(MockServer, PeerCloseMidStreamIsNoticedWhileTheMockSleeps) {
  Behaviour behaviour;
  behaviour.interval = 2s;
  behaviour.tokens = 5;
  auto mock = start_mock(behaviour);
  TestClient client(mock->port());
  ASSERT_FALSE(client.connect());
  ASSERT_FALSE(client.send(http::verb::post, "/v1/chat/completions", chat_body("m", true).dump()));
  ASSERT_FALSE(client.read_stream_head());
  ASSERT_TRUE(client.next_event().has_value());
  EXPECT_EQ(mock->stats().open_connections, 1u);

  // The mock is now sleeping two seconds before the next event.
  const auto closed_at = Clock::now();
  client.close();
  EXPECT_TRUE(eventually([&] { return mock->stats().streams_cancelled == 1; }, 100ms))
      << "the close was not noticed within 100 ms";
  EXPECT_TRUE(eventually([&] { return mock->stats().open_connections == 0; }, 100ms));
  EXPECT_LT(Clock::now() - closed_at, 150ms);
  EXPECT_EQ(mock->stats().streams_completed, 0u);
}

TEST(MockServer, BehaviourEndpointReplacesDefaults) {
  auto mock = start_mock();
  TestClient client(mock->port());
  const Response updated =
      client.post("/mock/behaviour", {{"tokens", 2}, {"fail", "429"}, {"retry_after", 9}});
  EXPECT_EQ(updated.result_int(), 204);
  EXPECT_EQ(mock->behaviour().tokens, 2u);

  const Response limited = client.post("/v1/chat/completions", chat_body());
  EXPECT_EQ(limited.result_int(), 429);
  EXPECT_EQ(limited[http::field::retry_after], "9");

  // Omitted fields keep their value: tokens stays 2.
  EXPECT_EQ(client.post("/mock/behaviour", {{"fail", ""}}).result_int(), 204);
  const Response normal = client.post("/v1/chat/completions", chat_body());
  EXPECT_EQ(normal.result_int(), 200);
  EXPECT_EQ(Json::parse(normal.body())["choices"][0]["message"]["content"], "tok0 tok1 ");

  EXPECT_EQ(client.post("/mock/behaviour", {{"fail", "sometimes"}}).result_int(), 400);
  EXPECT_EQ(client.post("/mock/behaviour", {{"tokenz", 1}}).result_int(), 400);
  EXPECT_EQ(client.post("/mock/behaviour", {{"fail_rate", 2.0}}).result_int(), 400);
  EXPECT_EQ(mock->behaviour().fail, "");

  // Control requests are neither counted nor recorded.
  EXPECT_EQ(mock->stats().requests, 2u);
  EXPECT_EQ(mock->recent_requests().size(), 2u);
}

TEST(MockServer, SetBehaviourAppliesToLaterRequests) {
  auto mock = start_mock();
  TestClient client(mock->port());
  Behaviour behaviour;
  behaviour.tokens = 1;
  behaviour.dims = 4;
  mock->set_behaviour(behaviour);
  EXPECT_EQ(Json::parse(client.post("/v1/chat/completions", chat_body())
                            .body())["choices"][0]["message"]["content"],
            "tok0 ");
  EXPECT_EQ(
      Json::parse(client.post("/v1/embeddings", {{"input", "x"}}).body())["data"][0]["embedding"]
          .size(),
      4u);
  behaviour.fail = "not-a-mode";
  EXPECT_THROW(mock->set_behaviour(behaviour), std::invalid_argument);
}

TEST(MockServer, RecordsRecentRequestsOldestFirst) {
  auto mock = start_mock();
  TestClient client(mock->port());
  for (int i = 0; i < 70; ++i) {
    ASSERT_EQ(client
                  .post("/v1/chat/completions", chat_body("model-" + std::to_string(i)),
                        {{"X-Request-Number", std::to_string(i)}})
                  .result_int(),
              200);
  }
  const auto recorded = mock->recent_requests();
  ASSERT_EQ(recorded.size(), 64u);
  EXPECT_EQ(recorded.front().header("x-request-number"), "6");
  EXPECT_EQ(recorded.back().header("X-REQUEST-NUMBER"), "69");
  EXPECT_EQ(recorded.back().method, "POST");
  EXPECT_EQ(recorded.back().target, "/v1/chat/completions");
  EXPECT_EQ(Json::parse(recorded.back().body)["model"], "model-69");
  EXPECT_FALSE(recorded.back().header("x-not-sent").has_value());

  mock->clear_recorded();
  EXPECT_TRUE(mock->recent_requests().empty());
}

TEST(MockServer, ResetClosesWithAnRstAndNoResponse) {
  auto mock = start_mock();
  TestClient client(mock->port());
  client.post("/v1/chat/completions", chat_body(), {{"x-mock-fail", "reset"}});
  EXPECT_EQ(client.last_error(), asio::error::connection_reset) << client.last_error().message();
}

TEST(MockServer, GarbageIsNotHttp) {
  auto mock = start_mock();
  TestClient client(mock->port());
  ASSERT_FALSE(client.connect());
  ASSERT_FALSE(client.send(http::verb::post, "/v1/chat/completions", chat_body().dump(),
                           {{"x-mock-fail", "garbage"}}));
  boost::system::error_code error;
  const std::string raw = client.read_raw_until_close(error);
  EXPECT_EQ(raw, "this is not http\r\n\r\n");
  EXPECT_EQ(error, asio::error::eof) << error.message();
}

TEST(MockServer, TruncatedStreamEndsWithoutTheTerminatingChunk) {
  auto mock = start_mock();
  TestClient client(mock->port());
  ASSERT_FALSE(client.connect());
  ASSERT_FALSE(client.send(http::verb::post, "/v1/chat/completions", chat_body("m", true).dump(),
                           {{"x-mock-fail", "truncate"}}));
  ASSERT_FALSE(client.read_stream_head());
  int events = 0;
  while (client.next_event()) ++events;
  EXPECT_EQ(events, 3);
  EXPECT_FALSE(client.stream_done());
  EXPECT_EQ(client.last_error(), http::error::partial_message) << client.last_error().message();
}

TEST(MockServer, ResetMidStreamSendsHalfTheEventsThenAnRst) {
  auto mock = start_mock();
  TestClient client(mock->port());
  ASSERT_FALSE(client.connect());
  // 8 tokens + finish + [DONE] = 10 events; half of them arrive.
  ASSERT_FALSE(client.send(http::verb::post, "/v1/chat/completions", chat_body("m", true).dump(),
                           {{"x-mock-fail", "reset-mid"}, {"x-mock-interval-ms", "5"}}));
  ASSERT_FALSE(client.read_stream_head());
  int events = 0;
  while (client.next_event()) ++events;
  EXPECT_EQ(events, 5);
  EXPECT_EQ(client.last_error(), asio::error::connection_reset) << client.last_error().message();
}

TEST(MockServer, StallMidSendsTheFirstEventThenWaits) {
  auto mock = start_mock();
  TestClient client(mock->port());
  ASSERT_FALSE(client.connect());
  ASSERT_FALSE(client.send(http::verb::post, "/v1/chat/completions", chat_body("m", true).dump(),
                           {{"x-mock-fail", "stall-mid"}, {"x-mock-stall-ms", "400"}}));
  const auto sent = Clock::now();
  ASSERT_FALSE(client.read_stream_head());
  ASSERT_TRUE(client.next_event().has_value());
  EXPECT_LT(Clock::now() - sent, 300ms);
  ASSERT_TRUE(client.next_event().has_value());
  EXPECT_GE(Clock::now() - sent, 350ms);
  while (client.next_event()) {
  }
  EXPECT_TRUE(client.stream_done());
}

TEST(MockServer, StallDelaysEverythingThenAnswers) {
  auto mock = start_mock();
  TestClient client(mock->port());
  const auto sent = Clock::now();
  const Response response = client.post("/v1/chat/completions", chat_body(),
                                        {{"x-mock-fail", "stall"}, {"x-mock-stall-ms", "300"}});
  EXPECT_EQ(response.result_int(), 200);
  EXPECT_GE(Clock::now() - sent, 290ms);
}

TEST(MockServer, EndlessStreamRunsUntilThePeerLeaves) {
  auto mock = start_mock();
  TestClient client(mock->port());
  ASSERT_FALSE(client.connect());
  ASSERT_FALSE(client.send(http::verb::post, "/v1/chat/completions", chat_body("m", true).dump(),
                           {{"x-mock-fail", "endless"}, {"x-mock-tokens", "2"}}));
  ASSERT_FALSE(client.read_stream_head());
  for (int i = 0; i < 30; ++i) {
    auto event = client.next_event();
    ASSERT_TRUE(event.has_value()) << "event " << i << ": " << client.last_error().message();
    EXPECT_EQ(event_data(*event)["choices"][0]["delta"]["content"],
              "tok" + std::to_string(i) + " ");
  }
  client.close();
  EXPECT_TRUE(eventually([&] { return mock->stats().streams_cancelled == 1; }, 500ms));
}

TEST(MockServer, DripSendsTheStreamByteByByte) {
  auto mock = start_mock();
  TestClient client(mock->port());
  ASSERT_FALSE(client.connect());
  ASSERT_FALSE(
      client.send(http::verb::post, "/v1/chat/completions", chat_body("m", true).dump(),
                  {{"x-mock-fail", "drip"}, {"x-mock-tokens", "1"}, {"x-mock-interval-ms", "1"}}));
  ASSERT_FALSE(client.read_stream_head());
  std::vector<Json> chunks;
  while (auto event = client.next_event()) chunks.push_back(event_data(*event));
  ASSERT_TRUE(client.stream_done()) << client.last_error().message();
  ASSERT_EQ(chunks.size(), 3u);
  EXPECT_EQ(chunks[0]["choices"][0]["delta"]["content"], "tok0 ");
  // The body alone is hundreds of bytes, each in its own segment.
  EXPECT_GT(client.stream_reads(), 100u);
}

std::pair<std::string, std::string> make_self_signed_certificate() {
  std::unique_ptr<EVP_PKEY, decltype(&EVP_PKEY_free)> key(EVP_EC_gen("P-256"), EVP_PKEY_free);
  std::unique_ptr<X509, decltype(&X509_free)> cert(X509_new(), X509_free);
  if (!key || !cert) return {};
  X509_set_version(cert.get(), 2);
  ASN1_INTEGER_set(X509_get_serialNumber(cert.get()), 1);
  X509_gmtime_adj(X509_getm_notBefore(cert.get()), -60);
  X509_gmtime_adj(X509_getm_notAfter(cert.get()), 3600);
  X509_set_pubkey(cert.get(), key.get());
  X509_NAME* name = X509_get_subject_name(cert.get());
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC,
                             reinterpret_cast<const unsigned char*>("localhost"), -1, -1, 0);
  X509_set_issuer_name(cert.get(), name);
  X509V3_CTX context;
  X509V3_set_ctx_nodb(&context);
  X509V3_set_ctx(&context, cert.get(), cert.get(), nullptr, nullptr, 0);
  X509_EXTENSION* san =
      X509V3_EXT_conf_nid(nullptr, &context, NID_subject_alt_name, "DNS:localhost,IP:127.0.0.1");
  if (san == nullptr) return {};
  X509_add_ext(cert.get(), san, -1);
  X509_EXTENSION_free(san);
  if (X509_sign(cert.get(), key.get(), EVP_sha256()) == 0) return {};

  auto to_pem = [](auto write) {
    std::unique_ptr<BIO, decltype(&BIO_free)> bio(BIO_new(BIO_s_mem()), BIO_free);
    write(bio.get());
    char* data = nullptr;
    const long size = BIO_get_mem_data(bio.get(), &data);
    return std::string(data, static_cast<std::size_t>(size));
  };
  std::string cert_pem = to_pem([&](BIO* bio) { PEM_write_bio_X509(bio, cert.get()); });
  std::string key_pem = to_pem([&](BIO* bio) {
    PEM_write_bio_PrivateKey(bio, key.get(), nullptr, nullptr, 0, nullptr, nullptr);
  });
  return {std::move(cert_pem), std::move(key_pem)};
}

TEST(MockServer, ServesHttpsWhenGivenACertificate) {
  auto [cert_pem, key_pem] = make_self_signed_certificate();
  ASSERT_FALSE(cert_pem.empty());
  ASSERT_FALSE(key_pem.empty());
  auto mock = start_mock({}, cert_pem, key_pem);
  EXPECT_EQ(mock->base_url(), "https://127.0.0.1:" + std::to_string(mock->port()) + "/v1");

  TestClient client(mock->port(), /*tls=*/true);
  const Response response = client.post("/v1/chat/completions", chat_body("tls-model"));
  ASSERT_FALSE(client.last_error()) << client.last_error().message();
  EXPECT_EQ(response.result_int(), 200);
  EXPECT_EQ(Json::parse(response.body())["model"], "tls-model");

  // Streaming works over TLS too, with the peer-close watch in place.
  ASSERT_FALSE(client.send(http::verb::post, "/v1/chat/completions",
                           chat_body("tls-model", true).dump(), {{"x-mock-tokens", "2"}}));
  ASSERT_FALSE(client.read_stream_head());
  int events = 0;
  while (client.next_event()) ++events;
  EXPECT_TRUE(client.stream_done()) << client.last_error().message();
  EXPECT_EQ(events, 4);

  // A plain-HTTP client gets no HTTP answer from the TLS port.
  TestClient plain(mock->port());
  plain.post("/v1/models", {});
  EXPECT_TRUE(plain.last_error());
}

TEST(MockServer, AnswersExpectContinueBeforeTheBodyIsSent) {
  auto mock = start_mock();
  TestClient client(mock->port());
  ASSERT_FALSE(client.connect());
  const std::string body = chat_body("patient").dump();
  ASSERT_FALSE(
      client.write_raw("POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                       "Content-Type: application/json\r\nExpect: 100-continue\r\n"
                       "Content-Length: " +
                       std::to_string(body.size()) + "\r\n\r\n"));
  const Response interim = client.read_response();
  ASSERT_FALSE(client.last_error()) << client.last_error().message();
  EXPECT_EQ(interim.result_int(), 100);
  ASSERT_FALSE(client.write_raw(body));
  const Response response = client.read_response();
  EXPECT_EQ(response.result_int(), 200);
  EXPECT_EQ(Json::parse(response.body())["model"], "patient");
}

TEST(MockServer, ServesConcurrentStreamsOnSeveralThreads) {
  MockServer::Options options;
  options.threads = 2;
  options.behaviour.tokens = 20;
  options.behaviour.interval = 1ms;
  MockServer mock(options);
  mock.start();
  constexpr int kClients = 8;
  constexpr int kStreamsPerClient = 5;
  std::vector<int> complete_streams(kClients, 0);
  std::vector<std::thread> clients;
  for (int c = 0; c < kClients; ++c) {
    clients.emplace_back([&, c] {
      TestClient client(mock.port());
      if (client.connect()) return;
      for (int s = 0; s < kStreamsPerClient; ++s) {
        if (client.send(http::verb::post, "/v1/chat/completions", chat_body("m", true).dump())) {
          return;
        }
        if (client.read_stream_head()) return;
        int events = 0;
        while (client.next_event()) ++events;
        if (client.stream_done() && events == 22) ++complete_streams[c];
      }
    });
  }
  for (auto& client : clients) client.join();
  for (int c = 0; c < kClients; ++c) EXPECT_EQ(complete_streams[c], kStreamsPerClient) << c;
  const Stats stats = mock.stats();
  EXPECT_EQ(stats.connections_accepted, static_cast<std::uint64_t>(kClients));
  EXPECT_EQ(stats.requests, static_cast<std::uint64_t>(kClients * kStreamsPerClient));
  // The client can see the last chunk a moment before the server has
  // finished its write and counted the stream.
  EXPECT_TRUE(eventually(
      [&] { return mock.stats().streams_completed == kClients * kStreamsPerClient; }, 1s));
  EXPECT_EQ(stats.streams_cancelled, 0u);
}

TEST(MockServer, StopClosesOpenConnectionsAndIsIdempotent) {
  Behaviour behaviour;
  behaviour.interval = 5s;
  auto mock = start_mock(behaviour);
  TestClient client(mock->port());
  ASSERT_FALSE(client.connect());
  ASSERT_FALSE(client.send(http::verb::post, "/v1/chat/completions", chat_body("m", true).dump()));
  ASSERT_FALSE(client.read_stream_head());
  ASSERT_TRUE(client.next_event().has_value());

  const auto stopping = Clock::now();
  mock->stop();
  EXPECT_LT(Clock::now() - stopping, 1s);
  mock->stop();
  EXPECT_FALSE(client.next_event(1000ms).has_value());
  EXPECT_TRUE(client.last_error());
  EXPECT_NE(client.last_error(), asio::error::timed_out);
}

// ---------------------------------------------------------------------------
// Anthropic Messages (/v1/messages)

const Headers kAnthropicHeaders = {{"anthropic-version", "2023-06-01"},
                                   {"x-api-key", "sk-ant-test"}};

Json messages_body(std::string model = "claude-test", bool stream = false,
                   std::string content = "hello") {
  Json body = {{"model", std::move(model)},
               {"max_tokens", 256},
               {"messages", Json::array({{{"role", "user"}, {"content", std::move(content)}}})}};
  if (stream) body["stream"] = true;
  return body;
}

Headers with_anthropic_headers(Headers extra) {
  Headers headers = kAnthropicHeaders;
  headers.insert(headers.end(), extra.begin(), extra.end());
  return headers;
}

struct NamedEvent {
  std::string name;  // from the "event:" line
  Json data;
};

// "event: NAME\ndata: JSON\n\n"
NamedEvent named_event(const std::string& event) {
  constexpr std::string_view kEvent = "event: ";
  if (!event.starts_with(kEvent)) return {"", Json::object({{"unnamed", event}})};
  const auto line_end = event.find('\n');
  return {event.substr(kEvent.size(), line_end - kEvent.size()), event_data(event)};
}

std::vector<NamedEvent> read_named_events(TestClient& client) {
  std::vector<NamedEvent> events;
  while (auto event = client.next_event()) events.push_back(named_event(*event));
  return events;
}

// Checks the block structure every Anthropic stream keeps: message_start
// first, message_stop last, and each block's deltas between its
// content_block_start and content_block_stop, the blocks numbered 0, 1, ...
// in order. Returns the type of each block started.
std::vector<std::string> expect_well_formed_blocks(const std::vector<NamedEvent>& events) {
  std::vector<std::string> block_types;
  std::optional<std::size_t> open_block;
  for (const auto& [name, data] : events) {
    EXPECT_EQ(data["type"], name) << "the data's type repeats the event's name";
    if (name == "content_block_start") {
      EXPECT_FALSE(open_block.has_value()) << "a block started inside another";
      EXPECT_EQ(data["index"], block_types.size());
      open_block = data["index"].get<std::size_t>();
      block_types.push_back(data["content_block"]["type"]);
    } else if (name == "content_block_delta") {
      if (!open_block) {
        ADD_FAILURE() << "a delta outside a block";
        continue;
      }
      EXPECT_EQ(data["index"], *open_block);
    } else if (name == "content_block_stop") {
      if (!open_block) {
        ADD_FAILURE() << "a stop outside a block";
        continue;
      }
      EXPECT_EQ(data["index"], *open_block);
      open_block.reset();
    }
  }
  EXPECT_FALSE(open_block.has_value()) << "a block was never stopped";
  if (!events.empty()) {
    EXPECT_EQ(events.front().name, "message_start");
    EXPECT_EQ(events.back().name, "message_stop");
  }
  return block_types;
}

TEST(MockAnthropic, MessageHasAnthropicShapeAndEchoesModel) {
  auto mock = start_mock();
  TestClient client(mock->port());
  // 40 characters of content: an estimate of 10 input tokens.
  const Response response =
      client.post("/v1/messages", messages_body("claude-echoed", false, std::string(40, 'x')),
                  with_anthropic_headers(
                      {{"x-mock-cache-read-tokens", "5"}, {"x-mock-cache-creation-tokens", "7"}}));
  ASSERT_FALSE(client.last_error()) << client.last_error().message();
  EXPECT_EQ(response.result_int(), 200);
  EXPECT_EQ(response[http::field::content_type], "application/json");

  const Json body = Json::parse(response.body());
  EXPECT_TRUE(body["id"].get<std::string>().starts_with("msg_"));
  EXPECT_EQ(body["type"], "message");
  EXPECT_EQ(body["role"], "assistant");
  EXPECT_EQ(body["model"], "claude-echoed");
  ASSERT_EQ(body["content"].size(), 1u);
  EXPECT_EQ(body["content"][0]["type"], "text");
  EXPECT_EQ(body["content"][0]["text"], expected_content(8));
  EXPECT_EQ(body["stop_reason"], "end_turn");
  EXPECT_TRUE(body["stop_sequence"].is_null());
  EXPECT_EQ(body["usage"]["input_tokens"], 10);
  EXPECT_EQ(body["usage"]["output_tokens"], 8);
  EXPECT_EQ(body["usage"]["cache_read_input_tokens"], 5);
  EXPECT_EQ(body["usage"]["cache_creation_input_tokens"], 7);

  // The same token count rules as the OpenAI answers.
  const Response short_answer = client.post("/v1/messages", messages_body(),
                                            with_anthropic_headers({{"x-mock-tokens", "2"}}));
  EXPECT_EQ(Json::parse(short_answer.body())["content"][0]["text"], "tok0 tok1 ");

  const auto recorded = mock->recent_requests();
  ASSERT_FALSE(recorded.empty());
  EXPECT_EQ(recorded.back().target, "/v1/messages");
  EXPECT_EQ(recorded.back().header("anthropic-version"), "2023-06-01");
}

TEST(MockAnthropic, CountTokensEstimatesTheMessagesAndSystem) {
  auto mock = start_mock();
  TestClient client(mock->port());
  Json body = messages_body("claude-test", false, std::string(40, 'x'));
  body.erase("max_tokens");
  body["system"] = std::string(20, 's');
  const Response response = client.post("/v1/messages/count_tokens", body, kAnthropicHeaders);
  EXPECT_EQ(response.result_int(), 200);
  EXPECT_EQ(Json::parse(response.body()), Json({{"input_tokens", 15}}));
}

TEST(MockAnthropic, RequiresAnthropicVersionAndTheRequiredFields) {
  auto mock = start_mock();
  TestClient client(mock->port());
  // No x-api-key is needed: like Authorization on the OpenAI paths, it is
  // never checked.
  const Response no_version =
      client.post("/v1/messages", messages_body(), {{"x-api-key", "sk-ant-test"}});
  EXPECT_EQ(no_version.result_int(), 400);
  const Json error = Json::parse(no_version.body());
  EXPECT_EQ(error["type"], "error");
  EXPECT_EQ(error["error"]["type"], "invalid_request_error");
  EXPECT_NE(error["error"]["message"].get<std::string>().find("anthropic-version"),
            std::string::npos);

  Json no_max_tokens = messages_body();
  no_max_tokens.erase("max_tokens");
  const Response missing = client.post("/v1/messages", no_max_tokens, kAnthropicHeaders);
  EXPECT_EQ(missing.result_int(), 400);
  EXPECT_EQ(Json::parse(missing.body())["error"]["type"], "invalid_request_error");

  const Response not_json =
      client.request(http::verb::post, "/v1/messages", "{not json", kAnthropicHeaders);
  EXPECT_EQ(not_json.result_int(), 400);
  EXPECT_EQ(Json::parse(not_json.body())["type"], "error");

  const Response wrong_method =
      client.request(http::verb::get, "/v1/messages", {}, kAnthropicHeaders);
  EXPECT_EQ(wrong_method.result_int(), 405);
  EXPECT_EQ(Json::parse(wrong_method.body())["type"], "error");

  EXPECT_EQ(client.post("/v1/messages", messages_body(), kAnthropicHeaders).result_int(), 200);
}

TEST(MockAnthropic, StreamSendsTheEventsInOrderAtTheInterval) {
  auto mock = start_mock();
  TestClient client(mock->port());
  ASSERT_FALSE(client.connect());
  const auto sent = Clock::now();
  ASSERT_FALSE(
      client.send(http::verb::post, "/v1/messages", messages_body("claude-stream", true).dump(),
                  with_anthropic_headers({{"x-mock-tokens", "3"}, {"x-mock-interval-ms", "40"}})));
  ASSERT_FALSE(client.read_stream_head()) << client.last_error().message();
  EXPECT_EQ(client.stream_message().result_int(), 200);
  EXPECT_EQ(client.stream_message()[http::field::content_type], "text/event-stream");
  std::vector<NamedEvent> events;
  std::vector<Clock::duration> arrivals;
  while (auto event = client.next_event()) {
    arrivals.push_back(Clock::now() - sent);
    events.push_back(named_event(*event));
  }
  ASSERT_FALSE(client.last_error()) << client.last_error().message();
  EXPECT_TRUE(client.stream_done());

  std::vector<std::string> names;
  for (const auto& event : events) names.push_back(event.name);
  EXPECT_EQ(names, (std::vector<std::string>{"message_start", "content_block_start", "ping",
                                             "content_block_delta", "content_block_delta",
                                             "content_block_delta", "content_block_stop",
                                             "message_delta", "message_stop"}));
  EXPECT_EQ(expect_well_formed_blocks(events), std::vector<std::string>{"text"});
  for (std::size_t i = 1; i < arrivals.size(); ++i) {
    EXPECT_GE(arrivals[i] - arrivals[i - 1], 25ms) << "event " << i << " came too early";
  }

  const Json& message = events[0].data["message"];
  EXPECT_EQ(message["model"], "claude-stream");
  EXPECT_EQ(message["role"], "assistant");
  EXPECT_TRUE(message["content"].empty());
  EXPECT_GE(message["usage"]["input_tokens"], 1);
  std::string text;
  for (int i = 3; i < 6; ++i) {
    EXPECT_EQ(events[i].data["delta"]["type"], "text_delta");
    text += events[i].data["delta"]["text"].get<std::string>();
  }
  EXPECT_EQ(text, expected_content(3));
  EXPECT_EQ(events[7].data["delta"]["stop_reason"], "end_turn");
  EXPECT_EQ(events[7].data["usage"]["output_tokens"], 3);
  EXPECT_TRUE(eventually([&] { return mock->stats().streams_completed == 1; }, 1s));
}

TEST(MockAnthropic, TextAnswerEventsFormattedOnDemandMatchTheWholeStream) {
  namespace anthropic = sluice::mock::anthropic;
  for (unsigned tokens : {0u, 1u, 5u}) {
    anthropic::Answer answer;
    answer.serial = 7;
    answer.model = "claude-test";
    answer.text_tokens = tokens;
    answer.input_tokens = 12;
    std::string whole;
    for (const auto& event : anthropic::stream_events(answer)) whole += event;
    std::string on_demand;
    for (std::size_t i = 0; i < anthropic::text_answer_event_count(answer); ++i) {
      anthropic::append_text_answer_event(answer, i, on_demand);
    }
    EXPECT_EQ(on_demand, whole) << tokens << " tokens";
  }

  // The opening events and the text deltas are written out by hand: the
  // same bytes as their JSON values dumped, keys in Anthropic's order.
  using Ordered = nlohmann::ordered_json;
  auto framed = [](std::string_view name, const Ordered& data) {
    return "event: " + std::string(name) + "\ndata: " + data.dump() + "\n\n";
  };
  anthropic::Answer answer;
  answer.serial = 3;
  answer.model = "claude-\"quoted\"-\u00e9";
  answer.text_tokens = 2;
  answer.input_tokens = 12;
  answer.cache_read_input_tokens = 5;
  answer.cache_creation_input_tokens = 7;
  const auto events = anthropic::stream_events(answer);
  ASSERT_EQ(events.size(), 8u);
  EXPECT_EQ(events[0], framed("message_start", {{"type", "message_start"},
                                                {"message",
                                                 {{"id", "msg_mock_3"},
                                                  {"type", "message"},
                                                  {"role", "assistant"},
                                                  {"model", answer.model},
                                                  {"content", Ordered::array()},
                                                  {"stop_reason", nullptr},
                                                  {"stop_sequence", nullptr},
                                                  {"usage",
                                                   {{"input_tokens", 12},
                                                    {"output_tokens", 1},
                                                    {"cache_read_input_tokens", 5},
                                                    {"cache_creation_input_tokens", 7}}}}}}));
  EXPECT_EQ(events[1],
            framed("content_block_start", {{"type", "content_block_start"},
                                           {"index", 0},
                                           {"content_block", {{"type", "text"}, {"text", ""}}}}));
  EXPECT_EQ(events[2], framed("ping", {{"type", "ping"}}));
  EXPECT_EQ(events[4], framed("content_block_delta",
                              {{"type", "content_block_delta"},
                               {"index", 0},
                               {"delta", {{"type", "text_delta"}, {"text", "tok1 "}}}}));
}

TEST(MockAnthropic, ToolUseAndThinkingStreamAsThePlainAnswerHasThem) {
  Behaviour behaviour;
  behaviour.tokens = 4;
  auto mock = start_mock(behaviour);
  TestClient client(mock->port());
  Json request = messages_body();
  request["tools"] =
      Json::array({{{"name", "lookup_order"}, {"input_schema", {{"type", "object"}}}}});
  const Headers headers = with_anthropic_headers({{"x-mock-anthropic", "tools,thinking"}});

  const Response plain = client.post("/v1/messages", request, headers);
  ASSERT_EQ(plain.result_int(), 200);
  const Json message = Json::parse(plain.body());
  ASSERT_EQ(message["content"].size(), 3u);
  EXPECT_EQ(message["content"][0]["type"], "thinking");
  EXPECT_FALSE(message["content"][0]["thinking"].get<std::string>().empty());
  EXPECT_FALSE(message["content"][0]["signature"].get<std::string>().empty());
  EXPECT_EQ(message["content"][1]["type"], "text");
  EXPECT_EQ(message["content"][1]["text"], expected_content(4));
  const Json& tool_use = message["content"][2];
  EXPECT_EQ(tool_use["type"], "tool_use");
  EXPECT_TRUE(tool_use["id"].get<std::string>().starts_with("toolu_"));
  EXPECT_EQ(tool_use["name"], "lookup_order");
  ASSERT_TRUE(tool_use["input"].is_object());
  EXPECT_FALSE(tool_use["input"].empty());
  EXPECT_EQ(message["stop_reason"], "tool_use");

  request["stream"] = true;
  ASSERT_FALSE(client.send(http::verb::post, "/v1/messages", request.dump(), headers));
  ASSERT_FALSE(client.read_stream_head()) << client.last_error().message();
  const auto events = read_named_events(client);
  ASSERT_FALSE(client.last_error()) << client.last_error().message();
  EXPECT_EQ(expect_well_formed_blocks(events),
            (std::vector<std::string>{"thinking", "text", "tool_use"}));

  std::string thinking, signature, text, arguments;
  std::size_t argument_pieces = 0;
  bool a_piece_is_not_json = false;
  std::string stop_reason;
  for (const auto& [name, data] : events) {
    if (name == "content_block_start" && data["index"] == 2) {
      EXPECT_EQ(data["content_block"]["name"], "lookup_order");
      EXPECT_TRUE(data["content_block"]["id"].get<std::string>().starts_with("toolu_"));
      EXPECT_EQ(data["content_block"]["input"], Json::object());
    }
    if (name == "message_delta") stop_reason = data["delta"]["stop_reason"];
    if (name != "content_block_delta") continue;
    const Json& delta = data["delta"];
    if (delta["type"] == "thinking_delta") {
      EXPECT_EQ(data["index"], 0);
      EXPECT_TRUE(signature.empty()) << "the signature comes after the thinking";
      thinking += delta["thinking"].get<std::string>();
    } else if (delta["type"] == "signature_delta") {
      EXPECT_EQ(data["index"], 0);
      signature += delta["signature"].get<std::string>();
    } else if (delta["type"] == "text_delta") {
      EXPECT_EQ(data["index"], 1);
      text += delta["text"].get<std::string>();
    } else if (delta["type"] == "input_json_delta") {
      EXPECT_EQ(data["index"], 2);
      const std::string piece = delta["partial_json"];
      a_piece_is_not_json |= !Json::accept(piece);
      arguments += piece;
      ++argument_pieces;
    } else {
      ADD_FAILURE() << "unexpected delta " << delta.dump();
    }
  }
  EXPECT_EQ(thinking, message["content"][0]["thinking"]);
  EXPECT_EQ(signature, message["content"][0]["signature"]);
  EXPECT_EQ(text, expected_content(4));
  // The arguments arrive in many pieces split mid-token, and reassemble to
  // the plain answer's input.
  EXPECT_GT(argument_pieces, 5u);
  EXPECT_TRUE(a_piece_is_not_json);
  ASSERT_TRUE(Json::accept(arguments)) << arguments;
  EXPECT_EQ(Json::parse(arguments), tool_use["input"]);
  EXPECT_EQ(stop_reason, "tool_use");
}

TEST(MockAnthropic, BehaviourSelectsTheBlocksAndCacheCounts) {
  Behaviour behaviour;
  behaviour.anthropic_content = "tools";
  behaviour.cache_read_tokens = 11;
  auto mock = start_mock(behaviour);
  TestClient client(mock->port());
  const Json message =
      Json::parse(client.post("/v1/messages", messages_body(), kAnthropicHeaders).body());
  ASSERT_EQ(message["content"].size(), 2u);
  EXPECT_EQ(message["content"][1]["type"], "tool_use");
  EXPECT_EQ(message["content"][1]["name"], "get_weather");
  EXPECT_EQ(message["usage"]["cache_read_input_tokens"], 11);

  // The header overrides it for one request.
  const Json thinking =
      Json::parse(client
                      .post("/v1/messages", messages_body(),
                            with_anthropic_headers({{"x-mock-anthropic", "thinking"}}))
                      .body());
  EXPECT_EQ(thinking["content"][0]["type"], "thinking");
  EXPECT_EQ(thinking["stop_reason"], "end_turn");

  EXPECT_EQ(client
                .post("/v1/messages", messages_body(),
                      with_anthropic_headers({{"x-mock-anthropic", "pictures"}}))
                .result_int(),
            400);
  EXPECT_EQ(
      client
          .request(
              http::verb::post, "/mock/behaviour",
              R"({"anthropic":"thinking,tools","cache_creation_tokens":4,"retry_after_ms":250})")
          .result_int(),
      204);
  const Behaviour updated = mock->behaviour();
  EXPECT_EQ(updated.anthropic_content, "thinking,tools");
  EXPECT_EQ(updated.cache_creation_tokens, 4u);
  EXPECT_EQ(updated.retry_after_ms, 250u);
  EXPECT_EQ(client.request(http::verb::post, "/mock/behaviour", R"({"anthropic":"pictures"})")
                .result_int(),
            400);
  Behaviour unknown_blocks;
  unknown_blocks.anthropic_content = "pictures";
  EXPECT_THROW(mock->set_behaviour(unknown_blocks), std::invalid_argument);
}

TEST(MockAnthropic, ScriptedErrorsHaveAnthropicShape) {
  auto mock = start_mock();
  TestClient client(mock->port());

  const Response overloaded = client.post("/v1/messages", messages_body(),
                                          with_anthropic_headers({{"x-mock-fail", "overloaded"}}));
  EXPECT_EQ(overloaded.result_int(), 529);
  EXPECT_EQ(overloaded[http::field::content_type], "application/json");
  EXPECT_EQ(Json::parse(overloaded.body()),
            Json::parse(
                R"({"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}})"));

  const std::vector<std::pair<std::string, std::string>> statuses = {
      {"400", "invalid_request_error"},
      {"401", "authentication_error"},
      {"429", "rate_limit_error"},
      {"500", "api_error"},
      {"context", "invalid_request_error"}};
  for (const auto& [mode, type] : statuses) {
    const Response response =
        client.post("/v1/messages", messages_body("claude-test", true),
                    with_anthropic_headers({{"x-mock-fail", mode}, {"x-mock-retry-after", "3"}}));
    const Json error = Json::parse(response.body());
    EXPECT_EQ(error["type"], "error") << mode;
    EXPECT_EQ(error["error"]["type"], type) << mode;
    EXPECT_FALSE(error["error"]["message"].get<std::string>().empty()) << mode;
    if (mode == "429") {
      EXPECT_EQ(response.result_int(), 429);
      EXPECT_EQ(response[http::field::retry_after], "3");
    }
  }

  // The OpenAI paths keep their own shape for the same mode.
  const Response openai =
      client.post("/v1/chat/completions", chat_body(), {{"x-mock-fail", "overloaded"}});
  EXPECT_EQ(openai.result_int(), 529);
  EXPECT_EQ(Json::parse(openai.body())["error"]["type"], "server_error");
}

TEST(MockAnthropic, ErrorMidStreamSendsAFewDeltasThenAnErrorEvent) {
  auto mock = start_mock();
  TestClient client(mock->port());
  ASSERT_FALSE(client.connect());
  ASSERT_FALSE(client.send(http::verb::post, "/v1/messages", messages_body("m", true).dump(),
                           with_anthropic_headers({{"x-mock-fail", "error-mid"}})));
  ASSERT_FALSE(client.read_stream_head());
  EXPECT_EQ(client.stream_message().result_int(), 200);
  const auto events = read_named_events(client);
  ASSERT_FALSE(client.last_error()) << client.last_error().message();
  ASSERT_EQ(events.size(), 7u);  // message_start, content_block_start, ping, 3 deltas, error
  for (int i = 3; i < 6; ++i) EXPECT_EQ(events[i].name, "content_block_delta");
  EXPECT_EQ(events[6].name, "error");
  EXPECT_EQ(events[6].data["error"]["type"], "overloaded_error");

  // A non-streamed request is answered normally.
  EXPECT_EQ(client
                .post("/v1/messages", messages_body(),
                      with_anthropic_headers({{"x-mock-fail", "error-mid"}}))
                .result_int(),
            200);
}

TEST(MockServer, ErrorMidStreamOnOpenAiSendsAFewChunksThenAnError) {
  auto mock = start_mock();
  TestClient client(mock->port());
  ASSERT_FALSE(client.connect());
  ASSERT_FALSE(client.send(http::verb::post, "/v1/chat/completions", chat_body("m", true).dump(),
                           {{"x-mock-fail", "error-mid"}}));
  ASSERT_FALSE(client.read_stream_head());
  std::vector<Json> chunks;
  while (auto event = client.next_event()) chunks.push_back(event_data(*event));
  ASSERT_EQ(chunks.size(), 4u);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(chunks[i]["object"], "chat.completion.chunk");
  EXPECT_EQ(chunks[3]["error"]["type"], "server_error");
}

// ---------------------------------------------------------------------------
// OpenAI tool calls (x-mock-openai: tools)

Json chat_body_with_tools(bool stream = false, bool include_usage = false) {
  Json body = chat_body("gpt-tools", stream, include_usage);
  body["tools"] =
      Json::array({{{"type", "function"},
                    {"function", {{"name", "lookup_order"}, {"parameters", {{"type", "object"}}}}}},
                   {{"type", "function"}, {"function", {{"name", "cancel_order"}}}}});
  return body;
}

const Headers kOpenAiTools = {{"x-mock-openai", "tools"}};

TEST(MockServer, ToolCallsAnswerARequestThatOffersTools) {
  auto mock = start_mock();
  TestClient client(mock->port());
  const Response plain = client.post("/v1/chat/completions", chat_body_with_tools(), kOpenAiTools);
  ASSERT_EQ(plain.result_int(), 200) << plain.body();
  const Json completion = Json::parse(plain.body());
  const Json& choice = completion["choices"][0];
  EXPECT_EQ(choice["finish_reason"], "tool_calls");
  EXPECT_EQ(choice["message"]["role"], "assistant");
  EXPECT_TRUE(choice["message"]["content"].is_null());
  ASSERT_EQ(choice["message"]["tool_calls"].size(), 1u);
  const Json& call = choice["message"]["tool_calls"][0];
  EXPECT_TRUE(call["id"].get<std::string>().starts_with("call_")) << call.dump();
  EXPECT_FALSE(call.contains("index")) << "only a streamed call has an index";
  EXPECT_EQ(call["type"], "function");
  EXPECT_EQ(call["function"]["name"], "lookup_order");  // the first tool offered
  const std::string arguments = call["function"]["arguments"];
  ASSERT_TRUE(Json::accept(arguments)) << arguments;
  const Json input = Json::parse(arguments);
  EXPECT_TRUE(input.is_object());
  EXPECT_FALSE(input.empty());
  EXPECT_GT(completion["usage"]["completion_tokens"], 0);
  EXPECT_EQ(completion["usage"]["total_tokens"],
            completion["usage"]["prompt_tokens"].get<int>() +
                completion["usage"]["completion_tokens"].get<int>());

  // Streamed: the call's id, type and name first, then its arguments a few
  // characters a chunk, then the finish reason, the usage and [DONE].
  ASSERT_FALSE(client.send(http::verb::post, "/v1/chat/completions",
                           chat_body_with_tools(true, true).dump(), kOpenAiTools));
  ASSERT_FALSE(client.read_stream_head()) << client.last_error().message();
  std::vector<Json> chunks;
  while (auto event = client.next_event()) chunks.push_back(event_data(*event));
  ASSERT_TRUE(client.stream_done()) << client.last_error().message();
  ASSERT_GE(chunks.size(), 5u);
  EXPECT_TRUE(chunks.back().is_null()) << "the stream ends with [DONE]";
  const Json& usage = chunks[chunks.size() - 2];
  EXPECT_TRUE(usage["choices"].empty());
  EXPECT_EQ(usage["usage"], completion["usage"]);
  const Json& finish = chunks[chunks.size() - 3];
  EXPECT_EQ(finish["choices"][0]["finish_reason"], "tool_calls");
  EXPECT_EQ(finish["choices"][0]["delta"], Json::object());

  const Json& opening = chunks[0]["choices"][0]["delta"];
  EXPECT_EQ(opening["role"], "assistant");
  ASSERT_EQ(opening["tool_calls"].size(), 1u);
  EXPECT_EQ(opening["tool_calls"][0]["index"], 0);
  EXPECT_TRUE(opening["tool_calls"][0]["id"].get<std::string>().starts_with("call_"));
  EXPECT_EQ(opening["tool_calls"][0]["type"], "function");
  EXPECT_EQ(opening["tool_calls"][0]["function"]["name"], "lookup_order");
  EXPECT_EQ(opening["tool_calls"][0]["function"]["arguments"], "");
  std::string streamed;
  std::size_t pieces = 0;
  bool a_piece_is_not_json = false;
  for (std::size_t i = 1; i + 3 < chunks.size(); ++i) {
    EXPECT_EQ(chunks[i]["object"], "chat.completion.chunk");
    ASSERT_TRUE(chunks[i].contains("usage")) << i;
    EXPECT_TRUE(chunks[i]["usage"].is_null()) << i;
    const Json& delta = chunks[i]["choices"][0]["delta"];
    ASSERT_EQ(delta["tool_calls"].size(), 1u) << delta.dump();
    EXPECT_EQ(delta["tool_calls"][0]["index"], 0);
    EXPECT_FALSE(delta["tool_calls"][0].contains("id"));
    const std::string piece = delta["tool_calls"][0]["function"]["arguments"];
    EXPECT_LE(piece.size(), 8u);
    a_piece_is_not_json |= !Json::accept(piece);
    streamed += piece;
    ++pieces;
  }
  EXPECT_GT(pieces, 5u);
  EXPECT_TRUE(a_piece_is_not_json);
  EXPECT_EQ(streamed, arguments);
}

TEST(MockServer, ToolCallsNeedToolsOfferedAndAValidSetting) {
  auto mock = start_mock();
  TestClient client(mock->port());
  // Offered tools without the header, or the header without tools: text.
  for (const auto& [body, headers] : std::vector<std::pair<Json, Headers>>{
           {chat_body_with_tools(), {}}, {chat_body(), kOpenAiTools}}) {
    const Json completion = Json::parse(client.post("/v1/chat/completions", body, headers).body());
    EXPECT_EQ(completion["choices"][0]["finish_reason"], "stop");
    EXPECT_EQ(completion["choices"][0]["message"]["content"], expected_content(8));
    EXPECT_FALSE(completion["choices"][0]["message"].contains("tool_calls"));
  }
  EXPECT_EQ(
      client.post("/v1/chat/completions", chat_body_with_tools(), {{"x-mock-openai", "pictures"}})
          .result_int(),
      400);

  // The behaviour sets it for every request.
  EXPECT_EQ(
      client.request(http::verb::post, "/mock/behaviour", R"({"openai":"tools"})").result_int(),
      204);
  EXPECT_EQ(mock->behaviour().openai_content, "tools");
  const Json called =
      Json::parse(client.post("/v1/chat/completions", chat_body_with_tools()).body());
  EXPECT_EQ(called["choices"][0]["finish_reason"], "tool_calls");
  EXPECT_EQ(
      client.request(http::verb::post, "/mock/behaviour", R"({"openai":"pictures"})").result_int(),
      400);
  Behaviour unknown;
  unknown.openai_content = "pictures";
  EXPECT_THROW(mock->set_behaviour(unknown), std::invalid_argument);
}

TEST(MockServer, ErrorMidStreamCutsAToolCallsArguments) {
  auto mock = start_mock();
  TestClient client(mock->port());
  ASSERT_FALSE(client.connect());
  ASSERT_FALSE(client.send(http::verb::post, "/v1/chat/completions",
                           chat_body_with_tools(true).dump(),
                           {{"x-mock-openai", "tools"}, {"x-mock-fail", "error-mid"}}));
  ASSERT_FALSE(client.read_stream_head());
  std::vector<Json> chunks;
  while (auto event = client.next_event()) chunks.push_back(event_data(*event));
  ASSERT_EQ(chunks.size(), 5u);  // the opening chunk, 3 pieces, the error
  EXPECT_EQ(chunks[0]["choices"][0]["delta"]["tool_calls"][0]["function"]["name"], "lookup_order");
  for (int i = 1; i < 4; ++i) {
    EXPECT_TRUE(
        chunks[i]["choices"][0]["delta"]["tool_calls"][0]["function"].contains("arguments"));
  }
  EXPECT_EQ(chunks[4]["error"]["type"], "server_error");
}

// ---------------------------------------------------------------------------
// Azure OpenAI's deployment paths

TEST(MockAzure, DeploymentPathsAnswerAsOpenAiDoes) {
  auto mock = start_mock();
  TestClient client(mock->port());
  const std::string base = "/openai/deployments/gpt-4o-prod";
  const std::string version = "?api-version=2024-10-21";

  const Response chat = client.post(base + "/chat/completions" + version, chat_body("azure-model"));
  EXPECT_EQ(chat.result_int(), 200);
  EXPECT_EQ(Json::parse(chat.body())["object"], "chat.completion");
  EXPECT_EQ(Json::parse(chat.body())["choices"][0]["message"]["content"], expected_content(8));

  const Response completion =
      client.post(base + "/completions" + version, {{"model", "m"}, {"prompt", "hi"}});
  EXPECT_EQ(completion.result_int(), 200);
  EXPECT_EQ(Json::parse(completion.body())["object"], "text_completion");

  const Response embedding =
      client.post(base + "/embeddings" + version, {{"model", "m"}, {"input", "hello"}});
  EXPECT_EQ(embedding.result_int(), 200);
  EXPECT_EQ(Json::parse(embedding.body())["data"][0]["embedding"].size(), 16u);

  // The same behaviours apply.
  const Response limited =
      client.post(base + "/chat/completions" + version, chat_body(), {{"x-mock-fail", "429"}});
  EXPECT_EQ(limited.result_int(), 429);

  ASSERT_FALSE(client.send(http::verb::post, base + "/chat/completions" + version,
                           chat_body("m", true).dump(), {{"x-mock-tokens", "2"}}));
  ASSERT_FALSE(client.read_stream_head());
  int events = 0;
  while (client.next_event()) ++events;
  EXPECT_EQ(events, 4);  // 2 tokens, finish, [DONE]

  const auto recorded = mock->recent_requests();
  ASSERT_EQ(recorded.size(), 5u);
  EXPECT_EQ(recorded.front().target, base + "/chat/completions" + version);
  EXPECT_EQ(Json::parse(recorded.front().body)["model"], "azure-model");
}

TEST(MockAzure, ApiVersionIsRequired) {
  auto mock = start_mock();
  TestClient client(mock->port());
  for (const std::string target :
       {"/openai/deployments/d/chat/completions", "/openai/deployments/d/embeddings?x=1",
        "/openai/deployments/d/completions?api-version="}) {
    const Response response = client.post(target, chat_body());
    EXPECT_EQ(response.result_int(), 400) << target;
    const Json error = Json::parse(response.body())["error"];
    EXPECT_EQ(error["code"], "BadRequest") << target;
    EXPECT_EQ(error["param"], "api-version") << target;
    EXPECT_NE(error["message"].get<std::string>().find("api-version"), std::string::npos);
  }
  EXPECT_EQ(mock->recent_requests().size(), 3u);
  // Only the deployment paths need it.
  EXPECT_EQ(client.post("/v1/chat/completions", chat_body()).result_int(), 200);
  EXPECT_EQ(client
                .post("/openai/deployments/d/chat/completions?foo=bar&api-version=2024-10-21",
                      chat_body())
                .result_int(),
            200);
}

TEST(MockAzure, RateLimitCarriesRetryAfterMsWhenAsked) {
  auto mock = start_mock();
  TestClient client(mock->port());
  const std::string target = "/openai/deployments/d/chat/completions?api-version=2024-10-21";
  const Response asked =
      client.post(target, chat_body(), {{"x-mock-fail", "429"}, {"x-mock-retry-after-ms", "1500"}});
  EXPECT_EQ(asked.result_int(), 429);
  EXPECT_EQ(asked["retry-after-ms"], "1500");
  EXPECT_EQ(asked[http::field::retry_after], "1");

  const Response plain = client.post(target, chat_body(), {{"x-mock-fail", "429"}});
  EXPECT_EQ(plain.result_int(), 429);
  EXPECT_EQ(plain.find("retry-after-ms"), plain.end());
}

// ---------------------------------------------------------------------------
// The sluice-mock executable (its path comes from the build; skipped when run
// outside ctest without SLUICE_MOCK_BINARY).

using sluice::testing::built_binary;
using sluice::testing::ChildProcess;

std::optional<std::string> mock_binary() {
  return built_binary("SLUICE_MOCK_BINARY", "tools/mock/sluice-mock");
}

TEST(MockBinary, PrintsTheListeningLineServesAndExitsCleanlyOnSigterm) {
  const auto binary = mock_binary();
  if (!binary) GTEST_SKIP() << "sluice-mock not found; set SLUICE_MOCK_BINARY";
  ChildProcess child(*binary, {"--listen", "127.0.0.1:0", "--tokens", "2", "--ttft", "0"});
  const auto port = child.wait_for_listening_port("sluice-mock listening on http://127.0.0.1:", 5s);
  ASSERT_TRUE(port) << child.standard_output() << child.standard_error();

  TestClient client(*port);
  const Response response = client.post("/v1/chat/completions", chat_body());
  EXPECT_EQ(response.result_int(), 200);
  EXPECT_EQ(Json::parse(response.body())["choices"][0]["message"]["content"], "tok0 tok1 ");

  child.signal(SIGTERM);
  EXPECT_EQ(child.wait_exit(5s), 0);
}

TEST(MockBinary, HelpNamesTheAnthropicAndAzureEndpoints) {
  const auto binary = mock_binary();
  if (!binary) GTEST_SKIP() << "sluice-mock not found; set SLUICE_MOCK_BINARY";
  ChildProcess child(*binary, {"--help"});
  EXPECT_EQ(child.wait_exit(5s), 0);
  const std::string help = child.standard_output();
  EXPECT_NE(help.find("/v1/messages"), std::string::npos) << help;
  EXPECT_NE(help.find("/openai/deployments/"), std::string::npos) << help;
  EXPECT_NE(help.find("--anthropic"), std::string::npos) << help;
  EXPECT_NE(help.find("--openai"), std::string::npos) << help;
  EXPECT_NE(help.find("x-mock-openai"), std::string::npos) << help;
}

TEST(MockBinary, BadArgumentsExitWithCode2) {
  const auto binary = mock_binary();
  if (!binary) GTEST_SKIP() << "sluice-mock not found; set SLUICE_MOCK_BINARY";
  for (const auto& arguments : std::vector<std::vector<std::string>>{{"--fail", "sometimes"},
                                                                     {"--ttft", "soon"},
                                                                     {"--listen", "nowhere"},
                                                                     {"--anthropic", "pictures"},
                                                                     {"--openai", "pictures"},
                                                                     {"--what"}}) {
    ChildProcess child(*binary, arguments);
    EXPECT_EQ(child.wait_exit(5s), 2) << arguments.front();
    EXPECT_FALSE(child.standard_error().empty()) << arguments.front();
  }
}

}  // namespace
