// The tuner of tuned sweeps (docs/spec.md, "Tuning"): after a tuned run pauses at a rung or ends,
// the decisions due in its group are computed from what the store holds (asha.h: DecideAsha;
// bisection.h: NextBoundaryStep) and written in one store transaction; the runs they release or
// add go to the coordinator to be queued. Stateless: a restarted coordinator re-derives the same
// decisions (it calls TuneSweep for every active tuned sweep), and the store applies a decision
// once (tune_decisions is unique per group, value, rung and kind).
//
// What it may touch, and nothing else:
//  - the Store: its scheduling reader (the sweep's tune, groups, runs, decisions, brackets and
//    stored spec) and the tuner's writes (ApplyTuneDecisions, AddTuneProbe, CloseBracket, and a
//    "tune_error" event when a decision after a run's end cannot be made);
//  - the coordinator through TunerPort alone: whether a sweep was cancelled, and queueing a run;
//  - pure functions: the rules above, and for a boundary sweep's next probe the spec parser and
//    expansion (orchestrator/sweep/), by a coordinator of the sweep's own code version.
//
// Thread safety: thread-safe. Its own lock serializes the decisions (two ends in one group decide
// one after the other) and is held while it calls the port: take no lock of the port's owner
// around a call into the Tuner. The Store and the port must outlive it.
#ifndef ABLATE_ORCHESTRATOR_COORDINATOR_TUNER_H_
#define ABLATE_ORCHESTRATOR_COORDINATOR_TUNER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "orchestrator/store/store.h"
#include "proto/ablate.pb.h"

namespace ablate {

struct BoundaryStep;  // orchestrator/coordinator/bisection.h
struct RunInfo;       // orchestrator/store/reader.h
struct TuneInfo;      // orchestrator/store/reader.h

// What the tuner may ask of the coordinator (CoordinatorCore implements it). Called with the
// tuner's lock held: an implementation may take its own locks (after the tuner's) and must not
// call back into the Tuner.
class TunerPort {
 public:
  virtual ~TunerPort() = default;

  // Whether sweep `sweep_id` was cancelled: the tuner then decides nothing more in it.
  virtual bool SweepCancelled(int64_t sweep_id) = 0;
  // Queues `run`, PENDING in the store (released by a decision, or a probe just added), to be
  // dispatched now with its retries counted from its attempts so far (rung pauses use none up),
  // and wakes the workers waiting for a job. `config`: the run's config as just expanded (it
  // saves parsing the stored one at dispatch); null: read from the store at dispatch.
  virtual void EnqueueRun(const RunInfo& run, const RunConfig* config) = 0;
  // A stop decision on a run of a plan that trains through its rungs: dropped from the queue
  // when it waits there (STOPPED in the store already; `why` empty), or, RUNNING, told to stop
  // (DIRECTIVE_STOP) and ended STOPPED with `why` when its worker finishes.
  virtual void StopRun(int64_t run_id, const std::string& why) = 0;
};

class Tuner {
 public:
  Tuner(Store* store, TunerPort* port) : store_(store), port_(port) {}

  Tuner(const Tuner&) = delete;
  Tuner& operator=(const Tuner&) = delete;

  // Makes the decisions due in every group of a tuned sweep (none for an untuned or grid one).
  // The error is the store's, or a boundary probe that this coordinator cannot expand
  // (FailedPrecondition: another code version); the groups after it are left for later.
  absl::Status TuneSweep(int64_t sweep_id) ABSL_LOCKS_EXCLUDED(mu_);
  // The same for the groups of these tuned runs, which just paused at a rung or ended. A group
  // whose decision fails gets a "tune_error" event and is decided at its next end or a restart.
  void TuneAfter(const std::vector<int64_t>& run_ids) ABSL_LOCKS_EXCLUDED(mu_);
  // After a tuned run reported an evaluation: its group's decisions, when its plan trains
  // through its rungs (it never pauses, so the evaluations are the only moments to decide).
  void TuneAfterEval(int64_t run_id) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // The decisions due in one group (DecideAsha), written in one store transaction, until none is
  // left; the runs they release are queued.
  absl::Status TuneGroup(const TuneInfo& tune, const std::string& group) ABSL_LOCKS_EXCLUDED(mu_);
  // A boundary sweep's group (NextBoundaryStep): waits for the probe training, adds the next one
  // (its runs expanded from the stored spec, queued), or closes the bracket.
  absl::Status BisectGroup(const TuneInfo& tune, const std::string& group) ABSL_LOCKS_EXCLUDED(mu_);
  // BisectGroup for a boundary tune, else TuneGroup.
  absl::Status DecideGroup(const TuneInfo& tune, const std::string& group) ABSL_LOCKS_EXCLUDED(mu_);
  // The probe of `step` (kProbe) in a boundary sweep's group: its runs expanded from the stored
  // spec, added to the store and queued. FailedPrecondition when this coordinator was built from
  // another code version than the sweep's.
  absl::Status AddProbe(const TuneInfo& tune, const std::string& group, const BoundaryStep& step)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Constant after construction.
  Store* const store_;
  TunerPort* const port_;

  // Serializes the decisions; guards nothing in memory (the store holds what they read).
  absl::Mutex mu_;
};

}  // namespace ablate

#endif  // ABLATE_ORCHESTRATOR_COORDINATOR_TUNER_H_
