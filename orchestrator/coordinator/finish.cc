// CoordinatorCore's ending of attempts. The Finish RPC of a worker ends one attempt or several
// (`more`): PrepareFinish checks each, a FAILED one takes FinishFailed (retry with backoff, or
// not), the rest end in one store transaction with the starts of the worker's next runs
// (EndAttemptsTogether). A gang member's Finish (FinishMember) ends its part alone. A lost or
// failed attempt's retry, cancellation or failure is EndAttemptAndRetry, also used by the
// worker API (CheckLeases, a gang part that could not be made). What needs none of the core's
// state (the checks of a request, the store writes, their mirror in the scheduler) is
// finishing.h's.
#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/credentials.h"
#include "orchestrator/coordinator/core.h"
#include "orchestrator/coordinator/core_internal.h"
#include "orchestrator/coordinator/door.h"
#include "orchestrator/coordinator/finishing.h"
#include "orchestrator/store/reader.h"

namespace ablate {

using core_internal::ToQueued;

absl::Status CoordinatorCore::EndAttemptAndRetry(int64_t run_id, int64_t sweep_id, int32_t attempt,
                                                 const std::string& attempt_end,
                                                 const std::string& reason, bool retry) {
  RetryDecision decision;
  bool cancelled = false;
  std::string tune_stop;  // the tuner stopped it (it trained through a rung): not retried
  std::optional<QueuedRun> queued;
  {
    absl::MutexLock lock(&mu_);
    cancelled = scheduler_.IsCancelled(sweep_id);
    auto base = attempt_base_.find(run_id);
    const int before_rerun = base == attempt_base_.end() ? 0 : base->second;
    if (retry) decision = scheduler_.RetryAfterLoss(attempt - before_rerun);
    queued = scheduler_.LeasedRun(run_id);
    const std::optional<Lease> lease = scheduler_.GetLease(run_id);
    if (lease.has_value() && !lease->tune_stop.empty()) tune_stop = lease->tune_stop;
  }
  RunTransition t;
  t.run_id = run_id;
  t.from = {RUNNING};
  t.expected_attempt = attempt;
  t.attempt_end = attempt_end;
  t.to = cancelled ? CANCELLED : !tune_stop.empty() ? STOPPED : decision.retry ? PENDING : FAILED;
  t.reason =
      t.to == STOPPED ? absl::StrCat(tune_stop, " (its attempt ended: ", reason, ")") : reason;
  if (t.to == FAILED) {
    absl::StrAppend(&t.reason, retry ? absl::StrCat(" (gave up after ", attempt, " attempts)")
                                     : " (not retried: it would fail again on any worker)");
  }
  absl::StatusOr<TransitionResult> r = store_->TransitionRun(t);
  if (!r.ok()) return r.status();
  if (t.to == PENDING && !queued.has_value()) {
    absl::StatusOr<RunInfo> run = store_->scheduling_reader().GetRun(run_id);
    if (!run.ok()) return run.status();
    queued = ToQueued(*run, absl::InfinitePast());
  }
  {
    absl::MutexLock lock(&mu_);
    scheduler_.Release(run_id);
    if (t.to == PENDING) {
      queued->not_before = decision.not_before;
      scheduler_.Enqueue(*queued);
      work_cv_.SignalAll();
    }
  }
  // A tuned run that failed for good or was cancelled drops out of its trial.
  if (t.to != PENDING && queued.has_value() && queued->tuned) tuner_.TuneAfter({run_id});
  return absl::OkStatus();
}

absl::StatusOr<PreparedFinish> CoordinatorCore::PrepareFinish(const FinishRequest& request,
                                                              int64_t worker_id) {
  PreparedFinish p;
  p.request = &request;
  const RunState state = request.summary().state();
  if (absl::Status s = CheckFinishState(request); !s.ok()) return s;
  if (absl::Status s = CheckLeaseSecret("finish", request.lease_secret(), request.run_id(),
                                        request.attempt(), worker_id);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckFinalReportOf(request, worker_id); !s.ok()) return s;
  if (request.has_final_report()) {
    absl::StatusOr<MetricBatch> converted =
        BatchOf(request.final_report(), request.run_id(), request.attempt(),
                "finish: final_report has", "send the rest with Report first");
    if (!converted.ok()) return converted.status();
    p.batch = *std::move(converted);
  }
  std::optional<Lease> lease;
  {
    absl::MutexLock lock(&mu_);
    lease = scheduler_.GetLease(request.run_id());
  }
  if (!lease.has_value() || lease->attempt != request.attempt() || lease->worker_id != worker_id) {
    // A retried Finish whose first try was applied is acknowledged again (without a next job:
    // one leased by the first try comes back when its lease expires).
    absl::StatusOr<RunInfo> run = store_->scheduling_reader().GetRun(request.run_id());
    if (!run.ok()) return run.status();
    if (run->attempts == request.attempt() && run->state == state) {
      p.applied_before = true;
      return p;
    }
    return absl::FailedPreconditionError(
        absl::StrCat("finish: run ", request.run_id(), " attempt ", request.attempt(),
                     " is not leased to worker ", worker_id, " (it is ", RunStateName(run->state),
                     ", attempt ", run->attempts, ")"));
  }
  p.lease = *lease;
  p.rung_pause = IsRungPause(request, *lease);
  if (request.has_final_report()) {
    absl::StatusOr<ReportShape> shape = ShapeOfLease(*lease);
    if (!shape.ok()) return shape.status();
    if (absl::Status s = CheckReportAtDoor(request.final_report(), *shape, "finish: final_report");
        !s.ok()) {
      return s;
    }
  }
  if (state != FAILED && (state != INTERRUPTED || p.rung_pause || !lease->tune_stop.empty())) {
    if (absl::Status s = CheckSummaryAtDoor(request.summary(), lease->total_steps); !s.ok()) {
      return s;
    }
  }
  if (p.batch.has_value() && request.final_report().checkpoint_step() > 0) {
    // Queued before the finish: committed with it or earlier.
    if (absl::Status s = store_->EnqueueCheckpoint(request.run_id(), request.attempt(),
                                                   request.final_report().checkpoint_path(),
                                                   request.final_report().checkpoint_step());
        !s.ok()) {
      return s;
    }
  }
  p.reason = BoundedText(!request.error().empty() ? request.error() : request.summary().reason());
  return p;
}

absl::Status CoordinatorCore::FinishFailed(PreparedFinish& p) {
  // Retries and backoff have their own path; the batch takes its own transaction (a failed
  // attempt is not the hot path).
  const FinishRequest& request = *p.request;
  if (p.batch.has_value()) {
    absl::StatusOr<ReportResult> r = store_->ReportMetrics(*p.batch);
    if (!r.ok()) return r.status();
  }
  return EndAttemptAndRetry(request.run_id(), p.lease.sweep_id, request.attempt(), "FAILED",
                            p.reason, !request.permanent());
}

absl::StatusOr<FinishResponse> CoordinatorCore::FinishMember(const FinishRequest& request) {
  const int64_t worker_id = request.worker_id();
  if (absl::Status s = CheckLeaseSecret("finish", request.lease_secret(), request.run_id(),
                                        request.attempt(), worker_id);
      !s.ok()) {
    return s;
  }
  if (request.more_size() > 0 || request.has_final_report()) {
    return absl::InvalidArgumentError(
        "finish: a member's finish ends its part alone: no `more`, no final_report (rank 0's "
        "worker reports the metrics)");
  }
  std::optional<Lease> lease;
  {
    absl::MutexLock lock(&mu_);
    lease = scheduler_.GetLease(request.run_id());
  }
  const bool holds = lease.has_value() && lease->attempt == request.attempt() &&
                     lease->worker_id != worker_id && lease->MemberOf(worker_id) != nullptr;
  if (holds && request.summary().state() == FAILED) {
    std::string worker;
    {
      absl::MutexLock lock(&mu_);
      worker = WorkerName(worker_id);
    }
    const std::string reason = BoundedText(absl::StrCat(
        "ranks from ", lease->MemberOf(worker_id)->rank_offset, " on worker ", worker, ": ",
        !request.error().empty() ? request.error() : request.summary().reason()));
    if (absl::Status s = EndAttemptAndRetry(request.run_id(), lease->sweep_id, request.attempt(),
                                            "FAILED", reason, !request.permanent());
        !s.ok() && !absl::IsFailedPrecondition(s)) {
      return s;
    }
  } else if (holds) {
    absl::MutexLock lock(&mu_);
    scheduler_.ReleaseMember(request.run_id(), request.attempt(), worker_id);
  }
  // Not held (the attempt is over, rank 0's worker finished it first): acknowledged.
  FinishResponse response;
  AcquireNextJobs(worker_id, request.acquire_next() ? std::max(1, request.acquire_max()) : 0,
                  &response);
  NoteWorkerBySlots(worker_id);
  return response;
}

absl::StatusOr<FinishResponse> CoordinatorCore::Finish(const FinishRequest& request) {
  if (request.member()) return FinishMember(request);
  const int64_t worker_id = request.worker_id();
  absl::StatusOr<PreparedFinish> first = PrepareFinish(request, worker_id);
  // This request refused: none of `more` is applied either (the worker resends them all).
  if (!first.ok()) return first.status();
  // Every attempt this call ends, this request's first; errors of those in `more` are theirs.
  std::vector<PreparedFinish> items = {*std::move(first)};
  std::vector<absl::Status> errors(request.more_size() + 1);
  PrepareMoreFinishes(
      request, worker_id, [&](const FinishRequest& more) { return PrepareFinish(more, worker_id); },
      &items, &errors);
  // Failed attempts first, on their own path; the rest end in one store transaction with the
  // starts of the next jobs.
  std::vector<PreparedFinish*> ending;
  int freeing = 0;  // slots the ending attempts hold
  for (PreparedFinish& p : items) {
    if (p.applied_before) continue;
    if (p.request->summary().state() == FAILED) {
      errors[p.index] = FinishFailed(p);
      continue;
    }
    ending.push_back(&p);
    freeing += p.lease.slots;
  }
  if (!errors[0].ok()) return errors[0];
  const int max_next = request.acquire_next() ? std::max(1, request.acquire_max()) : 0;
  FinishResponse response;
  if (ending.empty()) {
    AcquireNextJobs(worker_id, max_next, &response);
  } else {
    EndAttemptsTogether(worker_id, ending, freeing, max_next, &errors, &response);
    if (!errors[0].ok()) return errors[0];
  }
  // BUSY while it holds a job (a next one, or another slot's), else IDLE: written when it
  // changed (a job handed over was noted BUSY as it started: one write, not two, per job).
  NoteWorkerBySlots(worker_id);
  AddMoreErrors(errors, &response);
  return response;
}

void CoordinatorCore::AcquireNextJobs(int64_t worker_id, int max_jobs, FinishResponse* response) {
  if (max_jobs <= 0) return;
  AcquireJobRequest acquire;
  acquire.set_worker_id(worker_id);
  acquire.set_worker_secret(WorkerSecret(lease_mac_, worker_id));  // its Finish showed a lease's
  acquire.set_max_jobs(max_jobs);
  absl::StatusOr<AcquireJobResponse> next = AcquireJob(acquire);
  if (!next.ok() || !next->has_job()) return;
  AddNextJob(next->job(), response);
  for (const Job& job : next->more_jobs()) AddNextJob(job, response);
}

void CoordinatorCore::EndAttemptsTogether(int64_t worker_id,
                                          const std::vector<PreparedFinish*>& ending, int freeing,
                                          int max_next, std::vector<absl::Status>* errors,
                                          FinishResponse* response) {
  std::vector<FinishWrite> writes;
  for (PreparedFinish* p : ending) writes.push_back(FinishWriteOf(*p));
  // The next runs are picked now and started in the transaction of the first write.
  std::vector<QueuedRun> next;
  if (max_next > 0) {
    absl::StatusOr<WorkerOffer> offer = OfferOf(worker_id);
    absl::MutexLock lock(&mu_);
    if (offer.ok() && !shutdown_) {
      next = scheduler_.AcquireUpTo(worker_id, *offer, max_next, freeing);
    }
  }
  AddStarts(next, worker_id, &writes[0]);
  std::vector<absl::StatusOr<FinishWriteResult>> results = store_->FinishAttempts(writes);
  {
    absl::MutexLock lock(&mu_);
    if (MirrorEndedAttempts(ending, writes, results, next, mu_, scheduler_, errors)) {
      work_cv_.SignalAll();
    }
  }
  if (results[0].ok()) StartNextJobs(worker_id, next, *results[0], response);
  // Tuned runs at a rung or at their end: their groups' decisions are due.
  const std::vector<int64_t> tuned = TunedRunsEnded(ending, results);
  if (!tuned.empty()) tuner_.TuneAfter(tuned);
}

void CoordinatorCore::StartNextJobs(int64_t worker_id, const std::vector<QueuedRun>& next,
                                    const FinishWriteResult& r, FinishResponse* response) {
  // A next job that cannot be made is not this Finish's failure: the worker asks again.
  for (size_t i = 0; i < next.size(); ++i) {
    absl::StatusOr<std::optional<Job>> job = LeaseStarted(worker_id, next[i], StartOf(r, i));
    if (job.ok() && job->has_value()) AddNextJob(**std::move(job), response);
  }
}

}  // namespace ablate
