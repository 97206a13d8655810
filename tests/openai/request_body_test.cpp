#include "sluice/openai/request_body.hpp"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "sluice/common/cpu_features.hpp"
#include "sluice/common/json_scan.hpp"

namespace sluice {
namespace {

TEST(RequestBody, ExtractsModelStreamAndLimits) {
  auto body = inspect_request_body(
      R"({"model":"gpt","stream":true,"max_tokens":300,"stream_options":{"include_usage":true},)"
      R"("messages":[{"role":"user","content":"hi","model":"not-this-one"}]})");
  ASSERT_TRUE(body.ok());
  EXPECT_EQ(body->model, "gpt");
  EXPECT_TRUE(body->stream);
  EXPECT_EQ(body->max_tokens, 300u);
  EXPECT_TRUE(body->include_usage);
  EXPECT_TRUE(body->has_stream_options);
}

TEST(RequestBody, DefaultsWhenFieldsAreAbsent) {
  auto body = inspect_request_body(R"({"model":"m","max_completion_tokens":5})");
  ASSERT_TRUE(body.ok());
  EXPECT_FALSE(body->stream);
  EXPECT_EQ(body->max_tokens, 5u);
  EXPECT_FALSE(body->include_usage);
  EXPECT_FALSE(body->has_stream_options);
}

TEST(RequestBody, NotesWhatMakesARequestCacheable) {
  auto plain = inspect_request_body(R"({"model":"m","temperature":0.7})");
  ASSERT_TRUE(plain.ok());
  EXPECT_FALSE(plain->zero_temperature);
  EXPECT_FALSE(plain->has_cache_field);
  EXPECT_FALSE(plain->cache.has_value());

  for (const char* zero : {"0", "0.0", "-0.0"}) {
    auto body = inspect_request_body(std::string(R"({"model":"m","temperature":)") + zero + "}");
    ASSERT_TRUE(body.ok());
    EXPECT_TRUE(body->zero_temperature) << zero;
  }
  auto nested = inspect_request_body(
      R"({"model":"m","temperature":1,"tools":[{"temperature":0,"cache":true}]})");
  EXPECT_FALSE(nested->zero_temperature);
  EXPECT_FALSE(nested->has_cache_field);

  auto flagged = inspect_request_body(R"({"model":"m","cache":true})");
  EXPECT_TRUE(flagged->has_cache_field);
  EXPECT_EQ(flagged->cache, true);
  auto declined = inspect_request_body(R"({"model":"m","cache":false,"temperature":0})");
  EXPECT_EQ(declined->cache, false);
  auto odd = inspect_request_body(R"({"model":"m","cache":"yes"})");
  EXPECT_TRUE(odd->has_cache_field);
  EXPECT_FALSE(odd->cache.has_value());
  // Repeated keys: the last value counts, as in a parsed document.
  auto repeated = inspect_request_body(R"({"model":"m","temperature":0,"temperature":1})");
  EXPECT_FALSE(repeated->zero_temperature);
}

TEST(RequestBody, RejectsWhatTheGatewayCannotForward) {
  struct Case {
    const char* body;
    const char* code;
  } cases[] = {
      {"", "invalid_json"},
      {"{\"model\":", "invalid_json"},
      {"{\"model\":\"m\"} trailing", "invalid_json"},
      {"[1]", "invalid_type"},
      {"\"text\"", "invalid_type"},
      {"{}", "missing_required_parameter"},
      {"{\"model\":7}", "invalid_type"},
      {"{\"model\":null}", "invalid_type"},
      {"{\"model\":[\"a\"]}", "invalid_type"},
      {"{\"model\":\"a\",\"model\":{}}", "invalid_type"},
      {"{\"model\":\"\xff\"}", "invalid_json"},
  };
  for (const auto& c : cases) {
    auto body = inspect_request_body(c.body);
    ASSERT_FALSE(body.ok()) << c.body;
    EXPECT_EQ(body.error().status, 400u);
    EXPECT_EQ(body.error().code, c.code) << c.body;
  }
}

// With a repeated key the last value counts, as for the parser upstream.
TEST(RequestBody, LastOfRepeatedStreamFieldsCounts) {
  auto body = inspect_request_body(R"({"model":"m","stream":true,"stream":1})");
  ASSERT_TRUE(body.ok());
  EXPECT_FALSE(body->stream);
  body = inspect_request_body(
      R"({"model":"m","stream_options":{"include_usage":true},"stream_options":null})");
  ASSERT_TRUE(body.ok());
  EXPECT_FALSE(body->has_stream_options);
  EXPECT_FALSE(body->include_usage);
  body = inspect_request_body(
      R"({"model":"m","stream_options":{"include_usage":true,"include_usage":"yes"}})");
  ASSERT_TRUE(body.ok());
  EXPECT_TRUE(body->has_stream_options);
  EXPECT_FALSE(body->include_usage);
}

TEST(RequestBody, RefusesANulByteAnywhere) {
  // The JSON parser stops at a NUL as if the input ended there.
  using namespace std::string_view_literals;
  for (auto body : {"{\"model\":\"m\"}\0{\"model\":\"x\"}"sv, "{\"model\":\"m\"}\0"sv,
                    "\0{\"model\":\"m\"}"sv}) {
    auto inspected = inspect_request_body(body);
    ASSERT_FALSE(inspected.ok()) << body.size();
    EXPECT_EQ(inspected.error().code, "invalid_json");
  }
}

TEST(RequestBody, RefusesDeepNesting) {
  std::string deep =
      "{\"model\":\"m\",\"x\":" + std::string(100, '[') + std::string(100, ']') + "}";
  auto body = inspect_request_body(deep);
  ASSERT_FALSE(body.ok());
  EXPECT_NE(body.error().message.find("nested"), std::string::npos);
  std::string fine = "{\"model\":\"m\",\"x\":" + std::string(30, '[') + std::string(30, ']') + "}";
  EXPECT_TRUE(inspect_request_body(fine).ok());
}

// The inspector is a JSON validator of its own: it must refuse and accept
// what a strict parser does (the fuzz target compares the two at length).
TEST(RequestBody, AcceptsAndRefusesAsAStrictJsonParser) {
  auto verdict = [](const std::string& value) {
    return inspect_request_body(R"({"model":"m","x":)" + value + "}").ok();
  };
  for (const char* good : {"0",
                           "-0",
                           "1.5",
                           "-1.5e-3",
                           "1E+2",
                           "18446744073709551615",
                           "18446744073709551616",
                           "-9223372036854775809",
                           "1e-400",
                           "0e999999",
                           "[]",
                           "{}",
                           "[1,[2,{\"a\":null}]]",
                           "true",
                           "false",
                           "null",
                           R"("\"\\\/\b\f\n\r\t")",
                           R"("\u00e9\uD83D\uDE00")",
                           "\"\xc3\xa9\"",
                           "\"\xe2\x82\xac\"",
                           "\"\xf0\x9f\x98\x80\"",
                           "\"\xf4\x8f\xbf\xbf\"",
                           " \t\r\n1 "}) {
    EXPECT_TRUE(verdict(good)) << good;
  }
  for (const std::string& bad : std::vector<std::string>{"01",
                                                         "-",
                                                         "1.",
                                                         ".5",
                                                         "+1",
                                                         "1e",
                                                         "1e+",
                                                         "1e400",
                                                         "-1e400",
                                                         "1" + std::string(400, '0'),
                                                         "NaN",
                                                         "Infinity",
                                                         "tru",
                                                         "nul",
                                                         "[1,]",
                                                         "{\"a\":1,}",
                                                         "{\"a\"}",
                                                         "{1:2}",
                                                         "[1 2]",
                                                         R"("\x")",
                                                         R"("\u12")",
                                                         R"("\uD83D")",
                                                         R"("\uDE00")",
                                                         R"("\uD83D\u0041")",
                                                         "\"\x01\"",
                                                         "\"\xc0\xaf\"",
                                                         "\"\xe0\x80\xaf\"",
                                                         "\"\xed\xa0\x80\"",
                                                         "\"\xf4\x90\x80\x80\"",
                                                         "\"\xf5\x80\x80\x80\"",
                                                         "\"\x80\"",
                                                         "\"\xc3\"",
                                                         "\"abc",
                                                         "'a'"}) {
    EXPECT_FALSE(verdict(bad)) << bad;
  }
  EXPECT_FALSE(inspect_request_body(R"({"model":"m"} x)").ok());
  EXPECT_FALSE(inspect_request_body("\xef\xbb{\"model\":\"m\"}").ok());
  EXPECT_TRUE(inspect_request_body("\xef\xbb\xbf {\"model\":\"m\"}").ok());
}

// Chinese and Japanese text: a run of three-byte sequences with ASCII
// punctuation and spaces between some of them.
std::string cjk_run() {
  std::string run;
  for (int i = 0; i < 6; ++i) run += "\xe4\xb8\xad\xe6\x96\x87, \xe6\x97\xa5\xe6\x9c\xac";
  return run;
}

// The ways of reading strings this processor runs.
std::vector<detail::StringScan> string_scans() {
  std::vector<detail::StringScan> scans = {detail::StringScan::sse2};
  if (cpu_has_avx2()) scans.push_back(detail::StringScan::avx2);
  return scans;
}

// Strings are scanned 16 bytes at a time (8 without SSE2) while nothing in
// them needs a closer look: whatever does must be found at every offset of
// such a block, and in the bytes after the last whole block.
TEST(RequestBody, EveryByteOfALongStringIsChecked) {
  struct Case {
    std::string inserted;
    bool accepted;
  };
  const std::vector<Case> cases = {
      {"\x01", false},
      {"\x1f", false},
      {"\x7f", true},
      {"\\n", true},
      {"\\\"", true},
      {"\\x", false},
      {"\xc3\xa9", true},
      {"\xe2\x82\xac", true},
      {"\x80", false},
      {"\x9f", false},
      {"\xc2\x80", true},
      {"\xff", false},
      {"\xc3", false},
      {"\xed\xa0\x80", false},
      {"\"", false},  // a quote ends the string early:
                      // what follows is not JSON
      // Escapes in a row, across a block's end: each one's second byte is
      // taken as escaped, never as a stop of its own.
      {"\\n\\t\\\"\\\\\\/\\b\\f\\r", true},
      {"\\\\\"", false},  // \\ then a quote
      {"\\\\x", true},
      {"\\u00e9\\n", true},
      {"\\uZZ", false},
      {"\\ ", false},
      {"\\n\x01", false},
      {"\\n\xc3\xa9\\n", true},
      // Runs longer than a block: escapes only, escaped backslashes only,
      // and an odd run whose last backslash escapes a quote.
      {[] {
         std::string run;
         for (int i = 0; i < 40; ++i) run += "\\n";
         return run;
       }(),
       true},
      {std::string(80, '\\'), true},
      {std::string(81, '\\') + "\"", true},
      {std::string(80, '\\') + "\"", false},
      {"\\u00e9\\u20ac\\ud83d\\ude00\\n\\\"", true},
      {"\\ud83d\\n", false},
      // Runs of multi-byte characters with a few ASCII bytes between them,
      // each followed by a malformed sequence, a quote or a control byte
      // inside the run.
      {cjk_run() + "abc" + cjk_run() + "\\n" + cjk_run(), true},
      {cjk_run() + "\xe4\xb8" + cjk_run(), false},      // a sequence cut short
      {cjk_run() + "\xed\xa0\x80" + cjk_run(), false},  // a surrogate
      {cjk_run() + "\xc0\xaf" + cjk_run(), false},      // an overlong form
      {cjk_run() + "\xe0\x80\xaf" + cjk_run(), false},
      {cjk_run() + "\xf0\x80\x80\xaf" + cjk_run(), false},
      {cjk_run() + "\xf5\x80\x80\x80" + cjk_run(), false},
      {cjk_run() + "\xe0\xa0\x80\xf0\x90\x80\x80\xed\x9f\xbf" + cjk_run(), true},
      {cjk_run() + "\xf4\x90\x80\x80", false},  // above U+10FFFF
      {cjk_run() + "\xf0\x9f\x98\x80\xf4\x8f\xbf\xbf" + cjk_run(), true},
      {cjk_run() + "\x80", false},  // a continuation byte alone
      {cjk_run() + "\"", false},
      {cjk_run() + "\x1f" + cjk_run(), false},
      {cjk_run() + "\xc3\xa9" + std::string(20, 'a') + cjk_run(), true},
      // What the wide scan tells apart at the byte after a backslash: the
      // escapes it steps over (\b, which shares a lookup entry with \", is
      // left to the byte-wise code), and bytes no escape has, which it must
      // leave to that code too, UTF-8 included.
      {"\\r\\n\\t\\f\\/", true},
      {"\\b\\\"", true},
      {"\\'", false},
      {"\\ux", false},
      {"\\U0041", false},
      {"\\\x01", false},
      {"\\\x7f", false},
      {"\\\xc3\xa9", false},
      {"\\" + cjk_run(), false},
      {"\\n\x80", false},
      {"\\\"\xc3", false},
      // After an escaped backslash, the next byte is no escape's: text in
      // another script is read from there as text.
      {"\\\\" + cjk_run(), true},
      {"\\\\\xc3\xa9", true},
      {"\\\\\x80", false},
  };
  for (const auto scan : string_scans()) {
    SCOPED_TRACE(scan == detail::StringScan::avx2 ? "64 bytes at a time" : "16 bytes at a time");
    for (const auto& test : cases) {
      // Across the first 16 bytes, tested alone, and the 64-byte steps
      // after them (tested two at a time where 128 bytes are left).
      for (std::size_t offset = 0; offset < 280; ++offset) {
        const std::string text =
            std::string(offset, 'a') + test.inserted + std::string(280 - offset, 'b');
        const std::string body = R"({"model":"m","messages":[{"role":"user","content":")" + text +
                                 R"("}],"stream":true})";
        auto inspected = detail::inspect_request_body(body, kMaxJsonDepth, scan);
        EXPECT_EQ(inspected.ok(), test.accepted) << "offset " << offset << " in " << body;
        if (inspected.ok()) {
          EXPECT_TRUE(inspected.value().stream) << body;
        }
      }
    }
  }
}

