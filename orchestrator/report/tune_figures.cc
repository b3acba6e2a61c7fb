// The numbers behind a tuned sweep's chart (tune_figures.h) and their JSON.
#include "orchestrator/report/tune_figures.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <utility>

#include "orchestrator/report/figures.h"
#include "orchestrator/store/tune_results.h"

namespace ablate {
namespace {

using json = nlohmann::json;

json Number(double v) { return std::isfinite(v) ? json(Significant7(v)) : json(nullptr); }

}  // namespace

double TunedMetric(const RunInfo& r, const std::string& metric) {
  if (metric == "val_ppl") return r.val_ppl;
  if (metric == "gate_score") return r.gate_score;
  if (metric == "m_act") return r.m_act;
  if (metric == "f_attn") return r.f_attn;
  if (metric == "sink_rate") return r.sink_rate;
  return r.val_loss;
}

TuneFigures ComputeTuneFigures(const TuneInfo& tune, const std::vector<RunInfo>& runs,
                               const std::vector<BracketInfo>& brackets) {
  TuneFigures f;
  f.tune = tune;
  std::map<std::string, size_t> index;  // group -> its curve
  std::vector<std::map<double, TunePoint>> points;
  for (const RunInfo& r : runs) {
    if (!r.tuned || !std::isfinite(r.tune_value)) continue;
    auto [at, added] = index.emplace(r.tune_group, f.curves.size());
    if (added) {
      TuneCurve& c = f.curves.emplace_back();
      c.group = r.tune_group;
      c.variant = r.variant;
      c.axes = AxesWithout(r.axes, tune.axis);
      points.emplace_back();
    }
    f.log_scale = f.log_scale && r.tune_value > 0;
    TunePoint& p = points[at->second][r.tune_value];
    p.value = r.tune_value;
    ++p.runs;
    const double m = TunedMetric(r, tune.metric);
    if (r.state == SUCCEEDED && std::isfinite(m)) {
      // The mean as a running sum first; divided below.
      p.mean = p.finished == 0 ? m : p.mean + m;
      ++p.finished;
    } else if (r.state == STOPPED) {
      p.stopped.push_back(TuneStop{r.id, r.steps_done, m});
    } else if (r.state == DIVERGED) {
      ++p.diverged;
    }
  }
  for (size_t i = 0; i < f.curves.size(); ++i) {
    for (auto& [value, p] : points[i]) {
      if (p.finished > 0) p.mean /= static_cast<double>(p.finished);
      f.curves[i].points.push_back(std::move(p));
    }
  }
  for (const BracketInfo& b : brackets) {
    if (auto at = index.find(b.group); at != index.end()) f.curves[at->second].bracket = b;
  }
  return f;
}

absl::StatusOr<std::optional<TuneFigures>> ReadTuneFigures(const StoreReader& reader,
                                                           int64_t sweep_id) {
  absl::StatusOr<std::optional<TuneInfo>> tune = reader.GetTune(sweep_id);
  if (!tune.ok()) return tune.status();
  if (!tune->has_value()) return std::optional<TuneFigures>();
  absl::StatusOr<std::vector<RunInfo>> runs = reader.RunsOfSweep(sweep_id);
  if (!runs.ok()) return runs.status();
  std::vector<BracketInfo> brackets;
  if ((*tune)->method == "boundary") {
    absl::StatusOr<std::vector<BracketInfo>> read = reader.TuneBrackets(sweep_id);
    if (!read.ok()) return read.status();
    brackets = *std::move(read);
  }
  return std::optional<TuneFigures>(ComputeTuneFigures(**tune, *runs, brackets));
}

json TuneFiguresJson(const TuneFigures& f) {
  json curves = json::array();
  for (const TuneCurve& c : f.curves) {
    json points = json::array();
    for (const TunePoint& p : c.points) {
      json stopped = json::array();
      for (const TuneStop& s : p.stopped) {
        stopped.push_back({{"run", s.run_id}, {"step", s.step}, {"metric", Number(s.metric)}});
      }
      points.push_back({{"value", p.value},
                        {"runs", p.runs},
                        {"finished", p.finished},
                        {"diverged", p.diverged},
                        {"mean", Number(p.mean)},
                        {"stopped", std::move(stopped)}});
    }
    json bracket = nullptr;
    if (c.bracket) {
      bracket = {{"state", c.bracket->state},
                 {"stable", Number(c.bracket->stable)},
                 {"unstable", Number(c.bracket->unstable)},
                 {"probes", c.bracket->probes},
                 {"note", c.bracket->note},
                 {"found", BracketFinding(*c.bracket)}};
    }
    curves.push_back({{"group", c.group},
                      {"variant", c.variant},
                      {"axes", c.axes},
                      {"points", std::move(points)},
                      {"bracket", std::move(bracket)}});
  }
  return json{{"tune",
               {{"axis", f.tune.axis},
                {"method", f.tune.method},
                {"metric", f.tune.metric},
                {"mode", f.tune.maximize ? "max" : "min"},
                {"log_scale", f.log_scale}}},
              {"curves", std::move(curves)}};
}

}  // namespace ablate
