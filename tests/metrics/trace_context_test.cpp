#include <gtest/gtest.h>

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "sluice/metrics/trace_context.hpp"

namespace sluice::metrics {
namespace {

// The example from the W3C Trace Context recommendation.
constexpr const char* kExample = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

TEST(TraceContext, ParsesTheSpecExample) {
  const auto context = parse_traceparent(kExample);
  ASSERT_TRUE(context);
  EXPECT_EQ(context->trace_id_hex(), "4bf92f3577b34da6a3ce929d0e0e4736");
  EXPECT_EQ(context->parent_id_hex(), "00f067aa0ba902b7");
  EXPECT_EQ(context->flags, 0x01);
  EXPECT_EQ(context->traceparent(), kExample);
}

// Written into a header line being built: after what is there, unchanged.
TEST(TraceContext, AppendsTraceparentAfterWhatIsThere) {
  auto parsed = parse_traceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01");
  ASSERT_TRUE(parsed.has_value());
  std::string line = "traceparent: ";
  parsed->append_traceparent(line);
  EXPECT_EQ(line, "traceparent: 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01");
  EXPECT_EQ(parsed->traceparent(), "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01");
}

// Ids are written most significant byte first, whatever the machine's order.
TEST(TraceContext, MadeIdsAreBigEndian) {
  EXPECT_EQ(make_trace_context(0x0123456789abcdef, 0xfedcba9876543210, 0x1122334455667788, 1)
                .traceparent(),
            "00-0123456789abcdeffedcba9876543210-1122334455667788-01");
  // All-zero ids are invalid, so a zero draw becomes 1.
  EXPECT_EQ(make_trace_context(0, 0, 0, 0).traceparent(),
            "00-00000000000000000000000000000001-0000000000000001-00");
}

TEST(TraceContext, AcceptsValidVariants) {
  // Unsampled, other flag bits (kept as they are), surrounding whitespace.
  EXPECT_EQ(parse_traceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00")->flags,
            0x00);
  EXPECT_EQ(parse_traceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-ff")->flags,
            0xff);
  EXPECT_TRUE(parse_traceparent(" \t00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01 "));
  // A future version is read as 00 when it is exactly as long or goes on with '-'.
  EXPECT_TRUE(parse_traceparent("cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"));
  EXPECT_TRUE(
      parse_traceparent("cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what-the-future"));
  // Ids with a single non-zero digit are valid.
  EXPECT_TRUE(parse_traceparent("00-00000000000000000000000000000001-0000000000000001-01"));
}

TEST(TraceContext, RejectsMalformedValues) {
  const std::vector<std::string> invalid = {
      "",
      "00",
      // Uppercase hex is not allowed anywhere.
      "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
      "00-4bf92f3577b34da6a3ce929d0e0e4736-00F067AA0BA902B7-01",
      "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0A",
      "0A-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
      // All-zero ids.
      "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
      "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
      // Version ff is forbidden.
      "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
      // Version 00 has exactly four fields.
      "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
      "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-010",
      // A future version must continue with '-'.
      "cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01.what",
      // Wrong lengths and separators.
      "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
      "00-4bf92f3577b34da6a3ce929d0e0e47366-00f067aa0ba902b7-01",
      "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b-01",
      "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-1",
      "00_4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7_01",
      "004bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-",
      // Not hex.
      "00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01",
      "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902bz-01",
      "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0x",
      "00-+bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
      // Whitespace inside.
      "00-4bf92f3577b34da6a3ce929d0e0e4736 -00f067aa0ba902b7-01",
  };
  for (const std::string& value : invalid) {
    EXPECT_FALSE(parse_traceparent(value)) << value;
  }
}

// A fixed sequence standing in for a worker's random source.
struct Sequence {
  std::vector<std::uint64_t> values;
  std::size_t next = 0;
  std::uint64_t operator()() { return values[next++ % values.size()]; }
};

TEST(TraceContext, NewTraceUsesTheRandomSource) {
  Sequence random{{0x0123456789abcdefULL, 0xfedcba9876543210ULL, 0x1122334455667788ULL}};
  const TraceContext context = new_trace_context(random);
  EXPECT_EQ(context.trace_id_hex(), "0123456789abcdeffedcba9876543210");
  EXPECT_EQ(context.parent_id_hex(), "1122334455667788");
  EXPECT_EQ(context.flags, TraceContext::kSampled);
  EXPECT_EQ(context.traceparent(), "00-0123456789abcdeffedcba9876543210-1122334455667788-01");
  // What we generate, we parse back.
  EXPECT_EQ(parse_traceparent(context.traceparent()), context);
}

TEST(TraceContext, ZeroRandomWordsStillGiveValidIds) {
  Sequence zeros{{0}};
  const TraceContext context = new_trace_context(zeros, 0x00);
  EXPECT_TRUE(parse_traceparent(context.traceparent())) << context.traceparent();
  EXPECT_EQ(context.flags, 0x00);
}

TEST(TraceContext, NextHopKeepsTraceAndFlagsWithANewParent) {
  const TraceContext incoming = *parse_traceparent(kExample);
  Sequence random{{0xaaaabbbbccccddddULL}};
  const TraceContext hop = next_hop(incoming, random);
  EXPECT_EQ(hop.trace_id, incoming.trace_id);
  EXPECT_EQ(hop.flags, incoming.flags);
  EXPECT_EQ(hop.parent_id_hex(), "aaaabbbbccccdddd");
  EXPECT_EQ(hop.traceparent(), "00-4bf92f3577b34da6a3ce929d0e0e4736-aaaabbbbccccdddd-01");

  // A future-version header is forwarded as version 00.
  const TraceContext future =
      *parse_traceparent("cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-03-extra");
  EXPECT_EQ(next_hop(future, random).traceparent().substr(0, 3), "00-");
  EXPECT_EQ(next_hop(future, random).flags, 0x03);
}

TEST(TraceContext, GeneratedIdsDiffer) {
  std::uint64_t state = 0x853c49e6748fea9bULL;
  auto splitmix = [&state] {
    std::uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  };
  std::set<std::string> seen;
  for (int i = 0; i < 1000; ++i) seen.insert(new_trace_context(splitmix).traceparent());
  EXPECT_EQ(seen.size(), 1000u);
}

}  // namespace
}  // namespace sluice::metrics
