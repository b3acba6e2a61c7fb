// Processes and signals, as the `ablate` commands use them: the termination signals a long-running
// command waits for (serve, up, dashboard), the ablate-worker binary and the local workers `up`
// starts, and the programs `workers` runs (sbatch, squeue...). Every child gets stdin, stdout and
// stderr and nothing else of ours: no listening socket, database or log outlives us in a child.
#ifndef ABLATE_ORCHESTRATOR_CLI_PROCESS_H_
#define ABLATE_ORCHESTRATOR_CLI_PROCESS_H_

#include <signal.h>
#include <sys/types.h>

#include <initializer_list>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace ablate {

// Blocks `signals` in the calling thread for its life (restoring the mask after), so that they
// are taken with Wait (sigwait) instead of an async handler. Construct it before any thread
// starts: threads inherit the mask, and so the signals reach only Wait.
class BlockedSignals {
 public:
  explicit BlockedSignals(std::initializer_list<int> signals);
  ~BlockedSignals();
  BlockedSignals(const BlockedSignals&) = delete;
  BlockedSignals& operator=(const BlockedSignals&) = delete;

  // The next of the signals (blocks until one comes).
  int Wait() const;
  // The next of the signals within `timeout`; 0 when none came.
  int WaitFor(absl::Duration timeout) const;

 private:
  sigset_t set_;
  sigset_t previous_;
};

// The ablate-worker to run: `given`, else the one beside this ablate binary (/proc/self/exe);
// absolute. FailedPrecondition naming the path when it is not an executable.
absl::StatusOr<std::string> FindWorkerBinary(const std::string& given);

// Starts `args` (args[0] an absolute path) with `env` as its environment: the default signal mask,
// its own process group, SIGTERM when this process dies (PR_SET_PDEATHSIG), only stdio. Its argv
// and environment are built before fork, so that the child makes only async-signal-safe calls
// between fork and exec (the parent has gRPC threads). -1 (errno set) when fork failed.
pid_t SpawnChild(const std::vector<std::string>& args, const std::vector<std::string>& env);

// What a program printed and how it ended.
struct ProgramResult {
  int exit_code = 0;  // 128 + signal when killed
  std::string out, err;
};

// Runs args[0] (searched in PATH) with `env` as its environment (empty: ours), stdin from
// /dev/null, and collects its output. NotFound "PROGRAM not found on PATH: <not_found_hint>" when
// it is not installed.
absl::StatusOr<ProgramResult> RunProgram(const std::vector<std::string>& args,
                                         const std::vector<std::string>& env,
                                         const std::string& not_found_hint);

// "exited with code N", "was killed by signal N" (a waitpid status).
std::string ExitText(int status);

}  // namespace ablate

#endif  // ABLATE_ORCHESTRATOR_CLI_PROCESS_H_
