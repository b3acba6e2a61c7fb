#include "orchestrator/store/store.h"

#include <fcntl.h>
#include <unistd.h>

#include <pthread.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/notification.h"
#include "nlohmann/json.hpp"
#include "config/proto_yaml.h"
#include "orchestrator/store/reader.h"
#include "orchestrator/store/schema.h"

namespace ablate {

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

  // Event rows are written together, up to kRowsPerInsert to a statement, by FlushEvents: before
  // COMMIT, and before each write's RELEASE when writes have savepoints (Store::ApplyBatch). A
  // dispatched job's two events were two statements of their own, 13% of the writer's
  // instructions per job (callgrind, bench_store --phases dispatch). Their ids keep the order
  // they were added in.
  void AddEvent(int64_t sweep_id, int64_t run_id, std::string kind, std::string message) {
    events_.push_back({Now(), sweep_id, run_id, std::move(kind), std::move(message)});
  }
  size_t pending_events() const { return events_.size(); }
  // Forgets the events added since `mark` (their savepoint or transaction was rolled back).
  void DropEventsFrom(size_t mark) { events_.resize(std::min(mark, events_.size())); }
  absl::Status FlushEvents();

 private:
  struct PendingEvent {
    double time = 0;
    int64_t sweep_id = 0, run_id = 0;  // 0: NULL
    std::string kind, message;
  };

  SqliteDb db_;
  StmtCache cache_;
  std::function<absl::Time()> now_;
  bool undo_points_ = true;
  std::vector<PendingEvent> events_;
};

