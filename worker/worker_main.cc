// ablate-worker: `--coordinator HOST:PORT` pulls jobs from a coordinator (worker/agent/agent.h);
// `train` runs one config standalone (worker/standalone.h).
#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <exception>

#include "absl/time/time.h"
#include "common/binary_init.h"
#include "common/version.h"
#include "proto/grpc_status.h"
#include "common/state_dir.h"
#include "common/token_flag.h"
#include "worker/agent/agent.h"
#include "worker/agent/job_process.h"
#include "worker/train/trainer.h"
#include "worker/standalone.h"

namespace {

int RunWorker(int argc, char** argv) {
  CLI::App app{"ablate-worker: trains ablate runs (LibTorch, CPU or CUDA)\n"
               "  ablate-worker --coordinator HOST:PORT   pull and train jobs from a coordinator\n"
               "  ablate-worker train --config FILE       train one run, no coordinator"};
  app.require_subcommand(0, 1);
  // Which runs this worker may train: the coordinator leases it only runs of its code version.
  app.set_version_flag("--version", ablate::VersionText());

  ablate::AgentOptions agent;
  std::string token_file;
  double idle_exit_s = 0, report_interval_s = 1;
  app.add_option("--coordinator", agent.coordinator, "the coordinator's HOST:PORT")
      ->envname("ABLATE_COORDINATOR");
  app.add_option("--token-file", token_file,
                 "read the worker credential from this file (the coordinator's "
                 "STATE_DIR/worker-token; else $ABLATE_TOKEN)");
  ablate::RefuseTokenOnCommandLine(&app);
  app.add_option("--tls-ca", agent.tls_ca, "PEM CA bundle to verify a TLS coordinator")
      ->envname("ABLATE_TLS_CA");
  app.add_option("--device", agent.device,
                 "cpu, cuda or cuda:N for every job (overrides train.device); a list "
                 "(cuda:0,cuda:1) offers one slot per device");
  app.add_option("--slots", agent.slots,
                 "slots offered: a job with resources.devices N <= slots trains on N ranks "
                 "(default: the number of --device entries, else 1; on a CPU the cores are "
                 "split between the ranks)")
      ->check(CLI::Range(1, 4096));
  double agent_collective_timeout_s = 600;
  app.add_option("--collective-timeout", agent_collective_timeout_s,
                 "seconds a data-parallel collective may wait for the other ranks (default 600)")
      ->check(CLI::PositiveNumber);
  app.add_option("--rendezvous-host", agent.rendezvous_host,
                 "the address other workers reach this one at when it holds rank 0 of a run wider "
                 "than any one worker (default: the hostname)");
  app.add_option("--checkpoint-root", agent.checkpoint_root,
                 "keep checkpoints in DIR/run-<id> instead of the job's checkpoint dir");
  app.add_option("--idle-exit", idle_exit_s, "exit after this many seconds without a job (0 = never)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--max-jobs", agent.max_jobs, "exit after this many jobs (0 = no limit)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--name", agent.name, "this worker's name (default hostname:pid)");
  app.add_option("--report-interval", report_interval_s, "seconds between metric reports")
      ->check(CLI::PositiveNumber);

  ablate::StandaloneOptions train;
  CLI::App* cmd = app.add_subcommand("train", "train one run from a config file, no coordinator");
  cmd->add_option("--config", train.config_path, "RunConfig as YAML or JSON (model:, train:)");
  cmd->add_option("--out", train.out_dir, "output directory (config, metrics.jsonl, summary, checkpoint)");
  cmd->add_option("--resume", train.resume_dir, "continue the run in this output directory");
  cmd->add_option("--device", train.device, "cpu, cuda or cuda:N (overrides train.device)");
  cmd->add_option("--threads", train.threads, "intra-op threads, 0 = all cores (overrides train.threads)");
  cmd->add_option("--world-size", train.world_size,
                  "train data-parallel over N local processes (train.batch_size is the global "
                  "batch; with --device cuda, rank r uses cuda:r)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--collective-timeout", train.collective_timeout_s,
                  "seconds a data-parallel collective may wait for the other ranks (default 600)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--stop-at-step", train.stop_at_step,
                  "pause after this step with an evaluation and a checkpoint (--resume goes on)")
      ->check(CLI::NonNegativeNumber);
  // Set by the --world-size launcher for the processes it starts.
  cmd->add_option("--rank", train.rank)->group("");
  cmd->add_option("--rendezvous", train.rendezvous)->group("");
  int code = 0;
  cmd->callback([&] { code = ablate::RunStandalone(train); });
  // A job of an agent with several slots, in a process of its own (worker/agent/job_process.h):
  // started by the agent, not by hand.
  ablate::JobProcessOptions job;
  CLI::App* job_cmd = app.add_subcommand("job-process")->group("");
  job_cmd->add_option("--config", job.config_path)->required();
  job_cmd->add_option("--checkpoint-dir", job.checkpoint_dir)->required();
  job_cmd->add_option("--world-size", job.world_size);
  job_cmd->add_option("--rendezvous", job.rendezvous);
  job_cmd->add_option("--collective-timeout", job.collective_timeout_s);
  job_cmd->add_option("--stop-at-step", job.stop_at_step);
  job_cmd->callback([&] { code = ablate::RunJobProcess(job); });
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version exit 0; a bad command line exits 2, as getopt and argparse tools do
    // (CLI11's own codes are 105 and the like), as `ablate` does.
    return app.exit(e) == 0 ? 0 : 2;
  }
  if (cmd->parsed() || job_cmd->parsed()) return code;

  agent.collective_timeout = absl::Seconds(agent_collective_timeout_s);
  if (agent.coordinator.empty()) {
    std::fprintf(stderr, "ablate-worker: --coordinator HOST:PORT (or ABLATE_COORDINATOR) is "
                         "required, or run one config with `ablate-worker train`\n");
    return 2;  // a missing argument: a bad command line
  }
  if (!token_file.empty()) {
    absl::StatusOr<std::string> read = ablate::ReadTokenFile(token_file);
    if (!read.ok()) {
      std::fprintf(stderr, "ablate-worker: %s\n", std::string(read.status().message()).c_str());
      return 1;
    }
    agent.token = *read;
  } else {
    agent.token = ablate::EnvOrEmpty("ABLATE_TOKEN");
  }
  agent.idle_exit = absl::Seconds(idle_exit_s);
  agent.report_interval = absl::Seconds(report_interval_s);
  return ablate::RunAgentCommand(std::move(agent));
}

}  // namespace

int main(int argc, char** argv) {
  ablate::KeepFreedMemoryInHeap();  // first: the in-process job trains on a thread of its own
  ablate::InitBinary();
  ablate::QuietGrpcLog();
  // Errors are reported as statuses; an exception that escapes (a bug) is one line, not an abort.
  try {
    return RunWorker(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ablate-worker: internal error: %s (a bug in ablate)\n", e.what());
  } catch (...) {
    std::fprintf(stderr, "ablate-worker: internal error: unknown exception (a bug in ablate)\n");
  }
  return 1;
}
