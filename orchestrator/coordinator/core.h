// CoordinatorCore: the client API (submit, list, get, cancel, rerun, annotate, watch, query,
// table) and the worker API (register, acquire, report, finish) over the Store and the
// Scheduler, without gRPC (server.h wraps it in the gRPC services of proto/ablate.proto). Every
// method returns an absl::Status whose code is the gRPC status code the service answers with.
// core.cc builds it (and rebuilds the scheduler from the store), client_api.cc is the client API,
// worker_api.cc the worker API, finish.cc the ending of attempts (with finishing.h, its parts that
// need none of the core's state); core_internal.h is what those files share. The tuner of tuned
// sweeps is a part of its own (tuner.h), which reaches the core only through TunerPort.
//
// Runs. The Store holds the truth (run states, attempts, metrics, checkpoints); the Scheduler
// holds the queue of PENDING runs and the leases of RUNNING ones. Every state change is a
// compare-and-set in the Store first (TransitionRun), then mirrored in the Scheduler, so a run
// completes once even when a worker's Finish races its lost lease or a cancellation.
//  - Submit: spec -> expansion -> CreateSweep. A run whose run_key already SUCCEEDED elsewhere is
//    reused unless `force`: CreateSweep stores it SUCCEEDED with the earlier run's results and
//    reused_from (reason "reused run N"), in the same transaction. The rest are queued.
//    Resubmitting a spec whose sweep exists with the same runs returns that sweep (nothing is
//    stored); a different spec under an existing name is AlreadyExists.
//  - AcquireJob: long poll; a dispatched run starts its next attempt (PENDING -> RUNNING) and the
//    job carries the latest checkpoint of any earlier attempt to resume from.
//  - Report: renews the lease and stores the batch (idempotent by seq); a report of an attempt
//    that no longer holds the lease is FailedPrecondition (the worker must stop). The reply says
//    DIRECTIVE_STOP once the run's sweep is cancelled.
//  - Finish: SUCCEEDED, DIVERGED (a result: never retried) and CANCELLED are terminal; FAILED is
//    retried with backoff until max_attempts; INTERRUPTED is queued again at once to resume.
//    The attempt's last metric batch (final_report) and the start of the worker's next run
//    (acquire_next) go into the same store transaction: a short job costs one call and one
//    commit instead of three of each.
//    A FAILED finish marked `permanent` (an invalid config, missing data) is not retried.
//    A worker running several jobs side by side ends several attempts in one Finish (`more`) and
//    takes up to one next job per free slot (acquire_max), all in one transaction; AcquireJob
//    likewise leases up to max_jobs at once (the Scheduler's slots).
//  - Gangs: a run wider than any one worker is leased to several at once (the Scheduler's
//    "Gangs"). Rank 0's worker starts the attempt and reports; each other member gets its part
//    (Job.rank_offset, local_ranks, rendezvous) at its next AcquireJob, renews it with heartbeats
//    and ends it with a member Finish: FAILED fails the attempt, anything else frees its slots.
//    A member that goes silent loses the whole attempt (LOST, retried).
//  - Lost leases (CheckLeases, also run by a background thread): the attempt ends LOST and the run
//    is queued again with backoff (or FAILED after max_attempts, CANCELLED when its sweep was).
//  - Workers: IDLE or BUSY while they call; GONE after Deregister or a lease timeout of silence
//    (CheckWorkers, also run by the background thread; after a restart every known worker gets a
//    lease timeout to call again).
// On Create the Scheduler is rebuilt from the Store: PENDING runs are queued, INTERRUPTED ones
// queued again, RUNNING ones get a fresh lease from now: a worker that keeps reporting keeps its
// job, one that does not loses it after the lease timeout.
//
// Thread safety: every method is thread-safe. AcquireJob and Watch block (bounded by their
// deadlines); Shutdown wakes them. The store must outlive the CoordinatorCore. One lock, mu_,
// guards the scheduler and what the core keeps of workers and runs; the tuner's own lock is taken
// before it (the core calls the tuner without mu_, the tuner calls back through TunerPort).
#ifndef ABLATE_ORCHESTRATOR_COORDINATOR_CORE_H_
#define ABLATE_ORCHESTRATOR_COORDINATOR_CORE_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/credentials.h"
#include "orchestrator/coordinator/door.h"
#include "orchestrator/coordinator/finishing.h"
#include "orchestrator/coordinator/scheduler.h"
#include "orchestrator/coordinator/tuner.h"
#include "orchestrator/store/store.h"
#include "proto/ablate.pb.h"

