#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "sluice/protocol/dialect.hpp"
#include "sluice/server/resolve.hpp"

// The request the attempts send upstream, in the client's protocol, as
// views into storage that outlives them.
namespace sluice::server {

struct CacheStep;

struct ForwardedRequest {
  std::string_view endpoint;
  protocol::Dialect dialect = protocol::Dialect::openai;  // the endpoint's
  std::string_view query;
  // Header lines that travel upstream: the client's, as received, and the
  // gateway's own, made once for all the attempts by whoever makes them.
  std::string_view client_fields;
  std::string_view gateway_fields;
  // The body is forwarded as [prefix, upstream model literal, suffix,
  // addition, closing]; the addition is empty unless a field is added. A
  // multipart/form-data body takes the upstream model's name as it is.
  bool form_data = false;
  std::string_view body_prefix;
  std::string_view body_suffix;
  std::string_view body_addition;
  std::string_view body_closing;
  bool strip_usage_only_chunks = false;
  // The client asked for the stream's usage chunk: an answer translated from
  // another protocol, which always ends with one, keeps it only then.
  bool client_wants_usage = false;
  // The two below lie in what was padding: a request's frame keeps this
  // struct, and a larger frame would no longer come from the thread's block
  // cache. The prompt-size class of the estimated input tokens (the same
  // estimate as a key's TPM budget's); the max_tokens that goes upstream, 0
  // when none is set (saturated at 2^32 - 1).
  std::uint8_t prompt_class = 0;
  std::uint32_t max_tokens = 0;
  CacheStep* cache_step = nullptr;  // set when the answer may be cached
};

// What the forwarded body is made from.
struct ForwardingInputs {
  const Resolution& resolution;
  std::string_view endpoint;
  std::string_view query;
  std::string_view received_body;  // the request's body as it came
  bool stream = false;
  // A key with a token budget needs the real usage of every stream, and so
  // does a cache entry that may be replayed to a client asking for it.
  bool needs_usage = false;
  CacheStep* cache_step = nullptr;  // set when the answer may be cached
};

// Storage the forwarded body may point into.
struct ForwardingStorage {
  std::string without_cache_field;  // the body without sluice's own `cache` field
  std::string respliced;            // the body, when its model could not be spliced in place
};

// The request the attempts send: the body with the upstream's model to be
// spliced in (and sluice's own fields out), and what the relay must strip.
// The header fields are left to the caller; `forwarded` is filled in place.
void forwarded_request(const ForwardingInputs& inputs, ForwardingStorage& storage,
                       ForwardedRequest& forwarded);

}  // namespace sluice::server
