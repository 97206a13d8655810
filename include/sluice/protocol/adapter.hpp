#pragma once

#include <memory>
#include <optional>
#include <string>

#include "sluice/openai/api_error.hpp"
#include "sluice/protocol/dialect.hpp"
#include "sluice/stream/answer_translator.hpp"
#include "sluice/upstream/client.hpp"

// The protocol seam: what a deployment's upstream speaks, against what the
// client's endpoint speaks (its Dialect: OpenAI's API, or Anthropic's
// Messages API). One adapter per deployment, made with the config snapshot.
namespace sluice::protocol {

class Adapter {
 public:
  virtual ~Adapter() = default;

  // Requests and answers pass as they are: the attempts send the client's
  // bytes, and the relay splices the upstream's through without parsing or
  // re-serialising any of it. Neither call below is made then.
  virtual bool passes_through(Dialect client) const = 0;

  // Rewrites the request for the upstream: its target (`request.target`:
  // the deployment's path prefix, the endpoint, the query), its header
  // lines and its body. New pieces may point into `storage`, which lives as
  // long as the attempt. An error is a request this upstream cannot carry:
  // the attempt is not made, and the deployment is not blamed for it. The
  // client's dialect is its endpoint's (`request.target[1]`, dialect_of).
  virtual std::optional<ApiError> adapt_request(upstream::Request& request,
                                                std::string& storage) const = 0;

  // Translates one answer of the upstream's for a client of `client`'s
  // dialect; null when the upstream answers as the client's endpoint does
  // (the request needed rewriting only): the answer is then spliced through
  // untouched.
  virtual std::unique_ptr<stream::AnswerTranslator> translate_answer(Dialect client) const = 0;
};

}  // namespace sluice::protocol
