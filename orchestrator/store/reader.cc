#include "orchestrator/store/reader.h"

#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <limits>
#include <mutex>
#include <optional>
#include <set>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "nlohmann/json.hpp"
#include "orchestrator/store/sqlite.h"
#include "orchestrator/store/schema.h"

namespace ablate {

// ---- Connections: from a pool, each read-only and guarded (query.h) --------------------------------

struct StoreReader::Connection {
  SqliteDb db;
  std::unique_ptr<StmtCache> cache;
  QueryGuard guard;
};

class StoreReader::Lease {
 public:
  Lease(const StoreReader* owner, Pool* pool, std::unique_ptr<Connection> connection)
      : owner_(owner), pool_(pool), connection_(std::move(connection)) {}
  Lease(Lease&& other) noexcept = default;
  Lease& operator=(Lease&&) = delete;
  ~Lease() {
    if (connection_ != nullptr) owner_->Release(pool_, std::move(connection_));
  }
  Connection* operator->() const { return connection_.get(); }
  Connection& operator*() const { return *connection_; }

 private:
  const StoreReader* owner_;
  Pool* pool_;
  std::unique_ptr<Connection> connection_;
};

namespace {

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

template <typename Bind, typename Read>
absl::Status StoreReader::ForEachRow(const std::string& sql, Bind bind, Read read) const {
  absl::StatusOr<Lease> lease = Acquire();
  if (!lease.ok()) return lease.status();
  absl::StatusOr<Stmt*> stmt = (*lease)->cache->Get(sql);
  if (!stmt.ok()) return stmt.status();
  bind(**stmt);
  while (true) {
    absl::StatusOr<bool> row = (*stmt)->Step();
    if (!row.ok()) {
      (*stmt)->Reset();
      return row.status();
    }
    if (!*row) break;
    read(static_cast<const Stmt&>(**stmt));
  }
  (*stmt)->Reset();
  return absl::OkStatus();
}

// ---- Ad-hoc queries: the users' SQL, in the sandbox of query.h ----------------------------------

absl::StatusOr<QueryResult> StoreReader::ReadOnlyQuery(const std::string& sql,
                                                       const QueryLimits& limits) const {
  absl::StatusOr<Lease> lease = Acquire(&queries_, absl::Now() + options_.query_wait);
  if (!lease.ok()) return lease.status();
  return RunGuardedQuery((*lease)->db.get(), &(*lease)->guard, sql, limits);
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
    "r.reason, r.reused_from, r.attempt_base, r.devices "
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
  r.attempt_base = static_cast<int>(s.ColumnInt(36));
  r.devices = std::max(1, static_cast<int>(s.ColumnInt(37)));
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
    "sparsity_mean_scaled_1e3, sdpa_mean_abs_before_gate, sdpa_mean_abs_after_gate "
    "FROM eval_layer_probes";

// A spike_events row's columns from `first` on: step, signal, value, baseline, kind, action,
// rollback_to_step.
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
constexpr char kSpikeColumns[] = "s.step, s.signal, s.value, s.baseline, s.kind, s.action, "
                                 "s.rollback_to_step";

// An eval_metrics row: step, val_loss, val_ppl, gate_score, m_act, f_attn, tokens, from column
// `first` on.
void ReadEval(const Stmt& s, int first, EvalResult* e) {
  e->set_step(s.ColumnInt(first));
  e->set_val_loss(s.ColumnDouble(first + 1));
  e->set_val_ppl(s.ColumnDouble(first + 2));
  if (!s.ColumnIsNull(first + 3)) {
    e->mutable_probes()->set_gate_score_mean(s.ColumnDouble(first + 3));  // NULL: no gate
  }
  e->mutable_probes()->set_m_act(s.ColumnDouble(first + 4));
  e->mutable_probes()->set_f_attn(s.ColumnDouble(first + 5));
  e->mutable_probes()->set_tokens(s.ColumnInt(first + 6));
}

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
  sp->set_mean_abs_before_gate(s.ColumnDouble(19));
  sp->set_mean_abs_after_gate(s.ColumnDouble(20));
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
  std::vector<SweepInfo> sweeps;
  if (absl::Status read = ForEachRow(
          absl::StrCat("SELECT ", kSweepColumns, " FROM sweep_progress ORDER BY sweep_id DESC"),
          [](Stmt&) {}, [&](const Stmt& s) { sweeps.push_back(ReadSweep(s)); });
      !read.ok()) {
    return read;
  }
  return sweeps;
}

absl::StatusOr<SweepInfo> StoreReader::GetSweep(const std::string& name_or_id) const {
  int64_t id = 0;
  {
    absl::StatusOr<Lease> lease = Acquire();
    if (!lease.ok()) return lease.status();
    // The name first (a name wins over an id that looks the same), then the view by its GROUP
    // BY column, which SQLite pushes into the aggregate: filtering the view by name aggregated
    // every run of every sweep first (35 ms per call with 10,000 runs stored).
    absl::StatusOr<Stmt*> find = (*lease)->cache->Get(
        "SELECT id FROM sweeps WHERE name = ?2 OR id = ?1 ORDER BY name = ?2 DESC LIMIT 1");
    if (!find.ok()) return find.status();
    if (!absl::SimpleAtoi(name_or_id, &id)) id = -1;
    (*find)->Bind(1, id).Bind(2, name_or_id);
    absl::StatusOr<bool> found = (*find)->Step();
    if (!found.ok()) return found.status();
    if (!*found) return absl::NotFoundError(absl::StrCat("store: no sweep named ", name_or_id));
    id = (*find)->ColumnInt(0);
    (*find)->Reset();
  }
  return GetSweepById(id);
}

absl::StatusOr<SweepInfo> StoreReader::GetSweepById(int64_t sweep_id) const {
  absl::StatusOr<Lease> lease = Acquire();
  if (!lease.ok()) return lease.status();
  absl::StatusOr<Stmt*> stmt = (*lease)->cache->Get(
      absl::StrCat("SELECT ", kSweepColumns, " FROM sweep_progress WHERE sweep_id = ?1"));
  if (!stmt.ok()) return stmt.status();
  (*stmt)->Bind(1, sweep_id);
  absl::StatusOr<bool> row = (*stmt)->Step();
  if (!row.ok()) return row.status();
  if (!*row) return absl::NotFoundError(absl::StrCat("store: no sweep ", sweep_id));
  SweepInfo info = ReadSweep(**stmt);
  (*stmt)->Reset();
  return info;
}

absl::StatusOr<std::vector<RunInfo>> StoreReader::ListRuns(const RunFilter& filter) const {
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
  std::vector<RunInfo> runs;
  if (absl::Status read = ForEachRow(
          sql,
          [&](Stmt& q) {
            if (filter.sweep_id != 0) q.Bind(1, filter.sweep_id);
            q.Bind(2, filter.limit > 0 ? filter.limit : int64_t{-1});
          },
          [&](const Stmt& s) { runs.push_back(ReadRun(s)); });
      !read.ok()) {
    return read;
  }
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
  std::vector<RunInfo> runs;
  if (absl::Status read = ForEachRow(
          absl::StrCat("SELECT ", kRunColumns, " WHERE r.run_key = ?1 ORDER BY r.id"),
          [&](Stmt& q) { q.Bind(1, run_key); }, [&](const Stmt& s) { runs.push_back(ReadRun(s)); });
      !read.ok()) {
    return read;
  }
  return runs;
}

absl::StatusOr<std::vector<AttemptInfo>> StoreReader::Attempts(int64_t run_id) const {
  std::vector<AttemptInfo> attempts;
  if (absl::Status read = ForEachRow(
          absl::StrCat("SELECT ", kAttemptColumns, " WHERE run_id = ?1 ORDER BY attempt"),
          [&](Stmt& q) { q.Bind(1, run_id); },
          [&](const Stmt& s) { attempts.push_back(ReadAttempt(s)); });
      !read.ok()) {
    return read;
  }
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
  std::vector<StepMetrics> points;
  if (absl::Status read = ForEachRow(
          absl::StrCat("SELECT step, loss, grad_norm, lr, tokens_per_s, aux_loss, skipped FROM "
                       "step_metrics WHERE run_id = ",
                       kSourceRun, " AND step BETWEEN ?2 AND ?3 ORDER BY step"),
          [&](Stmt& q) { q.Bind(1, run_id).Bind(2, options.from_step).Bind(3, options.to_step); },
          [&](const Stmt& s) {
            StepMetrics& m = points.emplace_back();
            m.set_step(s.ColumnInt(0));
            m.set_loss(s.ColumnDouble(1));
            m.set_grad_norm(s.ColumnDouble(2));
            m.set_lr(s.ColumnDouble(3));
            m.set_tokens_per_s(s.ColumnDouble(4));
            m.set_aux_loss(s.ColumnDouble(5));
            m.set_skipped(s.ColumnInt(6) != 0);
          });
      !read.ok()) {
    return read;
  }
  std::set<int64_t> spikes;
  if (absl::Status read = ForEachRow(
          absl::StrCat("SELECT DISTINCT step FROM spike_events WHERE run_id = ", kSourceRun,
                       " AND step BETWEEN ?2 AND ?3"),
          [&](Stmt& q) { q.Bind(1, run_id).Bind(2, options.from_step).Bind(3, options.to_step); },
          [&](const Stmt& s) { spikes.insert(s.ColumnInt(0)); });
      !read.ok()) {
    return read;
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
  std::vector<EvalResult> evals;
  if (absl::Status read = ForEachRow(
          absl::StrCat("SELECT step, val_loss, val_ppl, gate_score, m_act, f_attn, tokens FROM "
                       "eval_metrics WHERE run_id = ",
                       kSourceRun, " ORDER BY step"),
          [&](Stmt& q) { q.Bind(1, run_id); },
          [&](const Stmt& s) { ReadEval(s, 0, &evals.emplace_back()); });
      !read.ok()) {
    return read;
  }
  if (evals.empty()) return evals;
  size_t at = 0;
  if (absl::Status read = ForEachRow(
          absl::StrCat("SELECT step, seq_len, yarn, val_loss, val_ppl FROM eval_lengths "
                       "WHERE run_id = ",
                       kSourceRun, " ORDER BY step, seq_len"),
          [&](Stmt& q) { q.Bind(1, run_id); },
          [&](const Stmt& s) {
            const int64_t step = s.ColumnInt(0);
            while (at < evals.size() && evals[at].step() < step) ++at;
            if (at == evals.size() || evals[at].step() != step) return;
            LengthEval& l = *evals[at].add_lengths();
            l.set_seq_len(static_cast<int32_t>(s.ColumnInt(1)));
            l.set_yarn(s.ColumnInt(2) != 0);
            l.set_val_loss(s.ColumnDouble(3));
            l.set_val_ppl(s.ColumnDouble(4));
          });
      !read.ok()) {
    return read;
  }
  if (!with_layers) return evals;
  size_t e = 0;
  if (absl::Status read = ForEachRow(
          absl::StrCat("SELECT ", kLayerColumns, " WHERE run_id = ", kSourceRun,
                       " ORDER BY step, layer"),
          [&](Stmt& q) { q.Bind(1, run_id); },
          [&](const Stmt& s) {
            const int64_t step = s.ColumnInt(0);
            while (e < evals.size() && evals[e].step() < step) ++e;
            if (e < evals.size() && evals[e].step() == step) {
              *evals[e].mutable_probes()->add_layers() = ReadLayer(s);
            }
          });
      !read.ok()) {
    return read;
  }
  return evals;
}

absl::StatusOr<std::optional<int64_t>> StoreReader::EvalStep(int64_t run_id,
                                                             int64_t step) const {
  std::optional<int64_t> found;
  const std::string sql =
      step < 0 ? absl::StrCat("SELECT max(step) FROM eval_metrics WHERE run_id = ", kSourceRun)
               : absl::StrCat("SELECT step FROM eval_metrics WHERE run_id = ", kSourceRun,
                              " AND step = ?2");
  if (absl::Status read = ForEachRow(
          sql,
          [&](Stmt& q) {
            q.Bind(1, run_id);
            if (step >= 0) q.Bind(2, step);
          },
          [&](const Stmt& s) {
            if (!s.ColumnIsNull(0)) found = s.ColumnInt(0);
          });
      !read.ok()) {
    return read;
  }
  return found;
}

absl::StatusOr<std::vector<LayerProbes>> StoreReader::LayerProbesAt(int64_t run_id,
                                                                    int64_t step) const {
  std::vector<LayerProbes> layers;
  if (absl::Status read = ForEachRow(
          absl::StrCat("SELECT ", kLayerColumns, " WHERE run_id = ", kSourceRun,
                       " AND step = ?2 ORDER BY layer"),
          [&](Stmt& q) { q.Bind(1, run_id).Bind(2, step); },
          [&](const Stmt& s) { layers.push_back(ReadLayer(s)); });
      !read.ok()) {
    return read;
  }
  return layers;
}

absl::StatusOr<std::vector<AttentionMap>> StoreReader::AttentionMapsAt(int64_t run_id,
                                                                      int64_t step) const {
  std::vector<AttentionMap> maps;
  if (absl::Status read = ForEachRow(
          absl::StrCat("SELECT layer, head, size, probs FROM eval_attention_maps WHERE run_id = ",
                       kSourceRun, " AND step = ?2 ORDER BY layer, head"),
          [&](Stmt& q) { q.Bind(1, run_id).Bind(2, step); },
          [&](const Stmt& s) {
            AttentionMap& m = maps.emplace_back();
            m.set_layer(static_cast<int32_t>(s.ColumnInt(0)));
            m.set_head(static_cast<int32_t>(s.ColumnInt(1)));
            m.set_size(static_cast<int32_t>(s.ColumnInt(2)));
            m.set_probs(s.ColumnBlob(3));
          });
      !read.ok()) {
    return read;
  }
  return maps;
}

absl::StatusOr<std::vector<SpikeEvent>> StoreReader::SpikeEvents(int64_t run_id) const {
  std::vector<SpikeEvent> events;
  absl::Status read = ForEachRow(
      absl::StrCat("SELECT ", kSpikeColumns, " FROM spike_events s WHERE s.run_id = ", kSourceRun,
                   " ORDER BY s.step, s.id"),
      [&](Stmt& q) { q.Bind(1, run_id); },
      [&](const Stmt& r) { events.push_back(ReadSpike(r, 0)); });
  if (!read.ok()) return read;
  return events;
}

absl::StatusOr<std::map<int64_t, LatestStep>> StoreReader::LatestSteps(int64_t sweep_id) const {
  std::map<int64_t, LatestStep> latest;
  absl::Status read = ForEachRow(
      "SELECT r.id, m.step, m.loss FROM runs r JOIN step_metrics m "
      "ON m.run_id = coalesce(r.reused_from, r.id) AND m.step = (SELECT max(step) FROM "
      "step_metrics WHERE run_id = coalesce(r.reused_from, r.id)) WHERE r.sweep_id = ?1",
      [&](Stmt& q) { q.Bind(1, sweep_id); },
      [&](const Stmt& r) {
        latest[r.ColumnInt(0)] = LatestStep{r.ColumnInt(1), r.ColumnDouble(2)};
      });
  if (!read.ok()) return read;
  return latest;
}

absl::StatusOr<std::map<int64_t, std::vector<std::pair<int64_t, double>>>>
StoreReader::SweepCurves(int64_t sweep_id, CurveMetric metric, int64_t every) const {
  if (every < 1) return absl::InvalidArgumentError("store: a curve's step grid must be >= 1");
  const char* column = metric == CurveMetric::kLoss       ? "loss"
                       : metric == CurveMetric::kGradNorm ? "grad_norm"
                                                          : "lr";
  // Three unions of PK seeks (run, step), never a scan of a run's rows: the grid (0, every,
  // 2 every, ... up to the longest run), each run's last step, its spike steps. A reused run's rows
  // are its source's (coalesce(reused_from, id)).
  const std::string sql = absl::StrCat(
      "WITH RECURSIVE grid(step) AS (SELECT 0 UNION ALL SELECT step + ?2 FROM grid WHERE "
      "step + ?2 <= (SELECT max(steps_done) FROM runs WHERE sweep_id = ?1)) "
      "SELECT r.id, m.step, m.", column, " FROM runs r CROSS JOIN grid g JOIN step_metrics m ON "
      "m.run_id = coalesce(r.reused_from, r.id) AND m.step = g.step WHERE r.sweep_id = ?1 "
      "UNION SELECT r.id, m.step, m.", column, " FROM runs r JOIN step_metrics m ON m.run_id = "
      "coalesce(r.reused_from, r.id) AND m.step = r.steps_done WHERE r.sweep_id = ?1 "
      "UNION SELECT r.id, m.step, m.", column, " FROM runs r JOIN spike_events e ON e.run_id = "
      "coalesce(r.reused_from, r.id) JOIN step_metrics m ON m.run_id = e.run_id AND m.step = "
      "e.step WHERE r.sweep_id = ?1 ORDER BY 1, 2");
  std::map<int64_t, std::vector<std::pair<int64_t, double>>> curves;
  absl::Status read = ForEachRow(
      sql, [&](Stmt& q) { q.Bind(1, sweep_id).Bind(2, every); },
      [&](const Stmt& r) {
        curves[r.ColumnInt(0)].emplace_back(r.ColumnInt(1), r.ColumnDouble(2));
      });
  if (!read.ok()) return read;
  return curves;
}

absl::StatusOr<std::vector<SweepSpike>> StoreReader::SweepSpikes(int64_t sweep_id) const {
  std::vector<SweepSpike> spikes;
  absl::Status read = ForEachRow(
      absl::StrCat("SELECT s.id, r.id, ", kSpikeColumns,
                   " FROM runs r JOIN spike_events s ON "
                   "s.run_id = coalesce(r.reused_from, r.id) WHERE r.sweep_id = ?1 ORDER BY r.id, "
                   "s.step, s.id"),
      [&](Stmt& q) { q.Bind(1, sweep_id); },
      [&](const Stmt& r) {
        spikes.push_back(SweepSpike{r.ColumnInt(0), r.ColumnInt(1), ReadSpike(r, 2)});
      });
  if (!read.ok()) return read;
  return spikes;
}

absl::StatusOr<std::vector<VariantInfo>> StoreReader::ListVariants(int64_t sweep_id) const {
  std::vector<VariantInfo> variants;
  absl::Status read = ForEachRow(
      "SELECT name, description, diff, budget, params_total, params_activated, params_added, "
      "flops_per_token FROM variants WHERE sweep_id = ?1 ORDER BY position",
      [&](Stmt& q) { q.Bind(1, sweep_id); },
      [&](const Stmt& r) {
        VariantInfo& v = variants.emplace_back();
        v.name = r.ColumnText(0);
        v.description = r.ColumnText(1);
        v.diff = r.ColumnText(2);
        v.budget = r.ColumnText(3);
        v.params_total = r.ColumnInt(4);
        v.params_activated = r.ColumnInt(5);
        v.params_added = r.ColumnInt(6);
        v.flops_per_token = ZeroIfNull(r, 7);
      });
  if (!read.ok()) return read;
  return variants;
}

absl::StatusOr<SweepSource> StoreReader::GetSweepSource(int64_t sweep_id) const {
  std::optional<SweepSource> source;
  absl::Status read = ForEachRow(
      "SELECT spec_file, spec_yaml, reference, code_version, created_at, finished_at FROM sweeps "
      "WHERE id = ?1",
      [&](Stmt& q) { q.Bind(1, sweep_id); },
      [&](const Stmt& r) {
        source.emplace();
        source->sweep_id = sweep_id;
        source->spec_file = r.ColumnText(0);
        source->spec_yaml = r.ColumnText(1);
        source->reference = r.ColumnText(2);
        source->code_version = r.ColumnText(3);
        source->created_at = ZeroIfNull(r, 4);
        source->finished_at = ZeroIfNull(r, 5);
      });
  if (!read.ok()) return read;
  if (!source) return absl::NotFoundError(absl::StrCat("store: no sweep ", sweep_id));
  return *source;
}

absl::StatusOr<std::map<int64_t, EvalResult>> StoreReader::LatestEvals(int64_t sweep_id,
                                                                       bool with_layers) const {
  // Each run's source (itself, or the run it reused) and the step of that source's last
  // evaluation: one PK seek per run (max(step) over the eval_metrics rows of one run_id).
  constexpr char kLast[] =
      "WITH last(id, src, step) AS (SELECT r.id, coalesce(r.reused_from, r.id), (SELECT "
      "max(step) FROM eval_metrics WHERE run_id = coalesce(r.reused_from, r.id)) FROM runs r "
      "WHERE r.sweep_id = ?1) ";
  std::map<int64_t, EvalResult> evals;
  if (absl::Status read = ForEachRow(
          absl::StrCat(kLast,
                       "SELECT last.id, e.step, e.val_loss, e.val_ppl, e.gate_score, e.m_act, "
                       "e.f_attn, e.tokens FROM last JOIN eval_metrics e ON e.run_id = last.src "
                       "AND e.step = last.step ORDER BY last.id"),
          [&](Stmt& q) { q.Bind(1, sweep_id); },
          [&](const Stmt& s) { ReadEval(s, 1, &evals[s.ColumnInt(0)]); });
      !read.ok()) {
    return read;
  }
  if (!with_layers || evals.empty()) return evals;
  // kLayerColumns with the run id in place of its first column (step), which ReadLayer skips.
  const std::string layer_columns = absl::StrReplaceAll(
      absl::string_view(kLayerColumns).substr(std::strlen("step, ")),
      {{"FROM eval_layer_probes", "FROM last JOIN eval_layer_probes p"}});
  if (absl::Status read = ForEachRow(
          absl::StrCat(kLast, "SELECT last.id, ", layer_columns,
                       " ON p.run_id = last.src AND p.step = last.step ORDER BY last.id, p.layer"),
          [&](Stmt& q) { q.Bind(1, sweep_id); },
          [&](const Stmt& s) {
            auto it = evals.find(s.ColumnInt(0));
            if (it == evals.end()) return;
            *it->second.mutable_probes()->add_layers() = ReadLayer(s);
          });
      !read.ok()) {
    return read;
  }
  return evals;
}

absl::StatusOr<ChangeCursor> StoreReader::LatestCursor() const {
  ChangeCursor cursor;
  absl::Status read = ForEachRow(
      "SELECT (SELECT coalesce(max(id), 0) FROM events), "
      "(SELECT coalesce(max(id), 0) FROM spike_events)",
      [](Stmt&) {},
      [&](const Stmt& r) {
        cursor.event_id = r.ColumnInt(0);
        cursor.spike_id = r.ColumnInt(1);
      });
  if (!read.ok()) return read;
  return cursor;
}

absl::StatusOr<SweepChanges> StoreReader::ChangesSince(
    int64_t sweep_id, const ChangeCursor& cursor, int limit,
    const std::vector<RunState>& run_states) const {
  SweepChanges changes;
  changes.next = cursor;
  absl::StatusOr<std::vector<EventInfo>> events = Events(sweep_id, cursor.event_id, limit);
  if (!events.ok()) return events.status();
  changes.events = *std::move(events);
  if (!changes.events.empty()) changes.next.event_id = changes.events.back().id;
  absl::Status read = ForEachRow(
      absl::StrCat("SELECT s.id, s.run_id, ", kSpikeColumns,
                   " FROM spike_events s JOIN runs r ON "
                   "r.id = s.run_id WHERE r.sweep_id = ?1 AND s.id > ?2 ORDER BY s.id LIMIT ?3"),
      [&](Stmt& q) {
        q.Bind(1, sweep_id).Bind(2, cursor.spike_id).Bind(3, static_cast<int64_t>(limit));
      },
      [&](const Stmt& r) {
        changes.spikes.push_back(SweepSpike{r.ColumnInt(0), r.ColumnInt(1), ReadSpike(r, 2)});
      });
  if (!read.ok()) return read;
  if (!changes.spikes.empty()) changes.next.spike_id = changes.spikes.back().id;
  RunFilter filter;
  filter.sweep_id = sweep_id;
  filter.states = run_states;
  absl::StatusOr<std::vector<RunInfo>> runs = ListRuns(filter);
  if (!runs.ok()) return runs.status();
  changes.runs = *std::move(runs);
  return changes;
}

absl::StatusOr<StoreCounts> StoreReader::Counts() const {
  StoreCounts counts;
  for (const char* state : {"PENDING", "RUNNING", "SUCCEEDED", "FAILED", "DIVERGED", "CANCELLED",
                            "INTERRUPTED"}) {
    counts.runs_by_state[state] = 0;
  }
  struct Table {
    const char* sql;
    std::map<std::string, int64_t>* by_state;
  };
  const Table tables[] = {
      // sum() of steps is taken in REAL: a huge steps_done cannot overflow it.
      {"SELECT state, count(*), coalesce(total(steps_done), 0) FROM runs GROUP BY state",
       &counts.runs_by_state},
      {"SELECT state, count(*), 0 FROM sweeps GROUP BY state", &counts.sweeps_by_state},
      {"SELECT state, count(*), 0 FROM workers GROUP BY state", &counts.workers_by_state}};
  for (const Table& t : tables) {
    absl::Status read = ForEachRow(
        t.sql, [](Stmt&) {},
        [&](const Stmt& r) {
          (*t.by_state)[r.ColumnText(0)] = r.ColumnInt(1);
          counts.steps_done += r.ColumnDouble(2);
        });
    if (!read.ok()) return read;
  }
  return counts;
}

absl::StatusOr<std::vector<WorkerInfo>> StoreReader::ListWorkers() const {
  std::vector<WorkerInfo> workers;
  if (absl::Status read = ForEachRow(
          "SELECT w.id, w.name, w.resources_json, w.registered_at, w.last_seen, w.state, "
          "COALESCE(SUM(MAX(r.devices, 1)), 0), COUNT(r.id) FROM workers w "
          "LEFT JOIN runs r ON r.worker_id = w.id AND r.state = 'RUNNING' "
          "GROUP BY w.id ORDER BY w.id",
          [](Stmt&) {},
          [&](const Stmt& s) {
            WorkerInfo& w = workers.emplace_back();
            w.id = s.ColumnInt(0);
            w.name = s.ColumnText(1);
            w.resources_json = s.ColumnText(2);
            w.registered_at = s.ColumnDouble(3);
            w.last_seen = s.ColumnDouble(4);
            w.state = s.ColumnText(5);
            w.slots_in_use = static_cast<int>(s.ColumnInt(6));
            w.running = static_cast<int>(s.ColumnInt(7));
          });
      !read.ok()) {
    return read;
  }
  return workers;
}

absl::StatusOr<std::vector<EventInfo>> StoreReader::Events(int64_t sweep_id, int64_t after_id,
                                                           int limit) const {
  std::vector<EventInfo> events;
  if (absl::Status read = ForEachRow(
          absl::StrCat(
              "SELECT id, time, sweep_id, run_id, kind, message FROM events WHERE id > ?2 ",
              sweep_id != 0 ? "AND sweep_id = ?1 " : "", "ORDER BY id LIMIT ?3"),
          [&](Stmt& q) {
            if (sweep_id != 0) q.Bind(1, sweep_id);
            q.Bind(2, after_id).Bind(3, static_cast<int64_t>(limit));
          },
          [&](const Stmt& s) {
            EventInfo& e = events.emplace_back();
            e.id = s.ColumnInt(0);
            e.time = s.ColumnDouble(1);
            e.sweep_id = s.ColumnInt(2);
            e.run_id = s.ColumnInt(3);
            e.kind = s.ColumnText(4);
            e.message = s.ColumnText(5);
          });
      !read.ok()) {
    return read;
  }
  return events;
}

absl::StatusOr<ComparisonTable> StoreReader::GetComparisonTable(const std::string& sweep) const {
  absl::StatusOr<SweepInfo> info = GetSweep(sweep);
  if (!info.ok()) return info.status();
  ComparisonTable table;
  table.sweep = info->name;
  if (absl::Status read = ForEachRow(
          "SELECT variant, description, axes, runs, n, diverged, failed, unfinished, "
          "val_loss_mean, val_loss_std, val_ppl_mean, val_ppl_std, gate_score_mean, "
          "gate_score_std, "
          "m_act_mean, m_act_std, f_attn_mean, f_attn_std, spike_score_mean, spike_score_std, "
          "train_loss_mean, train_loss_std, params_total, params_activated, params_added "
          "FROM variant_table WHERE sweep_id = ?1 ORDER BY first_index",
          [&](Stmt& q) { q.Bind(1, info->id); },
          [&](const Stmt& s) {
            ComparisonRow& r = table.rows.emplace_back();
            r.variant = s.ColumnText(0);
            r.description = s.ColumnText(1);
            r.axes = s.ColumnText(2);
            r.runs = s.ColumnInt(3);
            r.n = s.ColumnInt(4);
            r.diverged = s.ColumnInt(5);
            r.failed = s.ColumnInt(6);
            r.unfinished = s.ColumnInt(7);
            MeanStd* metrics[] = {&r.val_loss, &r.val_ppl,     &r.gate_score, &r.m_act,
                                  &r.f_attn,   &r.spike_score, &r.train_loss};
            for (int i = 0; i < 7; ++i) {
              metrics[i]->mean = s.ColumnDouble(8 + 2 * i);
              metrics[i]->std = s.ColumnDouble(9 + 2 * i);
            }
            r.params_total = ZeroIfNull(s, 22);
            r.params_activated = ZeroIfNull(s, 23);
            r.params_added = ZeroIfNull(s, 24);
          });
      !read.ok()) {
    return read;
  }
  if (absl::Status read = ForEachRow(
          "SELECT variant, axes, seq_len, yarn, n, val_loss_mean, val_loss_std, val_ppl_mean, "
          "val_ppl_std FROM length_table WHERE sweep_id = ?1 ORDER BY seq_len",
          [&](Stmt& q) { q.Bind(1, info->id); },
          [&](const Stmt& s) {
            for (ComparisonRow& r : table.rows) {
              if (r.variant != s.ColumnText(0) || r.axes != s.ColumnText(1)) continue;
              LengthStat& l = r.lengths.emplace_back();
              l.seq_len = s.ColumnInt(2);
              l.yarn = s.ColumnInt(3) != 0;
              l.n = s.ColumnInt(4);
              l.val_loss = {s.ColumnDouble(5), s.ColumnDouble(6)};
              l.val_ppl = {s.ColumnDouble(7), s.ColumnDouble(8)};
              break;
            }
          });
      !read.ok()) {
    return read;
  }
  return table;
}

}  // namespace ablate
