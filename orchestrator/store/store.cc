// The store's opening and closing and its public API (store.h): each write method checks its
// arguments, wraps its write (writes.cc, store_internal.h) in an op and queues it on the writer
// (writer.cc), waiting for the op's transaction when the method is synchronous.
#include "orchestrator/store/store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <pthread.h>

#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "fmt/format.h"
#include "config/proto_yaml.h"
#include "orchestrator/store/reader.h"
#include "orchestrator/store/schema.h"
#include "orchestrator/store/store_internal.h"

namespace ablate {

using store_internal::ApplyAnnotate;
using store_internal::ApplyCancelSweep;
using store_internal::ApplyCheckpoint;
using store_internal::ApplyCreateSweep;
using store_internal::ApplyFinish;
using store_internal::ApplyHeartbeat;
using store_internal::ApplyMetrics;
using store_internal::ApplyRegisterWorker;
using store_internal::ApplySetSweepState;
using store_internal::ApplyTransition;
using store_internal::ApplyWorkerGone;
using store_internal::InsertEvent;

int64_t MetricBatch::Rows() const {
  int64_t rows = 2 + static_cast<int64_t>(steps.size() + spikes.size());
  for (const EvalResult& e : evals) rows += 1 + e.probes().layers_size() + e.metrics_size();
  return rows;
}

// ---- Open / close ---------------------------------------------------------------------------------

Store::Store(const StoreOptions& options) : options_(options), backoff_(options.retry_min) {}

absl::StatusOr<std::unique_ptr<Store>> Store::Open(const StoreOptions& options) {
  if (options.path.empty()) return absl::InvalidArgumentError("store: no database path");
  if (options.checkpoint_pages < 1 || options.checkpoint_pages > (1 << 24)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "store: checkpoint_pages must be 1 to 16777216, not ", options.checkpoint_pages));
  }
  // Created mode 0600 (SQLite would make it 0644 under the usual umask): the results, the
  // workers' names and the specs are the owner's alone. SQLite gives its -wal and -shm files the
  // database file's mode.
  if (const int fd = ::open(options.path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
      fd >= 0) {
    ::close(fd);
  }
  // One that exists is trusted only if it is this user's and no one else can write it: another
  // could rewrite results, or plant rows the coordinator acts on (a run to train, a worker).
  struct stat st;
  if (::lstat(options.path.c_str(), &st) == 0) {
    if (S_ISLNK(st.st_mode)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "store: ", options.path, " is a symbolic link: open the database it names instead"));
    }
    if (st.st_uid != ::geteuid()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "store: ", options.path, " belongs to user ", st.st_uid, ", not to this one (",
          ::geteuid(), "): a coordinator writes only its own database"));
    }
    if ((st.st_mode & 022) != 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "store: ", options.path, " is writable by group or others (mode ",
          fmt::format("{:04o}", st.st_mode & 07777), "): chmod 600 it"));
    }
  }
  absl::StatusOr<SqliteDb> db =
      OpenDb(options.path, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX);
  if (!db.ok()) return db.status();
  sqlite3* raw = db->get();
  sqlite3_busy_timeout(raw, static_cast<int>(absl::ToInt64Milliseconds(options.busy_timeout)));
  absl::StatusOr<Stmt> wal = Stmt::Prepare(raw, "PRAGMA journal_mode = WAL");
  if (!wal.ok()) return wal.status();
  absl::StatusOr<bool> row = wal->Step();
  if (!row.ok()) return row.status();
  if (!*row || wal->ColumnText(0) != "wal") {
    return absl::FailedPreconditionError(
        absl::StrCat("store: cannot put ", options.path, " in WAL mode (journal mode is ",
                     *row ? wal->ColumnText(0) : "unknown", ")"));
  }
  wal->Reset();
  // The writer's and the checkpointer's connections alike.
  const char* const synchronous =
      options.synchronous_full ? "PRAGMA synchronous = FULL" : "PRAGMA synchronous = NORMAL";
  if (absl::Status s = Exec(raw, synchronous); !s.ok()) {
    return s;
  }
  // A large page cache and infrequent checkpoints keep bulk ingestion off the disk's critical
  // path; readers are unaffected. A write under a SAVEPOINT has each page it changes copied into
  // a sub-journal, a temporary file by default, whose writes would outnumber the WAL's own; in
  // memory it holds at most the pages one write changes. No automatic checkpoint on this
  // connection: copying the WAL into the database and syncing it would stop every write queued
  // meanwhile; the checkpointer thread does it on a connection of its own.
  if (absl::Status s = Exec(raw, "PRAGMA foreign_keys = ON; PRAGMA cache_size = -65536; "
                                 "PRAGMA temp_store = MEMORY");
      !s.ok()) {
    return s;
  }
  if (absl::Status s = MigrateStore(raw); !s.ok()) return s;
  // The WAL file is cut back to twice the limit when it starts over.
  if (absl::Status s = Exec(raw, absl::StrCat("PRAGMA journal_size_limit = ",
                                              int64_t{2} * options.checkpoint_pages * 4096));
      !s.ok()) {
    return s;
  }
  absl::StatusOr<SqliteDb> checkpoint_db =
      OpenDb(options.path, SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX);
  if (!checkpoint_db.ok()) return checkpoint_db.status();
  sqlite3_busy_timeout(checkpoint_db->get(),
                       static_cast<int>(absl::ToInt64Milliseconds(options.busy_timeout)));
  if (absl::Status s = Exec(checkpoint_db->get(), synchronous); !s.ok()) return s;

  std::unique_ptr<Store> store(new Store(options));
  ReaderOptions reader_options;
  reader_options.path = options.path;
  reader_options.max_connections = options.reader_connections;
  absl::StatusOr<std::unique_ptr<StoreReader>> reader = StoreReader::Open(reader_options);
  if (!reader.ok()) return reader.status();
  store->reader_ = std::move(*reader);
  reader_options.max_connections = options.scheduling_connections;
  reader_options.max_query_connections = 1;  // never used: users' SQL goes through reader()
  absl::StatusOr<std::unique_ptr<StoreReader>> scheduling = StoreReader::Open(reader_options);
  if (!scheduling.ok()) return scheduling.status();
  store->scheduling_reader_ = std::move(*scheduling);
  store->checkpoint_db_ = *std::move(checkpoint_db);
  // Replaces SQLite's automatic checkpoint (itself a WAL hook) on the writer's connection.
  sqlite3_wal_hook(raw, &Store::OnWalCommit, store.get());
  {
    absl::MutexLock lock(&store->db_mu_);
    store->writer_ = std::make_unique<StoreWriter>(std::move(*db), options.now);
  }
  store->writer_thread_ = std::thread([s = store.get()] { s->WriterLoop(); });
  // Named for top, perf and the benchmarks, which read its CPU time under /proc.
  pthread_setname_np(store->writer_thread_.native_handle(), kWriterThreadName);
  store->checkpoint_thread_ = std::thread([s = store.get()] { s->CheckpointLoop(); });
  pthread_setname_np(store->checkpoint_thread_.native_handle(), "ablate-ckpt");
  return store;
}

