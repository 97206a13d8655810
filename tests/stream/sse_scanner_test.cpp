// The scanner must see the same events whatever the read boundaries, and the
// client must get the upstream's bytes unchanged (minus a stripped usage-only
// chunk), without extra copies or allocations on the token path.
#include "sluice/stream/sse_scanner.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <new>
#include <random>
#include <string>
#include <vector>

namespace {

// Counts allocations made on the calling thread, for the steady-state test.
thread_local std::size_t allocations_on_this_thread = 0;

void* counted_allocation(std::size_t size) {
  ++allocations_on_this_thread;
  if (void* memory = std::malloc(size == 0 ? 1 : size)) return memory;
  throw std::bad_alloc();
}

}  // namespace

// Every form that the replaced deletes free, so that nothing allocated by
// the toolchain's own operator new (the nothrow forms, which the standard
// library's temporary buffers use) is handed to free.
void* operator new(std::size_t size) { return counted_allocation(size); }
void* operator new[](std::size_t size) { return counted_allocation(size); }
void* operator new(std::size_t size, const std::nothrow_t&) noexcept {
  ++allocations_on_this_thread;
  return std::malloc(size == 0 ? 1 : size);
}
void* operator new[](std::size_t size, const std::nothrow_t& tag) noexcept {
  return operator new(size, tag);
}
void operator delete(void* memory) noexcept { std::free(memory); }
void operator delete[](void* memory) noexcept { std::free(memory); }
void operator delete(void* memory, std::size_t) noexcept { std::free(memory); }
void operator delete[](void* memory, std::size_t) noexcept { std::free(memory); }
void operator delete(void* memory, const std::nothrow_t&) noexcept { std::free(memory); }
void operator delete[](void* memory, const std::nothrow_t&) noexcept { std::free(memory); }

namespace sluice::stream {
namespace {

const std::string kRoleChunk =
    R"(data: {"id":"chatcmpl-9x","object":"chat.completion.chunk","created":1718000000,)"
    R"("model":"gpt-4o-mini-2024-07-18","system_fingerprint":"fp_0ba0d124f1","choices":[{)"
    R"("index":0,"delta":{"role":"assistant","content":"","refusal":null},"logprobs":null,)"
    R"("finish_reason":null}],"usage":null})"
    "\n\n";

std::string content_chunk(const std::string& text) {
  return R"(data: {"id":"chatcmpl-9x","object":"chat.completion.chunk","created":1718000000,)"
         R"("model":"gpt-4o-mini-2024-07-18","system_fingerprint":"fp_0ba0d124f1","choices":[{)"
         R"("index":0,"delta":{"content":")" +
         text + R"("},"logprobs":null,"finish_reason":null}],"usage":null})" + "\n\n";
}

const std::string kFinishChunk =
    R"(data: {"id":"chatcmpl-9x","object":"chat.completion.chunk","created":1718000000,)"
    R"("model":"gpt-4o-mini-2024-07-18","system_fingerprint":"fp_0ba0d124f1","choices":[{)"
    R"("index":0,"delta":{},"logprobs":null,"finish_reason":"stop"}],"usage":null})"
    "\n\n";

const std::string kUsageOnlyChunk =
    R"(data: {"id":"chatcmpl-9x","object":"chat.completion.chunk","created":1718000000,)"
    R"("model":"gpt-4o-mini-2024-07-18","system_fingerprint":"fp_0ba0d124f1","choices":[],)"
    R"("usage":{"prompt_tokens":19,"completion_tokens":7,"total_tokens":26,)"
    R"("prompt_tokens_details":{"cached_tokens":0,"audio_tokens":0},)"
    R"("completion_tokens_details":{"reasoning_tokens":0,"audio_tokens":0}}})"
    "\n\n";

const std::string kDone = "data: [DONE]\n\n";

const Usage kStreamUsage{19, 7, 26};

std::string with_line_ends(const std::string& text, std::string_view line_end) {
  std::string converted;
  for (char c : text) {
    if (c == '\n') {
      converted += line_end;
    } else {
      converted += c;
    }
  }
  return converted;
}

struct ChatStream {
  std::string full;
  std::string without_usage_chunk;
};

ChatStream chat_stream(std::string_view line_end) {
  const std::string before = kRoleChunk + content_chunk("Hello") + content_chunk(" there") +
                             content_chunk("!") + kFinishChunk;
  return {with_line_ends(before + kUsageOnlyChunk + kDone, line_end),
          with_line_ends(before + kDone, line_end)};
}

constexpr std::size_t kChatStreamEvents = 7;

struct Outcome {
  std::string written;
  // Whether every feed answered with exactly the piece it was given.
  bool each_feed_was_its_piece = true;
};

// Feeds `stream` cut at `cuts` through one reused read buffer, which is
// scribbled over after each feed so that a view kept into an old piece shows.
Outcome feed_pieces(SseScanner& scanner, std::string_view stream,
                    const std::vector<std::size_t>& cuts) {
  Outcome outcome;
  std::string buffer;
  std::vector<std::string_view> out;
  std::size_t begin = 0;
  auto feed_up_to = [&](std::size_t end) {
    if (end <= begin) return;
    buffer.assign(stream.substr(begin, end - begin));
    out.clear();
    scanner.feed(buffer, out);
    const bool is_piece =
        out.size() == 1 && out[0].data() == buffer.data() && out[0].size() == buffer.size();
    if (!is_piece) outcome.each_feed_was_its_piece = false;
    for (auto span : out) outcome.written += span;
    std::fill(buffer.begin(), buffer.end(), '#');
    begin = end;
  };
  for (auto cut : cuts) feed_up_to(cut);
  feed_up_to(stream.size());
  out.clear();
  scanner.finish(out);
  for (auto span : out) outcome.written += span;
  return outcome;
}

