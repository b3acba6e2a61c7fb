// The results store of the coordinator: one SQLite file in WAL mode (schema: docs/schema.md).
//
// Writes. Only the coordinator writes, through one Store and its ONE writer thread, which owns
// the only read-write connection. Callers enqueue writes; the writer applies everything queued in
// one transaction per flush (when flush_max_rows rows are queued, when the oldest write has waited
// flush_interval, or at once when someone waits: Flush(), the synchronous methods). A write that
// is wrong (an unknown run, a stale attempt) fails alone and the others of the transaction
// commit: the transaction is then rolled back and applied again with each write under its own
// SAVEPOINT (the first pass has none, which is cheaper; CommitBatch).
//
// Two kinds of write:
//  - Synchronous (CreateSweep, TransitionRun, RegisterWorker, ...): the caller blocks until the
//    write's transaction committed (or failed) and gets its result. Run-state transitions are a
//    compare-and-set in one transaction, serialized with every other write, so a run completes
//    once. When the transaction cannot commit (database locked, disk full) the write is dropped
//    and the error returned: the caller decides whether to retry.
//  - Ingestion (ReportMetrics and the asynchronous Enqueue* methods): metric batches, heartbeats,
//    checkpoints, events. When the transaction cannot commit they stay queued, in order, and are
//    retried with exponential backoff until it can: nothing accepted is lost, and a caller that
//    was told "Unavailable" may resend, because ingestion is idempotent (below).
//
// Idempotent ingestion. A worker reports metric batches for (run, attempt) numbered 1, 2, 3...,
// sending the next only after the previous was acknowledged and resending an unacknowledged one
// unchanged. The store keeps the highest sequence number applied per attempt (attempts.report_seq)
// in the same transaction as the batch, so a batch seen before is acknowledged as a duplicate and
// changes nothing. Step and eval rows are keyed (run, step): a later attempt that re-trains steps
// after resuming from a checkpoint replaces the earlier attempt's values; spike events are unique
// on (run, step, signal, kind). Only the current attempt of a RUNNING run may report: a batch of a
// LOST attempt (a worker whose lease expired) is refused with FailedPrecondition.
//
// Failures. SQLITE_BUSY/LOCKED (another process holds the file) are Unavailable, SQLITE_FULL is
// ResourceExhausted; both name the condition. Each failed transaction is rolled back whole, so
// the file never holds half a flush; the writer keeps retrying and recovers by itself when the
// condition clears. Stats() shows the backlog and the last error.
//
// Durability: a write acknowledged as OK is committed; with `synchronous_full` (default) it is
// also on disk (fsync per flush), otherwise it survives a crash of the process but not of the OS.
//
// Reads go through reader() (StoreReader): read-only connections that never block the writer.
//
// Thread safety: every method is thread-safe. The destructor flushes what it can (one attempt),
// fails what is left with Unavailable, and joins the writer.
#ifndef ABLATE_ORCHESTRATOR_STORE_STORE_H_
#define ABLATE_ORCHESTRATOR_STORE_STORE_H_

#include <sqlite3.h>

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "orchestrator/store/sqlite.h"
#include "proto/ablate.pb.h"

