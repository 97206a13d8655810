#pragma once

// sluice-mock: an OpenAI-compatible upstream, which also speaks Anthropic
// Messages (/v1/messages) and Azure OpenAI's deployment paths, whose timing
// and failures are scripted, so tests, the demo and the benchmarks can drive the gateway into
// every situation a real provider produces (slow first token, stalls, resets,
// rate limits) on demand and reproducibly.

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace sluice::mock {

// Defaults applied to every request. Each field can be overridden for a single
// request by the header named next to it.
struct Behaviour {
  // x-mock-ttft-ms: delay before the response head and first event (for a
  // non-streamed response: before the whole response).
  std::chrono::milliseconds ttft{0};
  // x-mock-ttft-per-token-us: extra delay per estimated prompt token
  // (characters of all message contents / 4), to model prefill cost.
  std::chrono::microseconds ttft_per_prompt_token{0};
  // How long each new connection is held after it is accepted, before its
  // TLS handshake or first read, as a slow network or a far-away load
  // balancer would: the client sees it on a fresh connection only, never on
  // a kept-alive one. Connection-wide, so there is no header for it
  // (--accept-delay, "accept_delay_ms" in POST /mock/behaviour).
  std::chrono::milliseconds accept_delay{0};
  // x-mock-interval-ms: gap between stream events.
  std::chrono::milliseconds interval{0};
  // x-mock-tokens: content tokens in the completion.
  unsigned tokens = 8;
  // x-mock-slots: queueing mode when not 0: this many requests are served at
  // once, across all connections, and the rest wait in turn (polled every
  // millisecond), so TTFT = ttft + the wait for a slot. A slot is held from
  // the start of the answer to its end.
  unsigned slots = 0;
  // x-mock-fail: "" | 400 | 401 | 500 | 503 | 429 | overloaded | context | stall |
  // stall-mid | reset | reset-mid | garbage | truncate | cut-short | endless | drip |
  // error-mid. "cut-short" ends the answer cleanly but early: a stream after a
  // few events, with no finish_reason, usage or [DONE]; a JSON body at half
  // its length, with a Content-Length to match.
  // On /v1/messages the error statuses carry Anthropic's error shape;
  // "overloaded" is a 529; "error-mid" ends a stream with an error event after
  // a few deltas (a non-streamed request is answered normally).
  std::string fail;
  // x-mock-stall-ms: how long "stall" and "stall-mid" sleep.
  std::chrono::milliseconds stall{60000};
  // x-mock-fail-rate: probability in [0, 1] that `fail` applies to a request.
  double fail_rate = 1.0;
  // x-mock-retry-after: Retry-After seconds sent with a 429.
  unsigned retry_after_s = 1;
  // x-mock-retry-after-ms: when not 0, a 429 also carries retry-after-ms, as
  // Azure OpenAI sends it.
  unsigned retry_after_ms = 0;
  // x-mock-dims: embedding dimensions.
  unsigned dims = 16;
  // x-mock-stamp: 1 starts each streamed event's JSON with "sent_ns": the
  // steady clock's nanoseconds when the event was handed to the socket, so a
  // client on this machine can tell the path's delay from the mock's timing.
  bool stamp = false;
  // x-mock-skip-body: 1 reads a chat or text completion request's body
  // without parsing it: the reply names the mock's own model, is not
  // streamed, and counts the body's bytes / 4 as prompt tokens. A benchmark
  // of large bodies then measures the path to the mock, not the mock's JSON
  // parser. Per request only.
  bool skip_body = false;
  // x-mock-anthropic: the blocks a /v1/messages answer holds besides its
  // text: "" | tools | thinking | tools,thinking. "tools" adds a tool_use block
  // (stop_reason "tool_use"), "thinking" a thinking block before the text.
  std::string anthropic_content;
  // x-mock-openai: what a chat completion answers besides text: "" | tools.
  // "tools" answers a request that offers tools with one call of the first
  // tool offered (tool_calls, finish_reason "tool_calls"; streamed, its
  // arguments come in pieces of a few characters); a request without tools
  // is answered with text.
  std::string openai_content;
  // x-mock-cache-read-tokens, x-mock-cache-creation-tokens: the prompt cache
  // counts a /v1/messages answer reports in its usage.
  unsigned cache_read_tokens = 0;
  unsigned cache_creation_tokens = 0;
  // HTTP/2 only, connection-wide like accept_delay (POST /mock/behaviour):
  // SETTINGS_MAX_CONCURRENT_STREAMS a new connection announces
  // ("h2_max_streams"); after this many streams a connection sends GOAWAY
  // naming the last of them and refuses the rest, 0 never
  // ("h2_goaway_after"); whether PINGs are answered, false for a server
  // that has stalled ("h2_ping_ack").
  unsigned h2_max_streams = 100;
  unsigned h2_goaway_after = 0;
  bool h2_ping_ack = true;
};

// True for "" and every failure mode listed on Behaviour::fail.
bool is_valid_fail_mode(std::string_view mode);
// True for every value listed on Behaviour::anthropic_content.
bool is_valid_anthropic_content(std::string_view content);
// True for every value listed on Behaviour::openai_content.
bool is_valid_openai_content(std::string_view content);

struct Stats {
  std::uint64_t connections_accepted = 0;  // TCP connections accepted since start
  std::uint64_t open_connections = 0;
  std::uint64_t requests = 0;  // requests fully read (every endpoint except /mock/*)
  std::uint64_t streams_completed = 0;
  std::uint64_t streams_cancelled = 0;   // the peer closed before the stream finished
  std::uint64_t h2_connections = 0;      // connections that spoke HTTP/2
  std::uint64_t h2_resets_received = 0;  // RST_STREAM frames from clients
  std::uint64_t h2_pings_received = 0;
};

struct RecordedRequest {
  std::string method;
  std::string target;
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;

  // First header with this name, compared case-insensitively.
  std::optional<std::string> header(std::string_view name) const;
};

class MockServer {
 public:
  struct Options {
    std::string host = "127.0.0.1";
    std::uint16_t port = 0;  // 0 picks a free port; read it back with port()
    unsigned threads = 1;
    Behaviour behaviour;
    // Both non-empty: serve HTTPS with this certificate chain and key.
    std::string tls_cert_pem;
    std::string tls_key_pem;
    // Serve HTTP/2 as well: offered by ALPN (h2, http/1.1) over TLS, or
    // spoken from the first byte (h2c with prior knowledge) without it.
    bool http2 = false;
  };

  explicit MockServer(Options options);
  ~MockServer();  // stops and joins

  MockServer(const MockServer&) = delete;
  MockServer& operator=(const MockServer&) = delete;

  // Binds and listens (throws on failure), then serves on `threads`
  // background threads. Call at most once.
  void start();
  // Idempotent. Closes the listener and every connection, joins the threads.
  void stop();

  std::uint16_t port() const;
  // "http://HOST:PORT/v1" ("https" when serving TLS).
  std::string base_url() const;
  // Thread-safe snapshot.
  Stats stats() const;
  // Thread-safe; applies to requests read afterwards.
  void set_behaviour(Behaviour behaviour);
  Behaviour behaviour() const;
  // The last 64 requests (not /mock/*), oldest first.
  std::vector<RecordedRequest> recent_requests() const;
  void clear_recorded();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace sluice::mock
