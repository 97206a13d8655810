// docker/kubernetes renders offline with `kubectl kustomize` into the objects
// a replicated sluice needs, and its ConfigMap is a config sluice loads.
#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <cstdio>
#include <map>
#include <memory>

#include "support/config_loading.hpp"

namespace sluice::testing {
namespace {

// What a command printed; nullopt when it could not run or failed.
std::optional<std::string> output_of(const std::string& command) {
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(::popen(command.c_str(), "r"), ::pclose);
  if (!pipe) return std::nullopt;
  std::string out;
  char buffer[4096];
  while (std::size_t n = std::fread(buffer, 1, sizeof buffer, pipe.get())) out.append(buffer, n);
  if (::pclose(pipe.release()) != 0) return std::nullopt;
  return out;
}

TEST(Kubernetes, KustomizationRendersTheObjectsOfAReplicatedGateway) {
  if (std::system("command -v kubectl >/dev/null 2>&1") != 0) {
    GTEST_SKIP() << "kubectl is not installed (not a Debian bookworm package)";
  }
  auto root = config::repository_root();
  auto rendered = output_of("kubectl kustomize " + (root / "docker/kubernetes").string());
  ASSERT_TRUE(rendered.has_value()) << "kubectl kustomize failed";

  std::map<std::string, YAML::Node> by_kind;
  for (const auto& document : YAML::LoadAll(*rendered)) {
    by_kind[document["kind"].as<std::string>()] = document;
  }
  for (const char* kind : {"Deployment", "Service", "ConfigMap", "Secret", "PodDisruptionBudget",
                           "HorizontalPodAutoscaler"}) {
    EXPECT_TRUE(by_kind.count(kind)) << kind;
  }

  const auto deployment = by_kind["Deployment"];
  EXPECT_GE(deployment["spec"]["replicas"].as<int>(), 2);
  const auto pod = deployment["spec"]["template"]["spec"];
  const auto container = pod["containers"][0];
  EXPECT_EQ(container["readinessProbe"]["httpGet"]["path"].as<std::string>(), "/health");
  EXPECT_EQ(container["livenessProbe"]["httpGet"]["path"].as<std::string>(), "/health");
  EXPECT_TRUE(container["resources"]["requests"]["cpu"]);
  EXPECT_TRUE(container["resources"]["limits"]["memory"]);
  EXPECT_TRUE(pod["securityContext"]["runAsNonRoot"].as<bool>());
  EXPECT_TRUE(container["securityContext"]["readOnlyRootFilesystem"].as<bool>());
  EXPECT_FALSE(container["securityContext"]["allowPrivilegeEscalation"].as<bool>());
  EXPECT_GE(by_kind["HorizontalPodAutoscaler"]["spec"]["minReplicas"].as<int>(), 2);

  // The config every replica reads loads, shares its state through Redis,
  // and drains within the pod's grace period.
  const auto yaml = by_kind["ConfigMap"]["data"]["sluice.yaml"].as<std::string>();
  auto loaded =
      config::load_string(yaml, config::fake_env({{"REDIS_PASSWORD", "p"},
                                                  {"SLUICE_TEAM_KEY", "sk-team-0123456789"},
                                                  {"OPENAI_API_KEY", "sk-upstream"}}));
  EXPECT_TRUE(loaded->state.shared());
  const auto grace = pod["terminationGracePeriodSeconds"].as<long>();
  EXPECT_LT(loaded->server.drain_timeout, std::chrono::seconds(grace));
}

}  // namespace
}  // namespace sluice::testing
