#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace sluice::config {

using Duration = std::chrono::milliseconds;

// Thrown only while loading; the message always starts with the YAML path
// ("models[0].deployments[1].base_url: ...") and ends with the line number.
class ConfigError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct Url {
  std::string scheme;       // "http" or "https"
  std::string host;         // no brackets for IPv6
  std::uint16_t port = 0;   // defaulted from the scheme when absent
  std::string path_prefix;  // "" or "/v1" (never a trailing slash)
  bool tls() const { return scheme == "https"; }
};

struct Timeouts {
  Duration connect{2000};
  Duration ttft{10000};  // request sent -> first response byte
  Duration idle{30000};  // gap between two body reads
  Duration total{600000};
  // `auto`: the deadline follows the deployment's measured latency
  // (router.adaptive); ttft and idle above stay the key's static default,
  // which applies until there are enough samples.
  bool ttft_auto = false;
  bool idle_auto = false;
  bool adaptive() const { return ttft_auto || idle_auto; }
};

// How requests to an upstream may use HTTP/2 (`upstream.http2`, a
// deployment's `http2`): auto offers h2 and http/1.1 by ALPN on https and
// speaks HTTP/1.1 on http://; prior_knowledge speaks h2c from the first byte
// on http:// (and h2 by ALPN on https); off is HTTP/1.1 only.
enum class Http2Mode { automatic, off, prior_knowledge };

struct Deployment {
  std::string id;  // unique across the whole config
  Url base_url;
  std::string api_key;         // resolved from the environment; may be empty
  std::string upstream_model;  // the name sent upstream
  std::vector<std::pair<std::string, std::string>> headers;
  Timeouts timeouts;
  bool tls_verify = true;
  std::string ca_file;  // extra trust anchors (PEM); "" = system store only
  unsigned weight = 1;
  unsigned max_parallel = 0;  // 0 = unlimited
  // `max_parallel: auto`: the cap follows router.adaptive.concurrency.
  bool max_parallel_auto = false;
  unsigned rpm = 0;  // 0 = unlimited
  // Idle connections each event-loop thread keeps open to this deployment,
  // so a first request pays no TCP/TLS handshake; 0 = none.
  unsigned warm_connections = 1;
  // The wire protocol the upstream speaks, by the name its adapter is
  // registered under (protocol/adapters.cpp); "openai" passes requests and
  // answers through as they are.
  std::string provider = "openai";
  std::string provider_at;  // "models[0].deployments[1].provider (line 12)", for errors
  // The anthropic-version header (provider anthropic only); "" = the
  // adapter's default.
  std::string anthropic_version;
  // Azure OpenAI's `api-version` query parameter ("2024-10-21"); set only,
  // and always, with `provider: azure`.
  std::string api_version;
  // Its own `http2`, or upstream.http2 when it has none.
  Http2Mode http2 = Http2Mode::automatic;
};

enum class Strategy { latency, round_robin, weighted, least_busy, priority };

// Request shaping: changes sluice makes to a request body before it goes
// upstream, each one off unless set. Applied only to what the client left
// out (defaults) or asked too much of (caps).
struct ShapingDefaults {
  std::optional<std::uint64_t> max_tokens;
  std::optional<std::string> reasoning_effort;
};

struct ShapingCaps {
  std::optional<std::uint64_t> max_tokens;
};

// Limits on the conversation history; 0 means no limit of that kind (at
// least one is set).
struct TrimHistory {
  unsigned max_messages = 0;
  std::uint64_t max_prompt_tokens = 0;
  bool keep_system = true;  // system and developer messages are never dropped
};

struct Shaping {
  ShapingDefaults defaults;
  ShapingCaps caps;
  std::optional<TrimHistory> trim_history;
};

// Every condition that is set must hold.
struct RuleCondition {
  std::optional<std::uint64_t> prompt_tokens_below;
  std::optional<bool> no_tools;           // true: no tools offered; false: some offered
  std::vector<std::string> contains_any;  // lower-cased; empty = no such condition
};

