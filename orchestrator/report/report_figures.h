#pragma once
// The SVG figures of `ablate report`: training loss, validation loss, the forest plot against the
// reference, M-Act and F-Attn per layer, gate-score histograms and PPL against evaluation length,
// each drawn from the numbers figures.h and comparison.h compute, in the order report.md shows
// them.

#include <string>
#include <vector>

#include "orchestrator/report/figures.h"
#include "orchestrator/report/tune_figures.h"
#include "orchestrator/stats/comparison.h"
#include "orchestrator/store/reader.h"

namespace ablate {

struct ReportFigure {
  std::string file;     // figures/NAME.svg
  std::string title;    // alt text and heading
  std::string caption;  // under it in report.md
  std::string svg;
};

// Whether some group's figures are interim (from runs still training).
bool AnyInterim(const SweepFigures& figures);

// Every figure that has something to show; `comparison` may be null (no reference in the sweep),
// `tune` null (a sweep without `tune:`).
std::vector<ReportFigure> DrawReportFigures(const SweepFigures& figures,
                                            const ComparisonTable& table,
                                            const Comparison* comparison,
                                            const TuneFigures* tune = nullptr);

}  // namespace ablate
