#include "support/gateway_fixture.hpp"

#include <sys/resource.h>
#include <unistd.h>

#include <boost/asio/post.hpp>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <future>
#include <thread>

namespace sluice::testing {

namespace {
std::string with_test_defaults(const std::string& yaml) {
  if (yaml.find("server:") != std::string::npos) return yaml;
  return "server:\n  listen: 127.0.0.1:0\n  threads: 2\n" + yaml;
}
}  // namespace

TestGateway::TestGateway(const std::string& yaml) {
  auto loaded = config::load_string(with_test_defaults(yaml));
  auto config = std::make_shared<config::Config>(*loaded);
  // Tests run in parallel, and beside a gateway someone may be running on
  // the default ports: both listeners take an ephemeral loopback port,
  // whatever the YAML says (a test gateway's own `port()` tells where).
  config->server.listen_host = "127.0.0.1";
  config->server.listen_port = 0;
  config->server.admin_host = "127.0.0.1";
  config->server.admin_port = 0;
  // Access lines stay out of the test output, unless a test asks.
  if (yaml.find("access_log") == std::string::npos) config->log.access_log = "off";
  gateway_ = std::make_unique<server::Gateway>(std::move(config));
  gateway_->start();
}

TestGateway::~TestGateway() { gateway_->stop(); }

std::int64_t TestGateway::idle_upstream_connections() {
  std::int64_t total = 0;
  for (auto& worker : gateway_->workers()) total += worker->pool().counters().idle.load();
  return total;
}

std::int64_t TestGateway::active_upstream_connections() {
  std::int64_t total = 0;
  for (auto& worker : gateway_->workers()) total += worker->pool().counters().active.load();
  return total;
}

void TestGateway::on_each_worker(const std::function<void(server::Worker&)>& task) {
  std::vector<std::future<void>> done;
  for (auto& worker : gateway_->workers()) {
    auto ran = std::make_shared<std::promise<void>>();
    done.push_back(ran->get_future());
    boost::asio::post(worker->context(), [&worker = *worker, task, ran] {
      task(worker);
      ran->set_value();
    });
  }
  for (auto& future : done) {
    if (future.wait_for(std::chrono::seconds(2)) != std::future_status::ready) {
      throw std::runtime_error("a worker did not run a posted task within 2 s");
    }
  }
}

void TestGateway::close_idle_upstream_connections() {
  on_each_worker([](server::Worker& worker) { worker.pool().close_all(); });
}

std::unique_ptr<mock::MockServer> start_mock(mock::Behaviour behaviour, unsigned threads) {
  mock::MockServer::Options options;
  options.behaviour = behaviour;
  options.threads = threads;
  auto server = std::make_unique<mock::MockServer>(options);
  server->start();
  return server;
}

std::string deployment_yaml(const std::string& id, const std::string& base_url,
                            const std::string& extra) {
  return "      - id: " + id + "\n        base_url: " + base_url + "\n        model: mock-model\n" +
         extra;
}

bool eventually(const std::function<bool()>& condition, std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (condition()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return condition();
}

std::size_t raise_descriptor_limit() {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0) return 1024;
  limit.rlim_cur = limit.rlim_max;
  setrlimit(RLIMIT_NOFILE, &limit);
  getrlimit(RLIMIT_NOFILE, &limit);
  return limit.rlim_cur == RLIM_INFINITY ? 1 << 20 : static_cast<std::size_t>(limit.rlim_cur);
}

TempFile::TempFile(const std::string& content, const std::string& suffix) {
  const char* dir = std::getenv("TMPDIR");
  std::string base = std::string(dir ? dir : "/tmp") + "/sluice-test-XXXXXX" + suffix;
  std::vector<char> name(base.begin(), base.end());
  name.push_back('\0');
  int fd = mkstemps(name.data(), static_cast<int>(suffix.size()));
  if (fd < 0) throw std::runtime_error("mkstemps failed");
  ::close(fd);
  path_ = name.data();
  std::ofstream(path_) << content;
}

TempFile::~TempFile() { std::remove(path_.c_str()); }

}  // namespace sluice::testing
