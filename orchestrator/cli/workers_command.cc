#include "common/token_flag.h"
#include "orchestrator/cli/workers_command.h"

#include <memory>

#include "CLI/CLI.hpp"
#include "orchestrator/cli/slurm.h"

namespace ablate {

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
    PilotScriptOptions& p = o->pilot;
    cmd->add_flag("--slurm", o->slurm, "submit through SLURM's sbatch (the only back end so far)");
    cmd->add_option("--count,-n", p.count, "pilots to start (array tasks 0..N-1)")->required();
    cmd->add_option("--partition", p.partition, "sbatch --partition");
    cmd->add_option("--gres", p.gres, "sbatch --gres, e.g. gpu:1 (a GPU pilot trains on cuda)");
    cmd->add_option("--time", p.time, "sbatch --time, e.g. 4:00:00");
    cmd->add_option("--cpus-per-task", p.cpus_per_task, "sbatch --cpus-per-task")
        ->capture_default_str();
    cmd->add_option("--mem", p.mem, "sbatch --mem, e.g. 16G");
    cmd->add_option("--extra", o->extra,
                    "more sbatch arguments, after ours (they win): --extra=\"--qos=high "
                    "--account=lab\"");
    cmd->add_option("--signal-before", p.signal_before_s,
                    "seconds before the time limit SLURM sends SIGTERM (the worker checkpoints "
                    "and hands its run back)")
        ->capture_default_str();
    cmd->add_option("--idle-exit", p.idle_exit_s,
                    "a pilot exits after this many seconds without a job (0: never)")
        ->capture_default_str();
    cmd->add_option("--device", p.device,
                    "cpu, cuda or cuda:N for every pilot (default cpu; cuda when --gres asks for "
                    "a GPU)");
    cmd->add_option("--slots", p.slots,
                    "devices each pilot offers to one run (e.g. 4 with --gres gpu:4): runs with "
                    "resources.devices up to this train data-parallel on one pilot")
        ->check(CLI::Range(1, 4096));
    cmd->add_option("--checkpoint-root", p.checkpoint_root,
                    "where pilots keep checkpoints (a shared path; default: the coordinator's)");
    cmd->add_option("--log-dir", p.log_dir,
                    "the pilots' logs, pilot-<job>_<task>.log (default STATE_DIR/slurm)");
    cmd->add_option("--worker-bin", o->worker_bin,
                    "the ablate-worker the pilots run, on a path every node sees (default: the "
                    "one beside ablate)");
    cmd->add_option("--coordinator", o->coordinator,
                    "HOST:PORT the pilots dial (default: $ABLATE_COORDINATOR, else "
                    "STATE_DIR/address)");
    cmd->add_option("--tls-ca", o->tls_ca,
                    "CA bundle of a TLS coordinator, on a path the nodes see (default: "
                    "$ABLATE_TLS_CA, else STATE_DIR/tls-ca.pem when present, else plaintext)");
    cmd->add_option("--token-file", o->token_file,
                    "the pilots' credential (default: $ABLATE_TOKEN, else "
                    "STATE_DIR/worker-token); passed to them in their environment");
    RefuseTokenOnCommandLine(cmd);
    state_dir_flag(cmd, o.get());
    cmd->callback([out, action, o] { *action = [out, o] { return RunWorkersLaunch(*o, *out); }; });
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
    cmd->callback([out, action, o] { *action = [out, o] { return RunWorkersStatus(*o, *out); }; });
  }
  // ---- stop ----
  {
    CLI::App* cmd = workers->add_subcommand(
        "stop",
        "scancel every pending or running pilot launched from this state dir; each "
        "running one checkpoints its run and hands it back (INTERRUPTED).");
    auto o = std::make_shared<WorkersOptions>();
    state_dir_flag(cmd, o.get());
    cmd->callback([out, action, o] { *action = [out, o] { return RunWorkersStop(*o, *out); }; });
  }
}

}  // namespace ablate
