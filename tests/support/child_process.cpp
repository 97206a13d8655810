#include "support/child_process.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>

namespace sluice::testing {

using namespace std::chrono_literals;

namespace {

std::string read_whole(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  std::ostringstream contents;
  contents << file.rdbuf();
  return contents.str();
}

}  // namespace

ChildProcess::ChildProcess(const std::string& binary, std::vector<std::string> arguments,
                           std::vector<std::pair<std::string, std::string>> environment)
    : stdout_file_("", ".out"), stderr_file_("", ".err") {
  // Opened before the fork: the child only dup2s and execs.
  const int out = ::open(stdout_file_.path().c_str(), O_WRONLY | O_TRUNC | O_CLOEXEC);
  const int err = ::open(stderr_file_.path().c_str(), O_WRONLY | O_TRUNC | O_CLOEXEC);
  if (out < 0 || err < 0) throw std::runtime_error("cannot open child output files");
  std::vector<char*> argv;
  argv.push_back(const_cast<char*>(binary.c_str()));
  for (auto& argument : arguments) argv.push_back(argument.data());
  argv.push_back(nullptr);
  pid_ = fork();
  if (pid_ == 0) {
    dup2(out, STDOUT_FILENO);
    dup2(err, STDERR_FILENO);
    for (const auto& [name, value] : environment) setenv(name.c_str(), value.c_str(), 1);
    execv(binary.c_str(), argv.data());
    _exit(127);
  }
  ::close(out);
  ::close(err);
  if (pid_ < 0) throw std::runtime_error("fork failed");
}

ChildProcess::~ChildProcess() {
  if (pid_ > 0) {
    ::kill(pid_, SIGKILL);
    int status = 0;
    waitpid(pid_, &status, 0);
  }
}

std::string ChildProcess::standard_output() const { return read_whole(stdout_file_.path()); }
std::string ChildProcess::standard_error() const { return read_whole(stderr_file_.path()); }

std::optional<std::string> ChildProcess::wait_for_stdout_line(const std::string& prefix,
                                                              std::chrono::milliseconds timeout) {
  std::optional<std::string> found;
  eventually(
      [&] {
        if (exited()) return true;
        std::istringstream lines(standard_output());
        for (std::string line; std::getline(lines, line);) {
          if (line.starts_with(prefix)) {
            found = line;
            return true;
          }
        }
        return false;
      },
      timeout);
  return found;
}

std::optional<std::uint16_t> ChildProcess::wait_for_listening_port(
    const std::string& prefix, std::chrono::milliseconds timeout) {
  auto line = wait_for_stdout_line(prefix, timeout);
  if (!line) return std::nullopt;
  auto colon = line->rfind(':');
  if (colon == std::string::npos) return std::nullopt;
  int port = std::atoi(line->c_str() + colon + 1);
  if (port <= 0 || port > 65535) return std::nullopt;
  return static_cast<std::uint16_t>(port);
}

bool ChildProcess::exited() {
  if (pid_ <= 0) return true;
  int status = 0;
  if (waitpid(pid_, &status, WNOHANG) != pid_) return false;
  pid_ = -1;
  exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : -2;
  return true;
}

void ChildProcess::signal(int signal_number) const {
  if (pid_ > 0) ::kill(pid_, signal_number);
}

int ChildProcess::wait_exit(std::chrono::milliseconds timeout) {
  if (pid_ <= 0) return exit_code_;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (exited()) return exit_code_;
    std::this_thread::sleep_for(5ms);
  }
  int status = 0;
  ::kill(pid_, SIGKILL);
  waitpid(pid_, &status, 0);
  pid_ = -1;
  return -1;
}

std::optional<std::string> built_binary(const char* variable, const std::string& relative_path) {
  if (const char* configured = std::getenv(variable)) return std::string(configured);
  char self[4096];
  const ssize_t length = readlink("/proc/self/exe", self, sizeof self - 1);
  if (length <= 0) return std::nullopt;
  std::string path(self, static_cast<std::size_t>(length));
  path = path.substr(0, path.rfind('/'));
  path = path.substr(0, path.rfind('/')) + "/" + relative_path;
  if (access(path.c_str(), X_OK) != 0) return std::nullopt;
  return path;
}

}  // namespace sluice::testing
