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

// The verdict of the test over items, from its adjusted p (the seeds' divergence is the seed
// verdict's to say).
std::string ItemVerdict(const Comparison& c, const CompareRow& row) {
  if (!(row.item_p_adjusted < c.alpha)) return kNoDifference;
  const bool lower = row.item_delta < 0;
  return c.lower_is_better    ? (lower ? kBetter : kWorse)
         : c.higher_is_better ? (lower ? kWorse : kBetter)
                              : (lower ? kLower : kHigher);
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

void TestItems(const std::vector<double>& variant, const std::vector<double>& reference,
               int64_t seeds, double alpha, CompareRow* row) {
  const size_t n = std::min(variant.size(), reference.size());
  if (n == 0) return;
  row->items = static_cast<int64_t>(n);
  row->item_seeds = seeds;
  std::vector<double> differences(n);
  bool binary = true;
  int64_t reference_only = 0, variant_only = 0;
  double reference_sum = 0, variant_sum = 0;
  for (size_t i = 0; i < n; ++i) {
    const double v = variant[i], r = reference[i];
    differences[i] = v - r;
    reference_sum += r;
    variant_sum += v;
    binary = binary && (v == 0 || v == 1) && (r == 0 || r == 1);
    if (r == 1 && v == 0) ++reference_only;
    if (r == 0 && v == 1) ++variant_only;
  }
  row->item_reference_mean = reference_sum / static_cast<double>(n);
  row->item_variant_mean = variant_sum / static_cast<double>(n);
  const BootstrapTest boot = PairedBootstrap(differences, alpha, kItemBootstrapResamples, 0);
  row->item_delta = boot.delta;
  row->item_ci_low = boot.ci_low;
  row->item_ci_high = boot.ci_high;
  if (binary) {
    row->item_test = "McNemar exact";
    row->item_p = McNemarExactP(reference_only, variant_only);
    row->item_reference_interval = WilsonInterval(reference_sum, static_cast<int64_t>(n), alpha);
    row->item_variant_interval = WilsonInterval(variant_sum, static_cast<int64_t>(n), alpha);
  } else {
    row->item_test = "paired bootstrap";
    row->item_p = boot.p_value;
  }
}

void JudgeRows(Comparison* comparison) {
  std::vector<double> p_values, item_p_values;
  for (const CompareRow& row : comparison->rows) {
    p_values.push_back(row.p_value);
    item_p_values.push_back(row.item_p);
  }
  const bool holm = comparison->correction == "holm";
  const std::vector<double> adjusted = holm ? HolmAdjust(p_values) : p_values;
  const std::vector<double> item_adjusted = holm ? HolmAdjust(item_p_values) : item_p_values;
  for (size_t i = 0; i < comparison->rows.size(); ++i) {
    CompareRow& row = comparison->rows[i];
    row.p_adjusted = adjusted[i];
    SetVerdict(*comparison, &row);
    row.item_p_adjusted = item_adjusted[i];
    if (!row.item_test.empty()) {
      row.item_verdict = ItemVerdict(*comparison, row);
    }
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

bool HasItems(const Comparison& c) {
  return std::any_of(c.rows.begin(), c.rows.end(),
                     [](const CompareRow& r) { return !r.item_test.empty(); });
}

// "0.412 [0.371, 0.455]": a mean over items with its Wilson interval when it has one.
std::string WithInterval(double mean, const Interval& interval, int decimals) {
  if (!std::isfinite(interval.low)) return Fixed(mean, decimals);
  return absl::StrCat(Fixed(mean, decimals), " [", Fixed(interval.low, decimals), ", ",
                      Fixed(interval.high, decimals), "]");
}

// The test over items, below the seeds' table: one row per row with items.
std::string ItemsMarkdown(const Comparison& c, bool has_axes, int decimals) {
  const int level = static_cast<int>(std::lround(100 * (1 - c.alpha)));
  std::string out = fmt::format(
      "\nOver items: each item scored by both runs of a seed, pooled over the paired seeds; "
      "p from McNemar's exact test where every score is 0 or 1 (with {}% Wilson intervals of "
      "each side), else from a paired bootstrap ({} resamples, which give the interval of Δ "
      "either way); {}.\n\n",
      level, kItemBootstrapResamples,
      c.correction == "holm" ? "Holm-adjusted over the rows" : "unadjusted");
  std::vector<std::string> header = {"variant"};
  if (has_axes) header.push_back("axes");
  for (const std::string& h :
       {std::string("items"), std::string("chance"), c.reference, std::string("mean"),
        std::string("Δ"), absl::StrCat(level, "% CI"), std::string("test"), std::string("p"),
        std::string(c.correction == "holm" ? "p (Holm)" : "p (unadjusted)"),
        std::string("verdict")}) {
    header.push_back(h);
  }
  absl::StrAppend(&out, "| ", absl::StrJoin(header, " | "), " |\n|");
  for (size_t i = 0; i < header.size(); ++i) {
    const bool left =
        i == 0 || (has_axes && i == 1) || header[i] == "verdict" || header[i] == "test";
    out += left ? "---|" : "---:|";
  }
  out += "\n";
  for (const CompareRow& r : c.rows) {
    if (r.item_test.empty()) continue;
    std::vector<std::string> cells = {r.variant};
    if (has_axes) cells.push_back(r.axes);
    cells.push_back(
        absl::StrCat(r.items, " (", r.item_seeds, r.item_seeds == 1 ? " seed)" : " seeds)"));
    cells.push_back(Fixed(c.chance, decimals));
    cells.push_back(WithInterval(r.item_reference_mean, r.item_reference_interval, decimals));
    cells.push_back(WithInterval(r.item_variant_mean, r.item_variant_interval, decimals));
    cells.push_back(Fixed(r.item_delta, decimals + 1, /*sign=*/true));
    cells.push_back(std::isfinite(r.item_ci_low)
                        ? absl::StrCat("[", Fixed(r.item_ci_low, decimals + 1, true), ", ",
                                       Fixed(r.item_ci_high, decimals + 1, true), "]")
                        : "—");
    cells.push_back(r.item_test);
    cells.push_back(PText(r.item_p));
    cells.push_back(PText(r.item_p_adjusted));
    cells.push_back(r.item_verdict);
    absl::StrAppend(&out, "| ", absl::StrJoin(cells, " | "), " |\n");
  }
  return out;
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
  if (std::isfinite(c.chance)) {
    absl::StrAppend(&out, "Chance level of ", c.heading, ": ", Fixed(c.chance, decimals), ".\n\n");
  }
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
  if (HasItems(c)) out += ItemsMarkdown(c, has_axes, decimals);
  return out;
}

std::string Csv(const Comparison& c) {
  std::string out =
      "variant,axes,metric,n_pairs,reference_mean,variant_mean,delta,ci_low,ci_high,p_value,"
      "p_adjusted,verdict,min_detectable";
  const bool best = !c.best_axis.empty();
  const bool items = HasItems(c);
  if (best) out += ",value,reference_value";
  if (items) {
    out +=
        ",chance,items,item_test,item_reference_mean,item_variant_mean,item_delta,item_ci_low,"
        "item_ci_high,item_p,item_p_adjusted,item_verdict";
  }
  out += "\n";
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
    if (items) {
      for (std::string cell :
           {CsvNumber(c.chance), absl::StrCat(r.items), CsvField(r.item_test),
            CsvNumber(r.item_reference_mean), CsvNumber(r.item_variant_mean),
            CsvNumber(r.item_delta), CsvNumber(r.item_ci_low), CsvNumber(r.item_ci_high),
            CsvNumber(r.item_p), CsvNumber(r.item_p_adjusted), CsvField(r.item_verdict)}) {
        cells.push_back(std::move(cell));
      }
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
    if (!r.item_test.empty()) {
      rows.back()["items"] = {
          {"test", r.item_test},
          {"n", r.items},
          {"seeds", r.item_seeds},
          {"reference_mean", NumberJson(r.item_reference_mean)},
          {"variant_mean", NumberJson(r.item_variant_mean)},
          {"reference_interval",
           {NumberJson(r.item_reference_interval.low), NumberJson(r.item_reference_interval.high)}},
          {"variant_interval",
           {NumberJson(r.item_variant_interval.low), NumberJson(r.item_variant_interval.high)}},
          {"delta", NumberJson(r.item_delta)},
          {"ci_low", NumberJson(r.item_ci_low)},
          {"ci_high", NumberJson(r.item_ci_high)},
          {"p_value", NumberJson(r.item_p)},
          {"p_adjusted", NumberJson(r.item_p_adjusted)},
          {"verdict", r.item_verdict}};
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
                        {"chance", NumberJson(c.chance)},
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
