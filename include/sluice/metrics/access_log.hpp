#pragma once

#include <boost/container/small_vector.hpp>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "sluice/metrics/budgets.hpp"

namespace spdlog {
class logger;
namespace details {
class thread_pool;
}
namespace sinks {
class sink;
}
}  // namespace spdlog

namespace sluice::metrics {

// One upstream attempt of a request, in the order they were made.
struct AttemptRecord {
  std::string deployment;
  std::string outcome;  // "ok", "timeout", "connect_error", "http_503", "cancelled", ...
  std::optional<double> connect_ms;  // absent on a reused pooled connection
  std::optional<double> tls_ms;      // absent for plain HTTP and reused connections
  std::optional<double> ttfb_ms;     // absent when no byte came back
  bool reused = false;               // a pooled keep-alive connection
};

// Everything the access log says about one request. Plain data: the pipeline
// fills it as the request goes and hands it to AccessLog::write at the end.
struct RequestRecord {
  std::chrono::system_clock::time_point timestamp;  // when the request head arrived
  std::string request_id;
  std::string trace_id;   // 32 hex digits
  std::string key_name;   // the client's key, by name (never the secret)
  std::string model;      // the public model name asked for
  std::string routed_to;  // the model a rule picked for `model`; empty when none did
  std::string shaped;     // the shaping changes made, as in x-sluice-shaped; empty for none
  bool stream = false;
  // The response cache: "hit", "semantic_hit", "miss" (stored if it
  // succeeds), "bypass" (Cache-Control: no-cache); empty when not consulted.
  std::string cache;
  unsigned status = 0;
  std::string deployment;  // the one that answered; empty when none did
  // Inline room for one: nearly every request makes exactly one attempt.
  boost::container::small_vector<AttemptRecord, 1> attempts;
  std::optional<double> ttft_ms;  // first byte sent to the client
  double total_ms = 0;
  std::uint64_t gateway_overhead_us = 0;
  std::optional<double> gap_p50_ms;  // between streamed reads
  std::optional<double> gap_max_ms;
  std::optional<std::uint64_t> prompt_tokens;
  std::optional<std::uint64_t> completion_tokens;
  std::uint64_t bytes_in = 0;   // request body bytes from the client
  std::uint64_t bytes_out = 0;  // response body bytes to the client
  bool client_disconnected = false;
  BudgetOverruns over_budget;
  std::vector<std::string> tags;  // shaping and cache notes, e.g. "cache:hit", "shaped:rpm"
};

// One JSON object on one line, appended to `out` (no newline). Every field
// is always present, unknown numbers as null, so log processors see one
// schema. Strings are escaped; invalid UTF-8 becomes U+FFFD.
void render_json_line(const RequestRecord& record, std::string& out);
// The same as logfmt (key=value, quoted where needed), for people reading
// a terminal. Unknown values are "-".
void render_text_line(const RequestRecord& record, std::string& out);

// "2024-05-01T12:00:00.123Z"
void append_rfc3339_utc(std::string& out, std::chrono::system_clock::time_point time);

enum class AccessLogFormat { json, text };

struct AccessLogOptions {
  std::string destination = "stderr";  // "stderr", "off", or a file path (appended to)
  AccessLogFormat format = AccessLogFormat::json;
  std::size_t queue_lines = 8192;  // lines waiting for the writer thread
};

// Writes access log lines from a dedicated spdlog async logger: its own
// queue and writer thread, separate from the diagnostic log. A line is
// rendered on the calling thread into a reused thread-local buffer and
// queued; when the queue is full the oldest queued line is dropped
// (counted by dropped()), so a slow disk or a stalled stderr never blocks an
// event loop. The queue is spdlog's, guarded by its mutex, which is held
// only to copy a line in or out, never across the sink's I/O.
class AccessLog {
 public:
  // Throws std::runtime_error when the file cannot be opened.
  explicit AccessLog(const AccessLogOptions& options);
  // Writes to `sink` (ignores options.destination): for tests and embedders.
  AccessLog(std::shared_ptr<spdlog::sinks::sink> sink, const AccessLogOptions& options);
  ~AccessLog();
  AccessLog(const AccessLog&) = delete;
  AccessLog& operator=(const AccessLog&) = delete;

  bool enabled() const { return logger_ != nullptr; }
  void write(const RequestRecord& record);
  void write_line(std::string_view line);
  // Asks the writer thread to flush the sink once the lines queued so far
  // are written; does not wait.
  void flush();
  std::size_t dropped() const;

 private:
  void start(std::shared_ptr<spdlog::sinks::sink> sink);

  AccessLogFormat format_;
  std::size_t queue_lines_;
  // The pool is declared first so it is destroyed last: its destructor
  // drains the queue, which needs the logger's sinks.
  std::shared_ptr<spdlog::details::thread_pool> thread_pool_;
  std::shared_ptr<spdlog::logger> logger_;
};

}  // namespace sluice::metrics
