// The results of a tuned sweep (`tune:`, docs/spec.md "Tuning"): each variant at its own best
// value of the tuned axis, what `ablate table --best` and `ablate compare --best` show. Pure
// functions over a ResultSet; thread-safe.
#ifndef ABLATE_ORCHESTRATOR_STORE_TUNE_RESULTS_H_
#define ABLATE_ORCHESTRATOR_STORE_TUNE_RESULTS_H_

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "orchestrator/stats/comparison.h"
#include "orchestrator/store/reader.h"

namespace ablate {

struct BestResults {
  // The runs of each (variant, other axes) at its best value, the tuned axis left out of
  // run.axes: a comparison then pairs each variant at its best with the reference at its own.
  ResultSet results;
  // By (variant, other axes): the best value as written ("0.004"); "" when no value of the group
  // has a SUCCEEDED run with the metric (the group's runs are all kept, to show why).
  std::map<std::pair<std::string, std::string>, std::string> best;
};

// The best value of each group: the lowest (highest with maximize) mean of tune.metric over its
// SUCCEEDED runs; a value whose runs were all STOPPED or DIVERGED cannot win. Ties go to the
// smaller value.
BestResults BestOf(const ResultSet& results, const TuneInfo& tune);

// "train.optimizer.lr=0.004 train.steps=300" without the `axis` assignment; `value` (optional)
// receives its value ("" when it has none).
std::string AxesWithout(const std::string& axes, const std::string& axis,
                        std::string* value = nullptr);

// The comparison table of BestOf, each row's `best` naming its value.
ComparisonTable BestTable(const BestResults& best, const TuneInfo& tune);

// Fills each row's value and reference_value, and the comparison's best_axis.
void NameBestValues(const BestResults& best, const TuneInfo& tune, Comparison* comparison);

// What a bracket found, in words: "stable up to 0.02, unstable from 0.025", "bisecting", or why
// there is none ("unstable already at min 0.01").
std::string BracketFinding(const BracketInfo& bracket);

// A boundary sweep's brackets: "markdown" (variant, axes when any, stable, unstable, probes,
// and what the bisection found in words), "csv" (exactly variant,axes,stable,unstable,probes;
// a value it does not have is empty) or "json".
absl::StatusOr<std::string> FormatStability(const std::vector<BracketInfo>& brackets,
                                            const std::string& format);

}  // namespace ablate

#endif  // ABLATE_ORCHESTRATOR_STORE_TUNE_RESULTS_H_
