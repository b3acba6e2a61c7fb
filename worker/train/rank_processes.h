// The processes of a data-parallel run's ranks on this machine: `ablate-worker train --world-size`
// starts all of them, a worker agent all but rank 0 (which it trains itself). Each is this
// binary (or `binary`) started with its own arguments, and dies with its parent (SIGTERM when
// the process that started it ends). No LibTorch here.
//
// Thread safety: one thread calls Poll/Signal/Wait at a time.
#ifndef ABLATE_WORKER_TRAIN_RANK_PROCESSES_H_
#define ABLATE_WORKER_TRAIN_RANK_PROCESSES_H_

#include <sys/types.h>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace ablate {

class RankProcesses {
 public:
  // How a rank process ended: its exit code, or 128 + the signal that killed it.
  struct Ending {
    int rank = -1;
    int code = 0;
    bool signaled = false;
    int signal = 0;
    // "exit code 1", "signal 9"
    std::string Describe() const;
  };

  // Starts one process per entry of `args` (argv[0] excluded), rank `ranks[i]` for args[i].
  // `binary` empty: /proc/self/exe. An error when a process cannot be started (the ones started
  // are killed).
  // `cpus[i]`, when given and not empty, are the CPUs process i is pinned to.
  static absl::StatusOr<RankProcesses> Start(std::string binary,
                                             const std::vector<std::vector<std::string>>& args,
                                             const std::vector<int>& ranks,
                                             const std::vector<std::vector<int>>& cpus = {});

  RankProcesses(RankProcesses&&) noexcept = default;
  RankProcesses& operator=(RankProcesses&&) noexcept = default;
  // Kills (SIGKILL) and reaps any still running.
  ~RankProcesses();

  // Reaps those that ended since the last call, without waiting. Returns the first that ended
  // badly (not exit code 0 or 3: 3 is a diverged run, a result), if any did.
  std::optional<Ending> Poll();
  bool AllEnded() const;
  // Sends `sig` to those still running.
  void Signal(int sig);
  // Waits until all have ended; those still running after `grace` get SIGKILL. Returns every
  // ending, by rank, and the first bad one (as Poll) in *failure when not null.
  std::vector<Ending> Wait(std::chrono::milliseconds grace, std::optional<Ending>* failure = nullptr);

 private:
  RankProcesses() = default;
  std::vector<pid_t> pids_;    // -1 once reaped
  std::vector<int> ranks_;
  std::vector<Ending> endings_;
  std::optional<Ending> first_failure_;
};

}  // namespace ablate

#endif  // ABLATE_WORKER_TRAIN_RANK_PROCESSES_H_
