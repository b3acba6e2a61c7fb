// A program run's output as its worker keeps it (docs/program.md, "Logs"): for each attempt N,
// CHECKPOINT_ROOT/run-<id>/logs/attempt-N.log, and the older half in attempt-N.log.1 once the
// output passed program.max_log_bytes / 2. Read from the filesystem of the machine the reader
// runs on, by `ablate logs` and by the dashboard's run page (GET /api/runs/ID/log). No gRPC, no
// store.
#ifndef ABLATE_COMMON_RUN_LOGS_H_
#define ABLATE_COMMON_RUN_LOGS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace ablate {

// Where `ablate serve` and `ablate up` keep runs' checkpoints: `checkpoint_root`
// (--checkpoint-root), or STATE_DIR/checkpoints when it is "".
std::string CheckpointRootOf(const std::string& state_dir, const std::string& checkpoint_root);

struct RunLogOptions {
  int attempt = 0;   // which attempt; 0: the last one that has a log
  int64_t tail = 0;  // only the last `tail` lines; 0: every line
  // At most this many bytes of lines (their '\n' not counted), the newest kept; a newest line
  // longer than that keeps its last max_bytes bytes. 0: no limit. Bounds what a reader holds and
  // reads whatever the program wrote (a progress bar redrawn with '\r' is one long line).
  int64_t max_bytes = 0;
};

struct RunLog {
  std::string path;           // the attempt's log file (attempt-N.log)
  int attempt = 0;            // N
  std::vector<int> attempts;  // every attempt that has a log, ascending
  // The lines kept, oldest first (the older half's before the log's), without their '\n': the
  // program's bytes as it wrote them, not necessarily UTF-8.
  std::vector<std::string> lines;
  bool truncated = false;  // earlier output was left out (`tail`, `max_bytes`)
};

// The output of attempt options.attempt of run `run_id` under `checkpoint_root`. Only regular
// files are read, never through a symbolic link (whoever can write the checkpoint root cannot
// make a reader serve another file of its machine). NotFound naming the directory when the run
// has no log there, or not of that attempt (not a program run, never started, or another
// machine's disk); Internal when a log cannot be read.
absl::StatusOr<RunLog> ReadRunLog(const std::string& checkpoint_root, int64_t run_id,
                                  const RunLogOptions& options);

}  // namespace ablate

#endif  // ABLATE_COMMON_RUN_LOGS_H_
