#include "orchestrator/report/report.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <optional>
#include <set>
#include <system_error>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/durable_file.h"
#include "common/text_format.h"
#include "common/version.h"
#include "fmt/format.h"
#include "orchestrator/assets/assets.h"
#include "orchestrator/report/report_figures.h"
#include "orchestrator/report/svg.h"
#include "orchestrator/store/compare.h"
#include "orchestrator/store/format.h"
#include "orchestrator/store/tune_results.h"

namespace ablate {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

// The most metrics by name a report compares (and shows as the table's columns): each is a read
// of the sweep and a comparison; the rest stay in `ablate compare --metric`.
constexpr size_t kMaxReportedEvalMetrics = 16;

// ---- What a report is made of ------------------------------------------------------------------

struct ReportData {
  ComparisonTable table;
  // Against the reference (val loss), when the sweep has one among its runs.
  std::optional<Comparison> comparison;
  // Against the reference on each metric the runs report by name (train.evals' tasks, with
  // their tests over items; a program's), at most kMaxReportedEvalMetrics of them.
  std::vector<Comparison> eval_comparisons;
  SweepFigures figures;
  SweepSource source;
  std::vector<VariantInfo> variants;
  std::vector<RunInfo> runs;
  std::vector<Annotation> annotations;  // the sweep's tags and notes and its runs', oldest first
  bool has_lengths = false;
  // A tuned sweep (`tune:`): each variant at its own best value, and compared at it.
  std::optional<TuneInfo> tune;
  std::optional<ComparisonTable> best_table;
  std::optional<Comparison> best_comparison;
  std::vector<BracketInfo> brackets;        // a boundary sweep's
  std::optional<TuneFigures> tune_figures;  // its chart's numbers (figures/tune.svg, index.html)
};

absl::StatusOr<ReportData> ReadReportData(const StoreReader& reader, const ReportOptions& options) {
  ReportData d;
  absl::StatusOr<ResultSet> results =
      reader.ReadResults(ResultSelection{{options.sweep}, options.exclude_tags});
  if (absl::IsNotFound(results.status())) {
    absl::StatusOr<std::vector<SweepInfo>> sweeps = reader.ListSweeps();
    std::vector<std::string> names;
    if (sweeps.ok()) {
      for (const SweepInfo& s : *sweeps) names.push_back(s.name);
    }
    std::sort(names.begin(), names.end());
    return absl::NotFoundError(absl::StrCat(
        "report: no sweep named ", options.sweep, " in ", options.db_label,
        names.empty() ? " (it holds no sweep)"
                      : absl::StrCat(" (sweeps there: ", absl::StrJoin(names, ", "), ")")));
  }
  if (!results.ok()) return results.status();
  d.table = ComparisonTableOf(*results);
  // A sweep whose reference has no runs (a spec without one) has no comparison to show.
  absl::StatusOr<Comparison> comparison = CompareResults(*results, CompareOptions{});
  if (comparison.ok()) d.comparison = *std::move(comparison);
  // The metrics by name: columns of the table, and each compared with its items.
  std::set<std::string> named;
  for (const ResultRun& r : results->runs) {
    for (const auto& [name, value] : r.metrics) named.insert(name);
  }
  for (const std::string& name : named) {
    if (d.table.evals.size() >= kMaxReportedEvalMetrics) break;
    d.table.evals.push_back(name);
    ResultSelection with_items{{options.sweep}, options.exclude_tags};
    with_items.items_metric = name;
    absl::StatusOr<ResultSet> itemized = reader.ReadResults(with_items);
    if (!itemized.ok()) return itemized.status();
    CompareOptions by_name;
    by_name.metric = name;
    absl::StatusOr<Comparison> c = CompareResults(*itemized, by_name);
    if (c.ok()) d.eval_comparisons.push_back(*std::move(c));
  }
  FigureOptions figure_options = options.figures;
  figure_options.exclude_tags = options.exclude_tags;
  absl::StatusOr<SweepFigures> figures = ComputeSweepFigures(reader, d.table, figure_options);
  if (!figures.ok()) return figures.status();
  d.figures = *std::move(figures);
  const int64_t id = d.figures.sweep.id;
  absl::StatusOr<SweepSource> source = reader.GetSweepSource(id);
  if (!source.ok()) return source.status();
  d.source = *std::move(source);
  absl::StatusOr<std::vector<VariantInfo>> variants = reader.ListVariants(id);
  if (!variants.ok()) return variants.status();
  d.variants = *std::move(variants);
  absl::StatusOr<std::vector<RunInfo>> runs = reader.RunsOfSweep(id);
  if (!runs.ok()) return runs.status();
  d.runs = *std::move(runs);
  absl::StatusOr<std::vector<Annotation>> annotations = reader.Annotations(id);
  if (!annotations.ok()) return annotations.status();
  d.annotations = *std::move(annotations);
  d.has_lengths = std::any_of(d.table.rows.begin(), d.table.rows.end(),
                              [](const ComparisonRow& r) { return !r.lengths.empty(); });
  absl::StatusOr<std::optional<TuneInfo>> tune = reader.GetTune(id);
  if (!tune.ok()) return tune.status();
  if (tune->has_value()) {
    d.tune = **tune;
    const BestResults best = BestOf(*results, *d.tune);
    d.best_table = BestTable(best, *d.tune);
    if (d.tune->method == "boundary") {
      absl::StatusOr<std::vector<BracketInfo>> brackets = reader.TuneBrackets(id);
      if (!brackets.ok()) return brackets.status();
      d.brackets = *std::move(brackets);
    }
    d.tune_figures = ComputeTuneFigures(*d.tune, d.runs, d.brackets);
    absl::StatusOr<Comparison> at_best = CompareResults(best.results, CompareOptions{});
    if (at_best.ok()) {
      NameBestValues(best, *d.tune, &*at_best);
      d.best_comparison = *std::move(at_best);
    }
  }
  return d;
}

// ---- Formatting ---------------------------------------------------------------------------------

// 7 significant digits; "" for a missing value (CSV).
std::string Num(double v) { return std::isfinite(v) ? fmt::format("{:.7g}", v) : ""; }

std::string CsvLine(const std::vector<std::string>& cells) {
  return absl::StrCat(absl::StrJoin(cells, ","), "\n");
}

std::string UtcTime(double unix_seconds) {
  if (unix_seconds <= 0) return "—";
  return absl::FormatTime("%Y-%m-%d %H:%M:%S UTC",
                          absl::FromUnixMicros(std::llround(unix_seconds * 1e6)),
                          absl::UTCTimeZone());
}

std::string StatesText(const SweepInfo& s) {
  std::vector<std::string> parts;
  const std::pair<const char*, int64_t> states[] = {
      {"PENDING", s.pending},        {"RUNNING", s.running},   {"SUCCEEDED", s.succeeded},
      {"FAILED", s.failed},          {"DIVERGED", s.diverged}, {"CANCELLED", s.cancelled},
      {"INTERRUPTED", s.interrupted}};
  for (const auto& [name, n] : states) {
    if (n > 0) parts.push_back(absl::StrCat(n, " ", name));
  }
  return parts.empty() ? "no runs" : absl::StrJoin(parts, ", ");
}

// The tags of the sweep (run_id 0) or of one run of it, oldest first.
std::vector<std::string> TagsOf(const ReportData& d, int64_t run_id) {
  std::vector<std::string> tags;
  for (const Annotation& a : d.annotations) {
    if (a.kind == "tag" && a.run_id == run_id) tags.push_back(a.text);
  }
  return tags;
}

// "note on run 7" / "note on the sweep".
std::string NoteTarget(const Annotation& a) {
  return a.run_id == 0 ? "the sweep" : absl::StrCat("run ", a.run_id);
}

// ---- Tables (CSV) -------------------------------------------------------------------------------

// tables/compare_NAME.csv for a metric by name, its characters outside [A-Za-z0-9._-] as '_'
// ("passkey@1024" -> compare_passkey_1024.csv).
std::string EvalCompareFile(const std::string& metric) {
  std::string name = metric;
  for (char& c : name) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '-' && c != '_') {
      c = '_';
    }
  }
  return absl::StrCat("tables/compare_", name, ".csv");
}