// A pasted document has an escape every few dozen bytes, which the wide
// scan steps over without leaving its vectors. A fault put at any offset of
// such text, inside an escape or beside one, must be judged as the
// sixteen-byte scan and a strict parser judge it.
TEST(RequestBody, EscapesInEveryStepAreJudgedAsAStrictParserDoes) {
  std::string document;
  while (document.size() < 420) {
    document +=
        R"(lorem ipsum dolor sit amet, \"consectetur\" adipiscing elit, sed do eiusmod tempor\n)";
  }
  const std::vector<std::string> faults = {
      // Escapes: invalid ones, ones left to the byte-wise code, ones the
      // wide scan reads, backslashes that escape the text beside them.
      "\\x", "\\'", "\\", "\\\\", "\\b", "\\r", "\\u00e9", "\\uD800", "\\u12", "n\\", "\\\"\\",
      // A quote, which ends the string early; control bytes (DEL is none).
      "\"", "\x01", "\x7f",
      // UTF-8, whole and broken, and after a backslash or an escaped one.
      "\x80", "\xc3\xa9", "\xe4\xb8", "\xc3", "\xf0\x9f\x98\x80", "\xed\xa0\x80", "\\\xc3\xa9",
      "\\\\\xc3\xa9"};
  for (const auto& fault : faults) {
    // Past the first 16 bytes, through two pairs of 64-byte steps.
    for (std::size_t at = 0; at < 300; ++at) {
      const std::string body = R"({"model":"m","messages":[{"role":"user","content":")" +
                               document.substr(0, at) + fault + document.substr(at) +
                               R"("}],"stream":true})";
      const bool strict = nlohmann::json::accept(body);
      for (const auto scan : string_scans()) {
        auto inspected = detail::inspect_request_body(body, kMaxJsonDepth, scan);
        EXPECT_EQ(inspected.ok(), strict)
            << "at " << at << (scan == detail::StringScan::avx2 ? " (64 at a time): " : ": ")
            << body.substr(0, 60 + at + fault.size());
        if (inspected.ok()) EXPECT_TRUE(inspected->stream);
      }
    }
  }
  // Whole, and cut short at each of its bytes: the steps end inside it.
  for (std::size_t size = document.size() - 200; size <= document.size(); ++size) {
    const std::string body = R"({"model":"m","x":")" + document.substr(0, size) + R"("})";
    for (const auto scan : string_scans()) {
      EXPECT_EQ(detail::is_valid_json(body, kMaxJsonDepth, scan), nlohmann::json::accept(body))
          << "cut to " << size;
    }
  }
}

