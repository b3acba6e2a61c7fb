// `ablate-worker train`: one run without a coordinator. Writes into an output directory:
//   config.json     the canonical RunConfig (what --resume reads back)
//   metrics.jsonl   one JSON object per line: {"type": "step"|"eval"|"spike", ...fields}
//   summary.json    the RunSummary at the end
//   checkpoint.pt   the latest checkpoint
// and prints a progress line every log_every steps, every evaluation and every spike as it
// happens. SIGINT/SIGTERM write a checkpoint and exit 0; --resume continues. With
// world_size > 1 the same run trains data-parallel over that many local processes
// (worker/train/collective.h), with the same results as one process within float reassociation.
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
  // Data parallel on this machine: > 1 starts that many rank processes of this binary, which
  // meet at a rendezvous this process serves; rank 0 prints and writes the outputs. A rank that
  // fails stops the others at once (exit 1; --resume continues from the last checkpoint).
  // With device "cuda", rank r trains on cuda:r.
  int world_size = 1;
  // Set by the launcher for the rank processes it starts (hidden flags): this process is rank
  // `rank` of world_size, meeting the others at `rendezvous` (HOST:PORT).
  int rank = -1;
  std::string rendezvous;
  double collective_timeout_s = 600;  // a collective waiting longer fails the run
  // Pause after this step (0 < S < train.steps) with an evaluation and a checkpoint, as a tuned
  // run does at a rung; --resume goes on. 0: train to the end.
  int64_t stop_at_step = 0;
};

// Exit code: 0 succeeded or interrupted (resumable), 3 diverged, 1 any error (printed to
// stderr as one line naming what is wrong).
int RunStandalone(const StandaloneOptions& options);

}  // namespace ablate

#endif  // ABLATE_WORKER_STANDALONE_H_
