// The store's writer machinery (store_internal.h): the queue of writes and its tickets, the
// writer thread that takes everything queued into one transaction per flush (CommitBatch:
// without savepoints first, again with one per write when a write fails alone), the retries of a
// failed flush with backoff, Flush(), and the checkpointer thread that copies the WAL into the
// database file while the writer goes on.
#include <algorithm>
#include <cstdint>
#include <deque>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "orchestrator/store/reader.h"
#include "orchestrator/store/store.h"
#include "orchestrator/store/store_internal.h"

namespace ablate {

// ---- The queue ------------------------------------------------------------------------------------

absl::Status Store::Enqueue(Op op) {
  absl::MutexLock lock(&mu_);
  return EnqueueLocked(std::move(op));
}

absl::Status Store::EnqueueLocked(Op op) {
  if (stop_) return absl::UnavailableError("store: closed");
  if (queued_rows_ + op.rows > options_.max_queued_rows && !queue_.empty()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("store: ", queued_rows_, " rows are waiting to be written (",
                     stats_.last_error.ok() ? "the writer is behind" : stats_.last_error.message(),
                     "); retry later"));
  }
  if (queue_.empty()) oldest_enqueued_ = absl::Now();
  op.ticket = next_ticket_++;
  queued_rows_ += op.rows;
  if (op.urgent) ++urgent_;
  queue_.push_back(std::move(op));
  if (urgent_ > 0 || queued_rows_ >= options_.flush_max_rows || queue_.size() == 1) {
    work_cv_.Signal();
  }
  return absl::OkStatus();
}

absl::Status Store::RunSync(std::function<absl::Status(StoreWriter&)> apply, int64_t rows,
                            bool keep_on_transient) {
  Op op;
  op.apply = std::move(apply);
  op.rows = rows;
  op.keep_on_transient = keep_on_transient;
  std::vector<Op> ops;
  ops.push_back(std::move(op));
  return RunAllSync(std::move(ops))[0];
}

std::vector<absl::Status> Store::RunAllSync(std::vector<Op> ops) {
  struct Outcome {
    absl::Notification done;
    absl::Status status;
  };
  std::vector<std::shared_ptr<Outcome>> outcomes;
  std::vector<absl::Status> statuses(ops.size());
  {
    absl::MutexLock lock(&mu_);
    for (size_t i = 0; i < ops.size(); ++i) {
      auto outcome = std::make_shared<Outcome>();
      Op& op = ops[i];
      op.done = [outcome](absl::Status s) {
        outcome->status = std::move(s);
        outcome->done.Notify();
      };
      op.urgent = true;
      statuses[i] = EnqueueLocked(std::move(op));
      outcomes.push_back(statuses[i].ok() ? outcome : nullptr);
    }
  }
  for (size_t i = 0; i < ops.size(); ++i) {
    if (outcomes[i] == nullptr) continue;
    outcomes[i]->done.WaitForNotification();
    statuses[i] = outcomes[i]->status;
  }
  return statuses;
}

// ---- The writer thread ------------------------------------------------------------------------------

void Store::WriterLoop() {
  while (true) {
    std::deque<Op> batch;
    int64_t batch_rows = 0;
    bool stopping = false;
    if (!TakeDueBatch(&batch, &batch_rows, &stopping)) return;

    std::vector<absl::Status> outcomes(batch.size());
    absl::Status status;
    bool reapplied = false;
    const absl::Time flush_start = absl::Now();
    {
      absl::MutexLock lock(&db_mu_);
      status = CommitBatch(batch, &outcomes, &reapplied);
    }
    const absl::Duration flush_time = absl::Now() - flush_start;
    if (status.ok()) {
      Committed(batch, outcomes, batch_rows, reapplied, flush_time);
    } else if (!RolledBack(batch, status, reapplied, stopping)) {
      return;
    }
  }
}

bool Store::TakeDueBatch(std::deque<Op>* batch, int64_t* rows, bool* stopping) {
  absl::MutexLock lock(&mu_);
  while (true) {
    const absl::Time now = absl::Now();
    if (stop_) {
      *stopping = true;
      break;
    }
    if (!queue_.empty()) {
      absl::Time due = urgent_ > 0 || queued_rows_ >= options_.flush_max_rows
                           ? now
                           : oldest_enqueued_ + options_.flush_interval;
      due = std::max(due, retry_at_);
      if (now >= due) break;
      work_cv_.WaitWithDeadline(&mu_, due);
    } else {
      work_cv_.Wait(&mu_);
    }
  }
  if (*stopping && queue_.empty()) {
    writer_exited_ = true;
    flush_cv_.SignalAll();
    return false;
  }
  batch->swap(queue_);
  *rows = queued_rows_;
  queued_rows_ = 0;
  for (const Op& op : *batch) {
    if (op.urgent) --urgent_;
  }
  return true;
}