namespace ablate {

struct RunInfo;  // orchestrator/store/reader.h

struct CoordinatorOptions {
  // Runs' checkpoints live under checkpoint_root/run-<id> (a shared filesystem on clusters).
  std::string checkpoint_root = ".ablate/checkpoints";
  // The TCP ports a gang-scheduled run's rendezvous may take on its rank 0 worker, inclusive.
  std::pair<int, int> rendezvous_ports = {29500, 29999};
  SchedulerOptions scheduler;
  // The longest an AcquireJob long poll waits (a worker's wait_s is capped to this).
  absl::Duration max_acquire_wait = absl::Seconds(30);
  // Limits on what clients and workers send.
  int64_t max_spec_bytes = 1 << 20;    // SubmitRequest.spec_yaml
  int64_t max_runs_per_sweep = 10000;  // runs after filters (as kDefaultMaxRuns, sweep/spec.h)
  int64_t max_batch_rows = 200000;     // MetricBatch::Rows() of one report
  // The coordinator's secret: every Job's lease secret is derived from it (common/credentials.h),
  // so a restarted coordinator with the same secret accepts the leases it handed out before.
  std::string lease_key;
  // Query limits: default and maximum rows, time per statement.
  int64_t default_query_rows = 10000;
  int64_t max_query_rows = 1000000;
  absl::Duration query_timeout = absl::Seconds(10);
  // How often Watch polls the store, and how often the background thread checks leases.
  absl::Duration watch_interval = absl::Milliseconds(200);
  // Watch streams open at once, all clients: each holds a gRPC thread and polls the store.
  int max_watches = 64;
  // Registered workers not GONE: past this many, Register is refused (RESOURCE_EXHAUSTED), so
  // the workers table and /api/workers cannot grow without bound. A worker that leaves, or is
  // silent for a lease period, frees its place.
  int max_workers = 4096;
  absl::Duration lease_check_interval = absl::Seconds(1);
  bool background_lease_checks = true;  // tests with a fake clock call CheckLeases themselves
  const Clock* clock = MonotonicClock::Get();  // intervals: common/clock.h
};

class CoordinatorCore : private TunerPort {
 public:
  // Rebuilds the scheduler from the store (see above) and starts the lease checker.
  static absl::StatusOr<std::unique_ptr<CoordinatorCore>> Create(Store* store,
                                                                 const CoordinatorOptions& options);
  ~CoordinatorCore() override;  // Shutdown() and join

  CoordinatorCore(const CoordinatorCore&) = delete;
  CoordinatorCore& operator=(const CoordinatorCore&) = delete;

