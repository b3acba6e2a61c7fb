// The SVG plotting module (svg.h): each axis's range and ticks, a chart's frame (the plot area
// and its margins), and the drawing of a frame's pieces (Chart::Painter), all deterministic.
#include "orchestrator/report/svg.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "fmt/format.h"

namespace ablate {
namespace svg {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kFontSize = 12;
constexpr double kCharWidth = 6.6;  // an average character at kFontSize, px (no font metrics)
constexpr double kLegendLine = 17;
constexpr double kCaptionLine = 15;
constexpr char kFonts[] =
    "system-ui, -apple-system, 'Segoe UI', Roboto, Helvetica, Arial, sans-serif";
constexpr char kInk[] = "#1d2330";
constexpr char kMuted[] = "#5b6374";
constexpr char kGridLine[] = "#e6e8ec";

// A coordinate to 0.1 px, never "-0.0".
std::string Px(double v) {
  const double r = std::round(v * 10) / 10;
  return fmt::format("{:.1f}", r == 0 ? 0.0 : r);
}

double Forward(Scale s, double v) {
  switch (s) {
    case Scale::kLog10:
      return std::log10(v);
    case Scale::kLog2:
      return std::log2(v);
    case Scale::kLinear:
      break;
  }
  return v;
}

bool Plottable(Scale s, double v) { return std::isfinite(v) && (s == Scale::kLinear || v > 0); }

// 1, 2, 2.5 or 5 times a power of ten, at least `raw`.
double NiceStep(double raw) {
  if (!(raw > 0) || !std::isfinite(raw)) return 1;
  const double power = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 2.5, 5.0, 10.0}) {
    if (m * power >= raw * (1 - 1e-9)) return m * power;
  }
  return 10 * power;
}

// Decimals that show every multiple of `step` exactly (2.5 -> 1, 0.02 -> 2, 50 -> 0).
int DecimalsFor(double step) {
  for (int d = 0; d < 12; ++d) {
    const double scaled = step * std::pow(10.0, d);
    if (std::fabs(scaled - std::round(scaled)) <= 1e-6 * std::max(1.0, scaled)) return d;
  }
  return 12;
}

std::string TickText(double v, int decimals) {
  const std::string s = fmt::format("{:.{}f}", v, decimals);
  return s == "-0" || s.find_first_not_of("-0.") == std::string::npos
             ? fmt::format("{:.{}f}", 0.0, decimals)
             : s;
}

std::string ShortNumber(double v) { return fmt::format("{:g}", v); }

// At most `max_chars` bytes, cut at a UTF-8 character boundary, "…" marking a cut.
std::string Clip(const std::string& text, size_t max_chars) {
  if (text.size() <= max_chars) return text;
  size_t end = max_chars - 1;
  while (end > 0 && (static_cast<unsigned char>(text[end]) & 0xC0) == 0x80) --end;
  return text.substr(0, end) + "…";
}

// Words into lines of at most `chars` characters.
std::vector<std::string> Wrap(const std::string& text, size_t chars) {
  std::vector<std::string> lines;
  std::string line;
  for (absl::string_view word : absl::StrSplit(text, ' ', absl::SkipEmpty())) {
    if (!line.empty() && line.size() + 1 + word.size() > chars) {
      lines.push_back(line);
      line.clear();
    }
    absl::StrAppend(&line, line.empty() ? "" : " ", word);
  }
  if (!line.empty()) lines.push_back(line);
  return lines;
}

struct Ticks {
  double lo = 0, hi = 1;
  std::vector<double> at;
  std::vector<std::string> labels;
};