Outcome feed_whole(SseScanner& scanner, std::string_view stream) {
  return feed_pieces(scanner, stream, {});
}

TEST(SseScanner, WholeChatStream) {
  const auto stream = chat_stream("\n");
  SseScanner scanner;
  auto outcome = feed_whole(scanner, stream.full);
  EXPECT_EQ(outcome.written, stream.full);
  EXPECT_TRUE(outcome.each_feed_was_its_piece);
  EXPECT_EQ(scanner.usage(), kStreamUsage);
  EXPECT_TRUE(scanner.saw_done());
  EXPECT_FALSE(scanner.saw_error());
  EXPECT_EQ(scanner.events(), kChatStreamEvents);
  EXPECT_EQ(scanner.stripped_events(), 0u);
  EXPECT_TRUE(scanner.at_event_boundary());
}

TEST(SseScanner, WholeChatStreamStripped) {
  const auto stream = chat_stream("\n");
  SseScanner scanner;
  scanner.set_strip_usage_only_chunks(true);
  auto outcome = feed_whole(scanner, stream.full);
  EXPECT_EQ(outcome.written, stream.without_usage_chunk);
  EXPECT_EQ(scanner.usage(), kStreamUsage);
  EXPECT_TRUE(scanner.saw_done());
  EXPECT_EQ(scanner.events(), kChatStreamEvents);
  EXPECT_EQ(scanner.stripped_events(), 1u);
}

class SseScannerLineEnds : public ::testing::TestWithParam<std::string_view> {};

INSTANTIATE_TEST_SUITE_P(SseAllLineEnds, SseScannerLineEnds,
                         ::testing::Values(std::string_view("\n"), std::string_view("\r\n"),
                                           std::string_view("\r")),
                         [](const auto& info) {
                           return info.param == "\n"     ? std::string("LF")
                                  : info.param == "\r\n" ? std::string("CRLF")
                                                         : std::string("CR");
                         });

void expect_stream_results(const SseScanner& scanner, const std::string& context) {
  EXPECT_EQ(scanner.usage(), kStreamUsage) << context;
  EXPECT_TRUE(scanner.saw_done()) << context;
  EXPECT_FALSE(scanner.saw_error()) << context;
  EXPECT_EQ(scanner.events(), kChatStreamEvents) << context;
}

TEST_P(SseScannerLineEnds, EverySingleSplitPoint) {
  const auto stream = chat_stream(GetParam());
  for (std::size_t cut = 1; cut < stream.full.size(); ++cut) {
    const std::string context = "cut at " + std::to_string(cut);
    {
      SseScanner scanner;
      auto outcome = feed_pieces(scanner, stream.full, {cut});
      ASSERT_EQ(outcome.written, stream.full) << context;
      ASSERT_TRUE(outcome.each_feed_was_its_piece) << context;
      expect_stream_results(scanner, context);
      EXPECT_EQ(scanner.stripped_events(), 0u) << context;
    }
    {
      SseScanner scanner;
      scanner.set_strip_usage_only_chunks(true);
      auto outcome = feed_pieces(scanner, stream.full, {cut});
      ASSERT_EQ(outcome.written, stream.without_usage_chunk) << context;
      expect_stream_results(scanner, context);
      EXPECT_EQ(scanner.stripped_events(), 1u) << context;
    }
  }
}

TEST_P(SseScannerLineEnds, RandomMultiSplits) {
  const auto stream = chat_stream(GetParam());
  std::mt19937 random(20240611);
  for (int round = 0; round < 300; ++round) {
    std::uniform_int_distribution<std::size_t> step(1, round % 2 == 0 ? 8 : 120);
    std::vector<std::size_t> cuts;
    for (std::size_t at = step(random); at < stream.full.size(); at += step(random)) {
      cuts.push_back(at);
    }
    const std::string context = "round " + std::to_string(round);
    for (bool strip : {false, true}) {
      SseScanner scanner;
      scanner.set_strip_usage_only_chunks(strip);
      auto outcome = feed_pieces(scanner, stream.full, cuts);
      ASSERT_EQ(outcome.written, strip ? stream.without_usage_chunk : stream.full) << context;
      if (!strip) {
        ASSERT_TRUE(outcome.each_feed_was_its_piece) << context;
      }
      expect_stream_results(scanner, context);
      EXPECT_EQ(scanner.stripped_events(), strip ? 1u : 0u) << context;
    }
  }
}

TEST(SseScanner, DataWithoutSpaceAndExtraSpaces) {
  SseScanner scanner;
  feed_whole(scanner,
             "data:{\"choices\":[],\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":2,"
             "\"total_tokens\":3}}\n\ndata:[DONE]\n\n");
  EXPECT_EQ(scanner.usage(), (Usage{1, 2, 3}));
  EXPECT_TRUE(scanner.saw_done());
  EXPECT_EQ(scanner.events(), 2u);

  // Only one space is dropped; JSON does not mind the rest.
  SseScanner spaced;
  feed_whole(spaced,
             "data:   {\"usage\":{\"prompt_tokens\":4,\"completion_tokens\":5}}\n\n"
             "data:  [DONE]\n\n");
  EXPECT_EQ(spaced.usage(), (Usage{4, 5, 9}));
  EXPECT_TRUE(spaced.saw_done());
}

