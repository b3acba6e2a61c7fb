#include "orchestrator/store/query.h"

#include <algorithm>
#include <cctype>
#include <cstring>
#include <limits>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "orchestrator/store/sqlite.h"

namespace ablate {

void QueryGuard::Reset() {
  refused.clear();
  deadline = absl::InfiniteFuture();
  timed_out = false;
  memory_ceiling = std::numeric_limits<int64_t>::max();
  out_of_memory = false;
}

namespace {

// PRAGMAs a query may run: they only read. Those in kPragmasWithTableArgument may name a table
// or index (`PRAGMA table_info(runs)`); the others must have no argument (an argument would set
// a value).
// Not integrity_check or quick_check: each is one VM step, whose time grows with the database and
// which the time limit cannot interrupt.
const std::set<std::string>& ReadOnlyPragmas() {
  static const auto* pragmas = new std::set<std::string>{
      "table_info", "table_xinfo", "table_list", "index_list", "index_info", "index_xinfo",
      "foreign_key_list", "user_version", "schema_version", "application_id", "page_count",
      "page_size", "freelist_count", "database_list", "compile_options", "function_list",
      "pragma_list", "collation_list", "module_list", "data_version", "encoding", "temp_store"};
  return *pragmas;
}

const std::set<std::string>& PragmasWithTableArgument() {
  static const auto* pragmas = new std::set<std::string>{
      "table_info", "table_xinfo", "table_list", "index_list", "index_info", "index_xinfo",
      "foreign_key_list"};
  return *pragmas;
}

// The functions a query may call: SQLite's core, date and time, math, aggregate, window and JSON
// functions, but none that can outrun the time limit in one call, reads the process or the
// build, or writes. like(), glob(), instr(), replace() and trim() with a character set cost the
// product of their arguments' lengths in one call: these are the bounded versions below
// (BoundFunctions), not SQLite's own.
const std::set<std::string>& AllowedFunctions() {
  static const auto* functions = new std::set<std::string>{
      // core
      "abs", "char", "coalesce", "glob", "hex", "ifnull", "iif", "instr", "length", "like",
      "likelihood", "likely", "lower", "ltrim", "max", "min", "nullif", "quote", "random",
      "randomblob", "replace", "round", "rtrim", "sign", "soundex", "substr", "substring", "trim",
      "typeof", "unicode", "unlikely", "upper", "zeroblob",
      // date and time
      "date", "time", "datetime", "julianday", "unixepoch", "strftime", "current_date",
      "current_time", "current_timestamp",
      // math
      "acos", "acosh", "asin", "asinh", "atan", "atan2", "atanh", "ceil", "ceiling", "cos", "cosh",
      "degrees", "exp", "floor", "ln", "log", "log10", "log2", "mod", "pi", "pow", "power",
      "radians", "sin", "sinh", "sqrt", "tan", "tanh", "trunc",
      // aggregate and window
      "avg", "count", "group_concat", "sum", "total", "row_number", "rank", "dense_rank",
      "percent_rank", "cume_dist", "ntile", "lag", "lead", "first_value", "last_value",
      "nth_value",
      // JSON
      "json", "json_array", "json_array_length", "json_extract", "json_insert", "json_object",
      "json_patch", "json_quote", "json_remove", "json_replace", "json_set", "json_type",
      "json_valid", "json_group_array", "json_group_object", "->", "->>"};
  return *functions;
}

// Why a function is refused, for the few a user may reach for.
std::string WhyNot(const std::string& name) {
  // SQLite 3.40's printf() repeats a character `precision` times even past SQLITE_LIMIT_LENGTH
  // ('%.*c' with 2e9 takes seconds), inside one VM step the progress handler cannot interrupt.
  // Found with tests/fuzz/query_fuzz.
  if (name == "printf" || name == "format") {
    return " (it can outrun the time limit); format values with round(), || or the client "
           "(--format csv|json)";
  }
  // fts3_tokenizer(NAME) returns a tokenizer's address, and (NAME, POINTER) registers any pointer
  // as one (Debian builds SQLite with it enabled).
  if (name == "fts3_tokenizer") return " (it reads and sets addresses in the process)";
  return " (the functions a query may call: docs/cli.md, `ablate query`)";
}

const char* WriteActionName(int action) {
  switch (action) {
    case SQLITE_INSERT: return "INSERT";
    case SQLITE_UPDATE: return "UPDATE";
    case SQLITE_DELETE: return "DELETE";
    case SQLITE_CREATE_INDEX: case SQLITE_CREATE_TEMP_INDEX: return "CREATE INDEX";
    case SQLITE_CREATE_TABLE: case SQLITE_CREATE_TEMP_TABLE: return "CREATE TABLE";
    case SQLITE_CREATE_TRIGGER: case SQLITE_CREATE_TEMP_TRIGGER: return "CREATE TRIGGER";
    case SQLITE_CREATE_VIEW: case SQLITE_CREATE_TEMP_VIEW: return "CREATE VIEW";
    case SQLITE_CREATE_VTABLE: return "CREATE VIRTUAL TABLE";
    case SQLITE_DROP_INDEX: case SQLITE_DROP_TEMP_INDEX: return "DROP INDEX";
    case SQLITE_DROP_TABLE: case SQLITE_DROP_TEMP_TABLE: return "DROP TABLE";
    case SQLITE_DROP_TRIGGER: case SQLITE_DROP_TEMP_TRIGGER: return "DROP TRIGGER";
    case SQLITE_DROP_VIEW: case SQLITE_DROP_TEMP_VIEW: return "DROP VIEW";
    case SQLITE_DROP_VTABLE: return "DROP VIRTUAL TABLE";
    case SQLITE_ALTER_TABLE: return "ALTER TABLE";
    case SQLITE_REINDEX: return "REINDEX";
    case SQLITE_ANALYZE: return "ANALYZE";
    case SQLITE_TRANSACTION: return "BEGIN/COMMIT/ROLLBACK";
    case SQLITE_SAVEPOINT: return "SAVEPOINT";
    default: return nullptr;
  }
}

// The authorizer of every reader connection: SELECT and reads pass, everything else is denied
// and remembered for the error message.
int Authorize(void* context, int action, const char* arg1, const char* arg2, const char* db_name,
              const char* trigger) {
  auto* connection = static_cast<QueryGuard*>(context);
  switch (action) {
    case SQLITE_SELECT:
    case SQLITE_READ:
    case SQLITE_RECURSIVE:
      return SQLITE_OK;
    case SQLITE_FUNCTION: {
      const std::string name = absl::AsciiStrToLower(arg2 != nullptr ? arg2 : "");
      if (AllowedFunctions().count(name) > 0) return SQLITE_OK;
      connection->refused = absl::StrCat("query: ", name, "() is not allowed", WhyNot(name));
      return SQLITE_DENY;
    }
    case SQLITE_PRAGMA: {
      std::string name = absl::AsciiStrToLower(arg1 != nullptr ? arg1 : "");
      bool has_argument = arg2 != nullptr;
      if (ReadOnlyPragmas().count(name) > 0 &&
          (!has_argument || PragmasWithTableArgument().count(name) > 0)) {
        return SQLITE_OK;
      }
      connection->refused = absl::StrCat(
          "query: PRAGMA ", name, has_argument ? absl::StrCat(" = ", arg2) : "",
          " is not allowed (only PRAGMAs that read, such as table_info, are)");
      return SQLITE_DENY;
    }
    case SQLITE_ATTACH:
      connection->refused = "query: ATTACH is not allowed (the query reads this database only)";
      return SQLITE_DENY;
    case SQLITE_DETACH:
      connection->refused = "query: DETACH is not allowed";
      return SQLITE_DENY;
    case SQLITE_INSERT:
    case SQLITE_UPDATE:
    case SQLITE_DELETE: {
      const bool schema_table = arg1 != nullptr && (std::strcmp(arg1, "sqlite_master") == 0 ||
                                                    std::strcmp(arg1, "sqlite_temp_master") == 0);
      // A table-valued PRAGMA (SELECT * FROM pragma_table_info('runs')) asks to update each
      // column of the schema table when SQLite sets up its virtual table; the PRAGMA itself is
      // checked next (SQLITE_PRAGMA above). A statement that really writes the schema table is
      // still refused: CREATE / ALTER / DROP by their own action, and anything that writes by
      // the read-only check after the prepare (and the read-only connection).
      if (schema_table && action == SQLITE_UPDATE && arg2 != nullptr) return SQLITE_OK;
      // CREATE / ALTER / DROP first ask to write the schema table: name the statement.
      if (schema_table) {
        connection->refused = absl::StrCat(
            "query: write statements are not allowed (",
            action == SQLITE_INSERT ? "CREATE" : action == SQLITE_DELETE ? "DROP" : "ALTER", ")");
        return SQLITE_DENY;
      }
    }
      [[fallthrough]];
    default: {
      const char* what = WriteActionName(action);
      connection->refused =
          what != nullptr
              ? absl::StrCat("query: write statements are not allowed (", what, ")")
              : absl::StrCat("query: statement not allowed (authorizer action ", action, ")");
      return SQLITE_DENY;
    }
  }
}

int Progress(void* context) {
  auto* connection = static_cast<QueryGuard*>(context);
  if (SqliteMemoryUsed() > connection->memory_ceiling) {
    connection->out_of_memory = true;
    return 1;
  }
  if (absl::Now() > connection->deadline) {
    connection->timed_out = true;
    return 1;  // interrupts the statement with SQLITE_INTERRUPT
  }
  return 0;
}

// True when `tail` (what follows the first statement) holds only blanks, semicolons and
// comments.
bool OnlyCommentsLeft(const char* tail) {
  const char* p = tail;
  while (*p != '\0') {
    if (std::isspace(static_cast<unsigned char>(*p)) || *p == ';') {
      ++p;
    } else if (p[0] == '-' && p[1] == '-') {
      while (*p != '\0' && *p != '\n') ++p;
    } else if (p[0] == '/' && p[1] == '*') {
      const char* end = std::strstr(p + 2, "*/");
      if (end == nullptr) return true;  // an unterminated comment runs to the end
      p = end + 2;
    } else {
      return false;
    }
  }
  return true;
}

SqlValue ColumnValue(sqlite3_stmt* stmt, int i) {
  switch (sqlite3_column_type(stmt, i)) {
    case SQLITE_INTEGER:
      return static_cast<int64_t>(sqlite3_column_int64(stmt, i));
    case SQLITE_FLOAT:
      return sqlite3_column_double(stmt, i);
    case SQLITE_TEXT:
    case SQLITE_BLOB: {
      const void* data = sqlite3_column_blob(stmt, i);
      int size = sqlite3_column_bytes(stmt, i);
      return std::string(static_cast<const char*>(data), data != nullptr ? size : 0);
    }
    default:
      return std::monostate();
  }
}

}  // namespace

// SQLite's own like(), glob(), instr(), replace() and two-argument trims, run on a private
// in-memory connection (the same semantics to the byte, ESCAPE and all), behind a check of the
// work one call may do and of the deadline: the guarded connection's functions of those names
// and argument counts are these.
struct BoundedFunctions {
  struct Delegate {
    BoundedFunctions* owner = nullptr;
    std::string name;
    sqlite3_stmt* stmt = nullptr;  // "SELECT name(?1, ...)" on `helper`
  };
  SqliteDb helper;
  QueryGuard* guard = nullptr;
  std::vector<std::unique_ptr<Delegate>> delegates;

