// Tuning (docs/spec.md, "Tuning"): the `tune:` block of a spec and what a tuned sweep may cost.
// The rules the coordinator applies to each group of runs while the sweep trains are scheduling
// policies beside the scheduler: ASHA (orchestrator/coordinator/asha.h) and the stability
// bisection (orchestrator/coordinator/bisection.h). Pure functions; thread-safe.
#ifndef ABLATE_ORCHESTRATOR_SWEEP_TUNE_H_
#define ABLATE_ORCHESTRATOR_SWEEP_TUNE_H_

#include <string>
#include <vector>

#include "orchestrator/sweep/problems.h"
#include "orchestrator/sweep/spec.h"
#include "orchestrator/sweep/tune_value.h"  // FormatTuneValue, for the users of this header
#include "proto/ablate.pb.h"
#include "yaml-cpp/yaml.h"

namespace ablate {

// The spec parser's part: reads `tune:` (`node`) into spec->tune and appends its values to
// spec->axes as the last product axis. Needs spec->base, spec->variants and spec->axes parsed,
// with no problem found so far. Each problem goes to `problems` ("FILE:LINE: tune.field: what");
// with one, spec is left as it was.
void ParseTuneBlock(const YAML::Node& node, SweepSpec* spec, SpecProblems* problems);

// The metrics a tune may rank by: columns of the store's eval_metrics.
const std::vector<std::string>& TuneMetrics();
// A metric reported by name a tune may rank by: 1-128 bytes, no whitespace, quote or `;` (it is
// bound into SQL as a value, never spliced; the limit keeps names printable).
bool IsMetricName(const std::string& name);

// The plan of a tuned sweep's expansion: the block, the most runs and steps it can take and, for
// asha, the steps synchronous successive halving would take (the expected figure: ASHA's early
// promotions can take a little more).
TunePlan MakeTunePlan(const TuneSpec& tune, const ExpandedSweep& sweep);

// "tune asha over train.optimizer.lr: 9 values; rungs 100, 300 (factor 3, seeds all); at most
// 18 runs, 16,200 steps; expected 4,800 steps (30% of the grid)".
std::string TunePlanText(const TunePlan& plan);

}  // namespace ablate

#endif  // ABLATE_ORCHESTRATOR_SWEEP_TUNE_H_
