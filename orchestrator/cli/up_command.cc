#include "orchestrator/cli/up_command.h"

#include <signal.h>
#include <sys/wait.h>

#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "fmt/format.h"
#include "orchestrator/cli/process.h"
#include "orchestrator/cli/serving.h"
#include "orchestrator/cluster/process.h"
#include "proto/tls.h"

extern char** environ;

namespace ablate {

namespace fs = std::filesystem;

namespace {

// The workers' environment: ours, with the coordinator's worker token and no stale address.
std::vector<std::string> WorkerEnvironment(const std::string& token) {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    if (absl::StartsWith(*e, "ABLATE_TOKEN=") || absl::StartsWith(*e, "ABLATE_COORDINATOR="))
      continue;
    env.emplace_back(*e);
  }
  env.push_back("ABLATE_TOKEN=" + token);
  return env;
}

// Starts options.workers workers of `worker_bin` against the coordinator at `address`, saying so
// on `out`: pid -> name of each that started (one that cannot start is said and left out).
std::map<pid_t, std::string> StartWorkers(const UpOptions& options, const std::string& worker_bin,
                                          const std::string& address, const std::string& token,
                                          std::ostream& out) {
  const fs::path state(options.server.state_dir);
  const std::vector<std::string> env = WorkerEnvironment(token);
  std::map<pid_t, std::string> running;
  for (int i = 1; i <= options.workers; ++i) {
    const std::string name = absl::StrCat("up-", i);
    // Every worker is on this machine: a gang's rendezvous (a run wider than one worker) is
    // reached on loopback.
    std::vector<std::string> args = {worker_bin, "--coordinator",     address,    "--name",
                                     name,       "--rendezvous-host", "127.0.0.1"};
    if (!options.server.tls_cert_file.empty()) {
      args.insert(args.end(), {"--tls-ca", (state / kTlsCaFile).string()});
    }
    if (!options.device.empty()) args.insert(args.end(), {"--device", options.device});
    if (options.slots > 0) args.insert(args.end(), {"--slots", std::to_string(options.slots)});
    const pid_t pid = SpawnChild(args, env);
    if (pid < 0) {
      out << fmt::format("ablate up: cannot start worker {}: {}\n", name, std::strerror(errno));
      continue;
    }
    out << fmt::format("ablate up: worker {}: pid {}\n", name, pid) << std::flush;
    running[pid] = name;
  }
  return running;
}

}  // namespace

absl::Status RunUp(const UpOptions& options, std::ostream& out) {
  if (options.workers < 0) return absl::InvalidArgumentError("--workers must be >= 0");
  std::string worker_bin;
  if (options.workers > 0) {
    absl::StatusOr<std::string> found = FindWorkerBinary(options.worker_bin);
    if (!found.ok()) return found.status();
    worker_bin = *found;
  }

  const BlockedSignals signals({SIGINT, SIGTERM, SIGCHLD});

  absl::StatusOr<std::unique_ptr<ServedCoordinator>> served =
      ServedCoordinator::Start(options.server, options.dashboard, options.alerts, out);
  if (!served.ok()) return served.status();
  const CoordinatorServer& server = (*served)->server();
  const fs::path state(options.server.state_dir);
  out << fmt::format(
             "ablate up: coordinator on {} (database {}, token {}); {} worker{}; Ctrl-C "
             "stops all\n",
             server.address(), (state / "ablate.db").string(), (state / "token").string(),
             options.workers, options.workers == 1 ? "" : "s")
      << std::flush;

  std::map<pid_t, std::string> running =  // pid -> the worker's name
      StartWorkers(options, worker_bin, server.address(), server.credentials().worker, out);
  auto reap = [&](bool announce) {
    // Its own workers only: waitpid(-1) would also reap an alert command (orchestrator/alerts)
    // from under the thread that waits for it.
    for (auto it = running.begin(); it != running.end();) {
      int status = 0;
      const pid_t pid = it->first;
      if (::waitpid(pid, &status, WNOHANG) != pid) {
        ++it;
        continue;
      }
      if (announce) {
        out << fmt::format("ablate up: worker {} (pid {}) {}\n", it->second, pid, ExitText(status))
            << std::flush;
      }
      it = running.erase(it);
    }
  };

  int signal = 0;
  while ((signal = signals.Wait()) == SIGCHLD) reap(/*announce=*/true);
  out << fmt::format(
             "ablate up: {}: stopping {} worker{} (each checkpoints its run), then the "
             "coordinator\n",
             signal == SIGINT ? "SIGINT" : "SIGTERM", running.size(),
             running.size() == 1 ? "" : "s")
      << std::flush;
  for (const auto& [pid, name] : running) ::kill(pid, SIGTERM);
  const absl::Time give_up = absl::Now() + options.stop_grace;
  bool killed = false;
  while (!running.empty()) {
    reap(/*announce=*/false);
    if (running.empty()) break;
    const absl::Duration left = give_up - absl::Now();
    if (!killed && left <= absl::ZeroDuration()) {
      out << "ablate up: workers still running after the grace period: killing them\n"
          << std::flush;
      for (const auto& [pid, name] : running) ::kill(pid, SIGKILL);
      killed = true;
    }
    const int got =
        signals.WaitFor(std::min(std::max(left, absl::Milliseconds(10)), absl::Milliseconds(200)));
    if ((got == SIGINT || got == SIGTERM) && !killed) {
      out << "ablate up: second signal: killing the workers\n" << std::flush;
      for (const auto& [pid, name] : running) ::kill(pid, SIGKILL);
      killed = true;
    }
  }
  (*served)->Stop();
  out << "ablate up: stopped\n" << std::flush;
  return absl::OkStatus();
}

void AddUpCommand(CLI::App* app, std::ostream* out, std::function<absl::Status()>* action) {
  CLI::App* cmd = app->add_subcommand(
      "up",
      "Run the coordinator and N local workers in one command; Ctrl-C stops all (runs in "
      "progress are checkpointed and resume on the next start).");
  auto options = std::make_shared<UpOptions>();
  auto seconds = std::make_shared<ServerFlagSeconds>();
  cmd->add_option("--workers,-w", options->workers, "local ablate-worker processes")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--device", options->device, "cpu, cuda or cuda:N for every worker's jobs");
  cmd->add_option("--slots", options->slots,
                  "slots of every worker: each holds up to that many jobs side by side "
                  "(docs/worker.md, \"Slots\")")
      ->check(CLI::Range(1, 4096));
  AddServerFlags(cmd, &options->server, seconds.get(), &options->dashboard, &options->alerts);
  cmd->add_option("--worker-bin", options->worker_bin,
                  "the ablate-worker to run (default: the one beside ablate)");
  cmd->callback([out, action, options, seconds] {
    *action = [out, options, seconds] {
      UpOptions o = *options;
      ApplyServerFlags(*seconds, &o.server);
      return RunUp(o, *out);
    };
  });
}

}  // namespace ablate