// The range and ticks of an axis over data in [lo, hi] (finite and, on log axes, positive), about
// one tick per `spacing_px` of its `length_px`.
Ticks ResolveAxis(const Axis& axis, double lo, double hi, double length_px, double spacing_px) {
  Ticks t;
  const bool fixed = axis.lo < axis.hi;
  if (fixed) {
    lo = axis.lo;
    hi = axis.hi;
  } else if (!(lo <= hi)) {  // no data
    lo = axis.scale == Scale::kLinear ? 0 : 1;
    hi = axis.scale == Scale::kLinear ? 1 : 10;
  }
  if (axis.include_zero && axis.scale == Scale::kLinear && !fixed) {
    lo = std::min(lo, 0.0);
    hi = std::max(hi, 0.0);
  }
  const int target = std::max(3, static_cast<int>(length_px / spacing_px));
  if (axis.scale == Scale::kLinear) {
    if (hi - lo <= 0) {
      const double pad = lo == 0 ? 1 : std::fabs(lo) * 0.1;
      lo -= pad;
      hi += pad;
    }
    const double step = NiceStep((hi - lo) / target);
    if (!fixed) {
      lo = std::floor(lo / step + 1e-9) * step;
      hi = std::ceil(hi / step - 1e-9) * step;
    }
    t.lo = lo;
    t.hi = hi;
    if (axis.ticks.empty()) {
      const int decimals = DecimalsFor(step);
      for (double k = std::ceil(lo / step - 1e-9); k * step <= hi + step * 1e-9; k += 1) {
        t.at.push_back(k * step);
        t.labels.push_back(TickText(k * step, decimals));
      }
    }
  } else {
    if (!fixed) {
      const double pad = axis.scale == Scale::kLog2 ? std::pow(2.0, 0.25) : 1.06;
      if (hi / lo < 1.01) {
        lo /= 1.1;
        hi *= 1.1;
      }
      lo /= pad;
      hi *= pad;
    }
    t.lo = lo;
    t.hi = hi;
    if (axis.ticks.empty() && axis.scale == Scale::kLog2) {
      for (double p = std::ceil(std::log2(lo)); std::pow(2.0, p) <= hi; p += 1) {
        t.at.push_back(std::pow(2.0, p));
        t.labels.push_back(ShortNumber(std::pow(2.0, p)));
      }
    } else if (axis.ticks.empty() && hi / lo < 3) {
      // Less than a factor of 3: linear steps read better than decades.
      const double step = NiceStep((hi - lo) / target);
      const int decimals = DecimalsFor(step);
      for (double k = std::ceil(lo / step - 1e-9); k * step <= hi; k += 1) {
        t.at.push_back(k * step);
        t.labels.push_back(TickText(k * step, decimals));
      }
    } else if (axis.ticks.empty()) {
      for (const std::vector<double>& mantissas :
           std::vector<std::vector<double>>{{1, 2, 3, 4, 5, 6, 7, 8, 9}, {1, 2, 5}, {1}}) {
        t.at.clear();
        for (double p = std::floor(std::log10(lo)); std::pow(10.0, p) <= hi; p += 1) {
          for (double m : mantissas) {
            const double v = m * std::pow(10.0, p);
            if (v >= lo && v <= hi) t.at.push_back(v);
          }
        }
        if (static_cast<int>(t.at.size()) <= target + 1) break;
      }
      for (double v : t.at) t.labels.push_back(ShortNumber(v));
    }
  }
  if (!axis.ticks.empty()) {
    for (size_t i = 0; i < axis.ticks.size(); ++i) {
      const double v = axis.ticks[i];
      if (!Plottable(axis.scale, v) || v < t.lo || v > t.hi) continue;
      t.at.push_back(v);
      t.labels.push_back(i < axis.tick_labels.size() ? axis.tick_labels[i] : ShortNumber(v));
    }
  }
  return t;
}

}  // namespace

struct Chart::Frame {
  double left = 0, top = 0, plot_w = 0, plot_h = 0;
  Scale xs = Scale::kLinear, ys = Scale::kLinear;
  Ticks xt, yt;
  double x_label_y = 0;    // baseline of the x axis label
  double caption_top = 0;  // baseline of the first caption line
  double legend_left = 0;
  int total_height = 0;

