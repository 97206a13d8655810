// Turns the YAML config into a validated Config. Every check reports the
// YAML path and line of the offending node, because the person reading the
// error is editing that file by hand.

#include "sluice/config/config.hpp"

#include <openssl/bio.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <iterator>
#include <limits>
#include <map>
#include <memory>
#include <sstream>
#include <string_view>
#include <thread>

#include "sluice/common/hex.hpp"
#include "sluice/common/sha256.hpp"
#include "sluice/openai/endpoints.hpp"

namespace sluice::config {
namespace {

// A node plus where it sits in the document, so any check on it can build
// the "<path>: <problem> (line N)" message.
struct Located {
  YAML::Node node;
  std::string path;
  int line = 1;  // 1-based
};

// Messages quote the config's own text (keys, values, yaml-cpp's view of a
// bad escape); a control byte in them would cut what() short at a NUL, hiding
// the line number, or reach the terminal or log as an escape sequence.
std::string printable(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (unsigned char c : text) {
    if (c < 0x20 || c == 0x7f) {
      char escaped[5];
      std::snprintf(escaped, sizeof escaped, "\\x%02x", c);
      out += escaped;
    } else {
      out.push_back(static_cast<char>(c));
    }
  }
  return out;
}

[[noreturn]] void fail(const std::string& path, const std::string& what, int line) {
  throw ConfigError(printable((path.empty() ? "(root)" : path) + ": " + what) + " (line " +
                    std::to_string(line) + ")");
}

[[noreturn]] void fail(const Located& at, const std::string& what) { fail(at.path, what, at.line); }

int line_of(const YAML::Node& node, int fallback) {
  YAML::Mark mark = node.Mark();
  return mark.is_null() ? fallback : mark.line + 1;
}

std::string join_path(const std::string& parent, std::string_view key) {
  return parent.empty() ? std::string(key) : parent + "." + std::string(key);
}

std::string index_path(const std::string& parent, std::size_t index) {
  return parent + "[" + std::to_string(index) + "]";
}

const char* type_name(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Null:
      return "null";
    case YAML::NodeType::Scalar:
      return "a scalar";
    case YAML::NodeType::Sequence:
      return "a sequence";
    case YAML::NodeType::Map:
      return "a mapping";
    case YAML::NodeType::Undefined:
      break;
  }
  return "nothing";
}

// "a, b, c", each name after `prefix`.
template <class Names>
std::string join_names(const Names& names, std::string_view prefix = {}) {
  std::string joined;
  for (std::string_view name : names) {
    if (!joined.empty()) joined += ", ";
    joined.append(prefix).append(name);
  }
  return joined;
}

std::string lower_ascii(std::string text) {
  for (char& c : text) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return text;
}

// ---------------------------------------------------------------------------
// Environment substitution

bool is_env_name(std::string_view name) {
  if (name.empty() || std::isdigit(static_cast<unsigned char>(name.front()))) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
  });
}

std::string lookup_env(std::string_view name, const EnvLookup& env, const Located& at) {
  if (!is_env_name(name)) {
    fail(at, "invalid environment variable name '" + std::string(name) +
                 "' (letters, digits and '_', not starting with a digit)");
  }
  std::optional<std::string> value;
  if (env) value = env(std::string(name));
  if (!value) fail(at, "environment variable " + std::string(name) + " is not set");
  return *std::move(value);
}

// Expands "${VAR}" anywhere in the text and a whole-value "os.environ/VAR".
// "$${" stays a literal "${". Substituted values are not expanded again, so
// a secret that happens to contain "${" is passed through untouched.
std::string expand_env(const std::string& raw, const EnvLookup& env, const Located& at) {
  constexpr std::string_view kWholeValuePrefix = "os.environ/";
  if (raw.starts_with(kWholeValuePrefix)) {
    return lookup_env(std::string_view(raw).substr(kWholeValuePrefix.size()), env, at);
  }

  std::string expanded;
  expanded.reserve(raw.size());
  std::size_t pos = 0;
  while (pos < raw.size()) {
    if (raw.compare(pos, 3, "$${") == 0) {
      expanded += "${";
      pos += 3;
    } else if (raw.compare(pos, 2, "${") == 0) {
      auto close = raw.find('}', pos + 2);
      if (close == std::string::npos) fail(at, "unterminated '${' (missing '}')");
      expanded += lookup_env(std::string_view(raw).substr(pos + 2, close - pos - 2), env, at);
      pos = close + 1;
    } else {
      expanded += raw[pos++];
    }
  }
  return expanded;
}

// ---------------------------------------------------------------------------
// Mappings

// Reads one YAML mapping: rejects unknown and repeated keys up front, then
// hands out values by name. A key whose value is null ("key:" or "key: ~")
// counts as absent, so commenting out every child of a section leaves the
// defaults in place.
class MappingReader {
 public:
  MappingReader(const Located& at, std::initializer_list<std::string_view> allowed) : at_(at) {
    if (at.node.IsNull()) return;
    if (!at.node.IsMap()) fail(at, std::string("expected a mapping, got ") + type_name(at.node));

    std::map<std::string, int, std::less<>> first_line_of_key;
    for (auto it = at.node.begin(); it != at.node.end(); ++it) {
      YAML::Node key_node = it->first;  // a copy: `it->` yields a temporary
      int key_line = line_of(key_node, at.line);
      if (!key_node.IsScalar()) {
        fail(at.path, std::string("keys must be plain names, got ") + type_name(key_node),
             key_line);
      }
      const std::string& key = key_node.Scalar();
      std::string path = join_path(at.path, key);
      if (std::find(allowed.begin(), allowed.end(), key) == allowed.end()) {
        fail(path, "unknown key '" + key + "' (allowed: " + join_names(allowed) + ")", key_line);
      }
      auto [previous, inserted] = first_line_of_key.emplace(key, key_line);
      if (!inserted) {
        fail(path,
             "duplicate key '" + key + "' (first given at line " +
                 std::to_string(previous->second) + ")",
             key_line);
      }
      YAML::Node value = it->second;
      // A null value's mark points past the key, often at the next line;
      // the key's own line is what the reader wants to see.
      int value_line = value.IsNull() ? key_line : line_of(value, key_line);
      entries_.push_back({key, Located{value, std::move(path), value_line}});
    }
  }

  std::optional<Located> get(std::string_view key) const {
    for (const auto& entry : entries_) {
      if (entry.key == key) {
        if (entry.value.node.IsNull()) return std::nullopt;
        return entry.value;
      }
    }
    return std::nullopt;
  }

  Located require(std::string_view key) const {
    if (auto value = get(key)) return *value;
    fail(join_path(at_.path, key), "missing required key", at_.line);
  }

 private:
  struct Entry {
    std::string key;
    Located value;
  };
  Located at_;
  std::vector<Entry> entries_;
};

// The line of `key` itself within the mapping at `at`.
int line_of_key(const Located& at, std::string_view key) {
  for (auto it = at.node.begin(); it != at.node.end(); ++it) {
    YAML::Node key_node = it->first;
    if (key_node.IsScalar() && key_node.Scalar() == key) return line_of(key_node, at.line);
  }
  return at.line;
}

std::vector<Located> sequence_items(const Located& at) {
  if (!at.node.IsSequence()) {
    fail(at, std::string("expected a sequence, got ") + type_name(at.node));
  }
  std::vector<Located> items;
  std::size_t index = 0;
  for (auto it = at.node.begin(); it != at.node.end(); ++it, ++index) {
    items.push_back(Located{*it, index_path(at.path, index), line_of(*it, at.line)});
  }
  return items;
}

// ---------------------------------------------------------------------------
// The document

class Loader {
 public:
  explicit Loader(EnvLookup env) : env_(std::move(env)) {}

  Config load(const Located& root);

 private:
  // Every scalar goes through here, so "${VAR}" works in numbers and
  // durations as much as in API keys and URLs.
  std::string read_string(const Located& at, std::string_view expected = "a string") const {
    if (!at.node.IsScalar()) {
      fail(at, "expected " + std::string(expected) + ", got " + type_name(at.node));
    }
    return expand_env(at.node.Scalar(), env_, at);
  }

