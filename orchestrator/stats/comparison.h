// `ablate compare`'s table (docs/cli.md): each variant against the reference at the same axis
// point, over the seeds both trained. Is it better, by how much, and would other seeds say the
// same?
//
// Per row: the pairs (seeds where both runs SUCCEEDED with a value of the metric), both means,
// the mean difference (variant − reference) with its (1 − alpha) interval and p-value from the
// paired t test, or from Welch's test when the seeds do not pair (fewer than two pairs, two or
// more runs on each side), the p-value adjusted over the table's rows (Holm), the smallest
// difference these seeds could detect (80% power at alpha), and a verdict. Numbers in, a table
// out: which runs pair, and their values, come from the store's side (orchestrator/store/
// compare.h). Pure functions; thread-safe.
#ifndef ABLATE_ORCHESTRATOR_STATS_COMPARISON_H_
#define ABLATE_ORCHESTRATOR_STATS_COMPARISON_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "orchestrator/stats/stats.h"

namespace ablate {

// The verdicts, from the adjusted p at alpha. A metric with a better direction (losses, PPL,
// M-Act, F-Attn, spike score: lower) says better or worse; one without (gate score) says lower or
// higher. `diverged` when one side DIVERGED at a seed where the other did not; `too few seeds`
// when there is no interval (one pair, or no reference at that axis point).
inline constexpr char kBetter[] = "better";
inline constexpr char kWorse[] = "worse";
inline constexpr char kLower[] = "lower";
inline constexpr char kHigher[] = "higher";
inline constexpr char kNoDifference[] = "no detectable difference";
inline constexpr char kDiverged[] = "diverged";
inline constexpr char kTooFewSeeds[] = "too few seeds";

struct CompareRow {
  std::string variant;
  std::string axes;  // "" without axes
  std::string test;  // "paired t", "Welch", or "" (no interval)
  int64_t n_pairs = 0;
  int64_t n_variant = 0, n_reference = 0;  // SUCCEEDED runs with a value, each side
  int64_t seeds = 0;                       // seeds at which both have a run
  // DIVERGED at a seed where the other side's run did not diverge.
  int64_t variant_diverged = 0, reference_diverged = 0;
  // Means over the pairs (paired t) or over every run with a value (Welch, or no interval).
  double reference_mean = kNaN, variant_mean = kNaN, delta = kNaN;
  double ci_low = kNaN, ci_high = kNaN, p_value = kNaN, p_adjusted = kNaN, min_detectable = kNaN;
  std::string verdict;
  std::string note;  // why there is no interval, or the diverged counts ("" when none)
  // `compare --best`: the tuned value each side is at ("0.004"; "" when neither trained).
  std::string value, reference_value;
  // Over items (TestItems): an evaluation task's per-item scores of both sides at each paired
  // seed, pooled. item_test "McNemar exact" (every score 0 or 1), "paired bootstrap" (else), or ""
  // when the runs stored no items for the metric.
  std::string item_test;
  int64_t items = 0, item_seeds = 0;  // pooled items, and the seeds they came from
  double item_reference_mean = kNaN, item_variant_mean = kNaN;
  Interval item_reference_interval, item_variant_interval;  // Wilson; NaN unless 0/1 scores
  double item_delta = kNaN, item_ci_low = kNaN, item_ci_high = kNaN;
  double item_p = kNaN, item_p_adjusted = kNaN;
  std::string item_verdict;
};

struct Comparison {
  std::string sweeps;   // the sweeps' names joined by "+"
  std::string metric;   // as asked
  std::string heading;  // as tables print it ("val loss", "PPL@256")
  std::string reference;
  double alpha = 0.05;
  std::string correction;
  bool lower_is_better = true;    // false: the metric has no better direction (gate score), or
  bool higher_is_better = false;  // it is better higher (an accuracy: passkey@1024)
  std::vector<CompareRow> rows;  // in order of each variant's first run
  int64_t excluded = 0;          // runs left out for their tags
  std::string best_axis;         // `compare --best`: the tuned axis; "" otherwise
  // The metric's chance level (an evaluation task's: config/eval_config.h EvalChanceLevel); NaN
  // when it has none.
  double chance = kNaN;
};

// The values one row compares: the metric at each seed where both sides SUCCEEDED with a value
// (paired, in seed order), and at every SUCCEEDED run with a value on each side.
struct RowSamples {
  std::vector<double> paired_variant, paired_reference;
  std::vector<double> variant, reference;
};

// Sets row's counts (n_pairs, n_variant, n_reference), means, test, delta, interval, p-value and
// detectable difference from `samples` at level `alpha`: the paired t test with two pairs or more,
// else Welch's with two values or more on each side, else no interval (the one pair's values, or
// every value's mean, and their difference) with a note saying why.
void TestRow(const RowSamples& samples, double alpha, CompareRow* row);

// The resamples of TestItems' paired bootstrap, from seed 0.
inline constexpr int kItemBootstrapResamples = 2000;

// Sets row's item_* fields from the per-item scores of both sides, pooled over `seeds` paired
// seeds (variant[i] and reference[i] the same item): the means, each side's Wilson interval and
// McNemar's exact p when every score is 0 or 1, else the paired bootstrap's p; the interval of
// the difference from the paired bootstrap either way (kItemBootstrapResamples). Nothing for no
// items.
void TestItems(const std::vector<double>& variant, const std::vector<double>& reference,
               int64_t seeds, double alpha, CompareRow* row);

// Adjusts the rows' p-values over the table (comparison->correction: "holm", else unadjusted) and
// sets each row's verdict from its adjusted p at comparison->alpha.
void JudgeRows(Comparison* comparison);

// "markdown" (a sentence saying what was tested, then the table), "csv" (the columns
// variant,axes,metric,n_pairs,reference_mean,variant_mean,delta,ci_low,ci_high,p_value,
// p_adjusted,verdict,min_detectable, and with best_axis value,reference_value; exact numbers,
// empty when none) or "json" (every field).
absl::StatusOr<std::string> FormatComparison(const Comparison& comparison,
                                             const std::string& format);

}  // namespace ablate

#endif  // ABLATE_ORCHESTRATOR_STATS_COMPARISON_H_