std::map<std::string, std::string> Tables(const ReportData& d) {
  std::map<std::string, std::string> out;
  absl::StatusOr<std::string> comparison = FormatComparisonTable(d.table, "csv");
  out["tables/comparison.csv"] = comparison.ok() ? *comparison : "";
  if (d.comparison) {
    absl::StatusOr<std::string> paired = FormatComparison(*d.comparison, "csv");
    out["tables/compare.csv"] = paired.ok() ? *paired : "";
  }
  for (const Comparison& c : d.eval_comparisons) {
    absl::StatusOr<std::string> paired = FormatComparison(c, "csv");
    out[EvalCompareFile(c.metric)] = paired.ok() ? *paired : "";
  }
  if (d.best_table) {
    absl::StatusOr<std::string> best = FormatComparisonTable(*d.best_table, "csv");
    out["tables/best.csv"] = best.ok() ? *best : "";
  }
  if (d.best_comparison) {
    absl::StatusOr<std::string> paired = FormatComparison(*d.best_comparison, "csv");
    out["tables/compare_best.csv"] = paired.ok() ? *paired : "";
  }
  if (!d.brackets.empty()) {
    absl::StatusOr<std::string> stability = FormatStability(d.brackets, "csv");
    out["tables/stability.csv"] = stability.ok() ? *stability : "";
  }

  std::string variants = CsvLine({"variant", "description", "diff", "budget", "params_total",
                                  "params_activated", "params_added", "flops_per_token"});
  for (const VariantInfo& v : d.variants) {
    variants +=
        CsvLine({CsvText(v.name), CsvText(v.description), CsvText(v.diff), CsvText(v.budget),
                 absl::StrCat(v.params_total), absl::StrCat(v.params_activated),
                 absl::StrCat(v.params_added), Num(v.flops_per_token)});
  }
  out["tables/variants.csv"] = variants;

  std::string runs =
      CsvLine({"run_id", "variant", "seed", "axes", "state", "steps_done", "steps_total",
               "final_train_loss", "val_loss", "val_ppl", "gate_score", "m_act", "f_attn",
               "spike_steps", "spike_score", "params_total", "reused_from", "reason", "tags"});
  for (const RunInfo& r : d.runs) {
    runs += CsvLine({absl::StrCat(r.id), CsvText(r.variant), absl::StrCat(r.seed), CsvText(r.axes),
                     RunStateName(r.state), absl::StrCat(r.steps_done), absl::StrCat(r.steps_total),
                     Num(r.final_train_loss), Num(r.val_loss), Num(r.val_ppl), Num(r.gate_score),
                     Num(r.m_act), Num(r.f_attn), absl::StrCat(r.spike_steps), Num(r.spike_score),
                     absl::StrCat(r.params_total),
                     r.reused_from == 0 ? "" : absl::StrCat(r.reused_from), CsvText(r.reason),
                     CsvText(absl::StrJoin(TagsOf(d, r.id), " "))});
  }
  out["tables/runs.csv"] = runs;

  std::string evals =
      CsvLine({"variant", "axes", "interim", "runs", "step_min", "step_max", "val_loss_mean",
               "val_loss_std", "val_ppl_mean", "val_ppl_std", "gate_score_mean", "gate_score_std",
               "m_act_mean", "m_act_std", "f_attn_mean", "f_attn_std"});
  std::string curves = CsvLine({"variant", "axes", "step", "n", "loss_mean", "loss_std"});
  std::string layers = CsvLine({"variant", "axes", "interim", "layer", "n", "m_act_mean",
                                "m_act_std", "f_attn_mean", "f_attn_std"});
  std::string histograms =
      CsvLine({"variant", "axes", "interim", "bin", "lo", "hi", "count", "fraction"});
  std::string spikes =
      CsvLine({"run_id", "variant", "axes", "seed", "step", "signal", "kind", "loss"});
  for (const GroupFigures& g : d.figures.groups) {
    const std::string v = CsvText(g.variant), a = CsvText(g.axes), interim = g.interim ? "1" : "0";
    if (g.eval_runs > 0) {
      evals += CsvLine({v, a, interim, absl::StrCat(g.eval_runs), absl::StrCat(g.eval_step_min),
                        absl::StrCat(g.eval_step_max), Num(g.val_loss.mean), Num(g.val_loss.std),
                        Num(g.val_ppl.mean), Num(g.val_ppl.std), Num(g.gate_score.mean),
                        Num(g.gate_score.std), Num(g.m_act.mean), Num(g.m_act.std),
                        Num(g.f_attn.mean), Num(g.f_attn.std)});
    }
    for (size_t k = 0; k < d.figures.steps.size(); ++k) {
      if (g.loss_n[k] == 0) continue;
      curves += CsvLine({v, a, absl::StrCat(d.figures.steps[k]), absl::StrCat(g.loss_n[k]),
                         Num(g.loss_mean[k]), Num(g.loss_std[k])});
    }
    for (const LayerStat& l : g.layers) {
      layers += CsvLine({v, a, interim, absl::StrCat(l.layer), absl::StrCat(l.n), Num(l.m_act.mean),
                         Num(l.m_act.std), Num(l.f_attn.mean), Num(l.f_attn.std)});
    }
    int64_t total = 0;
    for (int64_t c : g.gate_counts) total += c;
    const double w = g.gate_counts.empty()
                         ? 0
                         : (g.gate_hi - g.gate_lo) / static_cast<double>(g.gate_counts.size());
    for (size_t b = 0; b < g.gate_counts.size(); ++b) {
      histograms += CsvLine(
          {v, a, interim, absl::StrCat(b), Num(g.gate_lo + w * static_cast<double>(b)),
           Num(g.gate_lo + w * static_cast<double>(b + 1)), absl::StrCat(g.gate_counts[b]),
           Num(total > 0 ? static_cast<double>(g.gate_counts[b]) / static_cast<double>(total)
                         : kNaN)});
    }
    for (const SpikeMark& s : g.spikes) {
      spikes += CsvLine({absl::StrCat(s.run_id), v, a, absl::StrCat(s.seed), absl::StrCat(s.step),
                         CsvText(s.signal), CsvText(s.kind), Num(s.loss)});
    }
  }
  out["tables/evaluations.csv"] = evals;
  out["tables/loss_curves.csv"] = curves;
  out["tables/layers.csv"] = layers;
  out["tables/gate_histograms.csv"] = histograms;
  out["tables/spikes.csv"] = spikes;
  if (d.has_lengths) {
    std::string lengths = CsvLine({"variant", "axes", "seq_len", "yarn", "n", "val_loss_mean",
                                   "val_loss_std", "val_ppl_mean", "val_ppl_std"});
    for (const ComparisonRow& r : d.table.rows) {
      for (const LengthStat& l : r.lengths) {
        lengths += CsvLine({CsvText(r.variant), CsvText(r.axes), absl::StrCat(l.seq_len),
                            l.yarn ? "1" : "0", absl::StrCat(l.n), Num(l.val_loss.mean),
                            Num(l.val_loss.std), Num(l.val_ppl.mean), Num(l.val_ppl.std)});
      }
    }
    out["tables/lengths.csv"] = lengths;
  }
  return out;
}

