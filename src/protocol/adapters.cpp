#include "sluice/protocol/adapters.hpp"

#include <algorithm>
#include <map>
#include <mutex>

#include "sluice/protocol/anthropic_adapter.hpp"
#include "sluice/protocol/azure_adapter.hpp"
#include "sluice/protocol/openai_adapter.hpp"

namespace sluice::protocol {

namespace {

struct Registry {
  std::mutex mutex;  // registrations and config loads may come from any thread
  std::map<std::string, AdapterFactory, std::less<>> factories{
      // One line per adapter sluice ships.
      {"azure", &make_azure_adapter},
      {"openai", &make_openai_adapter},
      {"anthropic", &make_anthropic_adapter},
  };
};

Registry& registry() {
  static Registry instance;
  return instance;
}

AdapterFactory factory_for(const config::Deployment& deployment) {
  auto& known = registry();
  const std::lock_guard lock(known.mutex);
  auto found = known.factories.find(deployment.provider);
  if (found != known.factories.end()) return found->second;
  std::string names;
  for (const auto& [name, factory] : known.factories) {
    names.append(names.empty() ? "" : ", ").append(name);
  }
  const auto at = deployment.provider_at;
  const auto line = at.find(" (line ");
  throw config::ConfigError(at.substr(0, line) + ": unknown provider '" + deployment.provider +
                            "' (known: " + names + ")" +
                            (line == std::string::npos ? "" : at.substr(line)));
}

}  // namespace

std::unique_ptr<Adapter> make_adapter(const config::Deployment& deployment) {
  return factory_for(deployment)(deployment);
}

void check_providers(const config::Config& config) {
  for (const auto& model : config.models) {
    for (const auto& deployment : model.deployments) factory_for(deployment);
  }
}

std::vector<std::string> provider_names() {
  auto& known = registry();
  const std::lock_guard lock(known.mutex);
  std::vector<std::string> names;
  for (const auto& [name, factory] : known.factories) names.push_back(name);
  return names;
}

void register_adapter(std::string name, AdapterFactory factory) {
  auto& known = registry();
  const std::lock_guard lock(known.mutex);
  known.factories.insert_or_assign(std::move(name), factory);
}

}  // namespace sluice::protocol
