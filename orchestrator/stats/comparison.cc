#include "orchestrator/stats/comparison.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/text_format.h"
#include "fmt/format.h"
#include "nlohmann/json.hpp"
#include "orchestrator/stats/stats.h"

namespace ablate {
namespace {

double Mean(const std::vector<double>& v) { return MeanAndStd(v).mean; }

void SetVerdict(const Comparison& c, CompareRow* row) {
  if (row->variant_diverged > 0 || row->reference_diverged > 0) {
    row->verdict = kDiverged;
    const std::string counts =
        fmt::format("at {} of {} seeds, the reference at {}", row->variant_diverged, row->seeds,
                    row->reference_diverged);
    row->note = row->note.empty() ? counts : absl::StrCat(counts, "; ", row->note);
    return;
  }
  if (row->test.empty()) {
    row->verdict = kTooFewSeeds;
  } else if (row->p_adjusted < c.alpha) {
    const bool lower = row->delta < 0;
    row->verdict = c.lower_is_better    ? (lower ? kBetter : kWorse)
                   : c.higher_is_better ? (lower ? kWorse : kBetter)
                                        : (lower ? kLower : kHigher);
  } else {
    row->verdict = kNoDifference;
  }
}

}  // namespace

void TestRow(const RowSamples& samples, double alpha, CompareRow* row) {
  row->n_variant = static_cast<int64_t>(samples.variant.size());
  row->n_reference = static_cast<int64_t>(samples.reference.size());
  row->n_pairs = static_cast<int64_t>(samples.paired_variant.size());
  DifferenceTest test;
  if (row->n_pairs >= 2) {
    row->test = "paired t";
    test = PairedTTest(samples.paired_variant, samples.paired_reference, alpha);
    row->variant_mean = Mean(samples.paired_variant);
    row->reference_mean = Mean(samples.paired_reference);
  } else if (row->n_variant >= 2 && row->n_reference >= 2) {
    row->test = "Welch";
    test = WelchTTest(samples.variant, samples.reference, alpha);
    row->variant_mean = Mean(samples.variant);
    row->reference_mean = Mean(samples.reference);
  } else {
    const bool one_pair = row->n_pairs == 1;
    row->variant_mean = one_pair ? samples.paired_variant[0] : Mean(samples.variant);
    row->reference_mean = one_pair ? samples.paired_reference[0] : Mean(samples.reference);
    row->delta = row->variant_mean - row->reference_mean;
    row->note = one_pair ? "1 pair: no interval"
                         : absl::StrCat("no interval: ", row->n_pairs, " pairs, ", row->n_variant,
                                        " and ", row->n_reference, " runs with a value");
    return;
  }
  row->delta = test.delta;
  row->ci_low = test.ci_low;
  row->ci_high = test.ci_high;
  row->p_value = test.p_value;
  row->min_detectable = test.min_detectable;
}

void JudgeRows(Comparison* comparison) {
  std::vector<double> p_values;
  for (const CompareRow& row : comparison->rows) p_values.push_back(row.p_value);
  const std::vector<double> adjusted =
      comparison->correction == "holm" ? HolmAdjust(p_values) : p_values;
  for (size_t i = 0; i < comparison->rows.size(); ++i) {
    comparison->rows[i].p_adjusted = adjusted[i];
    SetVerdict(*comparison, &comparison->rows[i]);
  }
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
      c.lower_is_better    ? "lower is better"
      : c.higher_is_better ? "higher is better"
                           : "no better direction: lower or higher",
      level, c.correction == "holm" ? "Holm-adjusted" : "unadjusted", c.alpha);
  const bool best = !c.best_axis.empty();
  if (best) {
    absl::StrAppend(&out, "Each side at its own best ", c.best_axis,
                    " (`at`, `reference at`).\n\n");
  }
  std::vector<std::string> header = {"variant"};
  if (has_axes) header.push_back("axes");
  if (best) {
    header.push_back("at");
    header.push_back("reference at");
  }
  for (const std::string& h : {std::string("pairs"), c.reference, std::string("mean"),
                               std::string("Δ"), absl::StrCat(level, "% CI"), std::string("p"),
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
    cells.push_back(r.test == "Welch"
                        ? absl::StrCat(r.n_pairs, " (Welch ", r.n_variant, "/", r.n_reference, ")")
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
    cells.push_back(std::isfinite(r.min_detectable) ? Fixed(r.min_detectable, decimals + 1) : "—");
    absl::StrAppend(&out, "| ", absl::StrJoin(cells, " | "), " |\n");
  }
  if (c.rows.empty()) out += "\n(no variant besides the reference)\n";
  absl::StrAppend(&out,
                  "\n`detectable`: the smallest difference these seeds could tell apart "
                  "from none with 80% power at alpha ",
                  c.alpha, ".");
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
    std::vector<std::string> cells = {CsvField(r.variant),         CsvField(r.axes),
                                      CsvField(c.metric),          absl::StrCat(r.n_pairs),
                                      CsvNumber(r.reference_mean), CsvNumber(r.variant_mean),
                                      CsvNumber(r.delta),          CsvNumber(r.ci_low),
                                      CsvNumber(r.ci_high),        CsvNumber(r.p_value),
                                      CsvNumber(r.p_adjusted),     CsvField(r.verdict),
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
                        {"higher_is_better", c.higher_is_better},
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
