#include "orchestrator/dashboard_command.h"

#include <pthread.h>
#include <signal.h>

#include <filesystem>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "fmt/format.h"

namespace ablate {

std::unique_ptr<DashboardServer> StartCoordinatorDashboard(CoordinatorServer* server,
                                                           const std::string& host, int port,
                                                           std::ostream& out) {
  if (port <= 0) return nullptr;
  DashboardOptions o;
  o.host = host;
  o.port = port;
  o.token = server->token();
  o.reader = &server->store()->reader();
  Store* store = server->store();
  o.operator_stats = [store] {
    const StoreStats s = store->Stats();
    return std::vector<DashboardMetric>{
        {"ablate_store_queued_rows", "Rows waiting for the store's writer.", "gauge", {},
         static_cast<double>(s.queued_rows)},
        {"ablate_store_queued_writes", "Writes waiting for the store's writer.", "gauge", {},
         static_cast<double>(s.queued_writes)},
        {"ablate_store_rows_committed_total", "Rows the store's writer committed.", "counter", {},
         static_cast<double>(s.rows_committed)},
        {"ablate_store_flushes_total", "Store transactions committed.", "counter", {},
         static_cast<double>(s.flushes)},
        {"ablate_store_failed_flushes_total", "Store transactions rolled back and retried.",
         "counter", {}, static_cast<double>(s.failed_flushes)},
        {"ablate_store_dropped_writes_total",
         "Store writes refused alone inside a transaction (a stale finish, a cancelled run).",
         "counter", {}, static_cast<double>(s.dropped_writes)},
        {"ablate_store_reapplied_flushes_total",
         "Store transactions applied again, a savepoint per write, because a write failed alone.",
         "counter", {}, static_cast<double>(s.reapplied_flushes)},
        {"ablate_store_longest_transaction_seconds",
         "The longest committed store transaction; writes queued meanwhile waited that long.",
         "gauge", {}, absl::ToDoubleSeconds(s.longest_flush)}};
  };
  absl::StatusOr<std::unique_ptr<DashboardServer>> dashboard = DashboardServer::Start(o);
  if (!dashboard.ok()) {
    out << fmt::format("dashboard: not started ({}); --dashboard-port picks another port\n",
                       std::string(dashboard.status().message()))
        << std::flush;
    return nullptr;
  }
  out << fmt::format("dashboard: {}\n", (*dashboard)->Url()) << std::flush;
  return std::move(*dashboard);
}

namespace {

struct DashboardCommandOptions {
  std::string state_dir = ".ablate";
  std::string db;  // "" = STATE_DIR/ablate.db
  std::string host = "127.0.0.1";
  int port = 8080;
};

absl::Status RunDashboard(const DashboardCommandOptions& options, std::ostream& out) {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  DashboardOptions o;
  o.host = options.host;
  o.port = options.port;
  o.db_path = options.db.empty()
                  ? (std::filesystem::path(options.state_dir) / "ablate.db").string()
                  : options.db;
  if (!std::filesystem::exists(o.db_path)) {  // before a token is created for nothing
    return absl::NotFoundError(absl::StrCat("dashboard: no database at ", o.db_path));
  }
  absl::StatusOr<std::string> token = LoadOrCreateToken(options.state_dir);
  if (!token.ok()) return token.status();
  o.token = *token;
  absl::StatusOr<std::unique_ptr<DashboardServer>> dashboard = DashboardServer::Start(o);
  if (!dashboard.ok()) return dashboard.status();
  out << fmt::format("ablate dashboard: {} (read-only: {})\n", (*dashboard)->Url(), o.db_path)
      << std::flush;
  int signal = 0;
  sigwait(&signals, &signal);
  (*dashboard)->Stop();
  out << "ablate dashboard: stopped\n" << std::flush;
  return absl::OkStatus();
}

}  // namespace

void AddDashboardCommand(CLI::App* app, std::ostream* out, std::function<absl::Status()>* action) {
  CLI::App* cmd = app->add_subcommand(
      "dashboard", "Serve the web dashboard over a results database, read-only, without a "
                   "coordinator (`ablate serve` and `ablate up` start one themselves).");
  auto options = std::make_shared<DashboardCommandOptions>();
  cmd->add_option("--state-dir", options->state_dir,
                  "the state dir whose token protects the dashboard (and whose ablate.db it "
                  "serves unless --db)")
      ->capture_default_str();
  cmd->add_option("--db", options->db, "the database file to serve (default STATE_DIR/ablate.db)");
  cmd->add_option("--host", options->host, "address to listen on (0.0.0.0: every interface)")
      ->capture_default_str();
  cmd->add_option("--port,-p", options->port, "HTTP port (0: any free one)")->capture_default_str();
  cmd->callback([out, action, options] {
    *action = [out, options] { return RunDashboard(*options, *out); };
  });
}

}  // namespace ablate