namespace ablate {

struct StoreOptions {
  std::string path;  // the database file; created (with its schema) when missing
  // Flush when this many rows (metric points, probes, events...) are queued.
  int64_t flush_max_rows = 20000;
  // ... or when the oldest queued write has waited this long.
  absl::Duration flush_interval = absl::Milliseconds(20);
  // Enqueueing beyond this many queued rows is refused (ResourceExhausted), bounding memory
  // while the database is unavailable; the worker keeps its batch and resends it.
  int64_t max_queued_rows = 5000000;
  // How long the writer waits for a lock held by another connection before a flush fails with
  // Unavailable (it is then retried).
  absl::Duration busy_timeout = absl::Seconds(2);
  // Backoff between retries of a failed flush: doubles from min to max.
  absl::Duration retry_min = absl::Milliseconds(10);
  absl::Duration retry_max = absl::Seconds(2);
  bool synchronous_full = true;  // PRAGMA synchronous = FULL (else NORMAL)
  // The WAL is checkpointed into the database file once it holds this many pages (4 KB each),
  // by a thread and connection of its own while the writer goes on. Past twice as many (the
  // checkpointer fell behind) the writer waits for its pass and copies the rest itself, and the
  // WAL starts over. 1 to 2^24.
  int checkpoint_pages = 10000;
  int reader_connections = 4;  // StoreReader pool size
  // The pool of scheduling_reader(): the reads a worker's calls make.
  int scheduling_connections = 2;
  // The clock stamped on rows (created_at, last_seen, event times). Tests inject one.
  std::function<absl::Time()> now = absl::Now;
};

// What a sweep submission stores: the expansion (every run) and the spec it came from.
struct SweepRecord {
  ExpandedSweep expanded;
  std::string spec_yaml;  // the spec file's text, as submitted
  std::string spec_json;  // its canonical JSON (what the submitter parsed), "" if none
  // Each run's CanonicalJson(config), in runs order, as ExpandSweep printed it for the run key.
  // Empty: CreateSweep prints them (on the caller's thread, never the writer's).
  std::vector<std::string> config_json;
  // A run identical to one that SUCCEEDED by training (same run_key, itself not reused) is stored
  // SUCCEEDED with that run's results and reused_from = its id, in the same transaction.
  bool reuse = true;
  // A program sweep's code (config/program_snapshot.h), kept once per code hash in the same
  // transaction. Empty for the built-in model.
  ProgramSnapshot program;
};

struct SweepIds {
  int64_t sweep_id = 0;
  std::vector<int64_t> run_ids;      // in ExpandedSweep::runs order
  std::vector<int64_t> reused_from;  // the same order: the run reused, 0 for a run to train
};

// A batch of measurements from one attempt of one run.
struct MetricBatch {
  int64_t run_id = 0;
  int32_t attempt = 0;  // the attempt number the worker's job carried
  int64_t seq = 0;      // 1, 2, 3... per (run, attempt); must be >= 1
  std::vector<StepMetrics> steps;
  std::vector<EvalResult> evals;  // with per-layer probes
  std::vector<SpikeEvent> spikes;
  std::optional<ParamCount> params;  // the trainer's counts (a program's `params` report)
  int64_t Rows() const;
};

struct ReportResult {
  bool duplicate = false;  // seq was applied before: nothing changed
};

// A compare-and-set on a run's state, and what comes with it.
//   -> RUNNING      starts attempt `attempts + 1` on `worker_id` (attempt row, started_at).
//   RUNNING -> X    ends the current attempt as `attempt_end` (default: X's name; LOST for a lost
//                   lease), with `reason` and the final `summary` when given.
//   -> PENDING      queues the run again (after a lost lease, or a forced rerun).
//   terminal X      (SUCCEEDED, FAILED, DIVERGED, CANCELLED) sets finished_at; when no run of
//                   the sweep is left PENDING/RUNNING/INTERRUPTED the sweep becomes DONE.
//   STOPPED         (a tuner's decision: PENDING -> STOPPED at a rung, RUNNING -> STOPPED for a
//                   run training through its rungs) is terminal too, with no way out.
// Allowed edges: PENDING -> RUNNING | CANCELLED | STOPPED; RUNNING -> any other state;
// INTERRUPTED | FAILED | CANCELLED | SUCCEEDED | DIVERGED -> PENDING; INTERRUPTED -> CANCELLED.
struct RunTransition {
  int64_t run_id = 0;
  std::vector<RunState> from;  // the current state must be one of these (CAS)
  RunState to = RUN_STATE_UNSPECIFIED;
  // When > 0, the run's current attempt must be this one (a worker finishing attempt 2 cannot
  // finish attempt 3 started after its lease was lost).
  int32_t expected_attempt = 0;
  int64_t worker_id = 0;    // the new attempt's worker (-> RUNNING)
  std::string attempt_end;  // how the current attempt ends; "" = the name of `to`
  std::string reason;
  // A user queued the run again (rerun): its attempts so far become its attempt_base, from which
  // retries count.
  bool rebase_attempts = false;
  bool has_summary = false;
  RunSummary summary;  // final results (when has_summary and `to` is not RUNNING)
  // A tuned run paused at a rung (-> PENDING): held for the tuner's decision (tune_runs.held),
  // in the same transaction.
  bool tune_hold = false;
};

// Decisions of the tuner (orchestrator/sweep/tune.h) on one group of a tuned sweep, written in
// one transaction. Each is inserted once per (sweep, group, value, rung, kind); one stored
// before is skipped whole (decided before, by this coordinator or an earlier one).
struct TuneDecisionWrite {
  int64_t sweep_id = 0;
  std::string group;
  struct Decision {
    std::string kind;  // "promote", "stop", "choose"
    double value = 0;
    int rung = 0;       // -1: a seeds-first choice
    double metric = 0;  // NaN: none
    std::string detail;
    std::vector<int64_t> runs;  // held runs it applies to
    int64_t next_stop = 0;      // promote, choose: tune_runs.stop_at_step from now on
  };
  std::vector<Decision> decisions;
};

// A boundary sweep's next probe of one group: its runs (every seed, as ExpandTuneProbe made them)
// inserted after the sweep's last, with their configs, their tune_runs rows, a "probe" decision
// (once per group and value) and the bracket's probe count, in one transaction.
struct TuneProbeWrite {
  int64_t sweep_id = 0;
  std::string group;
  double value = 0;
  std::string detail;
  ExpandedSweep runs;                    // name, priority and the runs; indexes are renumbered
  std::vector<std::string> config_json;  // in runs order
};
struct TuneProbeResult {
  std::vector<int64_t> run_ids;  // empty: the probe was added before
};

// The end of a boundary sweep's bisection in one group: the bracket DONE with what it found
// (stable and unstable NaN when unknown) and a note; the sweep settles (DONE when it was the last
// thing left).
struct BracketWrite {
  int64_t sweep_id = 0;
  std::string group;
  double stable = 0, unstable = 0;  // NaN: none
  std::string note;
};

struct TuneDecisionResult {
  // Runs released to train on (promote, choose): PENDING, no longer held, attempt_base rebased.
  std::vector<int64_t> released;
  std::vector<int64_t> stopped;  // PENDING -> STOPPED
  // Stop decisions on RUNNING runs (a program that trains through its rungs): (run, why). The
  // coordinator stops them; each ends STOPPED when its worker finishes.
  std::vector<std::pair<int64_t, std::string>> stopping;
  int skipped = 0;  // decisions stored before
};

struct SweepCancellation {
  std::vector<int64_t> cancelled;  // runs that were PENDING or INTERRUPTED
  std::vector<int64_t> running;    // runs still RUNNING
};

struct TransitionResult {
  RunState previous = RUN_STATE_UNSPECIFIED;
  int32_t attempt = 0;  // the run's current attempt after the transition
};

// The end of an attempt as a worker's Finish writes it, in one transaction: its last metric
// batch (optional), the transition that ends it, and optionally the start of the worker's next run.
struct FinishWrite {
  std::optional<MetricBatch> batch;
  RunTransition end;
  std::optional<RunTransition> start;      // -> RUNNING of another run on the same worker
  std::vector<RunTransition> more_starts;  // further runs started on it (a worker's free slots)
};

struct FinishWriteResult {
  ReportResult report;  // of the batch, when there was one
  TransitionResult end;
  // The start's own outcome: a start that fails (FailedPrecondition: cancelled meanwhile) is
  // undone alone; the batch and the end commit.
  absl::Status start_status;
  TransitionResult start;
  // Of more_starts, one each, likewise undone alone when they cannot happen.
  std::vector<absl::Status> more_start_status;
  std::vector<TransitionResult> more_starts;
};

// A change to the tags and notes of a sweep or of one run of it (`ablate tag`, `untag`, `note`).
// The store checks only that the target exists; the coordinator checks the texts (tag grammar,
// note length) before.
struct AnnotationEdit {
  enum class Action { kTag, kUntag, kNote };
  int64_t sweep_id = 0;
  int64_t run_id = 0;  // 0 = the sweep itself
  Action action = Action::kTag;
  std::vector<std::string> texts;  // the tags (kTag, kUntag), or the one note (kNote)
};

struct AnnotationResult {
  std::vector<std::string> changed;    // tags added (kTag) or removed (kUntag); the note (kNote)
  std::vector<std::string> unchanged;  // kTag: tags the target carried already
  int64_t note_id = 0;                 // kNote: the annotation's id
};

// Alerts (orchestrator/alerts/alerter.h). How far the alerter has read: the last event and
// spike it looked at (alert_cursor).
struct AlertCursor {
  int64_t event_id = 0;
  int64_t spike_id = 0;
};

// An alert to send once: (kind, sweep, run) is its identity (alerts UNIQUE); payload the JSON
// each target gets; targets how many it goes to.
struct AlertClaim {
  std::string kind;
  int64_t sweep_id = 0;
  int64_t run_id = 0;  // 0: about the sweep
  std::string payload;
  int targets = 0;
};

// How one target's delivery of an alert ended (alerts.delivered, failed, dropped).
enum class AlertOutcome { kDelivered, kFailed, kDropped };

struct StoreStats {
  int64_t queued_writes = 0;
  int64_t queued_rows = 0;
  int64_t flushes = 0;         // committed transactions
  int64_t failed_flushes = 0;  // rolled back and retried
  int64_t rows_committed = 0;
  int64_t dropped_writes = 0;  // writes refused inside a transaction (bad run, stale attempt)
  // Transactions applied a second time, with a savepoint per write, because a write failed
  // alone in the first pass (CommitBatch).
  int64_t reapplied_flushes = 0;
  // The longest a committed transaction took, from BEGIN to the end of COMMIT: every write
  // queued meanwhile (a report, a finish) waited that long.
  absl::Duration longest_flush = absl::ZeroDuration();
  absl::Status last_error;        // of the last failed flush (OK after a success)
  int64_t checkpoints = 0;        // checkpointer passes that copied pages into the database
  absl::Status checkpoint_error;  // of the last checkpoint (OK after a success)
  // Times the checkpointer paused users' queries to copy back a WAL they held (kWalPressure).
  int64_t query_pauses = 0;
};

// WAL pressure: a checkpoint pass that leaves most of a WAL of this many times
// StoreOptions::checkpoint_pages pauses users' queries (StoreReader::PauseQueries) until the WAL
// is copied back.
inline constexpr int kWalPressure = 3;

class StoreReader;  // reader.h
class StoreWriter;  // the writer connection (store_internal.h)

// The name of the writer thread (at most 15 characters, the kernel's limit).
inline constexpr char kWriterThreadName[] = "ablate-store";

class Store {
 public:
  // Opens or creates the database (WAL mode, schema migrated to StoreSchemaVersion()), then
  // starts the writer thread and opens the reader pool.
  static absl::StatusOr<std::unique_ptr<Store>> Open(const StoreOptions& options);
  ~Store();

  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  // Read-only access; valid as long as the Store.
  const StoreReader& reader() const { return *reader_; }
  // The reads on a worker's path (the job it gets, its checkpoint, its offer, the run a Finish
  // ends, the tuner's decisions) on connections of their own: the dashboard, watch streams and
  // `ablate status`, which read through reader(), cannot hold every connection scheduling needs.
  const StoreReader& scheduling_reader() const { return *scheduling_reader_; }

