// A request body of known length is read in reads as large as what is still
// to come: a prompt of tens of kilobytes takes a few system calls, not one
// per 512 bytes. The body reaches the upstream intact either way.
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <atomic>
#include <nlohmann/json.hpp>
#include <string>

#include "support/gateway_fixture.hpp"
#include "support/http_client.hpp"

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

}  // namespace
}  // namespace sluice::testing
