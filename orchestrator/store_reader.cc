#include "orchestrator/store_reader.h"

#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <limits>
#include <mutex>
#include <set>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"
#include "orchestrator/sqlite_util.h"
#include "orchestrator/store_schema.h"

namespace ablate {

// ---- Connections: read-only, authorized, time-limited -------------------------------------------

namespace {

// What the authorizer and the progress handler of one connection share with its user.
struct GuardState {
  // Set by the authorizer during a prepare: what it refused.
  std::string refused;
  // Checked by the progress handler while a statement runs.
  absl::Time deadline = absl::InfiniteFuture();
  bool timed_out = false;
  int64_t memory_ceiling = std::numeric_limits<int64_t>::max();  // of sqlite3_memory_used()
  bool out_of_memory = false;
};

}  // namespace

struct StoreReader::Connection {
  SqliteDb db;
  std::unique_ptr<StmtCache> cache;
  GuardState guard;
};

class StoreReader::Lease {
 public:
  Lease(const StoreReader* owner, std::unique_ptr<Connection> connection)
      : owner_(owner), connection_(std::move(connection)) {}
  Lease(Lease&& other) noexcept = default;
  Lease& operator=(Lease&&) = delete;
  ~Lease() {
    if (connection_ != nullptr) owner_->Release(std::move(connection_));
  }
  Connection* operator->() const { return connection_.get(); }
  Connection& operator*() const { return *connection_; }

