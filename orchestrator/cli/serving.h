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
#include "orchestrator/alerts/alerter.h"
#include "orchestrator/coordinator/server.h"
#include "orchestrator/dashboard/server.h"

namespace CLI {
class App;
}  // namespace CLI

namespace ablate {

// The alert file in a state dir (ReadAlertsFile).
inline constexpr char kAlertsFile[] = "alerts.yaml";

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
// --lease-timeout, --retry-backoff, --max-attempts, --rendezvous-ports, --fsync/--no-fsync,
// --tls-cert, --tls-key, --dashboard-host and --dashboard-port (into *dashboard),
// --alert-webhook and --alert-command (into *alerts; repeatable).
void AddServerFlags(CLI::App* cmd, ServerOptions* options, ServerFlagSeconds* seconds,
                    DashboardFlags* dashboard, AlertOptions* alerts);
// Copies the durations and ports AddServerFlags parsed (and checked) into `options`.
void ApplyServerFlags(const ServerFlagSeconds& seconds, ServerOptions* options);

// "29500-29999" -> {29500, 29999}; InvalidArgument naming the text otherwise.
absl::StatusOr<std::pair<int, int>> ParsePortRange(const std::string& text);

class ServedCoordinator {
 public:
  // Starts the coordinator, then its dashboard on dashboard.host:dashboard.port (port 0: none)
  // over the coordinator's store and token, with the store writer's backlog and the alerts'
  // counts in /metrics, over HTTPS with the coordinator's certificate when it has one. Prints the
  // dashboard's URL (it carries the token), or why it did not start, on `out`: a port that
  // cannot be bound is not fatal to the coordinator. Then the alerter, on `alerts` and the
  // targets of STATE_DIR/alerts.yaml (a bad file or target fails the start, naming it).
  static absl::StatusOr<std::unique_ptr<ServedCoordinator>> Start(const ServerOptions& options,
                                                                  const DashboardFlags& dashboard,
                                                                  const AlertOptions& alerts,
                                                                  std::ostream& out);
  ~ServedCoordinator();  // Stop()

  CoordinatorServer& server() { return *server_; }
  // The dashboard, or nullptr when none runs.
  const DashboardServer* dashboard() const { return dashboard_.get(); }
  const Alerter& alerter() const { return *alerter_; }
  // Stops the dashboard, the alerter, then the coordinator (its store flushed and closed); returns the store's
  // statistics taken just before. Idempotent (later calls return zeros).
  StoreStats Stop();

 private:
  ServedCoordinator() = default;
  std::unique_ptr<CoordinatorServer> server_;
  std::unique_ptr<DashboardServer> dashboard_;
  std::unique_ptr<Alerter> alerter_;
};

}  // namespace ablate

#endif  // ABLATE_ORCHESTRATOR_CLI_SERVING_H_
