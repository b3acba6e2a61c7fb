// Tuning (docs/spec.md, "Tuning"): the `tune:` block of a spec, what a tuned sweep may cost, and
// the asynchronous successive halving rule (ASHA: Li et al., "A System for Massively Parallel
// Hyperparameter Tuning", MLSys 2020) that the coordinator applies to each group of runs.
//
// A group is one variant at one point of the other axes; a trial is one value of the tuned axis
// in a group, trained with every seed of the spec (`seeds: all`, the default) or decided on the
// first seed alone (`seeds: first`). DecideAsha is pure and stateless: it reads what the store
// holds of a group (run states, the metric at each rung step, the decisions already made) and
// returns what to decide now, so a coordinator that restarts re-derives the same decisions and
// nothing is decided twice. Thread-safe.
#ifndef ABLATE_ORCHESTRATOR_SWEEP_TUNE_H_
#define ABLATE_ORCHESTRATOR_SWEEP_TUNE_H_

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "orchestrator/sweep/spec.h"
#include "proto/ablate.pb.h"
#include "yaml-cpp/yaml.h"

namespace ablate {

// The spec parser's part: reads `tune:` (`node`) into spec->tune and appends its values to
// spec->axes as the last product axis. Needs spec->base, spec->variants and spec->axes parsed.
// InvalidArgument with one "FILE:LINE: tune.field: what" per line.
absl::Status ParseTuneBlock(const YAML::Node& node, SweepSpec* spec);

// The metrics a tune may rank by: columns of the store's eval_metrics.
const std::vector<std::string>& TuneMetrics();

// A value as a range point is written into the config and the axis text: "%.6g".
std::string FormatTuneValue(double value);

// The plan of a tuned sweep's expansion: the block, the most runs and steps it can take and, for
// asha, the steps synchronous successive halving would take (the expected figure: ASHA's early
// promotions can take a little more).
TunePlan MakeTunePlan(const TuneSpec& tune, const ExpandedSweep& sweep);

// "tune asha over train.optimizer.lr: 9 values; rungs 100, 300 (factor 3, seeds all); at most
// 18 runs, 16,200 steps; expected 4,800 steps (30% of the grid)".
std::string TunePlanText(const TunePlan& plan);

// ---- Boundary ----

// One value bisection tried, over every seed of the spec.
struct BoundaryProbe {
  double value = 0;
  bool done = false;    // every seed's run ended
  bool failed = false;  // one FAILED or was CANCELLED: the bisection cannot go on
  bool stable = false;  // every seed SUCCEEDED within max_spike_score
};

struct BoundaryStep {
  enum class Kind { kWait, kProbe, kDone };
  Kind kind = Kind::kWait;
  double next = 0;                  // kProbe: the value to try, sqrt(stable x unstable)
  std::optional<double> stable;     // kDone: the largest stable value below `unstable`
  std::optional<double> unstable;   // kDone: the smallest unstable value; none: stable at max
  std::string note;                 // kDone without a full bracket: why, in words
};

// What a group's stability bisection does next. It waits while a probe trains. It ends when min
// is unstable ("unstable already at min", no stable value), when max is stable (no unstable
// value), when a probe failed (neither), or once unstable / stable <= tolerance; else it probes
// the geometric mean of the largest stable value and the smallest unstable one above it.
BoundaryStep NextBoundaryStep(const std::vector<BoundaryProbe>& probes, double min, double max,
                              double tolerance);

// ---- ASHA ----

// One run of a group as the store holds it.
struct AshaRun {
  int64_t run_id = 0;
  double value = 0;
  uint64_t seed = 0;
  RunState state = RUN_STATE_UNSPECIFIED;
  bool held = false;          // PENDING and waiting for a decision
  bool follower = false;      // seeds first: a seed other than the first
  int64_t steps_done = 0;
  double final_metric = 0;    // the run's stored metric (its last evaluation); NaN if none
  std::map<int64_t, double> at;  // the metric at each rung step it was evaluated at
};

struct AshaGroup {
  std::vector<AshaRun> runs;
  // (value, rung, kind) of the decisions stored before; kind "promote", "stop" or "choose".
  std::set<std::tuple<double, int, std::string>> decided;
};

struct AshaRule {
  std::vector<int64_t> rungs;  // the pause steps only: increasing, each < the runs' train.steps
  double reduction_factor = 3;
  bool maximize = false;
  bool seeds_first = false;
  std::string metric = "val_loss";
};

struct AshaDecision {
  enum class Kind { kPromote, kStop, kChoose };
  Kind kind = Kind::kPromote;
  double value = 0;
  int rung = 0;                 // index into rungs; -1 for a seeds-first choice
  double metric = 0;            // the trial's metric there (NaN: diverged or none)
  std::vector<int64_t> runs;    // the held runs it applies to
  int64_t next_stop = 0;        // kPromote, kChoose: the step they pause at next (0 = the end)
  std::string detail;           // why, in words ("val_loss 2.31 in the top 3 of 9")
};

const char* AshaKindName(AshaDecision::Kind kind);  // "promote", "stop", "choose"

// The decisions to make now in one group, none of them in group.decided:
//  - A trial reaches rung k when every seed that did not fail has been evaluated at rungs[k];
//    its metric there is the mean over those seeds. A trial with a DIVERGED seed counts at the
//    first rung it did not reach, ranked last, and is never promoted; FAILED and CANCELLED seeds
//    drop out, and a trial with none left is left out.
//  - At rung k, the trials in the top floor(n_k / reduction_factor) of the n_k that reached it
//    go on (at least one once no other trial can still arrive): their held runs are promoted to
//    the next rung, or to the end.
//  - Once no trial can still arrive at rung k, the trials that reached it and were not promoted
//    are stopped (their held runs end STOPPED).
//  - seeds first: the first seed decides as above; once every first-seed run has ended, the
//    trial with the best final metric is chosen and its other seeds train straight through;
//    the other trials' other seeds are stopped.
std::vector<AshaDecision> DecideAsha(const AshaGroup& group, const AshaRule& rule);

}  // namespace ablate

#endif  // ABLATE_ORCHESTRATOR_SWEEP_TUNE_H_
