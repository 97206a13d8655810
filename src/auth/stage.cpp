#include "sluice/auth/stage.hpp"

#include <algorithm>
#include <charconv>
#include <limits>
#include <utility>

namespace sluice::auth {
namespace {

void append_number(std::string& out, std::uint64_t value) {
  char digits[24];
  auto [end, ec] = std::to_chars(digits, digits + sizeof digits, value);
  out.append(digits, end);
}

void append_header(std::string& out, std::string_view name, std::uint64_t value) {
  out += name;
  out += ": ";
  append_number(out, value);
  out += "\r\n";
}

void append_duration_header(std::string& out, std::string_view name, Nanos value) {
  out += name;
  out += ": ";
  append_openai_duration(out, value);
  out += "\r\n";
}

std::chrono::seconds whole_seconds_at_least_one(Nanos wait) {
  auto seconds = std::chrono::ceil<std::chrono::seconds>(wait);
  return std::max(seconds, std::chrono::seconds(1));
}

ApiError missing_key() {
  return {401,
          "You didn't provide an API key. You need to provide your API key in an Authorization "
          "header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY).",
          "invalid_request_error", "", "invalid_api_key"};
}

ApiError incorrect_key() {
  return {401, "Incorrect API key provided.", "invalid_request_error", "", "invalid_api_key"};
}

enum class Limit { max_parallel, rpm, tpm };

ApiError rate_limited(Limit limit, const KeyPolicy& key, std::optional<Nanos> retry_after) {
  std::string message = "Rate limit reached for key '" + key.name + "' on ";
  std::string type = "requests";
  switch (limit) {
    case Limit::max_parallel:
      message += "requests in flight (max_parallel): limit " +
                 std::to_string(key.limits.max_parallel) +
                 ". Please try again when one of them has finished.";
      return {429, std::move(message), std::move(type), "", "rate_limit_exceeded"};
    case Limit::rpm:
      message += "requests per minute (rpm): limit " + std::to_string(key.limits.rpm);
      break;
    case Limit::tpm:
      message += "tokens per minute (tpm): limit " + std::to_string(key.limits.tpm);
      type = "tokens";
      break;
  }
  message += ". Please try again in ";
  append_openai_duration(message, retry_after.value_or(Nanos{0}));
  message += ".";
  return {429, std::move(message), std::move(type), "", "rate_limit_exceeded"};
}

RateHeaders::Budget budget(std::uint64_t limit, std::uint64_t remaining, Nanos reset) {
  if (limit == 0) return {};
  return {limit, remaining, reset};
}

}  // namespace

std::uint64_t estimate_tokens(std::size_t prompt_bytes, std::optional<std::uint64_t> max_tokens) {
  std::uint64_t prompt = prompt_bytes / 4;
  std::uint64_t completion = max_tokens.value_or(kDefaultCompletionTokens);
  // Saturates: a client-supplied max_tokens must not wrap into a tiny charge.
  return completion > std::numeric_limits<std::uint64_t>::max() - prompt
             ? std::numeric_limits<std::uint64_t>::max()
             : prompt + completion;
}

// ---------------------------------------------------------------------------
// Headers

void append_openai_duration(std::string& out, Nanos duration) {
  if (duration <= Nanos{0}) {
    out += "0s";
    return;
  }
  auto total_ms =
      static_cast<std::uint64_t>(std::chrono::ceil<std::chrono::milliseconds>(duration).count());
  if (total_ms < 1000) {
    append_number(out, total_ms);
    out += "ms";
    return;
  }
  std::uint64_t hours = total_ms / 3'600'000;
  std::uint64_t minutes = total_ms / 60'000 % 60;
  std::uint64_t seconds = total_ms / 1000 % 60;
  std::uint64_t millis = total_ms % 1000;
  if (hours > 0) {
    append_number(out, hours);
    out += 'h';
  }
  if (hours > 0 || minutes > 0) {
    append_number(out, minutes);
    out += 'm';
  }
  append_number(out, seconds);
  if (millis > 0) {
    char fraction[4] = {'.', static_cast<char>('0' + millis / 100),
                        static_cast<char>('0' + millis / 10 % 10),
                        static_cast<char>('0' + millis % 10)};
    std::size_t length = 4;
    while (fraction[length - 1] == '0') --length;
    out.append(fraction, length);
  }
  out += 's';
}

void RateHeaders::append_to(std::string& out) const {
  if (requests.limit != 0) {
    append_header(out, "x-ratelimit-limit-requests", requests.limit);
    append_header(out, "x-ratelimit-remaining-requests", requests.remaining);
    append_duration_header(out, "x-ratelimit-reset-requests", requests.reset);
  }
  if (tokens.limit != 0) {
    append_header(out, "x-ratelimit-limit-tokens", tokens.limit);
    append_header(out, "x-ratelimit-remaining-tokens", tokens.remaining);
    append_duration_header(out, "x-ratelimit-reset-tokens", tokens.reset);
  }
}

// ---------------------------------------------------------------------------
// Admission

Admission::Admission(Admission&& other) noexcept
    : error(std::move(other.error)),
      retry_after(other.retry_after),
      key(other.key),
      headers(other.headers),
      limits_(std::exchange(other.limits_, nullptr)),
      reserved_tokens_(other.reserved_tokens_),
      completed_(other.completed_),
      limits_pending_(other.limits_pending_) {}

Admission& Admission::operator=(Admission&& other) noexcept {
  if (this != &other) {
    release_slot();
    error = std::move(other.error);
    retry_after = other.retry_after;
    key = other.key;
    headers = other.headers;
    limits_ = std::exchange(other.limits_, nullptr);
    reserved_tokens_ = other.reserved_tokens_;
    completed_ = other.completed_;
    limits_pending_ = other.limits_pending_;
  }
  return *this;
}

Admission::~Admission() { release_slot(); }

void Admission::release_slot() const {
  if (limits_ == nullptr || completed_) return;
  completed_ = true;
  limits_->parallel.release();
}

void Admission::append_headers(std::string& out) const {
  headers.append_to(out);
  if (retry_after)
    append_header(out, "Retry-After", static_cast<std::uint64_t>(retry_after->count()));
}

// ---------------------------------------------------------------------------
// AuthStage

AuthStage::AuthStage(const config::Config& config, const AuthStage* previous)
    : enabled_(config.auth.enabled()),
      limits_shared_(config.state.shared()),
      store_(config.auth),
      registry_(config.auth, previous != nullptr ? &previous->registry_ : nullptr) {
  limits_by_key_.reserve(store_.keys().size());
  for (const KeyPolicy& key : store_.keys()) limits_by_key_.push_back(registry_.find(key.name));
}

Admission AuthStage::admit(const AuthRequest& request) const {
  Admission admission;
  if (!enabled_) return admission;

  if (request.presented_key_or_empty.empty()) {
    admission.error = missing_key();
    return admission;
  }
  const KeyPolicy* key = request.memo != nullptr
                             ? request.memo->authenticate(store_, request.presented_key_or_empty)
                             : store_.authenticate(request.presented_key_or_empty);
  if (key == nullptr) {
    admission.error = incorrect_key();
    return admission;
  }
  admission.key = key;

  if (!request.model.empty() && !allows_model(*key, request.model)) {
    admission.error = ApiError::model_not_found(request.model);
    return admission;
  }

  const config::ApiKeyLimits& configured = key->limits;
  // What one request can be known to need before its usage settles it: the
  // estimate rests on the client's max_tokens, and uncapped, one request
  // could put the key in debt for a year.
  admission.reserved_tokens_ = configured.tpm > 0
                                   ? std::min(request.estimated_tokens, configured.tpm)
                                   : request.estimated_tokens;
  if (limits_shared_) {
    admission.limits_pending_ = true;
    return admission;
  }
  take_local_limits(admission, request.now);
  return admission;
}

KeyLimits& AuthStage::limits_of(const KeyPolicy& key) const {
  return *limits_by_key_[static_cast<std::size_t>(&key - store_.keys().data())];
}

void AuthStage::take_local_limits(Admission& admission, TimePoint now) const {
  admission.limits_pending_ = false;
  const KeyPolicy* key = admission.key;
  KeyLimits& limits = limits_of(*key);
  const config::ApiKeyLimits& configured = key->limits;
  const std::uint64_t estimate = admission.reserved_tokens_;
  admission.reserved_tokens_ = 0;

  if (!limits.parallel.try_acquire()) {
    admission.error = rate_limited(Limit::max_parallel, *key, std::nullopt);
    admission.retry_after = std::chrono::seconds(1);
    admission.headers.requests =
        budget(configured.rpm, limits.requests.remaining(now), limits.requests.reset_after(now));
    admission.headers.tokens =
        budget(configured.tpm, limits.tokens.remaining(now), limits.tokens.reset_after(now));
    return;
  }

  Decision requests = limits.requests.try_acquire(now);
  if (!requests.allowed) {
    limits.parallel.release();
    admission.error = rate_limited(Limit::rpm, *key, requests.retry_after);
    admission.retry_after = whole_seconds_at_least_one(requests.retry_after);
    admission.headers.requests = budget(configured.rpm, requests.remaining, requests.reset_after);
    admission.headers.tokens =
        budget(configured.tpm, limits.tokens.remaining(now), limits.tokens.reset_after(now));
    return;
  }

  if (estimate > 0) {
    Decision tokens = limits.tokens.reserve(estimate, now);
    if (!tokens.allowed) {
      limits.requests.refund();
      limits.parallel.release();
      admission.error = rate_limited(Limit::tpm, *key, tokens.retry_after);
      admission.retry_after = whole_seconds_at_least_one(tokens.retry_after);
      admission.headers.requests =
          budget(configured.rpm, limits.requests.remaining(now), limits.requests.reset_after(now));
      admission.headers.tokens = budget(configured.tpm, tokens.remaining, tokens.reset_after);
      return;
    }
    admission.headers.tokens = budget(configured.tpm, tokens.remaining, tokens.reset_after);
    admission.reserved_tokens_ = estimate;
  } else {
    admission.headers.tokens =
        budget(configured.tpm, limits.tokens.remaining(now), limits.tokens.reset_after(now));
  }
  admission.headers.requests = budget(configured.rpm, requests.remaining, requests.reset_after);
  admission.limits_ = &limits;
}

void AuthStage::conclude_shared(Admission& admission, const SharedVerdict& verdict) const {
  admission.limits_pending_ = false;
  const KeyPolicy& key = *admission.key;
  const KeyLimits& limits = limits_of(key);
  const config::ApiKeyLimits& configured = key.limits;
  const Gcra& gcra = limits.requests;
  const TokenBucket& bucket = limits.tokens;
  const auto rpm_owed = verdict.rpm_owed_ns;
  const auto tpm_owed = verdict.tpm_owed_ns;
  auto rpm_now = [&] {
    return budget(configured.rpm, gcra.remaining_when_owed(rpm_owed), Nanos(rpm_owed));
  };
  auto tpm_now = [&] {
    return budget(configured.tpm, bucket.remaining_when_owed(tpm_owed), Nanos(tpm_owed));
  };
  const std::uint64_t estimate = admission.reserved_tokens_;
  switch (verdict.refused) {
    case SharedVerdict::Refused::max_parallel:
      admission.reserved_tokens_ = 0;
      admission.error = rate_limited(Limit::max_parallel, key, std::nullopt);
      admission.retry_after = std::chrono::seconds(1);
      admission.headers.requests = rpm_now();
      admission.headers.tokens = tpm_now();
      return;
    case SharedVerdict::Refused::rpm: {
      admission.reserved_tokens_ = 0;
      Decision requests = gcra.judge(rpm_owed);
      admission.error = rate_limited(Limit::rpm, key, requests.retry_after);
      admission.retry_after = whole_seconds_at_least_one(requests.retry_after);
      admission.headers.requests = budget(configured.rpm, requests.remaining, requests.reset_after);
      admission.headers.tokens = tpm_now();
      return;
    }
    case SharedVerdict::Refused::tpm: {
      admission.reserved_tokens_ = 0;
      Decision tokens = bucket.judge(tpm_owed, bucket.cost_ns(estimate));
      admission.error = rate_limited(Limit::tpm, key, tokens.retry_after);
      admission.retry_after = whole_seconds_at_least_one(tokens.retry_after);
      admission.headers.requests = rpm_now();
      admission.headers.tokens = budget(configured.tpm, tokens.remaining, tokens.reset_after);
      return;
    }
    case SharedVerdict::Refused::none:
      break;
  }
  Decision requests = gcra.judge(rpm_owed);
  admission.headers.requests = budget(configured.rpm, requests.remaining, requests.reset_after);
  if (estimate > 0) {
    Decision tokens = bucket.judge(tpm_owed, bucket.cost_ns(estimate));
    admission.headers.tokens = budget(configured.tpm, tokens.remaining, tokens.reset_after);
  } else {
    admission.headers.tokens = tpm_now();
  }
}

void AuthStage::complete(const Admission& admission, std::optional<std::uint64_t> actual_tokens,
                         TimePoint now) const {
  if (admission.limits_ == nullptr || admission.completed_) return;
  if (actual_tokens) {
    admission.limits_->tokens.settle(admission.reserved_tokens_, *actual_tokens, now);
  }
  admission.release_slot();
}

}  // namespace sluice::auth