TEST(RequestBody, ModelAndKeysAreReadDecoded) {
  auto body = inspect_request_body(R"({"mod\u0065l":"gpt\u002d4\ud83d\ude00","str\u0065am":true})");
  ASSERT_TRUE(body.ok());
  EXPECT_EQ(body->model, "gpt-4\xf0\x9f\x98\x80");
  EXPECT_TRUE(body->stream);
  // A model of another type after a string one: the last counts.
  EXPECT_EQ(inspect_request_body(R"({"model":"m","model":7})").error().code, "invalid_type");
  EXPECT_EQ(inspect_request_body(R"({"model":"m","model":true})").error().code, "invalid_type");
  EXPECT_EQ(inspect_request_body(R"({"model":["m"]})").error().code, "invalid_type");
}

TEST(RequestBody, ALongModelIsReadDecodedByEitherStringScan) {
  // Escapes well inside a 64-byte block, which the wide scan steps over
  // without stopping, must still have the name decoded.
  const std::string plain(200, 'y');
  for (const std::string& escape : {std::string("\\n"), std::string("\\/"), std::string("\\\""),
                                    std::string("\\t"), std::string("\\\\")}) {
    for (std::size_t at : {5u, 40u, 62u, 63u, 64u, 90u, 126u, 127u, 128u, 143u, 144u, 190u}) {
      const std::string literal = plain.substr(0, at) + escape + plain.substr(at);
      const char escaped = escape[1] == 'n' ? '\n' : escape[1] == 't' ? '\t' : escape[1];
      const std::string decoded = plain.substr(0, at) + escaped + plain.substr(at);
      for (const auto scan : string_scans()) {
        auto body =
            detail::inspect_request_body(R"({"model":")" + literal + R"("})", kMaxJsonDepth, scan);
        ASSERT_TRUE(body.ok()) << literal;
        EXPECT_EQ(body->model, decoded)
            << "at " << at << (scan == detail::StringScan::avx2 ? " (64 at a time)" : "");
      }
    }
  }
  // None: the wide scan takes a string it steps through for one that may
  // hold some, and the decode gives the name back as it is.
  for (const auto scan : string_scans()) {
    auto body =
        detail::inspect_request_body(R"({"model":")" + plain + R"("})", kMaxJsonDepth, scan);
    ASSERT_TRUE(body.ok());
    EXPECT_EQ(body->model, plain);
  }
}

