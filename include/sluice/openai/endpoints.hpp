#pragma once

#include <optional>
#include <string_view>

namespace sluice {

// The OpenAI endpoints sluice proxies, as they follow "/v1"; that part of
// the path is appended to a deployment's base URL. Each takes a JSON body
// or, for the ones that upload files (audio transcriptions, image edits), a
// multipart/form-data one; the Content-Type says which.
inline constexpr std::string_view kProxiedEndpoints[] = {
    "/chat/completions", "/completions",          "/embeddings",        "/responses",
    "/moderations",      "/images/generations",   "/images/edits",      "/images/variations",
    "/audio/speech",     "/audio/transcriptions", "/audio/translations"};

// The endpoint a client's path ("/v1/...", no query) asks for.
inline std::optional<std::string_view> proxied_endpoint(std::string_view path) {
  constexpr std::string_view kPrefix = "/v1";
  if (!path.starts_with(kPrefix)) return std::nullopt;
  const auto rest = path.substr(kPrefix.size());
  for (const auto endpoint : kProxiedEndpoints) {
    if (rest == endpoint) return endpoint;
  }
  return std::nullopt;
}

}  // namespace sluice
