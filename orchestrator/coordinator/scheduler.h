// The coordinator's scheduler: which PENDING run a worker gets next, and the leases of running
// jobs. Pure logic: no gRPC, no SQLite, time from an injected Clock (tests use a fake one).
//
// Queue. Every PENDING run is queued in its sweep, in run order (run_index). Within a sweep runs
// are bucketed by what they need (device kind, memory, threads), so finding the first run a
// worker can take costs one ordered-set lookup per bucket. A run that must wait (a retry's
// backoff) sits in a min-heap by not_before and joins its sweep's queue when due.
//
// Fair share. Sweeps with queued work are served by stride scheduling: each has a pass value;
// a dispatch picks the lowest pass among sweeps holding a run the worker fits and advances that
// sweep's pass by kStride / priority. Over time a sweep of priority 3 gets three times the
// dispatches of a sweep of priority 1. A sweep that becomes runnable again starts at the current
// global pass (no banking of credit while idle).
//
// Cost: Acquire is O(S * B * log n) for S sweeps with queued work and B resource buckets per
// sweep (B is 1 for specs with one `resources:`), n queued runs; Enqueue, Renew and Release are
// O(log n); ExpireLeases is O(log n) per expired lease.
//
// Slots. A worker offers `slots` devices or core groups; a lease holds as many of them as its
// run needs (RunNeeds::devices), and a worker takes runs while its free slots allow: several
// single-device runs side by side, or one run of N devices on N slots at once (all or nothing).
// No starving: when the run a worker would get next (the lowest-pass sweep's first run it could
// ever fit) needs more slots than are free, the worker takes nothing else until enough of its
// slots are free for that run, so a queued N-device run is not passed over forever by smaller ones.
//
// Gangs. A run needing more devices than any worker the scheduler knows (AddWorker) has, but
// fitting them otherwise, is gang-scheduled across several workers once they have enough slots
// between them; a run wider than all of them waits without holding anyone. Its gang forms as
// workers poll: each reserves its free slots for the run (they count as in use, so it takes
// nothing else meanwhile). A worker joins the forming gang of the lowest run id it fits, leaving
// any other (a total order: two gangs never each hold workers the other needs), before it starts
// one, and the worker whose slots complete it gets the run as rank 0's worker (the primary).
// Then every member holds one lease: `Lease::members`, rank 0's worker first, each with its
// ranks [rank_offset, rank_offset + slots). The others take their parts with TakeParts once the
// store started the attempt (SetLeaseAttempt). A member renews its own part;
// the lease expires when any member's part does (a lost member ends the whole attempt), and
// Release frees every member's slots. A reserving worker silent for lease_timeout, or removed
// (RemoveWorker), gives its reservation back; a gang that can no longer complete (too few slots
// left) dissolves. A worker that could take the run whole dissolves a forming gang by taking it.
//
// Leases. A dispatched run holds a lease (worker, attempt) that expires lease_timeout after the
// last Renew. ExpireLeases returns the expired ones; the coordinator ends those attempts as LOST
// and asks RetryAfterLoss / RetryAfterFailure whether and when to queue the run again:
// not before now + min(retry_base * 2^(attempts-1), retry_cap), and not at all once `attempts`
// reached max_attempts (the run is then FAILED). DIVERGED is a result and never reaches here.
//
// Thread safety: not thread-safe. The coordinator calls it under its own mutex.
#ifndef ABLATE_ORCHESTRATOR_COORDINATOR_SCHEDULER_H_
#define ABLATE_ORCHESTRATOR_COORDINATOR_SCHEDULER_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/clock.h"