TEST(SseScanner, MultiLineDataIsJoinedWithNewlines) {
  const std::string stream =
      "data: {\"choices\":[],\n"
      "data: \"usage\":{\"prompt_tokens\":3,\n"
      "data: \"completion_tokens\":4,\"total_tokens\":7}}\n"
      "\n"
      "data: [DONE]\n\n";
  for (std::size_t cut = 1; cut < stream.size(); ++cut) {
    SseScanner scanner;
    scanner.set_strip_usage_only_chunks(true);
    auto outcome = feed_pieces(scanner, stream, {cut});
    EXPECT_EQ(scanner.usage(), (Usage{3, 4, 7})) << cut;
    EXPECT_EQ(outcome.written, "data: [DONE]\n\n") << cut;
    EXPECT_EQ(scanner.events(), 2u) << cut;
  }
}

TEST(SseScanner, CommentsAndOtherFieldsAreNotEvents) {
  SseScanner scanner;
  const std::string stream =
      ": keep-alive\n\n"
      ":\n\n"
      "retry: 1000\nid: 7\n: a comment inside an event\ndata: [DONE]\n\n";
  auto outcome = feed_whole(scanner, stream);
  EXPECT_EQ(outcome.written, stream);
  EXPECT_EQ(scanner.events(), 1u);
  EXPECT_TRUE(scanner.saw_done());
  EXPECT_FALSE(scanner.usage());
}

TEST(SseScanner, ErrorEvents) {
  {
    SseScanner scanner;
    feed_whole(scanner,
               "data: {\"error\":{\"message\":\"overloaded\",\"type\":\"server_error\"}}\n\n");
    EXPECT_TRUE(scanner.saw_error());
  }
  {
    SseScanner scanner;
    feed_whole(scanner, "event: error\ndata: {\"type\":\"error\",\"code\":\"server_error\"}\n\n");
    EXPECT_TRUE(scanner.saw_error());
  }
  {
    SseScanner scanner;
    feed_whole(scanner, "event: error\ndata: not json\n\n");
    EXPECT_TRUE(scanner.saw_error());
  }
  {
    // The event type is split across pieces.
    SseScanner scanner;
    feed_pieces(scanner, "event: error\r\ndata: x\r\n\r\n", {8, 10});
    EXPECT_TRUE(scanner.saw_error());
  }
  {
    // The word inside content, an `error: null` field, and other event types
    // are not errors.
    SseScanner scanner;
    feed_whole(scanner,
               "data: {\"choices\":[{\"delta\":{\"content\":\"\\\"error\\\"\"}}]}\n\n"
               "data: {\"choices\":[],\"error\":null}\n\n"
               "event: errors\ndata: {}\n\n"
               "event: error\nevent: message\ndata: {}\n\n");
    EXPECT_FALSE(scanner.saw_error());
    EXPECT_EQ(scanner.events(), 4u);
  }
}

TEST(SseScanner, AnErrorKeyIsFoundWhereverItFalls) {
  for (std::size_t pad = 0; pad < 48; ++pad) {
    const std::string before = R"({"p":")" + std::string(pad, 'x') + R"(","eeeee":1,"errors":2,)";
    SseScanner with_error;
    feed_whole(with_error, "data: " + before + R"("error":{"message":"m"}})" + "\n\n");
    EXPECT_TRUE(with_error.saw_error()) << pad;
    SseScanner without;
    feed_whole(without, "data: " + before + R"("errorx":{"message":"m"}})" + "\n\n");
    EXPECT_FALSE(without.saw_error()) << pad;
    // The key among the payload's last sixteen bytes.
    SseScanner at_the_end;
    feed_whole(at_the_end, "data: " + before + R"("error":1})" + "\n\n");
    EXPECT_TRUE(at_the_end.saw_error()) << pad;
  }
}

// A data line's end and the start of a "usage" or "error" key are looked for
// sixteen or thirty-two positions at a time, the last block overlapping the
// one before: each way is compared here with a byte-by-byte reading for every
// start in many texts made mostly of the bytes the search looks for.
void expect_line_scan_agrees_with_bytes(detail::DataLine (*scan)(std::string_view, std::size_t)) {
  std::mt19937 random(20261201);
  const std::string alphabet = "\n\r\"uex";
  for (int round = 0; round < 3000; ++round) {
    std::string text(random() % (round % 3 == 0 ? 160 : 80), 'x');
    for (char& c : text) {
      if (random() % 3 != 0) c = alphabet[random() % alphabet.size()];
    }
    // Long runs without a line end, so that the blocks, not the byte loop,
    // find it; and without a key start, so that the last block finds that.
    if (round % 2 == 0) {
      std::replace(text.begin(), text.end(), '\n', 'x');
      std::replace(text.begin(), text.end(), '\r', 'x');
      if (!text.empty()) text[random() % text.size()] = random() % 2 ? '\n' : '\r';
    }
    if (round % 4 == 0) std::replace(text.begin(), text.end(), '"', 'x');
    if (round % 8 == 0 && !text.empty()) text[random() % text.size()] = '"';
    for (std::size_t from = 0; from <= text.size(); ++from) {
      std::size_t end = from;
      while (end < text.size() && text[end] != '\n' && text[end] != '\r') ++end;
      std::size_t first_key_start = detail::DataLine::kNone;
      for (std::size_t at = from; at < end && first_key_start == detail::DataLine::kNone; ++at) {
        const bool key_start = text[at] == '"' && (at + 1 == text.size() || text[at + 1] == 'u' ||
                                                   text[at + 1] == 'e');
        if (key_start) first_key_start = at;
      }
      const auto line = scan(text, from);
      ASSERT_EQ(line.end, end) << "text '" << text << "' from " << from;
      ASSERT_EQ(line.first_key_start, first_key_start) << "text '" << text << "' from " << from;
    }
  }
}