// ---- report.md ----------------------------------------------------------------------------------

std::string Markdown(const ReportData& d, const std::vector<ReportFigure>& figures,
                     const std::map<std::string, std::string>& tables,
                     const std::string& generated) {
  const SweepInfo& s = d.figures.sweep;
  std::string md = absl::StrCat("# Report: ", s.name, "\n\n", generated, "\n\n");
  absl::StrAppend(&md, "| | |\n|---|---|\n");
  absl::StrAppend(&md, "| sweep | ", MarkdownText(s.name), " (id ", s.id, ")",
                  s.description.empty() ? "" : absl::StrCat(": ", MarkdownText(s.description)),
                  " |\n");
  absl::StrAppend(&md, "| state | ", s.state, ": ", StatesText(s), " |\n");
  absl::StrAppend(&md, "| code version | ",
                  MarkdownText(d.source.code_version.empty() ? "—" : d.source.code_version),
                  " |\n");
  absl::StrAppend(&md, "| spec file | ",
                  MarkdownText(d.source.spec_file.empty() ? "—" : d.source.spec_file),
                  " ([as submitted](spec.yaml)) |\n");
  absl::StrAppend(&md, "| reference variant | ",
                  MarkdownText(d.source.reference.empty() ? "—" : d.source.reference), " |\n");
  absl::StrAppend(&md, "| created | ", UtcTime(d.source.created_at), " |\n");
  absl::StrAppend(&md, "| finished | ", UtcTime(d.source.finished_at), " |\n");
  if (const std::vector<std::string> tags = TagsOf(d, 0); !tags.empty()) {
    absl::StrAppend(&md, "| tags | ", MarkdownText(absl::StrJoin(tags, ", ")), " |\n");
  }
  absl::StrAppend(&md, "\n");
  bool notes = false;
  for (const Annotation& a : d.annotations) {
    if (a.kind != "note") continue;
    if (!notes) absl::StrAppend(&md, "## Notes\n\n");
    notes = true;
    absl::StrAppend(&md, "- ", UtcTime(a.created_at), ", on ", NoteTarget(a), ": ",
                    MarkdownText(a.text), "\n");
  }
  if (notes) absl::StrAppend(&md, "\n");

  absl::StatusOr<std::string> table = FormatComparisonTable(d.table, "markdown");
  absl::StrAppend(
      &md, "## Comparison\n\n", table.ok() ? *table : "", "\n",
      "Mean ± sample std over each variant's SUCCEEDED seeds (n); diverged runs are counted, "
      "not averaged. As `ablate table ",
      s.name, "`; every number in ", "[tables/comparison.csv](tables/comparison.csv).\n\n");
  if (d.comparison) {
    absl::StatusOr<std::string> paired = FormatComparison(*d.comparison, "markdown");
    absl::StrAppend(&md, "## Against the reference\n\n", paired.ok() ? *paired : "", "\n",
                    "As `ablate compare ", s.name, "`; every number in ",
                    "[tables/compare.csv](tables/compare.csv).\n\n");
  }
  if (!d.eval_comparisons.empty()) {
    absl::StrAppend(&md, "## Evaluation tasks against the reference\n\n");
    for (const Comparison& c : d.eval_comparisons) {
      absl::StatusOr<std::string> paired = FormatComparison(c, "markdown");
      const std::string file = EvalCompareFile(c.metric);
      absl::StrAppend(&md, "### ", c.heading, "\n\n", paired.ok() ? *paired : "", "\n",
                      "As `ablate compare ", s.name, " --metric ", c.metric, "`; every number in [",
                      file, "](", file, ").\n\n");
    }
  }
  if (!d.brackets.empty()) {
    absl::StatusOr<std::string> stability = FormatStability(d.brackets, "markdown");
    absl::StrAppend(&md, "## Stability boundary\n\n", stability.ok() ? *stability : "", "\n",
                    "The largest value of ", d.tune->axis,
                    " at which every seed trained without "
                    "diverging or a spike score above ",
                    d.tune->plan.max_spike_score(),
                    " (stable), and the smallest above it at which one did not (unstable). As "
                    "`ablate table ",
                    s.name,
                    " --stability`; [tables/stability.csv]"
                    "(tables/stability.csv).\n\n");
  }
  if (d.best_table) {
    absl::StatusOr<std::string> best = FormatComparisonTable(*d.best_table, "markdown");
    absl::StrAppend(&md, "## Each variant at its best ", d.tune->axis, "\n\n",
                    best.ok() ? *best : "", "\n", "The value with the ",
                    d.tune->maximize ? "highest" : "lowest", " mean ", d.tune->metric,
                    " over SUCCEEDED seeds, per variant (", d.tune->method, "). As `ablate table ",
                    s.name, " --best`; every number in [tables/best.csv](tables/best.csv).\n\n");
    if (d.best_comparison) {
      absl::StatusOr<std::string> paired = FormatComparison(*d.best_comparison, "markdown");
      absl::StrAppend(
          &md, paired.ok() ? *paired : "", "\n", "As `ablate compare ", s.name,
          " --best`; every number in [tables/compare_best.csv](tables/compare_best.csv)."
          "\n\n");
    }
  }
  if (AnyInterim(d.figures)) {
    absl::StrAppend(&md,
                    "Interim (no run of the variant has finished; the latest evaluation of its "
                    "runs still training, not a result):\n\n| variant | runs | step | val loss | "
                    "gate score | M-Act | F-Attn |\n|---|---:|---:|---:|---:|---:|---:|\n");
    for (const GroupFigures& g : d.figures.groups) {
      if (!g.interim) continue;
      absl::StrAppend(&md, "| ", MarkdownText(g.label), " | ", g.eval_runs, " | ",
                      g.eval_step_min == g.eval_step_max
                          ? absl::StrCat(g.eval_step_max)
                          : absl::StrCat(g.eval_step_min, "–", g.eval_step_max),
                      " | ", MeanStdText(g.val_loss.mean, g.val_loss.std, 4), " | ",
                      MeanStdText(g.gate_score.mean, g.gate_score.std, 4), " | ",
                      MeanStdText(g.m_act.mean, g.m_act.std, 3), " | ",
                      MeanStdText(g.f_attn.mean, g.f_attn.std, 4), " |\n");
    }
    absl::StrAppend(&md, "\n");
  }

  absl::StrAppend(&md, "## Figures\n\n");
  if (figures.empty()) absl::StrAppend(&md, "No run has reported a step yet: nothing to draw.\n\n");
  for (const ReportFigure& f : figures) {
    absl::StrAppend(&md, "### ", f.title, "\n\n![", f.title, "](", f.file, ")\n\n", f.caption,
                    "\n\n");
  }

  absl::StrAppend(&md, "## Variants: budget solutions and parameters\n\n",
                  "| variant | description | differs from the reference | budget | params | "
                  "activated | added | FLOPs/token |\n",
                  "|---|---|---|---|---:|---:|---:|---:|\n");
  for (const VariantInfo& v : d.variants) {
    absl::StrAppend(&md, "| ", MarkdownText(v.name), " | ", MarkdownText(v.description), " | ",
                    MarkdownText(v.diff.empty() ? "—" : v.diff), " | ",
                    MarkdownText(v.budget.empty() ? "—" : v.budget), " | ",
                    HumanCount(static_cast<double>(v.params_total)), " | ",
                    HumanCount(static_cast<double>(v.params_activated)), " | ",
                    HumanCount(static_cast<double>(v.params_added), /*sign=*/true), " | ",
                    v.flops_per_token > 0 ? HumanCount(v.flops_per_token) : "—", " |\n");
  }
  absl::StrAppend(&md, "\nExact counts in [tables/variants.csv](tables/variants.csv).\n\n");

  absl::StrAppend(&md,
                  "## Runs\n\n| run | variant | seed | state | steps | val loss | spikes | reason "
                  "| tags |\n",
                  "|---:|---|---:|---|---:|---:|---:|---|---|\n");
  for (const RunInfo& r : d.runs) {
    absl::StrAppend(
        &md, "| ", r.id, " | ",
        MarkdownText(r.axes.empty() ? r.variant : absl::StrCat(r.variant, " (", r.axes, ")")),
        " | ", r.seed, " | ", RunStateName(r.state), " | ", r.steps_done, "/", r.steps_total, " | ",
        std::isfinite(r.val_loss) ? fmt::format("{:.4f}", r.val_loss) : "—", " | ", r.spike_steps,
        " | ", MarkdownText(r.reason), " | ", MarkdownText(absl::StrJoin(TagsOf(d, r.id), ", ")),
        " |\n");
  }

  absl::StrAppend(&md, "\n## Spec\n\n`",
                  MarkdownText(d.source.spec_file.empty() ? "spec" : d.source.spec_file),
                  "`, as submitted ([spec.yaml](spec.yaml)):\n\n");
  std::string fence = "```";
  while (absl::StrContains(d.source.spec_yaml, fence)) fence += "`";
  absl::StrAppend(
      &md, fence, "yaml\n", d.source.spec_yaml,
      absl::EndsWith(d.source.spec_yaml, "\n") || d.source.spec_yaml.empty() ? "" : "\n", fence,
      "\n\n");

  absl::StrAppend(&md,
                  "## Files\n\n- [index.html](index.html): this report with the dashboard's "
                  "interactive charts (opens from disk)\n");
  for (const auto& [path, text] : tables) absl::StrAppend(&md, "- [", path, "](", path, ")\n");
  for (const ReportFigure& f : figures) absl::StrAppend(&md, "- [", f.file, "](", f.file, ")\n");
  return md;
}