  std::string read_non_empty_string(const Located& at) const {
    std::string text = read_string(at);
    if (text.empty()) fail(at, "must not be empty");
    return text;
  }

  std::uint64_t read_unsigned(const Located& at, std::uint64_t min, std::uint64_t max) const {
    std::string text = read_string(at, "a number");
    if (text.starts_with('-')) fail(at, "must not be negative, got " + text);
    std::uint64_t value = 0;
    auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
    bool whole_text = end == text.data() + text.size();
    if (text.empty() || !whole_text ||
        (ec != std::errc{} && ec != std::errc::result_out_of_range)) {
      fail(at, "expected a whole number, got '" + text + "'");
    }
    if (value < min) {
      fail(at, "out of range: must be at least " + std::to_string(min) + ", got " + text);
    }
    if (ec == std::errc::result_out_of_range || value > max) {
      fail(at, "out of range: must be at most " + std::to_string(max) + ", got " + text);
    }
    return value;
  }

  unsigned read_uint(const Located& at, unsigned min,
                     unsigned max = std::numeric_limits<unsigned>::max()) const {
    return static_cast<unsigned>(read_unsigned(at, min, max));
  }

  std::size_t read_size(const Located& at, std::size_t min) const {
    return static_cast<std::size_t>(
        read_unsigned(at, min, std::numeric_limits<std::size_t>::max()));
  }

  double read_non_negative_double(const Located& at) const {
    std::string text = read_string(at, "a number");
    double value = 0;
    auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
    if (text.empty() || ec != std::errc{} || end != text.data() + text.size() ||
        !std::isfinite(value)) {
      fail(at, "expected a number, got '" + text + "'");
    }
    if (value < 0) fail(at, "out of range: must be at least 0, got " + text);
    return value;
  }

  bool read_bool(const Located& at) const {
    std::string text = read_string(at, "true or false");
    // The YAML 1.2 core schema spellings only: "yes"/"on" are too easily a
    // leftover from some other value.
    if (text == "true" || text == "True" || text == "TRUE") return true;
    if (text == "false" || text == "False" || text == "FALSE") return false;
    fail(at, "expected true or false, got '" + text + "'");
  }

  Duration read_duration(const Located& at) const {
    std::string text = read_string(at, "a duration");
    auto duration = parse_duration(text);
    if (!duration) {
      if (text.starts_with('-')) fail(at, "duration must not be negative, got '" + text + "'");
      if (!text.empty() &&
          std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; })) {
        fail(at, "duration '" + text + "' needs a unit (ms, s, m or h), e.g. " + text + "s");
      }
      fail(at, "invalid duration '" + text +
                   "' (expected a number and a unit: ms, s, m or h, e.g. 250ms, 2s, 1.5s, 1m; "
                   "it must come to a whole number of milliseconds)");
    }
    return *duration;
  }

  // Every duration in the schema is a timeout or an interval where zero
  // would either never fire or spin, so zero is rejected across the board.
  Duration read_positive_duration(const Located& at) const {
    Duration duration = read_duration(at);
    if (duration.count() == 0) fail(at, "must be greater than zero");
    return duration;
  }

  template <typename Enum>
  Enum read_enum(const Located& at,
                 std::initializer_list<std::pair<std::string_view, Enum>> choices) const {
    std::string text = read_string(at);
    std::string allowed;
    for (const auto& [name, value] : choices) {
      if (name == text) return value;
      if (!allowed.empty()) allowed += ", ";
      allowed += name;
    }
    fail(at, "invalid value '" + text + "' (allowed: " + allowed + ")");
  }

  void read_server(const Located& at, Server& server) const;
  void read_upstream(const Located& at, Upstream& upstream) const;
  Http2Mode read_http2_mode(const Located& at) const;
  // upstream.http2, for the deployments that do not set their own.
  Http2Mode default_http2_ = Http2Mode::automatic;
  void read_router(const Located& at, Router& router) const;
  void read_adaptive(const Located& at, Router& router) const;
  void read_adaptive_deadline(const Located& at, AdaptiveDeadline& deadline) const;
  void read_log(const Located& at, Log& log) const;
  void read_budgets(const Located& at, Budgets& budgets) const;
  void read_state(const Located& at, State& state) const;
  void read_auth(const Located& at, Auth& auth);
  ApiKey read_api_key(const Located& at);
  std::array<unsigned char, 32> read_key_digest(const MappingReader& map, const Located& at) const;
  std::vector<std::string> read_model_patterns(const Located& at) const;
  void read_models(const Located& at, Config& config);
  Model read_model(const Located& at);
  Shaping read_shaping(const Located& at) const;
  TrimHistory read_trim_history(const Located& at) const;
  std::vector<Rule> read_rules(const Located& at, const std::string& owner);
  RuleCondition read_rule_condition(const Located& at) const;
  Deployment read_deployment(const Located& at, const std::string& model_name,
                             std::size_t deployment_index);
  void read_timeouts(const Located& at, Timeouts& timeouts) const;
  void read_headers(const Located& at, Deployment& deployment) const;
  void read_api_version(const Located& at, const MappingReader& map, Deployment& deployment) const;
  // The path, checked readable; "" for an explicit "" (system store only).
  std::string read_ca_file(const Located& at) const;
  // The path at `at`, checked to be a readable file; `noun` names it.
  std::string read_file_path(const Located& at, const std::string& noun) const;
  void read_listener_tls(const Located& at, ListenerTls& tls) const;
  std::vector<std::string> read_model_references(const Located& at, const std::string& owner);
  void read_cache(const Located& at, const std::string& owner, Cache& cache);
  std::vector<std::string> read_default_for(const Located& at);

  EnvLookup env_;

  // Names and ids must be unique; these remember where each was first used.
  std::map<std::string, std::string> model_name_paths_;
  std::map<std::string, std::string, std::less<>> default_for_paths_;
  std::map<std::string, std::string> deployment_id_paths_;
  std::map<std::string, std::string> api_key_name_paths_;
  std::map<std::array<unsigned char, 32>, std::string> api_key_digest_paths_;

  // Fallback names are checked once every model is known.
  struct ModelReference {
    std::string name;
    std::string owner;
    Located at;
  };
  std::vector<ModelReference> model_references_;
  // Rule targets likewise; they must name models with deployments.
  std::vector<ModelReference> rule_targets_;

  // Semantic caches name their embedding model; checked like fallbacks.
  std::vector<ModelReference> embedding_references_;

  // Every referenced model must exist and must not be the one naming it
  // (which "cannot <self_use>").
  void check_model_references(const Config& config, const std::vector<ModelReference>& references,
                              std::string_view self_use) const;
};