namespace ablate {

struct SchedulerOptions {
  // A lease not renewed for this long is lost. Workers report (renewing it) at least every few
  // seconds while training.
  absl::Duration lease_timeout = absl::Seconds(60);
  // Backoff before a retry after a lost lease or a failed attempt: base * 2^(attempts-1), capped.
  absl::Duration retry_base = absl::Seconds(5);
  absl::Duration retry_cap = absl::Minutes(5);
  // Attempts (lost or failed) after which a run is FAILED instead of queued again.
  int max_attempts = 4;
};

// What a run needs from a worker (runs.device, memory_gb, threads; its sweep's code_version).
struct RunNeeds {
  std::string device = "cpu";  // "cpu" or "cuda" (a "cuda:N" is read as "cuda")
  double memory_gb = 0;        // 0 = any
  int threads = 0;             // 0 = any
  int devices = 1;             // ranks (data parallel): a worker with this many slots
  // The build it is keyed to (common/version.h): only a worker of this code version takes it.
  std::string code_version;
  bool operator<(const RunNeeds& o) const {
    return std::tie(device, memory_gb, threads, devices, code_version) <
           std::tie(o.device, o.memory_gb, o.threads, o.devices, o.code_version);
  }
};

// What a worker offers (WorkerResources).
struct WorkerOffer {
  std::string device = "cpu";  // "cpu", "cuda", "cuda:N"
  double memory_gb = 0;        // 0 = unknown: only runs that need no memory fit
  int cores = 0;               // 0 = unknown: only runs that need no threads fit
  int slots = 1;               // devices or core groups: runs needing up to this many fit
  std::string host;            // where other workers reach its rendezvous (a gang's rank 0)
  std::string code_version;    // its build's (WorkerResources.code_version)
};

// "cuda:1" -> "cuda", "" -> "cpu".
std::string DeviceKind(const std::string& device);
// Whether a worker offering `offer` may take a run needing `needs`.
bool Fits(const RunNeeds& needs, const WorkerOffer& offer);
// Whether it may train some ranks of such a run (same code version; device kind, memory and
// threads fit; the run's devices may exceed its slots: a gang).
bool FitsRanks(const RunNeeds& needs, const WorkerOffer& offer);

// What the coordinator makes a run's job from (core_internal.h). The scheduler only carries it,
// from queue to lease and back, and drops it with the run.
struct JobTemplate;

// A PENDING run handed to the scheduler.
struct QueuedRun {
  int64_t run_id = 0;
  int64_t sweep_id = 0;
  int run_index = 0;  // run order inside the sweep
  RunNeeds needs;
  absl::Time not_before = absl::InfinitePast();  // backoff: not dispatched before this
  std::shared_ptr<const JobTemplate> job;  // may be null: the coordinator reads the store
  int64_t total_steps = 0;  // train.steps: reports name steps in [0, total_steps]
  // A tuned run (`tune:`): the rung it pauses at (Job.stop_at_step; 0 = its end), and whether it
  // is tuned at all (its ends are the tuner's to decide on).
  int64_t stop_at_step = 0;
  bool tuned = false;
};

// One worker's part of a gang-scheduled run: ranks [rank_offset, rank_offset + slots).
struct GangMember {
  int64_t worker_id = 0;
  int slots = 0;
  int rank_offset = 0;
  absl::Time expiry;   // of its part: renewed by its own reports
  bool done = false;   // finished its part (ReleaseMember): slots free, no reports expected
};

struct Lease {
  int64_t run_id = 0;
  int64_t sweep_id = 0;
  int64_t worker_id = 0;  // a gang's: rank 0's worker
  int32_t attempt = 0;
  absl::Time expiry;
  bool stop = false;  // the run was cancelled: the next report says DIRECTIVE_STOP
  // Set with stop by a tuner's decision (a run that trains through its rungs): why, and the run
  // ends STOPPED rather than CANCELLED.
  std::string tune_stop;
  int64_t total_steps = 0;  // the run's QueuedRun::total_steps
  int64_t stop_at_step = 0;  // and its QueuedRun::stop_at_step and tuned
  bool tuned = false;
  int slots = 1;            // of the worker's slots the run holds (its RunNeeds::devices)
  // A gang-scheduled run's members, rank 0's worker (worker_id) first; empty otherwise. The
  // lease's expiry is the earliest of its members' still running.
  std::vector<GangMember> members;
  // The member part of `worker`, if it has one (a gang's).
  const GangMember* MemberOf(int64_t worker) const;
  // Whether `worker` holds this lease or a part of it.
  bool Holds(int64_t worker) const { return worker == worker_id || MemberOf(worker) != nullptr; }
};

// A gang's part for a member other than rank 0's worker, its attempt started (TakeParts).
struct GangPart {
  QueuedRun run;
  int32_t attempt = 0;
};

// Whether and when a run is queued again after an attempt ended badly.
struct RetryDecision {
  bool retry = false;        // false: the run is FAILED (max_attempts reached)
  absl::Time not_before;     // when retry
};

class Scheduler {
 public:
  // `clock` must outlive the scheduler.
  Scheduler(const SchedulerOptions& options, const Clock* clock);

  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  const SchedulerOptions& options() const { return options_; }