// ---- index.html ---------------------------------------------------------------------------------

absl::StatusOr<std::string> Asset(const std::string& path) {
  if (const EmbeddedAsset* a = FindAsset(path)) return std::string(a->text());
  return absl::InternalError(
      absl::StrCat("report: the asset ", path, " is not compiled into this binary"));
}

// Text that would end or confuse the script or style element it is inlined into.
absl::Status CheckInlinable(const std::string& path, const std::string& text) {
  const std::string lower = absl::AsciiStrToLower(text);
  for (const char* bad : {"</script", "<!--", "</style"}) {
    if (absl::StrContains(lower, bad)) {
      return absl::InvalidArgumentError(absl::StrCat("report: ", path, " contains \"", bad,
                                                     "\" and cannot be inlined into a page"));
    }
  }
  return absl::OkStatus();
}

// The paired comparison as the dashboard's compare API answers it (null without one).
json CompareJson(const ReportData& d) {
  if (!d.comparison) return nullptr;
  absl::StatusOr<std::string> text = FormatComparison(*d.comparison, "json");
  return text.ok() ? json::parse(*text) : json(nullptr);
}

json RunSummaryJson(const ReportData& d, const RunInfo& r) {
  return json{{"id", r.id},
              {"variant", r.variant},
              {"seed", r.seed},
              {"axes", r.axes},
              {"state", RunStateName(r.state)},
              {"steps_done", r.steps_done},
              {"steps_total", r.steps_total},
              {"val_loss", r.val_loss},
              {"spike_steps", r.spike_steps},
              {"reason", r.reason},
              {"tags", TagsOf(d, r.id)}};
}