  // ---- Synchronous writes ----

  // Inserts the sweep, one variants row per variant (from its first run) and every run,
  // PENDING. AlreadyExists when a sweep of that name exists.
  absl::StatusOr<SweepIds> CreateSweep(const SweepRecord& record);
  // ACTIVE/DONE/CANCELLED. Does not touch the runs (see CancelSweep).
  absl::Status SetSweepState(int64_t sweep_id, const std::string& state);
  // In one transaction: the sweep CANCELLED and each of its PENDING or INTERRUPTED runs
  // CANCELLED. Its RUNNING runs are left to their workers (the coordinator tells them to stop).
  // NotFound for an unknown sweep.
  absl::StatusOr<SweepCancellation> CancelSweep(int64_t sweep_id);

  // FailedPrecondition "run 7 is SUCCEEDED, not RUNNING" when the CAS fails (nothing changes),
  // NotFound for an unknown run, InvalidArgument for an edge that is not allowed.
  absl::StatusOr<TransitionResult> TransitionRun(const RunTransition& transition);
  // Several transitions queued together (one transaction), each succeeding or failing as
  // TransitionRun would alone.
  std::vector<absl::StatusOr<TransitionResult>> TransitionRuns(
      const std::vector<RunTransition>& transitions);

  // A FinishWrite in one transaction: fewer commits per job than ReportMetrics plus two
  // TransitionRuns. Errors of the batch or the end fail the whole write, as ReportMetrics and
  // TransitionRun would (nothing is kept for a retry: the worker resends its Finish).
  absl::StatusOr<FinishWriteResult> FinishAttempt(const FinishWrite& write);
  // Several FinishWrites (a worker ending several attempts in one call), queued together so
  // that they commit in one transaction; each succeeds or fails as FinishAttempt would alone.
  std::vector<absl::StatusOr<FinishWriteResult>> FinishAttempts(
      const std::vector<FinishWrite>& writes);

