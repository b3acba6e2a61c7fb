// `ablate compare` over the store's results (docs/cli.md): the runs of one or more sweeps grouped
// by variant and axis point, paired with the reference's by seed, and compared by the statistics
// of orchestrator/stats/comparison.h (which this header brings: Comparison, FormatComparison).
// Pure functions of a ResultSet; thread-safe.
#ifndef ABLATE_ORCHESTRATOR_STORE_COMPARE_H_
#define ABLATE_ORCHESTRATOR_STORE_COMPARE_H_

#include <string>

#include "absl/status/statusor.h"
#include "orchestrator/stats/comparison.h"
#include "orchestrator/store/reader.h"

namespace ablate {

struct CompareOptions {
  // val_loss, val_ppl, gate_score, m_act, f_attn, spike_score, train_loss, ppl@L / loss@L: PPL
  // or loss at evaluation length L (TrainConfig.eval_seq_lens), or a metric the runs report by
  // name (train.evals' TASK@SETTING, a program's own: ResultRun::metrics).
  std::string metric = "val_loss";
  std::string reference;            // a variant name; "" = the first sweep's reference
  double alpha = 0.05;              // the test's level, 0 < alpha < 0.5; intervals are 1 − alpha
  std::string correction = "holm";  // "holm" or "none"
};
// A metric of train.evals' tasks whose runs stored per-item scores (ResultSelection.items_metric
// read them) is also tested over items (TestItems), and its chance level is stated.

// Whether a metric reported by name is better higher: the eval tasks' accuracies (passkey@L,
// passkey_exact@L, mqar@P, copying_acc@L) and any name whose part before '@' contains "acc".
// Every other (losses, a program's perplexities) is better lower.
bool IsAccuracyMetric(absl::string_view name);

// The comparison of `results`. InvalidArgument naming a bad metric, alpha or correction;
// NotFound for a reference with no runs in the sweeps, or a length no run was evaluated at.
absl::StatusOr<Comparison> CompareResults(const ResultSet& results, const CompareOptions& options);

}  // namespace ablate

#endif  // ABLATE_ORCHESTRATOR_STORE_COMPARE_H_
