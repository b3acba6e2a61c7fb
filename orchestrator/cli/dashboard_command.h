// `ablate dashboard --state-dir DIR`: the web dashboard (docs/dashboard.md) over a results
// database, read-only, without a coordinator (browse a finished sweep, or a copy of someone's
// ablate.db). `ablate serve` and `ablate up` start the same dashboard beside the coordinator
// (serving.h).
#ifndef ABLATE_ORCHESTRATOR_CLI_DASHBOARD_COMMAND_H_
#define ABLATE_ORCHESTRATOR_CLI_DASHBOARD_COMMAND_H_

#include <functional>
#include <ostream>

#include "absl/status/status.h"

namespace CLI {
class App;
}  // namespace CLI

namespace ablate {

// Registers `dashboard` on `app`; when chosen, *action serves until SIGINT/SIGTERM.
void AddDashboardCommand(CLI::App* app, std::ostream* out, std::function<absl::Status()>* action);

}  // namespace ablate

#endif  // ABLATE_ORCHESTRATOR_CLI_DASHBOARD_COMMAND_H_
