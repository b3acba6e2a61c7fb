// The dashboard in the `ablate` commands (docs/dashboard.md):
//  - `ablate serve --dashboard-port P` and `ablate up` start it beside the coordinator, on the
//    coordinator's store and token (StartCoordinatorDashboard);
//  - `ablate dashboard --state-dir DIR` serves a results database read-only, without a
//    coordinator (browse a finished sweep, or a copy of someone's ablate.db).
#ifndef ABLATE_ORCHESTRATOR_DASHBOARD_COMMAND_H_
#define ABLATE_ORCHESTRATOR_DASHBOARD_COMMAND_H_

#include <functional>
#include <memory>
#include <ostream>
#include <string>

#include "absl/status/status.h"
#include "orchestrator/coordinator_server.h"
#include "orchestrator/dashboard_server.h"

namespace CLI {
class App;
}  // namespace CLI

namespace ablate {

// Starts the dashboard on `server`'s store (read-only) and token, with the store writer's backlog
// in /metrics, and prints its URL (with the token) to `out`. Port 0 = no dashboard (nullptr).
// A port that cannot be bound is not fatal to the coordinator: a line says so and nullptr is
// returned. The dashboard must be stopped (destroyed) before `server` shuts down.
std::unique_ptr<DashboardServer> StartCoordinatorDashboard(CoordinatorServer* server,
                                                           const std::string& host, int port,
                                                           std::ostream& out);

// Registers `dashboard` on `app`; when chosen, *action serves until SIGINT/SIGTERM.
void AddDashboardCommand(CLI::App* app, std::ostream* out, std::function<absl::Status()>* action);

}  // namespace ablate

#endif  // ABLATE_ORCHESTRATOR_DASHBOARD_COMMAND_H_
