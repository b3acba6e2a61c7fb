// The forest plot of `ablate compare` for `ablate report`: each variant's difference from the
// reference (variant − reference) with its interval, around a dashed line at zero. Deterministic,
// as every figure of the report (svg.h).
#ifndef ABLATE_ORCHESTRATOR_REPORT_FOREST_H_
#define ABLATE_ORCHESTRATOR_REPORT_FOREST_H_

#include <string>

#include "orchestrator/stats/comparison.h"

namespace ablate {

struct ForestPlot {
  std::string svg;      // "" when no row has an interval: nothing to draw
  std::string caption;  // what it shows, for report.md
};

ForestPlot DrawForestPlot(const Comparison& comparison);

}  // namespace ablate

#endif  // ABLATE_ORCHESTRATOR_REPORT_FOREST_H_
