// StoreReader's opening and its connections: Open checks the file is an ablate store of a schema
// this build reads, the two pools of read-only guarded connections (the typed reads' and the
// users' SQL's), ReadOnlyQuery in the sandbox of query.h, and the row mappers more than one of the
// reader's files share (reader_internal.h says which file reads what).
#include "orchestrator/store/reader.h"

#include <sys/stat.h>

#include <algorithm>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "orchestrator/store/reader_internal.h"
#include "orchestrator/store/schema.h"
#include "orchestrator/store/sqlite.h"

namespace ablate {

std::string RunStateName(RunState state) { return RunState_Name(state); }

RunState ParseRunState(const std::string& name) {
  RunState state = RUN_STATE_UNSPECIFIED;
  if (!RunState_Parse(name, &state)) return RUN_STATE_UNSPECIFIED;
  return state;
}

// ---- Connections: from a pool, each read-only and guarded (query.h) -----------------------------

absl::StatusOr<std::unique_ptr<StoreReader>> StoreReader::Open(const ReaderOptions& options) {
  struct stat st;
  if (::stat(options.path.c_str(), &st) != 0) {
    return absl::NotFoundError(absl::StrCat("store: no database at ", options.path));
  }
  std::unique_ptr<StoreReader> reader(new StoreReader(options));
  absl::StatusOr<std::unique_ptr<Connection>> first = reader->Connect();
  if (!first.ok()) return first.status();
  absl::StatusOr<int64_t> version = QueryInt((*first)->db.get(), "PRAGMA user_version");
  if (!version.ok()) return version.status();
  if (*version == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("store: ", options.path, " is not an ablate database (schema version 0)"));
  }
  if (*version > StoreSchemaVersion()) {
    return absl::FailedPreconditionError(
        absl::StrCat("store: ", options.path, " has schema version ", *version,
                     ", newer than this build's ", StoreSchemaVersion()));
  }
  {
    absl::MutexLock lock(&reader->mu_);
    reader->reads_.open = 1;
    reader->reads_.idle.push_back(std::move(*first));
  }
  return reader;
}

StoreReader::StoreReader(const ReaderOptions& options) : options_(options) {
  {
    absl::MutexLock lock(&mu_);
    reads_.max = std::max(1, options.max_connections);
    queries_.max = std::max(1, options.max_query_connections);
  }
  static std::once_flag heap_limit;
  std::call_once(heap_limit, [] {
    if (SqliteHardHeapLimit(-1) == 0) SqliteHardHeapLimit(kSqliteHeapLimit);
  });
}

StoreReader::~StoreReader() = default;

absl::StatusOr<std::unique_ptr<StoreReader::Connection>> StoreReader::Connect() const {
  absl::StatusOr<SqliteDb> db =
      OpenDb(options_.path, SQLITE_OPEN_READONLY | SQLITE_OPEN_NOMUTEX);
  if (!db.ok()) return db.status();
  auto connection = std::make_unique<Connection>();
  connection->db = std::move(*db);
  sqlite3* raw = connection->db.get();
  sqlite3_busy_timeout(raw, static_cast<int>(absl::ToInt64Milliseconds(options_.busy_timeout)));
  if (absl::Status s = GuardConnection(raw, &connection->guard); !s.ok()) return s;
  connection->cache = std::make_unique<StmtCache>(raw);
  return connection;
}

absl::StatusOr<StoreReader::Lease> StoreReader::Acquire(Pool* pool, absl::Time deadline) const {
  {
    absl::MutexLock lock(&mu_);
    if (pool == nullptr) pool = &reads_;
    auto available = [pool]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return !pool->idle.empty() || pool->open < pool->max;
    };
    if (!mu_.AwaitWithDeadline(absl::Condition(&available), deadline)) {
      return absl::UnavailableError(absl::StrCat(
          "store: busy: ", pool->open, " queries are running (at most ", pool->max,
          " at once); try again when one ends"));
    }
    if (!pool->idle.empty()) {
      std::unique_ptr<Connection> connection = std::move(pool->idle.back());
      pool->idle.pop_back();
      return Lease(this, pool, std::move(connection));
    }
    ++pool->open;
  }
  absl::StatusOr<std::unique_ptr<Connection>> connection = Connect();
  if (!connection.ok()) {
    absl::MutexLock lock(&mu_);
    --pool->open;
    return connection.status();
  }
  return Lease(this, pool, std::move(*connection));
}

void StoreReader::Release(Pool* pool, std::unique_ptr<Connection> connection) const {
  connection->guard.Reset();
  absl::MutexLock lock(&mu_);
  pool->idle.push_back(std::move(connection));
}

// ---- Ad-hoc queries: the users' SQL, in the sandbox of query.h ----------------------------------

absl::StatusOr<QueryResult> StoreReader::ReadOnlyQuery(const std::string& sql,
                                                       const QueryLimits& limits) const {
  absl::StatusOr<Lease> lease = Acquire(&queries_, absl::Now() + options_.query_wait);
  if (!lease.ok()) return lease.status();
  sqlite3* db = (*lease)->db.get();
  constexpr absl::string_view kPaused =
      "query: the store is copying its write-ahead log back, which long queries held up; try "
      "again in a moment";
  {
    absl::MutexLock lock(&mu_);
    if (queries_closed_) return absl::UnavailableError("query: the store is closing");
    if (queries_paused_) return absl::UnavailableError(kPaused);
    running_queries_.insert(db);
  }
  absl::StatusOr<QueryResult> result = RunGuardedQuery(db, &(*lease)->guard, sql, limits);
  absl::MutexLock lock(&mu_);
  running_queries_.erase(db);
  // Interrupted by PauseQueries rather than by the store closing: say so.
  if (paused_queries_.erase(db) > 0 && absl::IsUnavailable(result.status()) && !queries_closed_) {
    return absl::UnavailableError(kPaused);
  }
  return result;
}

void StoreReader::InterruptQueries() const {
  absl::MutexLock lock(&mu_);
  queries_closed_ = true;
  for (sqlite3* db : running_queries_) sqlite3_interrupt(db);
}

int StoreReader::OpenConnections() const {
  absl::MutexLock lock(&mu_);
  return reads_.open;
}

void StoreReader::PauseQueries(bool paused) const {
  absl::MutexLock lock(&mu_);
  queries_paused_ = paused;
  if (!paused) return;
  for (sqlite3* db : running_queries_) {
    paused_queries_.insert(db);
    sqlite3_interrupt(db);
  }
}

// ---- Row mappers shared by the reader's files ---------------------------------------------------

namespace reader_internal {

SpikeEvent ReadSpike(const Stmt& s, int first) {
  SpikeEvent e;
  e.set_step(s.ColumnInt(first));
  e.set_signal(s.ColumnText(first + 1));
  e.set_value(s.ColumnDouble(first + 2));
  e.set_baseline(s.ColumnDouble(first + 3));
  SpikeKind kind = SPIKE_KIND_UNSPECIFIED;
  SpikeKind_Parse(s.ColumnText(first + 4), &kind);
  e.set_kind(kind);
  SpikeAction action = SPIKE_ACTION_RECORDED;
  SpikeAction_Parse(s.ColumnText(first + 5), &action);
  e.set_action(action);
  e.set_rollback_to_step(s.ColumnInt(first + 6));
  return e;
}

SweepSpike ReadSweepSpike(const Stmt& s) {
  return SweepSpike{s.ColumnInt(0), s.ColumnInt(1), ReadSpike(s, 2)};
}

}  // namespace reader_internal

}  // namespace ablate
