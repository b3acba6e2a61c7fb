// Loss-spike and divergence detection (docs/training.md, "Spikes and divergence"), one small unit
// per rule, run every step.
//
// Each detector sees one signal's values in step order and says whether the newest value is an
// event. SpikeMonitor runs the four rules over loss and gradient norm and returns the events of a
// step. Detector state is a pure function of the values observed, so a resumed run rebuilds it
// by replaying its history. No LibTorch. Not thread-safe.
#ifndef ABLATE_WORKER_TRAIN_SPIKE_H_
#define ABLATE_WORKER_TRAIN_SPIKE_H_

#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <vector>

#include "proto/ablate.pb.h"

namespace ablate {

// Megatron-LM's rule: value >= factor x the max of the first `warmup` finite values.
class CatastrophicSpikeDetector {
 public:
  CatastrophicSpikeDetector(double factor, int warmup) : factor_(factor), warmup_(warmup) {}
  // The baseline when `value` is a spike; nullopt otherwise (and during warm-up).
  std::optional<double> Observe(double value);

 private:
  double factor_;
  int warmup_;
  int seen_ = 0;
  double max_ = 0;
};

// OLMo-core's rule: value > mean + sigmas x std of the last `window` values. Spikes do not
// enter the window, so a burst of spikes does not raise its own baseline. Silent until the
// window is full.
class StatisticalSpikeDetector {
 public:
  StatisticalSpikeDetector(int window, double sigmas) : window_(window), sigmas_(sigmas) {}
  std::optional<double> Observe(double value);  // baseline mean + k sigma when a spike

 private:
  int window_;
  double sigmas_;
  std::deque<double> values_;
  double sum_ = 0, sq_sum_ = 0;
};

// llm-foundry's rule: loss >= factor x the mean of the preceding `window` losses for more than
// `patience` consecutive steps means the run has diverged.
class DivergenceDetector {
 public:
  DivergenceDetector(double factor, int patience, int window)
      : factor_(factor), patience_(patience), window_(window) {}
  std::optional<double> Observe(double loss);  // window mean once diverged

 private:
  double factor_;
  int patience_, window_;
  std::deque<double> values_;
  double sum_ = 0;
  int run_ = 0;  // consecutive steps at or above factor x mean
};

// All four rules. Hard faults (non-finite loss or grad norm) end the run after
// max_nonfinite_steps in a row; a divergence ends it at once.
class SpikeMonitor {
 public:
  SpikeMonitor(const SpikeConfig& config, int64_t total_steps);

  struct Verdict {
    std::vector<SpikeEvent> events;  // action left RECORDED; the trainer decides
    bool nonfinite = false;          // this step's loss or grad norm is not finite
    bool spike = false;              // a catastrophic or statistical spike this step
    bool diverged = false;           // the run must end DIVERGED
    std::string reason;              // why, when diverged
  };
  // `grad_norm` nullopt: not measured (a program that reports none); only the loss is watched.
  Verdict Observe(int64_t step, double loss, std::optional<double> grad_norm);

 private:
  SpikeConfig config_;
  int nonfinite_run_ = 0;
  CatastrophicSpikeDetector loss_catastrophic_, grad_catastrophic_;
  StatisticalSpikeDetector loss_statistical_, grad_statistical_;
  DivergenceDetector divergence_;
};

// How many times a run may roll back (SPIKE_ROLLBACK); past it, a spike is skipped instead, so a
// run that spikes wherever it resumes cannot loop.
inline constexpr int kMaxRollbacks = 8;

// What the trainer does with a step, given its verdict and the sweep's spike policy.
struct SpikeDecision {
  bool skip = false;       // leave the weights as they are (the step still counts)
  bool roll_back = false;  // reload the last checkpoint and skip past the spike's batches
};

// Applies `policy` to a step's `verdict` (`rollbacks`: how many the run did so far): the decision,
// and each event's action (SKIPPED, ROLLED_BACK, STOPPED). SPIKE_STOP turns a spike into a
// divergence. A non-finite step is always skipped; a run that diverged is stopped.
SpikeDecision ApplySpikePolicy(SpikePolicy policy, int64_t rollbacks,
                               SpikeMonitor::Verdict* verdict);

}  // namespace ablate

#endif  // ABLATE_WORKER_TRAIN_SPIKE_H_
