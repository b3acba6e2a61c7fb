#include "orchestrator/report/forest.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "orchestrator/report/svg.h"

namespace ablate {

ForestPlot DrawForestPlot(const Comparison& c) {
  std::vector<const CompareRow*> shown;
  for (const CompareRow& r : c.rows) {
    if (std::isfinite(r.ci_low) && std::isfinite(r.ci_high)) shown.push_back(&r);
  }
  if (shown.empty()) return {};
  svg::Axis x, y;
  y.label = absl::StrCat(c.heading, ": variant − ", c.reference);
  y.include_zero = true;
  x.lo = -0.6;
  x.hi = static_cast<double>(shown.size()) - 0.4;
  x.slanted_labels = true;
  std::vector<double> xs, delta, half, better_x, better_y, other_x, other_y;
  for (size_t i = 0; i < shown.size(); ++i) {
    const CompareRow& r = *shown[i];
    const double at = static_cast<double>(i);
    x.ticks.push_back(at);
    x.tick_labels.push_back(r.axes.empty() ? r.variant : absl::StrCat(r.variant, " ", r.axes));
    xs.push_back(at);
    delta.push_back(r.delta);
    // t intervals are symmetric about the difference.
    half.push_back((r.ci_high - r.ci_low) / 2);
    const bool decided = r.verdict == kBetter || r.verdict == kWorse || r.verdict == kLower ||
                         r.verdict == kHigher;
    (decided ? better_x : other_x).push_back(at);
    (decided ? better_y : other_y).push_back(r.delta);
  }
  const int width = std::max(560, 120 + 52 * static_cast<int>(shown.size()));
  const int level = static_cast<int>(std::lround(100 * (1 - c.alpha)));
  svg::Chart chart(absl::StrCat("Against ", c.reference, ": difference in ", c.heading, ", ", level,
                                "% intervals"),
                   x, y, width, 420);
  svg::Style zero;
  zero.color = "#6b7280";
  zero.dashed = true;
  zero.width = 1;
  chart.Line({x.lo, x.hi}, {0, 0}, zero);
  svg::Style bars;
  bars.color = "#2f6fde";
  bars.width = 1.6;
  chart.ErrorBars(xs, delta, half, bars);
  svg::Style decided;
  decided.color = "#1d2330";
  chart.Points(better_x, better_y, decided);
  svg::Style undecided;
  undecided.color = "#9aa3b2";
  chart.Points(other_x, other_y, undecided);
  ForestPlot plot;
  plot.caption = absl::StrCat(
      "Each variant's mean difference from ", c.reference, " in ", c.heading, " (",
      c.lower_is_better    ? "below zero is better"
      : c.higher_is_better ? "above zero is better"
                           : "no better direction",
      ") with its ", level,
      "% interval, paired by seed (Welch's interval where the seeds do "
      "not pair). Dark points: a verdict at alpha ",
      c.alpha, c.correction == "holm" ? " after Holm's correction" : "",
      "; grey: no detectable difference, or a diverged seed. Rows without an interval are left "
      "out.");
  chart.Caption(plot.caption);
  plot.svg = chart.Render();
  return plot;
}

}  // namespace ablate