struct Rule {
  std::optional<RuleCondition> when;  // nullopt: matches every request
  std::string model;                  // a model with deployments
};

// Response cache of one model. Off unless the model's config turns it on.
struct Cache {
  enum class Mode { off, exact, semantic } mode = Mode::off;
  Duration ttl{600000};
  std::size_t max_entries = 10000;
  // Semantic mode only: the model (of this config) that embeds the last user
  // message, and the cosine similarity at or above which an entry matches.
  std::string embedding_model;
  double threshold = 0.95;

  bool operator==(const Cache&) const = default;
};

struct Model {
  std::string name;
  Strategy strategy = Strategy::latency;
  std::vector<std::string> fallbacks;
  std::vector<std::string> context_window_fallbacks;
  std::vector<Deployment> deployments;  // empty exactly when `rules` is not
  std::optional<Shaping> shaping;
  // A routing model: dispatches each request to the first matching rule's
  // model instead of having deployments of its own.
  std::vector<Rule> rules;
  Cache cache;
  // Endpoints ("/moderations", as they follow /v1) whose requests that name
  // no model this model serves.
  std::vector<std::string> default_for;
};

// TLS on a listener (server.tls, server.admin_tls). Off while `cert` is "".
// The files are checked at load; the gateway reads them again into each
// snapshot it builds, so a reload picks up rotated files.
struct ListenerTls {
  std::string cert;       // PEM chain, the server's certificate first
  std::string key;        // PEM private key matching `cert`
  std::string client_ca;  // PEM CAs a client certificate must chain to; "" = none asked for
  bool enabled() const { return !cert.empty(); }
  bool operator==(const ListenerTls&) const = default;
};

struct Server {
  std::string listen_host = "0.0.0.0";
  std::uint16_t listen_port = 8080;
  unsigned threads = 0;  // 0 = one per core
  // How long an idle worker keeps polling for events before it sleeps; 0 =
  // it sleeps at once (see server/event_loop.hpp).
  std::chrono::microseconds busy_poll{0};
  std::size_t max_body_bytes = 8 * 1024 * 1024;
  std::size_t max_header_bytes = 16 * 1024;
  Duration header_timeout{10000};
  Duration body_timeout{30000};
  Duration keepalive_timeout{75000};
  // How long each write of an answer may wait for the client to take it: a
  // client that stops reading frees its connection and the upstream's after
  // this, whatever the deployment's own timeouts allow.
  Duration write_timeout{30000};
  unsigned max_connections = 10000;
  // Separate listener for /metrics and /admin/*, kept off the client port so
  // operational endpoints need not be exposed wherever clients can reach.
  bool admin_enabled = true;  // false when admin_listen is "off"
  std::string admin_host = "127.0.0.1";
  std::uint16_t admin_port = 9090;
  std::string admin_key;          // bearer key required on the admin listener; "" = none
  ListenerTls tls;                // on the client listener
  ListenerTls admin_tls;          // on the admin listener
  Duration drain_timeout{30000};  // how long in-flight requests may finish on shutdown
  // Memory a burst freed is kept this long for the next one, and given back
  // once a worker has been quiet this long: faulting it in again costs each
  // stream of a burst several page faults.
  Duration memory_release_after{60000};
};

struct Upstream {
  unsigned max_idle_per_origin = 1024;  // per event-loop thread
  Duration idle_expiry{60000};          // pooled connections unused this long are closed
  Duration dns_ttl{30000};
  Http2Mode http2 = Http2Mode::automatic;
  // An HTTP/2 connection that has received nothing for http2_ping_after is
  // sent a PING; no answer within http2_ping_timeout closes it.
  Duration http2_ping_after{30000};
  Duration http2_ping_timeout{5000};
};

struct Backoff {
  Duration base{100};
  Duration max{4000};
};

