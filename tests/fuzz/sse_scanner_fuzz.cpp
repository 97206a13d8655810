// libFuzzer entry point for SseScanner; scripts/fuzz builds and runs it.
//
// The input is fed whole and in pieces cut at points derived from its
// bytes, one write per piece and several pieces per write. Checked: without
// stripping the client gets the input unchanged, as the very pieces fed;
// what the scanner finds does not depend on the cuts or the writes; with
// stripping the client gets the input minus whole events that a plain,
// non-incremental reading of the stream calls usage-only chunks; event count,
// [DONE] and event boundaries agree with that plain reading.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "sluice/stream/sse_scanner.hpp"

namespace {

using sluice::stream::SseScanner;
using sluice::stream::Usage;

[[noreturn]] void fail(const char* what) {
  std::fprintf(stderr, "sse_scanner invariant broken: %s\n", what);
  std::abort();
}

void check(bool condition, const char* what) {
  if (!condition) fail(what);
}

// Deterministic pseudo-random numbers from the input, so a crash replays.
struct SplitMix64 {
  std::uint64_t state;
  std::uint64_t next() {
    std::uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
};

std::uint64_t fnv1a(std::string_view bytes) {
  std::uint64_t hash = 0xcbf29ce484222325ULL;
  for (unsigned char c : bytes) {
    hash ^= c;
    hash *= 0x100000001b3ULL;
  }
  return hash;
}

// The stream read the plain way: whole, line by line, block by block.
struct Block {
  std::size_t begin = 0;
  std::size_t end = 0;  // after the blank line's terminator
  bool complete = false;
  std::size_t data_lines = 0;
  std::string data;
  bool error_type = false;
};

struct PlainReading {
  std::vector<Block> blocks;
  std::vector<bool> boundary;  // per position 0..size: between events
};

PlainReading read_plainly(std::string_view input) {
  PlainReading reading;
  reading.boundary.assign(input.size() + 1, false);
  reading.boundary[0] = true;
  Block block;
  std::size_t i = 0;
  while (i < input.size()) {
    std::size_t end = i;
    while (end < input.size() && input[end] != '\n' && input[end] != '\r') ++end;
    if (end == input.size()) break;  // an unterminated last line
    std::size_t next = end + 1;
    const bool crlf = input[end] == '\r' && next < input.size() && input[next] == '\n';
    if (crlf) ++next;
    const std::string_view line = input.substr(i, end - i);
    if (line.empty()) {
      block.end = next;
      block.complete = true;
      reading.blocks.push_back(block);
      reading.boundary[next] = true;
      if (crlf) reading.boundary[next - 1] = true;
      block = Block{};
      block.begin = next;
    } else if (line.front() != ':') {
      const auto colon = line.find(':');
      const std::string_view name = line.substr(0, colon);
      std::string_view value;
      if (colon != std::string_view::npos) {
        value = line.substr(colon + 1);
        if (!value.empty() && value.front() == ' ') value.remove_prefix(1);
      }
      if (name == "data") {
        if (block.data_lines++ > 0) block.data += '\n';
        block.data += value;
      } else if (name == "event") {
        block.error_type = value == "error";
      }
    }
    i = next;
  }
  if (block.begin < input.size()) {
    block.end = input.size();
    reading.blocks.push_back(block);
  }
  return reading;
}

std::string_view trim(std::string_view text) {
  auto space = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; };
  while (!text.empty() && space(text.front())) text.remove_prefix(1);
  while (!text.empty() && space(text.back())) text.remove_suffix(1);
  return text;
}

enum class Fate { keep, drop, either };

// What stripping must do with a block. A usage-only chunk written in plain
// compact JSON must go; one written unusually (escaped keys, duplicate keys,
// extra whitespace) may be kept, since the scanner decides from the raw text.
Fate fate_of(const Block& block) {
  if (!block.complete || block.data_lines == 0) return Fate::keep;
  const auto text = trim(block.data);
  const auto doc = nlohmann::json::parse(text.begin(), text.end(), nullptr, false);
  if (!doc.is_object()) return Fate::keep;
  auto choices = doc.find("choices");
  auto usage = doc.find("usage");
  const bool usage_only = choices != doc.end() && choices->is_array() && choices->empty() &&
                          usage != doc.end() && usage->is_object();
  if (!usage_only) return Fate::keep;
  const auto ordered = nlohmann::ordered_json::parse(text.begin(), text.end(), nullptr, false);
  return ordered.dump() == text ? Fate::drop : Fate::either;
}

void check_stripped_output(std::string_view input, const PlainReading& reading,
                           const std::vector<Fate>& fates, std::string_view written) {
  std::size_t at = 0;
  for (std::size_t i = 0; i < reading.blocks.size(); ++i) {
    const auto& block = reading.blocks[i];
    const auto bytes = input.substr(block.begin, block.end - block.begin);
    const auto fate = fates[i];
    const bool present = written.substr(at, bytes.size()) == bytes;
    if (fate == Fate::keep) check(present, "a block that must be kept is missing");
    if (fate == Fate::keep || (fate == Fate::either && present)) at += bytes.size();
  }
  check(at == written.size(), "output holds bytes that are not whole input blocks");
}

struct Run {
  std::string written;
  std::optional<Usage> usage;
  bool saw_error = false;
  bool saw_done = false;
  std::size_t events = 0;
  std::size_t stripped = 0;
};

// Feeds `input` cut at `cuts`. Each piece is fed from a buffer of its own,
// and `pieces_per_write` of them make one write, as a read of several chunks
// does in the relay: the first with feed(), the others with feed_more(), and
// the write's spans are collected only after its last piece. Then every
// buffer of the write is scribbled over, so that a view the scanner kept
// into one shows.
Run run(std::string_view input, const std::vector<std::size_t>& cuts, bool strip,
        std::size_t max_carry, const PlainReading& reading, std::size_t pieces_per_write = 1) {
  SseScanner scanner(max_carry);
  scanner.set_strip_usage_only_chunks(strip);
  Run result;
  // A deque: adding a piece moves none of the others (a short string's bytes
  // live inside it).
  std::deque<std::string> buffers;
  std::vector<std::string_view> out;
  auto write_out = [&] {
    for (auto span : out) result.written += span;
    out.clear();
    for (auto& buffer : buffers) {
      for (auto& c : buffer) c = '\x7f';
    }
    buffers.clear();
  };
  std::size_t begin = 0;
  auto feed_up_to = [&](std::size_t end) {
    const bool first_of_write = buffers.empty();
    const auto& buffer = buffers.emplace_back(input.substr(begin, end - begin));
    const std::size_t spans_before = out.size();
    if (first_of_write) {
      scanner.feed(buffer, out);
    } else {
      scanner.feed_more(buffer, out);
    }
    if (!strip) {
      check(out.size() == spans_before + 1 && out.back().data() == buffer.data() &&
                out.back().size() == buffer.size(),
            "without stripping, a feed must answer with exactly its piece");
    }
    check(scanner.at_event_boundary() == reading.boundary[end], "event boundary disagrees");
    begin = end;
    if (buffers.size() == pieces_per_write) write_out();
  };
  for (auto cut : cuts) feed_up_to(cut);
  if (begin < input.size()) feed_up_to(input.size());
  const std::size_t spans_before_finish = out.size();
  scanner.finish(out);
  if (!strip)
    check(out.size() == spans_before_finish, "without stripping, nothing is ever held back");
  write_out();
  result.usage = scanner.usage();
  result.saw_error = scanner.saw_error();
  result.saw_done = scanner.saw_done();
  result.events = scanner.events();
  result.stripped = scanner.stripped_events();
  return result;
}

bool same_findings(const Run& a, const Run& b) {
  return a.written == b.written && a.usage == b.usage && a.saw_error == b.saw_error &&
         a.saw_done == b.saw_done && a.events == b.events && a.stripped == b.stripped;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  SplitMix64 random{fnv1a(input)};

  std::vector<std::size_t> cuts;
  const std::uint64_t longest[] = {3, 16, 64, 512};
  const std::uint64_t longest_piece = longest[random.next() % 4];
  for (std::size_t at = 1 + random.next() % longest_piece; at < size;
       at += 1 + random.next() % longest_piece) {
    cuts.push_back(at);
  }
  const std::size_t small_cap = 1 + random.next() % 96;
  const std::size_t pieces_per_write = 2 + random.next() % 6;

  const auto reading = read_plainly(input);
  std::size_t expected_events = 0;
  bool expected_done = false;
  bool error_by_type = false;
  for (const auto& block : reading.blocks) {
    if (!block.complete) continue;
    if (block.data_lines > 0) ++expected_events;
    if (block.data_lines > 0 && trim(block.data) == "[DONE]") expected_done = true;
    if (block.error_type) error_by_type = true;
  }

  std::vector<Fate> fates;
  std::vector<Fate> fates_under_cap;
  for (const auto& block : reading.blocks) {
    fates.push_back(fate_of(block));
    fates_under_cap.push_back(fates.back() == Fate::drop ? Fate::either : fates.back());
  }

  for (bool strip : {false, true}) {
    const auto whole = run(input, {}, strip, SseScanner::kDefaultMaxCarry, reading);
    const auto split = run(input, cuts, strip, SseScanner::kDefaultMaxCarry, reading);
    check(same_findings(whole, split), "the cuts changed what was found or written");
    const auto batched =
        run(input, cuts, strip, SseScanner::kDefaultMaxCarry, reading, pieces_per_write);
    check(same_findings(whole, batched), "writing several pieces at once changed the outcome");
    check(whole.events == expected_events, "event count");
    check(whole.saw_done == expected_done, "[DONE]");
    if (error_by_type) check(whole.saw_error, "event: error missed");
    if (strip) {
      check_stripped_output(input, reading, fates, whole.written);
    } else {
      check(whole.written == input, "without stripping the output is the input");
    }

    // A small carry cap changes which events get inspected, never the bytes
    // beyond that, nor the count.
    const auto capped = run(input, cuts, strip, small_cap, reading);
    check(capped.events == expected_events, "event count under a small cap");
    if (strip) {
      check_stripped_output(input, reading, fates_under_cap, capped.written);
    } else {
      check(capped.written == input, "without stripping the output is the input (small cap)");
    }
  }
  return 0;
}