namespace {

#define STORE_RETURN_IF_ERROR(expr)         \
  do {                                      \
    absl::Status _status = (expr);          \
    if (!_status.ok()) return _status;      \
  } while (0)

#define STORE_ASSIGN_OR_RETURN(lhs, expr)   \
  auto lhs##_or = (expr);                   \
  if (!lhs##_or.ok()) return lhs##_or.status(); \
  auto lhs = *lhs##_or

bool IsTerminal(RunState s) {
  return s == SUCCEEDED || s == FAILED || s == DIVERGED || s == CANCELLED;
}

bool EdgeAllowed(RunState from, RunState to) {
  if (to == RUN_STATE_UNSPECIFIED || from == to) return false;
  switch (from) {
    case PENDING:
      return to == RUNNING || to == CANCELLED;
    case RUNNING:
      return true;
    case INTERRUPTED:
      return to == PENDING || to == CANCELLED;
    case SUCCEEDED:
    case FAILED:
    case DIVERGED:
    case CANCELLED:
      return to == PENDING;
    default:
      return false;
  }
}

std::string AxesText(const RunSpec& run) {
  std::vector<std::string> parts;
  for (const AxisValue& a : run.axes()) parts.push_back(absl::StrCat(a.path(), "=", a.value()));
  return absl::StrJoin(parts, " ");
}

std::string HistogramJson(const LayerProbes& p) {
  if (!p.has_gate_histogram()) return "";
  nlohmann::json j;
  j["lo"] = p.gate_histogram().lo();
  j["hi"] = p.gate_histogram().hi();
  j["counts"] = std::vector<int64_t>(p.gate_histogram().counts().begin(),
                                     p.gate_histogram().counts().end());
  return j.dump();
}

// Queued on the writer, written with the transaction's other events (StoreWriter::FlushEvents).
absl::Status InsertEvent(StoreWriter& w, int64_t sweep_id, int64_t run_id, std::string kind,
                         std::string message) {
  w.AddEvent(sweep_id, run_id, std::move(kind), std::move(message));
  return absl::OkStatus();
}

absl::Status UpsertEval(StoreWriter& w, int64_t run_id, int32_t attempt, const EvalResult& e) {
  STORE_ASSIGN_OR_RETURN(
      stmt, w.Get("INSERT OR REPLACE INTO eval_metrics (run_id, step, attempt, val_loss, val_ppl, "
                  "gate_score, m_act, f_attn, tokens) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)"));
  stmt->Bind(1, run_id).Bind(2, e.step()).Bind(3, attempt).Bind(4, e.val_loss());
  stmt->Bind(5, e.val_ppl()).Bind(7, e.probes().m_act());
  if (e.probes().has_gate_score_mean()) {
    stmt->Bind(6, e.probes().gate_score_mean());
  } else {
    stmt->BindNull(6);  // no gate: no score, not a score of 0
  }
  stmt->Bind(8, e.probes().f_attn()).Bind(9, e.probes().tokens());
  STORE_RETURN_IF_ERROR(stmt->Run());
  STORE_ASSIGN_OR_RETURN(
      layer, w.Get("INSERT OR REPLACE INTO eval_layer_probes (run_id, step, layer, has_gate, "
                   "gate_mean, gate_std, gate_min, gate_max, gate_histogram, attn_out_max_abs, "
                   "attn_residual_max_abs, ffn_out_max_abs, ffn_residual_max_abs, "
                   "first_token_attention, sparsity_before_gate_1e2, sparsity_before_gate_1e3, "
                   "sparsity_after_gate_1e2, sparsity_after_gate_1e3, sparsity_mean_scaled_1e2, "
                   "sparsity_mean_scaled_1e3, sdpa_mean_abs_before_gate, sdpa_mean_abs_after_gate) "
                   "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, "
                   "?17, ?18, ?19, ?20, ?21, ?22)"));
  for (const LayerProbes& p : e.probes().layers()) {
    layer->Bind(1, run_id).Bind(2, e.step()).Bind(3, p.layer()).Bind(4, p.has_gate() ? 1 : 0);
    if (p.has_gate()) {
      layer->Bind(5, p.gate_mean()).Bind(6, p.gate_std()).Bind(7, p.gate_min());
      layer->Bind(8, p.gate_max());
    }
    layer->Bind(9, HistogramJson(p)).Bind(10, p.attn_out_max_abs());
    layer->Bind(11, p.attn_residual_max_abs()).Bind(12, p.ffn_out_max_abs());
    layer->Bind(13, p.ffn_residual_max_abs()).Bind(14, p.first_token_attention());
    const Sparsity& sp = p.sparsity();
    layer->Bind(15, sp.before_gate_1e2()).Bind(16, sp.before_gate_1e3());
    layer->Bind(17, sp.after_gate_1e2()).Bind(18, sp.after_gate_1e3());
    layer->Bind(19, sp.mean_scaled_1e2()).Bind(20, sp.mean_scaled_1e3());
    layer->Bind(21, sp.mean_abs_before_gate()).Bind(22, sp.mean_abs_after_gate());
    STORE_RETURN_IF_ERROR(layer->Run());
  }
  if (e.lengths_size() > 0) {
    STORE_ASSIGN_OR_RETURN(
        length, w.Get("INSERT OR REPLACE INTO eval_lengths (run_id, step, seq_len, yarn, val_loss, "
                      "val_ppl) VALUES (?1, ?2, ?3, ?4, ?5, ?6)"));
    for (const LengthEval& l : e.lengths()) {
      length->Bind(1, run_id).Bind(2, e.step()).Bind(3, static_cast<int64_t>(l.seq_len()));
      length->Bind(4, l.yarn() ? 1 : 0).Bind(5, l.val_loss()).Bind(6, l.val_ppl());
      STORE_RETURN_IF_ERROR(length->Run());
    }
  }
  if (e.attention_maps_size() > 0) {
    STORE_ASSIGN_OR_RETURN(
        map, w.Get("INSERT OR REPLACE INTO eval_attention_maps (run_id, step, layer, head, size, "
                   "probs) VALUES (?1, ?2, ?3, ?4, ?5, ?6)"));
    for (const AttentionMap& m : e.attention_maps()) {
      map->Bind(1, run_id).Bind(2, e.step()).Bind(3, static_cast<int64_t>(m.layer()));
      map->Bind(4, static_cast<int64_t>(m.head())).Bind(5, static_cast<int64_t>(m.size()));
      map->BindBlob(6, m.probs());
      STORE_RETURN_IF_ERROR(map->Run());
    }
  }
  return absl::OkStatus();
}

// Rows per multi-row INSERT: each statement run has a fixed cost (its program's setup and halt,
// a statement journal) that one row per statement paid ten times for a no-op job's ten points.
constexpr size_t kRowsPerInsert = 32;

// "<head> VALUES (?1, ..., ?c), (?c+1, ...), ..." for 1 to kRowsPerInsert rows of `columns`
// parameters each, all built at construction.
class MultiRowInsert {
 public:
  MultiRowInsert(absl::string_view head, int columns) : sql_(kRowsPerInsert + 1) {
    for (size_t n = 1; n <= kRowsPerInsert; ++n) {
      std::string& text = sql_[n];
      absl::StrAppend(&text, head, " VALUES ");
      for (size_t row = 0; row < n; ++row) {
        absl::StrAppend(&text, row ? ", (" : "(");
        for (int c = 1; c <= columns; ++c) {
          absl::StrAppend(&text, c > 1 ? ", ?" : "?", row * columns + c);
        }
        absl::StrAppend(&text, ")");
      }
    }
  }
  const std::string& Sql(size_t rows) const { return sql_[rows]; }

 private:
  std::vector<std::string> sql_;
};

// Statement journals. SQLite gives a statement that writes several rows and may abort midway a
// journal of its own inside a transaction, so that its failure undoes only its own rows: each
// page it touches is copied first (to memory here). The writer never needs that. A failed write
// rolls its whole transaction back, or its own savepoint when the batch is applied again with
// them (Store::CommitBatch). So its multi-row INSERTs are OR FAIL, which keeps a failed
// statement's earlier rows and needs no journal: the step rows' journals were 5.5% of the
// writer's instructions per dispatched job (callgrind, bench_store --phases dispatch).
//
// Step rows replace the rows of the steps they repeat (a resumed attempt, a rollback after a
// spike). Nearly every batch repeats none, so a batch goes in with OR FAIL first and, only when
// a step was there, again with OR REPLACE, which rewrites whatever the first try put in.
const MultiRowInsert& StepRowsInsert(bool replace) {
  static constexpr char kInto[] =
      " INTO step_metrics (run_id, step, attempt, loss, grad_norm, lr, tokens_per_s, aux_loss, "
      "skipped)";
  static const auto* fail = new MultiRowInsert(absl::StrCat("INSERT OR FAIL", kInto), 9);
  static const auto* replacing = new MultiRowInsert(absl::StrCat("INSERT OR REPLACE", kInto), 9);
  return replace ? *replacing : *fail;
}

// Inserts b.steps[first, first + n) with `insert`.
absl::Status InsertStepRows(StoreWriter& w, const MultiRowInsert& insert, const MetricBatch& b,
                            size_t first, size_t n) {
  STORE_ASSIGN_OR_RETURN(stmt, w.Get(insert.Sql(n)));
  for (size_t i = 0; i < n; ++i) {
    const StepMetrics& m = b.steps[first + i];
    const int p = static_cast<int>(9 * i);
    stmt->Bind(p + 1, b.run_id).Bind(p + 2, m.step()).Bind(p + 3, b.attempt);
    stmt->Bind(p + 4, m.loss()).Bind(p + 5, m.grad_norm()).Bind(p + 6, m.lr());
    stmt->Bind(p + 7, m.tokens_per_s()).Bind(p + 8, m.aux_loss());
    stmt->Bind(p + 9, m.skipped() ? 1 : 0);
  }
  return stmt->Run();
}

// `ending`: the attempt's end follows in the same write with a summary (a Finish): the batch's
// seq is left to the end's UPDATE of the attempt (*seq_for_end) and the run's progress to the
// summary's steps_done, two row rewrites fewer per job.
absl::Status ApplyMetrics(StoreWriter& w, const MetricBatch& b, ReportResult* result,
                          bool ending = false, int64_t* seq_for_end = nullptr) {
  STORE_ASSIGN_OR_RETURN(check, w.Get("SELECT state, report_seq FROM attempts "
                                      "WHERE run_id = ?1 AND attempt = ?2"));
  check->Bind(1, b.run_id).Bind(2, b.attempt);
  STORE_ASSIGN_OR_RETURN(found, check->Step());
  if (!found) {
    check->Reset();
    return absl::NotFoundError(
        absl::StrCat("store: run ", b.run_id, " has no attempt ", b.attempt));
  }
  const std::string state = check->ColumnText(0);
  const int64_t last_seq = check->ColumnInt(1);
  check->Reset();
  if (b.seq <= last_seq) {
    result->duplicate = true;
    return absl::OkStatus();
  }
  if (state != "RUNNING") {
    return absl::FailedPreconditionError(absl::StrCat("store: run ", b.run_id, " attempt ",
                                                      b.attempt, " is ", state,
                                                      ": its reports are refused"));
  }
  int64_t max_step = 0;
  for (const StepMetrics& m : b.steps) max_step = std::max(max_step, m.step());
  for (size_t first = 0; first < b.steps.size(); first += kRowsPerInsert) {
    const size_t n = std::min(b.steps.size() - first, kRowsPerInsert);
    absl::Status inserted = InsertStepRows(w, StepRowsInsert(/*replace=*/false), b, first, n);
    if (!inserted.ok() && sqlite3_extended_errcode(w.db()) == SQLITE_CONSTRAINT_PRIMARYKEY) {
      inserted = InsertStepRows(w, StepRowsInsert(/*replace=*/true), b, first, n);
    }
    STORE_RETURN_IF_ERROR(inserted);
  }
  for (const EvalResult& e : b.evals) STORE_RETURN_IF_ERROR(UpsertEval(w, b.run_id, b.attempt, e));
  if (!b.spikes.empty()) {
    STORE_ASSIGN_OR_RETURN(
        stmt, w.Get("INSERT OR IGNORE INTO spike_events (run_id, attempt, step, signal, value, "
                    "baseline, kind, action, rollback_to_step) VALUES (?1, ?2, ?3, ?4, ?5, ?6, "
                    "?7, ?8, ?9)"));
    for (const SpikeEvent& s : b.spikes) {
      stmt->Bind(1, b.run_id).Bind(2, b.attempt).Bind(3, s.step()).Bind(4, s.signal());
      stmt->Bind(5, s.value()).Bind(6, s.baseline()).Bind(7, SpikeKind_Name(s.kind()));
      stmt->Bind(8, SpikeAction_Name(s.action())).Bind(9, s.rollback_to_step());
      STORE_RETURN_IF_ERROR(stmt->Run());
    }
  }
  if (ending) {
    *seq_for_end = b.seq;
    return absl::OkStatus();
  }
  STORE_ASSIGN_OR_RETURN(seq, w.Get("UPDATE attempts SET report_seq = ?3 "
                                    "WHERE run_id = ?1 AND attempt = ?2"));
  seq->Bind(1, b.run_id).Bind(2, b.attempt).Bind(3, b.seq);
  STORE_RETURN_IF_ERROR(seq->Run());
  if (max_step > 0) {
    STORE_ASSIGN_OR_RETURN(
        progress, w.Get("UPDATE runs SET steps_done = max(steps_done, ?2) WHERE id = ?1"));
    progress->Bind(1, b.run_id).Bind(2, max_step);
    STORE_RETURN_IF_ERROR(progress->Run());
  }
  return absl::OkStatus();
}

// `config_json`: each run's canonical config, in runs order.
absl::Status ApplyCreateSweep(StoreWriter& w, const SweepRecord& record,
                              const std::vector<std::string>& config_json, SweepIds* ids) {
  const ExpandedSweep& sweep = record.expanded;
  const double now = w.Now();
  {
    STORE_ASSIGN_OR_RETURN(exists, w.Get("SELECT id FROM sweeps WHERE name = ?1"));
    exists->Bind(1, sweep.name());
    STORE_ASSIGN_OR_RETURN(found, exists->Step());
    exists->Reset();
    if (found) {
      return absl::AlreadyExistsError(
          absl::StrCat("store: a sweep named ", sweep.name(), " exists already"));
    }
  }
  STORE_ASSIGN_OR_RETURN(
      insert, w.Get("INSERT INTO sweeps (name, description, spec_file, spec_yaml, spec_json, "
                    "reference, code_version, priority, created_at) VALUES (?1, ?2, ?3, ?4, ?5, "
                    "?6, ?7, ?8, ?9)"));
  insert->Bind(1, sweep.name()).Bind(2, sweep.description()).Bind(3, sweep.spec_file());
  insert->Bind(4, record.spec_yaml).Bind(5, record.spec_json).Bind(6, sweep.reference());
  insert->Bind(7, sweep.code_version()).Bind(8, sweep.priority()).Bind(9, now);
  STORE_RETURN_IF_ERROR(insert->Run());
  ids->sweep_id = sqlite3_last_insert_rowid(w.db());

  // Variants in spec order, then any only the runs name; each described by its first run.
  std::vector<std::string> names(sweep.variants().begin(), sweep.variants().end());
  std::map<std::string, const RunSpec*> first_run;
  for (const RunSpec& run : sweep.runs()) {
    if (first_run.emplace(run.variant(), &run).second &&
        std::find(names.begin(), names.end(), run.variant()) == names.end()) {
      names.push_back(run.variant());
    }
  }
  STORE_ASSIGN_OR_RETURN(
      variant, w.Get("INSERT INTO variants (sweep_id, name, position, description, model_json, "
                     "diff, params_total, params_activated, params_added, budget, "
                     "flops_per_token) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)"));
  std::map<std::string, int64_t> variant_ids;
  for (size_t i = 0; i < names.size(); ++i) {
    variant->Bind(1, ids->sweep_id).Bind(2, names[i]).Bind(3, static_cast<int64_t>(i));
    auto it = first_run.find(names[i]);
    if (it != first_run.end()) {
      const RunSpec& run = *it->second;
      variant->Bind(4, run.description()).Bind(5, CanonicalJson(run.config().model()));
      variant->Bind(6, run.diff()).Bind(7, run.params().total());
      variant->Bind(8, run.params().activated()).Bind(9, run.added_params());
      variant->Bind(10, run.budget().text()).Bind(11, run.flops_per_token());
    } else {
      variant->Bind(4, "").Bind(5, "").Bind(6, "").Bind(10, "");
    }
    STORE_RETURN_IF_ERROR(variant->Run());
    variant_ids[names[i]] = sqlite3_last_insert_rowid(w.db());
  }

  STORE_ASSIGN_OR_RETURN(
      run_stmt,
      w.Get("INSERT INTO runs (sweep_id, variant_id, run_index, run_key, seed, axes, "
            "params_total, params_activated, params_added, flops_per_token, priority, device, "
            "memory_gb, threads, created_at, steps_total, devices) VALUES (?1, ?2, ?3, ?4, ?5, "
            "?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17)"));
  STORE_ASSIGN_OR_RETURN(config_stmt,
                         w.Get("INSERT INTO run_configs (run_id, config_json) VALUES (?1, ?2)"));
  // Reuse: the first run of the same key that trained to SUCCEEDED, and a copy of its results.
  STORE_ASSIGN_OR_RETURN(source_stmt,
                         w.Get("SELECT id FROM runs WHERE run_key = ?1 AND state = 'SUCCEEDED' "
                               "AND reused_from IS NULL ORDER BY id LIMIT 1"));
  STORE_ASSIGN_OR_RETURN(
      reuse_stmt,
      w.Get("UPDATE runs SET (state, reused_from, reason, started_at, finished_at, steps_done, "
            "final_train_loss, val_loss, val_ppl, gate_score, m_act, f_attn, spike_steps, "
            "spike_score, tokens_per_s, wall_s) = (SELECT 'SUCCEEDED', s.id, 'reused run ' || "
            "s.id || ' (same run key ' || s.run_key || ')', ?3, ?3, s.steps_done, "
            "s.final_train_loss, s.val_loss, s.val_ppl, s.gate_score, s.m_act, s.f_attn, "
            "s.spike_steps, s.spike_score, s.tokens_per_s, s.wall_s FROM runs s WHERE s.id = ?2) "
            "WHERE id = ?1"));
  int reused = 0;
  for (int i = 0; i < sweep.runs_size(); ++i) {
    const RunSpec& run = sweep.runs(i);
    run_stmt->Bind(1, ids->sweep_id).Bind(2, variant_ids[run.variant()]).Bind(3, run.index());
    run_stmt->Bind(4, run.run_key()).Bind(5, static_cast<int64_t>(run.seed()));
    run_stmt->Bind(6, AxesText(run));
    run_stmt->Bind(7, run.params().total()).Bind(8, run.params().activated());
    run_stmt->Bind(9, run.added_params()).Bind(10, run.flops_per_token());
    run_stmt->Bind(11, run.priority() != 0 ? run.priority() : sweep.priority());
    const std::string device = run.resources().device().empty()
                                   ? std::string("cpu")
                                   : run.resources().device();
    run_stmt->Bind(12, device).Bind(13, run.resources().memory_gb());
    run_stmt->Bind(14, run.resources().threads()).Bind(15, now);
    run_stmt->Bind(16, run.config().train().steps());
    run_stmt->Bind(17, static_cast<int64_t>(std::max(1, run.resources().devices())));
    STORE_RETURN_IF_ERROR(run_stmt->Run());
    ids->run_ids.push_back(sqlite3_last_insert_rowid(w.db()));
    config_stmt->Bind(1, ids->run_ids.back()).Bind(2, config_json[i]);
    STORE_RETURN_IF_ERROR(config_stmt->Run());
    int64_t source = 0;
    if (record.reuse) {
      source_stmt->Bind(1, run.run_key());
      STORE_ASSIGN_OR_RETURN(found, source_stmt->Step());
      if (found) source = source_stmt->ColumnInt(0);
      source_stmt->Reset();
    }
    ids->reused_from.push_back(source);
    if (source == 0) continue;
    reuse_stmt->Bind(1, ids->run_ids.back()).Bind(2, source).Bind(3, now);
    STORE_RETURN_IF_ERROR(reuse_stmt->Run());
    STORE_RETURN_IF_ERROR(InsertEvent(w, ids->sweep_id, ids->run_ids.back(), "run_state",
                                      absl::StrCat("run ", ids->run_ids.back(),
                                                   ": PENDING -> SUCCEEDED: reused run ", source)));
    ++reused;
  }
  if (reused == sweep.runs_size()) {  // nothing left to run
    STORE_ASSIGN_OR_RETURN(done, w.Get("UPDATE sweeps SET state = 'DONE', finished_at = ?2 "
                                       "WHERE id = ?1"));
    done->Bind(1, ids->sweep_id).Bind(2, now);
    STORE_RETURN_IF_ERROR(done->Run());
  }
  return InsertEvent(w, ids->sweep_id, 0, "sweep_submitted",
                     absl::StrCat("sweep ", sweep.name(), " submitted: ", sweep.runs_size(),
                                  " runs, ", names.size(), " variants",
                                  reused > 0 ? absl::StrCat(", ", reused, " reused") : ""));
}

// `report_seq` > 0: the attempt that ends also records its last applied metric batch.
absl::Status ApplyTransition(StoreWriter& w, const RunTransition& t, TransitionResult* result,
                             int64_t report_seq = 0) {
  STORE_ASSIGN_OR_RETURN(read, w.Get("SELECT state, attempts, sweep_id FROM runs WHERE id = ?1"));
  read->Bind(1, t.run_id);
  STORE_ASSIGN_OR_RETURN(found, read->Step());
  if (!found) {
    read->Reset();
    return absl::NotFoundError(absl::StrCat("store: no run ", t.run_id));
  }
  const RunState current = ParseRunState(read->ColumnText(0));
  int32_t attempt = static_cast<int32_t>(read->ColumnInt(1));
  const int64_t sweep_id = read->ColumnInt(2);
  read->Reset();
  result->previous = current;
  if (std::find(t.from.begin(), t.from.end(), current) == t.from.end()) {
    std::vector<std::string> expected;
    for (RunState s : t.from) expected.push_back(RunStateName(s));
    return absl::FailedPreconditionError(
        absl::StrCat("store: run ", t.run_id, " is ", RunStateName(current), ", not ",
                     expected.empty() ? "(none given)" : absl::StrJoin(expected, " or ")));
  }
  if (!EdgeAllowed(current, t.to)) {
    return absl::InvalidArgumentError(absl::StrCat("store: run ", t.run_id, " cannot go from ",
                                                   RunStateName(current), " to ",
                                                   RunStateName(t.to)));
  }
  if (t.expected_attempt > 0 && attempt != t.expected_attempt) {
    return absl::FailedPreconditionError(absl::StrCat("store: run ", t.run_id, " is on attempt ",
                                                      attempt, ", not ", t.expected_attempt));
  }
  const double now = w.Now();
  if (current == RUNNING && attempt > 0) {
    STORE_ASSIGN_OR_RETURN(end, w.Get("UPDATE attempts SET state = ?3, ended_at = ?4, "
                                      "reason = ?5, report_seq = max(report_seq, ?6) "
                                      "WHERE run_id = ?1 AND attempt = ?2"));
    end->Bind(1, t.run_id).Bind(2, attempt);
    end->Bind(3, t.attempt_end.empty() ? RunStateName(t.to) : t.attempt_end);
    end->Bind(4, now).Bind(5, t.reason).Bind(6, report_seq);
    STORE_RETURN_IF_ERROR(end->Run());
  }
  if (t.to == RUNNING) {
    ++attempt;
    STORE_ASSIGN_OR_RETURN(start, w.Get("INSERT INTO attempts (run_id, attempt, worker_id, state, "
                                        "started_at) VALUES (?1, ?2, ?3, 'RUNNING', ?4)"));
    start->Bind(1, t.run_id).Bind(2, attempt);
    if (t.worker_id != 0) start->Bind(3, t.worker_id);
    start->Bind(4, now);
    STORE_RETURN_IF_ERROR(start->Run());
    STORE_ASSIGN_OR_RETURN(
        run, w.Get("UPDATE runs SET state = 'RUNNING', attempts = ?2, worker_id = ?3, "
                   "started_at = coalesce(started_at, ?4), finished_at = NULL, reason = '' "
                   "WHERE id = ?1"));
    run->Bind(1, t.run_id).Bind(2, attempt);
    if (t.worker_id != 0) run->Bind(3, t.worker_id);
    run->Bind(4, now);
    STORE_RETURN_IF_ERROR(run->Run());
  } else if (!t.has_summary) {
    STORE_ASSIGN_OR_RETURN(run, w.Get("UPDATE runs SET state = ?2, reason = ?3, finished_at = ?4, "
                                      "attempt_base = CASE WHEN ?5 THEN attempts ELSE "
                                      "attempt_base END WHERE id = ?1"));
    run->Bind(1, t.run_id).Bind(2, RunStateName(t.to)).Bind(3, t.reason);
    if (IsTerminal(t.to)) run->Bind(4, now);
    run->Bind(5, static_cast<int64_t>(t.rebase_attempts));
    STORE_RETURN_IF_ERROR(run->Run());
  } else {
    // The end and the summary in one UPDATE: SQLite rewrites the whole row for each.
    const RunSummary& s = t.summary;
    STORE_ASSIGN_OR_RETURN(
        run, w.Get("UPDATE runs SET state = ?2, finished_at = ?4, steps_done = ?5, "
                   "final_train_loss = ?6, val_loss = ?7, val_ppl = ?8, gate_score = ?9, "
                   "m_act = ?10, f_attn = ?11, spike_steps = ?12, spike_score = ?13, "
                   "tokens_per_s = ?14, wall_s = ?15, "
                   "reason = CASE WHEN ?16 = '' THEN ?3 ELSE ?16 END WHERE id = ?1"));
    run->Bind(1, t.run_id).Bind(2, RunStateName(t.to)).Bind(3, t.reason);
    if (IsTerminal(t.to)) run->Bind(4, now);
    run->Bind(5, s.steps_done()).Bind(6, s.final_train_loss());
    if (s.has_final_eval()) {
      const EvalResult& e = s.final_eval();
      run->Bind(7, e.val_loss()).Bind(8, e.val_ppl());
      if (e.probes().has_gate_score_mean()) {
        run->Bind(9, e.probes().gate_score_mean());
      } else {
        run->BindNull(9);
      }
      run->Bind(10, e.probes().m_act()).Bind(11, e.probes().f_attn());
    }
    run->Bind(12, s.spike_steps()).Bind(13, s.spike_score()).Bind(14, s.tokens_per_s());
    run->Bind(15, s.wall_s()).Bind(16, s.reason());
    STORE_RETURN_IF_ERROR(run->Run());
    if (s.has_final_eval() && s.final_eval().step() > 0) {
      STORE_RETURN_IF_ERROR(UpsertEval(w, t.run_id, attempt, s.final_eval()));
    }
  }
  std::string message = absl::StrCat("run ", t.run_id, ": ", RunStateName(current), " -> ",
                                     RunStateName(t.to), " (attempt ", attempt, ")");
  if (!t.reason.empty()) absl::StrAppend(&message, ": ", t.reason);
  STORE_RETURN_IF_ERROR(InsertEvent(w, sweep_id, t.run_id, "run_state", message));

  // The sweep is DONE when nothing of it is left to run; a requeued run makes it ACTIVE again.
  // Only a run entering or leaving a terminal state can change that: a start (PENDING ->
  // RUNNING) or the requeue of an interrupted run skips the check.
  // EXISTS, not count(*): it stops at the first index entry, where a count walked every queued
  // run of a 10,000-run sweep on each transition.
  if (IsTerminal(current) == IsTerminal(t.to)) {
    result->attempt = attempt;
    return absl::OkStatus();
  }
  // One statement: whether anything of the sweep is left to run (three index probes, not
  // `state IN (...)`: SQLite builds a temporary b-tree of an IN list of three names or more on
  // every execution), evaluated once (it does not depend on the sweeps row), and the sweep's
  // state set from it where it differs. A probe and an UPDATE of their own cost a statement more
  // per dispatched job.
  STORE_ASSIGN_OR_RETURN(
      settle,
      w.Get("UPDATE sweeps SET state = CASE state WHEN 'ACTIVE' THEN 'DONE' ELSE 'ACTIVE' END, "
            "finished_at = CASE state WHEN 'ACTIVE' THEN ?2 ELSE NULL END "
            "WHERE id = ?1 AND state = CASE WHEN "
            "EXISTS (SELECT 1 FROM runs WHERE sweep_id = ?1 AND state = 'PENDING') OR "
            "EXISTS (SELECT 1 FROM runs WHERE sweep_id = ?1 AND state = 'RUNNING') OR "
            "EXISTS (SELECT 1 FROM runs WHERE sweep_id = ?1 AND state = 'INTERRUPTED') "
            "THEN 'DONE' ELSE 'ACTIVE' END"));
  settle->Bind(1, sweep_id).Bind(2, now);
  STORE_RETURN_IF_ERROR(settle->Run());
  result->attempt = attempt;
  return absl::OkStatus();
}

}  // namespace

absl::Status StoreWriter::FlushEvents() {
  // OR FAIL: no statement journal (StepRowsInsert).
  static const auto* insert =
      new MultiRowInsert("INSERT OR FAIL INTO events (time, sweep_id, run_id, kind, message)", 5);
  for (size_t first = 0; first < events_.size(); first += kRowsPerInsert) {
    const size_t n = std::min(events_.size() - first, kRowsPerInsert);
    STORE_ASSIGN_OR_RETURN(stmt, Get(insert->Sql(n)));
    for (size_t i = 0; i < n; ++i) {
      const PendingEvent& e = events_[first + i];
      const int p = static_cast<int>(5 * i);
      stmt->Bind(p + 1, e.time);
      if (e.sweep_id != 0) stmt->Bind(p + 2, e.sweep_id);
      if (e.run_id != 0) stmt->Bind(p + 3, e.run_id);
      stmt->Bind(p + 4, e.kind).Bind(p + 5, e.message);
    }
    STORE_RETURN_IF_ERROR(stmt->Run());
  }
  events_.clear();
  return absl::OkStatus();
}

int64_t MetricBatch::Rows() const {
  int64_t rows = 2 + static_cast<int64_t>(steps.size() + spikes.size());
  for (const EvalResult& e : evals) rows += 1 + e.probes().layers_size();
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
  // A 64 MB page cache and checkpoints every ~40 MB of WAL keep bulk ingestion off the disk's
  // critical path; readers are unaffected. Every write runs under its own SAVEPOINT, and SQLite
  // copies each page a savepoint changes into a sub-journal, a temporary file by default: two
  // pwrite calls per page, ten times the WAL's own writes during dispatch (strace). In memory
  // it holds at most the pages one write changes. No automatic checkpoint on this connection:
  // copying 40 MB into the database and syncing it stopped every write queued meanwhile (a
  // tenth of a 10,000-job dispatch in bench_scheduler); the checkpointer thread does it.
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

// ---- The writer thread ------------------------------------------------------------------------------

absl::Status Store::Enqueue(Op op) {
  absl::MutexLock lock(&mu_);
  return EnqueueLocked(std::move(op));
}

absl::Status Store::EnqueueLocked(Op op) {
  if (stop_) return absl::UnavailableError("store: closed");
  if (queued_rows_ + op.rows > options_.max_queued_rows && !queue_.empty()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "store: ", queued_rows_, " rows are waiting to be written (",
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

void Store::WriterLoop() {
  while (true) {
    std::deque<Op> batch;
    int64_t batch_rows = 0;
    bool stopping = false;
    {
      absl::MutexLock lock(&mu_);
      while (true) {
        const absl::Time now = absl::Now();
        if (stop_) {
          stopping = true;
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
      if (stopping && queue_.empty()) {
        writer_exited_ = true;
        flush_cv_.SignalAll();
        return;
      }
      batch.swap(queue_);
      batch_rows = queued_rows_;
      queued_rows_ = 0;
      for (const Op& op : batch) {
        if (op.urgent) --urgent_;
      }
    }

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
      {
        // Counted before anyone is told: a caller whose write returned sees it in Stats().
        absl::MutexLock lock(&mu_);
        ++stats_.flushes;
        stats_.reapplied_flushes += reapplied;
        stats_.longest_flush = std::max(stats_.longest_flush, flush_time);
        stats_.rows_committed += batch_rows;
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
      continue;
    }

    // Rolled back: report the failure once to whoever waits, keep the ingestion writes (in
    // order, ahead of anything queued meanwhile), drop the synchronous ones.
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
    if (stopping) {
      // One last attempt was made for what was queued at close; fail the rest.
      while (!queue_.empty()) {
        Op op = std::move(queue_.front());
        queue_.pop_front();
        if (op.done) op.done(absl::UnavailableError("store: closed before the write committed"));
      }
      writer_exited_ = true;
      return;
    }
  }
}

void Store::UpdateDurableTicket() {
  // Everything ahead of the queue's front has committed or failed alone (or, for synchronous
  // writes, failed with its flush and been reported).
  durable_ticket_ = queue_.empty() ? next_ticket_ - 1 : queue_.front().ticket - 1;
}

// The first pass applies the batch without savepoints. An open savepoint makes SQLite copy
// every page a write touches into its sub-journal first: at one savepoint per write that was
// 15% of the writer's CPU per dispatched job (bench_store). Writes rarely fail alone (a stale
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
  // The runs' JSON is printed here, on the caller's thread, when the record does not bring it.
  // Printed on the writer, it held every other write (reports, finishes) back for 2.8 s while a
  // 10,000-run sweep was stored.
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
      [sweep_id, state](StoreWriter& w) -> absl::Status {
        STORE_ASSIGN_OR_RETURN(stmt, w.Get("UPDATE sweeps SET state = ?2, finished_at = CASE WHEN "
                                           "?2 = 'ACTIVE' THEN NULL ELSE ?3 END WHERE id = ?1"));
        stmt->Bind(1, sweep_id).Bind(2, state).Bind(3, w.Now());
        STORE_RETURN_IF_ERROR(stmt->Run());
        if (sqlite3_changes(w.db()) == 0) {
          return absl::NotFoundError(absl::StrCat("store: no sweep ", sweep_id));
        }
        return InsertEvent(w, sweep_id, 0, "sweep_state",
                           absl::StrCat("sweep ", sweep_id, " is ", state));
      },
      2);
}

absl::StatusOr<SweepCancellation> Store::CancelSweep(int64_t sweep_id) {
  auto result = std::make_shared<SweepCancellation>();
  absl::Status s = RunSync(
      [sweep_id, result](StoreWriter& w) -> absl::Status {
        *result = SweepCancellation();
        STORE_ASSIGN_OR_RETURN(stmt, w.Get("UPDATE sweeps SET state = 'CANCELLED', finished_at = "
                                           "?2 WHERE id = ?1"));
        stmt->Bind(1, sweep_id).Bind(2, w.Now());
        STORE_RETURN_IF_ERROR(stmt->Run());
        if (sqlite3_changes(w.db()) == 0) {
          return absl::NotFoundError(absl::StrCat("store: no sweep ", sweep_id));
        }
        STORE_RETURN_IF_ERROR(InsertEvent(w, sweep_id, 0, "sweep_state",
                                          absl::StrCat("sweep ", sweep_id, " is CANCELLED")));
        // The condition of runs_by_sweep_state (schema version 8), word for word: SQLite uses a
        // partial index only for a query whose WHERE holds its condition.
        STORE_ASSIGN_OR_RETURN(list, w.Get("SELECT id, state FROM runs WHERE sweep_id = ?1 AND "
                                           "(state = 'PENDING' OR state = 'RUNNING' OR "
                                           "state = 'INTERRUPTED') ORDER BY id"));
        list->Bind(1, sweep_id);
        std::vector<int64_t> unstarted;
        for (;;) {
          STORE_ASSIGN_OR_RETURN(row, list->Step());
          if (!row) break;
          (list->ColumnText(1) == "RUNNING" ? result->running : unstarted)
              .push_back(list->ColumnInt(0));
        }
        list->Reset();
        for (int64_t run_id : unstarted) {
          RunTransition t;
          t.run_id = run_id;
          t.from = {PENDING, INTERRUPTED};
          t.to = CANCELLED;
          t.reason = "cancelled";
          TransitionResult ignored;
          STORE_RETURN_IF_ERROR(ApplyTransition(w, t, &ignored));
          result->cancelled.push_back(run_id);
        }
        return absl::OkStatus();
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

namespace {

// Applies `start` under its own savepoint when the pass has them: a start that cannot happen
// (FailedPrecondition: cancelled meanwhile) is undone alone. Without savepoints its failure fails
// the whole write, and CommitBatch applies the batch again with them.
absl::Status ApplyStart(StoreWriter& w, const RunTransition& start, absl::Status* status,
                        TransitionResult* result) {
  if (!w.undo_points()) {
    *status = ApplyTransition(w, start, result);
    return *status;
  }
  const size_t events = w.pending_events();
  STORE_RETURN_IF_ERROR(w.Run("SAVEPOINT start_next"));
  *status = ApplyTransition(w, start, result);
  if (!status->ok()) {
    if (IsTransient(*status)) return *status;
    w.DropEventsFrom(events);
    STORE_RETURN_IF_ERROR(w.Run("ROLLBACK TO start_next"));
  }
  return w.Run("RELEASE start_next");
}

}  // namespace

Store::Op Store::FinishOp(const FinishWrite& write, std::shared_ptr<FinishWriteResult> result) {
  Op op;
  op.apply = [&write, result](StoreWriter& w) -> absl::Status {
    *result = FinishWriteResult();
    // A batch riding with an end that carries the summary: its seq goes into the end's UPDATE
    // and its progress into the summary's (the same run and attempt: the coordinator built both).
    const bool ending = write.batch.has_value() && write.end.has_summary &&
                        write.end.run_id == write.batch->run_id &&
                        write.end.expected_attempt == write.batch->attempt;
    int64_t seq_for_end = 0;
    if (write.batch.has_value()) {
      STORE_RETURN_IF_ERROR(
          ApplyMetrics(w, *write.batch, &result->report, ending, &seq_for_end));
    }
    STORE_RETURN_IF_ERROR(ApplyTransition(w, write.end, &result->end, seq_for_end));
    if (write.start.has_value()) {
      STORE_RETURN_IF_ERROR(ApplyStart(w, *write.start, &result->start_status, &result->start));
    }
    result->more_start_status.resize(write.more_starts.size());
    result->more_starts.resize(write.more_starts.size());
    for (size_t i = 0; i < write.more_starts.size(); ++i) {
      STORE_RETURN_IF_ERROR(ApplyStart(w, write.more_starts[i], &result->more_start_status[i],
                                       &result->more_starts[i]));
    }
    return absl::OkStatus();
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
      [&name, &resources_json, id](StoreWriter& w) -> absl::Status {
        STORE_ASSIGN_OR_RETURN(stmt, w.Get("INSERT INTO workers (name, resources_json, "
                                           "registered_at, last_seen, state) VALUES (?1, ?2, ?3, "
                                           "?3, 'IDLE')"));
        stmt->Bind(1, name).Bind(2, resources_json.empty() ? "{}" : resources_json);
        stmt->Bind(3, w.Now());
        STORE_RETURN_IF_ERROR(stmt->Run());
        *id = sqlite3_last_insert_rowid(w.db());
        return InsertEvent(w, 0, 0, "worker_registered",
                           absl::StrCat("worker ", *id, " (", name, ") registered"));
      },
      2);
  if (!s.ok()) return s;
  return *id;
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
  op.apply = [worker_id, state](StoreWriter& w) -> absl::Status {
    STORE_ASSIGN_OR_RETURN(stmt, w.Get("UPDATE workers SET last_seen = ?2, state = ?3 "
                                       "WHERE id = ?1"));
    stmt->Bind(1, worker_id).Bind(2, w.Now()).Bind(3, state);
    return stmt->Run();
  };
  op.keep_on_transient = true;
  return Enqueue(std::move(op));
}

absl::Status Store::EnqueueWorkerGone(int64_t worker_id) {
  Op op;
  op.apply = [worker_id](StoreWriter& w) -> absl::Status {
    STORE_ASSIGN_OR_RETURN(stmt, w.Get("UPDATE workers SET state = 'GONE' WHERE id = ?1"));
    stmt->Bind(1, worker_id);
    return stmt->Run();
  };
  op.keep_on_transient = true;
  return Enqueue(std::move(op));
}

absl::Status Store::EnqueueCheckpoint(int64_t run_id, int32_t attempt, const std::string& path,
                                      int64_t step) {
  Op op;
  op.apply = [run_id, attempt, path, step](StoreWriter& w) -> absl::Status {
    STORE_ASSIGN_OR_RETURN(stmt, w.Get("UPDATE attempts SET checkpoint_path = ?3, "
                                       "checkpoint_step = ?4 WHERE run_id = ?1 AND attempt = ?2 "
                                       "AND checkpoint_step <= ?4"));
    stmt->Bind(1, run_id).Bind(2, attempt).Bind(3, path).Bind(4, step);
    return stmt->Run();
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