  absl::StatusOr<int64_t> RegisterWorker(const std::string& name,
                                         const std::string& resources_json);

  // An AnnotationEdit in one transaction, with an "annotation" event. A tag is stored once per
  // target: tagging again changes nothing (AnnotationResult::unchanged). NotFound for an unknown
  // sweep, a run that is not one of the sweep's, or (kUntag) a tag the target does not carry: then
  // nothing is removed. InvalidArgument for no texts, or kNote with more than one.
  absl::StatusOr<AnnotationResult> Annotate(const AnnotationEdit& edit);

  // A TuneDecisionWrite in one transaction, with a "tune_decision" event per decision applied.
  // A stop moves each of its runs PENDING -> STOPPED (a RUNNING one is returned in `stopping`
  // for the coordinator to stop; one that ended is left alone);
  // a promote or choose releases its held runs with the next stop step and attempt_base =
  // attempts, so that rung pauses do not use up retries.
  absl::StatusOr<TuneDecisionResult> ApplyTuneDecisions(const TuneDecisionWrite& write);
  // A TuneProbeWrite; a probe of that value added before adds nothing (run_ids empty).
  absl::StatusOr<TuneProbeResult> AddTuneProbe(const TuneProbeWrite& write);
  // A BracketWrite; NotFound for a group without a bracket. Closing a DONE bracket again keeps
  // what it holds.
  absl::Status CloseBracket(const BracketWrite& write);

