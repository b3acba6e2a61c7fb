#include "orchestrator/store/compare.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "common/text_format.h"
#include "fmt/format.h"
#include "nlohmann/json.hpp"
#include "orchestrator/store/stats.h"

namespace ablate {
namespace {

// What one run contributes to a comparison: a metric of its final evaluation.
struct Metric {
  std::string heading;
  double RunInfo::*field = nullptr;  // a summary metric, or
  int64_t seq_len = 0;               // with `ppl`: PPL (else loss) at this evaluation length
  bool ppl = false;
  bool lower_is_better = true;

  double Of(const ResultRun& r) const {
    if (field != nullptr) return r.run.*field;
    for (const RunLength& l : r.lengths) {
      if (l.seq_len == seq_len) return ppl ? l.val_ppl : l.val_loss;
    }
    return kNaN;
  }
};

constexpr char kMetricNames[] =
    "val_loss, val_ppl, gate_score, m_act, f_attn, spike_score, train_loss, ppl@L, loss@L";

absl::StatusOr<Metric> ParseMetric(const std::string& name, const ResultSet& results) {
  static const auto* summaries = new std::map<std::string, Metric>{
      {"val_loss", {"val loss", &RunInfo::val_loss}},
      {"val_ppl", {"val PPL", &RunInfo::val_ppl}},
      // A gate's mean value describes the mechanism (sparser: lower), not a result to improve.
      {"gate_score", {"gate score", &RunInfo::gate_score, 0, false, false}},
      {"m_act", {"M-Act", &RunInfo::m_act}},
      {"f_attn", {"F-Attn", &RunInfo::f_attn}},
      {"spike_score", {"spike score", &RunInfo::spike_score}},
      {"train_loss", {"train loss", &RunInfo::final_train_loss}},
  };
  auto it = summaries->find(name);
  if (it != summaries->end()) return it->second;
  absl::string_view rest = name;
  Metric m;
  m.ppl = absl::ConsumePrefix(&rest, "ppl@");
  if (!m.ppl && !absl::ConsumePrefix(&rest, "loss@")) {
    return absl::InvalidArgumentError(
        absl::StrCat("compare: unknown metric \"", name, "\" (expected one of ", kMetricNames,
                     ")"));
  }
  if (!absl::SimpleAtoi(rest, &m.seq_len) || m.seq_len <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "compare: metric \"", name, "\" needs an evaluation length, e.g. ppl@256"));
  }
  std::set<int64_t> measured;
  for (const ResultRun& r : results.runs) {
    for (const RunLength& l : r.lengths) measured.insert(l.seq_len);
  }
  if (measured.count(m.seq_len) == 0) {
    return absl::NotFoundError(absl::StrCat(
        "compare: no run of ", results.label, " was evaluated at length ", m.seq_len,
        measured.empty() ? " (none has TrainConfig.eval_seq_lens)"
                         : absl::StrCat(" (lengths measured: ", absl::StrJoin(measured, ", "),
                                        ")")));
  }
  m.heading = absl::StrCat(m.ppl ? "PPL@" : "loss@", m.seq_len);
  return m;
}

// The runs of one (variant, axes), by seed.
struct Group {
  std::string variant, axes;
  std::map<uint64_t, const ResultRun*> by_seed;
};

std::vector<double> FiniteValues(const Group& g, const Metric& metric) {
  std::vector<double> values;
  for (const auto& [seed, r] : g.by_seed) {
    const double v = metric.Of(*r);
    if (r->run.state == SUCCEEDED && std::isfinite(v)) values.push_back(v);
  }
  return values;
}

double Mean(const std::vector<double>& v) { return MeanAndStd(v).mean; }