  double X(double v) const {
    return left + (Forward(xs, v) - Forward(xs, xt.lo)) /
                      (Forward(xs, xt.hi) - Forward(xs, xt.lo)) * plot_w;
  }
  double Y(double v) const {
    return top + plot_h -
           (Forward(ys, v) - Forward(ys, yt.lo)) / (Forward(ys, yt.hi) - Forward(ys, yt.lo)) *
               plot_h;
  }
  bool InX(double v) const { return Plottable(xs, v) && v >= xt.lo && v <= xt.hi; }
};

Chart::Chart(std::string title, Axis x, Axis y, int width, int height)
    : title_(std::move(title)),
      x_(std::move(x)),
      y_(std::move(y)),
      width_(width),
      height_(height) {}

void Chart::Add(Element e) { elements_.push_back(std::move(e)); }

void Chart::Line(const std::vector<double>& x, const std::vector<double>& y, const Style& style,
                 const std::string& legend) {
  Add(Element{Kind::kLine, x, y, {}, 0, style, legend});
}

void Chart::Band(const std::vector<double>& x, const std::vector<double>& lo,
                 const std::vector<double>& hi, const Style& style, const std::string& legend) {
  Add(Element{Kind::kBand, x, lo, hi, 0, style, legend});
}

void Chart::Markers(const std::vector<double>& x, const std::vector<double>& y, const Style& style,
                    const std::string& legend) {
  Add(Element{Kind::kMarkers, x, y, {}, 0, style, legend});
}

void Chart::Points(const std::vector<double>& x, const std::vector<double>& y, const Style& style) {
  Add(Element{Kind::kPoints, x, y, {}, 0, style, ""});
}

void Chart::Bars(const std::vector<double>& x, const std::vector<double>& y, double width,
                 const Style& style, const std::string& legend) {
  Add(Element{Kind::kBars, x, y, {}, width, style, legend});
}

void Chart::ErrorBars(const std::vector<double>& x, const std::vector<double>& mean,
                      const std::vector<double>& std, const Style& style) {
  Add(Element{Kind::kErrorBars, x, mean, std, 0, style, ""});
}

void Chart::Caption(const std::string& text) { captions_.push_back(text); }