 private:
  const StoreReader* owner_;
  std::unique_ptr<Connection> connection_;
};

namespace {

// PRAGMAs a query may run: they only read. Those in kPragmasWithTableArgument may name a table
// or index (`PRAGMA table_info(runs)`); the others must have no argument (an argument would set
// a value).
const std::set<std::string>& ReadOnlyPragmas() {
  static const auto* pragmas = new std::set<std::string>{
      "table_info", "table_xinfo", "table_list", "index_list", "index_info", "index_xinfo",
      "foreign_key_list", "user_version", "schema_version", "application_id", "page_count",
      "page_size", "freelist_count", "database_list", "compile_options", "function_list",
      "pragma_list", "collation_list", "module_list", "data_version", "encoding", "integrity_check", "quick_check"};
  return *pragmas;
}

const std::set<std::string>& PragmasWithTableArgument() {
  static const auto* pragmas = new std::set<std::string>{
      "table_info", "table_xinfo", "table_list", "index_list", "index_info", "index_xinfo",
      "foreign_key_list", "integrity_check", "quick_check"};
  return *pragmas;
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
  auto* connection = static_cast<GuardState*>(context);
  switch (action) {
    case SQLITE_SELECT:
    case SQLITE_READ:
    case SQLITE_RECURSIVE:
      return SQLITE_OK;
    case SQLITE_FUNCTION: {
      // SQLite 3.40's printf() repeats a character `precision` times even past
      // SQLITE_LIMIT_LENGTH ('%.*c' with 2e9 takes seconds), inside one VM step the progress
      // handler cannot interrupt, and a statement can call it many times between two checks: the
      // time limit would not hold. Found with tests/fuzz/query_fuzz.
      const std::string name = absl::AsciiStrToLower(arg2 != nullptr ? arg2 : "");
      if (name == "printf" || name == "format") {
        connection->refused = absl::StrCat(
            "query: ", name, "() is not allowed (it can outrun the time limit); format values "
            "with round(), || or the client (--format csv|json)");
        return SQLITE_DENY;
      }
      return SQLITE_OK;
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
  auto* connection = static_cast<GuardState*>(context);
  if (sqlite3_memory_used() > connection->memory_ceiling) {
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

double NullableDouble(const Stmt& stmt, int i) { return stmt.ColumnDouble(i); }

}  // namespace

std::string RunStateName(RunState state) { return RunState_Name(state); }

RunState ParseRunState(const std::string& name) {
  RunState state = RUN_STATE_UNSPECIFIED;
  if (!RunState_Parse(name, &state)) return RUN_STATE_UNSPECIFIED;
  return state;
}

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
    reader->open_ = 1;
    reader->idle_.push_back(std::move(*first));
  }
  return reader;
}

StoreReader::StoreReader(const ReaderOptions& options) : options_(options) {
  static std::once_flag heap_limit;
  std::call_once(heap_limit, [] {
    if (sqlite3_hard_heap_limit64(-1) == 0) sqlite3_hard_heap_limit64(kSqliteHeapLimit);
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
  // Belt and braces under the read-only open and the authorizer.
  if (absl::Status s = Exec(raw, "PRAGMA query_only = 1"); !s.ok()) return s;
  sqlite3_limit(raw, SQLITE_LIMIT_ATTACHED, 0);
  sqlite3_limit(raw, SQLITE_LIMIT_LENGTH, kMaxQueryValueBytes);
  sqlite3_db_config(raw, SQLITE_DBCONFIG_DEFENSIVE, 1, nullptr);
  sqlite3_db_config(raw, SQLITE_DBCONFIG_ENABLE_LOAD_EXTENSION, 0, nullptr);
  sqlite3_set_authorizer(raw, Authorize, &connection->guard);
  // Every 100 VM steps (checking every 10 cost about 15% of a compute-bound query). A step can
  // make a value of up to kMaxQueryValueBytes, so a statement can still outgrow its budget
  // between two checks; the process's hard heap limit (kSqliteHeapLimit) bounds that.
  sqlite3_progress_handler(raw, 100, Progress, &connection->guard);
  connection->cache = std::make_unique<StmtCache>(raw);
  return connection;
}

absl::StatusOr<StoreReader::Lease> StoreReader::Acquire() const {
  {
    absl::MutexLock lock(&mu_);
    auto available = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return !idle_.empty() || open_ < options_.max_connections;
    };
    mu_.Await(absl::Condition(&available));
    if (!idle_.empty()) {
      std::unique_ptr<Connection> connection = std::move(idle_.back());
      idle_.pop_back();
      return Lease(this, std::move(connection));
    }
    ++open_;
  }
  absl::StatusOr<std::unique_ptr<Connection>> connection = Connect();
  if (!connection.ok()) {
    absl::MutexLock lock(&mu_);
    --open_;
    return connection.status();
  }
  return Lease(this, std::move(*connection));
}

void StoreReader::Release(std::unique_ptr<Connection> connection) const {
  connection->guard.deadline = absl::InfiniteFuture();
  connection->guard.timed_out = false;
  connection->guard.memory_ceiling = std::numeric_limits<int64_t>::max();
  connection->guard.out_of_memory = false;
  absl::MutexLock lock(&mu_);
  idle_.push_back(std::move(connection));
}

// ---- Ad-hoc queries -------------------------------------------------------------------------------

absl::StatusOr<QueryResult> StoreReader::ReadOnlyQuery(const std::string& sql,
                                                       const QueryLimits& limits) const {
  absl::StatusOr<Lease> lease = Acquire();
  if (!lease.ok()) return lease.status();
  GuardState& c = (*lease)->guard;
  sqlite3* db = (*lease)->db.get();
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
  c.memory_ceiling = sqlite3_memory_used() + limits.max_memory;
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

// ---- Typed getters -------------------------------------------------------------------------------

namespace {

constexpr char kSweepColumns[] =
    "sweep_id, sweep, state, priority, created_at, runs, pending, running, succeeded, failed, "
    "diverged, cancelled, interrupted, steps_done, steps_total, "
    "(SELECT description FROM sweeps WHERE id = sweep_id)";

SweepInfo ReadSweep(const Stmt& s) {
  SweepInfo info;
  info.id = s.ColumnInt(0);
  info.name = s.ColumnText(1);
  info.state = s.ColumnText(2);
  info.priority = static_cast<int>(s.ColumnInt(3));
  info.created_at = s.ColumnDouble(4);
  info.runs = s.ColumnInt(5);
  info.pending = s.ColumnInt(6);
  info.running = s.ColumnInt(7);
  info.succeeded = s.ColumnInt(8);
  info.failed = s.ColumnInt(9);
  info.diverged = s.ColumnInt(10);
  info.cancelled = s.ColumnInt(11);
  info.interrupted = s.ColumnInt(12);
  info.steps_done = s.ColumnInt(13);
  info.steps_total = s.ColumnInt(14);
  info.description = s.ColumnText(15);
  return info;
}

// In the per-run series reads: the run whose rows hold run ?1's data (its source, when reused).
constexpr char kSourceRun[] = "(SELECT coalesce(reused_from, id) FROM runs WHERE id = ?1)";

constexpr char kRunColumns[] =
    "r.id, r.sweep_id, s.name, v.name, r.run_index, r.run_key, r.seed, r.axes, c.config_json, "
    "r.state, r.attempts, r.worker_id, r.priority, r.device, r.memory_gb, r.threads, "
    "r.params_total, r.params_activated, r.params_added, r.created_at, r.started_at, "
    "r.finished_at, r.steps_total, r.steps_done, r.final_train_loss, r.val_loss, r.val_ppl, "
    "r.gate_score, r.m_act, r.f_attn, r.spike_score, r.spike_steps, r.tokens_per_s, r.wall_s, "
    "r.reason, r.reused_from "
    "FROM runs r JOIN sweeps s ON s.id = r.sweep_id JOIN variants v ON v.id = r.variant_id "
    "JOIN run_configs c ON c.run_id = r.id";

double ZeroIfNull(const Stmt& s, int i) { return s.ColumnIsNull(i) ? 0.0 : s.ColumnDouble(i); }

RunInfo ReadRun(const Stmt& s) {
  RunInfo r;
  r.id = s.ColumnInt(0);
  r.sweep_id = s.ColumnInt(1);
  r.sweep = s.ColumnText(2);
  r.variant = s.ColumnText(3);
  r.run_index = static_cast<int>(s.ColumnInt(4));
  r.run_key = s.ColumnText(5);
  r.seed = static_cast<uint64_t>(s.ColumnInt(6));
  r.axes = s.ColumnText(7);
  r.config_json = s.ColumnText(8);
  r.state = ParseRunState(s.ColumnText(9));
  r.attempts = static_cast<int>(s.ColumnInt(10));
  r.worker_id = s.ColumnInt(11);
  r.priority = static_cast<int>(s.ColumnInt(12));
  r.device = s.ColumnText(13);
  r.memory_gb = s.ColumnDouble(14);
  r.threads = static_cast<int>(s.ColumnInt(15));
  r.params_total = s.ColumnInt(16);
  r.params_activated = s.ColumnInt(17);
  r.params_added = s.ColumnInt(18);
  r.created_at = ZeroIfNull(s, 19);
  r.started_at = ZeroIfNull(s, 20);
  r.finished_at = ZeroIfNull(s, 21);
  r.steps_total = s.ColumnInt(22);
  r.steps_done = s.ColumnInt(23);
  r.final_train_loss = NullableDouble(s, 24);
  r.val_loss = NullableDouble(s, 25);
  r.val_ppl = NullableDouble(s, 26);
  r.gate_score = NullableDouble(s, 27);
  r.m_act = NullableDouble(s, 28);
  r.f_attn = NullableDouble(s, 29);
  r.spike_score = NullableDouble(s, 30);
  r.spike_steps = s.ColumnInt(31);
  r.tokens_per_s = NullableDouble(s, 32);
  r.wall_s = NullableDouble(s, 33);
  r.reason = s.ColumnText(34);
  r.reused_from = s.ColumnInt(35);  // NULL reads as 0
  return r;
}

constexpr char kAttemptColumns[] =
    "run_id, attempt, worker_id, state, started_at, ended_at, checkpoint_path, checkpoint_step, "
    "report_seq, reason FROM attempts";

AttemptInfo ReadAttempt(const Stmt& s) {
  AttemptInfo a;
  a.run_id = s.ColumnInt(0);
  a.attempt = static_cast<int>(s.ColumnInt(1));
  a.worker_id = s.ColumnInt(2);
  a.state = s.ColumnText(3);
  a.started_at = ZeroIfNull(s, 4);
  a.ended_at = ZeroIfNull(s, 5);
  a.checkpoint_path = s.ColumnText(6);
  a.checkpoint_step = s.ColumnInt(7);
  a.report_seq = s.ColumnInt(8);
  a.reason = s.ColumnText(9);
  return a;
}

constexpr char kLayerColumns[] =
    "step, layer, has_gate, gate_mean, gate_std, gate_min, gate_max, gate_histogram, "
    "attn_out_max_abs, attn_residual_max_abs, ffn_out_max_abs, ffn_residual_max_abs, "
    "first_token_attention, sparsity_before_gate_1e2, sparsity_before_gate_1e3, "
    "sparsity_after_gate_1e2, sparsity_after_gate_1e3, sparsity_mean_scaled_1e2, "
    "sparsity_mean_scaled_1e3 FROM eval_layer_probes";

LayerProbes ReadLayer(const Stmt& s) {
  LayerProbes p;
  p.set_layer(static_cast<int32_t>(s.ColumnInt(1)));
  p.set_has_gate(s.ColumnInt(2) != 0);
  p.set_gate_mean(s.ColumnDouble(3));
  p.set_gate_std(s.ColumnDouble(4));
  p.set_gate_min(s.ColumnDouble(5));
  p.set_gate_max(s.ColumnDouble(6));
  std::string histogram = s.ColumnText(7);
  if (!histogram.empty()) {
    nlohmann::json j = nlohmann::json::parse(histogram, nullptr, /*allow_exceptions=*/false);
    if (j.is_object()) {
      Histogram* h = p.mutable_gate_histogram();
      h->set_lo(j.value("lo", 0.0));
      h->set_hi(j.value("hi", 0.0));
      if (j.contains("counts") && j["counts"].is_array()) {
        for (const auto& c : j["counts"]) h->add_counts(c.is_number() ? c.get<int64_t>() : 0);
      }
    }
  }
  p.set_attn_out_max_abs(s.ColumnDouble(8));
  p.set_attn_residual_max_abs(s.ColumnDouble(9));
  p.set_ffn_out_max_abs(s.ColumnDouble(10));
  p.set_ffn_residual_max_abs(s.ColumnDouble(11));
  p.set_first_token_attention(s.ColumnDouble(12));
  Sparsity* sp = p.mutable_sparsity();
  sp->set_before_gate_1e2(s.ColumnDouble(13));
  sp->set_before_gate_1e3(s.ColumnDouble(14));
  sp->set_after_gate_1e2(s.ColumnDouble(15));
  sp->set_after_gate_1e3(s.ColumnDouble(16));
  sp->set_mean_scaled_1e2(s.ColumnDouble(17));
  sp->set_mean_scaled_1e3(s.ColumnDouble(18));
  return p;
}

// Keeps indexes into `points` (sorted by step): the downsampled ones, the last, and `spikes`.
std::vector<size_t> DownsampleIndexes(const std::vector<StepMetrics>& points,
                                      const std::set<int64_t>& spikes,
                                      const SeriesOptions& options) {
  const size_t n = points.size();
  std::vector<size_t> keep;
  if (n == 0) return keep;
  if (options.mode == Downsample::kNone || options.max_points <= 0 ||
      n <= static_cast<size_t>(options.max_points)) {
    keep.resize(n);
    for (size_t i = 0; i < n; ++i) keep[i] = i;
    return keep;
  }
  std::vector<bool> kept(n, false);
  if (options.mode == Downsample::kStride) {
    const size_t k = (n + options.max_points - 1) / options.max_points;
    for (size_t i = 0; i < n; i += k) kept[i] = true;
  } else {
    // Two points per bucket (its minimum and its maximum loss) for max_points in all.
    const size_t buckets = std::max<size_t>(1, options.max_points / 2);
    const size_t k = (n + buckets - 1) / buckets;
    for (size_t start = 0; start < n; start += k) {
      const size_t end = std::min(n, start + k);
      size_t lo = start, hi = start;
      for (size_t i = start; i < end; ++i) {
        const double loss = points[i].loss();
        if (std::isnan(loss)) {
          kept[i] = true;  // a non-finite loss is always notable
          continue;
        }
        if (std::isnan(points[lo].loss()) || loss < points[lo].loss()) lo = i;
        if (std::isnan(points[hi].loss()) || loss > points[hi].loss()) hi = i;
      }
      kept[lo] = true;
      kept[hi] = true;
    }
  }
  kept[n - 1] = true;
  for (size_t i = 0; i < n; ++i) {
    if (kept[i] || spikes.count(points[i].step()) > 0) keep.push_back(i);
  }
  return keep;
}

}  // namespace

absl::StatusOr<std::vector<SweepInfo>> StoreReader::ListSweeps() const {
  absl::StatusOr<Lease> lease = Acquire();
  if (!lease.ok()) return lease.status();
  absl::StatusOr<Stmt*> stmt = (*lease)->cache->Get(
      absl::StrCat("SELECT ", kSweepColumns, " FROM sweep_progress ORDER BY sweep_id DESC"));
  if (!stmt.ok()) return stmt.status();
  std::vector<SweepInfo> sweeps;
  while (true) {
    absl::StatusOr<bool> row = (*stmt)->Step();
    if (!row.ok()) return row.status();
    if (!*row) break;
    sweeps.push_back(ReadSweep(**stmt));
  }
  (*stmt)->Reset();
  return sweeps;
}

absl::StatusOr<SweepInfo> StoreReader::GetSweep(const std::string& name_or_id) const {
  absl::StatusOr<Lease> lease = Acquire();
  if (!lease.ok()) return lease.status();
  // The id first (a name wins over an id that looks the same), then the view by its GROUP BY
  // column, which SQLite pushes into the aggregate: filtering the view by name aggregated every
  // run of every sweep first (35 ms per call with 10,000 runs stored).
  absl::StatusOr<Stmt*> find = (*lease)->cache->Get(
      "SELECT id FROM sweeps WHERE name = ?2 OR id = ?1 ORDER BY name = ?2 DESC LIMIT 1");
  if (!find.ok()) return find.status();
  int64_t id = 0;
  if (!absl::SimpleAtoi(name_or_id, &id)) id = -1;
  (*find)->Bind(1, id).Bind(2, name_or_id);
  absl::StatusOr<bool> found = (*find)->Step();
  if (!found.ok()) return found.status();
  if (!*found) return absl::NotFoundError(absl::StrCat("store: no sweep named ", name_or_id));
  id = (*find)->ColumnInt(0);
  (*find)->Reset();
  absl::StatusOr<Stmt*> stmt = (*lease)->cache->Get(
      absl::StrCat("SELECT ", kSweepColumns, " FROM sweep_progress WHERE sweep_id = ?1"));
  if (!stmt.ok()) return stmt.status();
  (*stmt)->Bind(1, id);
  absl::StatusOr<bool> row = (*stmt)->Step();
  if (!row.ok()) return row.status();
  if (!*row) return absl::NotFoundError(absl::StrCat("store: no sweep named ", name_or_id));
  SweepInfo info = ReadSweep(**stmt);
  (*stmt)->Reset();
  return info;
}

absl::StatusOr<std::vector<RunInfo>> StoreReader::ListRuns(const RunFilter& filter) const {
  absl::StatusOr<Lease> lease = Acquire();
  if (!lease.ok()) return lease.status();
  std::vector<std::string> where;
  if (filter.sweep_id != 0) where.push_back("r.sweep_id = ?1");
  if (!filter.states.empty()) {
    std::vector<std::string> names;
    for (RunState s : filter.states) names.push_back(absl::StrCat("'", RunStateName(s), "'"));
    where.push_back(absl::StrCat("r.state IN (", absl::StrJoin(names, ", "), ")"));
  }
  std::string sql = absl::StrCat("SELECT ", kRunColumns,
                                 where.empty() ? "" : " WHERE ", absl::StrJoin(where, " AND "),
                                 " ORDER BY r.sweep_id, r.run_index LIMIT ?2");
  absl::StatusOr<Stmt*> stmt = (*lease)->cache->Get(sql);
  if (!stmt.ok()) return stmt.status();
  if (filter.sweep_id != 0) (*stmt)->Bind(1, filter.sweep_id);
  (*stmt)->Bind(2, filter.limit > 0 ? filter.limit : int64_t{-1});
  std::vector<RunInfo> runs;
  while (true) {
    absl::StatusOr<bool> row = (*stmt)->Step();
    if (!row.ok()) return row.status();
    if (!*row) break;
    runs.push_back(ReadRun(**stmt));
  }
  (*stmt)->Reset();
  return runs;
}

absl::StatusOr<RunInfo> StoreReader::GetRun(int64_t run_id) const {
  absl::StatusOr<Lease> lease = Acquire();
  if (!lease.ok()) return lease.status();
  absl::StatusOr<Stmt*> stmt =
      (*lease)->cache->Get(absl::StrCat("SELECT ", kRunColumns, " WHERE r.id = ?1"));
  if (!stmt.ok()) return stmt.status();
  (*stmt)->Bind(1, run_id);
  absl::StatusOr<bool> row = (*stmt)->Step();
  if (!row.ok()) return row.status();
  if (!*row) return absl::NotFoundError(absl::StrCat("store: no run ", run_id));
  RunInfo run = ReadRun(**stmt);
  (*stmt)->Reset();
  return run;
}

absl::StatusOr<std::vector<RunInfo>> StoreReader::RunsWithKey(const std::string& run_key) const {
  absl::StatusOr<Lease> lease = Acquire();
  if (!lease.ok()) return lease.status();
  absl::StatusOr<Stmt*> stmt = (*lease)->cache->Get(
      absl::StrCat("SELECT ", kRunColumns, " WHERE r.run_key = ?1 ORDER BY r.id"));
  if (!stmt.ok()) return stmt.status();
  (*stmt)->Bind(1, run_key);
  std::vector<RunInfo> runs;
  while (true) {
    absl::StatusOr<bool> row = (*stmt)->Step();
    if (!row.ok()) return row.status();
    if (!*row) break;
    runs.push_back(ReadRun(**stmt));
  }
  (*stmt)->Reset();
  return runs;
}

absl::StatusOr<std::vector<AttemptInfo>> StoreReader::Attempts(int64_t run_id) const {
  absl::StatusOr<Lease> lease = Acquire();
  if (!lease.ok()) return lease.status();
  absl::StatusOr<Stmt*> stmt = (*lease)->cache->Get(
      absl::StrCat("SELECT ", kAttemptColumns, " WHERE run_id = ?1 ORDER BY attempt"));
  if (!stmt.ok()) return stmt.status();
  (*stmt)->Bind(1, run_id);
  std::vector<AttemptInfo> attempts;
  while (true) {
    absl::StatusOr<bool> row = (*stmt)->Step();
    if (!row.ok()) return row.status();
    if (!*row) break;
    attempts.push_back(ReadAttempt(**stmt));
  }
  (*stmt)->Reset();
  return attempts;
}

absl::StatusOr<AttemptInfo> StoreReader::LatestCheckpoint(int64_t run_id) const {
  absl::StatusOr<std::vector<AttemptInfo>> attempts = Attempts(run_id);
  if (!attempts.ok()) return attempts.status();
  AttemptInfo best;
  best.run_id = run_id;
  for (const AttemptInfo& a : *attempts) {
    if (!a.checkpoint_path.empty() && a.checkpoint_step >= best.checkpoint_step) best = a;
  }
  return best;
}

absl::StatusOr<std::vector<StepMetrics>> StoreReader::MetricSeries(
    int64_t run_id, const SeriesOptions& options) const {
  absl::StatusOr<Lease> lease = Acquire();
  if (!lease.ok()) return lease.status();
  std::vector<StepMetrics> points;
  {
    absl::StatusOr<Stmt*> stmt = (*lease)->cache->Get(
        absl::StrCat("SELECT step, loss, grad_norm, lr, tokens_per_s, aux_loss, skipped FROM "
                     "step_metrics WHERE run_id = ", kSourceRun,
                     " AND step BETWEEN ?2 AND ?3 ORDER BY step"));
    if (!stmt.ok()) return stmt.status();
    (*stmt)->Bind(1, run_id).Bind(2, options.from_step).Bind(3, options.to_step);
    while (true) {
      absl::StatusOr<bool> row = (*stmt)->Step();
      if (!row.ok()) return row.status();
      if (!*row) break;
      const Stmt& s = **stmt;
      StepMetrics& m = points.emplace_back();
      m.set_step(s.ColumnInt(0));
      m.set_loss(s.ColumnDouble(1));
      m.set_grad_norm(s.ColumnDouble(2));
      m.set_lr(s.ColumnDouble(3));
      m.set_tokens_per_s(s.ColumnDouble(4));
      m.set_aux_loss(s.ColumnDouble(5));
      m.set_skipped(s.ColumnInt(6) != 0);
    }
    (*stmt)->Reset();
  }
  std::set<int64_t> spikes;
  {
    absl::StatusOr<Stmt*> stmt = (*lease)->cache->Get(
        absl::StrCat("SELECT DISTINCT step FROM spike_events WHERE run_id = ", kSourceRun,
                     " AND step BETWEEN ?2 AND ?3"));
    if (!stmt.ok()) return stmt.status();
    (*stmt)->Bind(1, run_id).Bind(2, options.from_step).Bind(3, options.to_step);
    while (true) {
      absl::StatusOr<bool> row = (*stmt)->Step();
      if (!row.ok()) return row.status();
      if (!*row) break;
      spikes.insert((*stmt)->ColumnInt(0));
    }
    (*stmt)->Reset();
  }
  std::vector<size_t> keep = DownsampleIndexes(points, spikes, options);
  if (keep.size() == points.size()) return points;
  std::vector<StepMetrics> out;
  out.reserve(keep.size());
  for (size_t i : keep) out.push_back(std::move(points[i]));
  return out;
}

absl::StatusOr<std::vector<EvalResult>> StoreReader::EvalSeries(int64_t run_id,
                                                                bool with_layers) const {
  absl::StatusOr<Lease> lease = Acquire();
  if (!lease.ok()) return lease.status();
  std::vector<EvalResult> evals;
  {
    absl::StatusOr<Stmt*> stmt = (*lease)->cache->Get(
        absl::StrCat("SELECT step, val_loss, val_ppl, gate_score, m_act, f_attn, tokens FROM "
                     "eval_metrics WHERE run_id = ", kSourceRun, " ORDER BY step"));
    if (!stmt.ok()) return stmt.status();
    (*stmt)->Bind(1, run_id);
    while (true) {
      absl::StatusOr<bool> row = (*stmt)->Step();
      if (!row.ok()) return row.status();
      if (!*row) break;
      const Stmt& s = **stmt;
      EvalResult& e = evals.emplace_back();
      e.set_step(s.ColumnInt(0));
      e.set_val_loss(s.ColumnDouble(1));
      e.set_val_ppl(s.ColumnDouble(2));
      if (!s.ColumnIsNull(3)) e.mutable_probes()->set_gate_score_mean(s.ColumnDouble(3));
      e.mutable_probes()->set_m_act(s.ColumnDouble(4));
      e.mutable_probes()->set_f_attn(s.ColumnDouble(5));
      e.mutable_probes()->set_tokens(s.ColumnInt(6));
    }
    (*stmt)->Reset();
  }
  if (!with_layers || evals.empty()) return evals;
  absl::StatusOr<Stmt*> stmt = (*lease)->cache->Get(
      absl::StrCat("SELECT ", kLayerColumns, " WHERE run_id = ", kSourceRun,
                   " ORDER BY step, layer"));
  if (!stmt.ok()) return stmt.status();
  (*stmt)->Bind(1, run_id);
  size_t e = 0;
  while (true) {
    absl::StatusOr<bool> row = (*stmt)->Step();
    if (!row.ok()) return row.status();
    if (!*row) break;
    const int64_t step = (*stmt)->ColumnInt(0);
    while (e < evals.size() && evals[e].step() < step) ++e;
    if (e < evals.size() && evals[e].step() == step) {
      *evals[e].mutable_probes()->add_layers() = ReadLayer(**stmt);
    }
  }
  (*stmt)->Reset();
  return evals;
}

absl::StatusOr<std::vector<LayerProbes>> StoreReader::LayerProbesAt(int64_t run_id,
                                                                    int64_t step) const {
  absl::StatusOr<Lease> lease = Acquire();
  if (!lease.ok()) return lease.status();
  absl::StatusOr<Stmt*> stmt = (*lease)->cache->Get(
      absl::StrCat("SELECT ", kLayerColumns, " WHERE run_id = ", kSourceRun,
                   " AND step = ?2 ORDER BY layer"));
  if (!stmt.ok()) return stmt.status();
  (*stmt)->Bind(1, run_id).Bind(2, step);
  std::vector<LayerProbes> layers;
  while (true) {
    absl::StatusOr<bool> row = (*stmt)->Step();
    if (!row.ok()) return row.status();
    if (!*row) break;
    layers.push_back(ReadLayer(**stmt));
  }
  (*stmt)->Reset();
  return layers;
}

absl::StatusOr<std::vector<SpikeEvent>> StoreReader::SpikeEvents(int64_t run_id) const {
  absl::StatusOr<Lease> lease = Acquire();
  if (!lease.ok()) return lease.status();
  absl::StatusOr<Stmt*> stmt = (*lease)->cache->Get(
      absl::StrCat("SELECT step, signal, value, baseline, kind, action, rollback_to_step FROM "
                   "spike_events WHERE run_id = ", kSourceRun, " ORDER BY step, id"));
  if (!stmt.ok()) return stmt.status();
  (*stmt)->Bind(1, run_id);
  std::vector<SpikeEvent> events;
  while (true) {
    absl::StatusOr<bool> row = (*stmt)->Step();
    if (!row.ok()) return row.status();
    if (!*row) break;
    const Stmt& s = **stmt;
    SpikeEvent& e = events.emplace_back();
    e.set_step(s.ColumnInt(0));
    e.set_signal(s.ColumnText(1));
    e.set_value(s.ColumnDouble(2));
    e.set_baseline(s.ColumnDouble(3));
    SpikeKind kind = SPIKE_KIND_UNSPECIFIED;
    SpikeKind_Parse(s.ColumnText(4), &kind);
    e.set_kind(kind);
    SpikeAction action = SPIKE_ACTION_RECORDED;
    SpikeAction_Parse(s.ColumnText(5), &action);
    e.set_action(action);
    e.set_rollback_to_step(s.ColumnInt(6));
  }
  (*stmt)->Reset();
  return events;
}

absl::StatusOr<std::map<int64_t, LatestStep>> StoreReader::LatestSteps(int64_t sweep_id) const {
  absl::StatusOr<Lease> lease = Acquire();
  if (!lease.ok()) return lease.status();
  absl::StatusOr<Stmt*> stmt = (*lease)->cache->Get(
      "SELECT r.id, m.step, m.loss FROM runs r JOIN step_metrics m "
      "ON m.run_id = coalesce(r.reused_from, r.id) AND m.step = (SELECT max(step) FROM "
      "step_metrics WHERE run_id = coalesce(r.reused_from, r.id)) WHERE r.sweep_id = ?1");
  if (!stmt.ok()) return stmt.status();
  (*stmt)->Bind(1, sweep_id);
  std::map<int64_t, LatestStep> latest;
  while (true) {
    absl::StatusOr<bool> row = (*stmt)->Step();
    if (!row.ok()) return row.status();
    if (!*row) break;
    latest[(*stmt)->ColumnInt(0)] = LatestStep{(*stmt)->ColumnInt(1), (*stmt)->ColumnDouble(2)};
  }
  (*stmt)->Reset();
  return latest;
}

absl::StatusOr<std::vector<WorkerInfo>> StoreReader::ListWorkers() const {
  absl::StatusOr<Lease> lease = Acquire();
  if (!lease.ok()) return lease.status();
  absl::StatusOr<Stmt*> stmt = (*lease)->cache->Get(
      "SELECT id, name, resources_json, registered_at, last_seen, state FROM workers "
      "ORDER BY id");
  if (!stmt.ok()) return stmt.status();
  std::vector<WorkerInfo> workers;
  while (true) {
    absl::StatusOr<bool> row = (*stmt)->Step();
    if (!row.ok()) return row.status();
    if (!*row) break;
    const Stmt& s = **stmt;
    WorkerInfo& w = workers.emplace_back();
    w.id = s.ColumnInt(0);
    w.name = s.ColumnText(1);
    w.resources_json = s.ColumnText(2);
    w.registered_at = s.ColumnDouble(3);
    w.last_seen = s.ColumnDouble(4);
    w.state = s.ColumnText(5);
  }
  (*stmt)->Reset();
  return workers;
}

absl::StatusOr<std::vector<EventInfo>> StoreReader::Events(int64_t sweep_id, int64_t after_id,
                                                           int limit) const {
  absl::StatusOr<Lease> lease = Acquire();
  if (!lease.ok()) return lease.status();
  absl::StatusOr<Stmt*> stmt = (*lease)->cache->Get(absl::StrCat(
      "SELECT id, time, sweep_id, run_id, kind, message FROM events WHERE id > ?2 ",
      sweep_id != 0 ? "AND sweep_id = ?1 " : "", "ORDER BY id LIMIT ?3"));
  if (!stmt.ok()) return stmt.status();
  if (sweep_id != 0) (*stmt)->Bind(1, sweep_id);
  (*stmt)->Bind(2, after_id).Bind(3, static_cast<int64_t>(limit));
  std::vector<EventInfo> events;
  while (true) {
    absl::StatusOr<bool> row = (*stmt)->Step();
    if (!row.ok()) return row.status();
    if (!*row) break;
    const Stmt& s = **stmt;
    EventInfo& e = events.emplace_back();
    e.id = s.ColumnInt(0);
    e.time = s.ColumnDouble(1);
    e.sweep_id = s.ColumnInt(2);
    e.run_id = s.ColumnInt(3);
    e.kind = s.ColumnText(4);
    e.message = s.ColumnText(5);
  }
  (*stmt)->Reset();
  return events;
}

absl::StatusOr<ComparisonTable> StoreReader::GetComparisonTable(const std::string& sweep) const {
  absl::StatusOr<SweepInfo> info = GetSweep(sweep);
  if (!info.ok()) return info.status();
  absl::StatusOr<Lease> lease = Acquire();
  if (!lease.ok()) return lease.status();
  absl::StatusOr<Stmt*> stmt = (*lease)->cache->Get(
      "SELECT variant, description, axes, runs, n, diverged, failed, unfinished, "
      "val_loss_mean, val_loss_std, val_ppl_mean, val_ppl_std, gate_score_mean, gate_score_std, "
      "m_act_mean, m_act_std, f_attn_mean, f_attn_std, spike_score_mean, spike_score_std, "
      "train_loss_mean, train_loss_std, params_total, params_activated, params_added "
      "FROM variant_table WHERE sweep_id = ?1 ORDER BY first_index");
  if (!stmt.ok()) return stmt.status();
  (*stmt)->Bind(1, info->id);
  ComparisonTable table;
  table.sweep = info->name;
  while (true) {
    absl::StatusOr<bool> row = (*stmt)->Step();
    if (!row.ok()) return row.status();
    if (!*row) break;
    const Stmt& s = **stmt;
    ComparisonRow& r = table.rows.emplace_back();
    r.variant = s.ColumnText(0);
    r.description = s.ColumnText(1);
    r.axes = s.ColumnText(2);
    r.runs = s.ColumnInt(3);
    r.n = s.ColumnInt(4);
    r.diverged = s.ColumnInt(5);
    r.failed = s.ColumnInt(6);
    r.unfinished = s.ColumnInt(7);
    MeanStd* metrics[] = {&r.val_loss, &r.val_ppl, &r.gate_score, &r.m_act,
                          &r.f_attn,   &r.spike_score, &r.train_loss};
    for (int i = 0; i < 7; ++i) {
      metrics[i]->mean = s.ColumnDouble(8 + 2 * i);
      metrics[i]->std = s.ColumnDouble(9 + 2 * i);
    }
    r.params_total = ZeroIfNull(s, 22);
    r.params_activated = ZeroIfNull(s, 23);
    r.params_added = ZeroIfNull(s, 24);
  }
  (*stmt)->Reset();
  return table;
}

}  // namespace ablate