void Loader::read_server(const Located& at, Server& server) const {
  MappingReader map(at, {"listen", "threads", "max_body_bytes", "max_header_bytes",
                         "header_timeout", "body_timeout", "keepalive_timeout", "write_timeout",
                         "max_connections", "admin_listen", "admin_key", "drain_timeout",
                         "busy_poll_us", "tls", "admin_tls", "memory_release_after"});
  if (auto value = map.get("listen")) {
    std::string text = read_string(*value);
    auto listen = parse_listen(text);
    if (!listen) {
      fail(*value, "invalid listen address '" + text +
                       "' (expected host:port or [ipv6]:port, port 0-65535)");
    }
    server.listen_host = listen->first;
    server.listen_port = listen->second;
  }
  if (auto value = map.get("admin_listen")) {
    std::string text = read_string(*value);
    if (text == "off") {
      server.admin_enabled = false;
    } else {
      auto listen = parse_listen(text);
      if (!listen) {
        fail(*value, "invalid listen address '" + text +
                         "' (expected off, host:port or [ipv6]:port, port 0-65535)");
      }
      server.admin_host = listen->first;
      server.admin_port = listen->second;
    }
  }
  // Caught here rather than as a bind failure at start-up, which would not
  // say which of the two keys to change.
  if (server.admin_enabled && server.admin_port != 0 && server.admin_port == server.listen_port &&
      server.admin_host == server.listen_host) {
    if (auto value = map.get("admin_listen")) fail(*value, "must differ from server.listen");
    fail(*map.get("listen"),
         "collides with the admin listener (server.admin_listen defaults to 127.0.0.1:9090); "
         "set admin_listen to another address or to off");
  }
  if (auto value = map.get("admin_key")) {
    server.admin_key = read_string(*value);
    // Compared against a request header, which cannot carry line breaks: such
    // a key could never match and would lock the admin listener for good.
    if (server.admin_key.find_first_of("\r\n") != std::string::npos) {
      fail(*value, "must not contain line breaks");
    }
  }
  if (auto value = map.get("tls")) read_listener_tls(*value, server.tls);
  if (auto value = map.get("admin_tls")) read_listener_tls(*value, server.admin_tls);
  if (auto value = map.get("drain_timeout")) server.drain_timeout = read_positive_duration(*value);
  if (auto value = map.get("memory_release_after")) {
    server.memory_release_after = read_positive_duration(*value);
    // Quiet is judged a second at a time; an hour is a typo for a minute.
    if (server.memory_release_after < std::chrono::seconds(1) ||
        server.memory_release_after > std::chrono::hours(1)) {
      fail(*value, "must be between 1s and 1h");
    }
  }
  // More threads than this is a typo, not a machine.
  if (auto value = map.get("threads")) server.threads = read_uint(*value, 0, 1024);
  // Up to a second: beyond that the workers never sleep under any load
  // worth the name, and a bigger number is a typo.
  if (auto value = map.get("busy_poll_us")) {
    server.busy_poll = std::chrono::microseconds(read_uint(*value, 0, 1000000));
  }
  if (auto value = map.get("max_body_bytes")) server.max_body_bytes = read_size(*value, 1);
  if (auto value = map.get("max_header_bytes")) server.max_header_bytes = read_size(*value, 1);
  if (auto value = map.get("header_timeout"))
    server.header_timeout = read_positive_duration(*value);
  if (auto value = map.get("body_timeout")) server.body_timeout = read_positive_duration(*value);
  if (auto value = map.get("keepalive_timeout")) {
    server.keepalive_timeout = read_positive_duration(*value);
  }
  if (auto value = map.get("write_timeout")) server.write_timeout = read_positive_duration(*value);
  if (auto value = map.get("max_connections")) server.max_connections = read_uint(*value, 1);

  if (server.threads == 0) server.threads = std::max(1u, std::thread::hardware_concurrency());
}

Http2Mode Loader::read_http2_mode(const Located& at) const {
  const std::string text = read_string(at);
  if (text == "auto") return Http2Mode::automatic;
  if (text == "off") return Http2Mode::off;
  if (text == "prior_knowledge") return Http2Mode::prior_knowledge;
  fail(at, "invalid value '" + text + "' (expected auto, off or prior_knowledge)");
}

void Loader::read_upstream(const Located& at, Upstream& upstream) const {
  MappingReader map(at, {"max_idle_per_origin", "idle_expiry", "dns_ttl", "http2",
                         "http2_ping_after", "http2_ping_timeout"});
  if (auto value = map.get("http2")) upstream.http2 = read_http2_mode(*value);
  if (auto value = map.get("http2_ping_after")) {
    upstream.http2_ping_after = read_positive_duration(*value);
  }
  if (auto value = map.get("http2_ping_timeout")) {
    upstream.http2_ping_timeout = read_positive_duration(*value);
  }
  // Zero idle connections is valid: it turns pooling off.
  if (auto value = map.get("max_idle_per_origin"))
    upstream.max_idle_per_origin = read_uint(*value, 0);
  if (auto value = map.get("idle_expiry")) upstream.idle_expiry = read_positive_duration(*value);
  if (auto value = map.get("dns_ttl")) upstream.dns_ttl = read_positive_duration(*value);
}

void Loader::read_router(const Located& at, Router& router) const {
  MappingReader map(at, {"window", "latency_buffer", "retries", "backoff", "cooldown", "hedge",
                         "adaptive", "quality", "prompt_classes", "diagnosis"});
  if (auto value = map.get("prompt_classes")) router.prompt_classes = read_bool(*value);
  if (auto value = map.get("diagnosis")) router.diagnosis = read_bool(*value);
  if (auto value = map.get("window")) router.window = read_uint(*value, 1);
  if (auto value = map.get("adaptive")) read_adaptive(*value, router);
  if (auto quality_at = map.get("quality")) {
    MappingReader quality(*quality_at, {"enabled", "min_tokens_per_second"});
    router.quality.enabled = true;
    if (auto value = quality.get("enabled")) router.quality.enabled = read_bool(*value);
    if (auto value = quality.get("min_tokens_per_second")) {
      router.quality.min_tokens_per_second = read_non_negative_double(*value);
    }
  }
  if (auto value = map.get("latency_buffer")) {
    router.latency_buffer = read_non_negative_double(*value);
  }
  if (auto value = map.get("retries")) router.retries = read_uint(*value, 0);

  if (auto backoff_at = map.get("backoff")) {
    MappingReader backoff(*backoff_at, {"base", "max"});
    if (auto value = backoff.get("base")) router.backoff.base = read_positive_duration(*value);
    if (auto value = backoff.get("max")) router.backoff.max = read_positive_duration(*value);
    if (router.backoff.max < router.backoff.base) {
      if (auto max_at = backoff.get("max")) {
        fail(*max_at, "must not be smaller than backoff.base (" +
                          std::to_string(router.backoff.base.count()) + "ms)");
      }
      fail(*backoff.get("base"), "must not exceed backoff.max (" +
                                     std::to_string(router.backoff.max.count()) +
                                     "ms by default); raise max as well");
    }
  }

  if (auto cooldown_at = map.get("cooldown")) {
    MappingReader cooldown(*cooldown_at, {"fails", "within", "for"});
    // Zero failures would cool a deployment down before it ever failed.
    if (auto value = cooldown.get("fails")) router.cooldown.fails = read_uint(*value, 1);
    if (auto value = cooldown.get("within"))
      router.cooldown.within = read_positive_duration(*value);
    if (auto value = cooldown.get("for")) router.cooldown.duration = read_positive_duration(*value);
  }

  if (auto hedge_at = map.get("hedge")) {
    MappingReader hedge(*hedge_at, {"after"});
    if (auto value = hedge.get("after")) {
      std::string text = read_string(*value);
      if (text == "off") {
        router.hedge = Hedge{};
      } else if (text == "p95") {
        router.hedge.mode = Hedge::Mode::p95;
      } else {
        auto after = parse_duration(text);
        if (!after || after->count() == 0) {
          fail(*value, "invalid value '" + text +
                           "' (expected off, p95 or a duration greater than zero such as 500ms)");
        }
        router.hedge.mode = Hedge::Mode::fixed;
        router.hedge.after = *after;
      }
    }
  }
}

void Loader::read_adaptive_deadline(const Located& at, AdaptiveDeadline& deadline) const {
  MappingReader map(at, {"multiplier", "floor", "ceiling"});
  if (auto value = map.get("multiplier")) {
    deadline.multiplier = read_non_negative_double(*value);
    // Below 1 the deadline would cut off answers as slow as the P99 itself.
    if (deadline.multiplier < 1.0) fail(*value, "must be at least 1");
  }
  if (auto value = map.get("floor")) deadline.floor = read_positive_duration(*value);
  if (auto value = map.get("ceiling")) deadline.ceiling = read_positive_duration(*value);
  if (deadline.ceiling < deadline.floor) {
    if (auto value = map.get("ceiling")) {
      fail(*value,
           "must not be smaller than floor (" + std::to_string(deadline.floor.count()) + "ms)");
    }
    fail(*map.get("floor"), "must not exceed ceiling (" + std::to_string(deadline.ceiling.count()) +
                                "ms by default); raise ceiling as well");
  }
}

