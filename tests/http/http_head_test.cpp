#include "sluice/http/http_head.hpp"

#include <gtest/gtest.h>

#include <string>
#include <string_view>

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

TEST(HttpHead, ATokenListIsReadElementByElement) {
  EXPECT_TRUE(token_list_has("keep-alive, X-Hop", "x-hop"));
  EXPECT_TRUE(token_list_has("x-hop", "X-HOP"));
  EXPECT_TRUE(token_list_has(" ,\tx-hop\t, close", "x-hop"));
  EXPECT_TRUE(token_list_has("close,x-hop", "close"));
  EXPECT_FALSE(token_list_has("x-hops, x-ho", "x-hop"));
  EXPECT_FALSE(token_list_has("", "x-hop"));
  EXPECT_FALSE(token_list_has("x-hop", ""));
}

TEST(HttpHead, LinesWithoutSomeNamesAreCopiedOnlyWhenOneIsThere) {
  const std::string lines = "A: 1\r\nB-Name: 2\r\na: 3\r\nC: \r\n";
  const auto named = [](std::string_view wanted) {
    return [wanted](std::string_view name) { return iequals(name, wanted); };
  };
  std::string kept = "untouched";
  const auto same = lines_without(lines, kept, named("d"));
  EXPECT_EQ(same.data(), lines.data());
  EXPECT_EQ(same.size(), lines.size());
  EXPECT_EQ(kept, "untouched");

  EXPECT_EQ(lines_without(lines, kept, named("a")), "B-Name: 2\r\nC: \r\n");
  EXPECT_EQ(lines_without(lines, kept, named("b-name")), "A: 1\r\na: 3\r\nC: \r\n");
  EXPECT_EQ(lines_without(lines, kept, named("c")), "A: 1\r\nB-Name: 2\r\na: 3\r\n");
  EXPECT_EQ(lines_without(lines, kept, [](std::string_view) { return true; }), "");
  EXPECT_EQ(lines_without("", kept, [](std::string_view) { return true; }), "");
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