  // In one transaction: each claim not stored before (same kind, sweep and run) inserted, and
  // the alert cursor moved to `cursor`. Returns, in claims order, the new alert's id, or 0 for
  // a claim stored before (by this coordinator or an earlier one: not to be sent again).
  absl::StatusOr<std::vector<int64_t>> ClaimAlerts(const AlertCursor& cursor,
                                                   const std::vector<AlertClaim>& claims);

  // Waits until every write enqueued before the call is committed. Returns the error of a failed
  // flush attempt meanwhile (the writes stay queued and are retried).
  absl::Status Flush();

  // ---- Ingestion (kept and retried on transient failures) ----

  // Enqueues the batch and waits for its transaction. OK with duplicate=true for a batch seen
  // before. Unavailable / ResourceExhausted: the database cannot be written now; the batch stays
  // queued and will be applied (resending it is safe). FailedPrecondition: the attempt may not
  // report (not the current attempt of a RUNNING run); NotFound: no such attempt.
  absl::StatusOr<ReportResult> ReportMetrics(const MetricBatch& batch);
  // The same without waiting: `done` (optional) is called once from the writer thread with the
  // outcome of the first attempt to commit the batch. For callback-based gRPC reactors.
  absl::Status EnqueueMetrics(MetricBatch batch,
                              std::function<void(absl::StatusOr<ReportResult>)> done = nullptr);