void Loader::read_adaptive(const Located& at, Router& router) const {
  MappingReader map(at, {"ttft", "idle", "min_samples", "concurrency"});
  if (auto value = map.get("ttft")) read_adaptive_deadline(*value, router.adaptive.ttft);
  if (auto concurrency_at = map.get("concurrency")) {
    auto& concurrency = router.adaptive.concurrency;
    MappingReader reader(*concurrency_at, {"min", "max", "tolerance", "probe_every"});
    if (auto value = reader.get("min")) concurrency.min = read_uint(*value, 1);
    if (auto value = reader.get("max")) concurrency.max = read_uint(*value, 1);
    if (auto value = reader.get("tolerance")) {
      concurrency.tolerance = read_non_negative_double(*value);
      // At 1 or below every round past the baseline would cut the limit.
      if (concurrency.tolerance <= 1.0) fail(*value, "must be greater than 1");
    }
    if (auto value = reader.get("probe_every")) {
      concurrency.probe_every = read_positive_duration(*value);
    }
    if (concurrency.max < concurrency.min) {
      if (auto value = reader.get("max")) {
        fail(*value, "must not be smaller than min (" + std::to_string(concurrency.min) + ")");
      }
      fail(*reader.get("min"), "must not exceed max (" + std::to_string(concurrency.max) +
                                   " by default); raise max as well");
    }
  }
  if (auto value = map.get("idle")) read_adaptive_deadline(*value, router.adaptive.idle);
  if (auto value = map.get("min_samples")) {
    router.adaptive.min_samples = read_uint(*value, 1);
  }
  // The windows keep router.window samples: more could never be reached.
  if (router.adaptive.min_samples > router.window) {
    const auto value = map.get("min_samples");
    const std::string message = "must not exceed router.window (" + std::to_string(router.window) +
                                "), which is all a window keeps";
    if (value) fail(*value, message);
    fail(at, "min_samples defaults to 20, more than router.window (" +
                 std::to_string(router.window) + "); set min_samples or raise window");
  }
}

void Loader::read_log(const Located& at, Log& log) const {
  MappingReader map(at, {"level", "format", "access_log"});
  if (auto value = map.get("level")) {
    std::string level = read_string(*value);
    constexpr std::string_view kLevels[] = {"trace", "debug", "info", "warn", "error", "off"};
    if (std::find(std::begin(kLevels), std::end(kLevels), level) == std::end(kLevels)) {
      fail(*value, "invalid value '" + level + "' (allowed: trace, debug, info, warn, error, off)");
    }
    log.level = level;
  }
  if (auto value = map.get("format")) {
    std::string format = read_string(*value);
    if (format != "json" && format != "text") {
      fail(*value, "invalid value '" + format + "' (allowed: json, text)");
    }
    log.format = format;
  }
  // Whether a path is writable is left to start-up, which opens the file
  // anyway; "" is rejected because it is neither a path nor "off".
  if (auto value = map.get("access_log")) {
    log.access_log = read_string(*value);
    if (log.access_log.empty()) {
      fail(*value, "must not be empty (a file path, stderr or off)");
    }
  }
}

void Loader::read_budgets(const Located& at, Budgets& budgets) const {
  MappingReader map(at, {"gateway", "upstream_ttfb", "total"});
  if (auto value = map.get("gateway")) budgets.gateway = read_positive_duration(*value);
  if (auto value = map.get("upstream_ttfb")) {
    budgets.upstream_ttfb = read_positive_duration(*value);
  }
  if (auto value = map.get("total")) budgets.total = read_positive_duration(*value);
}

void Loader::read_state(const Located& at, State& state) const {
  MappingReader map(at, {"backend", "redis", "on_unavailable", "lease_ttl"});
  if (auto value = map.get("backend")) {
    state.backend = read_enum<State::Backend>(
        *value, {{"local", State::Backend::local}, {"redis", State::Backend::redis}});
  }
  if (auto value = map.get("on_unavailable")) {
    state.on_unavailable = read_enum<State::OnUnavailable>(
        *value, {{"local", State::OnUnavailable::local}, {"deny", State::OnUnavailable::deny}});
  }
  if (auto value = map.get("lease_ttl")) {
    state.lease_ttl = read_positive_duration(*value);
    // Renewed every third of it: shorter, and one slow round trip to Redis
    // would let a live request's permit lapse.
    if (state.lease_ttl < std::chrono::seconds(1)) fail(*value, "must be at least 1s");
  }
  auto redis_at = map.get("redis");
  if (!redis_at) {
    if (state.shared()) fail(join_path(at.path, "redis.url"), "missing required key", at.line);
    return;
  }
  MappingReader redis(*redis_at,
                      {"url", "password", "username", "key_prefix", "timeout", "ca_file"});
  RedisState& into = state.redis;
  if (auto value = redis.get("url")) {
    std::string why;
    if (!parse_redis_url(read_string(*value), into, why)) fail(*value, why);
  } else if (state.shared()) {
    redis.require("url");
  }
  if (auto value = redis.get("password")) {
    if (!into.password.empty()) fail(*value, "the URL gives a password already: give it once");
    into.password = read_non_empty_string(*value);
  }
  if (auto value = redis.get("username")) {
    if (!into.username.empty()) fail(*value, "the URL gives a username already: give it once");
    into.username = read_non_empty_string(*value);
  }
  if (!into.username.empty() && into.password.empty()) {
    fail(join_path(redis_at->path, "username"), "a username needs a password", redis_at->line);
  }
  if (auto value = redis.get("key_prefix")) {
    into.key_prefix = read_string(*value);
    // Braces would break the hash tags every key carries.
    if (into.key_prefix.find_first_of("{} \r\n") != std::string::npos) {
      fail(*value, "must not contain braces, spaces or line breaks");
    }
  }
  if (auto value = redis.get("timeout")) into.timeout = read_positive_duration(*value);
  if (auto value = redis.get("ca_file")) {
    if (into.transport != RedisState::Transport::tls) {
      fail(*value, "a CA file is for a rediss:// URL (TLS) only");
    }
    into.ca_file = read_ca_file(*value);
  }
}

// Shared by the load-time check and require_auth_or_explicit_opt_out, so
// both tell the reader the same two ways out.
constexpr std::string_view kNoKeysMessage =
    "no client API keys configured, and sluice refuses to start without authentication; "
    "add keys under auth.keys, or set auth.disabled: true to run without authentication "
    "on purpose";

// Shortest plaintext key accepted: anything shorter can be guessed by
// simply trying, whatever the rate limits.
constexpr std::size_t kMinKeyLength = 8;

void Loader::read_auth(const Located& at, Auth& auth) {
  MappingReader map(at, {"disabled", "keys"});
  auth.line = at.line;
  if (auto value = map.get("disabled")) auth.disabled = read_bool(*value);
  if (auto keys_at = map.get("keys")) {
    for (const Located& item : sequence_items(*keys_at)) {
      auth.keys.push_back(read_api_key(item));
    }
  }
  // A section that is there but empty is a half-finished edit, never a
  // deliberate choice: only "disabled: true" turns authentication off.
  if (auth.keys.empty() && !auth.disabled) fail(at, std::string(kNoKeysMessage));
}

ApiKey Loader::read_api_key(const Located& at) {
  MappingReader map(at, {"name", "key", "key_sha256", "models", "rpm", "tpm", "max_parallel"});
  if (!at.node.IsMap()) fail(at, std::string("expected a mapping, got ") + type_name(at.node));

  ApiKey key;
  Located name_at = map.require("name");
  key.name = read_non_empty_string(name_at);
  auto [previous_name, name_inserted] = api_key_name_paths_.emplace(key.name, at.path);
  if (!name_inserted) {
    fail(name_at,
         "duplicate key name '" + key.name + "' (already used by " + previous_name->second + ")");
  }

  key.key_sha256 = read_key_digest(map, at);
  auto [previous_key, key_inserted] = api_key_digest_paths_.emplace(key.key_sha256, at.path);
  if (!key_inserted) {
    // The secret itself is never printed; saying which entry shares it is
    // enough to find the copy-paste.
    Located secret_at = map.get("key") ? *map.get("key") : *map.get("key_sha256");
    fail(secret_at, "the same key is already given by " + previous_key->second +
                        "; every entry needs its own secret");
  }

  if (auto value = map.get("models")) key.models = read_model_patterns(*value);
  if (auto value = map.get("rpm")) key.limits.rpm = read_uint(*value, 0);
  if (auto value = map.get("tpm")) {
    key.limits.tpm = read_unsigned(*value, 0, std::numeric_limits<std::uint64_t>::max());
  }
  if (auto value = map.get("max_parallel")) key.limits.max_parallel = read_uint(*value, 0);
  return key;
}