  // Declares a sweep and its priority (>= 1; smaller values count as 1). Idempotent; a new
  // priority applies from now on.
  void AddSweep(int64_t sweep_id, int priority);
  // Marks a sweep cancelled: its queued runs are dropped (returned), running ones get stop=true
  // and any run of it enqueued later is refused. Returns the dropped run ids.
  std::vector<int64_t> CancelSweep(int64_t sweep_id);
  // Lifts a cancellation (a rerun of a cancelled sweep).
  void UncancelSweep(int64_t sweep_id);
  bool IsCancelled(int64_t sweep_id) const;

  // Queues a PENDING run (AddSweep first). False (nothing queued) when it is queued or leased
  // already, or its sweep is cancelled.
  bool Enqueue(const QueuedRun& run);
  // Drops a queued run (cancelled). False when it was not queued.
  bool Remove(int64_t run_id);

  // The workers that may poll, for gangs (a run is gang-scheduled only when the known workers
  // have the slots for it). AddWorker again replaces the offer. RemoveWorker (gone) also takes
  // back its reservations.
  void AddWorker(int64_t worker_id, const WorkerOffer& offer);
  void RemoveWorker(int64_t worker_id);

  // Picks the next run for a worker: the lowest-pass sweep holding a due run the worker fits,
  // its first such run in run order (or it joins a forming gang: see "Gangs"). The
  // run leaves the queue and is leased to worker_id from now (attempt 0 until SetLeaseAttempt).
  // nullopt when no queued run fits or is due, when that run needs more slots than the worker
  // has free (see "Slots"), or while the worker's slots wait in a forming gang. `freeing` slots
  // of the worker's leases count as free (a Finish picks the next runs before it releases its
  // own).
  std::optional<QueuedRun> Acquire(int64_t worker_id, const WorkerOffer& offer, int freeing = 0);
  // The gang parts of worker_id whose attempts started since it last asked: they are its jobs
  // now (their slots were counted when the gang formed). Acquire never returns them.
  std::vector<GangPart> TakeParts(int64_t worker_id);
  // Acquire up to `max_runs` times, while it returns runs.
  std::vector<QueuedRun> AcquireUpTo(int64_t worker_id, const WorkerOffer& offer, int max_runs,
                                     int freeing = 0);
  // When no due queued run fits `offer` but some would with another code version: the code
  // version of the first of those (lowest sweep id, then run order), which the worker would
  // need to be built from. "" otherwise (some run fits it, or none would whatever its build).
  std::string OtherBuildNeeded(const WorkerOffer& offer) const;
  // Slots of worker_id its leases hold or a forming gang reserved.
  int SlotsInUse(int64_t worker_id) const;
  // Slots of worker_id reserved by forming gangs.
  int SlotsReserved(int64_t worker_id) const;
  // Records the attempt number of a lease once the store has started it.
  void SetLeaseAttempt(int64_t run_id, int32_t attempt);

  // Installs a lease directly (rebuilding after a restart: RUNNING runs get a fresh lease).
  void RestoreLease(int64_t run_id, int64_t sweep_id, int64_t worker_id, int32_t attempt,
                    const QueuedRun& run);

  // Installs an expired lease again (ExpireLeases returned it; the coordinator could not end
  // its attempt), its members included, renewed from now.
  void Reinstate(Lease lease);

  // The lease of a running run, if any.
  std::optional<Lease> GetLease(int64_t run_id) const;
  // Renews the lease of (run, attempt) held by worker_id (a gang member: its part):
  // expiry = now + lease_timeout. False when no such lease exists (lost, finished, or another
  // attempt) or the member's part is done.
  bool Renew(int64_t run_id, int32_t attempt, int64_t worker_id);
  // A gang member (not rank 0's worker) finished its part of (run, attempt): its slots are
  // free, its part no longer renewed. False when it holds no such part.
  bool ReleaseMember(int64_t run_id, int32_t attempt, int64_t worker_id);
  // Sets the stop flag of a running run's lease (and its tune_stop reason when not empty).
  // False when it has none.
  bool Stop(int64_t run_id, const std::string& tune_stop = "");
  // Ends a lease (the attempt finished) and forgets its run. Returns the lease, nullopt when
  // there was none.
  std::optional<Lease> Release(int64_t run_id);
  // Removes and returns every lease whose expiry is <= now, oldest first.
  std::vector<Lease> ExpireLeases();
  // The earliest lease expiry or queued run's not_before (for the coordinator's timer);
  // InfiniteFuture when nothing is pending.
  absl::Time NextDeadline() const;