  // Fire-and-forget updates, applied with the next flush.
  absl::Status EnqueueHeartbeat(int64_t worker_id, const std::string& state);
  // The worker left (a clean exit) or went silent: state GONE, last_seen kept.
  absl::Status EnqueueWorkerGone(int64_t worker_id);
  absl::Status EnqueueCheckpoint(int64_t run_id, int32_t attempt, const std::string& path,
                                 int64_t step);
  absl::Status EnqueueEvent(int64_t sweep_id, int64_t run_id, const std::string& kind,
                            const std::string& message);

  // One target's outcome of alert `alert_id` (counted in its row; `error` kept as last_error).
  absl::Status EnqueueAlertOutcome(int64_t alert_id, AlertOutcome outcome,
                                   const std::string& error);

  // A write's transaction is counted (committed or rolled back) before the write returns or its
  // callback runs.
  StoreStats Stats() const;

  // Runs `fn` on the writer's connection between flushes (tests: PRAGMA max_page_count to
  // simulate a full disk, a long transaction to show readers are not blocked).
  absl::Status RunOnWriterForTesting(const std::function<absl::Status(sqlite3*)>& fn);

 private:
  struct Op {
    // Applies the write on the writer's connection inside the flush transaction. A transient
    // error (IsTransient) aborts the whole flush; any other error fails this write alone. It
    // may be applied more than once (after a rollback), so it resets whatever it reports.
    std::function<absl::Status(StoreWriter&)> apply;
    // Called once with the outcome (may be empty).
    std::function<void(absl::Status)> done;
    int64_t rows = 1;
    bool keep_on_transient = false;  // ingestion: stays queued across failed flushes
    bool urgent = false;             // someone waits for it: flush now
    uint64_t ticket = 0;
  };

