#include <gtest/gtest.h>

#include <spdlog/sinks/base_sink.h>

#include <unistd.h>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "sluice/metrics/access_log.hpp"

namespace sluice::metrics {
namespace {

using namespace std::chrono_literals;

RequestRecord full_record() {
  RequestRecord record;
  // 2024-05-01T12:34:56.789Z
  record.timestamp = std::chrono::system_clock::time_point(1714566896789ms);
  record.request_id = "req-1";
  record.trace_id = "4bf92f3577b34da6a3ce929d0e0e4736";
  record.key_name = "team-a";
  record.model = "gpt-4o";
  record.routed_to = "gpt-4o-mini";
  record.shaped = "trimmed,max_tokens";
  record.stream = true;
  record.cache = "miss";
  record.status = 200;
  record.deployment = "openai-1";
  record.attempts.push_back({"azure-1", "timeout", 1.25, 3.5, std::nullopt, false});
  record.attempts.push_back({"openai-1", "ok", std::nullopt, std::nullopt, 45.6, true});
  record.ttft_ms = 52.125;
  record.total_ms = 1234.5;
  record.gateway_overhead_us = 85;
  record.gap_p50_ms = 20.0;
  record.gap_max_ms = 80.25;
  record.prompt_tokens = 12;
  record.completion_tokens = 340;
  record.bytes_in = 512;
  record.bytes_out = 4096;
  record.client_disconnected = false;
  record.over_budget.insert(BudgetStage::total);
  record.tags = {"cache:miss", "shaped:rpm"};
  return record;
}

nlohmann::json parse_line(const std::string& line) {
  EXPECT_EQ(line.find('\n'), std::string::npos) << line;
  return nlohmann::json::parse(line);
}

TEST(AccessLogJson, EveryFieldIsPresentWithItsValue) {
  std::string line;
  render_json_line(full_record(), line);
  const nlohmann::json json = parse_line(line);

  std::set<std::string> keys;
  for (const auto& item : json.items()) keys.insert(item.key());
  const std::set<std::string> expected = {"ts",
                                          "request_id",
                                          "trace_id",
                                          "key",
                                          "model",
                                          "routed_to",
                                          "shaped",
                                          "stream",
                                          "cache",
                                          "status",
                                          "deployment",
                                          "attempts",
                                          "ttft_ms",
                                          "total_ms",
                                          "gateway_overhead_us",
                                          "gap_p50_ms",
                                          "gap_max_ms",
                                          "prompt_tokens",
                                          "completion_tokens",
                                          "bytes_in",
                                          "bytes_out",
                                          "client_disconnected",
                                          "over_budget",
                                          "tags"};
  EXPECT_EQ(keys, expected);

  EXPECT_EQ(json["ts"], "2024-05-01T12:34:56.789Z");
  EXPECT_EQ(json["request_id"], "req-1");
  EXPECT_EQ(json["trace_id"], "4bf92f3577b34da6a3ce929d0e0e4736");
  EXPECT_EQ(json["key"], "team-a");
  EXPECT_EQ(json["model"], "gpt-4o");
  EXPECT_EQ(json["routed_to"], "gpt-4o-mini");
  EXPECT_EQ(json["shaped"], "trimmed,max_tokens");
  EXPECT_EQ(json["stream"], true);
  EXPECT_EQ(json["status"], 200);
  EXPECT_EQ(json["deployment"], "openai-1");
  ASSERT_EQ(json["attempts"].size(), 2u);
  EXPECT_EQ(json["attempts"][0]["deployment"], "azure-1");
  EXPECT_EQ(json["attempts"][0]["outcome"], "timeout");
  EXPECT_DOUBLE_EQ(json["attempts"][0]["connect_ms"].get<double>(), 1.25);
  EXPECT_DOUBLE_EQ(json["attempts"][0]["tls_ms"].get<double>(), 3.5);
  EXPECT_TRUE(json["attempts"][0]["ttfb_ms"].is_null());
  EXPECT_EQ(json["attempts"][0]["reused"], false);
  EXPECT_TRUE(json["attempts"][1]["connect_ms"].is_null());
  EXPECT_TRUE(json["attempts"][1]["tls_ms"].is_null());
  EXPECT_DOUBLE_EQ(json["attempts"][1]["ttfb_ms"].get<double>(), 45.6);
  EXPECT_EQ(json["attempts"][1]["reused"], true);
  EXPECT_DOUBLE_EQ(json["ttft_ms"].get<double>(), 52.125);
  EXPECT_DOUBLE_EQ(json["total_ms"].get<double>(), 1234.5);
  EXPECT_EQ(json["gateway_overhead_us"], 85);
  EXPECT_DOUBLE_EQ(json["gap_p50_ms"].get<double>(), 20.0);
  EXPECT_DOUBLE_EQ(json["gap_max_ms"].get<double>(), 80.25);
  EXPECT_EQ(json["prompt_tokens"], 12);
  EXPECT_EQ(json["completion_tokens"], 340);
  EXPECT_EQ(json["bytes_in"], 512);
  EXPECT_EQ(json["bytes_out"], 4096);
  EXPECT_EQ(json["client_disconnected"], false);
  EXPECT_EQ(json["over_budget"], nlohmann::json::array({"total"}));
  EXPECT_EQ(json["tags"], nlohmann::json::array({"cache:miss", "shaped:rpm"}));
  EXPECT_EQ(json["cache"], "miss");
}

TEST(AccessLogJson, UnknownValuesAreNullAndTheSchemaStaysTheSame) {
  RequestRecord record;
  record.timestamp = std::chrono::system_clock::time_point(0ms);
  record.total_ms = std::numeric_limits<double>::quiet_NaN();
  std::string line;
  render_json_line(record, line);
  const nlohmann::json json = parse_line(line);
  EXPECT_EQ(json.size(), 24u);
  EXPECT_TRUE(json["cache"].is_null());
  EXPECT_EQ(json["ts"], "1970-01-01T00:00:00.000Z");
  EXPECT_TRUE(json["ttft_ms"].is_null());
  EXPECT_TRUE(json["total_ms"].is_null());
  EXPECT_TRUE(json["gap_p50_ms"].is_null());
  EXPECT_TRUE(json["prompt_tokens"].is_null());
  EXPECT_TRUE(json["completion_tokens"].is_null());
  EXPECT_EQ(json["attempts"], nlohmann::json::array());
  EXPECT_EQ(json["over_budget"], nlohmann::json::array());
  EXPECT_EQ(json["tags"], nlohmann::json::array());
  EXPECT_EQ(json["deployment"], "");
  EXPECT_EQ(json["routed_to"], "");
  EXPECT_EQ(json["shaped"], "");
}

TEST(AccessLogJson, StringsAreEscapedAndInvalidUtf8Replaced) {
  RequestRecord record = full_record();
  record.model = "quote\" backslash\\ newline\n tab\t bell\x07 del\x7f é 日本 😀";
  record.request_id = "bad\xff\xfe utf8 \xc3 truncated \xed\xa0\x80 surrogate";
  record.key_name = std::string("nul\0inside", 10);
  record.tags = {"</script>", "\x1b[31mred"};
  std::string line;
  render_json_line(record, line);
  const nlohmann::json json = parse_line(line);
  EXPECT_EQ(json["model"], record.model);  // valid UTF-8 passes through unchanged
  EXPECT_EQ(json["key"], std::string("nul\0inside", 10));
  EXPECT_EQ(json["tags"][1], "\x1b[31mred");
  const std::string request_id = json["request_id"];
  EXPECT_EQ(request_id.find('\xff'), std::string::npos);
  EXPECT_NE(request_id.find("\xef\xbf\xbd"), std::string::npos);  // U+FFFD
  EXPECT_TRUE(request_id.starts_with("bad"));
}

TEST(AccessLogJson, LinesAppendWithoutClearing) {
  std::string out = "prefix ";
  render_json_line(full_record(), out);
  EXPECT_TRUE(out.starts_with("prefix {\"ts\":"));
  EXPECT_EQ(out.back(), '}');
}

TEST(AccessLogText, IsOneLogfmtLine) {
  RequestRecord record = full_record();
  record.key_name = "has space";
  record.prompt_tokens.reset();
  std::string line;
  render_text_line(record, line);
  EXPECT_EQ(line.find('\n'), std::string::npos);
  EXPECT_TRUE(line.starts_with("ts=2024-05-01T12:34:56.789Z request_id=req-1 ")) << line;
  EXPECT_NE(line.find(" key=\"has space\" "), std::string::npos) << line;
  EXPECT_NE(line.find(" cache=miss status=200 "), std::string::npos) << line;
  EXPECT_NE(line.find(" model=gpt-4o routed_to=gpt-4o-mini shaped=trimmed,max_tokens "),
            std::string::npos)
      << line;
  EXPECT_NE(line.find(" attempts=azure-1:timeout,openai-1:ok "), std::string::npos) << line;
  EXPECT_NE(line.find(" ttft_ms=52.125 "), std::string::npos) << line;
  EXPECT_NE(line.find(" prompt_tokens=- "), std::string::npos) << line;
  EXPECT_NE(line.find(" over_budget=total "), std::string::npos) << line;
  EXPECT_TRUE(line.ends_with(" tags=cache:miss,shaped:rpm")) << line;
}

// A sink that records lines and, while `slow` is set, takes 50 ms per line:
// a disk or pipe that cannot keep up.
class SlowSink final : public spdlog::sinks::base_sink<std::mutex> {
 public:
  std::atomic<bool> slow{true};

