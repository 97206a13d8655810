#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "sluice/auth/key_store.hpp"
#include "sluice/config/config.hpp"

namespace sluice::server {

// The public model names in OpenAI's shapes: GET /v1/models lists them, and
// GET /v1/models/{model} describes one (what the SDKs' models.retrieve asks).

// The models of `config` that `key` may use; all of them without a key.
std::string render_model_list(const config::Config& config, const auth::KeyPolicy* key);

// One model's object, as /v1/models/{model} answers it.
std::string render_model(std::string_view name);

// The model name that follows "/v1/models/" in a path, percent-decoded: a
// name with a slash ("org/model") may come either way. nullopt when the name
// is empty or an escape is malformed.
std::optional<std::string> model_name_from_path(std::string_view encoded);

}  // namespace sluice::server
