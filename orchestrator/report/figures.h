// The numbers behind a sweep's figures, computed once for both their readers: `ablate report`
// (SVG figures, CSVs and the self-contained index.html) and the dashboard's compare page
// (GET /api/sweeps/NAME/figures). One row per group of the comparison table (a variant at one
// axis point), in the table's order:
//
//   - the loss curve as mean ± sample std over the group's runs at each step of one grid shared
//     by every group (SweepFigures::steps), the diverged runs' curves apart, and spike markers;
//   - the evaluations behind the probes: the last evaluation of each SUCCEEDED run; when none
//     succeeded yet, the latest evaluation of each unfinished run, marked interim;
//   - from those: val loss/PPL, gate score, M-Act, F-Attn (the comparison table's values for a
//     group with SUCCEEDED runs, so the figures and the table agree), M-Act and F-Attn per layer
//     (mean ± std over the runs), and the gate-score histogram summed over layers and runs.
//
// Pure reads; the same database gives the same numbers in the same order. Thread-safe.
#ifndef ABLATE_ORCHESTRATOR_REPORT_FIGURES_H_
#define ABLATE_ORCHESTRATOR_REPORT_FIGURES_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "orchestrator/store/reader.h"

namespace ablate {

struct FigureOptions {
  // Steps on the loss curves' grid: every k-th step with k = ceil(longest run / curve_points),
  // plus the last step of the runs that finished every step. 2..5000.
  int curve_points = 400;
  // Runs tagged so (on the run or its sweep) are left out of every figure.
  std::vector<std::string> exclude_tags;
};

// M-Act and F-Attn of one layer, mean ± std over the group's evaluations that have the layer.
struct LayerStat {
  int32_t layer = 0;
  int64_t n = 0;
  MeanStd m_act;   // ffn_residual_max_abs: the max |hidden state| the layer outputs
  MeanStd f_attn;  // first_token_attention
};

// A spike event on the loss curve of one run of the group.
struct SpikeMark {
  int64_t run_id = 0;
  uint64_t seed = 0;
  int64_t step = 0;
  double seconds = kNaN;  // the run's training seconds at that step (NaN: not stored)
  std::string signal;  // loss or grad_norm
  std::string kind;    // SPIKE_CATASTROPHIC, ...
  double loss = kNaN;  // the run's training loss at that step (NaN: non-finite, or not stored)
};

// One run's loss curve on the grid (and its spike steps): a diverged run, drawn apart.
struct RunCurve {
  int64_t run_id = 0;
  uint64_t seed = 0;
  std::vector<int64_t> steps;
  std::vector<double> loss;     // NaN where non-finite
  std::vector<double> seconds;  // training seconds at each step (NaN: not stored)
};

struct GroupFigures {
  std::string variant, axes, description;
  std::string label;  // "variant" or "variant (axes)"
  // From the comparison table: runs of the group, SUCCEEDED (n), diverged, failed, unfinished.
  int64_t runs = 0, n = 0, diverged = 0, failed = 0, unfinished = 0;

  // The evaluations below: the last of each SUCCEEDED run, or (no run succeeded yet) the latest
  // of each unfinished run that has one: `interim`. eval_runs == 0: none to show.
  bool interim = false;
  int64_t eval_runs = 0;
  int64_t eval_step_min = 0, eval_step_max = 0;
  MeanStd val_loss, val_ppl, gate_score, m_act, f_attn;
  std::vector<LayerStat> layers;  // by layer
  // Gate scores of every gated layer of those evaluations, bin by bin (bins of one shape only:
  // the first layer's lo, hi and bin count). Empty counts: no gate.
  double gate_lo = 0, gate_hi = 0;
  std::vector<int64_t> gate_counts;

  // The loss curve: at each SweepFigures::steps, mean ± std over the group's runs that are not
  // DIVERGED, FAILED or CANCELLED and have a finite loss there (loss_n of them).
  int64_t band_runs = 0;
  // Tokens and training FLOPs per step of its runs (its first run's config; NaN: unreadable):
  // the curves against tokens seen or FLOPs spent are its steps times these.
  double tokens_per_step = kNaN, flops_per_step = kNaN;
  std::vector<int64_t> loss_n;
  std::vector<double> loss_mean, loss_std;  // NaN: no run, or (std) fewer than 2
  // At each step: the mean training seconds of the runs in the band there (NaN: none stored),
  // for the curves against wall time (variants of one budget differ in speed).
  std::vector<double> seconds_mean;
  std::vector<RunCurve> diverged_curves;    // by run id
  std::vector<SpikeMark> spikes;            // by run id, then step
};

struct SweepFigures {
  SweepInfo sweep;
  int64_t stride = 1;                // the curves' grid: every stride-th step
  std::vector<int64_t> steps;        // the loss curves' steps, ascending
  std::vector<GroupFigures> groups;  // in the comparison table's order
};

// The figures of a sweep (by name or id). NotFound for an unknown sweep; InvalidArgument for
// curve_points outside 2..5000.
absl::StatusOr<SweepFigures> ComputeSweepFigures(const StoreReader& reader,
                                                 const std::string& sweep,
                                                 const FigureOptions& options = {});
// As above, for a comparison table already read (its sweep).
absl::StatusOr<SweepFigures> ComputeSweepFigures(const StoreReader& reader,
                                                 const ComparisonTable& table,
                                                 const FigureOptions& options = {});

// The JSON the compare page and the report's index.html draw from: {"sweep", "stride", "steps",
// "groups": [...]}, numbers to 7 significant digits, NaN as null (docs/dashboard.md).
nlohmann::json SweepFiguresJson(const SweepFigures& figures);
// The comparison table as GET /api/sweeps/NAME/table answers it.
nlohmann::json ComparisonTableJson(const ComparisonTable& table);
// A variant's budget solution and parameter counts, as GET /api/sweeps/NAME lists them.
nlohmann::json VariantJson(const VariantInfo& v);
// mean ± std as {"mean", "std"} (NaN: null).
nlohmann::json MeanStdJson(const MeanStd& m);

// 7 significant digits: what a chart can show, and half the JSON of a double's 17.
double Significant7(double v);

}  // namespace ablate

#endif  // ABLATE_ORCHESTRATOR_REPORT_FIGURES_H_
