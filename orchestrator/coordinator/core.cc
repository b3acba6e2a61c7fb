// CoordinatorCore's construction: Create, the rebuild of the scheduler from the store after a
// (re)start, the background lease checker and Shutdown; what the tuner may ask of it (TunerPort);
// and the helpers its files share (core_internal.h). The client API is client_api.cc, the worker
// API worker_api.cc, the ending of attempts finish.cc.
#include "orchestrator/coordinator/core.h"

#include <algorithm>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "google/protobuf/util/json_util.h"
#include "orchestrator/coordinator/core_internal.h"
#include "orchestrator/store/reader.h"

namespace ablate {
namespace core_internal {

WorkerResources ResourcesOf(const WorkerInfo& w) {
  WorkerResources resources;
  google::protobuf::util::JsonParseOptions parse;
  parse.ignore_unknown_fields = true;
  (void)google::protobuf::util::JsonStringToMessage(w.resources_json, &resources, parse);
  return resources;
}

WorkerOffer OfferFrom(const WorkerResources& r) {
  WorkerOffer offer;
  offer.device = r.device().empty() ? "cpu" : r.device();
  offer.memory_gb = r.memory_gb();
  offer.cores = r.cores();
  offer.slots = std::max(1, r.slots());
  offer.host = !r.rendezvous_host().empty() ? r.rendezvous_host() : r.hostname();
  offer.code_version = r.code_version();
  return offer;
}

QueuedRun ToQueued(const RunInfo& run, absl::Time not_before,
                   std::shared_ptr<const JobTemplate> job) {
  QueuedRun q;
  q.run_id = run.id;
  q.sweep_id = run.sweep_id;
  q.run_index = run.run_index;
  q.needs.device = run.device;
  q.needs.memory_gb = run.memory_gb;
  q.needs.threads = run.threads;
  q.needs.devices = run.devices;
  q.needs.code_version = run.code_version;
  q.not_before = not_before;
  q.job = std::move(job);
  q.total_steps = run.steps_total;
  q.stop_at_step = run.stop_at_step;
  q.tuned = run.tuned;
  return q;
}

RunTransition StartOn(int64_t run_id, int64_t worker_id) {
  RunTransition start;
  start.run_id = run_id;
  start.from = {PENDING};
  start.to = RUNNING;
  start.worker_id = worker_id;
  return start;
}

}  // namespace core_internal

using core_internal::ResourcesOf;
using core_internal::ToQueued;

CoordinatorCore::CoordinatorCore(Store* store, const CoordinatorOptions& options)
    : store_(store),
      options_(options),
      lease_mac_(options.lease_key),
      scheduler_(options.scheduler, options.clock),
      tuner_(store, this) {}

absl::StatusOr<std::unique_ptr<CoordinatorCore>> CoordinatorCore::Create(
    Store* store, const CoordinatorOptions& options) {
  std::unique_ptr<CoordinatorCore> c(new CoordinatorCore(store, options));
  if (absl::Status s = c->Rebuild(); !s.ok()) return s;
  if (options.background_lease_checks) {
    c->lease_checker_ = std::thread([p = c.get()] { p->LeaseCheckerLoop(); });
  }
  return c;
}

CoordinatorCore::~CoordinatorCore() {
  Shutdown();
  if (lease_checker_.joinable()) lease_checker_.join();
}

void CoordinatorCore::Shutdown() {
  absl::MutexLock lock(&mu_);
  shutdown_ = true;
  work_cv_.SignalAll();
}

absl::Status CoordinatorCore::Rebuild() {
  const StoreReader& reader = store_->reader();
  absl::StatusOr<std::vector<SweepInfo>> sweeps = reader.ListSweeps();
  if (!sweeps.ok()) return sweeps.status();
  {
    absl::MutexLock lock(&mu_);
    for (const SweepInfo& s : *sweeps) {
      scheduler_.AddSweep(s.id, s.priority);
      if (s.state == "CANCELLED") scheduler_.CancelSweep(s.id);
    }
  }
  // A sweep cancelled by an older coordinator (which cancelled its runs one by one, after the
  // sweep) may have unstarted runs left: cancelled now.
  for (const SweepInfo& s : *sweeps) {
    if (s.state != "CANCELLED" || s.pending + s.interrupted == 0) continue;
    if (absl::StatusOr<SweepCancellation> c = store_->CancelSweep(s.id); !c.ok()) {
      return c.status();
    }
  }
  absl::StatusOr<std::vector<WorkerInfo>> workers = reader.ListWorkers();
  if (!workers.ok()) return workers.status();
  std::map<int64_t, int> slots_of;  // by worker
  for (const WorkerInfo& w : *workers) slots_of[w.id] = std::max(1, ResourcesOf(w).slots());
  RunFilter filter;
  filter.states = {PENDING, RUNNING, INTERRUPTED};
  absl::StatusOr<std::vector<RunInfo>> runs = reader.ListRuns(filter);
  if (!runs.ok()) return runs.status();
  for (RunInfo run : *runs) {
    // A gang's attempt (wider than its rank 0 worker): its members are not known any more, so
    // their heartbeats would be refused. Ended here, it resumes from its checkpoint.
    if (run.state == RUNNING && run.devices > slots_of[run.worker_id]) {
      RunTransition t;
      t.run_id = run.id;
      t.from = {RUNNING};
      t.expected_attempt = run.attempts;
      t.attempt_end = "LOST";
      t.to = PENDING;
      t.reason =
          "the coordinator restarted during this gang-scheduled attempt; it resumes from "
          "its checkpoint";
      if (absl::StatusOr<TransitionResult> r = store_->TransitionRun(t); !r.ok()) {
        return r.status();
      }
      run.state = PENDING;
    }
    if (run.state == INTERRUPTED) {
      RunTransition t;
      t.run_id = run.id;
      t.from = {INTERRUPTED};
      t.to = PENDING;
      t.reason = "resumed after a coordinator restart";
      if (absl::StatusOr<TransitionResult> r = store_->TransitionRun(t); !r.ok()) {
        return r.status();
      }
    }
    absl::MutexLock lock(&mu_);
    if (run.attempt_base > 0) attempt_base_[run.id] = run.attempt_base;
    if (run.state == RUNNING) {
      scheduler_.RestoreLease(run.id, run.sweep_id, run.worker_id, run.attempts,
                              ToQueued(run, absl::InfinitePast()));
    } else if (!run.held) {  // a held run waits for the tuner, below
      scheduler_.Enqueue(ToQueued(run, absl::InfinitePast()));
    }
  }
  {
    absl::MutexLock lock(&mu_);
    const absl::Time now = options_.clock->Now();
    for (const WorkerInfo& w : *workers) {
      worker_names_[w.id] = w.name;
      // Each gets a lease timeout from now to call again before CheckWorkers marks it GONE.
      if (w.state != "GONE") worker_seen_[w.id] = WorkerSeen{w.state, absl::InfinitePast(), now};
    }
  }
  // Decisions a crash left unmade (a rung arrival stored, its decision not yet) are made now.
  // One that cannot be made (a boundary probe needs the sweep's build) is an event, and the
  // coordinator serves the rest.
  for (const SweepInfo& s : *sweeps) {
    if (s.state != "ACTIVE" || s.tune_method.empty()) continue;
    if (absl::Status t = tuner_.TuneSweep(s.id); !t.ok()) {
      (void)store_->EnqueueEvent(s.id, 0, "tune_error", absl::StrCat("tuning: ", t.message()));
    }
  }
  return absl::OkStatus();
}

bool CoordinatorCore::SweepCancelled(int64_t sweep_id) {
  absl::MutexLock lock(&mu_);
  return scheduler_.IsCancelled(sweep_id);
}

void CoordinatorCore::EnqueueRun(const RunInfo& run, const RunConfig* config) {
  std::shared_ptr<JobTemplate> job;
  if (config != nullptr) {
    job = std::make_shared<JobTemplate>();
    job->config = *config;
    job->sweep = run.sweep;
    job->variant = run.variant;
  }
  absl::MutexLock lock(&mu_);
  attempt_base_[run.id] = run.attempts;
  scheduler_.Enqueue(ToQueued(run, absl::InfinitePast(), std::move(job)));
  work_cv_.SignalAll();
}

void CoordinatorCore::StopRun(int64_t run_id, const std::string& why) {
  bool was_queued = false;
  {
    absl::MutexLock lock(&mu_);
    was_queued = scheduler_.Remove(run_id);
    if (!was_queued && !why.empty()) scheduler_.Stop(run_id, why);
  }
  if (!was_queued || why.empty()) return;
  // Queued again after the decision was made (its lease was lost meanwhile): stopped there.
  RunTransition t;
  t.run_id = run_id;
  t.from = {PENDING};
  t.to = STOPPED;
  t.reason = why;
  (void)store_->TransitionRun(t);
}

std::string CoordinatorCore::WorkerName(int64_t worker_id) const {
  auto it = worker_names_.find(worker_id);
  return it != worker_names_.end() ? it->second : absl::StrCat("#", worker_id);
}

void CoordinatorCore::LeaseCheckerLoop() {
  for (;;) {
    {
      absl::MutexLock lock(&mu_);
      // On the monotonic clock: a wall clock stepped back must not stall the lease checks.
      const absl::Time until = MonotonicNow() + options_.lease_check_interval;
      for (absl::Time now = MonotonicNow(); !shutdown_ && now < until; now = MonotonicNow()) {
        work_cv_.WaitWithTimeout(&mu_, until - now);
      }
      if (shutdown_) return;
    }
    CheckLeases();
    CheckWorkers();
  }
}

}  // namespace ablate
