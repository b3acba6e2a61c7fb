#include "orchestrator/coordinator/finishing.h"

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "orchestrator/coordinator/core_internal.h"
#include "orchestrator/coordinator/door.h"

namespace ablate {

absl::Status CheckFinishState(const FinishRequest& request) {
  const RunState state = request.summary().state();
  if (state != SUCCEEDED && state != DIVERGED && state != FAILED && state != CANCELLED &&
      state != INTERRUPTED) {
    return absl::InvalidArgumentError(absl::StrCat(
        "finish: state must be SUCCEEDED, DIVERGED, FAILED, CANCELLED or INTERRUPTED, got ",
        RunStateName(state)));
  }
  return absl::OkStatus();
}

absl::Status CheckFinalReportOf(const FinishRequest& request, int64_t worker_id) {
  if (!request.has_final_report()) return absl::OkStatus();
  const ReportRequest& r = request.final_report();
  if ((r.worker_id() != 0 && r.worker_id() != worker_id) ||
      (r.run_id() != 0 && r.run_id() != request.run_id()) ||
      (r.attempt() != 0 && r.attempt() != request.attempt())) {
    return absl::InvalidArgumentError(
        absl::StrCat("finish: final_report is of worker ", r.worker_id(), " run ", r.run_id(),
                     " attempt ", r.attempt(), ", not of the finished worker ", worker_id, " run ",
                     request.run_id(), " attempt ", request.attempt()));
  }
  if (r.seq() < 1) {
    return absl::InvalidArgumentError(
        "finish: final_report.seq must be >= 1 (the batch after the last acknowledged one)");
  }
  return absl::OkStatus();
}

bool IsRungPause(const FinishRequest& request, const Lease& lease) {
  return request.summary().state() == INTERRUPTED && lease.stop_at_step > 0 && !lease.stop &&
         request.summary().steps_done() == lease.stop_at_step;
}

void PrepareMoreFinishes(
    const FinishRequest& request, int64_t worker_id,
    const std::function<absl::StatusOr<PreparedFinish>(const FinishRequest&)>& prepare,
    std::vector<PreparedFinish>* items, std::vector<absl::Status>* errors) {
  for (int i = 0; i < request.more_size(); ++i) {
    const FinishRequest& more = request.more(i);
    if (more.worker_id() != 0 && more.worker_id() != worker_id) {
      (*errors)[i + 1] = absl::InvalidArgumentError(absl::StrCat(
          "finish: more[", i, "] is of worker ", more.worker_id(), ", not ", worker_id));
      continue;
    }
    if (more.more_size() > 0) {
      (*errors)[i + 1] = absl::InvalidArgumentError(
          absl::StrCat("finish: more[", i,
                       "] has more of its own; list every attempt in the outer request's more"));
      continue;
    }
    absl::StatusOr<PreparedFinish> p = prepare(more);
    if (!p.ok()) {
      (*errors)[i + 1] = p.status();
      continue;
    }
    p->index = i + 1;
    items->push_back(*std::move(p));
  }
}

FinishWrite FinishWriteOf(PreparedFinish& p) {
  const FinishRequest& request = *p.request;
  FinishWrite write;
  write.batch = std::move(p.batch);
  RunTransition& t = write.end;
  t.run_id = request.run_id();
  t.from = {RUNNING};
  t.expected_attempt = request.attempt();
  t.reason = p.reason;
  if (p.rung_pause) {
    // At its rung: PENDING with the rung's results, held until the tuner decides.
    t.attempt_end = "INTERRUPTED";
    t.to = PENDING;
    t.has_summary = true;
    t.summary = request.summary();
    t.summary.set_reason(BoundedText(t.summary.reason()));
    t.tune_hold = true;
  } else if (!p.lease.tune_stop.empty() &&
             (request.summary().state() == CANCELLED || request.summary().state() == INTERRUPTED)) {
    // Stopped by the tuner while it trained through a rung: its results so far are the run's.
    t.attempt_end = "CANCELLED";  // the attempt was stopped; the run ends STOPPED
    t.to = STOPPED;
    t.has_summary = true;
    t.summary = request.summary();
    t.summary.set_reason(BoundedText(p.lease.tune_stop));
    t.reason = t.summary.reason();
  } else if (request.summary().state() == INTERRUPTED) {
    // Resumable: queued again at once (or cancelled with its sweep).
    t.attempt_end = "INTERRUPTED";
    t.to = p.lease.stop ? CANCELLED : PENDING;
  } else {
    t.to = request.summary().state();
    t.has_summary = true;
    t.summary = request.summary();
    t.summary.set_reason(BoundedText(t.summary.reason()));
  }
  return write;
}

void AddStarts(const std::vector<QueuedRun>& next, int64_t worker_id, FinishWrite* first) {
  for (size_t i = 0; i < next.size(); ++i) {
    RunTransition start = core_internal::StartOn(next[i].run_id, worker_id);
    if (i == 0) {
      first->start = std::move(start);
    } else {
      first->more_starts.push_back(std::move(start));
    }
  }
}

absl::StatusOr<TransitionResult> StartOf(const FinishWriteResult& r, size_t i) {
  const absl::Status& status = i == 0 ? r.start_status : r.more_start_status[i - 1];
  if (!status.ok()) return status;
  return i == 0 ? r.start : r.more_starts[i - 1];
}

bool MirrorEndedAttempts(const std::vector<PreparedFinish*>& ending,
                         const std::vector<FinishWrite>& writes,
                         const std::vector<absl::StatusOr<FinishWriteResult>>& results,
                         const std::vector<QueuedRun>& next, absl::Mutex& mu, Scheduler& scheduler,
                         std::vector<absl::Status>* errors) {
  bool queued_any = false;
  if (!results[0].ok()) {
    // The starts rode on the first write: back to the queue.
    for (const QueuedRun& run : next) {
      scheduler.Release(run.run_id);
      scheduler.Enqueue(run);
    }
    queued_any = !next.empty();
  }
  for (size_t i = 0; i < ending.size(); ++i) {
    if (!results[i].ok()) {
      (*errors)[ending[i]->index] = results[i].status();
      continue;
    }
    const int64_t run_id = ending[i]->request->run_id();
    std::optional<QueuedRun> queued = scheduler.LeasedRun(run_id);
    scheduler.Release(run_id);
    if (writes[i].end.to == PENDING && queued.has_value() && !writes[i].end.tune_hold) {
      queued->not_before = absl::InfinitePast();
      scheduler.Enqueue(*queued);
      queued_any = true;
    }
  }
  return queued_any;
}

std::vector<int64_t> TunedRunsEnded(const std::vector<PreparedFinish*>& ending,
                                    const std::vector<absl::StatusOr<FinishWriteResult>>& results) {
  std::vector<int64_t> tuned;
  for (size_t i = 0; i < ending.size(); ++i) {
    if (results[i].ok() && ending[i]->lease.tuned) tuned.push_back(ending[i]->request->run_id());
  }
  return tuned;
}

void AddNextJob(Job job, FinishResponse* response) {
  if (!response->has_next_job()) {
    *response->mutable_next_job() = std::move(job);
  } else {
    *response->add_more_next_jobs() = std::move(job);
  }
}

void AddMoreErrors(const std::vector<absl::Status>& errors, FinishResponse* response) {
  for (size_t i = 1; i < errors.size(); ++i) {
    const absl::Status& e = errors[i];
    response->add_more_errors(
        e.ok() ? "" : absl::StrCat(absl::StatusCodeToString(e.code()), ": ", e.message()));
  }
}

}  // namespace ablate
