// The processes ablate starts: the ablate-worker binary and the local workers `ablate up` starts
// as children (orchestrator/cli/up_command.h), and the programs a cluster back end runs (sbatch,
// squeue...: slurm.h). Every child gets stdin, stdout and stderr and nothing else of ours: no
// listening socket, database or log outlives us in a child.
#ifndef ABLATE_ORCHESTRATOR_CLUSTER_PROCESS_H_
#define ABLATE_ORCHESTRATOR_CLUSTER_PROCESS_H_

#include <sys/types.h>

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace ablate {

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

#endif  // ABLATE_ORCHESTRATOR_CLUSTER_PROCESS_H_
