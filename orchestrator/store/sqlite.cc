#include "orchestrator/store/sqlite.h"

#include <malloc.h>

#include <atomic>
#include <cmath>
#include <cstdlib>

#include "absl/strings/str_cat.h"

namespace ablate {
namespace {

// The counted allocator (SqliteMemoryUsed): glibc's malloc, each block counted at its usable size,
// as SQLite's own statistics count sqlite3_msize.
std::atomic<int64_t> sqlite_used{0}, sqlite_highwater{0}, sqlite_limit{0};

void CountAdded(int64_t bytes) {
  const int64_t now = sqlite_used.fetch_add(bytes, std::memory_order_relaxed) + bytes;
  int64_t high = sqlite_highwater.load(std::memory_order_relaxed);
  while (now > high &&
         !sqlite_highwater.compare_exchange_weak(high, now, std::memory_order_relaxed)) {
  }
}

// Whether `more` bytes stay within the hard limit.
bool WithinLimit(int64_t more) {
  const int64_t limit = sqlite_limit.load(std::memory_order_relaxed);
  return limit <= 0 || sqlite_used.load(std::memory_order_relaxed) + more <= limit;
}

void* CountedMalloc(int bytes) {
  if (!WithinLimit(bytes)) return nullptr;
  void* p = std::malloc(static_cast<size_t>(bytes));
  if (p != nullptr) CountAdded(static_cast<int64_t>(malloc_usable_size(p)));
  return p;
}

void CountedFree(void* p) {
  if (p == nullptr) return;
  sqlite_used.fetch_sub(static_cast<int64_t>(malloc_usable_size(p)), std::memory_order_relaxed);
  std::free(p);
}

// SQLite reallocates only blocks it allocated, to a new size above zero.
void* CountedRealloc(void* p, int bytes) {
  const int64_t before = static_cast<int64_t>(malloc_usable_size(p));
  if (bytes > before && !WithinLimit(bytes - before)) return nullptr;
  void* moved = std::realloc(p, static_cast<size_t>(bytes));
  if (moved == nullptr) return nullptr;
  CountAdded(static_cast<int64_t>(malloc_usable_size(moved)) - before);
  return moved;
}

int CountedSize(void* p) { return p == nullptr ? 0 : static_cast<int>(malloc_usable_size(p)); }
int RoundUp(int bytes) { return (bytes + 7) & ~7; }
int NoInit(void*) { return SQLITE_OK; }
void NoShutdown(void*) {}

bool InstallCountedAllocator() {
  static const sqlite3_mem_methods methods = {CountedMalloc, CountedFree, CountedRealloc,
                                              CountedSize,   RoundUp,     NoInit,
                                              NoShutdown,    nullptr};
  // Both or neither: SQLITE_MISUSE for the first means SQLite was already initialized.
  if (sqlite3_config(SQLITE_CONFIG_MALLOC, &methods) != SQLITE_OK) return false;
  return sqlite3_config(SQLITE_CONFIG_MEMSTATUS, 0) == SQLITE_OK;
}

// Before main: SQLite takes its allocator once, at its first use.
const bool counted_allocator = InstallCountedAllocator();

}  // namespace

int64_t SqliteMemoryUsed() {
  return counted_allocator ? sqlite_used.load(std::memory_order_relaxed) : sqlite3_memory_used();
}

int64_t SqliteMemoryHighwater(bool reset) {
  if (!counted_allocator) return sqlite3_memory_highwater(reset ? 1 : 0);
  const int64_t high = sqlite_highwater.load(std::memory_order_relaxed);
  if (reset) sqlite_highwater.store(sqlite_used.load(std::memory_order_relaxed));
  return high;
}

int64_t SqliteHardHeapLimit(int64_t limit) {
  if (!counted_allocator) return sqlite3_hard_heap_limit64(limit);
  if (limit < 0) return sqlite_limit.load(std::memory_order_relaxed);
  return sqlite_limit.exchange(limit, std::memory_order_relaxed);
}

bool SqliteCountedAllocator() { return counted_allocator; }

absl::Status SqliteStatus(int code, sqlite3* db, absl::string_view context) {
  std::string message = absl::StrCat(
      "store: ", context, ": ",
      db != nullptr ? sqlite3_errmsg(db) : sqlite3_errstr(code));
  switch (code & 0xff) {
    case SQLITE_OK:
      return absl::OkStatus();
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
      return absl::UnavailableError(
          absl::StrCat(message, " (the database file is locked by another connection; retrying)"));
    case SQLITE_FULL:
      return absl::ResourceExhaustedError(
          absl::StrCat(message, " (free disk space; queued writes are kept and retried)"));
    case SQLITE_IOERR:
    case SQLITE_NOMEM:
    case SQLITE_CANTOPEN:
    case SQLITE_PROTOCOL:
      return absl::UnavailableError(message);
    case SQLITE_INTERRUPT:
      return absl::CancelledError(message);
    case SQLITE_CONSTRAINT:
      return absl::FailedPreconditionError(message);
    case SQLITE_AUTH:
      return absl::PermissionDeniedError(message);
    case SQLITE_CORRUPT:
    case SQLITE_NOTADB:
      return absl::DataLossError(message);
    case SQLITE_READONLY:
      return absl::PermissionDeniedError(message);
    default:
      return absl::InternalError(message);
  }
}

bool IsTransient(const absl::Status& status) {
  return absl::IsUnavailable(status) || absl::IsResourceExhausted(status);
}

absl::Status Exec(sqlite3* db, absl::string_view sql) {
  std::string text(sql);
  char* error = nullptr;
  int rc = sqlite3_exec(db, text.c_str(), nullptr, nullptr, &error);
  sqlite3_free(error);
  if (rc != SQLITE_OK) return SqliteStatus(rc, db, text.substr(0, 60));
  return absl::OkStatus();
}

absl::StatusOr<int64_t> QueryInt(sqlite3* db, absl::string_view sql) {
  absl::StatusOr<Stmt> stmt = Stmt::Prepare(db, sql);
  if (!stmt.ok()) return stmt.status();
  absl::StatusOr<bool> row = stmt->Step();
  if (!row.ok()) return row.status();
  if (!*row) return absl::InternalError(absl::StrCat("store: no row from ", sql));
  return stmt->ColumnInt(0);
}

absl::StatusOr<SqliteDb> OpenDb(const std::string& path, int flags) {
  sqlite3* raw = nullptr;
  int rc = sqlite3_open_v2(path.c_str(), &raw, flags, nullptr);
  SqliteDb db(raw);
  if (rc != SQLITE_OK) {
    return SqliteStatus(rc, raw, absl::StrCat("cannot open ", path));
  }
  sqlite3_extended_result_codes(raw, 1);
  return db;
}

Stmt& Stmt::operator=(Stmt&& other) noexcept {
  if (this != &other) {
    sqlite3_finalize(stmt_);
    db_ = other.db_;
    stmt_ = other.stmt_;
    dirty_ = other.dirty_;
    other.stmt_ = nullptr;
  }
  return *this;
}

absl::StatusOr<Stmt> Stmt::Prepare(sqlite3* db, absl::string_view sql) {
  sqlite3_stmt* stmt = nullptr;
  int rc = sqlite3_prepare_v3(db, sql.data(), static_cast<int>(sql.size()),
                              SQLITE_PREPARE_PERSISTENT, &stmt, nullptr);
  if (rc != SQLITE_OK) {
    sqlite3_finalize(stmt);
    return SqliteStatus(rc, db, absl::StrCat("prepare \"", sql.substr(0, 80), "\""));
  }
  return Stmt(db, stmt);
}

Stmt& Stmt::Bind(int index, int64_t value) {
  dirty_ = true;
  sqlite3_bind_int64(stmt_, index, value);
  return *this;
}

Stmt& Stmt::Bind(int index, double value) {
  dirty_ = true;
  if (std::isfinite(value)) {
    sqlite3_bind_double(stmt_, index, value);
  } else {
    sqlite3_bind_null(stmt_, index);
  }
  return *this;
}

Stmt& Stmt::Bind(int index, absl::string_view value) {
  dirty_ = true;
  sqlite3_bind_text(stmt_, index, value.data(), static_cast<int>(value.size()), SQLITE_TRANSIENT);
  return *this;
}

Stmt& Stmt::BindBlob(int index, absl::string_view bytes) {
  dirty_ = true;
  sqlite3_bind_blob(stmt_, index, bytes.data(), static_cast<int>(bytes.size()), SQLITE_TRANSIENT);
  return *this;
}

Stmt& Stmt::BindNull(int index) {
  dirty_ = true;
  sqlite3_bind_null(stmt_, index);
  return *this;
}

absl::StatusOr<bool> Stmt::Step() {
  dirty_ = true;
  int rc = sqlite3_step(stmt_);
  if (rc == SQLITE_ROW) return true;
  if (rc == SQLITE_DONE) return false;
  absl::Status status = SqliteStatus(rc, db_, "step");
  sqlite3_reset(stmt_);
  return status;
}

absl::Status Stmt::Run() {
  absl::StatusOr<bool> row = Step();
  Reset();
  if (!row.ok()) return row.status();
  return absl::OkStatus();
}

void Stmt::Reset() {
  if (!dirty_) return;
  sqlite3_reset(stmt_);
  sqlite3_clear_bindings(stmt_);
  dirty_ = false;
}

double Stmt::ColumnDouble(int i) const {
  if (ColumnIsNull(i)) return std::nan("");
  return sqlite3_column_double(stmt_, i);
}

std::string Stmt::ColumnText(int i) const {
  const unsigned char* text = sqlite3_column_text(stmt_, i);
  if (text == nullptr) return "";
  return std::string(reinterpret_cast<const char*>(text),
                     static_cast<size_t>(sqlite3_column_bytes(stmt_, i)));
}

std::string Stmt::ColumnBlob(int i) const {
  const void* blob = sqlite3_column_blob(stmt_, i);
  if (blob == nullptr) return "";
  return std::string(static_cast<const char*>(blob),
                     static_cast<size_t>(sqlite3_column_bytes(stmt_, i)));
}

absl::StatusOr<Stmt*> StmtCache::Get(absl::string_view sql) {
  auto it = cache_.find(sql);
  if (it != cache_.end()) {
    it->second->Reset();
    return it->second.get();
  }
  absl::StatusOr<Stmt> stmt = Stmt::Prepare(db_, sql);
  if (!stmt.ok()) return stmt.status();
  auto owned = std::make_unique<Stmt>(std::move(*stmt));
  Stmt* raw = owned.get();
  cache_.emplace(std::string(sql), std::move(owned));
  return raw;
}

}  // namespace ablate
