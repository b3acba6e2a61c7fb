// The asynchronous successive halving rule (ASHA: Li et al., "A System for Massively Parallel
// Hyperparameter Tuning", MLSys 2020) of a `method: asha` tune (docs/spec.md, "Tuning"). A
// scheduling rule beside the scheduler (its pure library): the coordinator's tuner (tuner.h)
// reads a group from the store, asks DecideAsha what to decide, and writes the decisions.
//
// A group is one variant at one point of the other axes; a trial is one value of the tuned axis
// in a group, trained with every seed of the spec (`seeds: all`, the default) or decided on the
// first seed alone (`seeds: first`). DecideAsha is pure and stateless: it reads what the store
// holds of a group (run states, the metric at each rung step, the decisions already made) and
// returns what to decide now, so a coordinator that restarts re-derives the same decisions and
// nothing is decided twice. Thread-safe.
#ifndef ABLATE_ORCHESTRATOR_COORDINATOR_ASHA_H_
#define ABLATE_ORCHESTRATOR_COORDINATOR_ASHA_H_

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "proto/ablate.pb.h"

namespace ablate {

// One run of a group as the store holds it.
struct AshaRun {
  int64_t run_id = 0;
  double value = 0;
  uint64_t seed = 0;
  RunState state = RUN_STATE_UNSPECIFIED;
  bool held = false;      // PENDING and waiting for a decision
  bool follower = false;  // seeds first: a seed other than the first
  int64_t steps_done = 0;
  double final_metric = 0;       // the run's stored metric (its last evaluation); NaN if none
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
  // The runs train on past their rungs (a program that cannot pause, TunePlan.trains_through):
  // `at` holds each run's first evaluation at or after each rung, and trials are judged as they
  // arrive (below).
  bool trains_through = false;
};

struct AshaDecision {
  enum class Kind { kPromote, kStop, kChoose };
  Kind kind = Kind::kPromote;
  double value = 0;
  int rung = 0;               // index into rungs; -1 for a seeds-first choice
  double metric = 0;          // the trial's metric there (NaN: diverged or none)
  std::vector<int64_t> runs;  // the held runs it applies to (trains through: the live ones)
  int64_t next_stop = 0;      // kPromote, kChoose: the step they pause at next (0 = the end)
  std::string detail;         // why, in words ("val_loss 2.31 in the top 3 of 9")
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
//  - trains through (nothing is held; the stopping variant of ASHA, as in Ray Tune's
//    AsyncHyperBandScheduler): a trial that reached rung k and has no decision there is judged
//    against every trial that reached rung k so far (a diverged one ranked last): in their top
//    max(1, floor(n / reduction_factor)) it goes on (a promote decision with no run to
//    release); otherwise its runs still PENDING or RUNNING are stopped. A trial that already
//    ended is left alone.
std::vector<AshaDecision> DecideAsha(const AshaGroup& group, const AshaRule& rule);

}  // namespace ablate

#endif  // ABLATE_ORCHESTRATOR_COORDINATOR_ASHA_H_
