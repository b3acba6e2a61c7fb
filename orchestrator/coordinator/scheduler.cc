#include "orchestrator/coordinator/scheduler.h"

#include <algorithm>
#include <utility>

#include "config/program_config.h"

namespace ablate {

std::string DeviceKind(const std::string& device) {
  if (device.empty()) return "cpu";
  const size_t colon = device.find(':');
  return colon == std::string::npos ? device : device.substr(0, colon);
}

bool FitsRanks(const RunNeeds& needs, const WorkerOffer& offer) {
  // A program run needs the program's code (its job carries it), not a build of ablate's.
  if (needs.code_version != offer.code_version && !IsProgramCodeVersion(needs.code_version)) {
    return false;
  }
  if (DeviceKind(needs.device) != DeviceKind(offer.device)) return false;
  if (needs.memory_gb > 0 && needs.memory_gb > offer.memory_gb) return false;
  if (needs.threads > 0 && needs.threads > offer.cores) return false;
  return true;
}

bool Fits(const RunNeeds& needs, const WorkerOffer& offer) {
  return FitsRanks(needs, offer) && std::max(1, needs.devices) <= std::max(1, offer.slots);
}

const GangMember* Lease::MemberOf(int64_t worker) const {
  for (const GangMember& m : members) {
    if (m.worker_id == worker) return &m;
  }
  return nullptr;
}

int Scheduler::FormingGang::Reserved() const {
  int n = 0;
  for (const auto& [worker, slots] : reserved) n += slots;
  return n;
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
  DissolveGang(run_id);
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

void Scheduler::AddWorker(int64_t worker_id, const WorkerOffer& offer) {
  workers_[worker_id] = offer;
}

void Scheduler::RemoveWorker(int64_t worker_id) {
  workers_.erase(worker_id);
  for (auto& [run_id, gang] : forming_) {
    if (auto it = gang.seen.find(worker_id); it != gang.seen.end()) it->second = absl::InfinitePast();
  }
  ExpireReservations();
}

bool Scheduler::GangFor(const RunNeeds& needs) const {
  const int devices = std::max(1, needs.devices);
  int slots = 0;
  for (const auto& [id, offer] : workers_) {
    if (!FitsRanks(needs, offer)) continue;
    if (std::max(1, offer.slots) >= devices) return false;  // it waits for that worker
    slots += std::max(1, offer.slots);
  }
  return slots >= devices;
}

std::string Scheduler::OtherBuildNeeded(const WorkerOffer& offer) const {
  WorkerOffer rebuilt = offer;
  std::string needed;
  std::pair<int64_t, std::pair<int, int64_t>> first;  // (sweep, (run_index, run_id)) of `needed`
  for (const auto& [sweep_id, sweep] : sweeps_) {
    for (const auto& [needs, bucket] : sweep.buckets) {
      rebuilt.code_version = needs.code_version;
      if (!FitsRanks(needs, rebuilt)) continue;  // not for this worker whatever its build
      if (needs.code_version == offer.code_version || IsProgramCodeVersion(needs.code_version)) {
        return "";
      }
      const std::pair<int64_t, std::pair<int, int64_t>> at = {sweep_id, *bucket.begin()};
      if (needed.empty() || at < first) {
        needed = needs.code_version;
        first = at;
      }
    }
  }
  return needed;
}

int Scheduler::SlotsReserved(int64_t worker_id) const {
  auto it = reserved_.find(worker_id);
  return it == reserved_.end() ? 0 : it->second;
}

void Scheduler::Unreserve(int64_t worker_id, int slots) {
  if ((reserved_[worker_id] -= slots) <= 0) reserved_.erase(worker_id);
}

void Scheduler::ExpireReservations() {
  if (forming_.empty()) return;
  const absl::Time now = clock_->Now();
  std::vector<int64_t> dissolve;
  for (auto& [run_id, gang] : forming_) {
    for (auto it = gang.reserved.begin(); it != gang.reserved.end();) {
      if (gang.seen[it->first] + options_.lease_timeout > now) {
        ++it;
        continue;
      }
      Unreserve(it->first, it->second);
      gang.seen.erase(it->first);
      it = gang.reserved.erase(it);
    }
    if (gang.reserved.empty() || !queued_.count(run_id) || !GangFor(gang.needs)) {
      dissolve.push_back(run_id);
    }
  }
  for (int64_t run_id : dissolve) DissolveGang(run_id);
}

void Scheduler::DissolveGang(int64_t run_id) {
  auto it = forming_.find(run_id);
  if (it == forming_.end()) return;
  for (const auto& [worker, slots] : it->second.reserved) {
    Unreserve(worker, slots);
  }
  forming_.erase(it);
}

void Scheduler::Dispatch(double pass, int64_t sweep_id, const QueuedRun& run) {
  SweepQueue& sweep = sweeps_[sweep_id];
  EraseFromBucket(run);
  queued_.erase(run.run_id);
  // Stride scheduling: charge the sweep one dispatch.
  global_pass_ = pass;
  if (sweep.due > 0) active_.erase({sweep.pass, sweep_id});
  sweep.pass = pass + kStride / sweep.priority;
  if (sweep.due > 0) active_.emplace(sweep.pass, sweep_id);
}

std::optional<QueuedRun> Scheduler::JoinGang(int64_t run_id, int64_t worker_id, int free_slots) {
  FormingGang& gang = forming_[run_id];
  gang.seen[worker_id] = clock_->Now();
  const int add = std::min(free_slots, gang.needs.devices - gang.Reserved());
  if (add <= 0) return std::nullopt;
  auto mine = std::find_if(gang.reserved.begin(), gang.reserved.end(),
                           [&](const auto& r) { return r.first == worker_id; });
  if (mine == gang.reserved.end()) {
    gang.reserved.emplace_back(worker_id, add);
  } else {
    mine->second += add;
  }
  reserved_[worker_id] += add;
  if (gang.Reserved() < gang.needs.devices) return std::nullopt;

  // Complete: the run is leased to every member, this worker's part first (rank 0).
  FormingGang formed = std::move(gang);
  forming_.erase(run_id);
  for (const auto& [worker, slots] : formed.reserved) {
    Unreserve(worker, slots);
  }
  std::stable_partition(formed.reserved.begin(), formed.reserved.end(),
                        [&](const auto& r) { return r.first == worker_id; });
  QueuedRun run = queued_.at(run_id);
  auto ait = active_.find({sweeps_[run.sweep_id].pass, run.sweep_id});
  Dispatch(ait != active_.end() ? ait->first : global_pass_, run.sweep_id, run);
  Lease lease;
  lease.run_id = run_id;
  lease.sweep_id = run.sweep_id;
  lease.worker_id = worker_id;
  lease.expiry = clock_->Now() + options_.lease_timeout;
  lease.stop = IsCancelled(run.sweep_id);
  lease.total_steps = run.total_steps;
  lease.stop_at_step = run.stop_at_step;
  lease.tuned = run.tuned;
  int offset = 0;
  for (const auto& [worker, slots] : formed.reserved) {
    GangMember& m = lease.members.emplace_back();
    m.worker_id = worker;
    m.slots = slots;
    m.rank_offset = offset;
    m.expiry = lease.expiry;
    offset += slots;
    if (worker != worker_id) undelivered_[worker].push_back(run_id);
  }
  AddLease(lease, run);
  return run;
}

std::vector<GangPart> Scheduler::TakeParts(int64_t worker_id) {
  std::vector<GangPart> parts;
  auto uit = undelivered_.find(worker_id);
  if (uit == undelivered_.end()) return parts;
  std::vector<int64_t>& runs = uit->second;
  for (auto it = runs.begin(); it != runs.end();) {
    auto lit = leases_.find(*it);
    if (lit == leases_.end() || lit->second.MemberOf(worker_id) == nullptr) {
      it = runs.erase(it);  // that attempt ended before the part was taken
      continue;
    }
    if (lit->second.attempt == 0) {
      ++it;  // not started in the store yet
      continue;
    }
    parts.push_back(GangPart{leased_runs_.at(*it), lit->second.attempt});
    it = runs.erase(it);
  }
  if (runs.empty()) undelivered_.erase(uit);
  return parts;
}

void Scheduler::LeaveGang(int64_t run_id, int64_t worker_id) {
  auto git = forming_.find(run_id);
  if (git == forming_.end()) return;
  FormingGang& gang = git->second;
  for (auto it = gang.reserved.begin(); it != gang.reserved.end(); ++it) {
    if (it->first != worker_id) continue;
    Unreserve(worker_id, it->second);
    gang.reserved.erase(it);
    break;
  }
  gang.seen.erase(worker_id);
  if (gang.reserved.empty()) forming_.erase(git);
}

std::optional<QueuedRun> Scheduler::Acquire(int64_t worker_id, const WorkerOffer& offer,
                                            int freeing) {
  PromoteDelayed();
  ExpireReservations();
  // A forming gang it fits goes first, the lowest run id of them: every worker that fits it
  // joins it (leaving any other), so the first gang completes rather than two gangs each
  // holding part of the workers the other needs.
  for (auto& [run_id, gang] : forming_) {
    if (!FitsRanks(gang.needs, offer)) continue;
    const int64_t target = run_id;
    std::vector<int64_t> others;
    for (const auto& [other, g] : forming_) {
      if (other != target && g.seen.count(worker_id)) others.push_back(other);
    }
    for (int64_t other : others) LeaveGang(other, worker_id);
    FormingGang& joined = forming_.at(target);
    if (joined.seen.count(worker_id)) joined.seen[worker_id] = clock_->Now();  // still waiting
    const int free_slots = std::max(1, offer.slots) - SlotsInUse(worker_id) + freeing;
    if (free_slots <= 0) return std::nullopt;
    return JoinGang(target, worker_id, free_slots);
  }
  const int free_slots = std::max(1, offer.slots) - SlotsInUse(worker_id) + freeing;
  if (free_slots <= 0) return std::nullopt;
  for (auto ait = active_.begin(); ait != active_.end(); ++ait) {
    const auto [pass, sweep_id] = *ait;
    SweepQueue& sweep = sweeps_[sweep_id];
    const std::pair<int, int64_t>* best = nullptr;
    const RunNeeds* best_needs = nullptr;
    for (const auto& [needs, bucket] : sweep.buckets) {
      if (!FitsRanks(needs, offer)) continue;
      // Wider than this worker: a gang, when no known worker is wide enough and together
      // they are; never for a program, whose ranks the worker starts itself (one worker).
      if (std::max(1, needs.devices) > std::max(1, offer.slots) &&
          (IsProgramCodeVersion(needs.code_version) || !GangFor(needs))) {
        continue;
      }
      if (best == nullptr || *bucket.begin() < *best) {
        best = &*bucket.begin();
        best_needs = &needs;
      }
    }
    if (best == nullptr) continue;
    const int best_devices = std::max(1, best_needs->devices);
    const int64_t run_id = best->second;
    if (best_devices > std::max(1, offer.slots)) {
      FormingGang& gang = forming_[run_id];
      gang.needs = *best_needs;
      gang.sweep_id = sweep_id;
      return JoinGang(run_id, worker_id, free_slots);
    }
    // The run this worker owes its next slots to: nothing smaller jumps ahead of it.
    if (best_devices > free_slots) return std::nullopt;
    QueuedRun run = queued_.at(run_id);
    Dispatch(pass, sweep_id, run);  // may erase *ait: do not touch ait after this
    DissolveGang(run_id);  // taken whole by a worker wide enough

    Lease lease;
    lease.run_id = run_id;
    lease.sweep_id = sweep_id;
    lease.worker_id = worker_id;
    lease.expiry = clock_->Now() + options_.lease_timeout;
    lease.stop = sweep.cancelled;
    lease.total_steps = run.total_steps;
    lease.stop_at_step = run.stop_at_step;
    lease.tuned = run.tuned;
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
  return (it == slots_in_use_.end() ? 0 : it->second) + SlotsReserved(worker_id);
}

void Scheduler::AddLease(const Lease& lease, const QueuedRun& run) {
  Lease& added = leases_[lease.run_id] = lease;
  if (added.members.empty()) {
    added.slots = std::max(1, run.needs.devices);
    slots_in_use_[lease.worker_id] += added.slots;
  } else {
    added.slots = added.members.front().slots;
    for (const GangMember& m : added.members) {
      if (!m.done) slots_in_use_[m.worker_id] += m.slots;
    }
  }
  expiries_.emplace(lease.expiry, lease.run_id);
  leased_runs_[lease.run_id] = run;
}

void Scheduler::DropLease(const Lease& lease) {
  expiries_.erase({lease.expiry, lease.run_id});
  if (lease.members.empty()) {
    FreeSlots(lease.worker_id, lease.slots);
    return;
  }
  for (const GangMember& m : lease.members) {
    if (!m.done) FreeSlots(m.worker_id, m.slots);
  }
}

void Scheduler::SetExpiry(Lease& lease, absl::Time expiry) {
  expiries_.erase({lease.expiry, lease.run_id});
  lease.expiry = expiry;
  expiries_.emplace(lease.expiry, lease.run_id);
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
  lease.stop_at_step = run.stop_at_step;
  lease.tuned = run.tuned;
  AddLease(lease, run);
}

void Scheduler::Reinstate(Lease lease) {
  auto rit = leased_runs_.find(lease.run_id);
  if (rit == leased_runs_.end() || leases_.count(lease.run_id)) return;
  lease.expiry = clock_->Now() + options_.lease_timeout;
  for (GangMember& m : lease.members) m.expiry = lease.expiry;
  AddLease(lease, rit->second);
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
  if (lease.attempt != attempt || !lease.Holds(worker_id)) return false;
  const absl::Time expiry = clock_->Now() + options_.lease_timeout;
  if (lease.members.empty()) {
    SetExpiry(lease, expiry);
    return true;
  }
  for (GangMember& m : lease.members) {
    if (m.worker_id != worker_id || m.done) continue;
    m.expiry = expiry;
    SetExpiry(lease, EarliestPart(lease));
    return true;
  }
  return false;
}

absl::Time Scheduler::EarliestPart(const Lease& lease) {
  absl::Time earliest = absl::InfiniteFuture();
  for (const GangMember& m : lease.members) {
    if (!m.done) earliest = std::min(earliest, m.expiry);
  }
  return earliest;
}

void Scheduler::FreeSlots(int64_t worker_id, int slots) {
  auto it = slots_in_use_.find(worker_id);
  if (it != slots_in_use_.end() && (it->second -= slots) <= 0) slots_in_use_.erase(it);
}

bool Scheduler::ReleaseMember(int64_t run_id, int32_t attempt, int64_t worker_id) {
  auto it = leases_.find(run_id);
  if (it == leases_.end()) return false;
  Lease& lease = it->second;
  if (lease.attempt != attempt || worker_id == lease.worker_id) return false;
  for (GangMember& m : lease.members) {
    if (m.worker_id != worker_id || m.done) continue;
    m.done = true;
    FreeSlots(worker_id, m.slots);
    SetExpiry(lease, EarliestPart(lease));
    return true;
  }
  return false;
}

bool Scheduler::Stop(int64_t run_id, const std::string& tune_stop) {
  auto it = leases_.find(run_id);
  if (it == leases_.end()) return false;
  it->second.stop = true;
  if (!tune_stop.empty()) it->second.tune_stop = tune_stop;
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
  ExpireReservations();
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
