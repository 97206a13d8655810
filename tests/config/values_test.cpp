// The small value languages inside the config: durations, upstream URLs and
// listen addresses.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "sluice/config/config.hpp"

namespace sluice::config {
namespace {

using std::chrono::milliseconds;

TEST(ParseDuration, AcceptsEveryUnit) {
  EXPECT_EQ(parse_duration("250ms"), milliseconds(250));
  EXPECT_EQ(parse_duration("2s"), milliseconds(2000));
  EXPECT_EQ(parse_duration("1m"), milliseconds(60000));
  EXPECT_EQ(parse_duration("2h"), milliseconds(2 * 3600 * 1000));
}

TEST(ParseDuration, AcceptsFractionsThatAreWholeMilliseconds) {
  EXPECT_EQ(parse_duration("1.5s"), milliseconds(1500));
  EXPECT_EQ(parse_duration("0.25s"), milliseconds(250));
  EXPECT_EQ(parse_duration("0.5m"), milliseconds(30000));
  EXPECT_EQ(parse_duration("1.250s"), milliseconds(1250));
  EXPECT_EQ(parse_duration("3.0ms"), milliseconds(3));
  EXPECT_EQ(parse_duration("0.001s"), milliseconds(1));
}

TEST(ParseDuration, AcceptsZeroWithOrWithoutUnit) {
  EXPECT_EQ(parse_duration("0"), milliseconds(0));
  EXPECT_EQ(parse_duration("0s"), milliseconds(0));
  EXPECT_EQ(parse_duration("0ms"), milliseconds(0));
}

TEST(ParseDuration, RejectsMalformedText) {
  for (const char* text :
       {"",     "s",   "ms",  "5",   "30", "-1s",  "-0", "+1s", "1.5ms", "0.0001s", "1.s", ".5s",
        "1,5s", "1 s", " 1s", "1s ", "1S", "1sec", "1d", "1us", "1e3ms", "abc",     "1s2", "00"}) {
    EXPECT_FALSE(parse_duration(text).has_value()) << "'" << text << "'";
  }
}

TEST(ParseDuration, RejectsOverflow) {
  EXPECT_FALSE(parse_duration("99999999999999999999ms").has_value());
  EXPECT_FALSE(parse_duration("9999999999999999h").has_value());
}

std::optional<Url> url_of(const std::string& text) {
  std::string why;
  auto url = parse_url(text, why);
  EXPECT_TRUE(url.has_value()) << text << ": " << why;
  EXPECT_TRUE(url.has_value() || !why.empty());
  return url;
}

std::string url_error(const std::string& text) {
  std::string why;
  auto url = parse_url(text, why);
  EXPECT_FALSE(url.has_value()) << text;
  return why;
}

TEST(ParseUrl, HttpsDefaultsToPort443) {
  auto url = url_of("https://api.openai.com/v1");
  ASSERT_TRUE(url);
  EXPECT_EQ(url->scheme, "https");
  EXPECT_EQ(url->host, "api.openai.com");
  EXPECT_EQ(url->port, 443);
  EXPECT_EQ(url->path_prefix, "/v1");
  EXPECT_TRUE(url->tls());
}

TEST(ParseUrl, HttpDefaultsToPort80) {
  auto url = url_of("http://example.com");
  ASSERT_TRUE(url);
  EXPECT_EQ(url->scheme, "http");
  EXPECT_EQ(url->port, 80);
  EXPECT_EQ(url->path_prefix, "");
  EXPECT_FALSE(url->tls());
}

TEST(ParseUrl, ExplicitPortAndPrefix) {
  auto url = url_of("http://127.0.0.1:8000/v1");
  ASSERT_TRUE(url);
  EXPECT_EQ(url->host, "127.0.0.1");
  EXPECT_EQ(url->port, 8000);
  EXPECT_EQ(url->path_prefix, "/v1");

  auto max_port = url_of("https://h:65535");
  ASSERT_TRUE(max_port);
  EXPECT_EQ(max_port->port, 65535);
}

TEST(ParseUrl, StripsTrailingSlashesFromThePrefix) {
  EXPECT_EQ(url_of("https://h/v1/")->path_prefix, "/v1");
  EXPECT_EQ(url_of("https://h/openai/deployments/gpt-4o//")->path_prefix,
            "/openai/deployments/gpt-4o");
  EXPECT_EQ(url_of("https://h/")->path_prefix, "");
  EXPECT_EQ(url_of("https://h:8443/")->path_prefix, "");
}

TEST(ParseUrl, NormalisesUpperCaseSchemeAndHost) {
  auto url = url_of("HTTPS://API.Example.COM/V1");
  ASSERT_TRUE(url);
  EXPECT_EQ(url->scheme, "https");
  EXPECT_EQ(url->host, "api.example.com");
  EXPECT_EQ(url->port, 443);
  EXPECT_EQ(url->path_prefix, "/V1");  // paths are case-sensitive
  EXPECT_TRUE(url->tls());
}

TEST(ParseUrl, BracketedIpv6Host) {
  auto url = url_of("http://[::1]:8000/v1");
  ASSERT_TRUE(url);
  EXPECT_EQ(url->host, "::1");
  EXPECT_EQ(url->port, 8000);

  auto without_port = url_of("https://[2001:DB8::1]");
  ASSERT_TRUE(without_port);
  EXPECT_EQ(without_port->host, "2001:db8::1");
  EXPECT_EQ(without_port->port, 443);
}

TEST(ParseUrl, ExplainsWhyAUrlIsRejected) {
  EXPECT_THAT(url_error(""), testing::HasSubstr("empty"));
  EXPECT_THAT(url_error("api.openai.com/v1"), testing::HasSubstr("scheme"));
  EXPECT_THAT(url_error("://h"), testing::HasSubstr("scheme"));
  EXPECT_THAT(url_error("ftp://h"), testing::HasSubstr("unsupported scheme 'ftp'"));
  EXPECT_THAT(url_error("ws://h"), testing::HasSubstr("scheme"));
  EXPECT_THAT(url_error("https://"), testing::HasSubstr("empty host"));
  EXPECT_THAT(url_error("https:///v1"), testing::HasSubstr("empty host"));
  EXPECT_THAT(url_error("https://:443"), testing::HasSubstr("empty host"));
  EXPECT_THAT(url_error("https://h/v1?api-version=1"), testing::HasSubstr("query"));
  EXPECT_THAT(url_error("https://h?x"), testing::HasSubstr("query"));
  EXPECT_THAT(url_error("https://h/v1#top"), testing::HasSubstr("fragment"));
  EXPECT_THAT(url_error("https://user:pw@h/v1"), testing::HasSubstr("credentials"));
  EXPECT_THAT(url_error("https://h:0"), testing::HasSubstr("port"));
  EXPECT_THAT(url_error("https://h:65536"), testing::HasSubstr("port"));
  EXPECT_THAT(url_error("https://h:"), testing::HasSubstr("port"));
  EXPECT_THAT(url_error("https://h:http"), testing::HasSubstr("port"));
  EXPECT_THAT(url_error("https://h:-1"), testing::HasSubstr("port"));
  EXPECT_THAT(url_error("https://[::1"), testing::HasSubstr("IPv6"));
  EXPECT_THAT(url_error("https://[zz]:80"), testing::HasSubstr("IPv6"));
  EXPECT_THAT(url_error("https://::1:80"), testing::HasSubstr("brackets"));
  EXPECT_THAT(url_error("https://bad host/"), testing::HasSubstr("whitespace"));
  EXPECT_THAT(url_error("https://bad!host/"), testing::HasSubstr("host"));
}

TEST(ParseListen, HostAndPort) {
  auto listen = parse_listen("0.0.0.0:8080");
  ASSERT_TRUE(listen);
  EXPECT_EQ(listen->first, "0.0.0.0");
  EXPECT_EQ(listen->second, 8080);

  auto named = parse_listen("localhost:65535");
  ASSERT_TRUE(named);
  EXPECT_EQ(named->first, "localhost");
  EXPECT_EQ(named->second, 65535);
}

TEST(ParseListen, PortZeroMeansEphemeral) {
  auto listen = parse_listen("127.0.0.1:0");
  ASSERT_TRUE(listen);
  EXPECT_EQ(listen->second, 0);
}

TEST(ParseListen, BracketedIpv6) {
  auto loopback = parse_listen("[::1]:9000");
  ASSERT_TRUE(loopback);
  EXPECT_EQ(loopback->first, "::1");
  EXPECT_EQ(loopback->second, 9000);

  auto any = parse_listen("[::]:8080");
  ASSERT_TRUE(any);
  EXPECT_EQ(any->first, "::");
}

TEST(ParseListen, RejectsMalformedAddresses) {
  for (const char* text :
       {"", "8080", ":8080", "0.0.0.0", "0.0.0.0:", "0.0.0.0:65536", "0.0.0.0:-1", "0.0.0.0:http",
        "::1:8080", "[::1]", "[::1]8080", "[::1:8080", "[]:8080", "a b:80", "host:80:90"}) {
    EXPECT_FALSE(parse_listen(text).has_value()) << "'" << text << "'";
  }
}

}  // namespace
}  // namespace sluice::config
