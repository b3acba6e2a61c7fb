// The checkpoint archive of one run: what a run's progress is made of, and how it is written,
// read, fallen back from and pruned in its checkpoint directory.
//
// Files, in TrainerOptions.checkpoint_dir:
// - `checkpoint.pt`: the model, the optimizer (a replicated one's state inside it), the
//   progress (TrainingProgress) and the CPU generator's state. Replaced durably
//   (common/durable_file.h: a temporary file of its own per write, fsynced, renamed, the
//   directory fsynced); the one it replaces is kept as `checkpoint.prev.pt`.
// - `optimizer-STEP.bin`: a sharded optimizer's state (ShardedStateFile), for the steps of those
//   two files only (older ones are removed after each save).
// - `<name>.corrupt-<UTC time>[.N]`: a checkpoint that could not be read, moved aside by
//   LoadNewestGood and never read again (kept for a post-mortem).
//
// Worker-internal (includes LibTorch): only worker/train's translation units include it. A
// CheckpointArchive is used from the training thread; it owns nothing but its directory's name
// and the step it last wrote or read.
#ifndef ABLATE_WORKER_TRAIN_CHECKPOINT_H_
#define ABLATE_WORKER_TRAIN_CHECKPOINT_H_

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/model/transformer.h"
#include "worker/train/optimizer.h"

namespace ablate {

// A run's progress beside its weights: all of it is in the checkpoint.
struct TrainingProgress {
  int64_t step = 0;         // optimizer steps taken
  int64_t data_offset = 0;  // train batch index = (step - 1) * grad_accum + micro + data_offset
  int64_t rollbacks = 0;
  int64_t spike_steps = 0;
  // Training seconds of the attempts before this one (StepMetrics.elapsed_s); a save writes
  // the seconds up to it.
  double elapsed_before = 0;
  std::vector<double> loss_history, grad_history;  // per step, to rebuild the spike detectors
};

class CheckpointArchive {
 public:
  explicit CheckpointArchive(std::string dir) : dir_(std::move(dir)) {}

  const std::string& dir() const { return dir_; }
  // dir/checkpoint.pt, and the checkpoint it replaced: the fallback when it cannot be read.
  std::string Path() const;
  std::string PreviousPath() const;
  // The step of checkpoint.pt as this process last wrote or read it; -1 when unknown.
  int64_t step() const { return step_; }
  // Forgets that step (the state was rebuilt from scratch).
  void Forget() { step_ = -1; }

  // Writes `model`, `optimizer`, `progress` (with `elapsed_s` as its training seconds) and the
  // CPU generator's state to checkpoint.pt, durably; the old one becomes checkpoint.prev.pt, and
  // the sharded optimizer states of older steps are removed. Every rank calls it: the `writer`
  // (rank 0) writes, the others take part in gathering a sharded optimizer's state. Errors
  // start with "checkpoint: " and name the file.
  absl::Status Save(bool writer, TransformerImpl& model, TrainingOptimizer& optimizer,
                    const TrainingProgress& progress, double elapsed_s);

  // Loads the checkpoint at `path` onto `device`: into `model`, `optimizer`, *progress and the
  // CPU generator. DataLoss naming `path` when it cannot be read or is inconsistent; the model,
  // optimizer and progress are then partly loaded (rebuild them).
  absl::Status Load(const std::string& path, torch::Device device, TransformerImpl& model,
                    TrainingOptimizer& optimizer, TrainingProgress* progress);

  // Loads checkpoint.pt, else checkpoint.prev.pt, else leaves the state of step 0, through
  // `load` (a Load into the caller's current model; DataLoss when unreadable) and `rebuild`
  // (a fresh model and optimizer of step 0, after a partial load). Each file that cannot be
  // read is moved aside by the `writer` (the other ranks fall back alike) and noted in
  // *notices with the step training resumes from. Errors: a `load` error other than DataLoss,
  // a `rebuild` error, or a file that cannot be moved.
  absl::Status LoadNewestGood(bool writer,
                              const std::function<absl::Status(const std::string& path)>& load,
                              const std::function<absl::Status()>& rebuild,
                              std::vector<std::string>* notices);

  // Removes a sharded optimizer's state files but those of checkpoint.pt (at `current`) and of
  // checkpoint.prev.pt (at `previous`, -1 when unknown: then the newest below `current`).
  void RemoveStaleShardedStates(int64_t previous, int64_t current) const;

 private:
  const std::string dir_;
  int64_t step_ = -1;
};

// Continued training (TrainConfig.init_from): the parameters of the checkpoint at `path` are
// copied into `model` (freshly built) by name. A parameter the model has and the checkpoint
// lacks keeps its fresh initialisation; returns the summary line naming those. A parameter the
// checkpoint has and the model lacks, or a shape that differs, is InvalidArgument; a missing
// file is NotFound, an unreadable one DataLoss. `out_scale` != 1 (train.init_from.
// preserve_function: 1 / GateStartScore) multiplies each loaded W_O by it, and requires every
// attention gate parameter to be fresh: the added gate's constant starting score is taken over by
// W_O, so the loaded model's function is unchanged.
absl::StatusOr<std::string> InitFromCheckpoint(const std::string& path, torch::Device device,
                                               TransformerImpl& model, double out_scale = 1.0);

}  // namespace ablate

#endif  // ABLATE_WORKER_TRAIN_CHECKPOINT_H_
