#pragma once

#include <signal.h>
#include <sys/types.h>
#include <unistd.h>

#include <chrono>

namespace sluice::bench {

// Starts a child that, after `delay`, stops this whole process for `pause`
// (SIGSTOP, then SIGCONT): to each of its threads, a time in which no CPU
// served it. Returns the child's pid to wait for, or -1 when fork failed.
inline pid_t pause_this_process(std::chrono::microseconds delay, std::chrono::microseconds pause) {
  const pid_t parent = getpid();
  const pid_t child = fork();
  if (child != 0) return child;
  usleep(static_cast<useconds_t>(delay.count()));
  kill(parent, SIGSTOP);
  usleep(static_cast<useconds_t>(pause.count()));
  kill(parent, SIGCONT);
  _exit(0);
}

}  // namespace sluice::bench