std::string Html(const ReportData& d, const std::vector<ReportFigure>& figures,
                 const std::map<std::string, std::string>& tables, const std::string& generated,
                 const std::string& modules, const std::string& uplot_js,
                 const std::string& uplot_css, const std::string& style_css) {
  const SweepInfo& s = d.figures.sweep;
  json variants = json::array();
  for (const VariantInfo& v : d.variants) variants.push_back(VariantJson(v));
  json runs = json::array();
  for (const RunInfo& r : d.runs) runs.push_back(RunSummaryJson(d, r));
  json notes = json::array();
  for (const Annotation& a : d.annotations) {
    if (a.kind == "note") {
      notes.push_back({{"run_id", a.run_id}, {"text", a.text}, {"created", UtcTime(a.created_at)}});
    }
  }
  json files = json::array();
  for (const auto& [path, text] : tables) files.push_back(path);
  for (const ReportFigure& f : figures) files.push_back(f.file);
  const json data{{"sweep", json{{"id", s.id},
                                 {"name", s.name},
                                 {"description", s.description},
                                 {"state", s.state},
                                 {"states", StatesText(s)},
                                 {"runs", s.runs},
                                 {"tags", TagsOf(d, 0)}}},
                  {"notes", std::move(notes)},
                  {"source", json{{"spec_file", d.source.spec_file},
                                  {"code_version", d.source.code_version},
                                  {"reference", d.source.reference},
                                  {"created", UtcTime(d.source.created_at)},
                                  {"finished", UtcTime(d.source.finished_at)}}},
                  {"spec_yaml", d.source.spec_yaml},
                  {"table", ComparisonTableJson(d.table)},
                  {"compare", CompareJson(d)},
                  {"figures", SweepFiguresJson(d.figures)},
                  {"tune", d.tune_figures ? TuneFiguresJson(*d.tune_figures) : json(nullptr)},
                  {"variants", std::move(variants)},
                  {"runs", std::move(runs)},
                  {"files", std::move(files)}};
  // '<' as \u003c: no string in the data can end its script element.
  const std::string embedded = absl::StrReplaceAll(
      data.dump(-1, ' ', false, json::error_handler_t::replace), {{"<", "\\u003c"}});
  return absl::StrCat(
      "<!doctype html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n",
      "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n",
      "<title>ablate report: ", svg::Escape(s.name),
      "</title>\n<link rel=\"icon\" href=\"data:,\">\n", "<style>\n", uplot_css,
      "\n</style>\n<style>\n", style_css, "\n</style>\n<script>\n", uplot_js,
      "\n</script>\n</head>\n<body class=\"report\">\n<header><span class=\"brand\">ablate</span>",
      "<nav>report: ", svg::Escape(s.name), "</nav></header>\n",
      "<main id=\"view\"><noscript>This report draws its charts with JavaScript; report.md beside "
      "it has the same figures as SVG files.</noscript></main>\n",
      "<footer><p class=\"muted\" id=\"generated\">", svg::Escape(generated), "</p></footer>\n",
      "<script type=\"application/json\" id=\"report-data\">", embedded, "</script>\n",
      "<script type=\"module\">\n", modules, "</script>\n</body>\n</html>\n");
}

}  // namespace