  ~BoundedFunctions() {
    for (const auto& d : delegates) sqlite3_finalize(d->stmt);
  }
};

namespace {

void BoundedCall(sqlite3_context* context, int argc, sqlite3_value** argv) {
  auto* d = static_cast<BoundedFunctions::Delegate*>(sqlite3_user_data(context));
  QueryGuard* guard = d->owner->guard;
  if (absl::Now() > guard->deadline) {
    guard->timed_out = true;
    sqlite3_result_error_code(context, SQLITE_INTERRUPT);
    return;
  }
  const int64_t a = std::max(1, sqlite3_value_bytes(argv[0]));
  const int64_t b = std::max(1, sqlite3_value_bytes(argv[1]));
  if (a * b > kMaxCallWork) {
    const std::string message = absl::StrCat(
        "query: ", d->name, "() of a ", a, "-byte and a ", b, "-byte argument is too much work "
        "for one call (their product is at most ", kMaxCallWork, "): compare shorter values");
    sqlite3_result_error(context, message.c_str(), -1);
    return;
  }
  for (int i = 0; i < argc; ++i) sqlite3_bind_value(d->stmt, i + 1, argv[i]);
  const int rc = sqlite3_step(d->stmt);
  if (rc == SQLITE_ROW) {
    sqlite3_result_value(context, sqlite3_column_value(d->stmt, 0));
  } else {
    sqlite3_result_error(context, sqlite3_errmsg(d->owner->helper.get()), -1);
    sqlite3_result_error_code(context, rc);
  }
  sqlite3_reset(d->stmt);
  sqlite3_clear_bindings(d->stmt);
}

absl::Status BoundFunctions(sqlite3* db, QueryGuard* guard) {
  auto bounded = std::make_shared<BoundedFunctions>();
  bounded->guard = guard;
  absl::StatusOr<SqliteDb> helper =
      OpenDb(":memory:", SQLITE_OPEN_READWRITE | SQLITE_OPEN_MEMORY | SQLITE_OPEN_NOMUTEX);
  if (!helper.ok()) return helper.status();
  bounded->helper = *std::move(helper);
  sqlite3* h = bounded->helper.get();
  sqlite3_limit(h, SQLITE_LIMIT_LENGTH, kMaxQueryValueBytes);
  sqlite3_limit(h, SQLITE_LIMIT_LIKE_PATTERN_LENGTH, kMaxLikePatternBytes);
  for (const auto& [name, args] : std::vector<std::pair<const char*, int>>{
           {"like", 2}, {"like", 3}, {"glob", 2}, {"instr", 2}, {"replace", 3},
           {"trim", 2}, {"ltrim", 2}, {"rtrim", 2}}) {
    auto d = std::make_unique<BoundedFunctions::Delegate>();
    d->owner = bounded.get();
    d->name = name;
    std::string sql = absl::StrCat("SELECT ", name, "(?1");
    for (int i = 2; i <= args; ++i) absl::StrAppend(&sql, ", ?", i);
    sql += ")";
    if (sqlite3_prepare_v2(h, sql.c_str(), -1, &d->stmt, nullptr) != SQLITE_OK) {
      return SqliteStatus(sqlite3_errcode(h), h, "query: bounded functions");
    }
    const int rc = sqlite3_create_function_v2(db, name, args, SQLITE_UTF8 | SQLITE_DETERMINISTIC,
                                              d.get(), BoundedCall, nullptr, nullptr, nullptr);
    if (rc != SQLITE_OK) return SqliteStatus(rc, db, "query: bounded functions");
    bounded->delegates.push_back(std::move(d));
  }
  guard->bounded = std::move(bounded);
  return absl::OkStatus();
}

}  // namespace

absl::Status GuardConnection(sqlite3* db, QueryGuard* guard) {
  // Belt and braces under the read-only open and the authorizer.
  if (absl::Status s = Exec(db, "PRAGMA query_only = 1"); !s.ok()) return s;
  // A sort or materialized subquery too big for memory spills to temporary files by default,
  // where the heap limit does not reach: in memory, it is bounded like every other allocation.
  if (absl::Status s = Exec(db, "PRAGMA temp_store = MEMORY"); !s.ok()) return s;
  sqlite3_limit(db, SQLITE_LIMIT_ATTACHED, 0);
  sqlite3_limit(db, SQLITE_LIMIT_LENGTH, kMaxQueryValueBytes);
  sqlite3_limit(db, SQLITE_LIMIT_LIKE_PATTERN_LENGTH, kMaxLikePatternBytes);
  if (absl::Status s = BoundFunctions(db, guard); !s.ok()) return s;
  sqlite3_db_config(db, SQLITE_DBCONFIG_DEFENSIVE, 1, nullptr);
  sqlite3_db_config(db, SQLITE_DBCONFIG_ENABLE_LOAD_EXTENSION, 0, nullptr);
  sqlite3_db_config(db, SQLITE_DBCONFIG_ENABLE_FTS3_TOKENIZER, 0, nullptr);
  sqlite3_set_authorizer(db, Authorize, guard);
  // Every 100 VM steps: a check every few steps costs a compute-bound query a share of its time,
  // and a limit counted in seconds needs no finer grain. A step can
  // make a value of up to kMaxQueryValueBytes, so a statement can still outgrow its budget
  // between two checks; the process's hard heap limit (kSqliteHeapLimit) bounds that.
  sqlite3_progress_handler(db, 100, Progress, guard);
  return absl::OkStatus();
}

absl::StatusOr<QueryResult> RunGuardedQuery(sqlite3* db, QueryGuard* guard, const std::string& sql,
                                            const QueryLimits& limits) {
  QueryGuard& c = *guard;
  c.refused.clear();
  sqlite3_stmt* raw = nullptr;
  const char* tail = nullptr;
  int rc = sqlite3_prepare_v2(db, sql.c_str(), static_cast<int>(sql.size()), &raw, &tail);
  Stmt stmt(db, raw);
  if (rc != SQLITE_OK) {
    if ((rc & 0xff) == SQLITE_AUTH || !c.refused.empty()) {
      return absl::PermissionDeniedError(
          c.refused.empty() ? "query: statement not allowed" : c.refused);
    }
    return absl::InvalidArgumentError(absl::StrCat("query: ", sqlite3_errmsg(db)));
  }
  if (raw == nullptr) return absl::InvalidArgumentError("query: empty statement");
  if (!OnlyCommentsLeft(tail)) {
    return absl::InvalidArgumentError(
        "query: one statement at a time (text follows the first statement)");
  }
  if (!sqlite3_stmt_readonly(raw)) {
    return absl::PermissionDeniedError("query: only statements that read are allowed");
  }

  QueryResult result;
  const int columns = sqlite3_column_count(raw);
  for (int i = 0; i < columns; ++i) result.columns.push_back(sqlite3_column_name(raw, i));
  c.timed_out = false;
  c.out_of_memory = false;
  c.deadline = absl::Now() + limits.timeout;
  c.memory_ceiling = std::min<int64_t>(SqliteMemoryUsed() + limits.max_memory,
                                       kSqliteHeapLimit - kSqliteHeapHeadroom);
  auto unguard = [&c] {
    c.deadline = absl::InfiniteFuture();
    c.memory_ceiling = std::numeric_limits<int64_t>::max();
  };
  int64_t bytes = 0;
  while (true) {
    rc = sqlite3_step(raw);
    if (rc == SQLITE_DONE) break;
    if (rc != SQLITE_ROW) {
      unguard();
      if (c.timed_out) {
        return absl::DeadlineExceededError(absl::StrCat(
            "query: time limit of ", absl::FormatDuration(limits.timeout), " exceeded (interrupted)"));
      }
      if (c.out_of_memory || rc == SQLITE_NOMEM) {
        return absl::ResourceExhaustedError(absl::StrCat(
            "query: out of memory (", limits.max_memory >> 20, " MiB for one statement's values, ",
            kSqliteHeapLimit >> 20, " MiB for all of SQLite in this process): interrupted; select "
            "fewer or smaller values at once"));
      }
      switch (rc & 0xff) {
        case SQLITE_INTERRUPT:  // neither the time limit nor memory: StoreReader::InterruptQueries
          return absl::UnavailableError("query: interrupted: the store is closing");
        case SQLITE_ERROR:     // malformed JSON, an unknown schema name, integer overflow...
        case SQLITE_MISMATCH:
        case SQLITE_RANGE:
        case SQLITE_TOOBIG:
          // The statement's own fault, found while it ran: as a prepare error reads.
          return absl::InvalidArgumentError(absl::StrCat("query: ", sqlite3_errmsg(db)));
        default:
          return SqliteStatus(rc, db, "query");
      }
    }
    if (static_cast<int64_t>(result.rows.size()) >= limits.max_rows) {
      result.truncated = true;
      break;
    }
    std::vector<SqlValue> row;
    row.reserve(columns);
    int64_t row_bytes = 0;
    for (int i = 0; i < columns; ++i) {
      row.push_back(ColumnValue(raw, i));
      row_bytes += sizeof(SqlValue);
      if (const auto* text = std::get_if<std::string>(&row.back())) row_bytes += text->size();
    }
    if (bytes + row_bytes > limits.max_bytes) {
      result.truncated = true;
      break;
    }
    bytes += row_bytes;
    result.rows.push_back(std::move(row));
  }
  unguard();
  return result;
}

}  // namespace ablate