Chart::Frame Chart::Resolve() const {
  Frame f;
  f.xs = x_.scale;
  f.ys = y_.scale;
  // The data's extent on each axis.
  double x_lo = kInf, x_hi = -kInf, y_lo = kInf, y_hi = -kInf;
  auto see_x = [&](double v) {
    if (Plottable(x_.scale, v)) x_lo = std::min(x_lo, v), x_hi = std::max(x_hi, v);
  };
  auto see_y = [&](double v) {
    if (Plottable(y_.scale, v)) y_lo = std::min(y_lo, v), y_hi = std::max(y_hi, v);
  };
  bool bars = false;
  for (const Element& e : elements_) {
    for (size_t i = 0; i < e.x.size() && i < e.y.size(); ++i) {
      switch (e.kind) {
        case Kind::kBars:
          bars = true;
          if (!std::isfinite(e.y[i])) break;
          see_x(e.x[i] - e.bar_width / 2);
          see_x(e.x[i] + e.bar_width / 2);
          see_y(e.y[i]);
          break;
        case Kind::kErrorBars:
          see_x(e.x[i]);
          if (i < e.z.size() && std::isfinite(e.z[i])) {
            see_y(e.y[i] - e.z[i]);
            see_y(e.y[i] + e.z[i]);
          }
          see_y(e.y[i]);
          break;
        case Kind::kBand:
          see_x(e.x[i]);
          see_y(e.y[i]);
          if (i < e.z.size()) see_y(e.z[i]);
          break;
        case Kind::kMarkers:
          see_x(e.x[i]);  // y: on the curve, or the top edge
          break;
        case Kind::kLine:
        case Kind::kPoints:
          see_x(e.x[i]);
          see_y(e.y[i]);
          break;
      }
    }
  }
  // Bars read against a baseline below them: some room under the shortest.
  if (bars && y_lo < y_hi && !(y_.lo < y_.hi) && !y_.include_zero) {
    y_lo -= 0.25 * (y_hi - y_lo);
  }

  // Margins: the y tick labels' width, the x labels' height (slanted ones need more), the legend.
  std::vector<std::string> legends;
  for (const Element& e : elements_) {
    if (!e.legend.empty()) legends.push_back(e.legend);
  }
  size_t longest_legend = 0;
  for (const std::string& l : legends) longest_legend = std::max(longest_legend, l.size());
  const double legend_w =
      legends.empty() ? 0 : std::min(260.0, 30 + kCharWidth * static_cast<double>(longest_legend));
  size_t longest_x_label = 0;
  for (const std::string& l : x_.tick_labels) longest_x_label = std::max(longest_x_label, l.size());
  const double x_labels_h =
      x_.slanted_labels
          ? 12 + 0.6 * kCharWidth * static_cast<double>(std::min<size_t>(longest_x_label, 28))
          : 18;
  f.top = title_.empty() ? 14 : 34;
  f.plot_h = height_ - f.top - x_labels_h - (x_.label.empty() ? 8 : 26);
  f.yt = ResolveAxis(y_, y_lo, y_hi, f.plot_h, 50);
  size_t widest_y = 0;
  for (const std::string& l : f.yt.labels) widest_y = std::max(widest_y, l.size());
  f.left = 18 + (y_.label.empty() ? 0 : 18) + kCharWidth * static_cast<double>(widest_y);
  f.plot_w = width_ - f.left - 16 - (legend_w > 0 ? legend_w + 12 : 0);
  f.xt = ResolveAxis(x_, x_lo, x_hi, f.plot_w, 90);
  f.x_label_y = f.top + f.plot_h + x_labels_h + 16;
  f.legend_left = f.left + f.plot_w + 16;
  // Captions start under the plot, or under a legend taller than it.
  double total = std::max(static_cast<double>(height_),
                          f.top + kLegendLine * static_cast<double>(legends.size()) + 8);
  f.caption_top = total + 8;
  for (const std::string& c : captions_) {
    total += kCaptionLine *
             static_cast<double>(Wrap(c, static_cast<size_t>(width_ / kCharWidth)).size());
  }
  f.total_height = static_cast<int>(std::ceil(total));
  return f;
}

int Chart::height() const { return Resolve().total_height; }

namespace {

// A series' stroke attributes: colour, width, opacity below 1, dashes.
std::string StrokeAttributes(const Style& s) {
  return absl::StrCat(
      " stroke=\"", s.color, "\" stroke-width=\"", Px(s.width), "\"",
      s.opacity < 1 ? absl::StrCat(" stroke-opacity=\"", fmt::format("{:.2f}", s.opacity), "\"")
                    : "",
      s.dashed ? " stroke-dasharray=\"5 3\"" : "");
}

std::string Opacity(double v) { return fmt::format("{:.2f}", v); }

}  // namespace

// Draws a chart over its resolved frame, piece by piece, appending to one string: the title,
// the axes, the data (clipped to the plot area), the legend and the captions, in that order.
class Chart::Painter {
 public:
  Painter(const Chart& chart, const Frame& frame, std::string* out)
      : chart_(chart), f_(frame), out_(*out) {}

  void Title() {
    if (chart_.title_.empty()) return;
    absl::StrAppend(&out_, "<text x=\"", Px(f_.left),
                    "\" y=\"20\" font-size=\"14\" font-weight=\"600\" fill=\"", kInk, "\">",
                    Escape(chart_.title_), "</text>\n");
  }