absl::StatusOr<std::string> InlineModules(const std::vector<std::string>& order) {
  std::string out;
  std::set<std::string> included;
  for (const std::string& path : order) {
    absl::StatusOr<std::string> text = Asset(path);
    if (!text.ok()) return text.status();
    if (absl::Status s = CheckInlinable(path, *text); !s.ok()) return s;
    absl::StrAppend(&out, "// ---- ", path.substr(1), " ----\n");
    int line_number = 0;
    for (absl::string_view line : absl::StrSplit(*text, '\n')) {
      ++line_number;
      if (absl::StartsWith(line, "import ")) {
        // Only imports of modules inlined before this one: they are in scope already.
        const size_t from = line.find(" from './");
        const size_t from_parent = line.find(" from '../");
        const size_t at = from != absl::string_view::npos ? from + 9 : from_parent + 10;
        if ((from == absl::string_view::npos && from_parent == absl::string_view::npos) ||
            !absl::EndsWith(line, "';")) {
          return absl::InvalidArgumentError(absl::StrCat("report: ", path, ":", line_number,
                                                         ": an import this cannot inline: ", line));
        }
        const std::string target = std::string(line.substr(at, line.size() - 2 - at));
        const bool seen = std::any_of(included.begin(), included.end(), [&](const std::string& p) {
          return absl::EndsWith(p, absl::StrCat("/", target));
        });
        if (!seen) {
          return absl::InvalidArgumentError(absl::StrCat("report: ", path, ":", line_number,
                                                         " imports ", target,
                                                         ", which is not inlined before it"));
        }
        absl::StrAppend(&out, "\n");  // keeps line numbers of errors close to the source's
        continue;
      }
      if (absl::StartsWith(line, "export ")) {
        const absl::string_view rest = line.substr(7);
        if (!absl::StartsWith(rest, "function ") && !absl::StartsWith(rest, "async function ") &&
            !absl::StartsWith(rest, "const ") && !absl::StartsWith(rest, "class ")) {
          return absl::InvalidArgumentError(absl::StrCat("report: ", path, ":", line_number,
                                                         ": an export this cannot inline: ", line));
        }
        absl::StrAppend(&out, rest, "\n");
        continue;
      }
      absl::StrAppend(&out, line, "\n");
    }
    included.insert(path);
  }
  return out;
}