Store::~Store() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
    work_cv_.SignalAll();
  }
  if (writer_thread_.joinable()) writer_thread_.join();
  {
    absl::MutexLock lock(&checkpoint_mu_);
    checkpoint_stop_ = true;
  }
  if (checkpoint_thread_.joinable()) checkpoint_thread_.join();
  checkpoint_db_.reset();
  absl::MutexLock lock(&db_mu_);
  if (writer_ != nullptr) {
    // Leave a short WAL behind; failure is harmless (readers may hold it).
    Exec(writer_->db(), "PRAGMA wal_checkpoint(TRUNCATE)").IgnoreError();
    writer_->Close();
  }
}

// ---- Stats --------------------------------------------------------------------------------------

StoreStats Store::Stats() const {
  absl::MutexLock lock(&mu_);
  StoreStats stats = stats_;
  stats.queued_writes = static_cast<int64_t>(queue_.size());
  stats.queued_rows = queued_rows_;
  return stats;
}

absl::Status Store::RunOnWriterForTesting(const std::function<absl::Status(sqlite3*)>& fn) {
  absl::MutexLock lock(&db_mu_);
  return fn(writer_->db());
}

// ---- The write API -----------------------------------------------------------------------------------

absl::StatusOr<SweepIds> Store::CreateSweep(const SweepRecord& record) {
  // The runs' JSON is printed here, on the caller's thread, when the record does not bring it:
  // printed on the writer, it would hold every other write (reports, finishes) back while a
  // large sweep is stored.
  const int runs = record.expanded.runs_size();
  if (!record.config_json.empty() && static_cast<int>(record.config_json.size()) != runs) {
    return absl::InvalidArgumentError(absl::StrCat("store: sweep ", record.expanded.name(), " has ",
                                                   runs, " runs but ", record.config_json.size(),
                                                   " config JSONs"));
  }
  std::vector<std::string> printed;
  if (record.config_json.empty()) {
    printed.reserve(runs);
    for (const RunSpec& run : record.expanded.runs()) printed.push_back(CanonicalJson(run.config()));
  }
  const std::vector<std::string>& config_json =
      record.config_json.empty() ? printed : record.config_json;
  auto ids = std::make_shared<SweepIds>();
  absl::Status s = RunSync(
      [&record, &config_json, ids](StoreWriter& w) {
        *ids = SweepIds();
        return ApplyCreateSweep(w, record, config_json, ids.get());
      },
      1 + runs);
  if (!s.ok()) return s;
  return *ids;
}