// A row's counts, means and test; the verdict comes once every p-value is adjusted.
CompareRow Row(const Group& variant, const Group* reference, const Metric& metric, double alpha) {
  CompareRow row;
  row.variant = variant.variant;
  row.axes = variant.axes;
  const std::vector<double> all_variant = FiniteValues(variant, metric);
  row.n_variant = static_cast<int64_t>(all_variant.size());
  if (reference == nullptr) {
    row.variant_mean = Mean(all_variant);
    row.note = "no reference runs at this axis point";
    return row;
  }
  const std::vector<double> all_reference = FiniteValues(*reference, metric);
  row.n_reference = static_cast<int64_t>(all_reference.size());
  std::vector<double> paired_variant, paired_reference;
  for (const auto& [seed, v] : variant.by_seed) {
    auto r = reference->by_seed.find(seed);
    if (r == reference->by_seed.end()) continue;
    ++row.seeds;
    const RunState vs = v->run.state, rs = r->second->run.state;
    if (vs == DIVERGED && rs != DIVERGED) ++row.variant_diverged;
    if (rs == DIVERGED && vs != DIVERGED) ++row.reference_diverged;
    const double a = metric.Of(*v), b = metric.Of(*r->second);
    if (vs == SUCCEEDED && rs == SUCCEEDED && std::isfinite(a) && std::isfinite(b)) {
      paired_variant.push_back(a);
      paired_reference.push_back(b);
    }
  }
  row.n_pairs = static_cast<int64_t>(paired_variant.size());
  DifferenceTest test;
  if (row.n_pairs >= 2) {
    row.test = "paired t";
    test = PairedTTest(paired_variant, paired_reference, alpha);
    row.variant_mean = Mean(paired_variant);
    row.reference_mean = Mean(paired_reference);
  } else if (row.n_variant >= 2 && row.n_reference >= 2) {
    row.test = "Welch";
    test = WelchTTest(all_variant, all_reference, alpha);
    row.variant_mean = Mean(all_variant);
    row.reference_mean = Mean(all_reference);
  } else {
    const bool one_pair = row.n_pairs == 1;
    row.variant_mean = one_pair ? paired_variant[0] : Mean(all_variant);
    row.reference_mean = one_pair ? paired_reference[0] : Mean(all_reference);
    row.delta = row.variant_mean - row.reference_mean;
    row.note = one_pair ? "1 pair: no interval"
                        : absl::StrCat("no interval: ", row.n_pairs, " pairs, ", row.n_variant,
                                       " and ", row.n_reference, " runs with a value");
    return row;
  }
  row.delta = test.delta;
  row.ci_low = test.ci_low;
  row.ci_high = test.ci_high;
  row.p_value = test.p_value;
  row.min_detectable = test.min_detectable;
  return row;
}

void SetVerdict(const Comparison& c, CompareRow* row) {
  if (row->variant_diverged > 0 || row->reference_diverged > 0) {
    row->verdict = kDiverged;
    const std::string counts =
        fmt::format("at {} of {} seeds, the reference at {}", row->variant_diverged,
                    row->seeds, row->reference_diverged);
    row->note = row->note.empty() ? counts : absl::StrCat(counts, "; ", row->note);
    return;
  }
  if (row->test.empty()) {
    row->verdict = kTooFewSeeds;
  } else if (row->p_adjusted < c.alpha) {
    const bool lower = row->delta < 0;
    row->verdict = c.lower_is_better ? (lower ? kBetter : kWorse) : (lower ? kLower : kHigher);
  } else {
    row->verdict = kNoDifference;
  }
}

}  // namespace

absl::StatusOr<Comparison> CompareResults(const ResultSet& results,
                                          const CompareOptions& options) {
  if (!(options.alpha > 0 && options.alpha < 0.5)) {
    return absl::InvalidArgumentError(
        absl::StrCat("compare: --alpha must be between 0 and 0.5, not ", options.alpha));
  }
  if (options.correction != "holm" && options.correction != "none") {
    return absl::InvalidArgumentError(absl::StrCat("compare: unknown correction \"",
                                                   options.correction,
                                                   "\" (expected holm or none)"));
  }
  absl::StatusOr<Metric> metric = ParseMetric(options.metric, results);
  if (!metric.ok()) return metric.status();
  Comparison c;
  c.sweeps = results.label;
  c.metric = options.metric;
  c.heading = metric->heading;
  c.reference = options.reference.empty() ? results.reference : options.reference;
  c.alpha = options.alpha;
  c.correction = options.correction;
  c.lower_is_better = metric->lower_is_better;
  c.excluded = results.excluded;

  std::vector<Group> groups;
  std::map<std::pair<std::string, std::string>, size_t> index;  // (variant, axes) -> group
  std::set<std::string> variants;
  for (const ResultRun& r : results.runs) {
    auto [it, added] = index.try_emplace({r.run.variant, r.run.axes}, groups.size());
    if (added) groups.push_back(Group{r.run.variant, r.run.axes, {}});
    groups[it->second].by_seed[r.run.seed] = &r;
    variants.insert(r.run.variant);
  }
  if (variants.count(c.reference) == 0) {
    return absl::NotFoundError(absl::StrCat("compare: no runs of reference variant \"",
                                            c.reference, "\" in ", results.label,
                                            " (variants: ", absl::StrJoin(variants, ", "), ")"));
  }
  for (const Group& g : groups) {
    if (g.variant == c.reference) continue;
    auto ref = index.find({c.reference, g.axes});
    c.rows.push_back(Row(g, ref == index.end() ? nullptr : &groups[ref->second], *metric,
                         options.alpha));
  }
  std::vector<double> p_values;
  for (const CompareRow& row : c.rows) p_values.push_back(row.p_value);
  const std::vector<double> adjusted =
      options.correction == "holm" ? HolmAdjust(p_values) : p_values;
  for (size_t i = 0; i < c.rows.size(); ++i) {
    c.rows[i].p_adjusted = adjusted[i];
    SetVerdict(c, &c.rows[i]);
  }
  return c;
}

