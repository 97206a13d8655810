#include "sluice/cache/request_key.hpp"

#include <cmath>
#include <nlohmann/json.hpp>

namespace sluice::cache {

namespace {

using json = nlohmann::json;

// Bumped whenever the canonical form changes, so entries of an older form
// can never be mistaken for new ones.
constexpr std::string_view kKeyVersion = "sluice-cache-1";

void normalise(json& value) {
  if (value.is_object() || value.is_array()) {
    for (auto& item : value) normalise(item);
  } else if (value.is_number_float()) {
    double number = value.get<double>();
    constexpr double kExactIntegers = 9007199254740992.0;  // 2^53
    if (std::trunc(number) == number && std::fabs(number) < kExactIntegers) {
      value = static_cast<std::int64_t>(number);
    }
  }
}

Digest digest_of(const json& body, std::string_view model, Endpoint endpoint) {
  std::string text(kKeyVersion);
  text.append("\n").append(endpoint == Endpoint::chat ? "chat" : "completions").append("\n");
  text.append(model).append("\n");
  // nlohmann's objects are ordered maps: the dump lists keys sorted.
  text.append(body.dump(-1, ' ', false, json::error_handler_t::replace));
  return sha256(text);
}

// The text parts of a message's content: a string, or an array of parts of
// which the "text" ones count.
std::string content_text(const json& content) {
  if (content.is_string()) return content.get<std::string>();
  std::string text;
  if (content.is_array()) {
    for (const auto& part : content) {
      if (!part.is_object()) continue;
      auto found = part.find("text");
      if (found == part.end() || !found->is_string()) continue;
      if (!text.empty()) text += "\n";
      text += found->get<std::string>();
    }
  }
  return text;
}

bool offers_tools(const json& body) {
  for (const char* field : {"tools", "functions"}) {
    auto found = body.find(field);
    if (found != body.end() && !found->is_null() && !(found->is_array() && found->empty())) {
      return true;
    }
  }
  return false;
}

// Takes the query text out of `body`, leaving a null in its place.
std::string take_query_text(json& body, Endpoint endpoint) {
  if (endpoint == Endpoint::completions) {
    auto prompt = body.find("prompt");
    if (prompt == body.end() || !prompt->is_string()) return {};
    std::string text = prompt->get<std::string>();
    *prompt = nullptr;
    return text;
  }
  auto messages = body.find("messages");
  if (messages == body.end() || !messages->is_array()) return {};
  for (auto it = messages->rbegin(); it != messages->rend(); ++it) {
    if (!it->is_object()) continue;
    auto role = it->find("role");
    if (role == it->end() || *role != "user") continue;
    auto content = it->find("content");
    if (content == it->end()) return {};
    std::string text = content_text(*content);
    *content = nullptr;
    return text;
  }
  return {};
}

}  // namespace

std::optional<Endpoint> cached_endpoint(std::string_view path) {
  if (path == "/chat/completions") return Endpoint::chat;
  if (path == "/completions") return Endpoint::completions;
  return std::nullopt;
}

RequestKey request_key(json body, std::string_view model, Endpoint endpoint, bool semantic) {
  RequestKey key;
  for (auto field : kIgnoredFields) body.erase(std::string(field));
  body.erase("model");  // the public name is keyed below, whatever the body spelled
  normalise(body);
  key.exact = digest_of(body, model, endpoint);
  if (semantic) {
    key.has_tools = offers_tools(body);
    key.query_text = take_query_text(body, endpoint);
    key.scope = digest_of(body, model, endpoint);
  }
  return key;
}

}  // namespace sluice::cache
