// The numbers behind a sweep's figures (figures.h): the reads they come from, the loss bands on
// one step grid, the groups' evaluations and spike markers, and their JSON.
#include "orchestrator/report/figures.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "config/param_count.h"
#include "google/protobuf/util/json_util.h"
#include "orchestrator/stats/stats.h"

namespace ablate {
namespace {

using json = nlohmann::json;

bool InBand(RunState s) {
  return s == SUCCEEDED || s == RUNNING || s == INTERRUPTED || s == PENDING;
}
bool Unfinished(RunState s) { return s == RUNNING || s == INTERRUPTED || s == PENDING; }

std::string GroupLabel(const std::string& variant, const std::string& axes) {
  return axes.empty() ? variant : absl::StrCat(variant, " (", axes, ")");
}

// The evaluations of `runs` (their latest ones, from `evals`) folded into `g`: the summary
// metrics (unless `keep_summary`: the table's), per-layer M-Act/F-Attn and the gate histogram.
void FoldEvaluations(const std::vector<const RunInfo*>& runs,
                     const std::map<int64_t, EvalResult>& evals, bool keep_summary,
                     GroupFigures* g) {
  std::vector<const EvalResult*> chosen;
  for (const RunInfo* r : runs) {
    auto it = evals.find(r->id);
    if (it != evals.end()) chosen.push_back(&it->second);
  }
  g->eval_runs = static_cast<int64_t>(chosen.size());
  if (chosen.empty()) return;
  g->eval_step_min = chosen.front()->step();
  g->eval_step_max = chosen.front()->step();
  std::vector<double> val_loss, val_ppl, gate, m_act, f_attn;
  std::map<int32_t, std::pair<std::vector<double>, std::vector<double>>> by_layer;
  bool shaped = false;
  for (const EvalResult* e : chosen) {
    g->eval_step_min = std::min(g->eval_step_min, e->step());
    g->eval_step_max = std::max(g->eval_step_max, e->step());
    val_loss.push_back(e->val_loss());
    val_ppl.push_back(e->val_ppl());
    if (e->probes().has_gate_score_mean()) gate.push_back(e->probes().gate_score_mean());
    m_act.push_back(e->probes().m_act());
    f_attn.push_back(e->probes().f_attn());
    for (const LayerProbes& l : e->probes().layers()) {
      auto& [m, f] = by_layer[l.layer()];
      m.push_back(l.ffn_residual_max_abs());
      f.push_back(l.first_token_attention());
      if (!l.has_gate() || l.gate_histogram().counts_size() == 0) continue;
      const Histogram& h = l.gate_histogram();
      if (!shaped) {
        shaped = true;
        g->gate_lo = h.lo();
        g->gate_hi = h.hi();
        g->gate_counts.assign(h.counts().begin(), h.counts().end());
        continue;
      }
      if (h.lo() != g->gate_lo || h.hi() != g->gate_hi ||
          h.counts_size() != static_cast<int>(g->gate_counts.size())) {
        continue;  // another binning: not summable with the first
      }
      for (int i = 0; i < h.counts_size(); ++i) g->gate_counts[i] += h.counts(i);
    }
  }
  if (!keep_summary) {
    g->val_loss = MeanAndStd(val_loss);
    g->val_ppl = MeanAndStd(val_ppl);
    g->gate_score = MeanAndStd(gate);
    g->m_act = MeanAndStd(m_act);
    g->f_attn = MeanAndStd(f_attn);
  }
  for (const auto& [layer, values] : by_layer) {
    LayerStat& s = g->layers.emplace_back();
    s.layer = layer;
    s.n = static_cast<int64_t>(values.first.size());
    s.m_act = MeanAndStd(values.first);
    s.f_attn = MeanAndStd(values.second);
  }
}

json Number(double v) { return std::isfinite(v) ? json(Significant7(v)) : json(nullptr); }

json MeanStd7(const MeanStd& m) { return json{{"mean", Number(m.mean)}, {"std", Number(m.std)}}; }

using Curve = std::vector<std::pair<int64_t, double>>;  // (step, loss), by step

// What the figures of one sweep are computed from, each read once.
struct SweepReads {
  std::vector<RunInfo> runs;
  std::map<int64_t, EvalResult> evals;  // the latest of each run, with its layers
  std::vector<SweepSpike> spikes;
  std::map<int64_t, Curve> curves;                 // by run id, on the grid
  std::map<int64_t, std::vector<double>> seconds;  // by run id: each curve point's elapsed_s