namespace {

nlohmann::json NumberJson(double d) {
  return std::isfinite(d) ? nlohmann::json(d) : nlohmann::json(nullptr);
}

// Decimals that keep the means readable: 3 near 1, fewer above, more below.
int Decimals(const Comparison& c) {
  double largest = 0;
  for (const CompareRow& r : c.rows) {
    for (double v : {r.reference_mean, r.variant_mean}) {
      if (std::isfinite(v)) largest = std::max(largest, std::fabs(v));
    }
  }
  if (largest >= 100) return 1;
  if (largest >= 10) return 2;
  if (largest >= 1) return 3;
  return 4;
}

std::string Fixed(double v, int decimals, bool sign = false) {
  if (!std::isfinite(v)) return "—";
  return sign ? fmt::format("{:+.{}f}", v, decimals) : fmt::format("{:.{}f}", v, decimals);
}

std::string PText(double p) {
  if (!std::isfinite(p)) return "—";
  if (p == 0) return "0";
  if (p < 1e-4) return fmt::format("{:.1e}", p);
  return fmt::format("{:.3g}", p);
}

std::string Markdown(const Comparison& c) {
  const bool has_axes = std::any_of(c.rows.begin(), c.rows.end(),
                                    [](const CompareRow& r) { return !r.axes.empty(); });
  const int decimals = Decimals(c);
  const int level = static_cast<int>(std::lround(100 * (1 - c.alpha)));
  std::string out = fmt::format(
      "{} of each variant against {} in {}, paired by seed ({}). {}% intervals of the "
      "difference (variant − reference); verdicts from the {} p-values at alpha {}.\n\n",
      c.heading, c.reference, c.sweeps,
      c.lower_is_better ? "lower is better" : "no better direction: lower or higher", level,
      c.correction == "holm" ? "Holm-adjusted" : "unadjusted", c.alpha);
  const bool best = !c.best_axis.empty();
  if (best) {
    absl::StrAppend(&out, "Each side at its own best ", c.best_axis, " (`at`, `reference at`).\n\n");
  }
  std::vector<std::string> header = {"variant"};
  if (has_axes) header.push_back("axes");
  if (best) {
    header.push_back("at");
    header.push_back("reference at");
  }
  for (const std::string& h :
       {std::string("pairs"), c.reference, std::string("mean"), std::string("Δ"),
        absl::StrCat(level, "% CI"), std::string("p"),
        std::string(c.correction == "holm" ? "p (Holm)" : "p (unadjusted)"),
        std::string("verdict"), std::string("detectable")}) {
    header.push_back(h);
  }
  absl::StrAppend(&out, "| ", absl::StrJoin(header, " | "), " |\n|");
  for (size_t i = 0; i < header.size(); ++i) {
    const bool left = i == 0 || (has_axes && i == 1) || header[i] == "verdict";
    out += left ? "---|" : "---:|";
  }
  out += "\n";
  for (const CompareRow& r : c.rows) {
    std::vector<std::string> cells = {r.variant};
    if (has_axes) cells.push_back(r.axes);
    if (best) {
      cells.push_back(r.value.empty() ? "—" : r.value);
      cells.push_back(r.reference_value.empty() ? "—" : r.reference_value);
    }
    cells.push_back(r.test == "Welch" ? absl::StrCat(r.n_pairs, " (Welch ", r.n_variant, "/",
                                                     r.n_reference, ")")
                                      : absl::StrCat(r.n_pairs));
    cells.push_back(Fixed(r.reference_mean, decimals));
    cells.push_back(Fixed(r.variant_mean, decimals));
    cells.push_back(Fixed(r.delta, decimals + 1, /*sign=*/true));
    cells.push_back(std::isfinite(r.ci_low)
                        ? absl::StrCat("[", Fixed(r.ci_low, decimals + 1, true), ", ",
                                       Fixed(r.ci_high, decimals + 1, true), "]")
                        : "—");
    cells.push_back(PText(r.p_value));
    cells.push_back(PText(r.p_adjusted));
    cells.push_back(r.note.empty() ? r.verdict : absl::StrCat(r.verdict, " (", r.note, ")"));
    cells.push_back(std::isfinite(r.min_detectable) ? Fixed(r.min_detectable, decimals + 1)
                                                    : "—");
    absl::StrAppend(&out, "| ", absl::StrJoin(cells, " | "), " |\n");
  }
  if (c.rows.empty()) out += "\n(no variant besides the reference)\n";
  absl::StrAppend(&out, "\n`detectable`: the smallest difference these seeds could tell apart "
                        "from none with 80% power at alpha ", c.alpha, ".");
  if (c.excluded > 0) {
    absl::StrAppend(&out, " ", c.excluded, c.excluded == 1 ? " run was" : " runs were",
                    " left out for their tags.");
  }
  out += "\n";
  return out;
}

std::string Csv(const Comparison& c) {
  std::string out =
      "variant,axes,metric,n_pairs,reference_mean,variant_mean,delta,ci_low,ci_high,p_value,"
      "p_adjusted,verdict,min_detectable";
  const bool best = !c.best_axis.empty();
  out += best ? ",value,reference_value\n" : "\n";
  for (const CompareRow& r : c.rows) {
    std::vector<std::string> cells = {
        CsvField(r.variant),         CsvField(r.axes),         CsvField(c.metric),
        absl::StrCat(r.n_pairs),     CsvNumber(r.reference_mean), CsvNumber(r.variant_mean),
        CsvNumber(r.delta),          CsvNumber(r.ci_low),      CsvNumber(r.ci_high),
        CsvNumber(r.p_value),        CsvNumber(r.p_adjusted),  CsvField(r.verdict),
        CsvNumber(r.min_detectable)};
    if (best) {
      cells.push_back(CsvField(r.value));
      cells.push_back(CsvField(r.reference_value));
    }
    absl::StrAppend(&out, absl::StrJoin(cells, ","), "\n");
  }
  return out;
}

std::string Json(const Comparison& c) {
  nlohmann::json rows = nlohmann::json::array();
  for (const CompareRow& r : c.rows) {
    rows.push_back({{"variant", r.variant},
                    {"axes", r.axes},
                    {"test", r.test},
                    {"n_pairs", r.n_pairs},
                    {"n_variant", r.n_variant},
                    {"n_reference", r.n_reference},
                    {"seeds", r.seeds},
                    {"variant_diverged", r.variant_diverged},
                    {"reference_diverged", r.reference_diverged},
                    {"reference_mean", NumberJson(r.reference_mean)},
                    {"variant_mean", NumberJson(r.variant_mean)},
                    {"delta", NumberJson(r.delta)},
                    {"ci_low", NumberJson(r.ci_low)},
                    {"ci_high", NumberJson(r.ci_high)},
                    {"p_value", NumberJson(r.p_value)},
                    {"p_adjusted", NumberJson(r.p_adjusted)},
                    {"min_detectable", NumberJson(r.min_detectable)},
                    {"verdict", r.verdict},
                    {"note", r.note}});
    if (!c.best_axis.empty()) {
      rows.back()["value"] = r.value;
      rows.back()["reference_value"] = r.reference_value;
    }
  }
  nlohmann::json out = {{"sweeps", c.sweeps},
                        {"metric", c.metric},
                        {"heading", c.heading},
                        {"reference", c.reference},
                        {"alpha", c.alpha},
                        {"correction", c.correction},
                        {"lower_is_better", c.lower_is_better},
                        {"excluded", c.excluded},
                        {"rows", std::move(rows)}};
  if (!c.best_axis.empty()) out["best_axis"] = c.best_axis;
  return out.dump(2) + "\n";
}

}  // namespace

absl::StatusOr<std::string> FormatComparison(const Comparison& comparison,
                                             const std::string& format) {
  if (format == "markdown") return Markdown(comparison);
  if (format == "csv") return Csv(comparison);
  if (format == "json") return Json(comparison);
  return absl::InvalidArgumentError(
      absl::StrCat("compare: unknown format \"", format, "\" (expected markdown, csv or json)"));
}

}  // namespace ablate
