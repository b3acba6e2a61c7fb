#include "orchestrator/cli/serving.h"

#include <filesystem>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "common/run_logs.h"
#include "fmt/format.h"
#include "orchestrator/alerts/delivery.h"
#include "orchestrator/dashboard/metrics.h"

namespace ablate {

void AddServerFlags(CLI::App* cmd, ServerOptions* options, ServerFlagSeconds* seconds,
                    DashboardFlags* dashboard, AlertOptions* alerts) {
  cmd->add_option("--host", options->host, "address to listen on (0.0.0.0: every interface)")
      ->capture_default_str();
  cmd->add_option("--port,-p", options->port, "port (0: any free one; see STATE_DIR/address)")
      ->capture_default_str();
  cmd->add_option("--state-dir", options->state_dir,
                  "database (ablate.db), token, address file, checkpoints/")
      ->capture_default_str();
  cmd->add_option("--checkpoint-root", options->checkpoint_root,
                  "where runs' checkpoints live (default STATE_DIR/checkpoints; a shared "
                  "filesystem path on clusters)");
  cmd->add_option("--lease-timeout", seconds->lease,
                  "seconds without a report after which a running job is LOST")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--retry-backoff", seconds->retry_backoff,
                  "seconds before a lost or failed run is retried, doubling per attempt (up to "
                  "5 minutes)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--max-attempts", options->coordinator.scheduler.max_attempts,
                  "attempts (lost or failed) before a run is FAILED")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--rendezvous-ports", seconds->rendezvous_ports,
                  "ports LO-HI a run wider than any one worker may take for its rendezvous on "
                  "its rank 0 worker (open them between workers)")
      ->capture_default_str()
      ->check([](const std::string& text) -> std::string {
        return ParsePortRange(text).ok() ? "" : std::string(ParsePortRange(text).status().message());
      });
  cmd->add_flag("--fsync,!--no-fsync", options->synchronous_full,
                "fsync the database at every group commit: acknowledged writes survive a power "
                "loss (--no-fsync: they survive a crash of the coordinator, and the OS writes "
                "them back; several times the job throughput on slow disks, docs/operations.md)")
      ->capture_default_str();
  CLI::Option* cert = cmd->add_option("--tls-cert", options->tls_cert_file,
                                      "serve gRPC, and the dashboard as HTTPS, over TLS with this "
                                      "PEM certificate (its subjectAltName must name the address "
                                      "clients dial)");
  CLI::Option* key = cmd->add_option("--tls-key", options->tls_key_file,
                                     "the PEM private key of --tls-cert");
  cert->needs(key);
  key->needs(cert);
  cmd->add_option("--dashboard-host", dashboard->host,
                  "address the web dashboard listens on, whatever --host is (0.0.0.0: every "
                  "interface)")
      ->capture_default_str();
  cmd->add_option("--dashboard-port", dashboard->port,
                  "port of the web dashboard (0: no dashboard); its URL carries the token")
      ->capture_default_str();
  cmd->add_option("--alert-webhook", alerts->webhooks,
                  "POST a JSON alert to this http(s) URL when a run diverges, fails or first "
                  "spikes, and when a sweep ends (repeatable; also `webhooks:` in "
                  "STATE_DIR/alerts.yaml; docs/operations.md)")
      ->take_all()
      ->allow_extra_args(false);
  cmd->add_option("--alert-command", alerts->commands,
                  "run this shell command for each alert, the JSON on stdin and ABLATE_ALERT_KIND, "
                  "_SWEEP, _RUN_ID, _VARIANT, _SEED, _STEP, _TEXT, _URL in its environment "
                  "(repeatable; also `commands:` in STATE_DIR/alerts.yaml)")
      ->take_all()
      ->allow_extra_args(false);
}

void ApplyServerFlags(const ServerFlagSeconds& seconds, ServerOptions* options) {
  options->coordinator.scheduler.lease_timeout = absl::Seconds(seconds.lease);
  options->coordinator.scheduler.retry_base = absl::Seconds(seconds.retry_backoff);
  if (absl::StatusOr<std::pair<int, int>> ports = ParsePortRange(seconds.rendezvous_ports);
      ports.ok()) {
    options->coordinator.rendezvous_ports = *ports;
  }
}

absl::StatusOr<std::pair<int, int>> ParsePortRange(const std::string& text) {
  const std::vector<std::string> parts = absl::StrSplit(text, '-');
  int lo = 0, hi = 0;
  if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &lo) || !absl::SimpleAtoi(parts[1], &hi) ||
      lo < 1 || hi > 65535 || lo > hi) {
    return absl::InvalidArgumentError(absl::StrCat(
        "\"", text, "\": expected LO-HI with 1 <= LO <= HI <= 65535"));
  }
  return std::pair{lo, hi};
}

