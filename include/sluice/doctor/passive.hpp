#pragma once

// The passive mode: a running gateway's own records (GET /admin/diagnosis on
// its admin listener) diagnosed by the same arithmetic as the active mode's
// measurements. Nothing is sent upstream.

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "sluice/doctor/report.hpp"

namespace sluice::doctor {

// One report per deployment in an /admin/diagnosis document.
std::vector<DeploymentReport> diagnose_gateway(const nlohmann::json& diagnosis);

// Fetches ADMIN_URL/admin/diagnosis (with `admin_key` as its bearer key when
// not empty) and diagnoses it; nullopt with `error` set when it cannot.
std::optional<std::vector<DeploymentReport>> read_gateway(const std::string& admin_url,
                                                          const std::string& admin_key,
                                                          std::string& error);

}  // namespace sluice::doctor