std::array<unsigned char, 32> Loader::read_key_digest(const MappingReader& map,
                                                      const Located& at) const {
  std::optional<Located> plain_at = map.get("key");
  std::optional<Located> digest_at = map.get("key_sha256");
  if (plain_at && digest_at) {
    fail(*digest_at, "give either key or key_sha256, not both");
  }
  if (!plain_at && !digest_at) {
    fail(join_path(at.path, "key"),
         "missing required key: give either key (the secret, usually \"${VAR}\") or key_sha256 "
         "(its SHA-256 in hex)",
         at.line);
  }

  std::array<unsigned char, 32> digest{};
  if (plain_at) {
    std::string secret = read_string(*plain_at);
    // Error messages give lengths and rules, never the secret.
    if (secret.empty()) fail(*plain_at, "must not be empty");
    if (secret.size() < kMinKeyLength) {
      OPENSSL_cleanse(secret.data(), secret.size());
      fail(*plain_at, "too short: keys need at least " + std::to_string(kMinKeyLength) +
                          " characters, got " + std::to_string(secret.size()));
    }
    bool has_control = std::any_of(secret.begin(), secret.end(), [](char c) {
      return std::iscntrl(static_cast<unsigned char>(c)) != 0;
    });
    bool padded = secret.front() == ' ' || secret.back() == ' ';
    if (has_control || padded) {
      OPENSSL_cleanse(secret.data(), secret.size());
      // Clients send the key in a header, which cannot carry control
      // characters and loses surrounding spaces: such a key never matches.
      fail(*plain_at, "must not contain control characters or start or end with a space");
    }
    digest = sha256(secret);
    OPENSSL_cleanse(secret.data(), secret.size());
    return digest;
  }

  std::string hex = read_string(*digest_at);
  if (hex.size() != digest.size() * 2) {
    fail(*digest_at, "expected the SHA-256 as 64 hex digits, got " + std::to_string(hex.size()) +
                         " characters");
  }
  for (std::size_t index = 0; index < digest.size(); ++index) {
    int high = hex_digit_value(hex[2 * index]);
    int low = hex_digit_value(hex[2 * index + 1]);
    if (high < 0 || low < 0) {
      std::size_t position = high < 0 ? 2 * index : 2 * index + 1;
      fail(*digest_at, "expected the SHA-256 as 64 hex digits, found '" +
                           std::string(1, hex[position]) + "' at position " +
                           std::to_string(position + 1));
    }
    digest[index] = static_cast<unsigned char>(high * 16 + low);
  }
  return digest;
}

// Patterns are not checked against the models section: a pattern that
// matches nothing only ever denies, and a key may list a model ahead of it.
std::vector<std::string> Loader::read_model_patterns(const Located& at) const {
  std::vector<Located> items = sequence_items(at);
  if (items.empty()) {
    fail(at, "must list at least one model name or pattern (leave 'models' out to allow all)");
  }
  std::vector<std::string> patterns;
  for (const Located& item : items) {
    std::string pattern = read_non_empty_string(item);
    if (std::find(patterns.begin(), patterns.end(), pattern) != patterns.end()) {
      fail(item, "'" + pattern + "' is listed twice");
    }
    patterns.push_back(std::move(pattern));
  }
  return patterns;
}

void Loader::read_models(const Located& at, Config& config) {
  std::vector<Located> items = sequence_items(at);
  if (items.empty()) fail(at, "must list at least one model");

  for (const Located& item : items) {
    Model model = read_model(item);
    config.model_index.emplace(model.name, config.models.size());
    config.models.push_back(std::move(model));
  }
}

Model Loader::read_model(const Located& at) {
  MappingReader map(at, {"name", "strategy", "fallbacks", "context_window_fallbacks", "deployments",
                         "shaping", "rules", "cache", "default_for"});
  if (!at.node.IsMap()) fail(at, std::string("expected a mapping, got ") + type_name(at.node));

  Model model;
  Located name_at = map.require("name");
  model.name = read_non_empty_string(name_at);
  auto [previous, inserted] = model_name_paths_.emplace(model.name, at.path);
  if (!inserted) {
    fail(name_at,
         "duplicate model name '" + model.name + "' (already defined at " + previous->second + ")");
  }
  if (auto value = map.get("strategy")) {
    model.strategy = read_enum<Strategy>(*value, {{"latency", Strategy::latency},
                                                  {"round_robin", Strategy::round_robin},
                                                  {"weighted", Strategy::weighted},
                                                  {"least_busy", Strategy::least_busy},
                                                  {"priority", Strategy::priority}});
  }
  if (auto value = map.get("fallbacks"))
    model.fallbacks = read_model_references(*value, model.name);
  if (auto value = map.get("context_window_fallbacks")) {
    model.context_window_fallbacks = read_model_references(*value, model.name);
  }
  if (auto value = map.get("cache")) read_cache(*value, model.name, model.cache);
  if (auto value = map.get("default_for")) model.default_for = read_default_for(*value);

  if (auto value = map.get("shaping")) model.shaping = read_shaping(*value);

  auto rules_at = map.get("rules");
  if (rules_at) {
    if (auto deployments_at = map.get("deployments")) {
      fail(*deployments_at, "a model has either deployments or rules, not both");
    }
    // The model a rule picks brings its own strategy and fallbacks.
    for (std::string_view key : {"strategy", "fallbacks", "context_window_fallbacks"}) {
      if (auto value = map.get(key)) {
        fail(*value, "not allowed on a model with rules; set it on the models the rules pick");
      }
    }
    model.rules = read_rules(*rules_at, model.name);
    return model;
  }
  auto deployments_at = map.get("deployments");
  if (!deployments_at) {
    fail(join_path(at.path, "deployments"),
         "missing required key: give deployments, or rules to route to other models", at.line);
  }
  std::vector<Located> items = sequence_items(*deployments_at);
  if (items.empty()) fail(*deployments_at, "must list at least one deployment");
  for (std::size_t index = 0; index < items.size(); ++index) {
    model.deployments.push_back(read_deployment(items[index], model.name, index));
  }
  return model;
}

Shaping Loader::read_shaping(const Located& at) const {
  MappingReader map(at, {"defaults", "caps", "trim_history"});
  Shaping shaping;
  std::optional<Located> default_max_tokens_at;
  if (auto defaults_at = map.get("defaults")) {
    MappingReader defaults(*defaults_at, {"max_tokens", "reasoning_effort"});
    if (auto value = defaults.get("max_tokens")) {
      shaping.defaults.max_tokens =
          read_unsigned(*value, 1, std::numeric_limits<std::uint32_t>::max());
      default_max_tokens_at = value;
    }
    if (auto value = defaults.get("reasoning_effort")) {
      std::string effort = read_string(*value);
      // The values OpenAI-compatible APIs accept; anything else would make
      // every request of the model fail upstream.
      constexpr std::string_view kEfforts[] = {"none", "minimal", "low", "medium", "high", "xhigh"};
      if (std::find(std::begin(kEfforts), std::end(kEfforts), effort) == std::end(kEfforts)) {
        fail(*value,
             "invalid value '" + effort + "' (allowed: none, minimal, low, medium, high, xhigh)");
      }
      shaping.defaults.reasoning_effort = effort;
    }
  }
  if (auto caps_at = map.get("caps")) {
    MappingReader caps(*caps_at, {"max_tokens"});
    if (auto value = caps.get("max_tokens")) {
      shaping.caps.max_tokens = read_unsigned(*value, 1, std::numeric_limits<std::uint32_t>::max());
    }
  }
  if (default_max_tokens_at && shaping.caps.max_tokens &&
      *shaping.defaults.max_tokens > *shaping.caps.max_tokens) {
    fail(*default_max_tokens_at,
         "must not exceed caps.max_tokens (" + std::to_string(*shaping.caps.max_tokens) + ")");
  }
  if (auto value = map.get("trim_history")) shaping.trim_history = read_trim_history(*value);
  return shaping;
}