TEST(RequestBody, MaxTokensTakesNonNegativeIntegersOnly) {
  EXPECT_EQ(inspect_request_body(R"({"model":"m","max_tokens":-1})")->max_tokens, std::nullopt);
  EXPECT_EQ(inspect_request_body(R"({"model":"m","max_tokens":1.5})")->max_tokens, std::nullopt);
  EXPECT_EQ(
      inspect_request_body(R"({"model":"m","max_output_tokens":18446744073709551615})")->max_tokens,
      18446744073709551615u);
  EXPECT_EQ(inspect_request_body(R"({"model":"m","max_tokens":18446744073709551616})")->max_tokens,
            std::nullopt);
}

TEST(RequestBody, KnowsWhereTheModelStandsForTheSplice) {
  const std::string body = R"({"model":"a","messages":[],"model" : "b"})";
  auto inspected = inspect_request_body(body);
  ASSERT_TRUE(inspected.ok());
  ASSERT_TRUE(inspected->model_value);
  EXPECT_EQ(body.substr(inspected->model_value->begin,
                        inspected->model_value->end - inspected->model_value->begin),
            "\"b\"");
  std::string storage;
  auto known = splice_model(body, storage, inspected->model_value);
  auto searched = splice_model(body, storage);
  EXPECT_EQ(known.before_model, searched.before_model);
  EXPECT_EQ(known.after_model, searched.after_model);
  EXPECT_EQ(known.closing, searched.closing);
  // Not in place: a byte order mark is not forwarded.
  EXPECT_FALSE(inspect_request_body("\xef\xbb\xbf{\"model\":\"m\"}")->model_value);
}