  // Grid lines, tick labels, the plot's frame and the axis labels.
  void Axes() {
    GridLines();
    TickLabels();
    const std::string pl = Px(f_.left), pt = Px(f_.top), pw = Px(f_.plot_w), ph = Px(f_.plot_h);
    absl::StrAppend(&out_, "<rect x=\"", pl, "\" y=\"", pt, "\" width=\"", pw, "\" height=\"", ph,
                    "\" fill=\"none\" stroke=\"#9aa1ad\" stroke-width=\"1\"/>\n");
    if (!chart_.x_.label.empty()) {
      absl::StrAppend(&out_, "<text x=\"", Px(f_.left + f_.plot_w / 2), "\" y=\"",
                      Px(f_.x_label_y), "\" text-anchor=\"middle\" fill=\"", kInk, "\">",
                      Escape(chart_.x_.label), "</text>\n");
    }
    if (!chart_.y_.label.empty()) {
      const std::string cy = Px(f_.top + f_.plot_h / 2);
      absl::StrAppend(&out_, "<text x=\"14\" y=\"", cy,
                      "\" text-anchor=\"middle\" transform=\"rotate(-90 14 ", cy, ")\" fill=\"",
                      kInk, "\">", Escape(chart_.y_.label), "</text>\n");
    }
  }

  // The elements in the order added, clipped to the plot area `id` names; markers after them,
  // unclipped, so that one without a value shows on the top edge.
  void Data(const std::string& id) {
    const std::string pl = Px(f_.left), pt = Px(f_.top), pw = Px(f_.plot_w), ph = Px(f_.plot_h);
    absl::StrAppend(&out_, "<clipPath id=\"", id, "\"><rect x=\"", pl, "\" y=\"", pt,
                    "\" width=\"", pw, "\" height=\"", ph,
                    "\"/></clipPath>\n<g clip-path=\"url(#", id, ")\">\n");
    std::string markers;
    for (const Element& e : chart_.elements_) {
      // A case a line: this switch is a dispatch table, one painter a kind.
      switch (e.kind) {
        case Kind::kLine: Line(e); break;
        case Kind::kBand: Band(e); break;
        case Kind::kBars: Bars(e); break;
        case Kind::kErrorBars: ErrorBars(e); break;
        case Kind::kPoints: Points(e); break;
        case Kind::kMarkers: Markers(e, &markers); break;
      }
    }
    absl::StrAppend(&out_, "</g>\n", markers);
  }

  // Right of the plot: a swatch and the text of each entry, in the order added.
  void Legend() {
    double ly = f_.top + 6;
    for (const Element& e : chart_.elements_) {
      if (e.legend.empty()) continue;
      Swatch(e, ly);
      absl::StrAppend(&out_, "<text x=\"", Px(f_.legend_left + 20), "\" y=\"", Px(ly + 9),
                      "\" font-size=\"11\" fill=\"", kInk, "\">", Escape(Clip(e.legend, 34)),
                      "</text>\n");
      ly += kLegendLine;
    }
  }

  // Under everything, each wrapped to the chart's width.
  void Captions() {
    double cy = f_.caption_top;
    for (const std::string& c : chart_.captions_) {
      for (const std::string& line :
           Wrap(c, static_cast<size_t>(chart_.width_ / kCharWidth))) {
        absl::StrAppend(&out_, "<text x=\"", Px(f_.left), "\" y=\"", Px(cy),
                        "\" font-size=\"11\" fill=\"", kMuted, "\">", Escape(line), "</text>\n");
        cy += kCaptionLine;
      }
    }
  }

 private:
  static size_t Count(const Element& e) { return std::min(e.x.size(), e.y.size()); }
  double Bottom() const { return f_.top + f_.plot_h; }

  void GridLines() {
    absl::StrAppend(&out_, "<g stroke=\"", kGridLine, "\" stroke-width=\"1\">");
    for (double v : f_.yt.at) {
      absl::StrAppend(&out_, "<line x1=\"", Px(f_.left), "\" x2=\"", Px(f_.left + f_.plot_w),
                      "\" y1=\"", Px(f_.Y(v)), "\" y2=\"", Px(f_.Y(v)), "\"/>");
    }
    for (double v : f_.xt.at) {
      absl::StrAppend(&out_, "<line x1=\"", Px(f_.X(v)), "\" x2=\"", Px(f_.X(v)), "\" y1=\"",
                      Px(f_.top), "\" y2=\"", Px(Bottom()), "\"/>");
    }
    absl::StrAppend(&out_, "</g>\n");
  }

