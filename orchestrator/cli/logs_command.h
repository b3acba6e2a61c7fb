// `ablate logs RUN`: a program run's output (docs/program.md, "Logs"), as its worker kept it in
// the run's checkpoint directory: CHECKPOINT_ROOT/run-<id>/logs/attempt-<n>.log (and the older
// half in attempt-<n>.log.1 once the output passed program.max_log_bytes / 2). Read from the
// filesystem: on the coordinator's machine (`ablate up`), or wherever the checkpoint root is
// shared (a cluster's filesystem). Read by ReadRunLog (common/run_logs.h), which the dashboard's
// run page reads them with too.
#ifndef ABLATE_ORCHESTRATOR_CLI_LOGS_COMMAND_H_
#define ABLATE_ORCHESTRATOR_CLI_LOGS_COMMAND_H_

#include <cstdint>
#include <functional>
#include <ostream>
#include <string>

#include "absl/status/status.h"

namespace CLI {
class App;
}  // namespace CLI

namespace ablate {

struct LogsOptions {
  int64_t run_id = 0;
  int attempt = 0;   // 0: the last one
  int64_t tail = 0;  // 0: every line kept
  std::string state_dir = ".ablate";
  std::string checkpoint_root;  // "": STATE_DIR/checkpoints
};

// Prints the attempt's output to `out`, preceded by a line naming the file. NotFound naming the
// directory when the run has no logs there (not a program run, never started, or another
// machine's disk).
absl::Status PrintRunLogs(const LogsOptions& options, std::ostream& out);

// Registers `logs` on `app`.
void AddLogsCommand(CLI::App* app, std::ostream* out, std::function<absl::Status()>* action);

}  // namespace ablate

#endif  // ABLATE_ORCHESTRATOR_CLI_LOGS_COMMAND_H_