  std::vector<std::string> written() {
    std::lock_guard lock(mutex_);
    return lines_;
  }

 protected:
  void sink_it_(const spdlog::details::log_msg& message) override {
    if (slow.load()) std::this_thread::sleep_for(50ms);
    lines_.emplace_back(message.payload.data(), message.payload.size());
  }
  void flush_() override {}

 private:
  std::vector<std::string> lines_;  // guarded by base_sink's mutex
};

TEST(AccessLog, AFullSinkNeverBlocksTheCaller) {
  auto sink = std::make_shared<SlowSink>();
  AccessLogOptions options;
  options.queue_lines = 64;
  auto log = std::make_unique<AccessLog>(sink, options);
  ASSERT_TRUE(log->enabled());

  constexpr int kLines = 1000;
  std::vector<std::string> lines;
  for (int i = 0; i < kLines; ++i) lines.push_back("line " + std::to_string(i));
  const auto start = std::chrono::steady_clock::now();
  for (const std::string& line : lines) log->write_line(line);
  const auto elapsed = std::chrono::steady_clock::now() - start;
  const double elapsed_ms = std::chrono::duration<double, std::milli>(elapsed).count();
  std::printf("1000 lines into a 50 ms/line sink: %.3f ms on the caller's side\n", elapsed_ms);
  // A blocking logger would need 50 s; one line's worth of sink time is the
  // bound that shows nothing waited for the sink.
  EXPECT_LT(elapsed_ms, 50.0);
  EXPECT_GT(log->dropped(), 0u);

  sink->slow = false;
  log.reset();  // drains what is still queued
  const std::vector<std::string> written = sink->written();
  ASSERT_FALSE(written.empty());
  // Overflow drops the oldest lines, so the newest one is always written.
  EXPECT_EQ(written.back(), "line 999");
  EXPECT_LE(written.size(), 64u + 2u);
}

TEST(AccessLog, WritesRenderedRecordsToAFile) {
  const std::filesystem::path path = std::filesystem::temp_directory_path() /
                                     ("sluice-access-" + std::to_string(::getpid()) + ".log");
  std::filesystem::remove(path);
  {
    AccessLogOptions options;
    options.destination = path.string();
    AccessLog log(options);
    for (int i = 0; i < 3; ++i) {
      RequestRecord record = full_record();
      record.request_id = "req-" + std::to_string(i);
      log.write(record);
    }
  }
  std::ifstream file(path);
  std::string line;
  int count = 0;
  while (std::getline(file, line)) {
    const nlohmann::json json = nlohmann::json::parse(line);
    EXPECT_EQ(json["request_id"], "req-" + std::to_string(count));
    ++count;
  }
  EXPECT_EQ(count, 3);
  std::filesystem::remove(path);
}

TEST(AccessLog, TextFormatAndAppending) {
  const std::filesystem::path path = std::filesystem::temp_directory_path() /
                                     ("sluice-access-text-" + std::to_string(::getpid()) + ".log");
  std::filesystem::remove(path);
  AccessLogOptions options;
  options.destination = path.string();
  options.format = AccessLogFormat::text;
  for (int round = 0; round < 2; ++round) {
    AccessLog log(options);
    log.write(full_record());
  }
  std::ifstream file(path);
  std::string line;
  int count = 0;
  while (std::getline(file, line)) {
    EXPECT_TRUE(line.starts_with("ts=2024-05-01T12:34:56.789Z ")) << line;
    ++count;
  }
  EXPECT_EQ(count, 2);
  std::filesystem::remove(path);
}

TEST(AccessLog, OffWritesNothingAndBadPathsThrow) {
  AccessLogOptions options;
  options.destination = "off";
  AccessLog off(options);
  EXPECT_FALSE(off.enabled());
  off.write(full_record());
  off.flush();
  EXPECT_EQ(off.dropped(), 0u);

  options.destination = "stderr";
  EXPECT_TRUE(AccessLog(options).enabled());

  // A regular file where a directory should be: the file cannot be created.
  const std::filesystem::path not_a_directory =
      std::filesystem::temp_directory_path() / ("sluice-not-a-dir-" + std::to_string(::getpid()));
  std::ofstream(not_a_directory) << "x";
  options.destination = (not_a_directory / "access.log").string();
  EXPECT_THROW(AccessLog bad(options), std::runtime_error);
  std::filesystem::remove(not_a_directory);
}

}  // namespace
}  // namespace sluice::metrics