  // Retry policy for an attempt that was lost or failed; `attempts` = attempts made so far.
  RetryDecision RetryAfterLoss(int attempts) const;

  // The full QueuedRun of a leased run (to requeue it after a loss).
  std::optional<QueuedRun> LeasedRun(int64_t run_id) const;

  size_t queued() const { return queued_.size(); }
  size_t leased() const { return leases_.size(); }

 private:
  // Runs of one sweep needing the same resources, by (run_index, run_id).
  using Bucket = std::set<std::pair<int, int64_t>>;

  struct SweepQueue {
    int priority = 1;
    double pass = 0;
    bool cancelled = false;
    std::map<RunNeeds, Bucket> buckets;  // due runs only; empty buckets are erased
    size_t due = 0;                      // runs in buckets
  };

  static constexpr double kStride = 1 << 20;

  void MakeDue(const QueuedRun& run);  // puts a due run in its sweep's bucket
  void PromoteDelayed();               // moves due delayed runs into their buckets
  void EraseFromBucket(const QueuedRun& run);
  void SetActive(int64_t sweep_id, SweepQueue& sweep);
  void AddLease(const Lease& lease, const QueuedRun& run);
  // Charges sweep `sweep_id` (at pass `pass`) one dispatch of `run` and takes the run out of the
  // queue.
  void Dispatch(double pass, int64_t sweep_id, const QueuedRun& run);
  // Whether a run needing `needs` is gang-scheduled: no known worker it fits has the slots for
  // it alone, and together they have.
  bool GangFor(const RunNeeds& needs) const;
  // Gangs: drops silent members' reservations and gangs that can no longer complete.
  void ExpireReservations();
  // Adds up to `free_slots` of the worker's slots to the gang forming for run_id; when they
  // complete it, leases the run to every member and returns it (this worker is rank 0's).
  std::optional<QueuedRun> JoinGang(int64_t run_id, int64_t worker_id, int free_slots);
  void DissolveGang(int64_t run_id);
  // Takes worker_id's reservation out of the gang forming for run_id (dissolved when empty).
  void LeaveGang(int64_t run_id, int64_t worker_id);
  // Moves a lease's expiry entry to `expiry`.
  void SetExpiry(Lease& lease, absl::Time expiry);
  // The earliest expiry of a gang lease's parts still running.
  static absl::Time EarliestPart(const Lease& lease);
  // Gives `slots` of worker_id's reserved slots back (a forming gang's).
  void Unreserve(int64_t worker_id, int slots);
  // Gives `slots` of worker_id's leased slots back.
  void FreeSlots(int64_t worker_id, int slots);
  // Forgets a lease's expiry entry and slots (not leases_ itself).
  void DropLease(const Lease& lease);

  // Constant after construction.
  const SchedulerOptions options_;
  const Clock* const clock_;

  std::unordered_map<int64_t, SweepQueue> sweeps_;
  // Sweeps with due runs, by (pass, sweep_id).
  std::set<std::pair<double, int64_t>> active_;
  double global_pass_ = 0;  // pass of the last dispatch
  // Every queued run (due or delayed), by id.
  std::unordered_map<int64_t, QueuedRun> queued_;
  // Runs waiting for their backoff: (not_before, run_id).
  std::set<std::pair<absl::Time, int64_t>> delayed_;
  std::unordered_map<int64_t, Lease> leases_;
  std::unordered_map<int64_t, QueuedRun> leased_runs_;
  std::set<std::pair<absl::Time, int64_t>> expiries_;  // (expiry, run_id) of leases_
  std::unordered_map<int64_t, int> slots_in_use_;       // by worker, of leases_

  // Gangs.
  struct FormingGang {
    RunNeeds needs;
    int64_t sweep_id = 0;
    // (worker, slots reserved), in join order; last poll by worker.
    std::vector<std::pair<int64_t, int>> reserved;
    std::unordered_map<int64_t, absl::Time> seen;
    int Reserved() const;
  };
  std::unordered_map<int64_t, WorkerOffer> workers_;    // AddWorker
  std::map<int64_t, FormingGang> forming_;              // by run_id
  std::unordered_map<int64_t, int> reserved_;           // by worker, of forming_
  // Gang runs whose part a member has not received yet, by member worker.
  std::unordered_map<int64_t, std::vector<int64_t>> undelivered_;
};

}  // namespace ablate

#endif  // ABLATE_ORCHESTRATOR_COORDINATOR_SCHEDULER_H_
