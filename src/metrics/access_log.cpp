#include "sluice/metrics/access_log.hpp"

#include <spdlog/async_logger.h>
#include <spdlog/details/thread_pool.h>
#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include <charconv>
#include <cmath>
#include <stdexcept>

#include "sluice/common/json_scan.hpp"

namespace sluice::metrics {

namespace {

void append_unsigned(std::string& out, std::uint64_t value) {
  char buffer[24];
  auto [end, error] = std::to_chars(buffer, buffer + sizeof buffer, value);
  out.append(buffer, end);
}

// Milliseconds with 3 decimals (microsecond resolution), "null" when unknown.
void append_ms(std::string& out, std::optional<double> value, std::string_view absent) {
  if (!value || !std::isfinite(*value)) {
    out += absent;
    return;
  }
  char buffer[48];
  auto [end, error] =
      std::to_chars(buffer, buffer + sizeof buffer, *value, std::chars_format::fixed, 3);
  if (error != std::errc()) {
    out += absent;
    return;
  }
  out.append(buffer, end);
}

void append_optional_unsigned(std::string& out, std::optional<std::uint64_t> value,
                              std::string_view absent) {
  if (value) {
    append_unsigned(out, *value);
  } else {
    out += absent;
  }
}

void append_two_digits(std::string& out, unsigned value) {
  out += static_cast<char>('0' + value / 10 % 10);
  out += static_cast<char>('0' + value % 10);
}

// JSON writer state: knows whether a comma is due.
class JsonObject {
 public:
  explicit JsonObject(std::string& out) : out_(out) { out_ += '{'; }
  void close() { out_ += '}'; }
  std::string& key(std::string_view name) {
    if (!first_) out_ += ',';
    first_ = false;
    out_ += '"';
    out_ += name;  // our own field names need no escaping
    out_ += "\":";
    return out_;
  }
  void string(std::string_view name, std::string_view value) {
    append_json_string(key(name), value);
  }
  void boolean(std::string_view name, bool value) { key(name) += value ? "true" : "false"; }
  void number(std::string_view name, std::uint64_t value) { append_unsigned(key(name), value); }
  void ms(std::string_view name, std::optional<double> value) {
    append_ms(key(name), value, "null");
  }
  void count(std::string_view name, std::optional<std::uint64_t> value) {
    append_optional_unsigned(key(name), value, "null");
  }