struct Cooldown {
  unsigned fails = 3;
  Duration within{60000};
  Duration duration{30000};  // YAML key "for"
};

struct Hedge {
  enum class Mode { off, p95, fixed } mode = Mode::off;
  Duration after{0};  // only for Mode::fixed
};

// clamp(multiplier x P99 of the recent samples, floor, ceiling).
struct AdaptiveDeadline {
  double multiplier;
  Duration floor;
  Duration ceiling;
};

// `max_parallel: auto`: a gradient limit on TTFT.
struct AdaptiveConcurrency {
  unsigned min = 1;
  unsigned max = 512;
  double tolerance = 1.5;       // TTFT past tolerance x baseline cuts the limit
  Duration probe_every{60000};  // how often the baseline is measured again
};

struct Adaptive {
  AdaptiveDeadline ttft{2.0, Duration{500}, Duration{60000}};
  AdaptiveDeadline idle{3.0, Duration{1000}, Duration{120000}};
  unsigned min_samples = 20;  // below this the key's static default applies
  AdaptiveConcurrency concurrency;
};

// Answers that count as failures of their deployment though they came with
// a 2xx: off unless `router.quality` turns it on.
struct Quality {
  bool enabled = false;
  double min_tokens_per_second = 0;  // slow_tokens; 0 = not checked
};

struct Router {
  unsigned window = 20;
  double latency_buffer = 0.10;
  unsigned retries = 2;
  Backoff backoff;
  Cooldown cooldown;
  Hedge hedge;
  Adaptive adaptive;
  Quality quality;
  // TTFT windows per prompt-size class (estimated input tokens < 1k, 1k-8k,
  // 8k-32k, >= 32k): latency routing, `ttft: auto` and `hedge.after: p95`
  // compare requests of like size.
  bool prompt_classes = false;
  // Keeps what `sluice doctor --from` reads on /admin/diagnosis: first-byte
  // times by the requests in flight, and new connections' connect and TLS
  // times.
  bool diagnosis = false;
};

struct Log {
  std::string level = "info";         // trace|debug|info|warn|error|off
  std::string format = "json";        // access log: json|text
  std::string access_log = "stderr";  // a file path, "stderr" or "off"
};

// Optional per-stage latency targets; nullopt means no budget for that
// stage, so nothing is measured against it.
struct Budgets {
  std::optional<Duration> gateway;        // time spent inside sluice itself
  std::optional<Duration> upstream_ttfb;  // request sent -> first upstream byte
  std::optional<Duration> total;
};

// What one client key may spend; 0 means unlimited for each.
struct ApiKeyLimits {
  std::uint64_t rpm = 0;      // requests per minute
  std::uint64_t tpm = 0;      // tokens per minute, prompt + completion
  unsigned max_parallel = 0;  // requests in flight

  bool operator==(const ApiKeyLimits&) const = default;
};

// A key clients present to sluice. Only the SHA-256 of the secret is kept:
// a plaintext `key` is hashed at load, so the secret itself never sits in a
// Config snapshot (or in a core dump of one).
struct ApiKey {
  std::string name;  // unique; what logs and metrics show, never the secret
  std::array<unsigned char, 32> key_sha256{};
  std::vector<std::string> models;  // public model names, globs with * and ?; empty = all
  ApiKeyLimits limits;
};

struct Auth {
  bool disabled = false;  // only ever true when the file says so
  std::vector<ApiKey> keys;
  // Line of the "auth:" key, 0 when the file has no auth section; lets a
  // later check point at the right place.
  int line = 0;

  // A config without an auth section loads with authentication off, which
  // is why the binary must also call require_auth_or_explicit_opt_out().
  bool enabled() const { return !disabled && !keys.empty(); }
};