TEST(SseScannerDataLine, SixteenWideAgreesWithAByteByByteReading) {
  expect_line_scan_agrees_with_bytes(detail::scan_data_line_sse2);
}

#if defined(__x86_64__)
TEST(SseScannerDataLine, ThirtyTwoWideAgreesWithAByteByByteReading) {
  if (!detail::has_avx2_line_scan()) GTEST_SKIP() << "this processor has no AVX2";
  expect_line_scan_agrees_with_bytes(detail::scan_data_line_avx2);
}
#endif

TEST(SseScannerDataLine, TheScanInUseAgreesWithAByteByByteReading) {
  expect_line_scan_agrees_with_bytes(detail::scan_data_line);
}

// Token chunks are not parsed, yet a usage object is found wherever it falls
// in its line and wherever the line falls in the piece.
TEST(SseScanner, AUsageKeyIsFoundWhereverItFalls) {
  for (std::size_t pad = 0; pad < 40; ++pad) {
    for (std::size_t lead = 0; lead < 20; ++lead) {
      const std::string before = R"({"p":")" + std::string(pad, 'x') + R"(","uxxxe":1,"usagf":{},)";
      const std::string leading_comment = ":" + std::string(lead, 'c') + "\n";
      // Spaces before the payload, beyond the one the field takes, are JSON's.
      const std::string field = "data:" + std::string(1 + lead % 3, ' ');
      SseScanner with_usage;
      feed_whole(with_usage, leading_comment + field + before +
                                 R"("usage":{"prompt_tokens":3,"total_tokens":3}})" + "\n\n");
      EXPECT_EQ(with_usage.usage(), (Usage{3, 0, 3})) << pad << " " << lead;
      SseScanner near_miss;
      feed_whole(near_miss,
                 leading_comment + "data: " + before + R"("usages":{"prompt_tokens":3}})" + "\n\n");
      EXPECT_FALSE(near_miss.usage()) << pad << " " << lead;
      // A null usage and an error key before the object are passed over.
      SseScanner after_null;
      feed_whole(after_null, leading_comment + field + R"({"error":null,"usage":null,)" +
                                 before.substr(1) + R"("usage":{"total_tokens":5}})" + "\n\n");
      EXPECT_EQ(after_null.usage(), (Usage{0, 0, 5})) << pad << " " << lead;
      EXPECT_FALSE(after_null.saw_error()) << pad << " " << lead;
      SseScanner carriage_returns;
      feed_whole(carriage_returns, leading_comment + "data: " + before +
                                       R"("usage":{"total_tokens":4}})" + "\r\n\r\n");
      EXPECT_EQ(carriage_returns.usage(), (Usage{0, 0, 4})) << pad << " " << lead;
    }
  }
}

// A usage object at the payload's top level is read by a scan, everything
// else by the JSON parser; either way each payload below comes to the same.
TEST(SseScanner, UsageChunksReadWithOrWithoutTheParser) {
  struct Case {
    std::string payload;
    std::optional<Usage> usage;
    bool stripped;
    bool error;
  };
  const std::string counts = R"({"prompt_tokens":1,"completion_tokens":2,"total_tokens":3})";
  const std::vector<Case> cases = {
      {R"({"id":"c","choices":[],"usage":)" + counts + "}", Usage{1, 2, 3}, true, false},
      {R"( { "choices" : [ ] , "usage" : )" + counts + " } ", Usage{1, 2, 3}, true, false},
      {R"({"choices":[{"index":0}],"usage":)" + counts + "}", Usage{1, 2, 3}, false, false},
      {R"({"choices":{},"usage":)" + counts + "}", Usage{1, 2, 3}, false, false},
      {R"({"usage":)" + counts + "}", Usage{1, 2, 3}, false, false},
      // The last of repeated keys wins, also when one is written with escapes.
      {R"({"choices":[],"usage":{"prompt_tokens":1},"usage":{"prompt_tokens":2}})", Usage{2, 0, 2},
       true, false},
      {R"({"choices":[],"usage":{"prompt_tokens":1},"us\u0061ge":{"prompt_tokens":4}})",
       Usage{4, 0, 4}, true, false},
      // No counters at the top: a nested usage object counts.
      {R"({"usage":{},"response":{"usage":{"input_tokens":4,"output_tokens":1}}})", Usage{4, 1, 5},
       false, false},
      {R"({"type":"response.completed","response":{"usage":{"input_tokens":4}}})", Usage{4, 0, 4},
       false, false},
      // Not valid JSON: nothing is read, nothing is stripped, wherever the
      // fault is.
      {R"({"choices":[],"usage":{"prompt_tokens":1}} trailing)", std::nullopt, false, false},
      {R"({"created":12a3,"choices":[],"usage":{"prompt_tokens":1}})", std::nullopt, false, false},
      {R"({"id":"\x","choices":[],"usage":{"prompt_tokens":1}})", std::nullopt, false, false},
      {R"({"choices":[],"usage":{"prompt_tokens":1,"details":{"a":tru}}})", std::nullopt, false,
       false},
      {R"({"choices":[],"usage":{"prompt_tokens":1})", std::nullopt, false, false},
      {R"({"choices":[] "usage":{"prompt_tokens":1}})", std::nullopt, false, false},
      // Read as it came, these are ruled out before their end (a first
      // "choices" with an item, a NUL after the object, which the parser
      // takes for the end of its input): kept however the reads split them.
      {R"({"choices":[1],"choices":[],"usage":{"prompt_tokens":1}})", Usage{1, 0, 1}, false, false},
      {std::string(R"({"choices":[],"usage":{"prompt_tokens":1}})") + '\0' + "@", Usage{1, 0, 1},
       false, false},
      // An error beside the usage.
      {R"({"choices":[],"usage":{"prompt_tokens":1},"error":{"message":"m"}})", Usage{1, 0, 1},
       true, true},
      {R"({"type":"error","usage":{"prompt_tokens":1}})", Usage{1, 0, 1}, false, true},
  };
  for (const auto& test : cases) {
    const std::string event = "data: " + test.payload + "\n\n";
    SseScanner scanner;
    scanner.set_strip_usage_only_chunks(true);
    const auto outcome = feed_whole(scanner, event);
    EXPECT_EQ(scanner.usage(), test.usage) << test.payload;
    EXPECT_EQ(outcome.written, test.stripped ? "" : event) << test.payload;
    EXPECT_EQ(scanner.saw_error(), test.error) << test.payload;
  }
}