TrimHistory Loader::read_trim_history(const Located& at) const {
  MappingReader map(at, {"max_messages", "max_prompt_tokens", "keep_system"});
  if (!at.node.IsMap()) fail(at, std::string("expected a mapping, got ") + type_name(at.node));
  TrimHistory trim;
  if (auto value = map.get("max_messages")) trim.max_messages = read_uint(*value, 1);
  if (auto value = map.get("max_prompt_tokens")) {
    trim.max_prompt_tokens = read_unsigned(*value, 1, std::numeric_limits<std::uint64_t>::max());
  }
  if (auto value = map.get("keep_system")) trim.keep_system = read_bool(*value);
  if (trim.max_messages == 0 && trim.max_prompt_tokens == 0) {
    fail(at, "set max_messages, max_prompt_tokens or both");
  }
  return trim;
}

std::vector<Rule> Loader::read_rules(const Located& at, const std::string& owner) {
  std::vector<Located> items = sequence_items(at);
  if (items.empty()) fail(at, "must list at least one rule");
  std::vector<Rule> rules;
  for (std::size_t index = 0; index < items.size(); ++index) {
    const Located& item = items[index];
    MappingReader map(item, {"when", "model"});
    if (!item.node.IsMap()) {
      fail(item, std::string("expected a mapping, got ") + type_name(item.node));
    }
    Located model_at = map.require("model");
    // Built with its name rather than assigned one: GCC 12 took the
    // assignment for a read past the end of a short string (a false
    // -Wstringop-overread in link-time optimised builds).
    Rule rule{.when = std::nullopt, .model = read_non_empty_string(model_at)};
    rule_targets_.push_back({rule.model, owner, model_at});
    if (auto when_at = map.get("when")) {
      rule.when = read_rule_condition(*when_at);
    } else if (index + 1 < items.size()) {
      // A rule without conditions matches everything: the ones after it
      // could never be reached.
      fail(item, "only the last rule may leave out 'when' (rules after it would never match)");
    }
    rules.push_back(std::move(rule));
  }
  return rules;
}

RuleCondition Loader::read_rule_condition(const Located& at) const {
  MappingReader map(at, {"prompt_tokens_below", "no_tools", "contains_any"});
  if (!at.node.IsMap()) fail(at, std::string("expected a mapping, got ") + type_name(at.node));
  RuleCondition condition;
  bool any = false;
  if (auto value = map.get("prompt_tokens_below")) {
    condition.prompt_tokens_below =
        read_unsigned(*value, 1, std::numeric_limits<std::uint64_t>::max());
    any = true;
  }
  if (auto value = map.get("no_tools")) {
    condition.no_tools = read_bool(*value);
    any = true;
  }
  if (auto value = map.get("contains_any")) {
    std::vector<Located> items = sequence_items(*value);
    if (items.empty()) fail(*value, "must list at least one phrase");
    for (const Located& item : items) {
      condition.contains_any.push_back(lower_ascii(read_non_empty_string(item)));
    }
    any = true;
  }
  if (!any) fail(at, "set at least one condition (leave 'when' out for a rule that matches all)");
  return condition;
}

std::vector<std::string> Loader::read_model_references(const Located& at,
                                                       const std::string& owner) {
  std::vector<std::string> names;
  for (const Located& item : sequence_items(at)) {
    std::string name = read_non_empty_string(item);
    if (std::find(names.begin(), names.end(), name) != names.end()) {
      fail(item, "model '" + name + "' is listed twice");
    }
    names.push_back(name);
    model_references_.push_back({name, owner, item});
  }
  return names;
}

std::vector<std::string> Loader::read_default_for(const Located& at) {
  std::vector<std::string> endpoints;
  for (const Located& item : sequence_items(at)) {
    const std::string path = read_non_empty_string(item);
    const auto endpoint = proxied_endpoint(path);
    if (!endpoint) {
      fail(item, "'" + path + "' is not an endpoint sluice proxies (" +
                     join_names(kProxiedEndpoints, "/v1") + ")");
    }
    auto [previous, inserted] = default_for_paths_.emplace(*endpoint, item.path);
    if (!inserted) {
      fail(item, "'" + path + "' already has a default model (at " + previous->second + ")");
    }
    endpoints.emplace_back(*endpoint);
  }
  return endpoints;
}

void Loader::read_cache(const Located& at, const std::string& owner, Cache& cache) {
  MappingReader map(at, {"mode", "ttl", "max_entries", "semantic"});
  if (auto value = map.get("mode")) {
    cache.mode = read_enum<Cache::Mode>(*value, {{"off", Cache::Mode::off},
                                                 {"exact", Cache::Mode::exact},
                                                 {"semantic", Cache::Mode::semantic}});
  }
  if (auto value = map.get("ttl")) cache.ttl = read_positive_duration(*value);
  if (auto value = map.get("max_entries")) cache.max_entries = read_size(*value, 1);
  auto semantic_at = map.get("semantic");
  if (semantic_at) {
    MappingReader semantic(*semantic_at, {"embedding_model", "threshold"});
    if (auto value = semantic.get("embedding_model")) {
      cache.embedding_model = read_non_empty_string(*value);
      embedding_references_.push_back({cache.embedding_model, owner, *value});
    }
    if (auto value = semantic.get("threshold")) {
      cache.threshold = read_non_negative_double(*value);
      if (cache.threshold <= 0 || cache.threshold > 1) {
        fail(*value, "out of range: a cosine similarity greater than 0 and at most 1");
      }
    }
  }
  if (cache.mode == Cache::Mode::semantic && cache.embedding_model.empty()) {
    fail(join_path(join_path(at.path, "semantic"), "embedding_model"),
         "missing required key: semantic mode needs the model that embeds the last user message",
         semantic_at ? semantic_at->line : map.get("mode")->line);
  }
}

void Loader::check_model_references(const Config& config,
                                    const std::vector<ModelReference>& references,
                                    std::string_view self_use) const {
  for (const auto& reference : references) {
    if (reference.name == reference.owner) {
      fail(reference.at, "model '" + reference.name + "' cannot " + std::string(self_use));
    }
    const Model* target = config.find_model(reference.name);
    if (!target) {
      fail(reference.at, "unknown model '" + reference.name + "' (not defined under models)");
    }
    if (!target->rules.empty()) {
      fail(reference.at,
           "model '" + reference.name + "' routes by rules and has no deployments to fall back to");
    }
  }
  for (const auto& reference : rule_targets_) {
    const Model* target = config.find_model(reference.name);
    if (!target) {
      fail(reference.at, "unknown model '" + reference.name + "' (not defined under models)");
    }
    // One level only: a rule's pick is served by its deployments, so
    // routing can never loop.
    if (!target->rules.empty()) {
      fail(reference.at, "model '" + reference.name +
                             "' routes by rules itself; a rule must pick a model with deployments");
    }
  }
}

