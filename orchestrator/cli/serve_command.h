// `ablate serve`: runs the coordinator (orchestrator/coordinator/server.h) until SIGINT or
// SIGTERM, then shuts down cleanly (health NOT_SERVING, in-flight calls finish, store flushed).
// Defaults need no flags on one machine: 127.0.0.1:50051, state dir ./.ablate.
#ifndef ABLATE_ORCHESTRATOR_CLI_SERVE_COMMAND_H_
#define ABLATE_ORCHESTRATOR_CLI_SERVE_COMMAND_H_

#include <functional>
#include <ostream>

#include "absl/status/status.h"

namespace CLI {
class App;
}  // namespace CLI

namespace ablate {

struct ServerOptions;   // orchestrator/coordinator/server.h
struct DashboardFlags;  // orchestrator/cli/serving.h
struct AlertOptions;    // orchestrator/alerts/alerter.h

// Starts the server and blocks until SIGINT/SIGTERM (BlockedSignals: blocked before any server
// thread starts, taken with sigwait, no async handler). With dashboard.port > 0 the web dashboard
// runs beside it (serving.h), and the alerter with `alerts`' targets and STATE_DIR/alerts.yaml's.
absl::Status RunServe(const ServerOptions& options, std::ostream& out,
                      const DashboardFlags& dashboard, const AlertOptions& alerts);

// Registers `serve` on `app`; when chosen, *action runs it. `out` must outlive *action.
void AddServeCommand(CLI::App* app, std::ostream* out, std::function<absl::Status()>* action);

}  // namespace ablate

#endif  // ABLATE_ORCHESTRATOR_CLI_SERVE_COMMAND_H_