namespace {

// The dashboard of `server`, or nullptr (none asked for, or its port could not be bound).
// The alerts' counts for /metrics.
std::vector<DashboardMetric> AlertMetrics(const AlertStats& s) {
  const char* help = "Alert deliveries (alert x target), by how they ended.";
  return {{"ablate_alerts_total", help, "counter", {{"outcome", "delivered"}},
           static_cast<double>(s.delivered)},
          {"ablate_alerts_total", help, "counter", {{"outcome", "failed"}},
           static_cast<double>(s.failed)},
          {"ablate_alerts_total", help, "counter", {{"outcome", "dropped"}},
           static_cast<double>(s.dropped)},
          {"ablate_alerts_queued", "Alert deliveries waiting or being tried.", "gauge", {},
           static_cast<double>(s.queued)}};
}

// `alerter` (may be null) must outlive the dashboard.
std::unique_ptr<DashboardServer> StartDashboard(CoordinatorServer* server,
                                                const ServerOptions& options,
                                                const DashboardFlags& flags,
                                                const Alerter* alerter, std::ostream& out) {
  if (flags.port <= 0) return nullptr;
  DashboardOptions o;
  o.host = flags.host;
  o.port = flags.port;
  // The URL carries the read-only credential; the admin one is accepted in the header (curl).
  o.token = server->credentials().read;
  o.also_accepted = {server->credentials().admin};
  o.tls_cert_file = options.tls_cert_file;
  o.tls_key_file = options.tls_key_file;
  o.reader = &server->store()->reader();
  // The run page's logs: where this machine's workers (`ablate up`'s among them) keep them.
  o.checkpoint_root = CheckpointRootOf(options.state_dir, options.checkpoint_root);
  Store* store = server->store();
  o.operator_stats = [store, alerter] {
    std::vector<DashboardMetric> metrics = StoreMetrics(store->Stats());
    if (alerter != nullptr) {
      const std::vector<DashboardMetric> more = AlertMetrics(alerter->Stats());
      metrics.insert(metrics.end(), more.begin(), more.end());
    }
    return metrics;
  };
  o.live_slots_in_use = [core = server->core()](int64_t worker_id) {
    return core->SlotsInUse(worker_id);
  };
  absl::StatusOr<std::unique_ptr<DashboardServer>> dashboard = DashboardServer::Start(o);
  if (!dashboard.ok()) {
    out << fmt::format("dashboard: not started ({}); --dashboard-host and --dashboard-port pick "
                       "another address\n",
                       std::string(dashboard.status().message()))
        << std::flush;
    return nullptr;
  }
  out << fmt::format("dashboard: {}\n", (*dashboard)->Url()) << std::flush;
  return std::move(*dashboard);
}

}  // namespace

absl::StatusOr<std::unique_ptr<ServedCoordinator>> ServedCoordinator::Start(
    const ServerOptions& options, const DashboardFlags& dashboard, const AlertOptions& alerts,
    std::ostream& out) {
  AlertOptions alert_options = alerts;
  const std::string alerts_file = (std::filesystem::path(options.state_dir) / kAlertsFile).string();
  if (absl::Status s = ReadAlertsFile(alerts_file, &alert_options); !s.ok()) return s;
  // The targets are checked before anything starts: a mistyped URL is an error at once, not a
  // silent loss at the first divergence.
  for (const std::string& url : alert_options.webhooks) {
    if (absl::StatusOr<WebhookUrl> parsed = ParseWebhookUrl(url); !parsed.ok()) {
      return parsed.status();
    }
  }
  absl::StatusOr<std::unique_ptr<CoordinatorServer>> server = CoordinatorServer::Start(options);
  if (!server.ok()) return server.status();
  std::unique_ptr<ServedCoordinator> served(new ServedCoordinator());
  served->server_ = *std::move(server);
  // The alerter starts before the dashboard, whose /metrics reads it: the pages' address is
  // the one the dashboard is asked to listen on, as Url() prints it, without the token.
  if (dashboard.port > 0) {
    alert_options.dashboard_url =
        DashboardBaseUrl(dashboard.host, dashboard.port, !options.tls_cert_file.empty());
  }
  absl::StatusOr<std::unique_ptr<Alerter>> alerter =
      Alerter::Start(served->server_->store(), alert_options);
  if (!alerter.ok()) return alerter.status();
  served->alerter_ = *std::move(alerter);
  if (const std::vector<std::string> targets = served->alerter_->targets(); !targets.empty()) {
    out << fmt::format("alerts: to {}\n", absl::StrJoin(targets, ", ")) << std::flush;
  }
  served->dashboard_ =
      StartDashboard(served->server_.get(), options, dashboard, served->alerter_.get(), out);
  return served;
}

ServedCoordinator::~ServedCoordinator() { Stop(); }

StoreStats ServedCoordinator::Stop() {
  dashboard_.reset();  // it reads the coordinator's store and the alerter's counts
  if (alerter_ != nullptr) alerter_->Stop();  // it writes to the store
  if (server_ == nullptr) return StoreStats();
  const StoreStats stats = server_->store()->Stats();  // Shutdown closes the store
  server_->Shutdown();
  server_.reset();
  return stats;
}

}  // namespace ablate
