// The coordinator as `ablate serve` and `ablate up` run it: the flags both take, and the
// coordinator and its web dashboard, started together and stopped together (the dashboard first:
// it reads the coordinator's store).
#ifndef ABLATE_ORCHESTRATOR_CLI_SERVING_H_
#define ABLATE_ORCHESTRATOR_CLI_SERVING_H_

#include <memory>
#include <ostream>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "orchestrator/coordinator/server.h"
#include "orchestrator/dashboard/server.h"

namespace CLI {
class App;
}  // namespace CLI

namespace ablate {

// Where `serve` and `up` run the web dashboard. Its own host: a coordinator listening on every
// interface for workers (--host 0.0.0.0) does not expose the dashboard unless asked.
struct DashboardFlags {
  std::string host = "127.0.0.1";  // --dashboard-host
  int port = 8080;                 // --dashboard-port (0: no dashboard)
};

// Coordinator flags given in seconds or as text, applied to ServerOptions by ApplyServerFlags.
struct ServerFlagSeconds {
  double lease = 60;         // --lease-timeout
  double retry_backoff = 5;  // --retry-backoff
  std::string rendezvous_ports = "29500-29999";  // --rendezvous-ports LO-HI
};

// The coordinator flags `serve` and `up` share: --host, --port, --state-dir, --checkpoint-root,
// --lease-timeout, --retry-backoff, --max-attempts, --rendezvous-ports, --fsync/--no-fsync, --tls-cert, --tls-key,
// --dashboard-host and --dashboard-port (into *dashboard).
void AddServerFlags(CLI::App* cmd, ServerOptions* options, ServerFlagSeconds* seconds,
                    DashboardFlags* dashboard);
// Copies the durations and ports AddServerFlags parsed (and checked) into `options`.
void ApplyServerFlags(const ServerFlagSeconds& seconds, ServerOptions* options);

// "29500-29999" -> {29500, 29999}; InvalidArgument naming the text otherwise.
absl::StatusOr<std::pair<int, int>> ParsePortRange(const std::string& text);

class ServedCoordinator {
 public:
  // Starts the coordinator, then its dashboard on dashboard.host:dashboard.port (port 0: none)
  // over the coordinator's store and token, with the store writer's backlog in /metrics, over
  // HTTPS with the coordinator's certificate when it has one. Prints the dashboard's URL (it
  // carries the token), or why it did not start, on `out`: a port that cannot be bound is not
  // fatal to the coordinator.
  static absl::StatusOr<std::unique_ptr<ServedCoordinator>> Start(const ServerOptions& options,
                                                                  const DashboardFlags& dashboard,
                                                                  std::ostream& out);
  ~ServedCoordinator();  // Stop()

  CoordinatorServer& server() { return *server_; }
  // The dashboard, or nullptr when none runs.
  const DashboardServer* dashboard() const { return dashboard_.get(); }
  // Stops the dashboard, then the coordinator (its store flushed and closed); returns the store's
  // statistics taken just before. Idempotent (later calls return zeros).
  StoreStats Stop();

 private:
  ServedCoordinator() = default;
  std::unique_ptr<CoordinatorServer> server_;
  std::unique_ptr<DashboardServer> dashboard_;
};

}  // namespace ablate

#endif  // ABLATE_ORCHESTRATOR_CLI_SERVING_H_