absl::StatusOr<std::map<std::string, std::string>> RenderReport(const StoreReader& reader,
                                                                const ReportOptions& options) {
  absl::StatusOr<ReportData> data = ReadReportData(reader, options);
  if (!data.ok()) return data.status();
  const std::string when =
      options.generated_at.empty()
          ? absl::FormatTime("%Y-%m-%d %H:%M:%S UTC", absl::Now(), absl::UTCTimeZone())
          : options.generated_at;
  const std::string generated = absl::StrCat(kGeneratedAtMarker, when, " by ablate ",
                                             BuildVersion(), " from ", options.db_label, ".");
  std::map<std::string, std::string> files = Tables(*data);
  const std::map<std::string, std::string> tables = files;
  const std::vector<ReportFigure> figures =
      DrawReportFigures(data->figures, data->table, data->comparison ? &*data->comparison : nullptr,
                        data->tune_figures ? &*data->tune_figures : nullptr);
  for (const ReportFigure& f : figures) files[f.file] = f.svg;
  files["spec.yaml"] = data->source.spec_yaml;
  files["report.md"] = Markdown(*data, figures, tables, generated);

  absl::StatusOr<std::string> modules =
      InlineModules({"/js/format.js", "/js/charts.js", "/js/figures.js", "/js/report.js"});
  if (!modules.ok()) return modules.status();
  absl::StatusOr<std::string> uplot_js = Asset("/vendor/uPlot.iife.min.js");
  absl::StatusOr<std::string> uplot_css = Asset("/vendor/uPlot.min.css");
  absl::StatusOr<std::string> style_css = Asset("/style.css");
  for (const auto* a : {&uplot_js, &uplot_css, &style_css}) {
    if (!a->ok()) return a->status();
  }
  if (absl::Status s = CheckInlinable("/vendor/uPlot.iife.min.js", *uplot_js); !s.ok()) return s;
  if (absl::Status s = CheckInlinable("/vendor/uPlot.min.css", *uplot_css); !s.ok()) return s;
  if (absl::Status s = CheckInlinable("/style.css", *style_css); !s.ok()) return s;
  files["index.html"] =
      Html(*data, figures, tables, generated, *modules, *uplot_js, *uplot_css, *style_css);
  return files;
}

