// The numbers behind a tuned sweep's chart (`tune:`, docs/spec.md "Tuning"), computed once for
// both its readers: `ablate report` (figures/tune.svg, and index.html from the embedded JSON) and
// the dashboard's compare page (GET /api/sweeps/NAME/tune). Per tuning group (a variant at one
// point of the other axes), at each value of the tuned axis its runs were trained at: the mean of
// the tuned metric over the runs that trained to the end, the runs a tuner STOPPED at a rung with
// their metric there, and how many DIVERGED; and a boundary sweep's bracket of each group.
//
// Pure functions of the reads; the same database gives the same numbers in the same order.
#ifndef ABLATE_ORCHESTRATOR_REPORT_TUNE_FIGURES_H_
#define ABLATE_ORCHESTRATOR_REPORT_TUNE_FIGURES_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "orchestrator/store/reader.h"

namespace ablate {

// A STOPPED run: where the tuner stopped it, and its metric there (its last evaluation).
struct TuneStop {
  int64_t run_id = 0;
  int64_t step = 0;
  double metric = kNaN;
};

// One value of the tuned axis in one group.
struct TunePoint {
  double value = 0;
  int64_t runs = 0;      // every run of the group at this value, whatever its state
  int64_t finished = 0;  // SUCCEEDED with a finite metric: the mean is theirs
  int64_t diverged = 0;
  double mean = kNaN;    // tune.metric over the finished runs (NaN: none)
  std::vector<TuneStop> stopped;
};

struct TuneCurve {
  std::string group, variant, axes;  // axes: the other axes' point ("" when none)
  std::vector<TunePoint> points;     // by value, ascending
  std::optional<BracketInfo> bracket;  // a boundary sweep's
};

struct TuneFigures {
  TuneInfo tune;
  bool log_scale = true;          // every value is positive: the axis is drawn on a log scale
  std::vector<TuneCurve> curves;  // by group, in the order the runs first name them
};

// The tuned metric of a run as `runs` stores it (its last evaluation): val_loss, val_ppl,
// gate_score, m_act or f_attn.
double TunedMetric(const RunInfo& run, const std::string& metric);

// From a tuned sweep's runs (RunsOfSweep) and brackets (TuneBrackets; empty unless boundary).
TuneFigures ComputeTuneFigures(const TuneInfo& tune, const std::vector<RunInfo>& runs,
                               const std::vector<BracketInfo>& brackets);

// The reads and the computation for a sweep id; nullopt for a sweep without `tune:`.
absl::StatusOr<std::optional<TuneFigures>> ReadTuneFigures(const StoreReader& reader,
                                                           int64_t sweep_id);

// {"tune": {axis, method, metric, mode, log_scale}, "curves": [{group, variant, axes,
// points: [{value, runs, finished, diverged, mean, stopped: [{run, step, metric}]}],
// bracket: {state, stable, unstable, probes, note, found} | null}]}, NaN as null
// (docs/dashboard.md).
nlohmann::json TuneFiguresJson(const TuneFigures& figures);

}  // namespace ablate

#endif  // ABLATE_ORCHESTRATOR_REPORT_TUNE_FIGURES_H_
