// What the files of Store share (not for use outside them): the writer's connection
// (StoreWriter: its prepared statements and the events it batches), the error macros of the
// writes, and each write as a function applied on that connection inside a flush transaction.
// store.cc opens and closes the store and holds the public API, which queues those writes;
// writer.cc the queue, the writer thread, its transactions (CommitBatch) and the checkpointer;
// writes.cc and *_writes.cc (alerts, annotations, tuning) the SQL of each write.
//
// Every Apply* runs on the writer thread under Store::db_mu_, inside the flush transaction. It
// may be applied twice (the batch is rolled back and applied again with savepoints), so it writes
// its results from scratch; the callers reset what it reports before each application.
#ifndef ABLATE_ORCHESTRATOR_STORE_STORE_INTERNAL_H_
#define ABLATE_ORCHESTRATOR_STORE_STORE_INTERNAL_H_

#include <sqlite3.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "orchestrator/store/sqlite.h"
#include "orchestrator/store/store.h"
#include "proto/ablate.pb.h"

namespace ablate {

#define STORE_RETURN_IF_ERROR(expr)         \
  do {                                      \
    absl::Status _status = (expr);          \
    if (!_status.ok()) return _status;      \
  } while (0)

#define STORE_ASSIGN_OR_RETURN(lhs, expr)   \
  auto lhs##_or = (expr);                   \
  if (!lhs##_or.ok()) return lhs##_or.status(); \
  auto lhs = *lhs##_or

// The writer's connection and its prepared statements. Used by the writer thread only (under
// Store::db_mu_).
class StoreWriter {
 public:
  StoreWriter(SqliteDb db, std::function<absl::Time()> now)
      : db_(std::move(db)), cache_(db_.get()), now_(std::move(now)) {}

  sqlite3* db() const { return db_.get(); }
  double Now() const { return absl::ToDoubleSeconds(now_() - absl::UnixEpoch()); }
  absl::StatusOr<Stmt*> Get(absl::string_view sql) { return cache_.Get(sql); }
  // Runs a cached statement that returns no rows.
  absl::Status Run(absl::string_view sql) {
    absl::StatusOr<Stmt*> stmt = Get(sql);
    if (!stmt.ok()) return stmt.status();
    return (*stmt)->Run();
  }
  void Close() { cache_.Clear(); }
  // Whether the write being applied runs under a savepoint of its own (Store::CommitBatch): a
  // write that can fail partway and must keep what it did before needs one to undo to.
  bool undo_points() const { return undo_points_; }
  void set_undo_points(bool on) { undo_points_ = on; }

  // Event rows are written together, several to a statement, by FlushEvents (writes.cc): before
  // COMMIT, and before each write's RELEASE when writes have savepoints (Store::ApplyBatch).
  // Every transition writes an event, and a statement of its own for each was a large part of
  // the writer's work per dispatched job. Their ids keep the order they were added in.
  // `state`: the state the event's run or sweep entered ("" = NULL: not a change of state).
  void AddEvent(int64_t sweep_id, int64_t run_id, std::string kind, std::string message,
                std::string state = "") {
    events_.push_back(
        {Now(), sweep_id, run_id, std::move(kind), std::move(message), std::move(state)});
  }
  size_t pending_events() const { return events_.size(); }
  // Forgets the events added since `mark` (their savepoint or transaction was rolled back).
  void DropEventsFrom(size_t mark) { events_.resize(std::min(mark, events_.size())); }
  absl::Status FlushEvents();

 private:
  struct PendingEvent {
    double time = 0;
    int64_t sweep_id = 0, run_id = 0;  // 0: NULL
    std::string kind, message, state;
  };

  SqliteDb db_;
  StmtCache cache_;
  std::function<absl::Time()> now_;
  bool undo_points_ = true;
  std::vector<PendingEvent> events_;
};

namespace store_internal {

// ---- The writes (writes.cc, *_writes.cc), each the body of one Store method's queued op ----

// Queued on the writer, written with the transaction's other events (StoreWriter::FlushEvents).
// `state`: the state a run_state or sweep_state event's run or sweep entered (events.state).
absl::Status InsertEvent(StoreWriter& w, int64_t sweep_id, int64_t run_id, std::string kind,
                         std::string message, std::string state = "");

// Store::CreateSweep. `config_json`: each run's canonical config, in runs order.
absl::Status ApplyCreateSweep(StoreWriter& w, const SweepRecord& record,
                              const std::vector<std::string>& config_json, SweepIds* ids);
// Store::SetSweepState; `state` is ACTIVE, DONE or CANCELLED.
absl::Status ApplySetSweepState(StoreWriter& w, int64_t sweep_id, const std::string& state);
// Store::CancelSweep.
absl::Status ApplyCancelSweep(StoreWriter& w, int64_t sweep_id, SweepCancellation* result);

// Store::TransitionRun. `report_seq` > 0: the attempt that ends also records its last applied
// metric batch.
absl::Status ApplyTransition(StoreWriter& w, const RunTransition& t, TransitionResult* result,
                             int64_t report_seq = 0);
// Store::FinishAttempt; `write` outlives the op (FinishAttempts waits for it).
absl::Status ApplyFinish(StoreWriter& w, const FinishWrite& write, FinishWriteResult* result);

// Store::ReportMetrics. `ending`: the attempt's end follows in the same write with a summary (a
// Finish): the batch's seq is left to the end's UPDATE of the attempt (*seq_for_end) and the
// run's progress to the summary's steps_done, two row rewrites fewer per job.
absl::Status ApplyMetrics(StoreWriter& w, const MetricBatch& b, ReportResult* result,
                          bool ending = false, int64_t* seq_for_end = nullptr);

// Store::RegisterWorker: the new worker's id in *id.
absl::Status ApplyRegisterWorker(StoreWriter& w, const std::string& name,
                                 const std::string& resources_json, int64_t* id);
// Store::Annotate (annotation_writes.cc).
absl::Status ApplyAnnotate(StoreWriter& w, const AnnotationEdit& edit, AnnotationResult* result);

// The sweep is DONE when nothing of it is left to run (and no boundary bracket is open); ACTIVE
// again when something is.
absl::Status SettleSweepState(StoreWriter& w, int64_t sweep_id, double now);
// Inserts one run of `sweep` (PENDING) at run.index() with its config; returns its id.
absl::StatusOr<int64_t> InsertRunRow(StoreWriter& w, const ExpandedSweep& sweep,
                                     const RunSpec& run, int64_t sweep_id, int64_t variant_id,
                                     const std::string& config_json, double now);

// A tuned sweep's rows (tune_writes.cc), inserted by ApplyCreateSweep: its plan, each run's place
// in the tuning, and a boundary sweep's open bracket per group.
absl::Status InsertTune(StoreWriter& w, int64_t sweep_id, const TunePlan& plan);
absl::Status InsertTuneRun(StoreWriter& w, int64_t sweep_id, int64_t run_id, const TuneRun& run);
// The tune_runs row of `run`, and its group's bracket when the sweep is a boundary one.
absl::Status InsertTuneRows(StoreWriter& w, const ExpandedSweep& sweep, int64_t sweep_id,
                            int64_t run_id, const RunSpec& run);
// Store::ClaimAlerts (alert_writes.cc): `ids` gets one entry per claim.
absl::Status ApplyClaimAlerts(StoreWriter& w, const AlertCursor& cursor,
                              const std::vector<AlertClaim>& claims, std::vector<int64_t>* ids);
// Store::EnqueueAlertOutcome.
absl::Status ApplyAlertOutcome(StoreWriter& w, int64_t alert_id, AlertOutcome outcome,
                               const std::string& error);

// Store::AddTuneProbe and Store::CloseBracket.
absl::Status ApplyAddTuneProbe(StoreWriter& w, const TuneProbeWrite& write, TuneProbeResult* result);
absl::Status ApplyCloseBracket(StoreWriter& w, const BracketWrite& write);
// Store::ApplyTuneDecisions.
absl::Status ApplyTuneDecisions(StoreWriter& w, const TuneDecisionWrite& write,
                                TuneDecisionResult* result);
// Store::EnqueueHeartbeat, EnqueueWorkerGone and EnqueueCheckpoint.
absl::Status ApplyHeartbeat(StoreWriter& w, int64_t worker_id, const std::string& state);
absl::Status ApplyWorkerGone(StoreWriter& w, int64_t worker_id);
absl::Status ApplyCheckpoint(StoreWriter& w, int64_t run_id, int32_t attempt,
                             const std::string& path, int64_t step);

}  // namespace store_internal
}  // namespace ablate

#endif  // ABLATE_ORCHESTRATOR_STORE_STORE_INTERNAL_H_
