#include "orchestrator/store/sqlite.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace ablate {

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
  sqlite3_bind_int64(stmt_, index, value);
  return *this;
}

Stmt& Stmt::Bind(int index, double value) {
  if (std::isfinite(value)) {
    sqlite3_bind_double(stmt_, index, value);
  } else {
    sqlite3_bind_null(stmt_, index);
  }
  return *this;
}

Stmt& Stmt::Bind(int index, absl::string_view value) {
  sqlite3_bind_text(stmt_, index, value.data(), static_cast<int>(value.size()), SQLITE_TRANSIENT);
  return *this;
}

Stmt& Stmt::BindBlob(int index, absl::string_view bytes) {
  sqlite3_bind_blob(stmt_, index, bytes.data(), static_cast<int>(bytes.size()), SQLITE_TRANSIENT);
  return *this;
}

Stmt& Stmt::BindNull(int index) {
  sqlite3_bind_null(stmt_, index);
  return *this;
}

absl::StatusOr<bool> Stmt::Step() {
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
  sqlite3_reset(stmt_);
  sqlite3_clear_bindings(stmt_);
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