void Store::Committed(std::deque<Op>& batch, const std::vector<absl::Status>& outcomes,
                      int64_t rows, bool reapplied, absl::Duration flush_time) {
  {
    // Counted before anyone is told: a caller whose write returned sees it in Stats().
    absl::MutexLock lock(&mu_);
    ++stats_.flushes;
    stats_.reapplied_flushes += reapplied;
    stats_.longest_flush = std::max(stats_.longest_flush, flush_time);
    stats_.rows_committed += rows;
    for (const absl::Status& outcome : outcomes) stats_.dropped_writes += !outcome.ok();
    stats_.last_error = absl::OkStatus();
    backoff_ = options_.retry_min;
    retry_at_ = absl::InfinitePast();
  }
  for (size_t i = 0; i < batch.size(); ++i) {
    if (batch[i].done) batch[i].done(outcomes[i]);
  }
  absl::MutexLock lock(&mu_);
  UpdateDurableTicket();
  flush_cv_.SignalAll();
}

bool Store::RolledBack(std::deque<Op>& batch, const absl::Status& status, bool reapplied,
                       bool stopping) {
  {
    absl::MutexLock lock(&mu_);
    ++stats_.failed_flushes;
    stats_.reapplied_flushes += reapplied;
    stats_.last_error = status;
  }
  std::deque<Op> kept;
  int64_t kept_rows = 0;
  for (Op& op : batch) {
    if (op.done) {
      op.done(status);
      op.done = nullptr;
    }
    if (op.keep_on_transient && !stopping) {
      kept_rows += op.rows;
      op.urgent = false;
      kept.push_back(std::move(op));
    }
  }
  absl::MutexLock lock(&mu_);
  if (!kept.empty()) {
    for (auto it = kept.rbegin(); it != kept.rend(); ++it) queue_.push_front(std::move(*it));
    queued_rows_ += kept_rows;
    oldest_enqueued_ = absl::Now();
  }
  UpdateDurableTicket();
  retry_at_ = absl::Now() + backoff_;
  backoff_ = std::min(backoff_ * 2, options_.retry_max);
  flush_cv_.SignalAll();
  if (!stopping) return true;
  // One last attempt was made for what was queued at close; fail the rest.
  while (!queue_.empty()) {
    Op op = std::move(queue_.front());
    queue_.pop_front();
    if (op.done) op.done(absl::UnavailableError("store: closed before the write committed"));
  }
  writer_exited_ = true;
  return false;
}

void Store::UpdateDurableTicket() {
  // Everything ahead of the queue's front has committed or failed alone (or, for synchronous
  // writes, failed with its flush and been reported).
  durable_ticket_ = queue_.empty() ? next_ticket_ - 1 : queue_.front().ticket - 1;
}

// The first pass applies the batch without savepoints. An open savepoint makes SQLite copy
// every page a write touches into its sub-journal first, work that a savepoint per write pays
// on every flush for an undo that is almost never needed. Writes rarely fail alone (a stale
// finish, a run cancelled under its lease); when one does, the transaction is rolled back and
// the batch applied again, each write under its own savepoint.
absl::Status Store::CommitBatch(std::deque<Op>& batch, std::vector<absl::Status>* outcomes,
                                bool* reapplied) {
  bool failed_alone = false;
  absl::Status s = ApplyBatch(batch, /*undo_points=*/false, outcomes, &failed_alone);
  if (!failed_alone) return s;
  *reapplied = true;
  std::fill(outcomes->begin(), outcomes->end(), absl::OkStatus());
  return ApplyBatch(batch, /*undo_points=*/true, outcomes, &failed_alone);
}

absl::Status Store::ApplyBatch(std::deque<Op>& batch, bool undo_points,
                               std::vector<absl::Status>* outcomes, bool* failed_alone) {
  StoreWriter& w = *writer_;
  sqlite3* db = w.db();
  auto rollback = [&]() {
    if (!sqlite3_get_autocommit(db)) Exec(db, "ROLLBACK").IgnoreError();
    w.DropEventsFrom(0);
  };
  if (absl::Status s = w.Run("BEGIN IMMEDIATE"); !s.ok()) {
    rollback();
    return s;
  }
  w.set_undo_points(undo_points);
  for (size_t i = 0; i < batch.size(); ++i) {
    if (undo_points) {
      if (absl::Status s = w.Run("SAVEPOINT op"); !s.ok()) {
        rollback();
        return s;
      }
    }
    absl::Status s = batch[i].apply(w);
    // Under a savepoint, the write's events go in with it: a later write undone alone must not
    // take them along.
    if (s.ok() && undo_points) s = w.FlushEvents();
    if (s.ok()) {
      if (!undo_points) continue;
      s = w.Run("RELEASE op");
      if (!s.ok()) {
        rollback();
        return s;
      }
      continue;
    }
    if (IsTransient(s) || sqlite3_get_autocommit(db)) {
      rollback();
      return s;
    }
    if (!undo_points) {
      rollback();
      *failed_alone = true;
      return s;
    }
    // This write alone is wrong: undo it, keep the others.
    (*outcomes)[i] = s;
    w.DropEventsFrom(0);
    absl::Status undo = w.Run("ROLLBACK TO op");
    if (undo.ok()) undo = w.Run("RELEASE op");
    if (!undo.ok()) {
      rollback();
      return undo;
    }
  }
  if (absl::Status s = w.FlushEvents(); !s.ok()) {
    rollback();
    return s;
  }
  if (absl::Status s = w.Run("COMMIT"); !s.ok()) {
    rollback();
    return s;
  }
  return absl::OkStatus();
}

