// The SQL of each write of the store (store_internal.h): a sweep's submission, its state and its
// cancellation (tags and notes: annotation_writes.cc), a run's state transitions and a worker's
// Finish, metric batches with their evaluations and spikes, workers, checkpoints, and the batched
// event rows. Each runs on the writer's connection inside the flush transaction (writer.cc) and
// returns a transient error to abort the flush or any other error to fail its write alone.
#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "config/proto_yaml.h"
#include "config/run_state.h"
#include "nlohmann/json.hpp"
#include "orchestrator/store/reader.h"
#include "orchestrator/store/store_internal.h"

namespace ablate {
namespace store_internal {
namespace {

bool EdgeAllowed(RunState from, RunState to) {
  if (to == RUN_STATE_UNSPECIFIED || from == to) return false;
  switch (from) {
    case PENDING:  // STOPPED: a tuner's decision on a run held at a rung
      return to == RUNNING || to == CANCELLED || to == STOPPED;
    case RUNNING:  // STOPPED: a tuner's decision on a run training through its rungs
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
  j["counts"] =
      std::vector<int64_t>(p.gate_histogram().counts().begin(), p.gate_histogram().counts().end());
  return j.dump();
}

// A layer's per-head values as a JSON array; "" (stored NULL) when there are none.
std::string NumbersJson(const google::protobuf::RepeatedField<double>& values) {
  if (values.empty()) return "";
  return nlohmann::json(std::vector<double>(values.begin(), values.end())).dump();
}

// A layer's split by query class as a JSON array of {name, queries, first_token_attention,
// gate_mean}; "" when the data defines no classes.
std::string QueryClassesJson(const LayerProbes& p) {
  if (p.classes().empty()) return "";
  nlohmann::json j = nlohmann::json::array();
  for (const QueryClassProbes& c : p.classes()) {
    nlohmann::json one = {{"name", c.name()},
                          {"queries", c.queries()},
                          {"first_token_attention", c.first_token_attention()}};
    if (c.has_gate_mean()) one["gate_mean"] = c.gate_mean();
    j.push_back(std::move(one));
  }
  return j.dump();
}

// Probes.sink_rate at `index`, NULL when not measured.
void BindSinkRate(Stmt& stmt, int index, const Probes& p) {
  if (p.has_sink_rate()) {
    stmt.Bind(index, p.sink_rate());
  } else {
    stmt.BindNull(index);
  }
}

// Runs the statement `sql` once per element of `rows`, after `bind(stmt, row)`; prepares
// nothing when there are none.
template <typename Rows, typename Bind>
absl::Status RunForEach(StoreWriter& w, absl::string_view sql, const Rows& rows, Bind bind) {
  if (rows.empty()) return absl::OkStatus();
  STORE_ASSIGN_OR_RETURN(stmt, w.Get(sql));
  for (const auto& row : rows) {
    bind(*stmt, row);
    STORE_RETURN_IF_ERROR(stmt->Run());
  }
  return absl::OkStatus();
}

// Binds gate_score, m_act and f_attn from `first` on: NULL where the probe was not measured
// (no gate: no score, not a score of 0; a program that does not report M-Act or F-Attn).
void BindProbeMeans(Stmt& stmt, int first, const Probes& p) {
  const std::pair<bool, double> means[] = {{p.has_gate_score_mean(), p.gate_score_mean()},
                                           {p.has_m_act(), p.m_act()},
                                           {p.has_f_attn(), p.f_attn()}};
  for (int i = 0; i < 3; ++i) {
    if (means[i].first) {
      stmt.Bind(first + i, means[i].second);
    } else {
      stmt.BindNull(first + i);
    }
  }
}

// The per-item scores of `e`, each metric's replacing those of an earlier evaluation (an
// evaluation of an earlier step arriving late, as a resumed attempt's replay, changes nothing).
absl::Status UpsertEvalItems(StoreWriter& w, int64_t run_id, const EvalResult& e) {
  for (const EvalItemScores& scores : e.items()) {
    STORE_ASSIGN_OR_RETURN(
        latest, w.Get("SELECT coalesce(max(step), -1) FROM eval_items WHERE run_id = ?1 AND "
                      "name = ?2"));
    latest->Bind(1, run_id).Bind(2, scores.metric());
    STORE_ASSIGN_OR_RETURN(has_row, latest->Step());
    const int64_t stored = has_row ? latest->ColumnInt(0) : -1;
    latest->Reset();
    if (stored > e.step()) continue;
    STORE_ASSIGN_OR_RETURN(clear, w.Get("DELETE FROM eval_items WHERE run_id = ?1 AND name = ?2"));
    clear->Bind(1, run_id).Bind(2, scores.metric());
    STORE_RETURN_IF_ERROR(clear->Run());
    STORE_ASSIGN_OR_RETURN(
        insert, w.Get("INSERT INTO eval_items (run_id, name, item, step, value) VALUES (?1, ?2, "
                      "?3, ?4, ?5)"));
    for (int i = 0; i < scores.values_size(); ++i) {
      insert->Bind(1, run_id).Bind(2, scores.metric()).Bind(3, int64_t{i}).Bind(4, e.step());
      insert->Bind(5, static_cast<double>(scores.values(i)));
      STORE_RETURN_IF_ERROR(insert->Run());
    }
  }
  return absl::OkStatus();
}

absl::Status UpsertEval(StoreWriter& w, int64_t run_id, int32_t attempt, const EvalResult& e) {
  STORE_ASSIGN_OR_RETURN(
      stmt, w.Get("INSERT OR REPLACE INTO eval_metrics (run_id, step, attempt, val_loss, val_ppl, "
                  "gate_score, m_act, f_attn, tokens, eval_s, sink_rate) VALUES (?1, ?2, ?3, ?4, "
                  "?5, ?6, ?7, ?8, ?9, ?10, ?11)"));
  stmt->Bind(1, run_id).Bind(2, e.step()).Bind(3, attempt).Bind(4, e.val_loss());
  stmt->Bind(5, e.val_ppl());
  BindProbeMeans(*stmt, 6, e.probes());
  stmt->Bind(9, e.probes().tokens());
  if (e.eval_seconds() > 0) {
    stmt->Bind(10, e.eval_seconds());
  } else {
    stmt->BindNull(10);  // not measured (a program's evaluation, an older worker)
  }
  BindSinkRate(*stmt, 11, e.probes());
  STORE_RETURN_IF_ERROR(stmt->Run());
  STORE_RETURN_IF_ERROR(UpsertEvalItems(w, run_id, e));
  STORE_RETURN_IF_ERROR(RunForEach(
      w, "INSERT OR REPLACE INTO eval_values (run_id, step, name, value) VALUES (?1, ?2, ?3, ?4)",
      e.metrics(), [&](Stmt& value, const auto& named) {
        value.Bind(1, run_id).Bind(2, e.step()).Bind(3, named.first).Bind(4, named.second);
      }));
  STORE_ASSIGN_OR_RETURN(
      layer,
      w.Get("INSERT OR REPLACE INTO eval_layer_probes (run_id, step, layer, has_gate, "
            "gate_mean, gate_std, gate_min, gate_max, gate_histogram, attn_out_max_abs, "
            "attn_residual_max_abs, ffn_out_max_abs, ffn_residual_max_abs, "
            "first_token_attention, sparsity_before_gate_1e2, sparsity_before_gate_1e3, "
            "sparsity_after_gate_1e2, sparsity_after_gate_1e3, sparsity_mean_scaled_1e2, "
            "sparsity_mean_scaled_1e3, sdpa_mean_abs_before_gate, sdpa_mean_abs_after_gate, "
            "first_token_by_head, sink_window_by_head, query_classes) "
            "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, "
            "?17, ?18, ?19, ?20, ?21, ?22, NULLIF(?23, ''), NULLIF(?24, ''), NULLIF(?25, ''))"));
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
    layer->Bind(23, NumbersJson(p.first_token_attention_by_head()));
    layer->Bind(24, NumbersJson(p.sink_window_attention_by_head())).Bind(25, QueryClassesJson(p));
    STORE_RETURN_IF_ERROR(layer->Run());
  }
  STORE_RETURN_IF_ERROR(RunForEach(
      w,
      "INSERT OR REPLACE INTO eval_lengths (run_id, step, seq_len, yarn, val_loss, val_ppl) "
      "VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
      e.lengths(), [&](Stmt& length, const LengthEval& l) {
        length.Bind(1, run_id).Bind(2, e.step()).Bind(3, static_cast<int64_t>(l.seq_len()));
        length.Bind(4, l.yarn() ? 1 : 0).Bind(5, l.val_loss()).Bind(6, l.val_ppl());
      }));
  return RunForEach(
      w,
      "INSERT OR REPLACE INTO eval_attention_maps (run_id, step, layer, head, size, probs) "
      "VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
      e.attention_maps(), [&](Stmt& map, const AttentionMap& m) {
        map.Bind(1, run_id).Bind(2, e.step()).Bind(3, static_cast<int64_t>(m.layer()));
        map.Bind(4, static_cast<int64_t>(m.head())).Bind(5, static_cast<int64_t>(m.size()));
        map.BindBlob(6, m.probs());
      });
}

// ---- Multi-row inserts ----------------------------------------------------------------------

// Rows per multi-row INSERT: each statement run has a fixed cost (its program's setup and halt,
// a statement journal) that one row per statement paid again for every point of a batch.
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
// statement's earlier rows and needs no journal: copying the pages of every step row a batch
// writes was a cost paid on every report for a rollback that never comes.
//
// Step rows replace the rows of the steps they repeat (a resumed attempt, a rollback after a
// spike). Nearly every batch repeats none, so a batch goes in with OR FAIL first and, only when
// a step was there, again with OR REPLACE, which rewrites whatever the first try put in.
const MultiRowInsert& StepRowsInsert(bool replace) {
  static constexpr char kInto[] =
      " INTO step_metrics (run_id, step, attempt, loss, grad_norm, lr, tokens_per_s, aux_loss, "
      "skipped, elapsed_s)";
  static const auto* fail = new MultiRowInsert(absl::StrCat("INSERT OR FAIL", kInto), 10);
  static const auto* replacing = new MultiRowInsert(absl::StrCat("INSERT OR REPLACE", kInto), 10);
  return replace ? *replacing : *fail;
}

// Inserts b.steps[first, first + n) with `insert`.
absl::Status InsertStepRows(StoreWriter& w, const MultiRowInsert& insert, const MetricBatch& b,
                            size_t first, size_t n) {
  STORE_ASSIGN_OR_RETURN(stmt, w.Get(insert.Sql(n)));
  for (size_t i = 0; i < n; ++i) {
    const StepMetrics& m = b.steps[first + i];
    const int p = static_cast<int>(10 * i);
    stmt->Bind(p + 1, b.run_id).Bind(p + 2, m.step()).Bind(p + 3, b.attempt);
    stmt->Bind(p + 4, m.loss()).Bind(p + 5, m.grad_norm()).Bind(p + 6, m.lr());
    stmt->Bind(p + 7, m.tokens_per_s()).Bind(p + 8, m.aux_loss());
    stmt->Bind(p + 9, m.skipped() ? 1 : 0);
    if (m.elapsed_s() > 0) {
      stmt->Bind(p + 10, m.elapsed_s());
    } else {
      stmt->BindNull(p + 10);  // a worker from before elapsed_s
    }
  }
  return stmt->Run();
}

// ---- A sweep's submission -------------------------------------------------------------------

// Inserts the sweeps row and returns its id; AlreadyExists when a sweep has that name.
absl::StatusOr<int64_t> InsertSweep(StoreWriter& w, const SweepRecord& record, double now) {
  const ExpandedSweep& sweep = record.expanded;
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
  return sqlite3_last_insert_rowid(w.db());
}

// The sweep's variants in spec order, then any only the runs name; `first_run` gets the first
// run of each (which describes it).
std::vector<std::string> VariantNames(const ExpandedSweep& sweep,
                                      std::map<std::string, const RunSpec*>* first_run) {
  std::vector<std::string> names(sweep.variants().begin(), sweep.variants().end());
  for (const RunSpec& run : sweep.runs()) {
    if (first_run->emplace(run.variant(), &run).second &&
        std::find(names.begin(), names.end(), run.variant()) == names.end()) {
      names.push_back(run.variant());
    }
  }
  return names;
}

// One variants row per name, at its position; `variant_ids` gets each one's id.
absl::Status InsertVariants(StoreWriter& w, int64_t sweep_id, const std::vector<std::string>& names,
                            const std::map<std::string, const RunSpec*>& first_run,
                            std::map<std::string, int64_t>* variant_ids) {
  STORE_ASSIGN_OR_RETURN(
      variant, w.Get("INSERT INTO variants (sweep_id, name, position, description, model_json, "
                     "diff, params_total, params_activated, params_added, budget, "
                     "flops_per_token) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)"));
  for (size_t i = 0; i < names.size(); ++i) {
    variant->Bind(1, sweep_id).Bind(2, names[i]).Bind(3, static_cast<int64_t>(i));
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
    (*variant_ids)[names[i]] = sqlite3_last_insert_rowid(w.db());
  }
  return absl::OkStatus();
}

// The statements a submission runs for each of its runs, prepared once for all of them.
struct RunStatements {
  Stmt* run = nullptr;     // the runs row
  Stmt* config = nullptr;  // its run_configs row
  // Reuse: the first run of the same key that trained to SUCCEEDED, and a copy of its results.
  Stmt* source = nullptr;
  Stmt* reuse = nullptr;

