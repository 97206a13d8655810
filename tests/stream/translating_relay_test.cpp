#include <gtest/gtest.h>

#include <string>

#include "sluice/stream/translating_relay.hpp"

namespace sluice::stream {
namespace {

// The events of `text` as next_event_end splits it, and what is left.
std::vector<std::string> events_of(std::string_view text, std::string_view* rest = nullptr) {
  std::vector<std::string> events;
  for (;;) {
    std::size_t event_end = 0;
    const auto end = next_event_end(text, event_end);
    if (end == std::string_view::npos) break;
    events.emplace_back(text.substr(0, event_end));
    text.remove_prefix(end);
  }
  if (rest) *rest = text;
  return events;
}

TEST(EventSplitting, EveryLineEndingOfTheSpecEndsAnEvent) {
  std::string_view rest;
  EXPECT_EQ(events_of("data: a\n\ndata: b\r\n\r\nevent: x\rdata: c\r\rdata: d", &rest),
            (std::vector<std::string>{"data: a", "data: b", "event: x\rdata: c"}));
  EXPECT_EQ(rest, "data: d");
  EXPECT_EQ(events_of("event: delta\ndata: {}\n\n"),
            (std::vector<std::string>{"event: delta\ndata: {}"}));
}

TEST(EventSplitting, AnEventNotYetWholeWaits) {
  std::string_view rest;
  EXPECT_TRUE(events_of("data: a\n", &rest).empty());
  EXPECT_EQ(rest, "data: a\n");
  // A CR that may yet be followed by LF decides nothing.
  EXPECT_TRUE(events_of("data: a\r\n\r", &rest).empty());
  EXPECT_EQ(events_of("data: a\n\ndata: b", &rest), (std::vector<std::string>{"data: a"}));
  EXPECT_EQ(rest, "data: b");
}

}  // namespace
}  // namespace sluice::stream