TEST(SseScanner, UsageInsideTheLastContentChunk) {
  const std::string stream =
      content_chunk("Hi") +
      "data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}],"
      "\"usage\":{\"prompt_tokens\":8,\"completion_tokens\":2,\"total_tokens\":10}}\n\n" +
      kDone;
  for (bool strip : {false, true}) {
    SseScanner scanner;
    scanner.set_strip_usage_only_chunks(strip);
    auto outcome = feed_pieces(scanner, stream, {stream.size() / 2});
    EXPECT_EQ(outcome.written, stream);
    EXPECT_EQ(scanner.usage(), (Usage{8, 2, 10}));
    EXPECT_EQ(scanner.stripped_events(), 0u);
  }
}

TEST(SseScanner, ChunkWithEmptyChoicesButNoUsageIsKept) {
  // Azure sends prompt filter results this way.
  const std::string stream =
      "data: {\"choices\":[],\"created\":0,\"id\":\"\",\"prompt_filter_results\":[{"
      "\"prompt_index\":0,\"content_filter_results\":{}}],\"usage\":null}\n\n";
  SseScanner scanner;
  scanner.set_strip_usage_only_chunks(true);
  EXPECT_EQ(feed_whole(scanner, stream).written, stream);
  EXPECT_EQ(scanner.stripped_events(), 0u);
}

TEST(SseScanner, ResponsesApiCompletedUsage) {
  const std::string stream =
      "event: response.created\n"
      "data: {\"type\":\"response.created\",\"sequence_number\":0,\"response\":{\"id\":\"resp_1\","
      "\"object\":\"response\",\"status\":\"in_progress\",\"output\":[],\"usage\":null}}\n\n"
      "event: response.output_text.delta\n"
      "data: {\"type\":\"response.output_text.delta\",\"sequence_number\":1,\"item_id\":\"msg_1\","
      "\"output_index\":0,\"content_index\":0,\"delta\":\"Hi\"}\n\n"
      "event: response.completed\n"
      "data: {\"type\":\"response.completed\",\"sequence_number\":2,\"response\":{\"id\":"
      "\"resp_1\",\"object\":\"response\",\"status\":\"completed\",\"output\":[{\"type\":"
      "\"message\",\"id\":\"msg_1\",\"role\":\"assistant\",\"content\":[{\"type\":"
      "\"output_text\",\"text\":\"Hi\"}]}],\"usage\":{\"input_tokens\":11,"
      "\"input_tokens_details\":{\"cached_tokens\":0},\"output_tokens\":4,"
      "\"output_tokens_details\":{\"reasoning_tokens\":0},\"total_tokens\":15}}}\n\n";
  for (std::size_t cut = 1; cut < stream.size(); cut += 7) {
    SseScanner scanner;
    scanner.set_strip_usage_only_chunks(true);
    auto outcome = feed_pieces(scanner, stream, {cut});
    EXPECT_EQ(outcome.written, stream) << cut;
    EXPECT_EQ(scanner.usage(), (Usage{11, 4, 15})) << cut;
    EXPECT_EQ(scanner.events(), 3u) << cut;
    EXPECT_FALSE(scanner.saw_done()) << cut;
    EXPECT_FALSE(scanner.saw_error()) << cut;
  }
}

TEST(SseScanner, LastUsageWins) {
  SseScanner scanner;
  feed_whole(scanner,
             "data: {\"choices\":[{}],\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":1,"
             "\"total_tokens\":2}}\n\n"
             "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":6,"
             "\"total_tokens\":11}}\n\n");
  EXPECT_EQ(scanner.usage(), (Usage{5, 6, 11}));
}

TEST(SseScanner, AnthropicUsageInPartsKeepsTheInputOfMessageStart) {
  SseScanner scanner;
  feed_whole(scanner,
             "event: message_start\n"
             "data: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"usage\":"
             "{\"input_tokens\":25,\"output_tokens\":1}}}\n\n"
             "event: content_block_delta\n"
             "data: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":"
             "\"text_delta\",\"text\":\"Hi\"}}\n\n"
             "event: message_delta\n"
             "data: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},"
             "\"usage\":{\"output_tokens\":15}}\n\n");
  EXPECT_EQ(scanner.usage(), (Usage{25, 15, 40}));
}

