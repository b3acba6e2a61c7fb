#include "orchestrator/cli/serve_command.h"

#include <signal.h>

#include <filesystem>
#include <memory>
#include <string>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/run_logs.h"
#include "fmt/format.h"
#include "orchestrator/cli/process.h"
#include "orchestrator/cli/serving.h"

namespace ablate {

absl::Status RunServe(const ServerOptions& options, std::ostream& out,
                      const DashboardFlags& dashboard, const AlertOptions& alerts) {
  const BlockedSignals signals({SIGINT, SIGTERM});
  absl::StatusOr<std::unique_ptr<ServedCoordinator>> served =
      ServedCoordinator::Start(options, dashboard, alerts, out);
  if (!served.ok()) return served.status();
  CoordinatorServer& server = (*served)->server();
  const std::filesystem::path dir(options.state_dir);
  out << fmt::format(
             "ablate serve: listening on {}:{}{} (clients: {}); database {}, credentials {} "
             "(admin), {} (workers), {} (read-only), mode 0600; checkpoints under {}\n",
             options.host, server.port(), options.tls_cert_file.empty() ? "" : " with TLS",
             server.address(), (dir / "ablate.db").string(), (dir / "token").string(),
             (dir / kWorkerTokenFile).string(), (dir / kReadTokenFile).string(),
             CheckpointRootOf(options.state_dir, options.checkpoint_root))
      << std::flush;
  const int signal = signals.Wait();
  out << fmt::format("ablate serve: {}: shutting down\n", signal == SIGINT ? "SIGINT" : "SIGTERM")
      << std::flush;
  const StoreStats stats = (*served)->Stop();
  out << fmt::format(
             "ablate serve: stopped ({} store transactions committed, {} rows, {} rolled back and "
             "retried; the longest took {:.0f} ms)\n",
             stats.flushes, stats.rows_committed, stats.failed_flushes,
             absl::ToDoubleMilliseconds(stats.longest_flush))
      << std::flush;
  return absl::OkStatus();
}

void AddServeCommand(CLI::App* app, std::ostream* out, std::function<absl::Status()>* action) {
  CLI::App* cmd = app->add_subcommand(
      "serve", "Run the coordinator: the gRPC API workers and the CLI talk to, the scheduler and "
               "the results database. Stops cleanly on SIGINT/SIGTERM.");
  auto options = std::make_shared<ServerOptions>();
  auto seconds = std::make_shared<ServerFlagSeconds>();
  auto dashboard = std::make_shared<DashboardFlags>();
  auto alerts = std::make_shared<AlertOptions>();
  AddServerFlags(cmd, options.get(), seconds.get(), dashboard.get(), alerts.get());
  cmd->callback([out, action, options, seconds, dashboard, alerts] {
    *action = [out, options, seconds, dashboard, alerts] {
      ServerOptions o = *options;
      ApplyServerFlags(*seconds, &o);
      return RunServe(o, *out, *dashboard, *alerts);
    };
  });
}

}  // namespace ablate
