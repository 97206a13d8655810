#pragma once

#include <sys/types.h>

#include <chrono>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "support/gateway_fixture.hpp"

namespace sluice::testing {

// An executable run as a child process for tests of the binaries themselves.
// Its stdout and stderr go to files, so a chatty child never blocks on a full
// pipe and a test can read everything it wrote. The child is killed and
// reaped with the object if the test has not waited for it.
class ChildProcess {
 public:
  ChildProcess(const std::string& binary, std::vector<std::string> arguments,
               std::vector<std::pair<std::string, std::string>> environment = {});
  ~ChildProcess();
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  pid_t pid() const { return pid_; }
  std::string standard_output() const;
  std::string standard_error() const;

  // The first stdout line starting with `prefix`, once it appears; nullopt
  // at the timeout or when the child exits first.
  std::optional<std::string> wait_for_stdout_line(const std::string& prefix,
                                                  std::chrono::milliseconds timeout);
  // The port of a "... listening on http://HOST:PORT" line on stdout.
  std::optional<std::uint16_t> wait_for_listening_port(const std::string& prefix,
                                                       std::chrono::milliseconds timeout);

  void signal(int signal_number) const;
  // The exit code; -1 if still running after `timeout` (it is then killed),
  // -2 if it ended by a signal.
  int wait_exit(std::chrono::milliseconds timeout);
  // Whether the child has ended, without waiting; reaps it if so, keeping
  // its exit code for wait_exit.
  bool exited();

 private:
  pid_t pid_ = -1;
  int exit_code_ = -1;
  TempFile stdout_file_;
  TempFile stderr_file_;
};

// The path of a binary built beside the tests: the environment variable
// `variable` if set, else `relative_path` under the build directory (the
// parent of the test binary's folder); nullopt when neither exists.
std::optional<std::string> built_binary(const char* variable, const std::string& relative_path);

}  // namespace sluice::testing
