#include "orchestrator/coordinator/scheduler.h"

#include <algorithm>
#include <utility>

namespace ablate {

const Clock* RealClock::Get() {
  static const RealClock* clock = new RealClock();
  return clock;
}

std::string DeviceKind(const std::string& device) {
  if (device.empty()) return "cpu";
  const size_t colon = device.find(':');
  return colon == std::string::npos ? device : device.substr(0, colon);
}

bool Fits(const RunNeeds& needs, const WorkerOffer& offer) {
  if (DeviceKind(needs.device) != DeviceKind(offer.device)) return false;
  if (needs.memory_gb > 0 && needs.memory_gb > offer.memory_gb) return false;
  if (needs.threads > 0 && needs.threads > offer.cores) return false;
  if (std::max(1, needs.devices) > std::max(1, offer.slots)) return false;
  return true;
}

Scheduler::Scheduler(const SchedulerOptions& options, const Clock* clock)
    : options_(options), clock_(clock) {}

void Scheduler::AddSweep(int64_t sweep_id, int priority) {
  SweepQueue& sweep = sweeps_[sweep_id];
  const int p = std::max(priority, 1);
  if (sweep.priority == p) return;
  sweep.priority = p;
}

std::vector<int64_t> Scheduler::CancelSweep(int64_t sweep_id) {
  SweepQueue& sweep = sweeps_[sweep_id];
  sweep.cancelled = true;
  std::vector<int64_t> dropped;
  for (const auto& [id, run] : queued_) {
    if (run.sweep_id == sweep_id) dropped.push_back(id);
  }
  std::sort(dropped.begin(), dropped.end());
  for (int64_t id : dropped) Remove(id);
  for (auto& [id, lease] : leases_) {
    if (lease.sweep_id == sweep_id) lease.stop = true;
  }
  return dropped;
}

void Scheduler::UncancelSweep(int64_t sweep_id) { sweeps_[sweep_id].cancelled = false; }

bool Scheduler::IsCancelled(int64_t sweep_id) const {
  auto it = sweeps_.find(sweep_id);
  return it != sweeps_.end() && it->second.cancelled;
}

void Scheduler::SetActive(int64_t sweep_id, SweepQueue& sweep) {
  // A sweep coming back starts at the current global pass: no credit banked while idle.
  sweep.pass = std::max(sweep.pass, global_pass_);
  active_.emplace(sweep.pass, sweep_id);
}

void Scheduler::MakeDue(const QueuedRun& run) {
  SweepQueue& sweep = sweeps_[run.sweep_id];
  RunNeeds needs = run.needs;
  needs.device = DeviceKind(needs.device);
  sweep.buckets[needs].emplace(run.run_index, run.run_id);
  if (sweep.due++ == 0) SetActive(run.sweep_id, sweep);
}

void Scheduler::EraseFromBucket(const QueuedRun& run) {
  auto sit = sweeps_.find(run.sweep_id);
  if (sit == sweeps_.end()) return;
  SweepQueue& sweep = sit->second;
  RunNeeds needs = run.needs;
  needs.device = DeviceKind(needs.device);
  auto bit = sweep.buckets.find(needs);
  if (bit == sweep.buckets.end()) return;
  if (bit->second.erase({run.run_index, run.run_id}) == 0) return;
  if (bit->second.empty()) sweep.buckets.erase(bit);
  if (--sweep.due == 0) active_.erase({sweep.pass, run.sweep_id});
}

bool Scheduler::Enqueue(const QueuedRun& run) {
  if (queued_.count(run.run_id) || leases_.count(run.run_id)) return false;
  if (IsCancelled(run.sweep_id)) return false;
  sweeps_.try_emplace(run.sweep_id);
  leased_runs_.erase(run.run_id);
  queued_.emplace(run.run_id, run);
  if (run.not_before > clock_->Now()) {
    delayed_.emplace(run.not_before, run.run_id);
  } else {
    MakeDue(run);
  }
  return true;
}

bool Scheduler::Remove(int64_t run_id) {
  auto it = queued_.find(run_id);
  if (it == queued_.end()) return false;
  const QueuedRun& run = it->second;
  if (delayed_.erase({run.not_before, run_id}) == 0) EraseFromBucket(run);
  queued_.erase(it);
  return true;
}

void Scheduler::PromoteDelayed() {
  const absl::Time now = clock_->Now();
  while (!delayed_.empty() && delayed_.begin()->first <= now) {
    const int64_t run_id = delayed_.begin()->second;
    delayed_.erase(delayed_.begin());
    auto it = queued_.find(run_id);
    if (it != queued_.end()) MakeDue(it->second);
  }
}

std::optional<QueuedRun> Scheduler::Acquire(int64_t worker_id, const WorkerOffer& offer,
                                            int freeing) {
  PromoteDelayed();
  const int free_slots = std::max(1, offer.slots) - SlotsInUse(worker_id) + freeing;
  if (free_slots <= 0) return std::nullopt;
  for (auto ait = active_.begin(); ait != active_.end(); ++ait) {
    const auto [pass, sweep_id] = *ait;
    SweepQueue& sweep = sweeps_[sweep_id];
    const std::pair<int, int64_t>* best = nullptr;
    int best_devices = 1;
    for (const auto& [needs, bucket] : sweep.buckets) {
      if (!Fits(needs, offer)) continue;
      if (best == nullptr || *bucket.begin() < *best) {
        best = &*bucket.begin();
        best_devices = std::max(1, needs.devices);
      }
    }
    if (best == nullptr) continue;
    // The run this worker owes its next slots to: nothing smaller jumps ahead of it.
    if (best_devices > free_slots) return std::nullopt;
    const int64_t run_id = best->second;
    auto qit = queued_.find(run_id);
    QueuedRun run = qit->second;
    EraseFromBucket(run);  // may erase *ait: do not touch ait after this
    queued_.erase(qit);
    // Stride scheduling: charge the sweep one dispatch.
    global_pass_ = pass;
    if (sweep.due > 0) active_.erase({sweep.pass, sweep_id});
    sweep.pass = pass + kStride / sweep.priority;
    if (sweep.due > 0) active_.emplace(sweep.pass, sweep_id);

    Lease lease;
    lease.run_id = run_id;
    lease.sweep_id = sweep_id;
    lease.worker_id = worker_id;
    lease.expiry = clock_->Now() + options_.lease_timeout;
    lease.stop = sweep.cancelled;
    lease.total_steps = run.total_steps;
    AddLease(lease, run);
    return run;
  }
  return std::nullopt;
}

std::vector<QueuedRun> Scheduler::AcquireUpTo(int64_t worker_id, const WorkerOffer& offer,
                                              int max_runs, int freeing) {
  std::vector<QueuedRun> runs;
  while (static_cast<int>(runs.size()) < max_runs) {
    std::optional<QueuedRun> run = Acquire(worker_id, offer, freeing);
    if (!run.has_value()) break;
    runs.push_back(*std::move(run));
  }
  return runs;
}

int Scheduler::SlotsInUse(int64_t worker_id) const {
  auto it = slots_in_use_.find(worker_id);
  return it == slots_in_use_.end() ? 0 : it->second;
}

void Scheduler::AddLease(const Lease& lease, const QueuedRun& run) {
  Lease& added = leases_[lease.run_id] = lease;
  added.slots = std::max(1, run.needs.devices);
  slots_in_use_[lease.worker_id] += added.slots;
  expiries_.emplace(lease.expiry, lease.run_id);
  leased_runs_[lease.run_id] = run;
}

void Scheduler::DropLease(const Lease& lease) {
  expiries_.erase({lease.expiry, lease.run_id});
  auto it = slots_in_use_.find(lease.worker_id);
  if (it != slots_in_use_.end() && (it->second -= lease.slots) <= 0) slots_in_use_.erase(it);
}

void Scheduler::SetLeaseAttempt(int64_t run_id, int32_t attempt) {
  auto it = leases_.find(run_id);
  if (it != leases_.end()) it->second.attempt = attempt;
}

void Scheduler::RestoreLease(int64_t run_id, int64_t sweep_id, int64_t worker_id,
                             int32_t attempt, const QueuedRun& run) {
  Release(run_id);
  Remove(run_id);
  sweeps_.try_emplace(sweep_id);
  Lease lease;
  lease.run_id = run_id;
  lease.sweep_id = sweep_id;
  lease.worker_id = worker_id;
  lease.attempt = attempt;
  lease.expiry = clock_->Now() + options_.lease_timeout;
  lease.stop = IsCancelled(sweep_id);
  lease.total_steps = run.total_steps;
  AddLease(lease, run);
}

std::optional<Lease> Scheduler::GetLease(int64_t run_id) const {
  auto it = leases_.find(run_id);
  if (it == leases_.end()) return std::nullopt;
  return it->second;
}

bool Scheduler::Renew(int64_t run_id, int32_t attempt, int64_t worker_id) {
  auto it = leases_.find(run_id);
  if (it == leases_.end()) return false;
  Lease& lease = it->second;
  if (lease.attempt != attempt || lease.worker_id != worker_id) return false;
  expiries_.erase({lease.expiry, run_id});
  lease.expiry = clock_->Now() + options_.lease_timeout;
  expiries_.emplace(lease.expiry, run_id);
  return true;
}

bool Scheduler::Stop(int64_t run_id) {
  auto it = leases_.find(run_id);
  if (it == leases_.end()) return false;
  it->second.stop = true;
  return true;
}

std::optional<Lease> Scheduler::Release(int64_t run_id) {
  leased_runs_.erase(run_id);
  auto it = leases_.find(run_id);
  if (it == leases_.end()) return std::nullopt;
  Lease lease = it->second;
  DropLease(lease);
  leases_.erase(it);
  return lease;
}

std::vector<Lease> Scheduler::ExpireLeases() {
  const absl::Time now = clock_->Now();
  std::vector<Lease> expired;
  while (!expiries_.empty() && expiries_.begin()->first <= now) {
    const int64_t run_id = expiries_.begin()->second;
    auto it = leases_.find(run_id);
    expired.push_back(it->second);
    DropLease(it->second);
    leases_.erase(it);
    // leased_runs_ keeps the run until the caller requeued it (LeasedRun) or it is released.
  }
  return expired;
}

std::optional<QueuedRun> Scheduler::LeasedRun(int64_t run_id) const {
  auto it = leased_runs_.find(run_id);
  if (it == leased_runs_.end()) return std::nullopt;
  return it->second;
}

absl::Time Scheduler::NextDeadline() const {
  absl::Time next = absl::InfiniteFuture();
  if (!expiries_.empty()) next = std::min(next, expiries_.begin()->first);
  if (!delayed_.empty()) next = std::min(next, delayed_.begin()->first);
  return next;
}

RetryDecision Scheduler::RetryAfterLoss(int attempts) const {
  RetryDecision d;
  if (attempts >= options_.max_attempts) return d;
  d.retry = true;
  absl::Duration delay = options_.retry_base;
  for (int i = 1; i < attempts && delay < options_.retry_cap; ++i) delay *= 2;
  d.not_before = clock_->Now() + std::min(delay, options_.retry_cap);
  return d;
}

}  // namespace ablate
