#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include "sluice/metrics/server_timing.hpp"

namespace sluice::metrics {
namespace {

using namespace std::chrono_literals;
using std::chrono::microseconds;
using std::chrono::nanoseconds;

std::string ms(Clock::duration d) {
  std::string out;
  append_milliseconds(out, d);
  return out;
}

TEST(ServerTiming, RendersEveryEntryInOrder) {
  ServerTiming timing;
  timing.gateway = microseconds(123);
  timing.upstream_connect = microseconds(1200);
  timing.upstream_ttfb = microseconds(45600);
  std::string out;
  render_server_timing(out, timing);
  EXPECT_EQ(out,
            "Server-Timing: gateway;dur=0.123, upstream-connect;dur=1.2, "
            "upstream-ttfb;dur=45.6\r\n");
  std::string value;
  render_server_timing_value(value, timing);
  EXPECT_EQ(value, "gateway;dur=0.123, upstream-connect;dur=1.2, upstream-ttfb;dur=45.6");
}

TEST(ServerTiming, AbsentEntriesAreLeftOut) {
  ServerTiming timing;
  timing.gateway = microseconds(80);
  timing.upstream_ttfb = 250ms;
  std::string value;
  render_server_timing_value(value, timing);
  EXPECT_EQ(value, "gateway;dur=0.08, upstream-ttfb;dur=250");

  ServerTiming only_connect;
  only_connect.upstream_connect = 3ms;
  value.clear();
  render_server_timing_value(value, only_connect);
  EXPECT_EQ(value, "upstream-connect;dur=3");
}

TEST(ServerTiming, NothingAtAllWhenEveryEntryIsAbsent) {
  std::string out = "keep";
  render_server_timing(out, ServerTiming{});
  render_server_timing_value(out, ServerTiming{});
  EXPECT_EQ(out, "keep");
}

TEST(ServerTiming, MillisecondsHaveAtMostThreeDecimals) {
  EXPECT_EQ(ms(0ms), "0");
  EXPECT_EQ(ms(12ms), "12");
  EXPECT_EQ(ms(microseconds(1)), "0.001");
  EXPECT_EQ(ms(microseconds(1010)), "1.01");
  EXPECT_EQ(ms(microseconds(99999)), "99.999");
  EXPECT_EQ(ms(nanoseconds(1'234'567)), "1.235");  // rounded to the microsecond
  EXPECT_EQ(ms(nanoseconds(400)), "0");
  EXPECT_EQ(ms(nanoseconds(2'500)), "0.003");  // half a microsecond rounds up
  EXPECT_EQ(ms(std::chrono::seconds(90)), "90000");
  EXPECT_EQ(ms(-5ms), "0");
}

// The longest value there can be: every entry, each the largest duration.
TEST(ServerTiming, TheLongestHeaderIsWrittenWhole) {
  const std::string longest = "9223372036854.776";
  EXPECT_EQ(ms(Clock::duration::max()), longest);
  ServerTiming timing{Clock::duration::max(), Clock::duration::max(), Clock::duration::max()};
  std::string out;
  render_server_timing(out, timing);
  EXPECT_EQ(out, "Server-Timing: gateway;dur=" + longest + ", upstream-connect;dur=" + longest +
                     ", upstream-ttfb;dur=" + longest + "\r\n");
}

}  // namespace
}  // namespace sluice::metrics