absl::Status Store::SetSweepState(int64_t sweep_id, const std::string& state) {
  if (state != "ACTIVE" && state != "DONE" && state != "CANCELLED") {
    return absl::InvalidArgumentError(
        absl::StrCat("store: sweep state ", state, " is not ACTIVE, DONE or CANCELLED"));
  }
  return RunSync(
      [sweep_id, state](StoreWriter& w) { return ApplySetSweepState(w, sweep_id, state); }, 2);
}

absl::StatusOr<SweepCancellation> Store::CancelSweep(int64_t sweep_id) {
  auto result = std::make_shared<SweepCancellation>();
  absl::Status s = RunSync(
      [sweep_id, result](StoreWriter& w) {
        *result = SweepCancellation();
        return ApplyCancelSweep(w, sweep_id, result.get());
      },
      16);
  if (!s.ok()) return s;
  return *result;
}

absl::StatusOr<TransitionResult> Store::TransitionRun(const RunTransition& transition) {
  std::vector<absl::StatusOr<TransitionResult>> r = TransitionRuns({transition});
  return std::move(r[0]);
}

std::vector<absl::StatusOr<TransitionResult>> Store::TransitionRuns(
    const std::vector<RunTransition>& transitions) {
  std::vector<Op> ops;
  std::vector<std::shared_ptr<TransitionResult>> results;
  for (const RunTransition& transition : transitions) {
    auto result = std::make_shared<TransitionResult>();
    Op op;
    op.apply = [&transition, result](StoreWriter& w) {
      *result = TransitionResult();
      return ApplyTransition(w, transition, result.get());
    };
    op.rows = 4;
    ops.push_back(std::move(op));
    results.push_back(std::move(result));
  }
  std::vector<absl::Status> statuses = RunAllSync(std::move(ops));
  std::vector<absl::StatusOr<TransitionResult>> out;
  for (size_t i = 0; i < statuses.size(); ++i) {
    if (statuses[i].ok()) {
      out.emplace_back(*results[i]);
    } else {
      out.emplace_back(statuses[i]);
    }
  }
  return out;
}

