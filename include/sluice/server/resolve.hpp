#pragma once

#include <boost/beast/http/verb.hpp>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "sluice/common/result.hpp"
#include "sluice/config/config.hpp"
#include "sluice/openai/api_error.hpp"
#include "sluice/openai/request_body.hpp"
#include "sluice/protocol/dialect.hpp"
#include "sluice/shaping/shaping.hpp"

// The first phase: where the request's path leads, which model its body
// names, and what that model's rules and shaping make of it. It writes
// nothing and decides no access: authorize comes next.
namespace sluice::server {

// The gateway's answer to a request it will not serve, and the header lines
// it carries ("Allow: ...\r\n").
struct Refusal {
  ApiError error;
  std::string_view fields;
};

struct RequestLine {
  boost::beast::http::verb method = boost::beast::http::verb::get;
  std::string_view method_name;
  std::string_view target;
};

// Where a request's path leads.
struct Route {
  enum class Kind { health, model_list, one_model, proxied };
  Kind kind = Kind::proxied;
  std::string_view path;
  std::string_view query;     // with its '?'; empty when there is none
  std::string_view endpoint;  // proxied: the endpoint under /v1 ("/chat/completions")
  protocol::Dialect dialect = protocol::Dialect::openai;  // the API the endpoint speaks
  std::string model_id;  // one_model: the model asked about, unescaped
};

// Routes the path and checks the method against it, into `route` (filled
// in place: the phases keep their results in the request's job rather than
// moving them there).
std::optional<Refusal> route_request(const RequestLine& line, Route& route);

// What a proxied request's body says.
struct Resolution {
  RequestBody inspected;
  const config::Model* requested = nullptr;  // the model the body names; null if none has the name
  // The model's rules and shaping, when it has any.
  std::optional<shaping::ShapedRequest> shaped;
  // What the token estimate is made from: the text's bytes (a form's fields
  // without its files) and the max_tokens that goes upstream.
  std::size_t text_bytes = 0;
  std::optional<std::uint64_t> max_tokens;

  // Whether the request would be sent upstream if admitted: a known model,
  // and a rule that matches when it has rules.
  bool goes_upstream() const { return requested && (!shaped || shaped->target); }

  // The body as it goes on: as received, with the endpoint's default model
  // added, or as the model's shaping rewrote it. (A view made when asked:
  // a shaped body small enough to live inside its string moves with it.)
  std::string_view body() const {
    return shaped && !shaped->body.empty() ? std::string_view(shaped->body) : inspected_body;
  }
  std::string_view inspected_body;  // as received, or with the default model
};

// Inspects the body of a request to `endpoint`; a body that names no model
// names the endpoint's default model, if one is configured, written into
// `storage`. Rules and shaping come here, before authorize, so that the key
// is charged for the body that goes upstream; models without either never
// parse the body.
std::optional<ApiError> resolve_body(const config::Config& config, std::string_view endpoint,
                                     std::string_view body, std::string_view content_type,
                                     std::string& storage, Resolution& resolution);

}  // namespace sluice::server