TEST(SseScanner, AnthropicCacheTokensCountAsInput) {
  SseScanner scanner;
  feed_whole(scanner,
             "event: message_delta\n"
             "data: {\"type\":\"message_delta\",\"usage\":{\"input_tokens\":5,"
             "\"cache_read_input_tokens\":100,\"cache_creation_input_tokens\":20,"
             "\"output_tokens\":7}}\n\n");
  EXPECT_EQ(scanner.usage(), (Usage{125, 7, 132}));
}

TEST(SseScanner, CarryCapStopsInspectingOnlyTheOversizedEvent) {
  const std::string padding(200, 'x');
  const std::string oversized =
      "data: {\"choices\":[],\"pad\":\"" + padding +
      "\",\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":1,\"total_tokens\":2}}\n\n";
  const std::string next =
      "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":4,"
      "\"total_tokens\":7}}\n\n";
  const std::string stream = oversized + kDone + next;
  for (bool strip : {false, true}) {
    SseScanner scanner(64);
    scanner.set_strip_usage_only_chunks(strip);
    // The oversized event is carried over three pieces; the rest comes whole.
    auto outcome = feed_pieces(scanner, stream, {100, 200, oversized.size()});
    EXPECT_EQ(scanner.events(), 3u);
    EXPECT_TRUE(scanner.saw_done());
    EXPECT_EQ(scanner.usage(), (Usage{3, 4, 7}));
    EXPECT_EQ(outcome.written, strip ? oversized + kDone : stream);
  }
  {
    // Within one piece nothing is carried, so the cap does not apply.
    SseScanner scanner(64);
    scanner.set_strip_usage_only_chunks(true);
    EXPECT_EQ(feed_whole(scanner, oversized).written, "");
    EXPECT_EQ(scanner.usage(), (Usage{1, 1, 2}));
  }
  {
    // A held event that outgrows the cap is released, never lost.
    SseScanner scanner(64);
    scanner.set_strip_usage_only_chunks(true);
    std::vector<std::string_view> out;
    const std::string first = oversized.substr(0, 40);
    const std::string second = oversized.substr(40, 40);
    scanner.feed(first, out);
    EXPECT_TRUE(out.empty());
    scanner.feed(second, out);
    ASSERT_EQ(out.size(), 2u);
    EXPECT_EQ(std::string(out[0]) + std::string(out[1]), oversized.substr(0, 80));
  }
}

TEST(SseScanner, NoStripNeverHoldsBytesBack) {
  SseScanner scanner;
  std::vector<std::string_view> out;
  const std::string partial = kUsageOnlyChunk.substr(0, kUsageOnlyChunk.size() - 30);
  scanner.feed(partial, out);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].data(), partial.data());
  EXPECT_EQ(out[0].size(), partial.size());
  EXPECT_FALSE(scanner.at_event_boundary());
  out.clear();
  scanner.finish(out);
  EXPECT_TRUE(out.empty());
}

TEST(SseScanner, StripReleasesCompleteChunksInTheSameFeed) {
  SseScanner scanner;
  scanner.set_strip_usage_only_chunks(true);
  std::vector<std::string_view> out;
  const std::string two_chunks = kRoleChunk + content_chunk("Hello");
  scanner.feed(two_chunks, out);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].data(), two_chunks.data());
  EXPECT_EQ(out[0].size(), two_chunks.size());
}

TEST(SseScanner, StripReleasesAPartialContentChunkOnceChoicesShowAnItem) {
  SseScanner scanner;
  scanner.set_strip_usage_only_chunks(true);
  std::vector<std::string_view> out;
  const std::string chunk = content_chunk("Hello");
  const auto item_start = chunk.find("\"choices\":[{") + 12;

  const std::string before_choices = chunk.substr(0, item_start - 1);
  scanner.feed(before_choices, out);
  EXPECT_TRUE(out.empty());  // could still be a usage-only chunk

  const std::string item = chunk.substr(item_start - 1, 1);
  scanner.feed(item, out);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0], before_choices);
  EXPECT_EQ(out[1].data(), item.data());

  out.clear();
  const std::string rest = chunk.substr(item_start);
  scanner.feed(rest, out);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].data(), rest.data());
}

// The probe reads each piece's new bytes of the event once, whatever the
// number of reads the event is split over.
TEST(SseScanner, StripReleasesAnEventOfManyReadsWithTheReadThatShowsAnItem) {
  const std::string chunk = content_chunk("Hello");
  const auto item_end = chunk.find("\"choices\":[{") + 12;  // just past the '{'
  for (std::size_t step = 1; step <= 9; ++step) {
    SseScanner scanner;
    scanner.set_strip_usage_only_chunks(true);
    std::vector<std::string_view> out;
    std::string written;
    std::vector<std::string> pieces;
    for (std::size_t at = 0; at < chunk.size(); at += step)
      pieces.push_back(chunk.substr(at, step));
    std::size_t fed = 0;
    for (const auto& piece : pieces) {
      out.clear();
      scanner.feed(piece, out);
      fed += piece.size();
      for (auto span : out) written += span;
      if (fed < item_end) {
        EXPECT_TRUE(written.empty()) << "step " << step << " at " << fed;
      } else if (fed < chunk.size()) {
        EXPECT_EQ(written, chunk.substr(0, fed)) << "step " << step << " at " << fed;
      }
    }
    EXPECT_EQ(written, chunk) << "step " << step;
  }
}

TEST(SseScanner, StripHoldsBackOnlyTheTrailingPartialEvent) {
  SseScanner scanner;
  scanner.set_strip_usage_only_chunks(true);
  std::vector<std::string_view> out;
  const std::string piece = kFinishChunk + kUsageOnlyChunk.substr(0, 50);
  scanner.feed(piece, out);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0], kFinishChunk);
  EXPECT_EQ(out[0].data(), piece.data());

  out.clear();
  const std::string rest = kUsageOnlyChunk.substr(50) + kDone;
  scanner.feed(rest, out);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0], kDone);
  EXPECT_EQ(scanner.usage(), kStreamUsage);
}