Deployment Loader::read_deployment(const Located& at, const std::string& model_name,
                                   std::size_t deployment_index) {
  MappingReader map(at, {"id", "base_url", "api_key", "model", "headers", "timeouts", "tls_verify",
                         "ca_file", "weight", "max_parallel", "rpm", "warm_connections", "provider",
                         "anthropic_version", "api_version", "http2"});
  if (!at.node.IsMap()) fail(at, std::string("expected a mapping, got ") + type_name(at.node));

  Deployment deployment;
  Located id_at = at;
  if (auto value = map.get("id")) {
    id_at = *value;
    deployment.id = read_non_empty_string(*value);
  } else {
    deployment.id = model_name + "-" + std::to_string(deployment_index);
  }
  auto [previous, inserted] = deployment_id_paths_.emplace(deployment.id, at.path);
  if (!inserted) {
    fail(join_path(at.path, "id"),
         "duplicate deployment id '" + deployment.id + "' (already used by " + previous->second +
             ")",
         id_at.line);
  }

  Located url_at = map.require("base_url");
  std::string why;
  auto url = parse_url(read_string(url_at), why);
  if (!url) fail(url_at, "invalid URL: " + why);
  deployment.base_url = *std::move(url);

  if (auto value = map.get("api_key")) {
    deployment.api_key = read_string(*value);
    // The key ends up in a request header; a stray newline would split it.
    if (deployment.api_key.find_first_of("\r\n") != std::string::npos) {
      fail(*value, "must not contain line breaks");
    }
  }
  deployment.upstream_model = model_name;
  if (auto value = map.get("model")) deployment.upstream_model = read_non_empty_string(*value);
  if (auto value = map.get("headers")) read_headers(*value, deployment);
  if (auto value = map.get("timeouts")) read_timeouts(*value, deployment.timeouts);
  if (auto value = map.get("tls_verify")) deployment.tls_verify = read_bool(*value);
  if (auto value = map.get("ca_file")) deployment.ca_file = read_ca_file(*value);
  if (auto value = map.get("weight")) deployment.weight = read_uint(*value, 1);
  if (auto value = map.get("max_parallel")) {
    if (value->node.IsScalar() && value->node.Scalar() == "auto") {
      deployment.max_parallel_auto = true;
    } else {
      deployment.max_parallel = read_uint(*value, 0);
    }
  }
  if (auto value = map.get("rpm")) deployment.rpm = read_uint(*value, 0);
  // More than this per thread is a typo, not a pool.
  if (auto value = map.get("warm_connections")) {
    deployment.warm_connections = read_uint(*value, 0, 1024);
  }
  // Which providers exist is known only above this stage (protocol/): the
  // name is checked there, at start-up, reload and --check-config, against
  // the place recorded here.
  deployment.provider_at =
      join_path(at.path, "provider") + " (line " + std::to_string(at.line) + ")";
  if (auto value = map.get("provider")) {
    deployment.provider = read_non_empty_string(*value);
    deployment.provider_at = value->path + " (line " + std::to_string(value->line) + ")";
  }
  if (auto value = map.get("anthropic_version")) {
    if (deployment.provider != "anthropic") {
      fail(*value, "is accepted only with provider: anthropic");
    }
    deployment.anthropic_version = read_non_empty_string(*value);
    // The version ends up in a request header; a stray newline would split it.
    if (deployment.anthropic_version.find_first_of("\r\n") != std::string::npos) {
      fail(*value, "must not contain line breaks");
    }
  }
  read_api_version(at, map, deployment);
  deployment.http2 = default_http2_;
  if (auto value = map.get("http2")) deployment.http2 = read_http2_mode(*value);
  return deployment;
}

// Azure OpenAI names the API version in every request's query; no other
// provider reads it, so one given elsewhere is a mistake worth saying.
void Loader::read_api_version(const Located& at, const MappingReader& map,
                              Deployment& deployment) const {
  const bool azure = deployment.provider == "azure";
  auto value = map.get("api_version");
  if (!value) {
    if (azure) {
      fail(join_path(at.path, "api_version"),
           "missing required key (provider: azure needs the API version its requests name, "
           "e.g. api_version: 2024-10-21)",
           at.line);
    }
    return;
  }
  if (!azure) {
    fail(*value,
         "only for provider: azure (this deployment's provider is '" + deployment.provider + "')");
  }
  deployment.api_version = read_non_empty_string(*value);
  // It is written into the request line as it is.
  const auto allowed = [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '.' || c == '_';
  };
  if (!std::all_of(deployment.api_version.begin(), deployment.api_version.end(), allowed)) {
    fail(*value, "invalid API version '" + deployment.api_version +
                     "' (letters, digits, '-', '.' and '_' only, e.g. 2024-10-21)");
  }
}

void Loader::read_timeouts(const Located& at, Timeouts& timeouts) const {
  MappingReader map(at, {"connect", "ttft", "idle", "total"});
  if (auto value = map.get("connect")) timeouts.connect = read_positive_duration(*value);
  // `auto` keeps the static default, which serves until there are samples.
  const auto read_or_auto = [&](const Located& value, Duration& duration, bool& automatic) {
    if (value.node.IsScalar() && value.node.Scalar() == "auto") {
      automatic = true;
      return;
    }
    duration = read_positive_duration(value);
  };
  if (auto value = map.get("ttft")) read_or_auto(*value, timeouts.ttft, timeouts.ttft_auto);
  if (auto value = map.get("idle")) read_or_auto(*value, timeouts.idle, timeouts.idle_auto);
  if (auto value = map.get("total")) timeouts.total = read_positive_duration(*value);
}

bool is_header_token_char(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) ||
         std::string_view("!#$%&'*+-.^_`|~").find(c) != std::string_view::npos;
}

void Loader::read_headers(const Located& at, Deployment& deployment) const {
  if (!at.node.IsMap()) fail(at, std::string("expected a mapping, got ") + type_name(at.node));
  std::map<std::string, int> first_line_of_name;  // lower-cased: names are case-insensitive
  for (auto it = at.node.begin(); it != at.node.end(); ++it) {
    int key_line = line_of(it->first, at.line);
    Located key_at{it->first, at.path, key_line};
    std::string name = read_string(key_at);
    std::string path = join_path(at.path, name);
    key_at.path = path;
    if (name.empty() || !std::all_of(name.begin(), name.end(), is_header_token_char)) {
      fail(key_at, "invalid header name '" + name + "'");
    }
    std::string lowered = lower_ascii(name);
    // These describe the connection or the body framing, which the gateway
    // owns; overriding them would corrupt the upstream request.
    for (std::string_view managed : {"host", "content-length", "transfer-encoding", "connection"}) {
      if (lowered == managed) fail(key_at, "header '" + name + "' is set by the gateway");
    }
    auto [previous, inserted] = first_line_of_name.emplace(lowered, key_line);
    if (!inserted) {
      fail(key_at, "duplicate header '" + name + "' (first given at line " +
                       std::to_string(previous->second) + ")");
    }
    YAML::Node value_node = it->second;
    Located value_at{value_node, path,
                     value_node.IsNull() ? key_line : line_of(value_node, key_line)};
    std::string value = value_node.IsNull() ? std::string{} : read_string(value_at);
    if (value.find_first_of(std::string_view("\r\n\0", 3)) != std::string::npos) {
      fail(value_at, "header value must not contain line breaks or NUL");
    }
    deployment.headers.emplace_back(std::move(name), std::move(value));
  }
}

std::string Loader::read_ca_file(const Located& at) const {
  std::string path = read_string(at);
  if (path.empty()) return path;  // explicit "" = system store only
  // Checked now rather than at the first TLS handshake, which could be
  // hours later and only for the one deployment.
  return read_file_path(at, "CA file");
}

std::string Loader::read_file_path(const Located& at, const std::string& noun) const {
  std::string path = read_string(at);
  if (path.empty()) fail(at, "must name a file");
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) fail(at, noun + " '" + path + "' does not exist");
  if (!std::filesystem::is_regular_file(path, ec)) {
    fail(at, noun + " '" + path + "' is not a regular file");
  }
  std::ifstream file(path);
  if (!file) fail(at, noun + " '" + path + "' cannot be read");
  return path;
}

namespace {

using Bio = std::unique_ptr<BIO, decltype(&BIO_free)>;
using X509Ptr = std::unique_ptr<X509, decltype(&X509_free)>;
using KeyPtr = std::unique_ptr<EVP_PKEY, decltype(&EVP_PKEY_free)>;

// The first certificate of a PEM file; null when it holds none.
X509Ptr first_certificate(const std::string& path) {
  Bio bio(BIO_new_file(path.c_str(), "r"), BIO_free);
  if (!bio) return {nullptr, X509_free};
  return {PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr), X509_free};
}

}  // namespace