  void TickLabels() {
    absl::StrAppend(&out_, "<g font-size=\"11\" fill=\"", kMuted, "\">");
    for (size_t i = 0; i < f_.yt.at.size(); ++i) {
      absl::StrAppend(&out_, "<text x=\"", Px(f_.left - 6), "\" y=\"", Px(f_.Y(f_.yt.at[i]) + 4),
                      "\" text-anchor=\"end\">", Escape(f_.yt.labels[i]), "</text>");
    }
    for (size_t i = 0; i < f_.xt.at.size(); ++i) {
      const std::string x = Px(f_.X(f_.xt.at[i])), y = Px(Bottom() + 15);
      const std::string label = Escape(Clip(f_.xt.labels[i], 28));
      if (chart_.x_.slanted_labels) {
        absl::StrAppend(&out_, "<text x=\"", x, "\" y=\"", y,
                        "\" text-anchor=\"end\" transform=\"rotate(-35 ", x, " ", y, ")\">",
                        label, "</text>");
      } else {
        absl::StrAppend(&out_, "<text x=\"", x, "\" y=\"", y, "\" text-anchor=\"middle\">",
                        label, "</text>");
      }
    }
    absl::StrAppend(&out_, "</g>\n");
  }

  void Line(const Element& e) {
    std::string d;
    bool pen_down = false;
    for (size_t i = 0; i < Count(e); ++i) {
      if (!Plottable(f_.xs, e.x[i]) || !Plottable(f_.ys, e.y[i])) {
        pen_down = false;
        continue;
      }
      absl::StrAppend(&d, pen_down ? "L" : "M", Px(f_.X(e.x[i])), " ", Px(f_.Y(e.y[i])));
      pen_down = true;
    }
    if (!d.empty()) {
      absl::StrAppend(&out_, "<path d=\"", d, "\" fill=\"none\"", StrokeAttributes(e.style),
                      " stroke-linejoin=\"round\"/>\n");
    }
  }

  // One polygon per run of points where lo and hi are both plottable.
  void Band(const Element& e) {
    const size_t n = Count(e);
    auto ok = [&](size_t k) {
      return k < e.z.size() && Plottable(f_.xs, e.x[k]) && Plottable(f_.ys, e.y[k]) &&
             Plottable(f_.ys, e.z[k]);
    };
    size_t i = 0;
    while (i < n) {
      while (i < n && !ok(i)) ++i;
      size_t j = i;
      while (j < n && ok(j)) ++j;
      if (j - i >= 2) {
        std::string d;
        for (size_t k = i; k < j; ++k) {
          absl::StrAppend(&d, k == i ? "M" : "L", Px(f_.X(e.x[k])), " ", Px(f_.Y(e.z[k])));
        }
        for (size_t k = j; k-- > i;) {
          absl::StrAppend(&d, "L", Px(f_.X(e.x[k])), " ", Px(f_.Y(e.y[k])));
        }
        absl::StrAppend(&out_, "<path d=\"", d, "Z\" fill=\"", e.style.color,
                        "\" fill-opacity=\"", Opacity(e.style.opacity), "\" stroke=\"none\"/>\n");
      }
      i = j;
    }
  }

