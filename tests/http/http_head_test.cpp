#include "sluice/http/http_head.hpp"

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

// Every token character at every position of names shorter than, equal to
// and longer than a word: the word-wise comparison agrees with iequals.
TEST(HttpHead, FieldNameComparisonAgreesWithCaseInsensitiveEquality) {
  const std::string_view token_bytes =
      "!#$%&'*+-.^_`|~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
  std::size_t matches = 0;
  for (std::string_view lowercase : {"te", "api-key", "x-api-key", "connection", "content-length",
                                     "transfer-encoding", "proxy-authorization"}) {
    EXPECT_TRUE(field_name_is(std::string(lowercase), lowercase));
    for (std::size_t at = 0; at < lowercase.size(); ++at) {
      for (char byte : token_bytes) {
        std::string name(lowercase);
        name[at] = byte;
        const bool expected = iequals(name, lowercase);
        EXPECT_EQ(field_name_is(name, lowercase), expected) << name << " / " << lowercase;
        matches += expected ? 1 : 0;
      }
    }
    EXPECT_FALSE(field_name_is(std::string(lowercase) + "s", lowercase));
    EXPECT_FALSE(field_name_is(lowercase.substr(1), lowercase));
  }
  // Each letter matched in both cases, each '-' once.
  EXPECT_EQ(matches, 2 * (2 + 6 + 7 + 10 + 13 + 16 + 18) + (0 + 1 + 2 + 0 + 1 + 1 + 1));
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
