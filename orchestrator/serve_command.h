// `ablate serve`: runs the coordinator (orchestrator/coordinator_server.h) until SIGINT or
// SIGTERM, then shuts down cleanly (health NOT_SERVING, in-flight calls finish, store flushed).
// Defaults need no flags on one machine: 127.0.0.1:50051, state dir ./.ablate.
#ifndef ABLATE_ORCHESTRATOR_SERVE_COMMAND_H_
#define ABLATE_ORCHESTRATOR_SERVE_COMMAND_H_

#include <functional>
#include <ostream>

#include "absl/status/status.h"
#include "orchestrator/coordinator_server.h"

namespace CLI {
class App;
}  // namespace CLI

namespace ablate {

// Starts the server and blocks until SIGINT/SIGTERM. The signals are blocked in the calling
// thread before any server thread starts (so those threads inherit the mask) and taken with
// sigwait: no async handler runs.
// With dashboard_port > 0 the web dashboard runs beside it (orchestrator/dashboard_command.h).
absl::Status RunServe(const ServerOptions& options, std::ostream& out, int dashboard_port = 0);

// Coordinator flags given in seconds, applied to ServerOptions by ApplyServerFlags.
struct ServerFlagSeconds {
  double lease = 60;         // --lease-timeout
  double retry_backoff = 5;  // --retry-backoff
};

// The coordinator flags `serve` and `up` share: --host, --port, --state-dir, --checkpoint-root,
// --lease-timeout, --retry-backoff, --max-attempts, --fsync/--no-fsync, --tls-cert, --tls-key,
// --dashboard-port (into *dashboard_port).
void AddServerFlags(CLI::App* cmd, ServerOptions* options, ServerFlagSeconds* seconds,
                    int* dashboard_port);
// Copies the durations AddServerFlags parsed into `options`.
void ApplyServerFlags(const ServerFlagSeconds& seconds, ServerOptions* options);

// Registers `serve` on `app`; when chosen, *action runs it. `out` must outlive *action.
void AddServeCommand(CLI::App* app, std::ostream* out, std::function<absl::Status()>* action);

}  // namespace ablate

#endif  // ABLATE_ORCHESTRATOR_SERVE_COMMAND_H_
