#include "options.hpp"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <utility>

namespace sluice::bench {

namespace {

std::string read_whole_file(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) throw UsageError{"cannot read " + path};
  std::ostringstream contents;
  contents << file.rdbuf();
  return contents.str();
}

// Quotes `text` as a JSON string; model names are short and user-supplied.
std::string json_quoted(std::string_view text) {
  std::string out = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char escaped[8];
      std::snprintf(escaped, sizeof escaped, "\\u%04x", c);
      out += escaped;
    } else {
      out += c;
    }
  }
  out += '"';
  return out;
}

double parse_rate(std::string_view value) {
  double rate = 0;
  auto [end, error] = std::from_chars(value.data(), value.data() + value.size(), rate);
  if (value.empty() || error != std::errc{} || end != value.data() + value.size() ||
      !(rate > 0 && std::isfinite(rate))) {
    throw UsageError{"--rate expects a positive number of requests per second"};
  }
  return rate;
}

}  // namespace

std::optional<HttpUrl> parse_http_url(std::string_view text, std::string& why) {
  constexpr std::string_view kScheme = "http://";
  if (!text.starts_with(kScheme)) {
    why = "only http:// URLs are supported";
    return std::nullopt;
  }
  std::string_view rest = text.substr(kScheme.size());
  const auto path_start = rest.find('/');
  const std::string_view authority = rest.substr(0, path_start);
  HttpUrl url;
  url.target = path_start == std::string_view::npos ? "/" : std::string(rest.substr(path_start));

  std::string_view host = authority;
  std::string_view port;
  if (authority.starts_with('[')) {
    const auto close = authority.find(']');
    if (close == std::string_view::npos) {
      why = "unterminated IPv6 address";
      return std::nullopt;
    }
    host = authority.substr(1, close - 1);
    if (close + 1 < authority.size()) {
      if (authority[close + 1] != ':') {
        why = "unexpected text after the IPv6 address";
        return std::nullopt;
      }
      port = authority.substr(close + 2);
    }
  } else if (auto colon = authority.rfind(':'); colon != std::string_view::npos) {
    host = authority.substr(0, colon);
    port = authority.substr(colon + 1);
  }
  if (host.empty()) {
    why = "missing host";
    return std::nullopt;
  }
  url.host = std::string(host);
  if (!port.empty()) {
    unsigned number = 0;
    auto [end, error] = std::from_chars(port.data(), port.data() + port.size(), number);
    if (error != std::errc{} || end != port.data() + port.size() || number == 0 || number > 65535) {
      why = "invalid port";
      return std::nullopt;
    }
    url.port = static_cast<std::uint16_t>(number);
  }
  url.host_header = std::string(authority);
  return url;
}

std::optional<Clock::duration> parse_duration(std::string_view text) {
  std::size_t number_end = 0;
  while (number_end < text.size() &&
         ((text[number_end] >= '0' && text[number_end] <= '9') || text[number_end] == '.')) {
    ++number_end;
  }
  double amount = 0;
  auto [end, error] = std::from_chars(text.data(), text.data() + number_end, amount);
  if (number_end == 0 || error != std::errc{} || end != text.data() + number_end) {
    return std::nullopt;
  }
  const std::string_view unit = text.substr(number_end);
  double nanoseconds_per_unit = 0;
  if (unit == "us") {
    nanoseconds_per_unit = 1e3;
  } else if (unit == "ms") {
    nanoseconds_per_unit = 1e6;
  } else if (unit == "s" || unit.empty()) {
    nanoseconds_per_unit = 1e9;
  } else if (unit == "m") {
    nanoseconds_per_unit = 60e9;
  } else {
    return std::nullopt;
  }
  const double total = amount * nanoseconds_per_unit;
  if (!std::isfinite(total) || total > 1e15) return std::nullopt;
  return std::chrono::duration_cast<Clock::duration>(
      std::chrono::nanoseconds(static_cast<std::int64_t>(std::llround(total))));
}

bool ArgumentCursor::next() {
  if (++index_ >= argc_) return false;
  name_ = argv_[index_];
  inline_value_.reset();
  if (auto equals = name_.find('='); name_.starts_with("--") && equals != name_.npos) {
    inline_value_ = name_.substr(equals + 1);
    name_ = name_.substr(0, equals);
  }
  return true;
}

std::string_view ArgumentCursor::value() {
  if (inline_value_) return *std::exchange(inline_value_, std::nullopt);
  if (index_ + 1 >= argc_) throw UsageError{std::string(name_) + " needs a value"};
  return argv_[++index_];
}

unsigned parse_count(std::string_view option, std::string_view value, unsigned minimum) {
  unsigned count = 0;
  auto [end, error] = std::from_chars(value.data(), value.data() + value.size(), count);
  if (value.empty() || error != std::errc{} || end != value.data() + value.size() ||
      count < minimum) {
    throw UsageError{"invalid number for " + std::string(option) + ": '" + std::string(value) +
                     "'"};
  }
  return count;
}

Clock::duration parse_duration_option(std::string_view option, std::string_view value) {
  auto duration = parse_duration(value);
  if (!duration) {
    throw UsageError{"invalid duration for " + std::string(option) + ": '" + std::string(value) +
                     "' (examples: 500ms, 5s, 1m)"};
  }
  return *duration;
}

