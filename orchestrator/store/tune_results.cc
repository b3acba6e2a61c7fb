#include "orchestrator/store/tune_results.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/text_format.h"
#include "nlohmann/json.hpp"

namespace ablate {
namespace {

double MetricOf(const ResultRun& result, const std::string& metric) {
  const RunInfo& r = result.run;
  if (metric == "val_loss") return r.val_loss;
  if (metric == "val_ppl") return r.val_ppl;
  if (metric == "gate_score") return r.gate_score;
  if (metric == "m_act") return r.m_act;
  if (metric == "f_attn") return r.f_attn;
  if (metric == "sink_rate") return r.sink_rate;
  auto named = result.metrics.find(metric);  // an eval metric by name (mqar@8)
  return named == result.metrics.end() ? kNaN : named->second;
}

}  // namespace

std::string AxesWithout(const std::string& axes, const std::string& axis, std::string* value) {
  if (value != nullptr) value->clear();
  const std::string prefix = axis + "=";
  // The tuned axis's item is found by its path, not by splitting at spaces: other axes' values
  // may hold spaces ({a: 1}). Its own value is a number, which holds none.
  const size_t at = axes.rfind(prefix);
  if (at == std::string::npos || (at > 0 && axes[at - 1] != ' ')) return axes;
  const size_t end = axes.find(' ', at);
  if (value != nullptr) {
    *value = axes.substr(at + prefix.size(),
                         end == std::string::npos ? std::string::npos : end - at - prefix.size());
  }
  std::string out = axes.substr(0, at > 0 ? at - 1 : 0);
  if (end != std::string::npos) absl::StrAppend(&out, out.empty() ? "" : " ", axes.substr(end + 1));
  return out;
}

BestResults BestOf(const ResultSet& results, const TuneInfo& tune) {
  BestResults out;
  out.results = results;
  out.results.runs.clear();
  using Key = std::pair<std::string, std::string>;  // variant, other axes
  struct Value {
    double sum = 0;
    int n = 0;
  };
  std::map<Key, std::map<std::string, Value>> values;  // by value text
  std::map<Key, std::vector<std::pair<std::string, const ResultRun*>>> runs;
  std::vector<Key> order;
  for (const ResultRun& r : results.runs) {
    std::string value;
    const Key key{r.run.variant, AxesWithout(r.run.axes, tune.axis, &value)};
    if (runs.find(key) == runs.end()) order.push_back(key);
    runs[key].push_back({value, &r});
    Value& v = values[key][value];
    const double m = MetricOf(r, tune.metric);
    if (r.run.state == SUCCEEDED && std::isfinite(m)) {
      v.sum += m;
      ++v.n;
    }
  }
  for (const Key& key : order) {
    std::string best;
    double best_mean = 0, best_number = 0;
    for (const auto& [text, v] : values[key]) {
      if (v.n == 0) continue;
      const double mean = v.sum / v.n;
      double number = 0;
      (void)absl::SimpleAtod(text, &number);
      const bool better = best.empty() || (tune.maximize ? mean > best_mean : mean < best_mean) ||
                          (mean == best_mean && number < best_number);
      if (!better) continue;
      best = text;
      best_mean = mean;
      best_number = number;
    }
    out.best[key] = best;
    for (const auto& [text, r] : runs[key]) {
      if (!best.empty() && text != best) continue;
      ResultRun kept = *r;
      kept.run.axes = key.second;
      out.results.runs.push_back(std::move(kept));
    }
  }
  return out;
}

ComparisonTable BestTable(const BestResults& best, const TuneInfo& tune) {
  ComparisonTable table = ComparisonTableOf(best.results);
  for (ComparisonRow& row : table.rows) {
    auto it = best.best.find({row.variant, row.axes});
    if (it == best.best.end()) continue;
    row.best = it->second.empty() ? "" : absl::StrCat(tune.axis, "=", it->second);
  }
  return table;
}

void NameBestValues(const BestResults& best, const TuneInfo& tune, Comparison* comparison) {
  comparison->best_axis = tune.axis;
  for (CompareRow& row : comparison->rows) {
    if (auto it = best.best.find({row.variant, row.axes}); it != best.best.end()) {
      row.value = it->second;
    }
    if (auto it = best.best.find({comparison->reference, row.axes}); it != best.best.end()) {
      row.reference_value = it->second;
    }
  }
}

namespace {

std::string Value(double v) { return std::isfinite(v) ? absl::StrCat(v) : ""; }
nlohmann::json ValueJson(double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(); }

}  // namespace

std::string BracketFinding(const BracketInfo& b) {
  if (b.state == "OPEN") return "bisecting";
  if (std::isfinite(b.stable) && std::isfinite(b.unstable)) {
    return absl::StrCat("stable up to ", b.stable, ", unstable from ", b.unstable,
                        b.note.empty() ? "" : absl::StrCat(" (", b.note, ")"));
  }
  return b.note;
}

absl::StatusOr<std::string> FormatStability(const std::vector<BracketInfo>& brackets,
                                            const std::string& format) {
  if (format == "csv") {
    std::string out = "variant,axes,stable,unstable,probes\n";
    for (const BracketInfo& b : brackets) {
      absl::StrAppend(&out, CsvField(b.variant), ",", CsvField(b.axes), ",", Value(b.stable), ",",
                      Value(b.unstable), ",", b.probes, "\n");
    }
    return out;
  }
  if (format == "json") {
    nlohmann::json rows = nlohmann::json::array();
    for (const BracketInfo& b : brackets) {
      rows.push_back({{"variant", b.variant},
                      {"axes", b.axes},
                      {"state", b.state},
                      {"stable", ValueJson(b.stable)},
                      {"unstable", ValueJson(b.unstable)},
                      {"probes", b.probes},
                      {"note", b.note}});
    }
    return rows.dump(2) + "\n";
  }
  if (format != "markdown") {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown format \"", format, "\" (expected markdown, csv or json)"));
  }
  const bool has_axes = std::any_of(brackets.begin(), brackets.end(),
                                    [](const BracketInfo& b) { return !b.axes.empty(); });
  std::string out = has_axes ? "| variant | axes | stable | unstable | probes | found |\n"
                               "|---|---|---:|---:|---:|---|\n"
                             : "| variant | stable | unstable | probes | found |\n"
                               "|---|---:|---:|---:|---|\n";
  for (const BracketInfo& b : brackets) {
    absl::StrAppend(&out, "| ", b.variant, " | ", has_axes ? absl::StrCat(b.axes, " | ") : "",
                    std::isfinite(b.stable) ? absl::StrCat(b.stable) : "—", " | ",
                    std::isfinite(b.unstable) ? absl::StrCat(b.unstable) : "—", " | ", b.probes,
                    " | ", BracketFinding(b), " |\n");
  }
  return out;
}

}  // namespace ablate