 private:
  std::string& out_;
  bool first_ = true;
};

// logfmt: bare when plainly printable ASCII, otherwise a quoted, escaped
// string (JSON rules, which logfmt readers accept).
void append_logfmt_value(std::string& out, std::string_view value) {
  bool bare = !value.empty();
  for (char c : value) {
    const auto byte = static_cast<unsigned char>(c);
    if (byte <= 0x20 || byte >= 0x7f || c == '"' || c == '=' || c == '\\') {
      bare = false;
      break;
    }
  }
  if (bare) {
    out += value;
  } else {
    append_json_string(out, value);
  }
}

}  // namespace

void append_rfc3339_utc(std::string& out, std::chrono::system_clock::time_point time) {
  using namespace std::chrono;
  const auto millis = floor<milliseconds>(time);
  const auto day = floor<days>(millis);
  const year_month_day date{day};
  const hh_mm_ss clock{millis - day};
  const int year = static_cast<int>(date.year());
  append_two_digits(out, static_cast<unsigned>(year / 100));
  append_two_digits(out, static_cast<unsigned>(year % 100));
  out += '-';
  append_two_digits(out, static_cast<unsigned>(date.month()));
  out += '-';
  append_two_digits(out, static_cast<unsigned>(date.day()));
  out += 'T';
  append_two_digits(out, static_cast<unsigned>(clock.hours().count()));
  out += ':';
  append_two_digits(out, static_cast<unsigned>(clock.minutes().count()));
  out += ':';
  append_two_digits(out, static_cast<unsigned>(clock.seconds().count()));
  out += '.';
  const auto fraction = static_cast<unsigned>(clock.subseconds().count());
  out += static_cast<char>('0' + fraction / 100);
  append_two_digits(out, fraction % 100);
  out += 'Z';
}

void render_json_line(const RequestRecord& record, std::string& out) {
  JsonObject line(out);
  line.key("ts") += '"';
  append_rfc3339_utc(out, record.timestamp);
  out += '"';
  line.string("request_id", record.request_id);
  line.string("trace_id", record.trace_id);
  line.string("key", record.key_name);
  line.string("model", record.model);
  line.string("routed_to", record.routed_to);
  line.string("shaped", record.shaped);
  line.boolean("stream", record.stream);
  if (record.cache.empty()) {
    line.key("cache") += "null";
  } else {
    line.string("cache", record.cache);
  }
  line.number("status", record.status);
  line.string("deployment", record.deployment);
  line.key("attempts") += '[';
  for (std::size_t i = 0; i < record.attempts.size(); ++i) {
    const AttemptRecord& attempt = record.attempts[i];
    if (i > 0) out += ',';
    JsonObject object(out);
    object.string("deployment", attempt.deployment);
    object.string("outcome", attempt.outcome);
    object.ms("connect_ms", attempt.connect_ms);
    object.ms("tls_ms", attempt.tls_ms);
    object.ms("ttfb_ms", attempt.ttfb_ms);
    object.boolean("reused", attempt.reused);
    object.close();
  }
  out += ']';
  line.ms("ttft_ms", record.ttft_ms);
  line.ms("total_ms", record.total_ms);
  line.number("gateway_overhead_us", record.gateway_overhead_us);
  line.ms("gap_p50_ms", record.gap_p50_ms);
  line.ms("gap_max_ms", record.gap_max_ms);
  line.count("prompt_tokens", record.prompt_tokens);
  line.count("completion_tokens", record.completion_tokens);
  line.number("bytes_in", record.bytes_in);
  line.number("bytes_out", record.bytes_out);
  line.boolean("client_disconnected", record.client_disconnected);
  line.key("over_budget") += '[';
  bool first = true;
  for (BudgetStage stage : kBudgetStages) {
    if (!record.over_budget.contains(stage)) continue;
    if (!first) out += ',';
    first = false;
    append_json_string(out, to_string(stage));
  }
  out += ']';
  line.key("tags") += '[';
  for (std::size_t i = 0; i < record.tags.size(); ++i) {
    if (i > 0) out += ',';
    append_json_string(out, record.tags[i]);
  }
  out += ']';
  line.close();
}

void render_text_line(const RequestRecord& record, std::string& out) {
  const std::size_t start = out.size();
  auto key = [&](std::string_view name) {
    if (out.size() > start) out += ' ';
    out += name;
    out += '=';
  };
  auto text = [&](std::string_view name, std::string_view value) {
    key(name);
    if (value.empty()) {
      out += '-';
    } else {
      append_logfmt_value(out, value);
    }
  };
  key("ts");
  append_rfc3339_utc(out, record.timestamp);
  text("request_id", record.request_id);
  text("trace_id", record.trace_id);
  text("key", record.key_name);
  text("model", record.model);
  text("routed_to", record.routed_to);
  text("shaped", record.shaped);
  key("stream");
  out += record.stream ? "true" : "false";
  text("cache", record.cache);
  key("status");
  append_unsigned(out, record.status);
  text("deployment", record.deployment);
  std::string attempts;
  for (const AttemptRecord& attempt : record.attempts) {
    if (!attempts.empty()) attempts += ',';
    attempts += attempt.deployment;
    attempts += ':';
    attempts += attempt.outcome;
  }
  text("attempts", attempts);
  key("ttft_ms");
  append_ms(out, record.ttft_ms, "-");
  key("total_ms");
  append_ms(out, record.total_ms, "-");
  key("gateway_overhead_us");
  append_unsigned(out, record.gateway_overhead_us);
  key("gap_p50_ms");
  append_ms(out, record.gap_p50_ms, "-");
  key("gap_max_ms");
  append_ms(out, record.gap_max_ms, "-");
  key("prompt_tokens");
  append_optional_unsigned(out, record.prompt_tokens, "-");
  key("completion_tokens");
  append_optional_unsigned(out, record.completion_tokens, "-");
  key("bytes_in");
  append_unsigned(out, record.bytes_in);
  key("bytes_out");
  append_unsigned(out, record.bytes_out);
  key("client_disconnected");
  out += record.client_disconnected ? "true" : "false";
  std::string over;
  for (BudgetStage stage : kBudgetStages) {
    if (!record.over_budget.contains(stage)) continue;
    if (!over.empty()) over += ',';
    over += to_string(stage);
  }
  text("over_budget", over);
  std::string tags;
  for (const std::string& tag : record.tags) {
    if (!tags.empty()) tags += ',';
    tags += tag;
  }
  text("tags", tags);
}

// ---- AccessLog

AccessLog::AccessLog(const AccessLogOptions& options)
    : format_(options.format), queue_lines_(options.queue_lines) {
  if (options.destination == "off") return;
  std::shared_ptr<spdlog::sinks::sink> sink;
  if (options.destination == "stderr") {
    sink = std::make_shared<spdlog::sinks::stderr_sink_mt>();
  } else {
    try {
      sink = std::make_shared<spdlog::sinks::basic_file_sink_mt>(options.destination, false);
    } catch (const spdlog::spdlog_ex& error) {
      throw std::runtime_error("access_log: cannot open " + options.destination + ": " +
                               error.what());
    }
  }
  start(std::move(sink));
}

AccessLog::AccessLog(std::shared_ptr<spdlog::sinks::sink> sink, const AccessLogOptions& options)
    : format_(options.format), queue_lines_(options.queue_lines) {
  start(std::move(sink));
}

AccessLog::~AccessLog() = default;

void AccessLog::start(std::shared_ptr<spdlog::sinks::sink> sink) {
  sink->set_pattern("%v");
  thread_pool_ =
      std::make_shared<spdlog::details::thread_pool>(std::max<std::size_t>(queue_lines_, 1), 1);
  // Not registered with spdlog's global registry: the access log is not a
  // diagnostic logger, and several may exist at once (tests, reloads).
  logger_ = std::make_shared<spdlog::async_logger>("access", std::move(sink), thread_pool_,
                                                   spdlog::async_overflow_policy::overrun_oldest);
  logger_->set_level(spdlog::level::info);
  // Flushing happens on the writer thread, so flushing every line costs the
  // event loops nothing and keeps `tail -f` current.
  logger_->flush_on(spdlog::level::info);
}

void AccessLog::write(const RequestRecord& record) {
  if (!logger_) return;
  thread_local std::string line;
  line.clear();
  if (format_ == AccessLogFormat::json) {
    render_json_line(record, line);
  } else {
    render_text_line(record, line);
  }
  logger_->log(spdlog::level::info, spdlog::string_view_t(line.data(), line.size()));
}

void AccessLog::write_line(std::string_view line) {
  if (!logger_) return;
  logger_->log(spdlog::level::info, spdlog::string_view_t(line.data(), line.size()));
}

void AccessLog::flush() {
  if (logger_) logger_->flush();
}

std::size_t AccessLog::dropped() const {
  return thread_pool_ ? thread_pool_->overrun_counter() : 0;
}

}  // namespace sluice::metrics
