#include "sluice/stream/finish_reason.hpp"

#include <gtest/gtest.h>

#include <string>
#include <string_view>

namespace sluice::stream {
namespace {

// The watch fed `text` cut at every position into two reads.
template <class Check>
void at_every_cut(std::string_view text, Check check) {
  for (std::size_t cut = 0; cut <= text.size(); ++cut) {
    FinishReasonWatch watch;
    watch.feed(text.substr(0, cut));
    watch.feed(text.substr(cut));
    check(watch, cut);
  }
}

TEST(FinishReasonWatch, FindsALengthStopWhereverTheReadsSplitIt) {
  const std::string_view event =
      R"(data: {"choices":[{"index":0,"delta":{},"finish_reason": "length"}]})"
      "\n\n";
  at_every_cut(event, [](const FinishReasonWatch& watch, std::size_t cut) {
    EXPECT_TRUE(watch.saw_reason()) << cut;
    EXPECT_TRUE(watch.saw_length()) << cut;
  });
}

TEST(FinishReasonWatch, NullIsNoReasonAndStopIsNoLength) {
  const std::string_view events =
      R"(data: {"choices":[{"delta":{"content":"a"},"finish_reason":null}]})"
      "\n\n"
      R"(data: {"choices":[{"delta":{},"finish_reason":"stop"}]})"
      "\n\n";
  at_every_cut(events.substr(0, events.find("data", 2)),
               [](const FinishReasonWatch& watch, std::size_t cut) {
                 EXPECT_FALSE(watch.saw_reason()) << cut;
               });
  at_every_cut(events, [](const FinishReasonWatch& watch, std::size_t cut) {
    EXPECT_TRUE(watch.saw_reason()) << cut;
    EXPECT_FALSE(watch.saw_length()) << cut;
  });
}

TEST(FinishReasonWatch, TheKeysSpellingInsideTextOrAsAValueIsNoKey) {
  FinishReasonWatch watch;
  // What the model wrote: its quotes are escaped.
  watch.feed(R"({"content":"say \"finish_reason\":\"length\" twice"})");
  // A value spelt like the key, then an object key of another name.
  watch.feed(R"({"name":"finish_reason","finish_reason_x":"length","reason":"length"})");
  EXPECT_FALSE(watch.saw_reason());
  EXPECT_FALSE(watch.saw_length());
  // "lengthy" and "" are not a length stop; the first is a reason.
  FinishReasonWatch other;
  other.feed(R"({"finish_reason":""}{"finish_reason":"lengthy"})");
  EXPECT_TRUE(other.saw_reason());
  EXPECT_FALSE(other.saw_length());
}

TEST(FinishReasonWatch, AKeyRightAfterAnotherQuoteIsFound) {
  FinishReasonWatch watch;
  watch.feed(R"({"a":"""finish_reason":"length"})");
  EXPECT_TRUE(watch.saw_length());
}

}  // namespace
}  // namespace sluice::stream
