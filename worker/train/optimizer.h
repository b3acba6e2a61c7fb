// The trainer's optimizer step after the backward pass: gradients averaged over the ranks of a
// data-parallel run, clipped, and AdamW's update, with its state either replicated on every rank
// or sharded between them (ZeRO stage 1, TrainConfig.shard_optimizer), and the gradients too
// (ZeRO stage 2, TrainConfig.shard_gradients).
//
// Replicated: LibTorch's AdamW on every rank, gradients all-reduced. Sharded (Rajbhandari et
// al. 2020): the parameters are laid end to end in one flat order, cut into buckets of
// kShardBucketElements, and each bucket into world_size equal chunks; each rank keeps AdamW's two
// moments for its chunk of every bucket only, receives that part of the averaged gradient
// (reduce-scatter, bucket by bucket: NCCL's; on Gloo, which has none in LibTorch 1.13, an
// all-reduce of which each rank keeps its chunk), updates it with the same arithmetic as
// LibTorch's AdamW, and all-gathers the parameters bucket by bucket. Checkpoints hold the whole
// state either way: a sharded run's as flat moments in parameter order (gathered to rank 0 to be
// written), so it resumes at any world size. ZeRO-2 reduce-scatters each bucket during the
// backward pass instead, as soon as the blocks it covers are done (GradientsDone), adding into
// the rank's gradient shard over the micro-batches, and frees the gradients it covered. Both need every rank to call every method, in the same order. Includes <torch/torch.h>:
// worker/ only. Not thread-safe: one trainer thread per rank.
#ifndef ABLATE_WORKER_TRAIN_OPTIMIZER_H_
#define ABLATE_WORKER_TRAIN_OPTIMIZER_H_

#include <torch/torch.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "config/memory_plan.h"  // kShardBucketElements
#include "proto/ablate.pb.h"

namespace ablate {

class Collective;  // worker/train/collective.h

class TrainingOptimizer {
 public:
  virtual ~TrainingOptimizer() = default;

  // Zeroes every parameter's gradient (as LibTorch's Optimizer::zero_grad).
  virtual void ZeroGrad() = 0;
  // The learning rate of the next Step.
  virtual void SetLearningRate(double lr) = 0;
  // After the backward of a step: the gradients averaged over the ranks, then clipped to a
  // global norm of `max_norm` (infinity: not clipped). Returns the global norm before clipping,
  // the same on every rank.
  virtual double ReduceAndClip(double max_norm) = 0;
  // AdamW's update of every parameter, on every rank.
  virtual void Step() = 0;
  // ZeRO-2 (TrainConfig.shard_gradients) only, no-ops otherwise. GradientsDone: every gradient
  // of block `layer`'s parameters for this backward pass has been accumulated (the model's
  // TransformerImpl::SetGradientsDone): the buckets that completes are reduce-scattered into
  // this rank's shard and the gradients they covered freed. BackwardDone, after each backward
  // pass (each micro-batch): the rest (the parameters outside the blocks, and any bucket not
  // yet complete) likewise, in bucket order, so that every rank makes the same collectives.
  virtual void GradientsDone(int /*layer*/) {}
  virtual void BackwardDone() {}
  // The whole optimizer state of the checkpoint at `step` in `dir`, written by the rank that
  // writes the checkpoint (it passes its archive) with every other rank taking part (null).
  // Replicated: into the archive. Sharded: gathered to that rank one bucket at a time and
  // streamed to ShardedStateFile(dir, step), never whole in memory. Errors name the file.
  virtual absl::Status Save(torch::serialize::OutputArchive* archive, const std::string& dir,
                            int64_t step) = 0;
  // Reads the state Save wrote for the checkpoint at `step` (every rank reads it; a sharded one
  // reads only its own parts). Throws c10::Error on a checkpoint of the other kind, of another
  // model, or a missing or short file.
  virtual void Load(torch::serialize::InputArchive& archive, const std::string& dir,
                    int64_t step) = 0;
};

// Where a sharded optimizer's state of the checkpoint at `step` lives: DIR/optimizer-STEP.bin,
// beside checkpoint.pt (the trainer keeps the files of its two newest checkpoints).
std::string ShardedStateFile(const std::string& dir, int64_t step);

// AdamW over `params` (weight decay `decays[i]` for params[i]) with config's betas, eps and
// weight decay, replicated or sharded by train.shard_optimizer (and its gradients too by
// train.shard_gradients: `layers[i]` is params[i]'s block, -1 outside the blocks, as
// TransformerImpl::ParameterLayers). `dist` is null for one process. `bucket_elements`: a
// sharded optimizer's bucket (tests make it small to cut many).
std::unique_ptr<TrainingOptimizer> MakeTrainingOptimizer(
    const std::vector<torch::Tensor>& params, const std::vector<bool>& decays,
    const TrainConfig& config, Collective* dist, int64_t bucket_elements = kShardBucketElements,
    const std::vector<int>& layers = {});

}  // namespace ablate

#endif  // ABLATE_WORKER_TRAIN_OPTIMIZER_H_
