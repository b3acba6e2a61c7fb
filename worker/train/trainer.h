// The training loop of one run: AdamW with warmup + cosine, gradient clipping and accumulation,
// evaluation with probes, atomic checkpoints with bitwise-exact resume on the CPU, the
// spike/divergence policies (worker/train/spike.h), and data parallelism over c10d
// (TrainerOptions).
//
// Checkpoints. `checkpoint.pt` is replaced durably (common/durable_file.h: a temporary file of its
// own per write, fsynced, renamed, the directory fsynced), and the one it replaces is kept as
// `checkpoint.prev.pt`. A checkpoint that cannot be loaded (torn, truncated) is moved aside to
// `<name>.corrupt-<UTC time>` and the trainer falls back to the previous one, else to step 0; each
// such fallback is reported once through TrainerObserver::OnNotice.
//
// The header is LibTorch-free (the implementation is hidden), so the worker agent and the CLI
// include it cheaply. A Trainer is used from one thread; the interrupt flag may be set from any
// thread or a signal handler. Errors (bad data, a device that does not exist, an unreadable
// checkpoint, a LibTorch exception) come back as a Status; a diverged run is a result, not an
// error.
#ifndef ABLATE_WORKER_TRAIN_TRAINER_H_
#define ABLATE_WORKER_TRAIN_TRAINER_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "proto/ablate.pb.h"

namespace ablate {

// Receives what a run produces as it happens. Called on the training thread; keep it quick.
class TrainerObserver {
 public:
  enum class Directive { kContinue, kStop };
  virtual ~TrainerObserver() = default;
  // Every optimizer step. kStop ends the run as CANCELLED after this step.
  virtual Directive OnStep(const StepMetrics& metrics) { return Directive::kContinue; }
  virtual void OnEval(const EvalResult& eval) {}
  virtual void OnSpike(const SpikeEvent& event) {}
  // Asked before each checkpoint is written (after the step's OnStep and evaluation). kStop ends
  // the run as CANCELLED without writing it: a worker that may have lost its lease must not
  // replace the checkpoint of the run's next owner.
  virtual Directive BeforeCheckpoint(int64_t step) { return Directive::kContinue; }
  // A checkpoint of `step` was written (durably) to `path`.
  virtual void OnCheckpoint(int64_t step, const std::string& path) {}
  // One line about the run that belongs in its event log: an unreadable checkpoint moved aside
  // and the step training resumed from instead (at the start of Run, or at a rollback).
  virtual void OnNotice(const std::string& line) {}
  // The model's parameter counts, as a program reported them (`params`).
  virtual void OnParams(const ParamCount& params) {}
};

struct TrainerOptions {
  // Where checkpoint.pt is written. Required.
  std::string checkpoint_dir;
  // Continue from checkpoint_dir/checkpoint.pt when it exists (or from checkpoint.prev.pt when
  // that one is unreadable; see above).
  bool resume = false;
  // When it becomes true, the trainer finishes the current step, writes a checkpoint and
  // returns INTERRUPTED. May be null.
  const std::atomic<bool>* interrupt = nullptr;
  // A rung (successive halving, docs/spec.md): when 0 < stop_at_step < train.steps, the trainer
  // evaluates and writes a checkpoint after that step and returns INTERRUPTED, whatever
  // train.eval_every and train.checkpoint_every say. Resuming from that checkpoint ends bit for
  // bit as the run trained straight through: the schedule depends on train.steps, not on where
  // a run pauses, and an evaluation changes no training state.
  int64_t stop_at_step = 0;

  // Data parallel (docs/training.md): this process is rank `rank` of `world_size`, meeting the
  // others at `rendezvous` (HOST:PORT of a RendezvousServer, worker/train/collective.h).
  // train.batch_size stays the global micro-batch: rank r trains on rows [r b, (r + 1) b) of
  // each batch one process would draw (b = batch_size / world_size), gradients are averaged
  // across ranks, and every rank takes the same steps. Rank 0 alone evaluates, writes
  // checkpoints and calls the observer; every rank resumes from rank 0's checkpoints.
  int world_size = 1;
  int rank = 0;
  std::string rendezvous;
  // A collective that waits longer than this (a rank died or hangs) fails the attempt. It must
  // exceed rank 0's longest evaluation, during which the others wait.
  std::chrono::milliseconds collective_timeout{std::chrono::minutes(10)};
};

// glibc serves blocks over 128 KiB with fresh mmaps and unmaps them on free, so every training
// step would page-fault its activations back in while the kernel zeroes every page: the larger
// the step, the more of its CPU time goes to the kernel rather than to training. This keeps
// freed blocks in the heap instead: no mmap for any size (M_MMAP_THRESHOLD alone stops at
// 32 MB), never trim; the process keeps its peak memory until it ends.
//
// It also keeps every thread on the main arena. glibc gives other threads arenas of their own,
// grown in heaps of at most 64 MiB, and serves any larger block there with a fresh mmap whatever
// M_MMAP_MAX says: a trainer on a thread other than main (the agent's in-process job) would map
// and zero each activation over 64 MiB again every step (docs/benchmarks.md has the
// measurements). A thread keeps the arena it first allocated from, so a process that may
// train on another thread calls this at the top of main(), before any thread starts;
// Trainer::Create calls it too (too late for threads already running, harmless otherwise).
// A thread that allocated earlier keeps its arena, and so may a later thread that glibc hands
// an arena left by an exited one: GLIBC_TUNABLES=glibc.malloc.arena_max=1 in the environment
// does the same from the process's start. Process-wide and idempotent. The agent hands the
// memory back (malloc_trim) after each job it trains itself.
void KeepFreedMemoryInHeap();

class Trainer {
 public:
  // Validates the config and loads the data; errors name what is wrong.
  static absl::StatusOr<std::unique_ptr<Trainer>> Create(const RunConfig& config,
                                                         TrainerOptions options);
  ~Trainer();

  // Optimizer steps already taken: the step of the checkpoint resumed from, else 0.
  int64_t step() const;

  // Trains to the end (or divergence, interrupt, cancel). `observer` may be null.
  absl::StatusOr<RunSummary> Run(TrainerObserver* observer);

  // The learning rate of 1-based `step`: linear warmup from 0, then cosine to min_lr.
  static double LearningRate(const OptimizerConfig& o, int64_t step, int64_t total_steps);

 private:
  struct State;
  explicit Trainer(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

}  // namespace ablate

#endif  // ABLATE_WORKER_TRAIN_TRAINER_H_