  // From 0 when 0 is in range, else from the bottom of the plot.
  void Bars(const Element& e) {
    const double bottom = Bottom();
    const double base =
        Plottable(f_.ys, 0) && f_.yt.lo <= 0 && f_.yt.hi >= 0 ? f_.Y(0) : bottom;
    for (size_t i = 0; i < Count(e); ++i) {
      if (!Plottable(f_.ys, e.y[i]) || !Plottable(f_.xs, e.x[i])) continue;
      const double x0 = f_.X(e.x[i] - e.bar_width / 2), x1 = f_.X(e.x[i] + e.bar_width / 2);
      const double y = std::clamp(f_.Y(e.y[i]), f_.top, bottom);
      absl::StrAppend(
          &out_, "<rect x=\"", Px(x0), "\" y=\"", Px(std::min(y, base)), "\" width=\"",
          Px(x1 - x0), "\" height=\"", Px(std::fabs(base - y)), "\" fill=\"", e.style.color,
          "\" fill-opacity=\"", Opacity(e.style.opacity), "\"",
          e.style.dashed ? absl::StrCat(" stroke=\"", e.style.color, "\" stroke-dasharray=\"4 2\"")
                         : "",
          "/>\n");
    }
  }

  // One path: a vertical stroke and two caps per point, clamped to the plot area.
  void ErrorBars(const Element& e) {
    const double bottom = Bottom();
    std::string d;
    for (size_t i = 0; i < Count(e) && i < e.z.size(); ++i) {
      if (!Plottable(f_.xs, e.x[i]) || !std::isfinite(e.y[i]) || !std::isfinite(e.z[i]) ||
          !(e.z[i] > 0)) {
        continue;
      }
      const double lo_v = e.y[i] - e.z[i], hi_v = e.y[i] + e.z[i];
      const double x = f_.X(e.x[i]);
      const double lo = Plottable(f_.ys, lo_v) ? std::min(bottom, f_.Y(lo_v)) : bottom;
      const double hi = std::max(f_.top, f_.Y(hi_v));
      absl::StrAppend(&d, "M", Px(x), " ", Px(lo), "L", Px(x), " ", Px(hi), "M", Px(x - 4), " ",
                      Px(lo), "L", Px(x + 4), " ", Px(lo), "M", Px(x - 4), " ", Px(hi), "L",
                      Px(x + 4), " ", Px(hi));
    }
    if (!d.empty()) {
      absl::StrAppend(&out_, "<path d=\"", d, "\" fill=\"none\"", StrokeAttributes(e.style),
                      "/>\n");
    }
  }

  void Points(const Element& e) {
    for (size_t i = 0; i < Count(e); ++i) {
      if (!Plottable(f_.xs, e.x[i]) || !Plottable(f_.ys, e.y[i])) continue;
      absl::StrAppend(&out_, "<circle cx=\"", Px(f_.X(e.x[i])), "\" cy=\"", Px(f_.Y(e.y[i])),
                      "\" r=\"3.2\"",
                      e.style.hollow ? absl::StrCat(" fill=\"none\" stroke=\"", e.style.color,
                                                    "\" stroke-width=\"1.4\"")
                                     : absl::StrCat(" fill=\"", e.style.color, "\""),
                      "/>\n");
    }
  }

  // Into `markers`, drawn after the clipped data.
  void Markers(const Element& e, std::string* markers) {
    for (size_t i = 0; i < Count(e); ++i) {
      if (!f_.InX(e.x[i])) continue;
      const double y =
          Plottable(f_.ys, e.y[i]) ? std::clamp(f_.Y(e.y[i]), f_.top, Bottom()) : f_.top;
      const double x = f_.X(e.x[i]);
      absl::StrAppend(markers, "<path d=\"M", Px(x), " ", Px(y - 5), "L", Px(x - 5), " ",
                      Px(y + 4), "L", Px(x + 5), " ", Px(y + 4), "Z\" fill=\"", e.style.color,
                      "\" stroke=\"#fff\" stroke-width=\"1\"/>\n");
    }
  }

