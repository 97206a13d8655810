#pragma once

#include <memory>
#include <utility>
#include <vector>

#include "sluice/common/clock.hpp"
#include "sluice/config/config.hpp"

// What the router's tests share: a fixed start for their clocks, and a
// configuration built from models directly rather than from YAML.
namespace sluice::router {

inline const TimePoint kBase = Clock::now();

inline std::shared_ptr<config::Config> make_config(std::vector<config::Model> models,
                                                   config::Router policy = {}) {
  auto cfg = std::make_shared<config::Config>();
  cfg->router = policy;
  cfg->models = std::move(models);
  for (std::size_t i = 0; i < cfg->models.size(); ++i) cfg->model_index[cfg->models[i].name] = i;
  return cfg;
}

}  // namespace sluice::router
