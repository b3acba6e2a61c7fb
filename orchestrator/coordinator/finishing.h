// The ending of attempts by a worker's Finish (CoordinatorCore::Finish, finish.cc), in the parts
// that need none of the coordinator's own state: an attempt a Finish ends once it is checked
// (PreparedFinish), the checks that need only the request, the store writes that end a Finish's
// attempts together with the starts of the worker's next runs, and how the store's results of
// those writes are mirrored in the scheduler. The coordinator does the rest: the checks against
// its leases and secrets (PrepareFinish), the store transaction, the jobs of the next runs, the
// retries of failed attempts and the tuner.
//
// What these functions touch: their parameters alone. MirrorEndedAttempts changes the scheduler
// it is given, under the lock that guards it (ABSL_EXCLUSIVE_LOCKS_REQUIRED); PrepareMoreFinishes
// calls the `prepare` it is given; the rest are pure. Thread-safe as far as their arguments are.
#ifndef ABLATE_ORCHESTRATOR_COORDINATOR_FINISHING_H_
#define ABLATE_ORCHESTRATOR_COORDINATOR_FINISHING_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "orchestrator/coordinator/scheduler.h"
#include "orchestrator/store/store.h"
#include "proto/ablate.pb.h"

namespace ablate {

// One attempt a Finish ends (the request's own, or one of its `more`), checked and ready.
struct PreparedFinish {
  const FinishRequest* request = nullptr;  // not owned: the Finish call's
  int index = 0;                           // 0: the request itself; i: its more[i - 1]
  bool applied_before = false;             // a resent Finish whose first try was applied
  Lease lease;
  std::optional<MetricBatch> batch;  // of final_report
  std::string reason;
  // A tuned run paused at its rung (INTERRUPTED at lease.stop_at_step): it goes back to
  // PENDING, held for the tuner, with its summary (the rung's evaluation) stored.
  bool rung_pause = false;
};

// A Finish ends its attempt SUCCEEDED, DIVERGED, FAILED, CANCELLED or INTERRUPTED: else
// InvalidArgument naming the state.
absl::Status CheckFinishState(const FinishRequest& request);
// A Finish's final_report (when it has one) is of its worker, run and attempt (0: not given)
// and is the batch after the last acknowledged one (seq >= 1): else InvalidArgument.
absl::Status CheckFinalReportOf(const FinishRequest& request, int64_t worker_id);
// Whether a Finish under `lease` is a tuned run's pause at its rung (PreparedFinish::rung_pause):
// INTERRUPTED at the lease's stop_at_step, the lease not told to stop.
bool IsRungPause(const FinishRequest& request, const Lease& lease);

// The attempts of worker_id's Finish listed in its `more`, each checked: of that worker, with no
// `more` of its own, then by `prepare` (the coordinator's checks of one attempt). Each accepted
// is appended to `items` with its index; a refused one's error is (*errors)[i + 1].
void PrepareMoreFinishes(
    const FinishRequest& request, int64_t worker_id,
    const std::function<absl::StatusOr<PreparedFinish>(const FinishRequest&)>& prepare,
    std::vector<PreparedFinish>* items, std::vector<absl::Status>* errors);

// The store write that ends a SUCCEEDED, DIVERGED, CANCELLED or INTERRUPTED attempt (moves the
// batch out of `p`): a rung pause back to PENDING, held, with its summary; another INTERRUPTED
// attempt PENDING to resume (CANCELLED when its lease was told to stop); the others their state,
// with their summary.
FinishWrite FinishWriteOf(PreparedFinish& p);
// The starts of `next` on worker_id (PENDING -> RUNNING), riding on `first`, the first write of
// the transaction that ends a Finish's attempts.
void AddStarts(const std::vector<QueuedRun>& next, int64_t worker_id, FinishWrite* first);
// The outcome of the start of next[i] that rode on the first write, of result `r`.
absl::StatusOr<TransitionResult> StartOf(const FinishWriteResult& r, size_t i);

// The store's `results` of the `writes` that ended `ending` (one each, in order; the first
// carried the starts of `next`) mirrored in `scheduler`, whose lock `mu` the caller holds: the
// ended attempts' leases released (an INTERRUPTED one queued again at once, unless it pauses for
// the tuner), and the next runs queued again when the first write failed. An attempt whose write
// failed gets that error, (*errors)[its index]. Returns whether it queued runs: the caller wakes
// the workers waiting for a job.
bool MirrorEndedAttempts(const std::vector<PreparedFinish*>& ending,
                         const std::vector<FinishWrite>& writes,
                         const std::vector<absl::StatusOr<FinishWriteResult>>& results,
                         const std::vector<QueuedRun>& next, absl::Mutex& mu, Scheduler& scheduler,
                         std::vector<absl::Status>* errors) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
// The tuned runs among `ending` whose end the store wrote: their groups' decisions are due.
std::vector<int64_t> TunedRunsEnded(const std::vector<PreparedFinish*>& ending,
                                    const std::vector<absl::StatusOr<FinishWriteResult>>& results);

// A next job for the worker, in the order they started: next_job first, then more_next_jobs.
void AddNextJob(Job job, FinishResponse* response);
// response.more_errors, one per `more` (errors[1], ...): "" when it ended, else "CODE: message".
void AddMoreErrors(const std::vector<absl::Status>& errors, FinishResponse* response);

}  // namespace ablate

#endif  // ABLATE_ORCHESTRATOR_COORDINATOR_FINISHING_H_