absl::Status Store::Flush() {
  absl::MutexLock lock(&mu_);
  const uint64_t target = next_ticket_ - 1;
  if (durable_ticket_ >= target) return absl::OkStatus();
  const int64_t failures = stats_.failed_flushes;
  ++urgent_;
  work_cv_.Signal();
  while (durable_ticket_ < target && stats_.failed_flushes == failures && !writer_exited_) {
    flush_cv_.Wait(&mu_);
  }
  --urgent_;
  if (durable_ticket_ >= target) return absl::OkStatus();
  if (writer_exited_) return absl::UnavailableError("store: closed");
  return stats_.last_error;
}

// ---- The checkpointer -------------------------------------------------------------------------------

int Store::OnWalCommit(void* store, sqlite3* db, const char*, int pages) {
  auto* self = static_cast<Store*>(store);
  if (pages < self->options_.checkpoint_pages) return SQLITE_OK;
  {
    absl::MutexLock lock(&self->checkpoint_mu_);
    self->checkpoint_wanted_ = true;
  }
  // The WAL starts over only when a checkpoint copied all of it before the writer's next
  // transaction, which a checkpointer racing a busy writer rarely does: past twice the limit
  // the writer waits for the checkpointer's pass and copies the rest itself (the frames
  // since that pass). SQLite's own automatic checkpoint is a WAL hook doing the same.
  if (pages >= 2 * self->options_.checkpoint_pages) {
    absl::MutexLock pass(&self->checkpoint_pass_mu_);
    sqlite3_wal_checkpoint_v2(db, nullptr, SQLITE_CHECKPOINT_PASSIVE, nullptr, nullptr);
  }
  return SQLITE_OK;
}

void Store::CheckpointLoop() {
  while (true) {
    {
      absl::MutexLock lock(&checkpoint_mu_);
      checkpoint_mu_.Await(absl::Condition(
          +[](Store* s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->checkpoint_mu_) {
            return s->checkpoint_wanted_ || s->checkpoint_stop_;
          },
          this));
      if (checkpoint_stop_) return;
      checkpoint_wanted_ = false;
    }
    // PASSIVE: copies what no reader still needs and never waits for the writer or a reader.
    // The writer starts the WAL over at its next transaction once all of it was copied.
    int wal_pages = 0, copied = 0, rc = SQLITE_OK;
    {
      absl::MutexLock pass(&checkpoint_pass_mu_);
      rc = sqlite3_wal_checkpoint_v2(checkpoint_db_.get(), nullptr, SQLITE_CHECKPOINT_PASSIVE,
                                     &wal_pages, &copied);
    }
    // WAL pressure: the pass left most of a WAL several times its usual size, because readers
    // still see old pages. Those are users' queries (typed reads are short): they are
    // interrupted and refused for the moment it takes to copy the WAL back, or it would grow
    // without bound under overlapping queries and steady ingestion.
    if (rc == SQLITE_OK && wal_pages >= kWalPressure * options_.checkpoint_pages &&
        copied < wal_pages) {
      {
        absl::MutexLock lock(&mu_);
        ++stats_.query_pauses;  // before: a query it interrupts sees the count
      }
      reader_->PauseQueries(true);
      for (int attempt = 0; attempt < 100 && copied < wal_pages; ++attempt) {
        absl::SleepFor(absl::Milliseconds(attempt == 0 ? 1 : 10));  // the interrupted ones end
        absl::MutexLock pass(&checkpoint_pass_mu_);
        rc = sqlite3_wal_checkpoint_v2(checkpoint_db_.get(), nullptr, SQLITE_CHECKPOINT_PASSIVE,
                                       &wal_pages, &copied);
        if (rc != SQLITE_OK) break;
      }
      reader_->PauseQueries(false);
    }
    absl::MutexLock lock(&mu_);
    // BUSY: another connection (a user's sqlite3) was checkpointing; the next pass goes on.
    if (rc == SQLITE_OK || rc == SQLITE_BUSY) {
      stats_.checkpoints += copied > 0;
      stats_.checkpoint_error = absl::OkStatus();
    } else {
      stats_.checkpoint_error = absl::UnavailableError(
          absl::StrCat("store: checkpoint: ", sqlite3_errmsg(checkpoint_db_.get())));
    }
  }
}

}  // namespace ablate