Store::Op Store::FinishOp(const FinishWrite& write, std::shared_ptr<FinishWriteResult> result) {
  Op op;
  op.apply = [&write, result](StoreWriter& w) {
    *result = FinishWriteResult();
    return ApplyFinish(w, write, result.get());
  };
  op.rows = (write.batch.has_value() ? write.batch->Rows() : 0) + 8 +
            static_cast<int64_t>(write.more_starts.size());
  return op;
}

absl::StatusOr<FinishWriteResult> Store::FinishAttempt(const FinishWrite& write) {
  std::vector<absl::StatusOr<FinishWriteResult>> r = FinishAttempts({write});
  return std::move(r[0]);
}

std::vector<absl::StatusOr<FinishWriteResult>> Store::FinishAttempts(
    const std::vector<FinishWrite>& writes) {
  std::vector<absl::StatusOr<FinishWriteResult>> out(writes.size(), FinishWriteResult());
  std::vector<Op> ops;
  std::vector<size_t> index;  // of each op's write
  std::vector<std::shared_ptr<FinishWriteResult>> results;
  for (size_t i = 0; i < writes.size(); ++i) {
    if (writes[i].batch.has_value() && writes[i].batch->seq < 1) {
      out[i] = absl::InvalidArgumentError("store: metric batch seq must be >= 1");
      continue;
    }
    results.push_back(std::make_shared<FinishWriteResult>());
    ops.push_back(FinishOp(writes[i], results.back()));
    index.push_back(i);
  }
  std::vector<absl::Status> statuses = RunAllSync(std::move(ops));
  for (size_t k = 0; k < index.size(); ++k) {
    if (statuses[k].ok()) {
      out[index[k]] = *results[k];
    } else {
      out[index[k]] = statuses[k];
    }
  }
  return out;
}

absl::StatusOr<int64_t> Store::RegisterWorker(const std::string& name,
                                              const std::string& resources_json) {
  auto id = std::make_shared<int64_t>(0);
  absl::Status s = RunSync(
      [&name, &resources_json, id](StoreWriter& w) {
        return ApplyRegisterWorker(w, name, resources_json, id.get());
      },
      2);
  if (!s.ok()) return s;
  return *id;
}

absl::StatusOr<AnnotationResult> Store::Annotate(const AnnotationEdit& edit) {
  if (edit.texts.empty()) return absl::InvalidArgumentError("store: annotate: no tag or note");
  if (edit.action == AnnotationEdit::Action::kNote && edit.texts.size() != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("store: annotate: a note is one text, not ", edit.texts.size()));
  }
  auto result = std::make_shared<AnnotationResult>();
  absl::Status s = RunSync(
      [&edit, result](StoreWriter& w) {
        *result = AnnotationResult();
        return ApplyAnnotate(w, edit, result.get());
      },
      1 + static_cast<int64_t>(edit.texts.size()));
  if (!s.ok()) return s;
  return *result;
}

absl::StatusOr<TuneDecisionResult> Store::ApplyTuneDecisions(const TuneDecisionWrite& write) {
  auto result = std::make_shared<TuneDecisionResult>();
  int64_t rows = 1;
  for (const TuneDecisionWrite::Decision& d : write.decisions) {
    rows += 1 + static_cast<int64_t>(d.runs.size());
  }
  absl::Status s = RunSync(
      [&write, result](StoreWriter& w) {
        *result = TuneDecisionResult();
        return store_internal::ApplyTuneDecisions(w, write, result.get());
      },
      rows);
  if (!s.ok()) return s;
  return *result;
}

absl::StatusOr<TuneProbeResult> Store::AddTuneProbe(const TuneProbeWrite& write) {
  auto result = std::make_shared<TuneProbeResult>();
  absl::Status s = RunSync(
      [&write, result](StoreWriter& w) {
        *result = TuneProbeResult();
        return store_internal::ApplyAddTuneProbe(w, write, result.get());
      },
      1 + 3 * static_cast<int64_t>(write.runs.runs_size()));
  if (!s.ok()) return s;
  return *result;
}

