#include "orchestrator/cli/workers_command.h"

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "common/token_flag.h"
#include "orchestrator/cluster/launcher.h"

namespace ablate {
namespace {

// A back end of `workers launch`, and whether its flag was given.
struct BackEnd {
  std::unique_ptr<ClusterLauncher> launcher;
  bool named = false;
};

// The back end whose flag was given: NoBackEndNamed when none was, InvalidArgument for several.
absl::StatusOr<ClusterLauncher*> NamedBackEnd(const std::vector<BackEnd>& back_ends) {
  ClusterLauncher* named = nullptr;
  for (const BackEnd& b : back_ends) {
    if (!b.named) continue;
    if (named != nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("workers launch: name one back end, not --",
                                                     named->name(), " and --", b.launcher->name()));
    }
    named = b.launcher.get();
  }
  if (named == nullptr) return NoBackEndNamed();
  return named;
}

// `status` and `stop` ask every back end in turn.
absl::Status ForEachBackEnd(const std::function<absl::Status(ClusterLauncher& launcher)>& ask) {
  for (const std::unique_ptr<ClusterLauncher>& launcher : ClusterLaunchers()) {
    if (absl::Status s = ask(*launcher); !s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace

void AddWorkersCommand(CLI::App* app, std::ostream* out, std::function<absl::Status()>* action) {
  CLI::App* workers = app->add_subcommand(
      "workers",
      "Pilot workers on a cluster: `launch --slurm` submits a SLURM job array of "
      "ablate-workers that pull runs from the coordinator; `status`; `stop`.");
  workers->require_subcommand(1);
  auto state_dir_flag = [](CLI::App* cmd, WorkersOptions* o) {
    cmd->add_option("--state-dir", o->state_dir,
                    "the coordinator's state dir (address, token; slurm/ lists the pilots' jobs)")
        ->capture_default_str();
  };
  // ---- launch ----
  {
    CLI::App* cmd = workers->add_subcommand(
        "launch",
        "Submit N pilot workers as a SLURM job array. Each runs ablate-worker against "
        "the coordinator until the queue stays empty for --idle-exit seconds or SLURM "
        "signals the end of its time. See docs/cluster.md.");
    auto o = std::make_shared<WorkersOptions>();
    // Each back end: its flag (--slurm), then, after --count, its own options.
    auto back_ends = std::make_shared<std::vector<BackEnd>>();
    for (std::unique_ptr<ClusterLauncher>& launcher : ClusterLaunchers()) {
      back_ends->push_back({std::move(launcher)});
    }
    for (BackEnd& b : *back_ends) {
      cmd->add_flag("--" + b.launcher->name(), b.named, b.launcher->help());
    }
    cmd->add_option("--count,-n", o->count, "pilots to start (array tasks 0..N-1)")->required();
    for (BackEnd& b : *back_ends) b.launcher->AddLaunchFlags(cmd);
    cmd->add_option("--idle-exit", o->idle_exit_s,
                    "a pilot exits after this many seconds without a job (0: never)")
        ->capture_default_str();
    cmd->add_option("--device", o->device,
                    "cpu, cuda or cuda:N for every pilot (default cpu; cuda when --gres asks for "
                    "a GPU)");
    cmd->add_option("--slots", o->slots,
                    "devices each pilot offers to one run (e.g. 4 with --gres gpu:4): runs with "
                    "resources.devices up to this train data-parallel on one pilot")
        ->check(CLI::Range(1, 4096));
    // Where the pilots find things: paths and an address, each as given.
    const struct {
      const char* flag;
      std::string WorkersOptions::*field;
      const char* help;
    } kPilotPaths[] = {
        {"--checkpoint-root", &WorkersOptions::checkpoint_root,
         "where pilots keep checkpoints (a shared path; default: the coordinator's)"},
        {"--log-dir", &WorkersOptions::log_dir,
         "the pilots' logs, pilot-<job>_<task>.log (default STATE_DIR/slurm)"},
        {"--worker-bin", &WorkersOptions::worker_bin,
         "the ablate-worker the pilots run, on a path every node sees (default: the one beside "
         "ablate)"},
        {"--coordinator", &WorkersOptions::coordinator,
         "HOST:PORT the pilots dial (default: $ABLATE_COORDINATOR, else STATE_DIR/address)"},
        {"--tls-ca", &WorkersOptions::tls_ca,
         "CA bundle of a TLS coordinator, on a path the nodes see (default: $ABLATE_TLS_CA, else "
         "STATE_DIR/tls-ca.pem when present, else plaintext)"},
        {"--token-file", &WorkersOptions::token_file,
         "the pilots' credential (default: $ABLATE_TOKEN, else STATE_DIR/worker-token); passed to "
         "them in their environment"},
    };
    for (const auto& f : kPilotPaths) cmd->add_option(f.flag, (*o).*(f.field), f.help);
    RefuseTokenOnCommandLine(cmd);
    state_dir_flag(cmd, o.get());
    cmd->callback([out, action, o, back_ends] {
      *action = [out, o, back_ends]() -> absl::Status {
        absl::StatusOr<ClusterLauncher*> launcher = NamedBackEnd(*back_ends);
        if (!launcher.ok()) return launcher.status();
        absl::StatusOr<PilotRequest> request = ResolvePilotRequest(*o);
        if (!request.ok()) return request.status();
        return (*launcher)->Launch(*request, *out);
      };
    });
  }
  // ---- status ----
  {
    CLI::App* cmd = workers->add_subcommand(
        "status", "The pilots launched from this state dir and their SLURM state (squeue, sacct).");
    auto o = std::make_shared<WorkersOptions>();
    state_dir_flag(cmd, o.get());
    cmd->add_option("--format,-f", o->format,
                    "table (for people), or json: {jobs, pilots: [{pilot, job, state, elapsed, "
                    "time_limit, node, reason, active}], active, ended_unknown, sacct_note}")
        ->check(CLI::IsMember({"table", "json"}))
        ->capture_default_str();
    cmd->callback([out, action, o] {
      *action = [out, o] {
        return ForEachBackEnd([&](ClusterLauncher& launcher) { return launcher.Status(*o, *out); });
      };
    });
  }
  // ---- stop ----
  {
    CLI::App* cmd = workers->add_subcommand(
        "stop",
        "scancel every pending or running pilot launched from this state dir; each "
        "running one checkpoints its run and hands it back (INTERRUPTED).");
    auto o = std::make_shared<WorkersOptions>();
    state_dir_flag(cmd, o.get());
    cmd->callback([out, action, o] {
      *action = [out, o] {
        return ForEachBackEnd([&](ClusterLauncher& launcher) { return launcher.Stop(*o, *out); });
      };
    });
  }
}

}  // namespace ablate