TEST(SseScanner, FinishReturnsATruncatedHeldEvent) {
  SseScanner scanner;
  scanner.set_strip_usage_only_chunks(true);
  std::vector<std::string_view> out;
  const std::string truncated = "data: {\"id\":\"x\",\"choices\":[],\"usa";
  scanner.feed(truncated, out);
  EXPECT_TRUE(out.empty());
  scanner.finish(out);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0], truncated);
  EXPECT_EQ(scanner.events(), 0u);  // an unterminated event is not dispatched
}

// One read of a plain upstream brings several chunks, and each is fed as a
// piece of its own, all written at once: the held bytes each piece releases
// must stay as they were until the write, though every next piece holds an
// event of its own.
TEST(SseScanner, FeedMoreKeepsTheHeldSpansOfEveryPieceOfTheWrite) {
  const std::string events[] = {kRoleChunk, content_chunk("Hello"), content_chunk(" there"),
                                kFinishChunk};
  constexpr std::size_t kHeadOfEvent = 30;  // too little of an event to release it
  std::vector<std::string> pieces{events[0].substr(0, kHeadOfEvent)};
  for (std::size_t i = 1; i < std::size(events); ++i) {
    pieces.push_back(events[i - 1].substr(kHeadOfEvent) + events[i].substr(0, kHeadOfEvent));
  }
  pieces.push_back(events[std::size(events) - 1].substr(kHeadOfEvent) + kUsageOnlyChunk +
                   kDone.substr(0, 5));

  SseScanner scanner;
  scanner.set_strip_usage_only_chunks(true);
  std::vector<std::string_view> out;
  scanner.feed(pieces[0], out);
  EXPECT_TRUE(out.empty());  // the first event's head waits for the next piece
  for (std::size_t i = 1; i < pieces.size(); ++i) scanner.feed_more(pieces[i], out);
  scanner.finish(out);
  std::string written;
  for (auto span : out) written += span;
  EXPECT_EQ(written, events[0] + events[1] + events[2] + events[3] + "data:");
  EXPECT_EQ(scanner.usage(), kStreamUsage);
  EXPECT_EQ(scanner.stripped_events(), 1u);

  // The next feed() starts a new write: what it hands out is right too.
  out.clear();
  const std::string next = kDone.substr(5);
  scanner.feed(next, out);
  written.clear();
  for (auto span : out) written += span;
  EXPECT_EQ(written, kDone.substr(5));
}

TEST(SseScanner, AtEventBoundary) {
  SseScanner scanner;
  std::vector<std::string_view> out;
  EXPECT_TRUE(scanner.at_event_boundary());
  scanner.feed("data: {\"a\":", out);
  EXPECT_FALSE(scanner.at_event_boundary());
  scanner.feed("1}\r\n", out);
  EXPECT_FALSE(scanner.at_event_boundary());
  scanner.feed("\r", out);
  EXPECT_TRUE(scanner.at_event_boundary());
  EXPECT_EQ(scanner.events(), 1u);
  scanner.feed("\n", out);  // the rest of that "\r\n"
  EXPECT_TRUE(scanner.at_event_boundary());
  EXPECT_EQ(scanner.events(), 1u);
  scanner.feed(": ping\n", out);
  EXPECT_FALSE(scanner.at_event_boundary());
  scanner.feed("\n", out);
  EXPECT_TRUE(scanner.at_event_boundary());
  EXPECT_EQ(scanner.events(), 1u);
}

TEST(SseScanner, SteadyStateFeedsDoNotAllocate) {
  const std::string token = content_chunk("tok");
  const std::string tokens_with_usage_field = token + token + token;
  const auto half = token.size() / 2;
  for (bool strip : {false, true}) {
    SseScanner scanner;
    scanner.set_strip_usage_only_chunks(strip);
    std::vector<std::string_view> out;
    out.reserve(16);
    std::string buffer;
    buffer.reserve(4096);
    auto feed = [&](std::string_view piece) {
      buffer.assign(piece);
      out.clear();
      scanner.feed(buffer, out);
    };
    // Warm up: the carry buffers grow to the event size once (which also
    // shows that the counter sees the scanner's allocations).
    const auto at_start = allocations_on_this_thread;
    for (int i = 0; i < 3; ++i) {
      feed(token);
      feed(std::string_view(token).substr(0, half));
      feed(std::string_view(token).substr(half));
    }
    const auto before = allocations_on_this_thread;
    EXPECT_GT(before - at_start, 0u);
    for (int i = 0; i < 1000; ++i) {
      feed(token);
      feed(tokens_with_usage_field);
      feed(std::string_view(token).substr(0, half));
      feed(std::string_view(token).substr(half));
    }
    const auto allocated = allocations_on_this_thread - before;
    EXPECT_EQ(allocated, 0u) << (strip ? "strip" : "no strip");
    EXPECT_EQ(scanner.events(), 3u * 2 + 1000u * 5);
  }
}

// The standard library's temporary buffers (std::stable_partition, which
// the upstream pool's idle sweep uses while other tests of this binary run)
// come from the nothrow operator new and go back through the plain delete
// replaced above; under AddressSanitizer a mismatched pair is an error.
TEST(ReplacedAllocation, NothrowNewPairsWithTheReplacedDelete) {
  const auto before = allocations_on_this_thread;
  auto* value = new (std::nothrow) int(7);
  ASSERT_NE(value, nullptr);
  EXPECT_EQ(*value, 7);
  EXPECT_EQ(allocations_on_this_thread, before + 1);
  delete value;
}

