#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "sluice/auth/key_store.hpp"
#include "sluice/auth/limits.hpp"
#include "sluice/common/clock.hpp"
#include "sluice/config/config.hpp"
#include "sluice/openai/api_error.hpp"

// The auth and rate-limit stage as one decision: the pipeline hands it what
// the request says and gets back "go ahead" or the error to answer with.
// Nothing here touches a socket.
namespace sluice::auth {

// Completion tokens assumed when a request does not set max_tokens. A
// guess at a typical answer, corrected by complete() once the real usage is
// known.
inline constexpr std::uint64_t kDefaultCompletionTokens = 256;

// The token estimate charged up front against a key's TPM budget: about
// four bytes of prompt per token (the usual rule of thumb for English text
// and JSON), plus the completion the request allows for, or
// kDefaultCompletionTokens. Cheap on purpose: it must not parse the body.
std::uint64_t estimate_tokens(std::size_t prompt_bytes, std::optional<std::uint64_t> max_tokens);

struct AuthRequest {
  std::string_view presented_key_or_empty;  // see extract_presented_key
  // The public model name; empty for endpoints without one (GET
  // /v1/models), which skips the model check.
  std::string_view model;
  // Reserved against the key's TPM budget, at most one minute's worth of
  // it. 0 charges no tokens up front and skips the TPM check (nothing to
  // reserve): for requests that will not go upstream.
  std::uint64_t estimated_tokens = 0;
  TimePoint now;
  // The client connection's, if it has one: the key is looked up through it.
  KeyMemo* memo = nullptr;
};

// OpenAI's x-ratelimit-* values, for the limits a key has configured.
struct RateHeaders {
  struct Budget {
    std::uint64_t limit = 0;  // 0 = not configured: no headers for it
    std::uint64_t remaining = 0;
    Nanos reset{0};  // until the budget is whole again
  };
  Budget requests;
  Budget tokens;

  // Appends "x-ratelimit-{limit,remaining,reset}-{requests,tokens}: value\r\n"
  // lines for each configured budget. Allocates only when `out` must grow.
  void append_to(std::string& out) const;
};

// Appends a duration the way OpenAI's reset headers spell it (Go's duration
// format at millisecond precision): "0s", "120ms", "1s", "1.5s", "6m0s",
// "1h2m3s". Rounded up to the next millisecond, so a client that waits
// that long is never early.
void append_openai_duration(std::string& out, Nanos duration);

// What a shared state backend (state.backend: redis) found for one
// admission: which check refused it, if any, and how far ahead of now each
// budget's TAT stood before this request. AuthStage::conclude_shared turns
// it into the same answer the local limits would give.
struct SharedVerdict {
  enum class Refused { none, max_parallel, rpm, tpm };
  Refused refused = Refused::none;
  std::int64_t rpm_owed_ns = 0;
  std::int64_t tpm_owed_ns = 0;
};

// The answer to one request. When allowed, it holds a ticket (a parallel
// slot and the token reservation) that AuthStage::complete() settles.
//
// An Admission points into the AuthStage that made it (its KeyPolicy and the
// key's live limits), so that stage must outlive it: keep the stage in the
// same snapshot the request holds. Move-only, so a ticket cannot be settled
// twice through a copy. If one is destroyed without complete() (a path that
// bailed out early), its parallel slot is given back then and its token
// estimate stands, so no slot can leak.
struct Admission {
  std::optional<ApiError> error;                    // set = answer with this instead
  std::optional<std::chrono::seconds> retry_after;  // with a 429: whole seconds, at least 1
  const KeyPolicy* key = nullptr;  // who is calling; null when auth is off or the key unknown
  RateHeaders headers;

  Admission() = default;
  Admission(Admission&& other) noexcept;
  Admission& operator=(Admission&& other) noexcept;
  Admission(const Admission&) = delete;
  Admission& operator=(const Admission&) = delete;
  ~Admission();

  bool allowed() const { return !error.has_value(); }
  // Key and model are checked, the limits are left to a shared backend:
  // see AuthStage::conclude_shared and take_local_limits.
  bool limits_pending() const { return limits_pending_; }
  // The tokens charged up front against the key's tpm (capped at a
  // minute's worth); with a shared backend, also what it was asked for.
  std::uint64_t reserved_tokens() const { return reserved_tokens_; }

  // The rate headers and, with a 429, "Retry-After: N\r\n".
  void append_headers(std::string& out) const;

 private:
  friend class AuthStage;
  void release_slot() const;

  KeyLimits* limits_ = nullptr;  // set while a ticket is held
  std::uint64_t reserved_tokens_ = 0;
  mutable bool completed_ = false;
  bool limits_pending_ = false;
};

// Built per config snapshot, like router::Router; `previous` carries the
// live budgets of unchanged keys across a reload (see LimiterRegistry).
// Every member is safe to call from any thread.
class AuthStage {
 public:
  explicit AuthStage(const config::Config& config, const AuthStage* previous = nullptr);

  // Checks, in order, and stops at the first that fails:
  //   key      401 invalid_api_key (missing or unknown; the key is never echoed)
  //   model    404 model_not_found, the very same answer as for a model that
  //            does not exist, so a key cannot probe which models are
  //            configured beyond its own
  //   parallel 429 rate_limit_exceeded, type "requests" (max_parallel)
  //   rpm      429 rate_limit_exceeded, type "requests"
  //   tpm      429 rate_limit_exceeded, type "tokens"
  // A request turned away by a later check gives back what earlier ones took
  // (the parallel slot, the rpm unit), so denials cost a key nothing.
  // With auth disabled every request is allowed with no key and no ticket.
  // Allocates nothing unless it has to build an error.
  Admission admit(const AuthRequest& request) const;

  // The request is over: settles the token reservation against the real
  // count (`actual_tokens`, prompt + completion; nullopt keeps the estimate,
  // e.g. a stream that ended without usage) and releases the parallel slot.
  // Only the first call for an admission counts; denied admissions have
  // nothing to settle.
  void complete(const Admission& admission, std::optional<std::uint64_t> actual_tokens,
                TimePoint now) const;

  // With a shared state backend, admit() checks the key and the model and
  // leaves the limits pending. The backend then either decides (its
  // verdict, concluded here into the headers and the 429 the local limits
  // would give) or is away, and the request takes this instance's own
  // limits (state.on_unavailable: local).
  void conclude_shared(Admission& admission, const SharedVerdict& verdict) const;
  void take_local_limits(Admission& admission, TimePoint now) const;
  bool limits_shared() const { return limits_shared_; }

  bool enabled() const { return enabled_; }
  const KeyStore& keys() const { return store_; }
  const LimiterRegistry& limiters() const { return registry_; }

 private:
  KeyLimits& limits_of(const KeyPolicy& key) const;

  bool enabled_;
  bool limits_shared_;
  KeyStore store_;
  LimiterRegistry registry_;
  std::vector<KeyLimits*> limits_by_key_;  // parallel to store_.keys()
};

}  // namespace sluice::auth
