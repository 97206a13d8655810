#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "response_parser.hpp"

namespace sluice::bench {
namespace {

// The stamps of the events completed in `body`, fed in pieces of `piece`
// bytes (0: all at once); 0 for an event without one.
std::vector<std::uint64_t> stamps_of(std::string_view body, std::size_t piece = 0) {
  SseEventScanner scanner;
  std::vector<std::uint64_t> stamps;
  if (piece == 0) piece = body.size();
  for (std::size_t at = 0; at < body.size(); at += piece) {
    const std::string_view part = body.substr(at, piece);
    scanner.scan(part.data(), part.size(),
                 [&](std::uint64_t sent_ns) { stamps.push_back(sent_ns); });
  }
  return stamps;
}

constexpr std::string_view kStampedStream =
    "data: {\"sent_ns\":1234567890123,\"id\":\"c1\",\"choices\":[]}\n\n"
    "data: {\"sent_ns\":1234587890999,\"id\":\"c1\",\"choices\":[]}\n\n"
    "data: [DONE]\n\n";

TEST(SseEventScanner, ReadsTheStampOfEveryStampedEvent) {
  EXPECT_EQ(stamps_of(kStampedStream),
            (std::vector<std::uint64_t>{1234567890123, 1234587890999, 0}));
}

TEST(SseEventScanner, StampsSplitAcrossReadsAreReadWhole) {
  const std::vector<std::uint64_t> expected{1234567890123, 1234587890999, 0};
  for (std::size_t piece = 1; piece < kStampedStream.size(); ++piece) {
    EXPECT_EQ(stamps_of(kStampedStream, piece), expected) << "pieces of " << piece << " bytes";
  }
}

TEST(SseEventScanner, UnstampedEventsCountWithoutAStamp) {
  EXPECT_EQ(stamps_of("data: {\"id\":\"c1\"}\n\ndata: {\"sent\":5}\n\n"),
            (std::vector<std::uint64_t>{0, 0}));
  // Only the stamp that opens the object counts: anywhere else it is content.
  EXPECT_EQ(stamps_of("data: {\"id\":\"x\",\"sent_ns\":7}\n\n"), (std::vector<std::uint64_t>{0}));
  EXPECT_EQ(stamps_of(": data: {\"sent_ns\":7}\ndata: {}\n\n"), (std::vector<std::uint64_t>{0}));
}

TEST(SseEventScanner, StampOnTheDataLineOfANamedEventAndWithCrlf) {
  EXPECT_EQ(stamps_of("event: response.output_text.delta\r\n"
                      "data: {\"sent_ns\":42,\"type\":\"response.output_text.delta\"}\r\n\r\n"),
            (std::vector<std::uint64_t>{42}));
}

TEST(SseEventScanner, ResetForgetsAHalfReadEvent) {
  SseEventScanner scanner;
  std::vector<std::uint64_t> stamps;
  auto record = [&](std::uint64_t sent_ns) { stamps.push_back(sent_ns); };
  const std::string_view cut = "data: {\"sent_ns\":99";
  scanner.scan(cut.data(), cut.size(), record);
  scanner.reset();
  const std::string_view next = "data: {\"id\":1}\n\n";
  scanner.scan(next.data(), next.size(), record);
  EXPECT_EQ(stamps, (std::vector<std::uint64_t>{0}));
}

}  // namespace
}  // namespace sluice::bench