bool parse_load_option(ArgumentCursor& cursor, LoadOptions& options) {
  const std::string_view name = cursor.name();
  if (name == "--stream") {
    options.stream = true;
  } else if (name == "--concurrency" || name == "-c") {
    options.concurrency = parse_count(name, cursor.value(), 1);
  } else if (name == "--rate") {
    options.rate = parse_rate(cursor.value());
  } else if (name == "--max-connections") {
    options.max_connections = parse_count(name, cursor.value(), 1);
  } else if (name == "--duration") {
    options.duration = parse_duration_option(name, cursor.value());
  } else if (name == "--requests" || name == "-n") {
    options.requests = parse_count(name, cursor.value(), 1);
  } else if (name == "--warmup") {
    options.warmup = parse_duration_option(name, cursor.value());
  } else if (name == "--ramp") {
    options.ramp = parse_duration_option(name, cursor.value());
  } else if (name == "--pause-after-error") {
    options.pause_after_error = parse_duration_option(name, cursor.value());
  } else if (name == "--timeout") {
    options.timeout = parse_duration_option(name, cursor.value());
  } else if (name == "--model") {
    options.model = std::string(cursor.value());
  } else if (name == "--header" || name == "-H") {
    std::string header(cursor.value());
    const auto colon = header.find(':');
    if (colon == std::string::npos || colon == 0 ||
        header.find_first_of("\r\n") != std::string::npos) {
      throw UsageError{"--header expects 'name: value', got '" + header + "'"};
    }
    options.headers.push_back(std::move(header));
  } else if (name == "--body-file") {
    options.body_file = std::string(cursor.value());
  } else if (name == "--threads") {
    options.threads = parse_count(name, cursor.value(), 1);
  } else {
    return false;
  }
  return true;
}

void validate(LoadOptions& options) {
  if (options.concurrency > 0 && options.rate > 0) {
    throw UsageError{"--concurrency (closed loop) and --rate (open loop) exclude each other"};
  }
  if (options.concurrency == 0 && options.rate == 0) options.concurrency = 1;
  if (options.model.empty() && options.body_file.empty()) {
    throw UsageError{"--model is required (or give the whole body with --body-file)"};
  }
  if (options.requests == 0 && options.duration <= Clock::duration::zero()) {
    throw UsageError{"--duration must be positive"};
  }
  if (options.timeout <= Clock::duration::zero()) throw UsageError{"--timeout must be positive"};
  if (options.ramp > Clock::duration::zero() && options.open_loop()) {
    throw UsageError{"--ramp staggers closed-loop connections; an open loop has its schedule"};
  }
  if (options.pause_after_error > Clock::duration::zero() && options.open_loop()) {
    throw UsageError{
        "--pause-after-error delays a closed-loop connection; an open loop has its schedule"};
  }
  // A closed-loop thread without a connection would only idle.
  if (!options.open_loop() && options.threads > options.concurrency) {
    options.threads = options.concurrency;
  }
}

std::string build_request(const HttpUrl& url, const LoadOptions& options) {
  std::string body;
  if (!options.body_file.empty()) {
    body = read_whole_file(options.body_file);
  } else {
    body = R"({"model":)" + json_quoted(options.model) +
           R"(,"messages":[{"role":"user","content":"Say hello."}])";
    if (options.stream) body += R"(,"stream":true)";
    body += '}';
  }
  std::string request;
  request.reserve(512 + body.size());
  request += "POST " + url.target + " HTTP/1.1\r\n";
  request += "Host: " + url.host_header + "\r\n";
  request += "User-Agent: sluice-bench\r\n";
  request += "Content-Type: application/json\r\n";
  request += options.stream ? "Accept: text/event-stream\r\n" : "Accept: application/json\r\n";
  request += "Content-Length: " + std::to_string(body.size()) + "\r\n";
  for (const auto& header : options.headers) request += header + "\r\n";
  request += "\r\n";
  request += body;
  return request;
}

std::string format_duration(Clock::duration duration) {
  const double seconds = std::chrono::duration<double>(duration).count();
  char text[32];
  if (seconds >= 1 || seconds == 0) {
    std::snprintf(text, sizeof text, "%gs", seconds);
  } else {
    std::snprintf(text, sizeof text, "%gms", seconds * 1e3);
  }
  return text;
}

std::string describe(const LoadOptions& options) {
  std::ostringstream text;
  if (options.open_loop()) {
    text << "open loop at " << options.rate << " req/s (up to " << options.max_connections
         << " connections)";
  } else {
    text << "closed loop, concurrency " << options.concurrency;
    if (options.ramp > Clock::duration::zero()) {
      text << " started over " << format_duration(options.ramp);
    }
    if (options.pause_after_error > Clock::duration::zero()) {
      text << ", pausing " << format_duration(options.pause_after_error)
           << " after an error status";
    }
  }
  text << (options.stream ? ", streaming" : ", non-streaming");
  if (options.requests > 0) {
    text << ", " << options.requests << " requests";
  } else {
    text << ", " << format_duration(options.duration);
  }
  text << " after " << format_duration(options.warmup) << " warmup, " << options.threads
       << (options.threads == 1 ? " thread" : " threads");
  for (const auto& header : options.headers) text << ", " << header;
  return text.str();
}

}  // namespace sluice::bench
