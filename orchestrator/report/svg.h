// A small SVG plotting module for `ablate report`: line charts, mean ± std bands, markers, bars
// with error bars, on linear, log10 or log2 axes with ticks, a title and a legend; and a grid of
// small charts in one SVG. Written from C++ so that a report needs no browser, and
// deterministically: the same calls give the same bytes (coordinates to 0.1 px, fixed formats, no
// clock, no randomness, ids numbered in call order).
//
//   svg::Axis x, y;
//   x.label = "step";
//   y.label = "loss";
//   y.scale = svg::Scale::kLog10;
//   svg::Chart chart("Training loss", x, y);
//   svg::Style style;
//   style.color = svg::SeriesColor(0);
//   chart.Band(steps, lo, hi, style);
//   chart.Line(steps, mean, style, "baseline");
//   std::string text = chart.Render();
//
// Non-finite values are gaps in lines and bands, and are skipped by bars and error bars; a
// marker with a non-finite y sits on the top edge. Not thread-safe; copyable.
#ifndef ABLATE_ORCHESTRATOR_REPORT_SVG_H_
#define ABLATE_ORCHESTRATOR_REPORT_SVG_H_

#include <string>
#include <vector>

namespace ablate {
namespace svg {

enum class Scale { kLinear, kLog10, kLog2 };

struct Axis {
  std::string label;
  Scale scale = Scale::kLinear;
  // The range: from the data when lo >= hi (rounded out to ticks on a linear axis), else fixed.
  double lo = 0, hi = 0;
  bool include_zero = false;  // a data range is widened to 0
  // Explicit ticks (each labelled by tick_labels[i] when given, else formatted); empty: chosen
  // from the range (1-2-5 steps; decades on a log10 axis, powers of 2 on a log2 one).
  std::vector<double> ticks;
  std::vector<std::string> tick_labels;
  bool slanted_labels = false;  // tick labels at -35 degrees (long category names)
};

struct Style {
  std::string color = "#2f6fde";
  double width = 1.5;    // stroke width, px
  double opacity = 1.0;  // fill opacity of bands and bars, stroke opacity of lines
  bool dashed = false;
  bool hollow = false;   // Points: an outlined circle, not a filled one
};

// One plot area with its axes; elements are drawn in the order they were added.
class Chart {
 public:
  Chart(std::string title, Axis x, Axis y, int width = 760, int height = 400);

  // A polyline through the finite points, broken at non-finite ones.
  void Line(const std::vector<double>& x, const std::vector<double>& y, const Style& style,
            const std::string& legend = "");
  // The area between lo and hi (a mean ± std band), broken where either is non-finite.
  void Band(const std::vector<double>& x, const std::vector<double>& lo,
            const std::vector<double>& hi, const Style& style, const std::string& legend = "");
  // A filled triangle at each point (spike markers); non-finite or above-range y: the top edge.
  void Markers(const std::vector<double>& x, const std::vector<double>& y, const Style& style,
               const std::string& legend = "");
  // A dot at each finite point (a ring with style.hollow).
  void Points(const std::vector<double>& x, const std::vector<double>& y, const Style& style);
  // Vertical bars centred on x, `width` in x units, from the bottom of the plot (or 0 when 0 is
  // in range) to y.
  void Bars(const std::vector<double>& x, const std::vector<double>& y, double width,
            const Style& style, const std::string& legend = "");
  // mean ± std error bars with caps, where both are finite and std > 0.
  void ErrorBars(const std::vector<double>& x, const std::vector<double>& mean,
                 const std::vector<double>& std, const Style& style);
  // A line of text under the plot (what the figure shows, what it leaves out).
  void Caption(const std::string& text);

  int width() const { return width_; }
  int height() const;  // with the legend's and the caption's room
  // A whole SVG document.
  std::string Render() const;
  // The chart's elements translated to (left, top), for Grid; `id` keeps clip paths apart.
  std::string RenderAt(double left, double top, const std::string& id) const;

 private:
  enum class Kind { kLine, kBand, kMarkers, kPoints, kBars, kErrorBars };
  struct Element {
    Kind kind;
    std::vector<double> x, y, z;  // z: a band's hi, error bars' std
    double bar_width = 0;
    Style style;
    std::string legend;
  };
  struct Frame;   // the resolved ranges and the plot area (svg.cc)
  class Painter;  // draws the pieces of RenderAt over a Frame (svg.cc)

  Frame Resolve() const;
  void Add(Element e);

  std::string title_;
  Axis x_, y_;
  int width_, height_;
  std::vector<Element> elements_;
  std::vector<std::string> captions_;
};

// Charts side by side, `columns` per row, in one SVG document under a title.
std::string Grid(const std::string& title, const std::vector<Chart>& charts, int columns);

// The colour of series `index` (0-based): golden-angle hues, as the dashboard's runColor
// (dashboard/js/format.js), as #rrggbb.
std::string SeriesColor(int index);
inline constexpr char kSpikeColor[] = "#d64541";

// Text for SVG and HTML: & < > " escaped.
std::string Escape(const std::string& text);

}  // namespace svg
}  // namespace ablate

#endif  // ABLATE_ORCHESTRATOR_REPORT_SVG_H_
