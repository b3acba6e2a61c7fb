#include "orchestrator/cli/dashboard_command.h"

#include <signal.h>

#include <filesystem>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/credentials.h"
#include "common/run_logs.h"
#include "common/state_dir.h"
#include "fmt/format.h"
#include "orchestrator/cli/process.h"
#include "orchestrator/dashboard/server.h"

namespace ablate {

namespace {

struct DashboardCommandOptions {
  std::string state_dir = ".ablate";
  std::string db;               // "" = STATE_DIR/ablate.db
  std::string checkpoint_root;  // "" = STATE_DIR/checkpoints (program runs' logs)
  std::string host = "127.0.0.1";
  int port = 8080;
  std::string tls_cert, tls_key;  // HTTPS when both are given
};

absl::Status RunDashboard(const DashboardCommandOptions& options, std::ostream& out) {
  const BlockedSignals signals({SIGINT, SIGTERM});
  DashboardOptions o;
  o.host = options.host;
  o.port = options.port;
  o.tls_cert_file = options.tls_cert;
  o.tls_key_file = options.tls_key;
  o.db_path = options.db.empty()
                  ? (std::filesystem::path(options.state_dir) / "ablate.db").string()
                  : options.db;
  o.checkpoint_root = CheckpointRootOf(options.state_dir, options.checkpoint_root);
  if (!std::filesystem::exists(o.db_path)) {  // before a token is created for nothing
    return absl::NotFoundError(absl::StrCat("dashboard: no database at ", o.db_path));
  }
  absl::StatusOr<Credentials> credentials = LoadOrCreateCredentials(options.state_dir);
  if (!credentials.ok()) return credentials.status();
  o.token = credentials->read;  // what the URL carries
  o.also_accepted = {credentials->admin};
  absl::StatusOr<std::unique_ptr<DashboardServer>> dashboard = DashboardServer::Start(o);
  if (!dashboard.ok()) return dashboard.status();
  out << fmt::format("ablate dashboard: {} (read-only: {})\n", (*dashboard)->Url(), o.db_path)
      << std::flush;
  signals.Wait();
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
  cmd->add_option("--checkpoint-root", options->checkpoint_root,
                  "where runs' checkpoints live, for program runs' logs on the run page (default "
                  "STATE_DIR/checkpoints)");
  cmd->add_option("--host,--dashboard-host", options->host,
                  "address to listen on (0.0.0.0: every interface)")
      ->capture_default_str();
  cmd->add_option("--port,-p,--dashboard-port", options->port, "HTTP port (0: any free one)")
      ->capture_default_str();
  CLI::Option* cert = cmd->add_option("--tls-cert", options->tls_cert,
                                      "serve HTTPS with this PEM certificate (chain)");
  CLI::Option* key = cmd->add_option("--tls-key", options->tls_key,
                                     "the PEM private key of --tls-cert");
  cert->needs(key);
  key->needs(cert);
  cmd->callback([out, action, options] {
    *action = [out, options] { return RunDashboard(*options, *out); };
  });
}

}  // namespace ablate
