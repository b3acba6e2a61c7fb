#include "orchestrator/serve_command.h"

#include <pthread.h>
#include <signal.h>

#include <filesystem>
#include <memory>
#include <string>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "fmt/format.h"
#include "orchestrator/dashboard_command.h"

namespace ablate {

absl::Status RunServe(const ServerOptions& options, std::ostream& out, int dashboard_port) {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  absl::StatusOr<std::unique_ptr<CoordinatorServer>> server = CoordinatorServer::Start(options);
  if (!server.ok()) return server.status();
  const std::filesystem::path dir(options.state_dir);
  out << fmt::format(
             "ablate serve: listening on {}:{}{} (clients: {}); database {}, token {} (mode 0600), "
             "checkpoints under {}\n",
             options.host, (*server)->port(), options.tls_cert_file.empty() ? "" : " with TLS",
             (*server)->address(),
             (dir / "ablate.db").string(), (dir / "token").string(),
             options.checkpoint_root.empty() ? (dir / "checkpoints").string()
                                             : options.checkpoint_root)
      << std::flush;
  std::unique_ptr<DashboardServer> dashboard =
      StartCoordinatorDashboard(server->get(), options.host, dashboard_port, out);
  int signal = 0;
  sigwait(&signals, &signal);
  out << fmt::format("ablate serve: {}: shutting down\n", signal == SIGINT ? "SIGINT" : "SIGTERM")
      << std::flush;
  dashboard.reset();  // it reads the coordinator's store
  const StoreStats stats = (*server)->store()->Stats();  // Shutdown closes the store
  (*server)->Shutdown();
  out << fmt::format(
             "ablate serve: stopped ({} store transactions committed, {} rows, {} rolled back and "
             "retried; the longest took {:.0f} ms)\n",
             stats.flushes, stats.rows_committed, stats.failed_flushes,
             absl::ToDoubleMilliseconds(stats.longest_flush))
      << std::flush;
  return absl::OkStatus();
}

void AddServerFlags(CLI::App* cmd, ServerOptions* options, ServerFlagSeconds* seconds,
                    int* dashboard_port) {
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
  cmd->add_flag("--fsync,!--no-fsync", options->synchronous_full,
                "fsync the database at every group commit: acknowledged writes survive a power "
                "loss (--no-fsync: they survive a crash of the coordinator, and the OS writes "
                "them back; several times the job throughput on slow disks, docs/operations.md)")
      ->capture_default_str();
  CLI::Option* cert = cmd->add_option("--tls-cert", options->tls_cert_file,
                                      "serve gRPC over TLS with this PEM certificate (its "
                                      "subjectAltName must name the address clients dial)");
  CLI::Option* key = cmd->add_option("--tls-key", options->tls_key_file,
                                     "the PEM private key of --tls-cert");
  cert->needs(key);
  key->needs(cert);
  cmd->add_option("--dashboard-port", *dashboard_port,
                  "port of the web dashboard on --host (0: no dashboard); its URL carries the token")
      ->capture_default_str();
}

void ApplyServerFlags(const ServerFlagSeconds& seconds, ServerOptions* options) {
  options->coordinator.scheduler.lease_timeout = absl::Seconds(seconds.lease);
  options->coordinator.scheduler.retry_base = absl::Seconds(seconds.retry_backoff);
}

void AddServeCommand(CLI::App* app, std::ostream* out, std::function<absl::Status()>* action) {
  CLI::App* cmd = app->add_subcommand(
      "serve", "Run the coordinator: the gRPC API workers and the CLI talk to, the scheduler and "
               "the results database. Stops cleanly on SIGINT/SIGTERM.");
  auto options = std::make_shared<ServerOptions>();
  auto seconds = std::make_shared<ServerFlagSeconds>();
  auto dashboard_port = std::make_shared<int>(8080);
  AddServerFlags(cmd, options.get(), seconds.get(), dashboard_port.get());
  cmd->callback([out, action, options, seconds, dashboard_port] {
    *action = [out, options, seconds, dashboard_port] {
      ServerOptions o = *options;
      ApplyServerFlags(*seconds, &o);
      return RunServe(o, *out, *dashboard_port);
    };
  });
}

}  // namespace ablate