  // ---- Client API ----
  absl::StatusOr<SubmitResponse> Submit(const SubmitRequest& request) ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<ListSweepsResponse> ListSweeps() ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<GetSweepResponse> GetSweep(const GetSweepRequest& request)
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<CancelResponse> Cancel(const CancelRequest& request) ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<RerunResponse> Rerun(const RerunRequest& request) ABSL_LOCKS_EXCLUDED(mu_);
  // Tags (TAG, UNTAG) or a note (NOTE) on a sweep or one of its runs. InvalidArgument for a
  // tag outside the grammar (proto/ablate.proto), an empty or oversized note, or no tags;
  // NotFound for an unknown sweep, a run not of that sweep, or an untagged tag that is not there.
  absl::StatusOr<AnnotateResponse> Annotate(const AnnotateRequest& request);
  // Calls `write` for every event of the sweep, in order, until the sweep is done (the last event
  // is sweep_done), `write` returns false or `cancelled` returns true (the client went away:
  // Cancelled), or Shutdown (Unavailable). NotFound for an unknown sweep.
  absl::Status Watch(const WatchRequest& request,
                     const std::function<bool(const WatchEvent&)>& write,
                     const std::function<bool()>& cancelled) ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<QueryResponse> Query(const QueryRequest& request);
  absl::StatusOr<TableResponse> Table(const TableRequest& request);
  absl::StatusOr<CompareResponse> Compare(const CompareRequest& request);

