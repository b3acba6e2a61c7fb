// StoreReader's reads of training output: a run's step metrics (downsampled on the server,
// spikes and the last point always kept), its evaluations with their lengths, per-layer probes and
// attention maps, its spike events; and per sweep, every run's latest step, overlay curves,
// spikes and last evaluation. A reused run (RunInfo::reused_from) reads as its source.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"
#include "orchestrator/store/reader.h"
#include "orchestrator/store/reader_internal.h"
#include "orchestrator/store/sqlite.h"

namespace ablate {

using reader_internal::kSpikeColumns;
using reader_internal::ReadSpike;
using reader_internal::ReadSweepSpike;

namespace {

// In the per-run series reads: the run whose rows hold run ?1's data (its source, when reused).
constexpr char kSourceRun[] = "(SELECT coalesce(reused_from, id) FROM runs WHERE id = ?1)";

constexpr char kLayerColumns[] =
    "step, layer, has_gate, gate_mean, gate_std, gate_min, gate_max, gate_histogram, "
    "attn_out_max_abs, attn_residual_max_abs, ffn_out_max_abs, ffn_residual_max_abs, "
    "first_token_attention, sparsity_before_gate_1e2, sparsity_before_gate_1e3, "
    "sparsity_after_gate_1e2, sparsity_after_gate_1e3, sparsity_mean_scaled_1e2, "
    "sparsity_mean_scaled_1e3, sdpa_mean_abs_before_gate, sdpa_mean_abs_after_gate, "
    "first_token_by_head, sink_window_by_head, query_classes "
    "FROM eval_layer_probes";

// A JSON array of numbers as stored (first_token_by_head, sink_window_by_head); "" or NULL: none.
template <typename Add>
void ReadNumbers(const std::string& text, Add add) {
  if (text.empty()) return;
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_array()) return;
  for (const auto& v : j) add(v.is_number() ? v.get<double>() : 0.0);
}

// An eval_metrics row: step, val_loss, val_ppl, gate_score, m_act, f_attn, tokens, from column
// `first` on.
void ReadEval(const Stmt& s, int first, EvalResult* e) {
  e->set_step(s.ColumnInt(first));
  e->set_val_loss(s.ColumnDouble(first + 1));
  e->set_val_ppl(s.ColumnDouble(first + 2));
  if (!s.ColumnIsNull(first + 3)) {
    e->mutable_probes()->set_gate_score_mean(s.ColumnDouble(first + 3));  // NULL: no gate
  }
  // NULL: not measured (a program that does not report them).
  if (!s.ColumnIsNull(first + 4)) e->mutable_probes()->set_m_act(s.ColumnDouble(first + 4));
  if (!s.ColumnIsNull(first + 5)) e->mutable_probes()->set_f_attn(s.ColumnDouble(first + 5));
  e->mutable_probes()->set_tokens(s.ColumnInt(first + 6));
  if (!s.ColumnIsNull(first + 7)) e->mutable_probes()->set_sink_rate(s.ColumnDouble(first + 7));
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
  ReadNumbers(s.ColumnText(21), [&](double v) { p.add_first_token_attention_by_head(v); });
  ReadNumbers(s.ColumnText(22), [&](double v) { p.add_sink_window_attention_by_head(v); });
  const std::string classes = s.ColumnText(23);
  if (!classes.empty()) {
    const nlohmann::json j = nlohmann::json::parse(classes, nullptr, /*allow_exceptions=*/false);
    if (j.is_array()) {
      for (const auto& c : j) {
        if (!c.is_object()) continue;
        QueryClassProbes* q = p.add_classes();
        q->set_name(c.value("name", ""));
        q->set_queries(c.value("queries", int64_t{0}));
        q->set_first_token_attention(c.value("first_token_attention", 0.0));
        if (c.contains("gate_mean") && c["gate_mean"].is_number())
          q->set_gate_mean(c["gate_mean"].get<double>());
      }
    }
  }
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

StepMetrics ReadStep(const Stmt& s) {
  StepMetrics m;
  m.set_step(s.ColumnInt(0));
  m.set_loss(s.ColumnDouble(1));
  m.set_grad_norm(s.ColumnDouble(2));
  m.set_lr(s.ColumnDouble(3));
  m.set_tokens_per_s(s.ColumnDouble(4));
  m.set_aux_loss(s.ColumnDouble(5));
  m.set_skipped(s.ColumnInt(6) != 0);
  if (!s.ColumnIsNull(7)) m.set_elapsed_s(s.ColumnDouble(7));
  return m;
}

AttentionMap ReadAttentionMap(const Stmt& s) {
  AttentionMap m;
  m.set_layer(static_cast<int32_t>(s.ColumnInt(0)));
  m.set_head(static_cast<int32_t>(s.ColumnInt(1)));
  m.set_size(static_cast<int32_t>(s.ColumnInt(2)));
  m.set_probs(s.ColumnBlob(3));
  return m;
}

}  // namespace

absl::StatusOr<std::vector<StepMetrics>> StoreReader::MetricSeries(
    int64_t run_id, const SeriesOptions& options) const {
  absl::StatusOr<std::vector<StepMetrics>> points = ReadRows<StepMetrics>(
      absl::StrCat("SELECT step, loss, grad_norm, lr, tokens_per_s, aux_loss, skipped, "
                   "elapsed_s FROM step_metrics WHERE run_id = ",
                   kSourceRun, " AND step BETWEEN ?2 AND ?3 ORDER BY step"),
      [&](Stmt& q) { q.Bind(1, run_id).Bind(2, options.from_step).Bind(3, options.to_step); },
      ReadStep);
  if (!points.ok()) return points.status();
  std::set<int64_t> spikes;
  if (absl::Status read = ForEachRow(
          absl::StrCat("SELECT DISTINCT step FROM spike_events WHERE run_id = ", kSourceRun,
                       " AND step BETWEEN ?2 AND ?3"),
          [&](Stmt& q) { q.Bind(1, run_id).Bind(2, options.from_step).Bind(3, options.to_step); },
          [&](const Stmt& s) { spikes.insert(s.ColumnInt(0)); });
      !read.ok()) {
    return read;
  }
  std::vector<size_t> keep = DownsampleIndexes(*points, spikes, options);
  if (keep.size() == points->size()) return points;
  std::vector<StepMetrics> out;
  out.reserve(keep.size());
  for (size_t i : keep) out.push_back(std::move((*points)[i]));
  return out;
}

absl::StatusOr<std::vector<EvalResult>> StoreReader::EvalSeries(int64_t run_id,
                                                                bool with_layers) const {
  absl::StatusOr<std::vector<EvalResult>> read_evals = ReadRows<EvalResult>(
      absl::StrCat("SELECT step, val_loss, val_ppl, gate_score, m_act, f_attn, tokens, sink_rate "
                   "FROM eval_metrics WHERE run_id = ",
                   kSourceRun, " ORDER BY step"),
      [&](Stmt& q) { q.Bind(1, run_id); },
      [](const Stmt& s) {
        EvalResult e;
        ReadEval(s, 0, &e);
        return e;
      });
  if (!read_evals.ok()) return read_evals.status();
  std::vector<EvalResult> evals = *std::move(read_evals);
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
  // The metrics by name (train.evals', a program's) and what each evaluation took.
  at = 0;
  if (absl::Status read = ForEachRow(
          absl::StrCat("SELECT step, name, value FROM eval_values WHERE run_id = ", kSourceRun,
                       " AND value IS NOT NULL ORDER BY step"),
          [&](Stmt& q) { q.Bind(1, run_id); },
          [&](const Stmt& s) {
            const int64_t step = s.ColumnInt(0);
            while (at < evals.size() && evals[at].step() < step) ++at;
            if (at == evals.size() || evals[at].step() != step) return;
            (*evals[at].mutable_metrics())[s.ColumnText(1)] = s.ColumnDouble(2);
          });
      !read.ok()) {
    return read;
  }
  at = 0;
  if (absl::Status read = ForEachRow(
          absl::StrCat("SELECT step, eval_s FROM eval_metrics WHERE run_id = ", kSourceRun,
                       " AND eval_s IS NOT NULL ORDER BY step"),
          [&](Stmt& q) { q.Bind(1, run_id); },
          [&](const Stmt& s) {
            const int64_t step = s.ColumnInt(0);
            while (at < evals.size() && evals[at].step() < step) ++at;
            if (at < evals.size() && evals[at].step() == step) {
              evals[at].set_eval_seconds(s.ColumnDouble(1));
            }
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
  return ReadRows<LayerProbes>(
      absl::StrCat("SELECT ", kLayerColumns, " WHERE run_id = ", kSourceRun,
                   " AND step = ?2 ORDER BY layer"),
      [&](Stmt& q) { q.Bind(1, run_id).Bind(2, step); }, ReadLayer);
}

absl::StatusOr<std::vector<AttentionMap>> StoreReader::AttentionMapsAt(int64_t run_id,
                                                                      int64_t step) const {
  return ReadRows<AttentionMap>(
      absl::StrCat("SELECT layer, head, size, probs FROM eval_attention_maps WHERE run_id = ",
                   kSourceRun, " AND step = ?2 ORDER BY layer, head"),
      [&](Stmt& q) { q.Bind(1, run_id).Bind(2, step); }, ReadAttentionMap);
}

absl::StatusOr<std::vector<SpikeEvent>> StoreReader::SpikeEvents(int64_t run_id) const {
  return ReadRows<SpikeEvent>(
      absl::StrCat("SELECT ", kSpikeColumns, " FROM spike_events s WHERE s.run_id = ", kSourceRun,
                   " ORDER BY s.step, s.id"),
      [&](Stmt& q) { q.Bind(1, run_id); }, [](const Stmt& r) { return ReadSpike(r, 0); });
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
StoreReader::SweepCurves(int64_t sweep_id, CurveMetric metric, int64_t every,
                         std::map<int64_t, std::vector<double>>* elapsed) const {
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
      "SELECT r.id, m.step, m.", column, ", m.elapsed_s FROM runs r CROSS JOIN grid g JOIN "
      "step_metrics m ON m.run_id = coalesce(r.reused_from, r.id) AND m.step = g.step WHERE "
      "r.sweep_id = ?1 "
      "UNION SELECT r.id, m.step, m.", column, ", m.elapsed_s FROM runs r JOIN step_metrics m ON "
      "m.run_id = coalesce(r.reused_from, r.id) AND m.step = r.steps_done WHERE r.sweep_id = ?1 "
      "UNION SELECT r.id, m.step, m.", column, ", m.elapsed_s FROM runs r JOIN spike_events e ON "
      "e.run_id = coalesce(r.reused_from, r.id) JOIN step_metrics m ON m.run_id = e.run_id AND "
      "m.step = e.step WHERE r.sweep_id = ?1 ORDER BY 1, 2");
  std::map<int64_t, std::vector<std::pair<int64_t, double>>> curves;
  if (elapsed != nullptr) elapsed->clear();
  absl::Status read = ForEachRow(
      sql, [&](Stmt& q) { q.Bind(1, sweep_id).Bind(2, every); },
      [&](const Stmt& r) {
        curves[r.ColumnInt(0)].emplace_back(r.ColumnInt(1), r.ColumnDouble(2));
        if (elapsed != nullptr) {
          (*elapsed)[r.ColumnInt(0)].push_back(r.ColumnIsNull(3) ? kNaN : r.ColumnDouble(3));
        }
      });
  if (!read.ok()) return read;
  return curves;
}

absl::StatusOr<std::vector<SweepSpike>> StoreReader::SweepSpikes(int64_t sweep_id) const {
  return ReadRows<SweepSpike>(
      absl::StrCat("SELECT s.id, r.id, ", kSpikeColumns,
                   " FROM runs r JOIN spike_events s ON "
                   "s.run_id = coalesce(r.reused_from, r.id) WHERE r.sweep_id = ?1 ORDER BY r.id, "
                   "s.step, s.id"),
      [&](Stmt& q) { q.Bind(1, sweep_id); }, ReadSweepSpike);
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
                       "e.f_attn, e.tokens, e.sink_rate FROM last JOIN eval_metrics e ON e.run_id "
                       "= last.src "
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

}  // namespace ablate
