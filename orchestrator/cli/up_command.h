// `ablate up [--workers N]`: the coordinator (as `ablate serve`) and N local
// `ablate-worker --coordinator` child processes, one command that needs nothing else. Prints the
// coordinator's address. SIGINT (Ctrl-C) or SIGTERM stops all: each worker gets SIGTERM (it
// checkpoints its run, flushes its reports and hands the run back as INTERRUPTED, to resume on
// the next start), then the coordinator shuts down; a second signal, or workers still running
// after the grace period, get SIGKILL. A worker that exits by itself is reported and not
// restarted. ablate-worker is the one beside the `ablate` binary unless given.
//
// The workers run in their own process group (a terminal's Ctrl-C reaches only `ablate up`,
// which then signals each worker once) and get SIGTERM should `ablate up` die (PR_SET_PDEATHSIG).
// They receive the token in their environment (ABLATE_TOKEN), never on their command line.
#ifndef ABLATE_ORCHESTRATOR_CLI_UP_COMMAND_H_
#define ABLATE_ORCHESTRATOR_CLI_UP_COMMAND_H_

#include <functional>
#include <ostream>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "orchestrator/cli/serving.h"
#include "orchestrator/coordinator/server.h"

namespace CLI {
class App;
}  // namespace CLI

namespace ablate {

struct UpOptions {
  ServerOptions server;
  int workers = 1;              // local worker processes (0: the coordinator alone)
  std::string device;           // --device for every worker ("" = each job's train.device)
  int slots = 0;                // --slots of every worker (0: the worker's default)
  std::string worker_bin;       // "" = ablate-worker beside this executable
  absl::Duration stop_grace = absl::Seconds(60);  // then SIGKILL
  DashboardFlags dashboard;     // where the web dashboard listens (port 0: none)
  AlertOptions alerts;          // --alert-webhook, --alert-command
};

// Runs until SIGINT/SIGTERM (blocked in the calling thread before any thread starts, taken with
// sigwait, as `ablate serve` does). FailedPrecondition when ablate-worker is missing.
absl::Status RunUp(const UpOptions& options, std::ostream& out);

// Registers `up` on `app`; when chosen, *action runs it. `out` must outlive *action.
void AddUpCommand(CLI::App* app, std::ostream* out, std::function<absl::Status()>* action);

}  // namespace ablate

#endif  // ABLATE_ORCHESTRATOR_CLI_UP_COMMAND_H_