// Where limits, cooldowns and the exact cache live (YAML `state`). Taken at
// start: a reload keeps the running backend.
struct RedisState {
  enum class Transport { tcp, tls, unix_socket };
  std::string url;  // as written, for messages; never holds the password
  Transport transport = Transport::tcp;
  std::string host = "127.0.0.1";
  std::uint16_t port = 6379;
  std::string socket_path;  // unix_socket only
  unsigned database = 0;
  std::string username;  // ACL user; "" = the default user
  std::string password;  // "" = no AUTH
  std::string key_prefix = "sluice:";
  Duration timeout{50};  // per operation
  // rediss:// only: extra trust anchors (PEM) beside the system store; the
  // server's certificate is verified, and its name, as an upstream's are.
  std::string ca_file;

  bool operator==(const RedisState&) const = default;
};

struct State {
  enum class Backend { local, redis };
  // What a request gets while Redis does not answer: the instance's own
  // limits, or 503 overloaded.
  enum class OnUnavailable { local, deny };
  Backend backend = Backend::local;
  RedisState redis;
  OnUnavailable on_unavailable = OnUnavailable::local;
  // How long a max_parallel permit outlives its holder's last renewal
  // (renewed every third of it): how long a crashed instance's requests
  // keep their slots.
  Duration lease_ttl{10000};

  bool shared() const { return backend == Backend::redis; }
  bool operator==(const State&) const = default;
};

// Parses "redis://[[user]:password@]host[:port][/db]", "rediss://..." and
// "unix:///path[?db=N]" into `into`; false with the reason in `why`.
bool parse_redis_url(const std::string& text, RedisState& into, std::string& why);

struct Config {
  Server server;
  Upstream upstream;
  Router router;
  Log log;
  Budgets budgets;
  Auth auth;
  State state;
  std::vector<Model> models;

  // Index into models by public name, built by load.
  std::unordered_map<std::string, std::size_t> model_index;

  const Model* find_model(const std::string& name) const {
    auto it = model_index.find(name);
    return it == model_index.end() ? nullptr : &models[it->second];
  }
  // The model that serves requests to `endpoint` that name none; nullptr
  // when there is none and such a request is refused.
  const Model* default_model_for(std::string_view endpoint) const {
    for (const auto& model : models) {
      for (const auto& served : model.default_for) {
        if (served == endpoint) return &model;
      }
    }
    return nullptr;
  }
};

using ConfigPtr = std::shared_ptr<const Config>;

// Parses and validates; throws ConfigError. Environment lookups go through
// `env` so tests can inject their own.
using EnvLookup = std::function<std::optional<std::string>(const std::string& name)>;
std::optional<std::string> process_env(const std::string& name);

ConfigPtr load_file(const std::string& path, EnvLookup env = process_env);
ConfigPtr load_string(const std::string& yaml_text, EnvLookup env = process_env);

// Refuses a config that neither lists client keys nor says
// `auth.disabled: true`; throws ConfigError ("(root): ..." when there is no
// auth section at all). load_file/load_string accept a config without an
// auth section (authentication off, Auth::enabled() false) so that configs
// for tests and tools need none; the binary calls this at start-up and on
// every reload, so a deployed gateway is never open by omission. An auth
// section that is present but lists no keys is already rejected by load.
void require_auth_or_explicit_opt_out(const Config& config);

// The settings a gateway takes once, when it starts: its listeners, worker
// threads and busy polling, its connection pools, DNS cache and access log.
// Returns the YAML paths of those that differ between `running` and
// `loaded`, in the order the sections are documented; a reload keeps their
// running values until a restart.
std::vector<std::string> start_only_changes(const Config& running, const Config& loaded);

// "250ms", "2s", "1m", "1.5s" -> milliseconds; nullopt when malformed.
std::optional<Duration> parse_duration(const std::string& text);

// Parses "http(s)://host[:port][/prefix]"; nullopt with reason in `why`.
std::optional<Url> parse_url(const std::string& text, std::string& why);

// "host:port", "[v6]:port" -> pair; nullopt when malformed.
std::optional<std::pair<std::string, std::uint16_t>> parse_listen(const std::string& text);

}  // namespace sluice::config
