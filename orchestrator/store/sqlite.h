// Thin RAII helpers over the SQLite C API, shared by the store's writer and readers.
//
// Error mapping (SqliteStatus), the one place where SQLite result codes become absl codes:
//   SQLITE_BUSY, SQLITE_LOCKED            -> Unavailable       (transient: retry later)
//   SQLITE_FULL                           -> ResourceExhausted (transient: retry when space frees)
//   SQLITE_IOERR*, SQLITE_NOMEM, SQLITE_CANTOPEN, SQLITE_PROTOCOL -> Unavailable (transient)
//   SQLITE_INTERRUPT                      -> DeadlineExceeded / Cancelled (set by the caller)
//   SQLITE_CONSTRAINT*                    -> FailedPrecondition
//   SQLITE_AUTH                           -> PermissionDenied
//   SQLITE_CORRUPT, SQLITE_NOTADB         -> DataLoss
//   everything else                       -> Internal
// IsTransient() says which codes a writer keeps its queued work for and retries.
//
// Not thread-safe by themselves: a connection and its statements belong to one thread at a time.
#ifndef ABLATE_ORCHESTRATOR_STORE_SQLITE_H_
#define ABLATE_ORCHESTRATOR_STORE_SQLITE_H_

#include <sqlite3.h>

#include <cstdint>
#include <memory>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ablate {

// An absl::Status for SQLite result `code`, "store: <context>: <sqlite message>". The message
// comes from `db` when given (sqlite3_errmsg), else from sqlite3_errstr(code).
absl::Status SqliteStatus(int code, sqlite3* db, absl::string_view context);

// True for the codes a writer retries: Unavailable (busy, locked, I/O) and ResourceExhausted
// (disk or database full).
bool IsTransient(const absl::Status& status);

// SQLite's heap, counted by ablate. sqlite.cc gives SQLite an allocator of its own before SQLite's
// first use (a static initializer), with SQLite's memory statistics off: they took one
// process-wide mutex around every allocation and free, and Debian's SQLite, built without
// lookaside, allocates about 100 times per dispatched job on the store's writer alone. The
// allocator counts in atomics what the statistics counted (each block's usable size) and
// enforces the hard limit as sqlite3_hard_heap_limit64 would, without the mutex. Where
// SQLite was initialized before the allocator could be given (a program that used SQLite before
// main), these read and set SQLite's own statistics and limit instead.
int64_t SqliteMemoryUsed();
// The most SqliteMemoryUsed() was since the last reset; `reset` starts it over at the current use.
int64_t SqliteMemoryHighwater(bool reset);
// Sets the hard limit on SQLite's heap to `limit` bytes (0: none; negative: leaves it), as
// sqlite3_hard_heap_limit64: past it SQLite's allocations fail (SQLITE_NOMEM). Returns the limit
// before the call.
int64_t SqliteHardHeapLimit(int64_t limit);
// Whether SQLite allocates through ablate's allocator (false only in the case above).
bool SqliteCountedAllocator();

// Runs one or more statements without results (sqlite3_exec).
absl::Status Exec(sqlite3* db, absl::string_view sql);

// The first column of the first row of `sql` as an integer (e.g. PRAGMA user_version).
absl::StatusOr<int64_t> QueryInt(sqlite3* db, absl::string_view sql);

// Closes a connection (sqlite3_close_v2); for std::unique_ptr.
struct SqliteCloser {
  void operator()(sqlite3* db) const { sqlite3_close_v2(db); }
};
using SqliteDb = std::unique_ptr<sqlite3, SqliteCloser>;

// Opens `path` with `flags` (SQLITE_OPEN_*). The error names the path.
absl::StatusOr<SqliteDb> OpenDb(const std::string& path, int flags);

// A prepared statement. Bind* take 1-based indexes; binding a non-finite double stores NULL
// (SQLite turns NaN into NULL anyway; infinities are stored as NULL too, so that every reader
// sees one "not a number" marker).
class Stmt {
 public:
  Stmt() = default;
  Stmt(sqlite3* db, sqlite3_stmt* stmt) : db_(db), stmt_(stmt) {}
  Stmt(Stmt&& other) noexcept : db_(other.db_), stmt_(other.stmt_), dirty_(other.dirty_) {
    other.stmt_ = nullptr;
  }
  Stmt& operator=(Stmt&& other) noexcept;
  Stmt(const Stmt&) = delete;
  Stmt& operator=(const Stmt&) = delete;
  ~Stmt() { sqlite3_finalize(stmt_); }

  static absl::StatusOr<Stmt> Prepare(sqlite3* db, absl::string_view sql);

  Stmt& Bind(int index, int64_t value);
  Stmt& Bind(int index, int value) { return Bind(index, static_cast<int64_t>(value)); }
  Stmt& Bind(int index, double value);
  Stmt& Bind(int index, absl::string_view value);
  Stmt& Bind(int index, const char* value) { return Bind(index, absl::string_view(value)); }
  Stmt& BindNull(int index);
  // Binds bytes as a BLOB (Bind of a string_view binds TEXT).
  Stmt& BindBlob(int index, absl::string_view bytes);

  // SQLITE_ROW -> true, SQLITE_DONE -> false, anything else -> error.
  absl::StatusOr<bool> Step();
  // Steps once, expecting no row (an INSERT/UPDATE), then resets.
  absl::Status Run();
  // Rewinds the statement and unbinds its parameters; nothing to do (and nothing done) when
  // neither a Bind nor a Step came since the last Reset. StmtCache::Get resets every statement it
  // hands out, and most were reset by their Run: clearing their bindings a second time is work
  // on the path of every dispatched job.
  void Reset();

  int64_t ColumnInt(int i) const { return sqlite3_column_int64(stmt_, i); }
  // NaN when the column is NULL.
  double ColumnDouble(int i) const;
  std::string ColumnText(int i) const;
  std::string ColumnBlob(int i) const;
  bool ColumnIsNull(int i) const { return sqlite3_column_type(stmt_, i) == SQLITE_NULL; }

  sqlite3_stmt* get() const { return stmt_; }

 private:
  sqlite3* db_ = nullptr;
  sqlite3_stmt* stmt_ = nullptr;
  bool dirty_ = false;  // bound or stepped since the last Reset
};

// Prepared statements kept for the life of a connection, keyed by their SQL text.
// Returned pointers stay valid until the cache is destroyed; statements come back reset.
// Looked up by a string_view, so that the writer's statements per dispatched job copy no SQL
// literal into a std::string.
class StmtCache {
 public:
  explicit StmtCache(sqlite3* db) : db_(db) {}
  absl::StatusOr<Stmt*> Get(absl::string_view sql);
  void Clear() { cache_.clear(); }

 private:
  sqlite3* db_;
  absl::flat_hash_map<std::string, std::unique_ptr<Stmt>> cache_;
};

}  // namespace ablate

#endif  // ABLATE_ORCHESTRATOR_STORE_SQLITE_H_