absl::StatusOr<ReportFiles> WriteReport(const StoreReader& reader, const ReportOptions& options) {
  if (options.out_dir.empty()) return absl::InvalidArgumentError("report: --out is empty");
  // Everything is read and rendered before the disk is touched: an unknown sweep leaves nothing.
  absl::StatusOr<std::map<std::string, std::string>> files = RenderReport(reader, options);
  if (!files.ok()) return files.status();
  const fs::path out(options.out_dir);
  std::error_code ec;
  const fs::file_status status = fs::status(out, ec);
  if (fs::exists(status)) {
    if (!fs::is_directory(status)) {
      return absl::FailedPreconditionError(
          absl::StrCat("report: --out ", options.out_dir, " is not a directory"));
    }
    size_t entries = 0;
    for (fs::directory_iterator it(out, ec), end; !ec && it != end; it.increment(ec)) ++entries;
    if (ec) {
      return absl::PermissionDeniedError(
          absl::StrCat("report: cannot read --out ", options.out_dir, ": ", ec.message()));
    }
    if (entries > 0 && !options.force) {
      return absl::FailedPreconditionError(
          absl::StrCat("report: --out ", options.out_dir, " is not empty (", entries,
                       entries == 1 ? " entry" : " entries",
                       "): pass --force to write over it, or choose another --out"));
    }
  }
  ReportFiles result;
  absl::StatusOr<SweepInfo> sweep = reader.GetSweep(options.sweep);
  result.sweep = sweep.ok() ? sweep->name : options.sweep;
  for (const char* dir : {"", "figures", "tables"}) {
    const fs::path p = *dir == '\0' ? out : out / dir;
    // Inside --out nothing is followed: a planted link would steer the writes, and --force's
    // removals, elsewhere.
    if (*dir != '\0' && fs::is_symlink(fs::symlink_status(p, ec))) {
      return absl::PermissionDeniedError(
          absl::StrCat("report: ", p.lexically_normal().string(),
                       " is a symbolic link: refusing to write through it (remove it, or choose "
                       "another --out)"));
    }
    fs::create_directories(p, ec);
    if (ec) {
      return absl::PermissionDeniedError(absl::StrCat(
          "report: cannot create ", p.lexically_normal().string(), ": ", ec.message()));
    }
  }
  for (const auto& [relative, text] : *files) {
    // A new file renamed over the old name: a symbolic link there is replaced, not followed.
    const fs::path p = out / relative;
    if (absl::Status s = WriteFileAtomically(p.string(), text, 0644); !s.ok()) {
      return absl::PermissionDeniedError(absl::StrCat("report: ", s.message()));
    }
    result.files.push_back(relative);
  }
  if (options.force) {
    // A previous report's figures and tables that this one does not have.
    for (const auto& [dir, extension] : {std::pair<const char*, const char*>{"figures", ".svg"},
                                         std::pair<const char*, const char*>{"tables", ".csv"}}) {
      for (fs::directory_iterator it(out / dir, ec), end; !ec && it != end; it.increment(ec)) {
        const std::string relative = absl::StrCat(dir, "/", it->path().filename().string());
        if (it->path().extension() == extension && files->count(relative) == 0) {
          fs::remove(it->path(), ec);
        }
      }
    }
  }
  return result;
}

}  // namespace ablate
