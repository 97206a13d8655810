#include "sluice/server/model_list.hpp"

#include <nlohmann/json.hpp>

namespace sluice::server {

namespace {

nlohmann::json model_object(std::string_view name) {
  // Models are the config's, not the upstreams': no creation time to tell,
  // and sluice is what serves them.
  return {{"id", name}, {"object", "model"}, {"created", 0}, {"owned_by", "sluice"}};
}

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

std::string render_model_list(const config::Config& config, const auth::KeyPolicy* key) {
  nlohmann::json data = nlohmann::json::array();
  for (const auto& model : config.models) {
    if (key && !auth::allows_model(*key, model.name)) continue;
    data.push_back(model_object(model.name));
  }
  return nlohmann::json{{"object", "list"}, {"data", std::move(data)}}.dump();
}

std::string render_model(std::string_view name) { return model_object(name).dump(); }

std::optional<std::string> model_name_from_path(std::string_view encoded) {
  std::string name;
  name.reserve(encoded.size());
  for (std::size_t i = 0; i < encoded.size(); ++i) {
    if (encoded[i] != '%') {
      name.push_back(encoded[i]);
      continue;
    }
    const int high = i + 2 < encoded.size() ? hex_digit(encoded[i + 1]) : -1;
    const int low = high >= 0 ? hex_digit(encoded[i + 2]) : -1;
    if (low < 0) return std::nullopt;
    name.push_back(static_cast<char>(high * 16 + low));
    i += 2;
  }
  if (name.empty()) return std::nullopt;
  return name;
}

}  // namespace sluice::server
