#include "sluice/common/http_head.hpp"

#include <gtest/gtest.h>

namespace sluice {
namespace {

TEST(HttpHead, HopByHopHeadersInAnyCase) {
  for (const char* name :
       {"connection", "Keep-Alive", "proxy-connection", "Proxy-Authenticate", "PROXY-AUTHORIZATION",
        "TE", "trailer", "Transfer-Encoding", "upgrade", "Content-Length", "host"}) {
    EXPECT_TRUE(is_hop_by_hop_header(name)) << name;
  }
  // End-to-end names, some of the same lengths as hop-by-hop ones.
  for (const char* name : {"", "tx", "hose", "content-type", "connections", "x-keep-alive",
                           "authorization", "accept", "user-agent", "content-lengths"}) {
    EXPECT_FALSE(is_hop_by_hop_header(name)) << name;
  }
}

TEST(HttpHead, CaseInsensitiveEquality) {
  EXPECT_TRUE(iequals("X-Request-Id", "x-request-ID"));
  EXPECT_FALSE(iequals("x-request-id", "x-request-ie"));
  EXPECT_FALSE(iequals("abc", "abcd"));
  // Only ASCII letters fold: '[' is not '{' in another case.
  EXPECT_FALSE(iequals("[", "{"));
}

TEST(HttpHead, WriterBuildsAHeadAndReusesItsString) {
  std::string out = "left over";
  HeadWriter(out)
      .status_line(200)
      .field("Content-Length", std::size_t{5})
      .raw_fields("a: b\r\n")
      .finish();
  EXPECT_EQ(out, "HTTP/1.1 200 OK\r\nContent-Length: 5\r\na: b\r\n\r\n");
  EXPECT_GE(out.capacity(), HeadWriter::kTypicalHeadBytes);
}

}  // namespace
}  // namespace sluice