  // A legend entry's swatch at height `ly`: a filled box for areas, a triangle for markers, a
  // stroke for the rest.
  void Swatch(const Element& e, double ly) {
    const double left = f_.legend_left;
    const std::string x = Px(left), y = Px(ly + 5);
    switch (e.kind) {
      case Kind::kBars:
      case Kind::kBand:
        absl::StrAppend(&out_, "<rect x=\"", x, "\" y=\"", Px(ly),
                        "\" width=\"14\" height=\"10\" fill=\"", e.style.color,
                        "\" fill-opacity=\"", Opacity(std::max(0.35, e.style.opacity)), "\"/>");
        break;
      case Kind::kMarkers:
        absl::StrAppend(&out_, "<path d=\"M", Px(left + 7), " ", Px(ly), "L", Px(left + 2), " ",
                        Px(ly + 9), "L", Px(left + 12), " ", Px(ly + 9), "Z\" fill=\"",
                        e.style.color, "\"/>");
        break;
      default:
        absl::StrAppend(&out_, "<line x1=\"", x, "\" x2=\"", Px(left + 14), "\" y1=\"", y,
                        "\" y2=\"", y, "\"", StrokeAttributes(e.style), "/>");
        break;
    }
  }

  const Chart& chart_;
  const Frame& f_;
  std::string& out_;
};

std::string Chart::RenderAt(double left, double top, const std::string& id) const {
  const Frame f = Resolve();
  std::string out = absl::StrCat("<g transform=\"translate(", Px(left), ",", Px(top), ")\">\n");
  Painter painter(*this, f, &out);
  painter.Title();
  painter.Axes();
  painter.Data(id);
  painter.Legend();
  painter.Captions();
  absl::StrAppend(&out, "</g>\n");
  return out;
}

namespace {

std::string Document(int width, int height, const std::string& body) {
  return absl::StrCat(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"", width, "\" height=\"", height,
      "\" viewBox=\"0 0 ", width, " ", height, "\" font-family=\"", kFonts, "\" font-size=\"",
      kFontSize, "\">\n<rect width=\"100%\" height=\"100%\" fill=\"#fff\"/>\n", body, "</svg>\n");
}

}  // namespace

std::string Chart::Render() const { return Document(width_, height(), RenderAt(0, 0, "plot")); }

std::string Grid(const std::string& title, const std::vector<Chart>& charts, int columns) {
  columns = std::max(1, columns);
  const double top = title.empty() ? 0 : 30;
  int width = 0;
  double y = top, row_height = 0;
  std::string body;
  if (!title.empty()) {
    body = absl::StrCat("<text x=\"12\" y=\"21\" font-size=\"15\" font-weight=\"600\" fill=\"",
                        kInk, "\">", Escape(title), "</text>\n");
  }
  double x = 0;
  for (size_t i = 0; i < charts.size(); ++i) {
    if (i > 0 && i % columns == 0) {
      y += row_height;
      row_height = 0;
      x = 0;
    }
    absl::StrAppend(&body, charts[i].RenderAt(x, y, absl::StrCat("plot", i)));
    x += charts[i].width();
    width = std::max(width, static_cast<int>(x));
    row_height = std::max(row_height, static_cast<double>(charts[i].height()));
  }
  return Document(std::max(width, 200), static_cast<int>(std::ceil(y + row_height)), body);
}

std::string SeriesColor(int index) {
  // hsl(h, 62%, 46%) with the dashboard's hue sequence (dashboard/js/format.js runColor).
  double hue = std::fmod(index * 137.508 + 200, 360.0);
  if (hue > 345 || hue < 15) hue = std::fmod(hue + 30, 360.0);
  const double h = std::round(hue) / 360, s = 0.62, l = 0.46;
  const double q = l < 0.5 ? l * (1 + s) : l + s - l * s, p = 2 * l - q;
  auto channel = [&](double t) {
    if (t < 0) t += 1;
    if (t > 1) t -= 1;
    double v = p;
    if (t < 1.0 / 6) {
      v = p + (q - p) * 6 * t;
    } else if (t < 0.5) {
      v = q;
    } else if (t < 2.0 / 3) {
      v = p + (q - p) * (2.0 / 3 - t) * 6;
    }
    return static_cast<int>(std::lround(v * 255));
  };
  return fmt::format("#{:02x}{:02x}{:02x}", channel(h + 1.0 / 3), channel(h), channel(h - 1.0 / 3));
}

std::string Escape(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

}  // namespace svg
}  // namespace ablate
