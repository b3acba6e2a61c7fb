#include "orchestrator/report/report_figures.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "orchestrator/report/forest.h"
#include "orchestrator/report/svg.h"

namespace ablate {
namespace {

std::vector<double> Doubles(const std::vector<int64_t>& v) {
  return std::vector<double>(v.begin(), v.end());
}

std::string InterimSuffix(const GroupFigures& g) { return g.interim ? " (interim)" : ""; }


// Whether any of `values` (standard deviations) is a number: with one seed per variant none is.
bool AnySpread(const std::vector<double>& values) {
  return std::any_of(values.begin(), values.end(), [](double v) { return std::isfinite(v); });
}

std::optional<ReportFigure> LossFigure(const SweepFigures& f) {
  if (f.steps.empty()) return std::nullopt;
  svg::Axis x, y;
  x.label = "step";
  y.label = "training loss (log scale)";
  y.scale = svg::Scale::kLog10;
  svg::Chart chart("Training loss: mean ± std over seeds", x, y, 900, 440);
  const std::vector<double> steps = Doubles(f.steps);
  std::vector<double> spike_x, spike_y;
  size_t diverged = 0;
  for (size_t i = 0; i < f.groups.size(); ++i) {
    const GroupFigures& g = f.groups[i];
    svg::Style style;
    style.color = svg::SeriesColor(static_cast<int>(i));
    std::vector<double> lo(steps.size()), hi(steps.size());
    for (size_t k = 0; k < steps.size(); ++k) {
      lo[k] = g.loss_mean[k] - g.loss_std[k];
      hi[k] = g.loss_mean[k] + g.loss_std[k];
    }
    svg::Style band = style;
    band.opacity = 0.18;
    chart.Band(steps, lo, hi, band);
    if (g.band_runs > 0) {
      chart.Line(steps, g.loss_mean, style,
                 absl::StrCat(g.label, " (", g.band_runs, g.band_runs == 1 ? " run)" : " runs)"));
    }
    for (size_t k = 0; k < g.diverged_curves.size(); ++k) {
      const RunCurve& c = g.diverged_curves[k];
      svg::Style dashed = style;
      dashed.dashed = true;
      dashed.width = 1;
      chart.Line(
          Doubles(c.steps), c.loss, dashed,
          k == 0 ? absl::StrCat(g.label, ": diverged (", g.diverged_curves.size(), ")") : "");
      ++diverged;
    }
    for (const SpikeMark& s : g.spikes) {
      spike_x.push_back(static_cast<double>(s.step));
      spike_y.push_back(s.loss);
    }
  }
  if (!spike_x.empty()) {
    svg::Style red;
    red.color = svg::kSpikeColor;
    chart.Markers(spike_x, spike_y, red, absl::StrCat("spike events (", spike_x.size(), ")"));
  }
  bool spread = false;
  for (const GroupFigures& g : f.groups) spread = spread || AnySpread(g.loss_std);
  const std::string caption = absl::StrCat(
      "Lines: the mean training loss of each variant over its runs that did not diverge, fail or "
      "get cancelled, at every ",
      f.stride == 1 ? "step" : absl::StrCat(f.stride, "th step"),
      spread ? "; bands: ± the sample standard deviation where two or more runs have a value"
             : " (one run per variant: no band)",
      diverged > 0 ? "; dashed: diverged runs" : "",
      spike_x.empty()
          ? "."
          : "; red triangles: spike events at the run's loss (on the top edge when non-finite).");
  chart.Caption(caption);
  return ReportFigure{"figures/loss.svg", "Training loss per variant", caption, chart.Render()};
}

std::optional<ReportFigure> ValLossFigure(const SweepFigures& f) {
  std::vector<const GroupFigures*> shown;
  for (const GroupFigures& g : f.groups) {
    if (std::isfinite(g.val_loss.mean)) shown.push_back(&g);
  }
  if (shown.empty()) return std::nullopt;
  svg::Axis x, y;
  y.label = "validation loss";
  x.lo = -0.6;
  x.hi = static_cast<double>(shown.size()) - 0.4;
  x.slanted_labels = true;
  std::vector<double> xs, final_y, interim_y, stds;
  bool any_interim = false;
  for (size_t i = 0; i < shown.size(); ++i) {
    x.ticks.push_back(static_cast<double>(i));
    x.tick_labels.push_back(shown[i]->label);
    xs.push_back(static_cast<double>(i));
    final_y.push_back(shown[i]->interim ? kNaN : shown[i]->val_loss.mean);
    interim_y.push_back(shown[i]->interim ? shown[i]->val_loss.mean : kNaN);
    stds.push_back(shown[i]->val_loss.std);
    any_interim = any_interim || shown[i]->interim;
  }
  const int width = std::max(560, 120 + 52 * static_cast<int>(shown.size()));
  svg::Chart chart("Validation loss: mean ± std over seeds", x, y, width, 420);
  svg::Style bars;
  bars.color = "#2f6fde";
  bars.opacity = 0.85;
  chart.Bars(xs, final_y, 0.7, bars, any_interim ? "final (SUCCEEDED seeds)" : "");
  if (any_interim) {
    svg::Style interim;
    interim.color = "#e69a17";
    interim.opacity = 0.55;
    interim.dashed = true;
    chart.Bars(xs, interim_y, 0.7, interim, "interim (runs still training)");
  }
  // The error bars on the bars' tops, interim or not.
  std::vector<double> means;
  for (const GroupFigures* g : shown) means.push_back(g->val_loss.mean);
  svg::Style err;
  err.color = "#1d2330";
  err.width = 1.4;
  chart.ErrorBars(xs, means, stds, err);
  const std::string caption = absl::StrCat(
      "Each variant's final validation loss, mean ± sample std (error bars) over its SUCCEEDED "
      "seeds, as in the comparison table",
      AnySpread(stds) ? "" : " (one seed per variant: no error bars)",
      any_interim
          ? "; interim bars: the latest evaluation of the runs of a variant none of whose runs "
            "has finished yet"
          : "",
      ". The axis does not start at 0.");
  chart.Caption(caption);
  return ReportFigure{"figures/val_loss.svg", "Validation loss per variant", caption, chart.Render()};
}

std::optional<ReportFigure> LayerFigure(const SweepFigures& f, bool m_act) {
  int32_t layers = 0;
  for (const GroupFigures& g : f.groups) {
    for (const LayerStat& l : g.layers) layers = std::max(layers, l.layer + 1);
  }
  if (layers == 0) return std::nullopt;
  svg::Axis x, y;
  x.label = "layer";
  x.lo = -0.4;
  x.hi = layers - 0.6;
  if (layers <= 32) {
    for (int32_t l = 0; l < layers; ++l) x.ticks.push_back(l);
  }
  y.label =
      m_act ? "M-Act: max |hidden state| (log scale)" : "F-Attn: attention on the first token";
  y.scale = m_act ? svg::Scale::kLog10 : svg::Scale::kLinear;
  y.include_zero = !m_act;
  svg::Chart chart(m_act ? "M-Act per layer" : "F-Attn per layer", x, y, 760, 400);
  bool spread = false;
  for (size_t i = 0; i < f.groups.size(); ++i) {
    const GroupFigures& g = f.groups[i];
    if (g.layers.empty()) continue;
    std::vector<double> xs, mean, stds;
    for (const LayerStat& l : g.layers) {
      xs.push_back(l.layer);
      mean.push_back(m_act ? l.m_act.mean : l.f_attn.mean);
      stds.push_back(m_act ? l.m_act.std : l.f_attn.std);
    }
    svg::Style style;
    style.color = svg::SeriesColor(static_cast<int>(i));
    style.dashed = g.interim;
    chart.Line(xs, mean, style, absl::StrCat(g.label, InterimSuffix(g)));
    chart.Points(xs, mean, style);
    svg::Style err = style;
    err.width = 1;
    err.dashed = false;
    chart.ErrorBars(xs, mean, stds, err);
    spread = spread || AnySpread(stds);
  }
  const std::string caption = absl::StrCat(
      m_act ? "The largest |hidden state| each layer outputs (its residual stream after the FFN)"
            : "The attention each layer's heads give the first token, averaged over heads and "
              "query positions",
      ", at each run's last evaluation: mean ± sample std (error bars) over the SUCCEEDED seeds",
      spread ? "" : " (one seed per variant: no error bars)",
      AnyInterim(f) ? "; dashed: interim, the latest evaluation of runs still training." : ".");
  chart.Caption(caption);
  return ReportFigure{m_act ? "figures/layers_m_act.svg" : "figures/layers_f_attn.svg",
                m_act ? "M-Act per layer" : "F-Attn per layer", caption, chart.Render()};
}

std::optional<ReportFigure> HistogramFigure(const SweepFigures& f) {
  double top = 0;
  for (const GroupFigures& g : f.groups) {
    int64_t total = 0;
    for (int64_t c : g.gate_counts) total += c;
    for (int64_t c : g.gate_counts) {
      if (total > 0) {
        top = std::max(top, 100.0 * static_cast<double>(c) / static_cast<double>(total));
      }
    }
  }
  std::vector<svg::Chart> charts;
  for (size_t i = 0; i < f.groups.size(); ++i) {
    const GroupFigures& g = f.groups[i];
    if (g.gate_counts.empty()) continue;
    int64_t total = 0;
    for (int64_t c : g.gate_counts) total += c;
    const double bins = static_cast<double>(g.gate_counts.size());
    const double w = (g.gate_hi - g.gate_lo) / bins;
    std::vector<double> xs, ys;
    for (size_t b = 0; b < g.gate_counts.size(); ++b) {
      xs.push_back(g.gate_lo + w * (static_cast<double>(b) + 0.5));
      ys.push_back(total > 0
                       ? 100.0 * static_cast<double>(g.gate_counts[b]) / static_cast<double>(total)
                       : 0);
    }
    svg::Axis x, y;
    x.label = "gate score";
    x.lo = g.gate_lo;
    x.hi = g.gate_hi;
    y.label = "% of scores";
    y.lo = 0;
    y.hi = top > 0 ? top * 1.08 : 1;
    svg::Chart chart(absl::StrCat(g.label, InterimSuffix(g)), x, y, 380, 230);
    svg::Style style;
    style.color = svg::SeriesColor(static_cast<int>(i));
    style.opacity = g.interim ? 0.5 : 0.85;
    chart.Bars(xs, ys, w * 0.92, style);
    chart.Caption(absl::StrCat(g.eval_runs, g.eval_runs == 1 ? " run" : " runs", ", step ",
                               g.eval_step_min == g.eval_step_max
                                   ? absl::StrCat(g.eval_step_max)
                                   : absl::StrCat(g.eval_step_min, "–", g.eval_step_max)));
    charts.push_back(std::move(chart));
  }
  if (charts.empty()) return std::nullopt;
  const std::string caption =
      "The gate scores of every gated layer at each run's last evaluation, summed over layers and "
      "SUCCEEDED seeds, as a percentage of all scores per variant (one y scale for all). Variants "
      "without a gate have none.";
  return ReportFigure{"figures/gate_histograms.svg", "Gate-score histograms per variant", caption,
                svg::Grid("Gate-score histograms", charts, 3)};
}

std::optional<ReportFigure> LengthFigure(const ComparisonTable& t) {
  std::map<int64_t, bool> lengths;  // seq_len -> measured with YaRN by some row
  for (const ComparisonRow& r : t.rows) {
    for (const LengthStat& l : r.lengths) lengths[l.seq_len] = lengths[l.seq_len] || l.yarn;
  }
  if (lengths.empty()) return std::nullopt;
  svg::Axis x, y;
  x.label = "evaluation length (tokens, log2 scale; * with YaRN)";
  x.scale = svg::Scale::kLog2;
  for (const auto& [len, yarn] : lengths) {
    x.ticks.push_back(static_cast<double>(len));
    x.tick_labels.push_back(absl::StrCat(len, yarn ? "*" : ""));
  }
  y.label = "validation PPL";
  svg::Chart chart("Validation PPL against evaluation length", x, y, 820, 420);
  for (size_t i = 0; i < t.rows.size(); ++i) {
    const ComparisonRow& r = t.rows[i];
    if (r.lengths.empty()) continue;
    std::vector<double> xs, mean, stds;
    for (const LengthStat& l : r.lengths) {
      xs.push_back(static_cast<double>(l.seq_len));
      mean.push_back(l.val_ppl.mean);
      stds.push_back(l.val_ppl.std);
    }
    svg::Style style;
    style.color = svg::SeriesColor(static_cast<int>(i));
    style.width = 2;
    chart.Line(xs, mean, style,
               r.axes.empty() ? r.variant : absl::StrCat(r.variant, " (", r.axes, ")"));
    chart.Points(xs, mean, style);
    svg::Style err = style;
    err.width = 1.2;
    chart.ErrorBars(xs, mean, stds, err);
  }
  const std::string caption =
      "Each variant's final validation PPL at each train.eval_seq_lens length, mean ± sample std "
      "(error bars) over the SUCCEEDED seeds; * lengths measured with YaRN RoPE scaling.";
  chart.Caption(caption);
  return ReportFigure{"figures/ppl_length.svg", "Validation PPL against evaluation length", caption,
                chart.Render()};
}

std::optional<ReportFigure> CompareFigure(const Comparison* comparison) {
  if (comparison == nullptr) return std::nullopt;
  ForestPlot plot = DrawForestPlot(*comparison);
  if (plot.svg.empty()) return std::nullopt;
  return ReportFigure{"figures/compare.svg", absl::StrCat("Against ", comparison->reference),
                      plot.caption, std::move(plot.svg)};
}

// A tuned sweep: each group's final metric against the tuned value (the mean over SUCCEEDED
// seeds, a line), the runs a tuner STOPPED at their rung's value (rings), the values where a
// run DIVERGED (triangles on the top edge), and a boundary sweep's brackets (dashed verticals).
std::optional<ReportFigure> TuneFigure(const TuneFigures* tune) {
  if (tune == nullptr || tune->curves.empty()) return std::nullopt;
  const TuneInfo& info = tune->tune;
  svg::Axis x, y;
  x.label = absl::StrCat(info.axis, tune->log_scale ? " (log scale)" : "");
  if (tune->log_scale) x.scale = svg::Scale::kLog10;
  y.label = absl::StrCat(info.metric, " at the end (rings: at the rung a run was stopped)");
  svg::Chart chart(absl::StrCat(info.metric, " against ", info.axis), x, y, 820, 420);
  double y_lo = std::numeric_limits<double>::infinity(), y_hi = -y_lo;
  for (size_t i = 0; i < tune->curves.size(); ++i) {
    const TuneCurve& c = tune->curves[i];
    svg::Style style;
    style.color = svg::SeriesColor(static_cast<int>(i));
    style.width = 2;
    std::vector<double> xs, mean, stopped_x, stopped_y, diverged_x;
    for (const TunePoint& p : c.points) {
      if (p.finished > 0) {
        xs.push_back(p.value);
        mean.push_back(p.mean);
        y_lo = std::min(y_lo, p.mean);
        y_hi = std::max(y_hi, p.mean);
      }
      for (const TuneStop& s : p.stopped) {
        stopped_x.push_back(p.value);
        stopped_y.push_back(s.metric);
      }
      if (p.diverged > 0) diverged_x.push_back(p.value);
    }
    chart.Line(xs, mean, style,
               c.axes.empty() ? c.variant : absl::StrCat(c.variant, " (", c.axes, ")"));
    chart.Points(xs, mean, style);
    svg::Style ring = style;
    ring.hollow = true;
    chart.Points(stopped_x, stopped_y, ring);
    chart.Markers(diverged_x, std::vector<double>(diverged_x.size(), kNaN), style);
  }
  // A boundary sweep's brackets: dashed verticals at the stable and the unstable value, across
  // the plotted metrics' range.
  bool brackets = false;
  for (size_t i = 0; i < tune->curves.size(); ++i) {
    const std::optional<BracketInfo>& b = tune->curves[i].bracket;
    if (!b || !(y_hi >= y_lo)) continue;
    brackets = true;
    svg::Style edge;
    edge.color = svg::SeriesColor(static_cast<int>(i));
    edge.dashed = true;
    edge.width = 1.2;
    for (double v : {b->stable, b->unstable}) {
      if (std::isfinite(v)) chart.Line({v, v}, {y_lo, y_hi}, edge);
    }
  }
  const std::string caption = absl::StrCat(
      "Each variant's ", info.metric, " against ", info.axis, " (", info.method,
      "): the mean over the seeds that trained to the end (line and dots), runs the tuner stopped "
      "at a rung with their metric there (rings), and values where a run diverged (triangles on "
      "the top edge)", brackets ? "; dashed: each variant's stability bracket." : ".");
  chart.Caption(caption);
  return ReportFigure{"figures/tune.svg", absl::StrCat(info.metric, " against ", info.axis),
                      caption, chart.Render()};
}

}  // namespace

bool AnyInterim(const SweepFigures& f) {
  return std::any_of(f.groups.begin(), f.groups.end(),
                     [](const GroupFigures& g) { return g.interim; });
}

std::vector<ReportFigure> DrawReportFigures(const SweepFigures& figures, const ComparisonTable& table,
                                            const Comparison* comparison,
                                            const TuneFigures* tune) {
  std::vector<ReportFigure> out;
  for (std::optional<ReportFigure> f :
       {LossFigure(figures), ValLossFigure(figures), CompareFigure(comparison),
        TuneFigure(tune),
        LayerFigure(figures, true), LayerFigure(figures, false), HistogramFigure(figures),
        LengthFigure(table)}) {
    if (f) out.push_back(*std::move(f));
  }
  return out;
}

}  // namespace ablate