TEST(SseUsageFromJsonBody, ChatCompletion) {
  EXPECT_EQ(usage_from_json_body(
                R"({"id":"chatcmpl-1","object":"chat.completion","choices":[{"index":0,)"
                R"("message":{"role":"assistant","content":"usage"},"finish_reason":"stop"}],)"
                R"("usage":{"prompt_tokens":9,"completion_tokens":12,"total_tokens":21,)"
                R"("completion_tokens_details":{"reasoning_tokens":0}}})"),
            (Usage{9, 12, 21}));
}

TEST(SseUsageFromJsonBody, Embeddings) {
  EXPECT_EQ(
      usage_from_json_body(
          R"({"object":"list","data":[{"object":"embedding","index":0,"embedding":[0.1]}],)"
          R"("model":"text-embedding-3-small","usage":{"prompt_tokens":5,"total_tokens":5}})"),
      (Usage{5, 0, 5}));
}

TEST(SseUsageFromJsonBody, Responses) {
  EXPECT_EQ(usage_from_json_body(
                R"({"id":"resp_1","object":"response","status":"completed","output":[],)"
                R"("usage":{"input_tokens":30,"input_tokens_details":{"cached_tokens":0},)"
                R"("output_tokens":8,"total_tokens":38}})"),
            (Usage{30, 8, 38}));
}

// The key is searched sixteen positions at a time, then byte by byte near the
// end: wherever it falls, it is found, and near misses are not taken for it.
TEST(SseUsageFromJsonBody, TheKeyIsFoundWhereverItFalls) {
  for (std::size_t pad = 0; pad < 48; ++pad) {
    const std::string before = R"({"p":")" + std::string(pad, 'x') + R"(","uxxxe":1,"usagf":{},)";
    EXPECT_EQ(usage_from_json_body(before + R"("usage":{"prompt_tokens":3,"total_tokens":3}})"),
              (Usage{3, 0, 3}))
        << pad;
    EXPECT_FALSE(usage_from_json_body(before + R"("usages":{"prompt_tokens":3}})")) << pad;
  }
}

TEST(SseUsageFromJsonBody, NoUsage) {
  EXPECT_FALSE(usage_from_json_body(""));
  EXPECT_FALSE(usage_from_json_body("not json at all"));
  EXPECT_FALSE(usage_from_json_body(R"({"usage":{"prompt_tokens":1)"));  // truncated
  EXPECT_FALSE(usage_from_json_body(R"({"usage":null})"));
  EXPECT_FALSE(usage_from_json_body(R"({"usage":{"prompt_tokens":-1}})"));
  EXPECT_FALSE(usage_from_json_body(R"({"usage":{"unrelated":1}})"));
  EXPECT_FALSE(usage_from_json_body(R"([{"usage":{"prompt_tokens":1}}])"));
  EXPECT_FALSE(usage_from_json_body(R"({"text":"\"usage\":{\"prompt_tokens\":1}"})"));
}

}  // namespace
// The scan that reads a usage object without parsing agrees with the parse.
TEST(SseUsageFromUsageObject, ReadsTheCountersLikeTheParser) {
  EXPECT_EQ(usage_from_usage_object(
                R"({"prompt_tokens":9,"completion_tokens":12,"total_tokens":21,)"
                R"("completion_tokens_details":{"reasoning_tokens":0,"total_tokens":99}})"),
            (Usage{9, 12, 21}));
  EXPECT_EQ(usage_from_usage_object(R"( { "input_tokens" : 30 , "output_tokens" : 8 } )"),
            (Usage{30, 8, 38}));
  EXPECT_EQ(usage_from_usage_object(R"({"prompt_tokens":5,"total_tokens":5})"), (Usage{5, 0, 5}));
  // The last of repeated keys wins, as in a parsed document.
  EXPECT_EQ(usage_from_usage_object(R"({"prompt_tokens":1,"prompt_tokens":2})"), (Usage{2, 0, 2}));
  // Only non-negative integers count.
  EXPECT_EQ(usage_from_usage_object(R"({"prompt_tokens":1.5,"completion_tokens":3})"),
            (Usage{0, 3, 3}));
  EXPECT_FALSE(usage_from_usage_object(R"({"prompt_tokens":-1})"));
  EXPECT_FALSE(usage_from_usage_object(R"({"prompt_tokens":1e3})"));
  EXPECT_FALSE(usage_from_usage_object(R"({"prompt_tokens":"7"})"));
  EXPECT_FALSE(usage_from_usage_object(R"({"prompt_tokens":007})"));
  EXPECT_FALSE(usage_from_usage_object(R"({"prompt_tokens":18446744073709551616})"));
  EXPECT_EQ(usage_from_usage_object(R"({"prompt_tokens":18446744073709551615})"),
            (Usage{18446744073709551615ULL, 0, 18446744073709551615ULL}));
  // Not an object, or broken.
  EXPECT_FALSE(usage_from_usage_object("{}"));
  EXPECT_FALSE(usage_from_usage_object("null"));
  EXPECT_FALSE(usage_from_usage_object(R"({"prompt_tokens":1)"));
  EXPECT_FALSE(usage_from_usage_object(R"({"prompt_tokens" 1})"));
  EXPECT_FALSE(usage_from_usage_object(R"([{"prompt_tokens":1}])"));
}

}  // namespace sluice::stream