  // ---- Worker API ----
  absl::StatusOr<RegisterResponse> Register(const RegisterRequest& request)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Waits up to min(wait_s, max_acquire_wait) and until `deadline` for a job. No job (has_job()
  // false) when nothing fits in time. NotFound for an unknown worker.
  absl::StatusOr<AcquireJobResponse> AcquireJob(const AcquireJobRequest& request,
                                                absl::Time deadline = absl::InfiniteFuture())
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<ReportResponse> Report(const ReportRequest& request) ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<FinishResponse> Finish(const FinishRequest& request) ABSL_LOCKS_EXCLUDED(mu_);
  // The worker left: GONE in the workers table. NotFound for an unknown worker.
  absl::StatusOr<DeregisterResponse> Deregister(const DeregisterRequest& request)
      ABSL_LOCKS_EXCLUDED(mu_);

  // The slots worker `worker_id` has in use now: its leases (a gang's part on it included) and
  // the slots a forming gang reserved on it.
  int SlotsInUse(int64_t worker_id) ABSL_LOCKS_EXCLUDED(mu_);

  // Ends every expired lease (LOST) and requeues or fails its run. Returns how many.
  int CheckLeases() ABSL_LOCKS_EXCLUDED(mu_);
  // Marks GONE every worker not heard from for a lease timeout. Returns how many. The background
  // thread runs it with CheckLeases.
  int CheckWorkers() ABSL_LOCKS_EXCLUDED(mu_);
  // Wakes long polls and watches (they return), stops the lease checker. Idempotent.
  void Shutdown() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  CoordinatorCore(Store* store, const CoordinatorOptions& options);
  absl::Status Rebuild() ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<WorkerOffer> OfferOf(int64_t worker_id) ABSL_LOCKS_EXCLUDED(mu_);
  // "built from X; queued runs need Y" when every due queued run a worker offering `offer`
  // could take needs another code version (Scheduler::OtherBuildNeeded), else "".
  std::string WaitingForBuild(const WorkerOffer& offer) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // TrainConfig.init_from {sweep, variant, seed} of each run -> the checkpoint of that
  // SUCCEEDED run, in the run's config and its `config_json` entry. InvalidArgument naming the
  // run for an unknown sweep or run; FailedPrecondition while the source has not succeeded.
  absl::Status ResolveInitFrom(const std::string& file, ExpandedSweep* sweep,
                               std::vector<std::string>* config_json);
  // The job of `run`'s attempt: from its template (the stored config when it has none), and the
  // latest checkpoint of an earlier attempt.
  // A gang's part carries the worker's ranks and the rendezvous (rank 0's worker's host and
  // RendezvousPort). `part`: the job is a gang member's part (TakeParts): FailedPrecondition
  // when that attempt's lease is gone.
  absl::StatusOr<Job> MakeJob(const QueuedRun& run, int32_t attempt, int64_t worker_id,
                              bool part = false) ABSL_LOCKS_EXCLUDED(mu_);
  // What `lease`'s reports may hold (door.h): its run's config shape (remembered from MakeJob, or
  // read once, e.g. for a lease restored after a restart) with the lease's steps and rung.
  absl::StatusOr<ReportShape> ShapeOfLease(const Lease& lease) ABSL_LOCKS_EXCLUDED(mu_);
  // The port of (run, attempt)'s gang rendezvous: a function of both in rendezvous_ports, so that
  // every member computes it alike and a retry moves to another (a port taken fails one attempt).
  int RendezvousPort(int64_t run_id, int32_t attempt) const;
  // A gang member's Finish (FinishRequest.member).
  absl::StatusOr<FinishResponse> FinishMember(const FinishRequest& request)
      ABSL_LOCKS_EXCLUDED(mu_);
  // PermissionDenied unless `presented` is worker_id's secret (RegisterResponse.worker_secret).
  absl::Status CheckWorkerSecret(absl::string_view what, absl::string_view presented,
                                 int64_t worker_id) const;
  // PermissionDenied unless `presented` is the lease secret of (run, attempt, worker).
  absl::Status CheckLeaseSecret(absl::string_view what, absl::string_view presented, int64_t run_id,
                                int32_t attempt, int64_t worker_id) const;
  // The metric batch of a report (a Report's, or a Finish's final_report) for (run, attempt);
  // ResourceExhausted "<what> N rows; the limit is M: <advice>" past max_batch_rows.
  absl::StatusOr<MetricBatch> BatchOf(const ReportRequest& report, int64_t run_id, int32_t attempt,
                                      absl::string_view what, absl::string_view advice) const;
  // After the store started (or refused to start) `run`, picked from the scheduler for
  // worker_id: records the lease's attempt and makes the job. nullopt when the start failed and
  // another pick may succeed (the run was cancelled, or queued again after a store hiccup);
  // Unavailable when the store cannot write.
  absl::StatusOr<std::optional<Job>> LeaseStarted(int64_t worker_id, const QueuedRun& run,
                                                  const absl::StatusOr<TransitionResult>& started)
      ABSL_LOCKS_EXCLUDED(mu_);
  // After a lost or failed attempt: queue again with backoff, or fail, or cancel. Does the store
  // transition from RUNNING (attempt `attempt`) and mirrors it in the scheduler.
  // `retry` false: FAILED (or CANCELLED) whatever the attempts left.
  absl::Status EndAttemptAndRetry(int64_t run_id, int64_t sweep_id, int32_t attempt,
                                  const std::string& attempt_end, const std::string& reason,
                                  bool retry = true) ABSL_LOCKS_EXCLUDED(mu_);
  // The checks of a Finish of `worker_id` (state, lease secret, final report, lease, summary at
  // the door); queues its checkpoint notice. The error is what the Finish answers.
  absl::StatusOr<PreparedFinish> PrepareFinish(const FinishRequest& request, int64_t worker_id)
      ABSL_LOCKS_EXCLUDED(mu_);
  // A FAILED finish: its batch, then the retry decision.
  absl::Status FinishFailed(PreparedFinish& p) ABSL_LOCKS_EXCLUDED(mu_);
  // Up to max_jobs next jobs for worker_id (none when max_jobs is 0), by an AcquireJob that does
  // not wait, into the response's next_job and more_next_jobs.
  void AcquireNextJobs(int64_t worker_id, int max_jobs, FinishResponse* response)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Ends the SUCCEEDED, DIVERGED, CANCELLED and INTERRUPTED attempts of one Finish of worker_id in
  // one store transaction, which also starts up to max_next next runs on the slots they hold
  // (`freeing`) and the worker's free ones; mirrors it in the scheduler (MirrorEndedAttempts),
  // hands the started jobs to `response` and has the tuner decide after the tuned ones. An
  // attempt's error goes to (*errors)[its index].
  void EndAttemptsTogether(int64_t worker_id, const std::vector<PreparedFinish*>& ending,
                           int freeing, int max_next, std::vector<absl::Status>* errors,
                           FinishResponse* response) ABSL_LOCKS_EXCLUDED(mu_);
  // The jobs of the next runs whose starts rode on the first write (`r`), into `response`.
  void StartNextJobs(int64_t worker_id, const std::vector<QueuedRun>& next,
                     const FinishWriteResult& r, FinishResponse* response) ABSL_LOCKS_EXCLUDED(mu_);
  RunStatus ToRunStatus(const RunInfo& run) ABSL_LOCKS_EXCLUDED(mu_);
  // ---- TunerPort (core.cc): what the tuner may ask of the core ----
  bool SweepCancelled(int64_t sweep_id) override ABSL_LOCKS_EXCLUDED(mu_);
  void EnqueueRun(const RunInfo& run, const RunConfig* config) override ABSL_LOCKS_EXCLUDED(mu_);
  void StopRun(int64_t run_id, const std::string& why) override ABSL_LOCKS_EXCLUDED(mu_);
  // A worker's registered name, or "#ID" for one this coordinator does not know.
  std::string WorkerName(int64_t worker_id) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Records in the store that a worker was seen IDLE or BUSY: at once when its state changed,
  // else at most every kWorkerSeenInterval (a report or long poll per job need not each write
  // the workers table).
  void NoteWorker(int64_t worker_id, const char* state) ABSL_LOCKS_EXCLUDED(mu_);
  // NoteWorker: BUSY while worker_id holds slots (a job, a gang's part, a reservation), else IDLE.
  void NoteWorkerBySlots(int64_t worker_id) ABSL_LOCKS_EXCLUDED(mu_);
  static constexpr absl::Duration kWorkerSeenInterval = absl::Seconds(5);
  void LeaseCheckerLoop() ABSL_LOCKS_EXCLUDED(mu_);

  // Constant after construction.
  Store* const store_;
  const CoordinatorOptions options_;
  const HmacSha256 lease_mac_;  // keyed with options_.lease_key

  mutable absl::Mutex mu_;
  absl::CondVar work_cv_;  // signalled when runs are queued, and on Shutdown
  Scheduler scheduler_ ABSL_GUARDED_BY(mu_);
  std::map<int64_t, WorkerOffer> workers_ ABSL_GUARDED_BY(mu_);
  std::map<int64_t, std::string> worker_names_ ABSL_GUARDED_BY(mu_);
  struct WorkerSeen {
    std::string state;                          // as last written: IDLE, BUSY or GONE
    absl::Time written = absl::InfinitePast();  // when it was last written
    absl::Time contact = absl::InfinitePast();  // the worker's last call
  };
  std::map<int64_t, WorkerSeen> worker_seen_ ABSL_GUARDED_BY(mu_);
  // Worker notices stored per run since this coordinator started (kMaxNoticesPerRun).
  std::map<int64_t, int> notices_of_ ABSL_GUARDED_BY(mu_);
  // Each run's ReportShapeOf(config), by run id, from MakeJob or the first report.
  std::map<int64_t, ReportShape> shapes_ ABSL_GUARDED_BY(mu_);
  // Attempts a run had when it was last queued by a user (rerun): retries count from there.
  std::map<int64_t, int> attempt_base_ ABSL_GUARDED_BY(mu_);
  // Program code by hash (the store's program_code), read once: every job of a program run
  // carries it.
  std::map<std::string, std::shared_ptr<const ProgramSnapshot>> program_code_ ABSL_GUARDED_BY(mu_);
  bool shutdown_ ABSL_GUARDED_BY(mu_) = false;
  int watches_ ABSL_GUARDED_BY(mu_) = 0;      // Watch calls in progress (options_.max_watches)
  int registering_ ABSL_GUARDED_BY(mu_) = 0;  // Register calls between the cap and the store

  // Decides in tuned sweeps after their runs' ends; calls back through TunerPort, so it is
  // called without mu_. Thread-safe on its own.
  Tuner tuner_;

  std::thread lease_checker_;
};

}  // namespace ablate

#endif  // ABLATE_ORCHESTRATOR_COORDINATOR_CORE_H_