  static absl::StatusOr<RunStatements> Prepare(StoreWriter& w) {
    RunStatements s;
    STORE_ASSIGN_OR_RETURN(
        run, w.Get("INSERT INTO runs (sweep_id, variant_id, run_index, run_key, seed, axes, "
                   "params_total, params_activated, params_added, flops_per_token, priority, "
                   "device, memory_gb, threads, created_at, steps_total, devices) VALUES (?1, ?2, "
                   "?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17)"));
    STORE_ASSIGN_OR_RETURN(config,
                           w.Get("INSERT INTO run_configs (run_id, config_json) VALUES (?1, ?2)"));
    STORE_ASSIGN_OR_RETURN(source,
                           w.Get("SELECT id FROM runs WHERE run_key = ?1 AND state = 'SUCCEEDED' "
                                 "AND reused_from IS NULL ORDER BY id LIMIT 1"));
    STORE_ASSIGN_OR_RETURN(
        reuse,
        w.Get("UPDATE runs SET (state, reused_from, reason, started_at, finished_at, steps_done, "
              "final_train_loss, val_loss, val_ppl, gate_score, m_act, f_attn, spike_steps, "
              "spike_score, tokens_per_s, wall_s, peak_memory_bytes, flops, sink_rate) = (SELECT "
              "'SUCCEEDED', s.id, 'reused run ' || s.id || ' (same run key ' || s.run_key || ')', "
              "?3, ?3, s.steps_done, s.final_train_loss, s.val_loss, s.val_ppl, s.gate_score, "
              "s.m_act, s.f_attn, s.spike_steps, s.spike_score, s.tokens_per_s, s.wall_s, "
              "s.peak_memory_bytes, s.flops, s.sink_rate FROM runs s WHERE s.id = ?2) "
              "WHERE id = ?1"));
    s.run = run;
    s.config = config;
    s.source = source;
    s.reuse = reuse;
    return s;
  }
};

// Inserts the runs row of `run` (PENDING) and its config; returns the run's id.
absl::StatusOr<int64_t> InsertRun(StoreWriter& w, const RunStatements& s,
                                  const ExpandedSweep& sweep, const RunSpec& run, int64_t sweep_id,
                                  int64_t variant_id, const std::string& config_json, double now) {
  Stmt& stmt = *s.run;
  stmt.Bind(1, sweep_id).Bind(2, variant_id).Bind(3, run.index());
  stmt.Bind(4, run.run_key()).Bind(5, static_cast<int64_t>(run.seed()));
  stmt.Bind(6, AxesText(run));
  stmt.Bind(7, run.params().total()).Bind(8, run.params().activated());
  stmt.Bind(9, run.added_params()).Bind(10, run.flops_per_token());
  stmt.Bind(11, run.priority() != 0 ? run.priority() : sweep.priority());
  const std::string device =
      run.resources().device().empty() ? std::string("cpu") : run.resources().device();
  stmt.Bind(12, device).Bind(13, run.resources().memory_gb());
  stmt.Bind(14, run.resources().threads()).Bind(15, now);
  stmt.Bind(16, run.config().train().steps());
  stmt.Bind(17, static_cast<int64_t>(std::max(1, run.resources().devices())));
  STORE_RETURN_IF_ERROR(stmt.Run());
  const int64_t run_id = sqlite3_last_insert_rowid(w.db());
  s.config->Bind(1, run_id).Bind(2, config_json);
  STORE_RETURN_IF_ERROR(s.config->Run());
  return run_id;
}

// The run that a run of `run_key` may reuse, 0 if none.
absl::StatusOr<int64_t> FindReusable(const RunStatements& s, const std::string& run_key) {
  s.source->Bind(1, run_key);
  STORE_ASSIGN_OR_RETURN(found, s.source->Step());
  const int64_t source = found ? s.source->ColumnInt(0) : 0;
  s.source->Reset();
  return source;
}

// Stores `run_id` SUCCEEDED with the results of `source`, with its event.
absl::Status ReuseRun(StoreWriter& w, const RunStatements& s, int64_t sweep_id, int64_t run_id,
                      int64_t source, double now) {
  s.reuse->Bind(1, run_id).Bind(2, source).Bind(3, now);
  STORE_RETURN_IF_ERROR(s.reuse->Run());
  return InsertEvent(w, sweep_id, run_id, "run_state",
                     absl::StrCat("run ", run_id, ": PENDING -> SUCCEEDED: reused run ", source),
                     "SUCCEEDED");
}

// ---- A run's transitions --------------------------------------------------------------------

// A run's row as a transition finds it.
struct RunAtTransition {
  RunState state = RUN_STATE_UNSPECIFIED;
  int32_t attempt = 0;
  int64_t sweep_id = 0;
};

absl::StatusOr<RunAtTransition> ReadRunAtTransition(StoreWriter& w, int64_t run_id) {
  STORE_ASSIGN_OR_RETURN(read, w.Get("SELECT state, attempts, sweep_id FROM runs WHERE id = ?1"));
  read->Bind(1, run_id);
  STORE_ASSIGN_OR_RETURN(found, read->Step());
  if (!found) {
    read->Reset();
    return absl::NotFoundError(absl::StrCat("store: no run ", run_id));
  }
  RunAtTransition run;
  run.state = ParseRunState(read->ColumnText(0));
  run.attempt = static_cast<int32_t>(read->ColumnInt(1));
  run.sweep_id = read->ColumnInt(2);
  read->Reset();
  return run;
}

// The compare-and-set, the edge and the expected attempt of `t` against the run as it is.
absl::Status CheckTransition(const RunTransition& t, const RunAtTransition& run) {
  if (std::find(t.from.begin(), t.from.end(), run.state) == t.from.end()) {
    std::vector<std::string> expected;
    for (RunState s : t.from) expected.push_back(RunStateName(s));
    return absl::FailedPreconditionError(
        absl::StrCat("store: run ", t.run_id, " is ", RunStateName(run.state), ", not ",
                     expected.empty() ? "(none given)" : absl::StrJoin(expected, " or ")));
  }
  if (!EdgeAllowed(run.state, t.to)) {
    return absl::InvalidArgumentError(absl::StrCat("store: run ", t.run_id, " cannot go from ",
                                                   RunStateName(run.state), " to ",
                                                   RunStateName(t.to)));
  }
  if (t.expected_attempt > 0 && run.attempt != t.expected_attempt) {
    return absl::FailedPreconditionError(absl::StrCat("store: run ", t.run_id, " is on attempt ",
                                                      run.attempt, ", not ", t.expected_attempt));
  }
  return absl::OkStatus();
}

// Ends the run's current attempt `attempt` as `t` says.
absl::Status EndAttempt(StoreWriter& w, const RunTransition& t, int32_t attempt, double now,
                        int64_t report_seq) {
  STORE_ASSIGN_OR_RETURN(end, w.Get("UPDATE attempts SET state = ?3, ended_at = ?4, "
                                    "reason = ?5, report_seq = max(report_seq, ?6) "
                                    "WHERE run_id = ?1 AND attempt = ?2"));
  end->Bind(1, t.run_id).Bind(2, attempt);
  end->Bind(3, t.attempt_end.empty() ? RunStateName(t.to) : t.attempt_end);
  end->Bind(4, now).Bind(5, t.reason).Bind(6, report_seq);
  return end->Run();
}

// Starts attempt `attempt` of the run on t.worker_id: the attempts row and the run RUNNING.
absl::Status StartAttempt(StoreWriter& w, const RunTransition& t, int32_t attempt, double now) {
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
  return run->Run();
}

// Moves the run to t.to (not RUNNING) without a summary.
absl::Status SetRunState(StoreWriter& w, const RunTransition& t, double now) {
  STORE_ASSIGN_OR_RETURN(run, w.Get("UPDATE runs SET state = ?2, reason = ?3, finished_at = ?4, "
                                    "attempt_base = CASE WHEN ?5 THEN attempts ELSE "
                                    "attempt_base END WHERE id = ?1"));
  run->Bind(1, t.run_id).Bind(2, RunStateName(t.to)).Bind(3, t.reason);
  if (RunEnded(t.to)) run->Bind(4, now);
  run->Bind(5, static_cast<int64_t>(t.rebase_attempts));
  return run->Run();
}

// The run's params columns from the counts its trainer reported, where expand left them empty
// (a program without program.count); counts from expand are never replaced.
absl::Status FillParams(StoreWriter& w, int64_t run_id, const ParamCount& p) {
  if (p.total() <= 0) return absl::OkStatus();
  STORE_ASSIGN_OR_RETURN(fill, w.Get("UPDATE runs SET params_total = ?2, params_activated = ?3 "
                                     "WHERE id = ?1 AND coalesce(params_total, 0) = 0"));
  fill->Bind(1, run_id).Bind(2, p.total()).Bind(3, p.activated() > 0 ? p.activated() : p.total());
  return fill->Run();
}

// Moves the run to t.to (not RUNNING) with t.summary, its final results; the final evaluation
// is stored under attempt `attempt`.
absl::Status SetRunStateWithSummary(StoreWriter& w, const RunTransition& t, int32_t attempt,
                                    double now) {
  // The end and the summary in one UPDATE: SQLite rewrites the whole row for each.
  const RunSummary& s = t.summary;
  STORE_ASSIGN_OR_RETURN(
      run, w.Get("UPDATE runs SET state = ?2, finished_at = ?4, steps_done = ?5, "
                 "final_train_loss = ?6, val_loss = ?7, val_ppl = ?8, gate_score = ?9, "
                 "m_act = ?10, f_attn = ?11, spike_steps = ?12, spike_score = ?13, "
                 "tokens_per_s = ?14, wall_s = ?15, "
                 "reason = CASE WHEN ?16 = '' THEN ?3 ELSE ?16 END, "
                 "peak_memory_bytes = ?17, flops = ?18, sink_rate = ?19 WHERE id = ?1"));
  run->Bind(1, t.run_id).Bind(2, RunStateName(t.to)).Bind(3, t.reason);
  if (RunEnded(t.to)) run->Bind(4, now);
  run->Bind(5, s.steps_done()).Bind(6, s.final_train_loss());
  if (s.has_final_eval()) {
    const EvalResult& e = s.final_eval();
    run->Bind(7, e.val_loss()).Bind(8, e.val_ppl());
    BindProbeMeans(*run, 9, e.probes());
    BindSinkRate(*run, 19, e.probes());
  }
  run->Bind(12, s.spike_steps()).Bind(13, s.spike_score()).Bind(14, s.tokens_per_s());
  run->Bind(15, s.wall_s()).Bind(16, s.reason());
  if (s.peak_memory_bytes() > 0) run->Bind(17, s.peak_memory_bytes());  // else NULL: unknown
  if (s.flops() > 0) run->Bind(18, s.flops());
  STORE_RETURN_IF_ERROR(run->Run());
  STORE_RETURN_IF_ERROR(FillParams(w, t.run_id, s.params()));
  if (s.has_final_eval() && s.final_eval().step() > 0) {
    STORE_RETURN_IF_ERROR(UpsertEval(w, t.run_id, attempt, s.final_eval()));
  }
  return absl::OkStatus();
}

// The sweep is DONE when nothing of it is left to run; a requeued run makes it ACTIVE again.
// Called only for a run that entered or left a terminal state, the only transitions that can
// change that.
}  // namespace

absl::Status SettleSweepState(StoreWriter& w, int64_t sweep_id, double now) {
  // One statement: whether anything of the sweep is left to run, evaluated once (it does not
  // depend on the sweeps row), and the sweep's state set from it where it differs. A probe and
  // an UPDATE of their own would cost a statement more per dispatched job. EXISTS, not
  // count(*): it stops at the first index entry, where a count walks every queued run of the
  // sweep. Three probes, not `state IN (...)`: SQLite builds a temporary b-tree of an IN list of
  // three names or more on every execution. A boundary sweep's open bracket (a stability
  // bisection that has another probe to add) keeps it ACTIVE: one primary-key probe more.
  STORE_ASSIGN_OR_RETURN(
      settle,
      w.Get("UPDATE sweeps SET state = CASE state WHEN 'ACTIVE' THEN 'DONE' ELSE 'ACTIVE' END, "
            "finished_at = CASE state WHEN 'ACTIVE' THEN ?2 ELSE NULL END "
            "WHERE id = ?1 AND state = CASE WHEN "
            "EXISTS (SELECT 1 FROM runs WHERE sweep_id = ?1 AND state = 'PENDING') OR "
            "EXISTS (SELECT 1 FROM runs WHERE sweep_id = ?1 AND state = 'RUNNING') OR "
            "EXISTS (SELECT 1 FROM runs WHERE sweep_id = ?1 AND state = 'INTERRUPTED') OR "
            "EXISTS (SELECT 1 FROM tune_brackets WHERE sweep_id = ?1 AND state = 'OPEN') "
            "THEN 'DONE' ELSE 'ACTIVE' END RETURNING state"));
  settle->Bind(1, sweep_id).Bind(2, now);
  // A row back: the state changed, to the one it returns (an event, which alerts follow).
  absl::StatusOr<bool> changed = settle->Step();
  std::string state = changed.ok() && *changed ? settle->ColumnText(0) : "";
  settle->Reset();
  if (!changed.ok()) return changed.status();
  if (state.empty()) return absl::OkStatus();
  return InsertEvent(w, sweep_id, 0, "sweep_state", absl::StrCat("sweep ", sweep_id, " is ", state),
                     state);
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

absl::StatusOr<int64_t> InsertRunRow(StoreWriter& w, const ExpandedSweep& sweep, const RunSpec& run,
                                     int64_t sweep_id, int64_t variant_id,
                                     const std::string& config_json, double now) {
  STORE_ASSIGN_OR_RETURN(statements, RunStatements::Prepare(w));
  return InsertRun(w, statements, sweep, run, sweep_id, variant_id, config_json, now);
}

absl::Status InsertEvent(StoreWriter& w, int64_t sweep_id, int64_t run_id, std::string kind,
                         std::string message, std::string state) {
  w.AddEvent(sweep_id, run_id, std::move(kind), std::move(message), std::move(state));
  return absl::OkStatus();
}

// ---- Sweeps ---------------------------------------------------------------------------------

absl::Status ApplyCreateSweep(StoreWriter& w, const SweepRecord& record,
                              const std::vector<std::string>& config_json, SweepIds* ids) {
  const ExpandedSweep& sweep = record.expanded;
  const double now = w.Now();
  STORE_ASSIGN_OR_RETURN(sweep_id, InsertSweep(w, record, now));
  ids->sweep_id = sweep_id;
  if (!record.program.code_hash().empty()) {
    STORE_ASSIGN_OR_RETURN(
        code, w.Get("INSERT INTO program_code (code_hash, snapshot, files, bytes, created_at) "
                    "VALUES (?1, ?2, ?3, ?4, ?5) ON CONFLICT (code_hash) DO NOTHING"));
    const std::string bytes = record.program.SerializeAsString();
    code->Bind(1, record.program.code_hash()).BindBlob(2, bytes);
    code->Bind(3, static_cast<int64_t>(record.program.files_size()));
    code->Bind(4, static_cast<int64_t>(bytes.size())).Bind(5, now);
    STORE_RETURN_IF_ERROR(code->Run());
  }
  std::map<std::string, const RunSpec*> first_run;
  const std::vector<std::string> names = VariantNames(sweep, &first_run);
  std::map<std::string, int64_t> variant_ids;
  STORE_RETURN_IF_ERROR(InsertVariants(w, sweep_id, names, first_run, &variant_ids));

  STORE_ASSIGN_OR_RETURN(statements, RunStatements::Prepare(w));
  if (sweep.has_tune()) STORE_RETURN_IF_ERROR(InsertTune(w, sweep_id, sweep.tune()));
  int reused = 0;
  for (int i = 0; i < sweep.runs_size(); ++i) {
    const RunSpec& run = sweep.runs(i);
    STORE_ASSIGN_OR_RETURN(run_id, InsertRun(w, statements, sweep, run, sweep_id,
                                             variant_ids[run.variant()], config_json[i], now));
    ids->run_ids.push_back(run_id);
    if (sweep.has_tune()) STORE_RETURN_IF_ERROR(InsertTuneRows(w, sweep, sweep_id, run_id, run));
    int64_t source = 0;
    if (record.reuse) {
      STORE_ASSIGN_OR_RETURN(found, FindReusable(statements, run.run_key()));
      source = found;
    }
    ids->reused_from.push_back(source);
    if (source == 0) continue;
    STORE_RETURN_IF_ERROR(ReuseRun(w, statements, sweep_id, run_id, source, now));
    ++reused;
  }
  if (reused == sweep.runs_size()) {  // nothing left to run
    STORE_ASSIGN_OR_RETURN(done, w.Get("UPDATE sweeps SET state = 'DONE', finished_at = ?2 "
                                       "WHERE id = ?1"));
    done->Bind(1, sweep_id).Bind(2, now);
    STORE_RETURN_IF_ERROR(done->Run());
    STORE_RETURN_IF_ERROR(InsertEvent(w, sweep_id, 0, "sweep_state",
                                      absl::StrCat("sweep ", sweep_id, " is DONE"), "DONE"));
  }
  return InsertEvent(w, sweep_id, 0, "sweep_submitted",
                     absl::StrCat("sweep ", sweep.name(), " submitted: ", sweep.runs_size(),
                                  " runs, ", names.size(), " variants",
                                  reused > 0 ? absl::StrCat(", ", reused, " reused") : ""));
}

absl::Status ApplySetSweepState(StoreWriter& w, int64_t sweep_id, const std::string& state) {
  STORE_ASSIGN_OR_RETURN(stmt, w.Get("UPDATE sweeps SET state = ?2, finished_at = CASE WHEN "
                                     "?2 = 'ACTIVE' THEN NULL ELSE ?3 END WHERE id = ?1"));
  stmt->Bind(1, sweep_id).Bind(2, state).Bind(3, w.Now());
  STORE_RETURN_IF_ERROR(stmt->Run());
  if (sqlite3_changes(w.db()) == 0) {
    return absl::NotFoundError(absl::StrCat("store: no sweep ", sweep_id));
  }
  return InsertEvent(w, sweep_id, 0, "sweep_state", absl::StrCat("sweep ", sweep_id, " is ", state),
                     state);
}

absl::Status ApplyCancelSweep(StoreWriter& w, int64_t sweep_id, SweepCancellation* result) {
  STORE_ASSIGN_OR_RETURN(stmt, w.Get("UPDATE sweeps SET state = 'CANCELLED', finished_at = "
                                     "?2 WHERE id = ?1"));
  stmt->Bind(1, sweep_id).Bind(2, w.Now());
  STORE_RETURN_IF_ERROR(stmt->Run());
  if (sqlite3_changes(w.db()) == 0) {
    return absl::NotFoundError(absl::StrCat("store: no sweep ", sweep_id));
  }
  STORE_RETURN_IF_ERROR(InsertEvent(w, sweep_id, 0, "sweep_state",
                                    absl::StrCat("sweep ", sweep_id, " is CANCELLED"),
                                    "CANCELLED"));
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
    (list->ColumnText(1) == "RUNNING" ? result->running : unstarted).push_back(list->ColumnInt(0));
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
}

// ---- Runs -----------------------------------------------------------------------------------

absl::Status ApplyTransition(StoreWriter& w, const RunTransition& t, TransitionResult* result,
                             int64_t report_seq) {
  STORE_ASSIGN_OR_RETURN(run, ReadRunAtTransition(w, t.run_id));
  result->previous = run.state;
  STORE_RETURN_IF_ERROR(CheckTransition(t, run));
  const double now = w.Now();
  int32_t attempt = run.attempt;
  if (run.state == RUNNING && attempt > 0) {
    STORE_RETURN_IF_ERROR(EndAttempt(w, t, attempt, now, report_seq));
  }
  if (t.to == RUNNING) {
    ++attempt;
    STORE_RETURN_IF_ERROR(StartAttempt(w, t, attempt, now));
  } else if (!t.has_summary) {
    STORE_RETURN_IF_ERROR(SetRunState(w, t, now));
  } else {
    STORE_RETURN_IF_ERROR(SetRunStateWithSummary(w, t, attempt, now));
  }
  if (t.tune_hold) {
    STORE_ASSIGN_OR_RETURN(hold, w.Get("UPDATE tune_runs SET held = 1 WHERE run_id = ?1"));
    hold->Bind(1, t.run_id);
    STORE_RETURN_IF_ERROR(hold->Run());
  }
  std::string message = absl::StrCat("run ", t.run_id, ": ", RunStateName(run.state), " -> ",
                                     RunStateName(t.to), " (attempt ", attempt, ")");
  if (!t.reason.empty()) absl::StrAppend(&message, ": ", t.reason);
  STORE_RETURN_IF_ERROR(
      InsertEvent(w, run.sweep_id, t.run_id, "run_state", message, RunStateName(t.to)));
  // Only a run entering or leaving a terminal state can change the sweep's: a start (PENDING ->
  // RUNNING) or the requeue of an interrupted run skips the check.
  if (RunEnded(run.state) != RunEnded(t.to)) {
    STORE_RETURN_IF_ERROR(SettleSweepState(w, run.sweep_id, now));
  }
  result->attempt = attempt;
  return absl::OkStatus();
}

absl::Status ApplyFinish(StoreWriter& w, const FinishWrite& write, FinishWriteResult* result) {
  // A batch riding with an end that carries the summary: its seq goes into the end's UPDATE
  // and its progress into the summary's (the same run and attempt: the coordinator built both).
  const bool ending = write.batch.has_value() && write.end.has_summary &&
                      write.end.run_id == write.batch->run_id &&
                      write.end.expected_attempt == write.batch->attempt;
  int64_t seq_for_end = 0;
  if (write.batch.has_value()) {
    STORE_RETURN_IF_ERROR(ApplyMetrics(w, *write.batch, &result->report, ending, &seq_for_end));
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
}

// ---- Metrics --------------------------------------------------------------------------------

absl::Status ApplyMetrics(StoreWriter& w, const MetricBatch& b, ReportResult* result, bool ending,
                          int64_t* seq_for_end) {
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
  if (b.params.has_value()) STORE_RETURN_IF_ERROR(FillParams(w, b.run_id, *b.params));
  STORE_RETURN_IF_ERROR(RunForEach(
      w,
      "INSERT OR IGNORE INTO spike_events (run_id, attempt, step, signal, value, baseline, kind, "
      "action, rollback_to_step) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
      b.spikes, [&b](Stmt& stmt, const SpikeEvent& s) {
        stmt.Bind(1, b.run_id).Bind(2, b.attempt).Bind(3, s.step()).Bind(4, s.signal());
        stmt.Bind(5, s.value()).Bind(6, s.baseline()).Bind(7, SpikeKind_Name(s.kind()));
        stmt.Bind(8, SpikeAction_Name(s.action())).Bind(9, s.rollback_to_step());
      }));
  if (ending) {
    *seq_for_end = b.seq;
    return absl::OkStatus();
  }
  STORE_ASSIGN_OR_RETURN(seq, w.Get("UPDATE attempts SET report_seq = ?3 "
                                    "WHERE run_id = ?1 AND attempt = ?2"));
  seq->Bind(1, b.run_id).Bind(2, b.attempt).Bind(3, b.seq);
  STORE_RETURN_IF_ERROR(seq->Run());
  if (max_step > 0) {
    STORE_ASSIGN_OR_RETURN(progress,
                           w.Get("UPDATE runs SET steps_done = max(steps_done, ?2) WHERE id = ?1"));
    progress->Bind(1, b.run_id).Bind(2, max_step);
    STORE_RETURN_IF_ERROR(progress->Run());
  }
  return absl::OkStatus();
}

// ---- Workers and checkpoints ----------------------------------------------------------------

absl::Status ApplyRegisterWorker(StoreWriter& w, const std::string& name,
                                 const std::string& resources_json, int64_t* id) {
  STORE_ASSIGN_OR_RETURN(stmt, w.Get("INSERT INTO workers (name, resources_json, "
                                     "registered_at, last_seen, state) VALUES (?1, ?2, ?3, "
                                     "?3, 'IDLE')"));
  stmt->Bind(1, name).Bind(2, resources_json.empty() ? "{}" : resources_json);
  stmt->Bind(3, w.Now());
  STORE_RETURN_IF_ERROR(stmt->Run());
  *id = sqlite3_last_insert_rowid(w.db());
  return InsertEvent(w, 0, 0, "worker_registered",
                     absl::StrCat("worker ", *id, " (", name, ") registered"));
}

absl::Status ApplyHeartbeat(StoreWriter& w, int64_t worker_id, const std::string& state) {
  STORE_ASSIGN_OR_RETURN(stmt, w.Get("UPDATE workers SET last_seen = ?2, state = ?3 "
                                     "WHERE id = ?1"));
  stmt->Bind(1, worker_id).Bind(2, w.Now()).Bind(3, state);
  return stmt->Run();
}

absl::Status ApplyWorkerGone(StoreWriter& w, int64_t worker_id) {
  STORE_ASSIGN_OR_RETURN(stmt, w.Get("UPDATE workers SET state = 'GONE' WHERE id = ?1"));
  stmt->Bind(1, worker_id);
  return stmt->Run();
}

absl::Status ApplyCheckpoint(StoreWriter& w, int64_t run_id, int32_t attempt,
                             const std::string& path, int64_t step) {
  STORE_ASSIGN_OR_RETURN(stmt, w.Get("UPDATE attempts SET checkpoint_path = ?3, "
                                     "checkpoint_step = ?4 WHERE run_id = ?1 AND attempt = ?2 "
                                     "AND checkpoint_step <= ?4"));
  stmt->Bind(1, run_id).Bind(2, attempt).Bind(3, path).Bind(4, step);
  return stmt->Run();
}

}  // namespace store_internal

// ---- Events ---------------------------------------------------------------------------------

absl::Status StoreWriter::FlushEvents() {
  using store_internal::kRowsPerInsert;
  // OR FAIL: no statement journal (StepRowsInsert).
  static const auto* insert = new store_internal::MultiRowInsert(
      "INSERT OR FAIL INTO events (time, sweep_id, run_id, kind, message, state)", 6);
  for (size_t first = 0; first < events_.size(); first += kRowsPerInsert) {
    const size_t n = std::min(events_.size() - first, kRowsPerInsert);
    STORE_ASSIGN_OR_RETURN(stmt, Get(insert->Sql(n)));
    for (size_t i = 0; i < n; ++i) {
      const PendingEvent& e = events_[first + i];
      const int p = static_cast<int>(6 * i);
      stmt->Bind(p + 1, e.time);
      if (e.sweep_id != 0) stmt->Bind(p + 2, e.sweep_id);
      if (e.run_id != 0) stmt->Bind(p + 3, e.run_id);
      stmt->Bind(p + 4, e.kind).Bind(p + 5, e.message);
      if (!e.state.empty()) stmt->Bind(p + 6, e.state);
    }
    STORE_RETURN_IF_ERROR(stmt->Run());
  }
  events_.clear();
  return absl::OkStatus();
}

}  // namespace ablate