TEST(JsonScan, DecodesStringLiterals) {
  std::string out;
  EXPECT_TRUE(decode_json_string(R"(a\"\\\/\b\f\n\r\t\u00e9\ud83d\ude00)", out));
  EXPECT_EQ(out, "a\"\\/\b\f\n\r\t\xc3\xa9\xf0\x9f\x98\x80");
  for (const char* bad : {R"(\)", R"(\q)", R"(\u12)", R"(\ud83d)", R"(\ude00)", R"(\ud83dx)"}) {
    std::string ignored;
    EXPECT_FALSE(decode_json_string(bad, ignored)) << bad;
  }
}

TEST(JsonScan, FindsTopLevelValueOnly) {
  std::string body = R"({"messages":[{"model":"inner"}], "model" : "outer", "x":{"model":1}})";
  auto span = find_top_level_value(body, "model");
  ASSERT_TRUE(span.has_value());
  EXPECT_EQ(body.substr(span->begin, span->end - span->begin), "\"outer\"");
}

TEST(JsonScan, LastDuplicateWinsAndEscapesAreSkipped) {
  std::string body = R"({"model":"a\"b}","model":"c"})";
  auto span = find_top_level_value(body, "model");
  ASSERT_TRUE(span.has_value());
  EXPECT_EQ(body.substr(span->begin, span->end - span->begin), "\"c\"");
  EXPECT_FALSE(find_top_level_value("[1,2]", "model").has_value());
  EXPECT_FALSE(find_top_level_value(R"({"other":1})", "model").has_value());
}

