#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace sluice::bench {

using Clock = std::chrono::steady_clock;

// Anything the user typed wrong; main turns it into exit code 2.
struct UsageError {
  std::string message;
};

// An http:// URL split into what the load generator needs. TLS is left out on
// purpose: the benchmark measures proxies on loopback, where TLS would only add
// the same constant to every target.
struct HttpUrl {
  std::string host;  // no brackets for IPv6
  std::uint16_t port = 80;
  std::string target = "/";  // path and query
  std::string host_header;   // "host:port" as sent in Host
};

std::optional<HttpUrl> parse_http_url(std::string_view text, std::string& why);

// "0", "250us", "20ms", "1.5s", "2m"; a bare number is seconds, as load
// durations are usually typed in seconds.
std::optional<Clock::duration> parse_duration(std::string_view text);

// Everything that shapes the load, shared by single runs and compare rounds.
struct LoadOptions {
  bool stream = false;
  unsigned concurrency = 0;         // closed loop when > 0
  double rate = 0;                  // open loop (requests per second) when > 0
  unsigned max_connections = 1024;  // open loop: connections are added up to this
  Clock::duration duration = std::chrono::seconds(5);
  std::uint64_t requests = 0;  // when > 0, replaces duration
  Clock::duration warmup = std::chrono::seconds(1);
  // Closed loop: connection k of N sends its first request k*ramp/N after
  // the start, so that streams do not run in step.
  Clock::duration ramp{};
  // Closed loop: after an answer with an error status, the connection waits
  // this long before its next request, as a client that backs off does
  // (0: at once).
  Clock::duration pause_after_error{};
  Clock::duration timeout = std::chrono::seconds(30);
  std::string model;
  std::vector<std::string> headers;  // "name: value"
  std::string body_file;
  unsigned threads = 1;
  // Not an option of its own: compare sets it to look for stalls in the
  // times of the TTFT and gap stretch samples (RunResult::ttft_samples).
  bool keep_sample_times = false;

  bool open_loop() const { return rate > 0; }
};

// Walks "--name value" and "--name=value" options.
class ArgumentCursor {
 public:
  ArgumentCursor(int argc, char** argv, int first) : argc_(argc), argv_(argv), index_(first - 1) {}

  // Moves to the next option; false when there is none left.
  bool next();
  std::string_view name() const { return name_; }
  // The current option's value; throws UsageError when it has none.
  std::string_view value();

 private:
  int argc_;
  char** argv_;
  int index_;
  std::string_view name_;
  std::optional<std::string_view> inline_value_;
};

// Applies the cursor's current option when it is a load option; false when it
// is not one. Throws UsageError on a bad value.
bool parse_load_option(ArgumentCursor& cursor, LoadOptions& options);

unsigned parse_count(std::string_view option, std::string_view value, unsigned minimum = 0);
Clock::duration parse_duration_option(std::string_view option, std::string_view value);

// Fills defaults and rejects contradictions (both --rate and --concurrency...).
void validate(LoadOptions& options);

// The request bytes sent for every exchange, built once.
std::string build_request(const HttpUrl& url, const LoadOptions& options);

// One line describing the load, for report headers.
std::string describe(const LoadOptions& options);

std::string format_duration(Clock::duration duration);

}  // namespace sluice::bench