  const Curve& CurveOf(int64_t run_id) const {
    static const Curve* const kNone = new Curve();
    auto it = curves.find(run_id);
    return it == curves.end() ? *kNone : it->second;
  }
  // The training seconds of CurveOf(run_id)'s i-th point (NaN: not stored).
  double SecondsAt(int64_t run_id, size_t i) const {
    auto it = seconds.find(run_id);
    return it == seconds.end() || i >= it->second.size() ? kNaN : it->second[i];
  }
};

// Reads the sweep named in the table, its runs, their latest evaluations, spikes and loss
// curves; sets out->sweep and the grid's out->stride, ceil(longest run / curve points) without
// overflow.
absl::StatusOr<SweepReads> ReadSweep(const StoreReader& reader, const std::string& name,
                                     const FigureOptions& options, SweepFigures* out) {
  absl::StatusOr<SweepWithRuns> sweep_runs = reader.GetSweepWithRuns(name);
  if (!sweep_runs.ok()) return sweep_runs.status();
  out->sweep = sweep_runs->sweep;
  const int64_t sweep_id = out->sweep.id;
  SweepReads reads;
  reads.runs = std::move(sweep_runs->runs);
  if (!options.exclude_tags.empty()) {
    absl::StatusOr<std::set<int64_t>> tagged = reader.RunsTagged(sweep_id, options.exclude_tags);
    if (!tagged.ok()) return tagged.status();
    reads.runs.erase(std::remove_if(reads.runs.begin(), reads.runs.end(),
                                    [&](const RunInfo& r) { return tagged->count(r.id) > 0; }),
                     reads.runs.end());
  }
  absl::StatusOr<std::map<int64_t, EvalResult>> evals =
      reader.LatestEvals(sweep_id, /*with_layers=*/true);
  if (!evals.ok()) return evals.status();
  reads.evals = std::move(*evals);
  absl::StatusOr<std::vector<SweepSpike>> spikes = reader.SweepSpikes(sweep_id);
  if (!spikes.ok()) return spikes.status();
  reads.spikes = std::move(*spikes);
  int64_t longest = 0;
  for (const RunInfo& r : reads.runs) longest = std::max(longest, r.steps_done);
  const int64_t points = options.curve_points;
  out->stride = std::max<int64_t>(1, longest / points + (longest % points != 0));
  absl::StatusOr<std::map<int64_t, Curve>> curves =
      reader.SweepCurves(sweep_id, CurveMetric::kLoss, out->stride, &reads.seconds);
  if (!curves.ok()) return curves.status();
  reads.curves = std::move(*curves);
  return reads;
}

// A band's steps: the grid's, and the last step of runs that did every step (spike steps and
// the last step of a run cut short would each put one run's value alone into the mean).
bool OnBand(const RunInfo& r, int64_t step, int64_t stride) {
  return step % stride == 0 || (step == r.steps_done && r.steps_done >= r.steps_total);
}

// Every band step of the runs that count in a band, ascending.
std::vector<int64_t> BandSteps(const SweepReads& reads, int64_t stride) {
  std::set<int64_t> steps;
  for (const RunInfo& r : reads.runs) {
    if (!InBand(r.state)) continue;
    for (const auto& [step, loss] : reads.CurveOf(r.id)) {
      if (OnBand(r, step, stride)) steps.insert(step);
    }
  }
  return std::vector<int64_t>(steps.begin(), steps.end());
}

// The comparison table's columns of the row's group.
void CopyRow(const ComparisonRow& row, GroupFigures* g) {
  g->variant = row.variant;
  g->axes = row.axes;
  g->description = row.description;
  g->label = GroupLabel(row.variant, row.axes);
  g->runs = row.runs;
  g->n = row.n;
  g->diverged = row.diverged;
  g->failed = row.failed;
  g->unfinished = row.unfinished;
}

// The runs of one group, in run order.
struct GroupRuns {
  std::vector<const RunInfo*> members, succeeded, unfinished;
};

GroupRuns RunsOf(const ComparisonRow& row, const std::vector<RunInfo>& runs) {
  GroupRuns out;
  for (const RunInfo& r : runs) {
    if (r.variant != row.variant || r.axes != row.axes) continue;
    out.members.push_back(&r);
    if (r.state == SUCCEEDED) out.succeeded.push_back(&r);
    if (Unfinished(r.state)) out.unfinished.push_back(&r);
  }
  return out;
}

// The group's loss band (each step's values in run order) and its diverged runs' curves.
void FoldLossBand(const std::vector<const RunInfo*>& members, const SweepReads& reads,
                  int64_t stride, const std::map<int64_t, size_t>& index_of, GroupFigures* g) {
  std::vector<std::vector<double>> at(index_of.size());
  std::vector<double> seconds_sum(index_of.size(), 0.0);
  std::vector<int64_t> seconds_n(index_of.size(), 0);
  for (const RunInfo* r : members) {
    RunConfig config;
    if (std::isnan(g->tokens_per_step) &&
        google::protobuf::util::JsonStringToMessage(r->config_json, &config).ok()) {
      g->tokens_per_step = TokensPerStep(config.train());
      g->flops_per_step =
          g->tokens_per_step * TrainingFlopsPerToken(config.model(), config.train().seq_len());
    }
    const Curve& curve = reads.CurveOf(r->id);
    if (r->state == DIVERGED) {
      RunCurve& c = g->diverged_curves.emplace_back();
      c.run_id = r->id;
      c.seed = r->seed;
      for (size_t i = 0; i < curve.size(); ++i) {
        c.steps.push_back(curve[i].first);
        c.loss.push_back(curve[i].second);
        c.seconds.push_back(reads.SecondsAt(r->id, i));
      }
      continue;
    }
    if (!InBand(r->state)) continue;
    ++g->band_runs;
    for (size_t i = 0; i < curve.size(); ++i) {
      const auto& [step, loss] = curve[i];
      if (!OnBand(*r, step, stride) || !std::isfinite(loss)) continue;
      const size_t k = index_of.at(step);
      at[k].push_back(loss);
      if (const double s = reads.SecondsAt(r->id, i); std::isfinite(s)) {
        seconds_sum[k] += s;
        ++seconds_n[k];
      }
    }
  }
  for (size_t k = 0; k < at.size(); ++k) {
    const MeanStd m = MeanAndStd(at[k]);
    g->loss_n.push_back(static_cast<int64_t>(at[k].size()));
    g->loss_mean.push_back(m.mean);
    g->loss_std.push_back(m.std);
    g->seconds_mean.push_back(seconds_n[k] > 0 ? seconds_sum[k] / seconds_n[k] : kNaN);
  }
}

// The spike events of the group's runs, each with the run's loss at its step when stored.
void MarkSpikes(const std::vector<const RunInfo*>& members, const SweepReads& reads,
                GroupFigures* g) {
  for (const SweepSpike& s : reads.spikes) {
    auto member = std::find_if(members.begin(), members.end(),
                               [&](const RunInfo* r) { return r->id == s.run_id; });
    if (member == members.end()) continue;
    SpikeMark& mark = g->spikes.emplace_back();
    mark.run_id = s.run_id;
    mark.seed = (*member)->seed;
    mark.step = s.event.step();
    mark.signal = s.event.signal();
    mark.kind = SpikeKind_Name(s.event.kind());
    const Curve& curve = reads.CurveOf(s.run_id);
    auto point = std::lower_bound(curve.begin(), curve.end(), std::make_pair(mark.step, -HUGE_VAL),
                                  [](const auto& a, const auto& b) { return a.first < b.first; });
    if (point != curve.end() && point->first == mark.step) {
      mark.loss = point->second;
      mark.seconds = reads.SecondsAt(s.run_id, static_cast<size_t>(point - curve.begin()));
    }
  }
}

}  // namespace

double Significant7(double v) {
  if (!std::isfinite(v) || v == 0) return v;
  const double scale = std::pow(10.0, 6 - std::floor(std::log10(std::fabs(v))));
  return std::isfinite(scale) && scale > 0 ? std::round(v * scale) / scale : v;
}

absl::StatusOr<SweepFigures> ComputeSweepFigures(const StoreReader& reader,
                                                 const std::string& sweep,
                                                 const FigureOptions& options) {
  absl::StatusOr<ComparisonTable> table =
      reader.GetComparisonTable(ResultSelection{{sweep}, options.exclude_tags});
  if (!table.ok()) return table.status();
  return ComputeSweepFigures(reader, *table, options);
}

absl::StatusOr<SweepFigures> ComputeSweepFigures(const StoreReader& reader,
                                                 const ComparisonTable& table,
                                                 const FigureOptions& options) {
  if (options.curve_points < 2 || options.curve_points > 5000) {
    return absl::InvalidArgumentError(
        absl::StrCat("figures: curve points must be 2..5000, got ", options.curve_points));
  }
  SweepFigures out;
  absl::StatusOr<SweepReads> reads = ReadSweep(reader, table.sweep, options, &out);
  if (!reads.ok()) return reads.status();
  out.steps = BandSteps(*reads, out.stride);
  std::map<int64_t, size_t> index_of;
  for (size_t i = 0; i < out.steps.size(); ++i) index_of[out.steps[i]] = i;
  for (const ComparisonRow& row : table.rows) {
    GroupFigures& g = out.groups.emplace_back();
    CopyRow(row, &g);
    const GroupRuns runs = RunsOf(row, reads->runs);
    if (!runs.succeeded.empty()) {
      g.val_loss = row.val_loss;
      g.val_ppl = row.val_ppl;
      g.gate_score = row.gate_score;
      g.m_act = row.m_act;
      g.f_attn = row.f_attn;
      FoldEvaluations(runs.succeeded, reads->evals, /*keep_summary=*/true, &g);
    } else {
      FoldEvaluations(runs.unfinished, reads->evals, /*keep_summary=*/false, &g);
      g.interim = g.eval_runs > 0;
    }
    FoldLossBand(runs.members, *reads, out.stride, index_of, &g);
    MarkSpikes(runs.members, *reads, &g);
  }
  return out;
}

json MeanStdJson(const MeanStd& m) { return json{{"mean", m.mean}, {"std", m.std}}; }

namespace {

// The fields a comparison row and a group's figures share: the group, its runs by outcome and
// the summary metrics, each through `stat`. A json object keeps its keys sorted, so the fields a
// caller adds to this one land where they would in a single literal; these are written in that
// (the printed) order.
template <typename Group, typename StatJson>
json GroupSummaryJson(const Group& g, StatJson stat) {
  return json{{"axes", g.axes},
              {"description", g.description},
              {"diverged", g.diverged},
              {"f_attn", stat(g.f_attn)},
              {"failed", g.failed},
              {"gate_score", stat(g.gate_score)},
              {"m_act", stat(g.m_act)},
              {"n", g.n},
              {"runs", g.runs},
              {"unfinished", g.unfinished},
              {"val_loss", stat(g.val_loss)},
              {"val_ppl", stat(g.val_ppl)},
              {"variant", g.variant}};
}

json LengthStatJson(const LengthStat& l) {
  return json{{"seq_len", l.seq_len},
              {"yarn", l.yarn},
              {"n", l.n},
              {"val_loss", MeanStdJson(l.val_loss)},
              {"val_ppl", MeanStdJson(l.val_ppl)}};
}

}  // namespace

json ComparisonTableJson(const ComparisonTable& t) {
  json rows = json::array();
  for (const ComparisonRow& r : t.rows) {
    json lengths = json::array();
    for (const LengthStat& l : r.lengths) lengths.push_back(LengthStatJson(l));
    json metrics = json::object();  // by name: train.evals' tasks, a program's own
    for (const auto& [name, m] : r.metrics) metrics[name] = MeanStdJson(m);
    json row = GroupSummaryJson(r, MeanStdJson);
    row.update(json{{"spike_score", MeanStdJson(r.spike_score)},
                    {"train_loss", MeanStdJson(r.train_loss)},
                    {"params_total", r.params_total},
                    {"params_activated", r.params_activated},
                    {"params_added", r.params_added},
                    {"peak_memory_bytes", MeanStdJson(r.peak_memory_bytes)},
                    {"train_seconds", MeanStdJson(r.train_seconds)},
                    {"eval_seconds", MeanStdJson(r.eval_seconds)},
                    {"tokens_per_s", MeanStdJson(r.tokens_per_s)},
                    {"flops", MeanStdJson(r.flops)},
                    {"lengths", std::move(lengths)},
                    {"metrics", std::move(metrics)}});
    rows.push_back(std::move(row));
  }
  return json{{"sweep", t.sweep}, {"rows", rows}};
}

json VariantJson(const VariantInfo& v) {
  return json{{"name", v.name},
              {"description", v.description},
              {"diff", v.diff},
              {"budget", v.budget},
              {"params_total", v.params_total},
              {"params_activated", v.params_activated},
              {"params_added", v.params_added},
              {"flops_per_token", v.flops_per_token}};
}

json SweepFiguresJson(const SweepFigures& f) {
  json groups = json::array();
  for (const GroupFigures& g : f.groups) {
    json layers = json::array();
    for (const LayerStat& l : g.layers) {
      layers.push_back(json{{"layer", l.layer},
                            {"n", l.n},
                            {"m_act", MeanStd7(l.m_act)},
                            {"f_attn", MeanStd7(l.f_attn)}});
    }
    json mean = json::array(), stdev = json::array();
    json seconds = json::array();
    for (size_t i = 0; i < g.loss_mean.size(); ++i) {
      mean.push_back(Number(g.loss_mean[i]));
      stdev.push_back(Number(g.loss_std[i]));
      seconds.push_back(Number(g.seconds_mean[i]));
    }
    json diverged = json::array();
    for (const RunCurve& c : g.diverged_curves) {
      json loss = json::array(), run_seconds = json::array();
      for (double v : c.loss) loss.push_back(Number(v));
      for (double v : c.seconds) run_seconds.push_back(Number(v));
      diverged.push_back(json{{"run", c.run_id},
                              {"seed", c.seed},
                              {"step", c.steps},
                              {"loss", std::move(loss)},
                              {"seconds", std::move(run_seconds)}});
    }
    json spikes = json::array();
    for (const SpikeMark& s : g.spikes) {
      spikes.push_back(json{{"run", s.run_id},
                            {"seed", s.seed},
                            {"step", s.step},
                            {"signal", s.signal},
                            {"kind", s.kind},
                            {"loss", Number(s.loss)},
                            {"seconds", Number(s.seconds)}});
    }
    json histogram = nullptr;
    if (!g.gate_counts.empty()) {
      histogram = json{{"lo", g.gate_lo}, {"hi", g.gate_hi}, {"counts", g.gate_counts}};
    }
    json group = GroupSummaryJson(g, MeanStd7);
    group.update(json{{"label", g.label},
                      {"interim", g.interim},
                      {"eval_runs", g.eval_runs},
                      {"eval_step_min", g.eval_step_min},
                      {"eval_step_max", g.eval_step_max},
                      {"layers", std::move(layers)},
                      {"gate_histogram", std::move(histogram)},
                      {"band_runs", g.band_runs},
                      {"tokens_per_step", Number(g.tokens_per_step)},
                      {"flops_per_step", Number(g.flops_per_step)},
                      {"loss", json{{"n", g.loss_n},
                                    {"mean", std::move(mean)},
                                    {"std", std::move(stdev)},
                                    {"seconds", std::move(seconds)}}},
                      {"diverged_curves", std::move(diverged)},
                      {"spikes", std::move(spikes)}});
    groups.push_back(std::move(group));
  }
  return json{{"sweep", f.sweep.name},
              {"state", f.sweep.state},
              {"stride", f.stride},
              {"steps", f.steps},
              {"groups", std::move(groups)}};
}

}  // namespace ablate