// A quote ends a string when an even run of backslashes (none included)
// precedes it; after an odd run it is part of the string.
TEST(JsonScan, BackslashRunsBeforeAQuote) {
  const std::string body = R"({"a":"x\\","b":"y\\\"z\\\\","c":"\\\"","model":"m"})";
  std::vector<std::string> values;
  bool well_formed = for_each_top_level_member(body, [&](std::string_view, ValueSpan value) {
    values.push_back(body.substr(value.begin, value.end - value.begin));
  });
  ASSERT_TRUE(well_formed);
  EXPECT_EQ(values,
            (std::vector<std::string>{R"("x\\")", R"("y\\\"z\\\\")", R"("\\\"")", R"("m")"}));
  EXPECT_FALSE(for_each_top_level_member(R"({"a":"x\"})", [](std::string_view, ValueSpan) {}));
  EXPECT_FALSE(for_each_top_level_member(R"({"a":"x)", [](std::string_view, ValueSpan) {}));
}

// The walk yields each member once, in order, and says whether the object
// was whole: a member list that breaks off is not taken for a short object.
TEST(JsonScan, MemberWalkTellsTheEndFromABreak) {
  struct Walk {
    std::vector<std::string> keys;
    bool well_formed;
  };
  auto walk = [](std::string_view json) {
    Walk result;
    result.well_formed = for_each_top_level_member(
        json, [&](std::string_view key, ValueSpan) { result.keys.emplace_back(key); });
    return result;
  };
  using Keys = std::vector<std::string>;

  auto whole = walk(R"( { "a" : 1 , "b":{"c":[1,2]} ,"d":"}"} trailing)");
  EXPECT_TRUE(whole.well_formed);
  EXPECT_EQ(whole.keys, (Keys{"a", "b", "d"}));

  auto empty = walk(" {  } ");
  EXPECT_TRUE(empty.well_formed);
  EXPECT_TRUE(empty.keys.empty());

  for (std::string_view broken : {R"({"a":1,})", R"({"a":1 "b":2})", R"({"a":1)", R"({"a":1,"b")",
                                  R"({"a":})", "[]", "", R"({,"a":1})"}) {
    SCOPED_TRACE(broken);
    EXPECT_FALSE(walk(broken).well_formed);
  }
  // Members before the break were seen; the walk stops at it.
  EXPECT_EQ(walk(R"({"a":1,"b":2,,"c":3})").keys, (Keys{"a", "b"}));

  TopLevelMembers members(R"({"a":1})");
  std::string_view key;
  ValueSpan value;
  ASSERT_TRUE(members.next(key, value));
  EXPECT_FALSE(members.next(key, value));
  EXPECT_FALSE(members.next(key, value));  // stays at the end
  EXPECT_TRUE(members.well_formed());
}

std::string forwarded(const ModelSplice& splice, std::string_view model,
                      std::string_view addition = {}) {
  std::string body(splice.before_model);
  append_json_string(body, model);
  body.append(splice.after_model).append(addition).append(splice.closing);
  return body;
}

TEST(SpliceModel, ReplacesOnlyTheModelValueInPlace) {
  const std::string body = R"({"messages":[{"model":"inner"}], "model" : "outer", "n":1} )";
  std::string storage;
  auto splice = splice_model(body, storage);
  EXPECT_TRUE(storage.empty());
  EXPECT_EQ(splice.before_model.data(), body.data());
  EXPECT_EQ(forwarded(splice, "up"), R"({"messages":[{"model":"inner"}], "model" : "up", "n":1} )");
  EXPECT_EQ(splice.closing, "} ");
  EXPECT_EQ(forwarded(splice, "up", R"(,"x":true)"),
            R"({"messages":[{"model":"inner"}], "model" : "up", "n":1,"x":true} )");
}

// Every parser upstream reads "mod\u0065l" as "model": with it last, an
// in-place splice of the first one would leave the client's name in force.
TEST(SpliceModel, FindsTheModelKeySpelledWithEscapes) {
  struct Case {
    std::string body;
    std::string expected;
  } cases[] = {
      {R"({"model":"a","mod\u0065l":"b"})", R"({"model":"a","mod\u0065l":"up"})"},
      {R"({"mod\u0065l":"a","n":1})", R"({"mod\u0065l":"up","n":1})"},
      {R"({"mod\u0065l":"a","model":"b"})", R"({"mod\u0065l":"a","model":"up"})"},
  };
  for (const auto& c : cases) {
    ASSERT_TRUE(inspect_request_body(c.body).ok()) << c.body;
    std::string storage;
    EXPECT_EQ(forwarded(splice_model(c.body, storage), "up"), c.expected) << c.body;
    EXPECT_TRUE(storage.empty());
  }
}

TEST(SpliceModel, ReserialisesABodyStartingWithAByteOrderMark) {
  const std::string body = "\xef\xbb\xbf{\"model\":\"m\",\"a\":[1]}";
  ASSERT_TRUE(inspect_request_body(body).ok());
  std::string storage;
  auto splice = splice_model(body, storage);
  EXPECT_FALSE(storage.empty());
  EXPECT_EQ(forwarded(splice, "up"), R"({"model":"up","a":[1]})");
  EXPECT_EQ(forwarded(splice, "up", R"(,"x":true)"), R"({"model":"up","a":[1],"x":true})");

  const std::string only_model = "\xef\xbb\xbf{\"model\":\"m\"}";
  EXPECT_EQ(forwarded(splice_model(only_model, storage), "up"), R"({"model":"up"})");
}

TEST(WithModelMember, TheModelBecomesTheFirstMember) {
  const std::pair<std::string, std::string> cases[] = {
      {R"({"input":"hi"})", R"({"model":"mod \"x\"","input":"hi"})"},
      {"{}", R"({"model":"mod \"x\""})"},
      {" \r\n{ \t}\n", " \r\n{\"model\":\"mod \\\"x\\\"\" \t}\n"},
      {"\xEF\xBB\xBF{ \"n\":1}", "\xEF\xBB\xBF{\"model\":\"mod \\\"x\\\"\", \"n\":1}"},
  };
  for (const auto& [body, expected] : cases) {
    ASSERT_FALSE(inspect_request_body(body).ok()) << body;
    const std::string added = with_model_member(body, "mod \"x\"");
    EXPECT_EQ(added, expected);
    auto inspected = inspect_request_body(added);
    ASSERT_TRUE(inspected.ok()) << added;
    EXPECT_EQ(inspected->model, "mod \"x\"");
  }
}

TEST(JsonScan, AppendsEscapedStrings) {
  std::string out;
  append_json_string(out, "a\"b\\c\n\x01");
  EXPECT_EQ(out, "\"a\\\"b\\\\c\\n\\u0001\"");
  // Valid UTF-8 passes as it is; what is not UTF-8 becomes U+FFFD.
  out.clear();
  append_json_string(out, "\xc3\xa9 \xff \xed\xa0\x80 \xe2\x82");
  EXPECT_EQ(out, "\"\xc3\xa9 \\ufffd \\ufffd\\ufffd\\ufffd \\ufffd\\ufffd\"");
}

}  // namespace
}  // namespace sluice