void Loader::read_listener_tls(const Located& at, ListenerTls& tls) const {
  // A failed read leaves errors queued on this thread, where a later TLS
  // operation of this thread would find them and fail.
  struct ClearErrors {
    ~ClearErrors() { ERR_clear_error(); }
  } clear_errors;
  MappingReader map(at, {"cert", "key", "client_ca"});
  // Everything a handshake will need is read now: a listener that starts,
  // or a reload that is accepted, must not fail its first client instead.
  const Located cert_at = map.require("cert");
  const Located key_at = map.require("key");
  tls.cert = read_file_path(cert_at, "certificate file");
  tls.key = read_file_path(key_at, "key file");
  auto cert = first_certificate(tls.cert);
  if (!cert) fail(cert_at, "'" + tls.cert + "' holds no PEM certificate");
  KeyPtr key(nullptr, EVP_PKEY_free);
  if (Bio bio(BIO_new_file(tls.key.c_str(), "r"), BIO_free); bio) {
    // An empty passphrase callback: an encrypted key fails here rather than
    // prompting on the terminal.
    key.reset(PEM_read_bio_PrivateKey(
        bio.get(), nullptr, [](char*, int, int, void*) { return 0; }, nullptr));
  }
  if (!key) fail(key_at, "'" + tls.key + "' holds no unencrypted PEM private key");
  if (X509_check_private_key(cert.get(), key.get()) != 1) {
    fail(key_at, "the key in '" + tls.key + "' does not match the certificate in '" + tls.cert +
                     "' (" + cert_at.path + ")");
  }
  if (auto value = map.get("client_ca")) {
    tls.client_ca = read_file_path(*value, "CA file");
    if (!first_certificate(tls.client_ca)) {
      fail(*value, "'" + tls.client_ca + "' holds no PEM certificate");
    }
  }
}

Config Loader::load(const Located& root) {
  if (root.node.IsNull()) fail(root, "the document is empty; at least 'models' is required");
  MappingReader map(root,
                    {"server", "upstream", "router", "log", "models", "auth", "budgets", "state"});

  Config config;
  if (auto value = map.get("server")) {
    read_server(*value, config.server);
  } else {
    read_server(Located{YAML::Node(), "server", root.line}, config.server);
  }
  if (auto value = map.get("upstream")) read_upstream(*value, config.upstream);
  default_http2_ = config.upstream.http2;
  if (auto value = map.get("router")) read_router(*value, config.router);
  if (auto value = map.get("log")) read_log(*value, config.log);
  if (auto value = map.get("budgets")) read_budgets(*value, config.budgets);
  if (auto value = map.get("state")) read_state(*value, config.state);
  if (auto value = map.get("auth")) {
    // A block mapping's value starts on the line after "auth:"; errors about
    // the section as a whole read better pointing at the key itself.
    Located auth_at = *value;
    auth_at.line = line_of_key(root, "auth");
    read_auth(auth_at, config.auth);
  }
  read_models(map.require("models"), config);
  check_model_references(config, model_references_, "fall back to itself");
  check_model_references(config, embedding_references_, "embed its own requests");
  return config;
}

// Reads through the documents of a YAML stream without building them, to
// tell how many there are and where the second one starts.
class DocumentCounter : public YAML::EventHandler {
 public:
  int documents = 0;
  YAML::Mark first_start;
  YAML::Mark second_start;
  std::optional<YAML::Mark> second_root;  // where the second document's content begins

  void OnDocumentStart(const YAML::Mark& mark) override {
    ++documents;
    (documents == 1 ? first_start : second_start) = mark;
  }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark& mark, YAML::anchor_t) override { node(mark); }
  void OnAlias(const YAML::Mark& mark, YAML::anchor_t) override { node(mark); }
  void OnScalar(const YAML::Mark& mark, const std::string&, YAML::anchor_t,
                const std::string&) override {
    node(mark);
  }
  void OnSequenceStart(const YAML::Mark& mark, const std::string&, YAML::anchor_t,
                       YAML::EmitterStyle::value) override {
    node(mark);
  }
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark& mark, const std::string&, YAML::anchor_t,
                  YAML::EmitterStyle::value) override {
    node(mark);
  }
  void OnMapEnd() override {}

 private:
  void node(const YAML::Mark& mark) {
    if (documents == 2 && !second_root) second_root = mark;
  }
};

ConfigPtr load_text(const std::string& text, EnvLookup env, const std::string& source) {
  // Not YAML::LoadAll: yaml-cpp 0.7 loops forever in it, allocating, on some
  // malformed input (a stray ',' before a flow end) because the parser keeps
  // reporting the same empty document without consuming anything. Count
  // documents first, stopping at the second, then load the first alone.
  DocumentCounter counter;
  YAML::Node document;
  try {
    std::istringstream stream(text);
    YAML::Parser parser(stream);
    while (counter.documents < 2 && parser.HandleNextDocument(counter)) {
    }
    if (counter.documents == 2 && counter.second_start.pos == counter.first_start.pos) {
      fail(source, "invalid YAML: cannot parse past this point",
           counter.first_start.is_null() ? 1 : counter.first_start.line + 1);
    }
    if (counter.documents == 1) document = YAML::Load(text);
  } catch (const YAML::Exception& error) {
    fail(source, "invalid YAML: " + error.msg, error.mark.is_null() ? 1 : error.mark.line + 1);
  }
  if (counter.documents == 0) {
    fail("(root)", "the document is empty; at least 'models' is required", 1);
  }
  if (counter.documents > 1) {
    const YAML::Mark at = counter.second_root.value_or(counter.second_start);
    fail("(root)", "expected a single YAML document, found a second one",
         at.is_null() ? 1 : at.line + 1);
  }

  Loader loader(std::move(env));
  Located root{document, "", line_of(document, 1)};
  try {
    return std::make_shared<const Config>(loader.load(root));
  } catch (const YAML::Exception& error) {
    // Only reachable through a yaml-cpp corner case; still report it in the
    // usual shape instead of leaking a foreign exception type.
    fail("(root)", error.msg, error.mark.is_null() ? 1 : error.mark.line + 1);
  }
}

}  // namespace

std::optional<std::string> process_env(const std::string& name) {
  const char* value = std::getenv(name.c_str());
  if (value == nullptr) return std::nullopt;
  return std::string(value);
}

ConfigPtr load_file(const std::string& path, EnvLookup env) {
  // A directory opens fine as a stream on Linux and then reads as empty,
  // which would surface as a baffling "document is empty".
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) throw ConfigError(path + ": cannot read file");
  std::ifstream file(path, std::ios::binary);
  if (!file) throw ConfigError(path + ": cannot read file");
  std::string contents{std::istreambuf_iterator<char>(file), std::istreambuf_iterator<char>()};
  if (file.bad()) throw ConfigError(path + ": cannot read file");
  return load_text(contents, std::move(env), path);
}

ConfigPtr load_string(const std::string& yaml_text, EnvLookup env) {
  return load_text(yaml_text, std::move(env), "(root)");
}

void require_auth_or_explicit_opt_out(const Config& config) {
  const Auth& auth = config.auth;
  if (auth.disabled || !auth.keys.empty()) return;
  // line 0 = no auth section: the whole document is what lacks it.
  if (auth.line == 0) fail("(root)", std::string(kNoKeysMessage), 1);
  fail("auth", std::string(kNoKeysMessage), auth.line);
}

std::vector<std::string> start_only_changes(const Config& running, const Config& loaded) {
  std::vector<std::string> changed;
  const auto note = [&](bool differs, const char* path) {
    if (differs) changed.emplace_back(path);
  };
  const auto& was = running.server;
  const auto& now = loaded.server;
  note(was.listen_host != now.listen_host || was.listen_port != now.listen_port, "server.listen");
  note(was.threads != now.threads, "server.threads");
  note(was.busy_poll != now.busy_poll, "server.busy_poll_us");
  note(was.memory_release_after != now.memory_release_after, "server.memory_release_after");
  note(was.admin_enabled != now.admin_enabled ||
           (now.admin_enabled &&
            (was.admin_host != now.admin_host || was.admin_port != now.admin_port)),
       "server.admin_listen");
  note(running.upstream.max_idle_per_origin != loaded.upstream.max_idle_per_origin,
       "upstream.max_idle_per_origin");
  note(running.upstream.idle_expiry != loaded.upstream.idle_expiry, "upstream.idle_expiry");
  note(running.upstream.dns_ttl != loaded.upstream.dns_ttl, "upstream.dns_ttl");
  note(running.log.format != loaded.log.format, "log.format");
  note(running.log.access_log != loaded.log.access_log, "log.access_log");
  note(running.state != loaded.state, "state");
  return changed;
}

}  // namespace sluice::config
