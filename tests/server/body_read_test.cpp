// A request body of known length is read in reads as large as what is still
// to come: a prompt of tens of kilobytes takes a few system calls, not one
// per 512 bytes, and goes from the socket straight into the request, not
// through the connection's buffer. The body reaches the upstream intact
// either way.
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <atomic>
#include <boost/asio/write.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/error.hpp>
#include <chrono>
#include <nlohmann/json.hpp>
#include <string>

#include "sluice/http/http_read.hpp"
#include "sluice/http/socket_deadline.hpp"
#include "sluice/server/client_request.hpp"
#include "support/gateway_fixture.hpp"
#include "support/http_client.hpp"
#include "support/socket_pair.hpp"

// Counts recvmsg calls on sockets whose local port is the watched one (the
// gateway's listening port: its connections from clients).
namespace {
std::atomic<int> watched_local_port{-1};
std::atomic<int> reads_from_clients{0};

int local_port(int descriptor) {
  sockaddr_in address{};
  socklen_t size = sizeof address;
  if (::getsockname(descriptor, reinterpret_cast<sockaddr*>(&address), &size) != 0) return -1;
  if (address.sin_family != AF_INET) return -1;
  return ntohs(address.sin_port);
}
}  // namespace

extern "C" ssize_t recvmsg(int descriptor, msghdr* message, int flags) {
  using Real = ssize_t (*)(int, msghdr*, int);
  static const auto real = reinterpret_cast<Real>(dlsym(RTLD_NEXT, "recvmsg"));
  const int watched = watched_local_port.load();
  if (watched >= 0 && local_port(descriptor) == watched) ++reads_from_clients;
  return real(descriptor, message, flags);
}

namespace sluice::testing {
namespace {

TEST(BodyRead, ALargeBodyTakesAFewReadsAndArrivesIntact) {
  auto upstream = start_mock();
  TestGateway gateway("models:\n  - name: chat\n    deployments:\n" +
                      deployment_yaml("d1", upstream->base_url()));
  const std::string prompt(40000, 'x');
  const std::string body =
      R"({"model":"chat","messages":[{"role":"user","content":")" + prompt + R"("}]})";
  // One connection: its buffer, grown for a body, is let go between requests.
  HttpConnection client(gateway.port());
  for (int round = 0; round < 3; ++round) {
    upstream->clear_recorded();
    reads_from_clients = 0;
    watched_local_port = gateway.port();
    auto response = client.request("POST", "/v1/chat/completions", body);
    watched_local_port = -1;
    ASSERT_EQ(response.status, 200u) << response.body;
    // 512 bytes at a time would be about 80 reads; the head's read, the
    // body's and what the kernel delivers in parts take a few.
    EXPECT_LE(reads_from_clients.load(), 8) << "round " << round;
    auto recorded = upstream->recent_requests();
    ASSERT_EQ(recorded.size(), 1u);
    auto forwarded = nlohmann::json::parse(recorded[0].body, nullptr, false);
    ASSERT_TRUE(forwarded.is_object());
    EXPECT_EQ(forwarded["messages"][0]["content"], prompt) << "round " << round;
  }
  auto small = client.request("POST", "/v1/chat/completions", chat_body("chat", false));
  EXPECT_EQ(small.status, 200u) << small.body;
}

namespace net = boost::asio;
using namespace std::chrono_literals;

std::string head_for(const std::string& body) {
  return "POST /v1/chat/completions HTTP/1.1\r\nContent-Length: " + std::to_string(body.size()) +
         "\r\n\r\n";
}

TEST(BodyRead, TheRestOfABodyOfKnownLengthIsReadIntoTheRequest) {
  const std::string body = R"({"pad":")" + std::string(160000, 'x') + R"("})";
  const std::string next_head = "GET /v1/models HTTP/1.1\r\n\r\n";
  constexpr std::size_t kFirstPart = 1000;
  constexpr std::size_t kPieces = 4;
  const std::size_t piece_size = (body.size() - kFirstPart + kPieces - 1) / kPieces;
  SocketPair pair;
  SocketDeadline deadline(pair.ours);
  boost::beast::flat_buffer buffer;
  server::ClientRequest request;
  server::ClientRequest next;
  error_code head_ec, body_ec, next_ec;
  std::size_t capacity_after_head = 0;
  pair.run([&]() -> net::awaitable<void> {
    net::write(pair.theirs, net::buffer(head_for(body) + body.substr(0, kFirstPart)));
    // Pieces a few milliseconds apart arrive in reads of their own; the
    // last comes with the next request's head.
    for (std::size_t piece = 0; piece < kPieces; ++piece) {
      std::string bytes = body.substr(kFirstPart + piece * piece_size, piece_size);
      if (piece + 1 == kPieces) bytes += next_head;
      pair.write_after(std::chrono::milliseconds(10 * (piece + 1)), std::move(bytes));
    }
    deadline.expires_after(5s);
    head_ec = co_await read_http(pair.ours, buffer, request, false, deadline);
    capacity_after_head = buffer.capacity();
    body_ec = co_await read_http(pair.ours, buffer, request, true, deadline);
    next_ec = co_await read_http(pair.ours, buffer, next, true, deadline);
  }());
  ASSERT_FALSE(head_ec) << head_ec.message();
  ASSERT_FALSE(body_ec) << body_ec.message();
  ASSERT_TRUE(request.read_plainly());
  ASSERT_EQ(request.body().size(), body.size());
  EXPECT_TRUE(request.body() == body);
  // Read through the buffer, 64 KiB at a time, the body would have grown it.
  EXPECT_EQ(buffer.capacity(), capacity_after_head);
  EXPECT_LT(buffer.capacity(), 16384u);
  // Nothing of the next request went into the body.
  ASSERT_FALSE(next_ec) << next_ec.message();
  EXPECT_EQ(next.target(), "/v1/models");
  EXPECT_EQ(buffer.size(), 0u);
}

TEST(BodyRead, AConnectionEndingInsideABodyReadIntoTheRequestIsAPartialMessage) {
  const std::string body = R"({"pad":")" + std::string(100000, 'x') + R"("})";
  SocketPair pair;
  SocketDeadline deadline(pair.ours);
  boost::beast::flat_buffer buffer;
  server::ClientRequest request;
  error_code head_ec, body_ec;
  pair.run([&]() -> net::awaitable<void> {
    net::write(pair.theirs, net::buffer(head_for(body) + body.substr(0, 500)));
    pair.write_after(10ms, body.substr(500, 30000));
    pair.after(20ms, [&] { pair.theirs.close(); });
    deadline.expires_after(5s);
    head_ec = co_await read_http(pair.ours, buffer, request, false, deadline);
    body_ec = co_await read_http(pair.ours, buffer, request, true, deadline);
  }());
  ASSERT_FALSE(head_ec) << head_ec.message();
  EXPECT_EQ(body_ec, boost::beast::http::error::partial_message) << body_ec.message();
  EXPECT_FALSE(request.is_done());
}

}  // namespace
}  // namespace sluice::testing