absl::Status Store::CloseBracket(const BracketWrite& write) {
  return RunSync([&write](StoreWriter& w) { return store_internal::ApplyCloseBracket(w, write); },
                 2);
}

absl::StatusOr<std::vector<int64_t>> Store::ClaimAlerts(const AlertCursor& cursor,
                                                        const std::vector<AlertClaim>& claims) {
  auto ids = std::make_shared<std::vector<int64_t>>();
  absl::Status s = RunSync(
      [&cursor, &claims, ids](StoreWriter& w) {
        ids->clear();
        return store_internal::ApplyClaimAlerts(w, cursor, claims, ids.get());
      },
      static_cast<int64_t>(claims.size()) + 1);
  if (!s.ok()) return s;
  return *ids;
}

absl::Status Store::EnqueueAlertOutcome(int64_t alert_id, AlertOutcome outcome,
                                        const std::string& error) {
  Op op;
  op.apply = [alert_id, outcome, error](StoreWriter& w) {
    return store_internal::ApplyAlertOutcome(w, alert_id, outcome, error);
  };
  op.keep_on_transient = true;
  return Enqueue(std::move(op));
}

absl::StatusOr<ReportResult> Store::ReportMetrics(const MetricBatch& batch) {
  if (batch.seq < 1) return absl::InvalidArgumentError("store: metric batch seq must be >= 1");
  auto result = std::make_shared<ReportResult>();
  // The batch is copied into the op: it may outlive this call when kept for a retry.
  auto owned = std::make_shared<MetricBatch>(batch);
  absl::Status s = RunSync(
      [owned, result](StoreWriter& w) {
        *result = ReportResult();
        return ApplyMetrics(w, *owned, result.get());
      },
      batch.Rows(), /*keep_on_transient=*/true);
  if (!s.ok()) return s;
  return *result;
}

absl::Status Store::EnqueueMetrics(MetricBatch batch,
                                   std::function<void(absl::StatusOr<ReportResult>)> done) {
  if (batch.seq < 1) return absl::InvalidArgumentError("store: metric batch seq must be >= 1");
  auto result = std::make_shared<ReportResult>();
  Op op;
  op.rows = batch.Rows();
  op.apply = [b = std::make_shared<MetricBatch>(std::move(batch)), result](StoreWriter& w) {
    *result = ReportResult();
    return ApplyMetrics(w, *b, result.get());
  };
  if (done) {
    op.done = [done = std::move(done), result](absl::Status s) {
      if (s.ok()) {
        done(*result);
      } else {
        done(std::move(s));
      }
    };
  }
  op.keep_on_transient = true;
  return Enqueue(std::move(op));
}

absl::Status Store::EnqueueHeartbeat(int64_t worker_id, const std::string& state) {
  Op op;
  op.apply = [worker_id, state](StoreWriter& w) { return ApplyHeartbeat(w, worker_id, state); };
  op.keep_on_transient = true;
  return Enqueue(std::move(op));
}

absl::Status Store::EnqueueWorkerGone(int64_t worker_id) {
  Op op;
  op.apply = [worker_id](StoreWriter& w) { return ApplyWorkerGone(w, worker_id); };
  op.keep_on_transient = true;
  return Enqueue(std::move(op));
}

absl::Status Store::EnqueueCheckpoint(int64_t run_id, int32_t attempt, const std::string& path,
                                      int64_t step) {
  Op op;
  op.apply = [run_id, attempt, path, step](StoreWriter& w) {
    return ApplyCheckpoint(w, run_id, attempt, path, step);
  };
  op.keep_on_transient = true;
  return Enqueue(std::move(op));
}

absl::Status Store::EnqueueEvent(int64_t sweep_id, int64_t run_id, const std::string& kind,
                                 const std::string& message) {
  Op op;
  op.apply = [sweep_id, run_id, kind, message](StoreWriter& w) {
    return InsertEvent(w, sweep_id, run_id, kind, message);
  };
  op.keep_on_transient = true;
  return Enqueue(std::move(op));
}

}  // namespace ablate
