// `ablate-worker train`: one run without a coordinator. Writes into an output directory:
//   config.json     the canonical RunConfig (what --resume reads back)
//   metrics.jsonl   one JSON object per line: {"type": "step"|"eval"|"spike", ...fields}
//   summary.json    the RunSummary at the end
//   checkpoint.pt   the latest checkpoint
// and prints a progress line every log_every steps, every evaluation and every spike as it
// happens. SIGINT/SIGTERM write a checkpoint and exit 0; --resume continues.
#ifndef ABLATE_WORKER_STANDALONE_H_
#define ABLATE_WORKER_STANDALONE_H_

#include <string>

namespace ablate {

struct StandaloneOptions {
  std::string config_path;  // a YAML or JSON RunConfig; empty with resume
  std::string out_dir;      // required unless resume_dir is given
  std::string resume_dir;   // continue the run in this directory
  std::string device;       // overrides train.device when not empty
  int threads = -1;         // overrides train.threads when >= 0
};

// Exit code: 0 succeeded or interrupted (resumable), 3 diverged, 1 any error (printed to
// stderr as one line naming what is wrong).
int RunStandalone(const StandaloneOptions& options);

}  // namespace ablate

#endif  // ABLATE_WORKER_STANDALONE_H_
