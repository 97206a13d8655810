#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "sluice/config/config.hpp"
#include "sluice/protocol/adapter.hpp"

// Adapters by the provider name a deployment gives (`provider:`).
namespace sluice::protocol {

using AdapterFactory = std::unique_ptr<Adapter> (*)(const config::Deployment& deployment);

// The adapter for a deployment's provider; a ConfigError that names the
// YAML path when no adapter has that name.
std::unique_ptr<Adapter> make_adapter(const config::Deployment& deployment);

// Checks every deployment's provider, as make_adapter would (for
// --check-config, which builds nothing).
void check_providers(const config::Config& config);

// The names adapters are registered under, sorted.
std::vector<std::string> provider_names();

// Adds an adapter under `name` (replacing one of the same name), for
// adapters that live outside this folder; call it before any config is
// loaded. The adapters sluice ships are listed in adapters.cpp.
void register_adapter(std::string name, AdapterFactory factory);

}  // namespace sluice::protocol
