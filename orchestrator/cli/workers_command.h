// `ablate workers launch --slurm | status | stop`: the command line of the pilot workers of a
// cluster (docs/cluster.md), whose back ends (SLURM's) it knows only through
// orchestrator/cluster/launcher.h.
#ifndef ABLATE_ORCHESTRATOR_CLI_WORKERS_COMMAND_H_
#define ABLATE_ORCHESTRATOR_CLI_WORKERS_COMMAND_H_

#include <functional>
#include <ostream>

#include "absl/status/status.h"

namespace CLI {
class App;
}  // namespace CLI

namespace ablate {

// Registers `workers` (launch, status, stop) on `app`; the chosen one sets *action. `out` must
// outlive it.
void AddWorkersCommand(CLI::App* app, std::ostream* out, std::function<absl::Status()>* action);

}  // namespace ablate

#endif  // ABLATE_ORCHESTRATOR_CLI_WORKERS_COMMAND_H_
