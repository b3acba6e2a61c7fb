#include "orchestrator/cli/logs_command.h"

#include <memory>
#include <string>

#include "CLI/CLI.hpp"
#include "absl/status/statusor.h"
#include "common/run_logs.h"

namespace ablate {

absl::Status PrintRunLogs(const LogsOptions& options, std::ostream& out) {
  RunLogOptions read;
  read.attempt = options.attempt;
  read.tail = options.tail;
  absl::StatusOr<RunLog> log = ReadRunLog(
      CheckpointRootOf(options.state_dir, options.checkpoint_root), options.run_id, read);
  if (!log.ok()) return log.status();
  out << "==> " << log->path << " <==\n";
  for (const std::string& line : log->lines) out << line << "\n";
  out << std::flush;
  return absl::OkStatus();
}

void AddLogsCommand(CLI::App* app, std::ostream* out, std::function<absl::Status()>* action) {
  CLI::App* cmd = app->add_subcommand(
      "logs",
      "Print a program run's output, as its worker kept it in the run's checkpoint "
      "directory (docs/program.md)");
  auto options = std::make_shared<LogsOptions>();
  cmd->add_option("run", options->run_id, "run id (as `ablate status SWEEP` lists it)")
      ->required()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--attempt", options->attempt, "which attempt (default: the last)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--tail,-n", options->tail, "only the last N lines")->check(CLI::PositiveNumber);
  cmd->add_option("--state-dir", options->state_dir, "the coordinator's state dir")
      ->capture_default_str();
  cmd->add_option("--checkpoint-root", options->checkpoint_root,
                  "where runs' checkpoints live (default STATE_DIR/checkpoints)");
  cmd->callback([=] { *action = [=] { return PrintRunLogs(*options, *out); }; });
}

}  // namespace ablate