  explicit Store(const StoreOptions& options);
  absl::Status Enqueue(Op op);
  absl::Status EnqueueLocked(Op op) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The op of a FinishWrite; `write` must outlive it (FinishAttempts waits for it).
  static Op FinishOp(const FinishWrite& write, std::shared_ptr<FinishWriteResult> result);
  // Enqueues urgent ops under one lock (so the writer takes them in one transaction) and waits
  // for all their outcomes, in order. Refused ones (a closed or full queue) get that error.
  std::vector<absl::Status> RunAllSync(std::vector<Op> ops);
  // Enqueues an urgent op and waits for its outcome.
  absl::Status RunSync(std::function<absl::Status(StoreWriter&)> apply, int64_t rows,
                       bool keep_on_transient = false);
  void WriterLoop() ABSL_LOCKS_EXCLUDED(mu_, db_mu_);
  // The writer thread's wait: until the queue is due (urgent, full, or its oldest write has
  // waited flush_interval; never before a retry's backoff ends) or the store closes, then takes
  // all of it into *batch (its rows in *rows; *stopping when the store is closing). false when
  // the store closed with nothing queued: the thread ends.
  bool TakeDueBatch(std::deque<Op>* batch, int64_t* rows, bool* stopping) ABSL_LOCKS_EXCLUDED(mu_);
  // After `batch` committed: counted in the stats, each waiter told its outcome.
  void Committed(std::deque<Op>& batch, const std::vector<absl::Status>& outcomes, int64_t rows,
                 bool reapplied, absl::Duration flush_time) ABSL_LOCKS_EXCLUDED(mu_);
  // After `batch` was rolled back with `status`: every waiter told, the ingestion writes queued
  // again ahead of the rest (unless `stopping`), the next flush backed off. false when the
  // writer thread ends (stopping: what is left queued fails).
  bool RolledBack(std::deque<Op>& batch, const absl::Status& status, bool reapplied, bool stopping)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The checkpointer thread: a PASSIVE checkpoint on its own connection whenever the writer's
  // commits left checkpoint_pages or more in the WAL (OnWalCommit, SQLite's WAL hook).
  void CheckpointLoop();
  static int OnWalCommit(void* store, sqlite3* db, const char* name, int pages);
  void UpdateDurableTicket() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // One transaction over `batch`. Returns the transient error that rolled it back, or OK; the
  // per-op outcomes are in `outcomes`. `*reapplied` is set when a write failed alone and the
  // batch was applied a second time (counted by the caller, which holds no db_mu_ then).
  absl::Status CommitBatch(std::deque<Op>& batch, std::vector<absl::Status>* outcomes,
                           bool* reapplied) ABSL_EXCLUSIVE_LOCKS_REQUIRED(db_mu_);
  // One pass of CommitBatch: with `undo_points`, each write under a savepoint of its own, so a
  // write that fails alone is undone alone; without, such a failure rolls everything back and
  // sets `*failed_alone`.
  absl::Status ApplyBatch(std::deque<Op>& batch, bool undo_points,
                          std::vector<absl::Status>* outcomes, bool* failed_alone)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(db_mu_);

  // Constant after construction.
  const StoreOptions options_;
  std::unique_ptr<StoreReader> reader_;
  std::unique_ptr<StoreReader> scheduling_reader_;
  std::thread writer_thread_;
  std::thread checkpoint_thread_;
  SqliteDb checkpoint_db_;  // used by checkpoint_thread_ alone

  // Held for each checkpoint pass (the checkpointer's, or the writer's past twice the limit),
  // so that the writer's never finds the checkpointer's running and gives up.
  absl::Mutex checkpoint_pass_mu_ ABSL_ACQUIRED_AFTER(db_mu_);
  absl::Mutex checkpoint_mu_ ABSL_ACQUIRED_AFTER(db_mu_);
  bool checkpoint_wanted_ ABSL_GUARDED_BY(checkpoint_mu_) = false;
  bool checkpoint_stop_ ABSL_GUARDED_BY(checkpoint_mu_) = false;

  // Serializes use of the writer connection (the writer thread per flush, RunOnWriterForTesting).
  absl::Mutex db_mu_ ABSL_ACQUIRED_AFTER(mu_);
  std::unique_ptr<StoreWriter> writer_ ABSL_GUARDED_BY(db_mu_);

  mutable absl::Mutex mu_;
  absl::CondVar work_cv_;   // the writer waits on it for work
  absl::CondVar flush_cv_;  // waiters for a flush outcome wait on it
  std::deque<Op> queue_ ABSL_GUARDED_BY(mu_);
  int64_t queued_rows_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time oldest_enqueued_ ABSL_GUARDED_BY(mu_);
  uint64_t next_ticket_ ABSL_GUARDED_BY(mu_) = 1;
  // Every op with ticket <= durable_ticket_ is done: committed, or failed and reported.
  uint64_t durable_ticket_ ABSL_GUARDED_BY(mu_) = 0;
  int urgent_ ABSL_GUARDED_BY(mu_) = 0;  // urgent queued ops + Flush() waiters
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool writer_exited_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time retry_at_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  absl::Duration backoff_ ABSL_GUARDED_BY(mu_);
  StoreStats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ablate

#endif  // ABLATE_ORCHESTRATOR_STORE_STORE_H_
