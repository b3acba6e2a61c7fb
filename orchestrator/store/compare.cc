#include "orchestrator/store/compare.h"

#include <cmath>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "config/eval_config.h"
#include "google/protobuf/util/json_util.h"
#include "orchestrator/stats/stats.h"

namespace ablate {
namespace {

// What one run contributes to a comparison: a metric of its final evaluation.
struct Metric {
  std::string heading;
  double RunInfo::*field = nullptr;  // a summary metric, or
  int64_t seq_len = 0;               // with `ppl`: PPL (else loss) at this evaluation length
  bool ppl = false;
  bool lower_is_better = true;
  std::string named;              // or a metric by name (an eval task's, a program's)
  bool higher_is_better = false;  // an accuracy

  double Of(const ResultRun& r) const {
    if (field != nullptr) return r.run.*field;
    if (!named.empty()) {
      auto it = r.metrics.find(named);
      return it == r.metrics.end() ? kNaN : it->second;
    }
    for (const RunLength& l : r.lengths) {
      if (l.seq_len == seq_len) return ppl ? l.val_ppl : l.val_loss;
    }
    return kNaN;
  }
};

std::optional<RunConfig> ConfigOf(const ResultRun& r) {
  RunConfig config;
  if (!google::protobuf::util::JsonStringToMessage(r.run.config_json, &config).ok()) {
    return std::nullopt;
  }
  return config;
}

constexpr char kMetricNames[] =
    "val_loss, val_ppl, gate_score, m_act, f_attn, sink_rate, spike_score, train_loss, ppl@L, "
    "loss@L";

absl::StatusOr<Metric> ParseMetric(const std::string& name, const ResultSet& results) {
  static const auto* summaries = new std::map<std::string, Metric>{
      {"val_loss", {"val loss", &RunInfo::val_loss}},
      {"val_ppl", {"val PPL", &RunInfo::val_ppl}},
      // A gate's mean value describes the mechanism (sparser: lower), not a result to improve.
      {"gate_score", {"gate score", &RunInfo::gate_score, 0, false, false}},
      {"m_act", {"M-Act", &RunInfo::m_act}},
      {"f_attn", {"F-Attn", &RunInfo::f_attn}},
      {"sink_rate", {"sink rate", &RunInfo::sink_rate}},
      {"spike_score", {"spike score", &RunInfo::spike_score}},
      {"train_loss", {"train loss", &RunInfo::final_train_loss}},
  };
  auto it = summaries->find(name);
  if (it != summaries->end()) return it->second;
  absl::string_view rest = name;
  Metric m;
  std::set<std::string> named;  // what the runs report by name
  for (const ResultRun& r : results.runs) {
    for (const auto& [n, v] : r.metrics) named.insert(n);
  }
  if (named.count(name) > 0) {
    m.heading = name;
    m.named = name;
    // An evaluation task's metric is known from the runs' config (a multiple-choice accuracy
    // is named by its task alone); a program's by its name.
    std::optional<bool> higher;
    for (const ResultRun& r : results.runs) {
      if (r.metrics.count(name) == 0) continue;
      if (const std::optional<RunConfig> config = ConfigOf(r)) {
        higher = EvalMetricHigherIsBetter(name, *config);
      }
      break;
    }
    m.lower_is_better = !higher.value_or(IsAccuracyMetric(name));
    m.higher_is_better = !m.lower_is_better;
    // A gate's mean value by query class (gate_score@trigger) describes the mechanism, as
    // gate_score does: neither direction is better.
    if (absl::StartsWith(name, "gate_score@")) m.lower_is_better = m.higher_is_better = false;
    return m;
  }
  m.ppl = absl::ConsumePrefix(&rest, "ppl@");
  if (!m.ppl && !absl::ConsumePrefix(&rest, "loss@")) {
    std::vector<std::string> some(named.begin(), named.end());
    if (some.size() > 8) some.resize(8);
    return absl::InvalidArgumentError(absl::StrCat(
        "compare: unknown metric \"", name, "\" (expected one of ", kMetricNames,
        named.empty()
            ? ", or a metric the runs report by name: these report none"
            : absl::StrCat(", or one the runs report by name: ", absl::StrJoin(some, ", "),
                           named.size() > some.size() ? ", ..." : ""),
        ")"));
  }
  if (!absl::SimpleAtoi(rest, &m.seq_len) || m.seq_len <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("compare: metric \"", name, "\" needs an evaluation length, e.g. ppl@256"));
  }
  std::set<int64_t> measured;
  for (const ResultRun& r : results.runs) {
    for (const RunLength& l : r.lengths) measured.insert(l.seq_len);
  }
  if (measured.count(m.seq_len) == 0) {
    return absl::NotFoundError(absl::StrCat(
        "compare: no run of ", results.label, " was evaluated at length ", m.seq_len,
        measured.empty()
            ? " (none has TrainConfig.eval_seq_lens)"
            : absl::StrCat(" (lengths measured: ", absl::StrJoin(measured, ", "), ")")));
  }
  m.heading = absl::StrCat(m.ppl ? "PPL@" : "loss@", m.seq_len);
  return m;
}

}  // namespace

bool IsAccuracyMetric(absl::string_view name) {
  const absl::string_view task = name.substr(0, name.find('@'));
  return task == "passkey" || task == "passkey_exact" || task == "mqar" || task == "copying_acc" ||
         absl::StrContains(task, "acc");
}

namespace {

// The runs of one (variant, axes), by seed.
struct Group {
  std::string variant, axes;
  std::map<uint64_t, const ResultRun*> by_seed;
};

std::vector<double> FiniteValues(const Group& g, const Metric& metric) {
  std::vector<double> values;
  for (const auto& [seed, r] : g.by_seed) {
    const double v = metric.Of(*r);
    if (r->run.state == SUCCEEDED && std::isfinite(v)) values.push_back(v);
  }
  return values;
}

// A row's runs: the reference's paired by seed, the DIVERGED ones counted, and the values its test
// compares; the verdict comes once every p-value is adjusted (JudgeRows).
CompareRow Row(const Group& variant, const Group* reference, const Metric& metric, double alpha) {
  CompareRow row;
  row.variant = variant.variant;
  row.axes = variant.axes;
  RowSamples samples;
  samples.variant = FiniteValues(variant, metric);
  if (reference == nullptr) {
    row.n_variant = static_cast<int64_t>(samples.variant.size());
    row.variant_mean = MeanAndStd(samples.variant).mean;
    row.note = "no reference runs at this axis point";
    return row;
  }
  samples.reference = FiniteValues(*reference, metric);
  for (const auto& [seed, v] : variant.by_seed) {
    auto r = reference->by_seed.find(seed);
    if (r == reference->by_seed.end()) continue;
    ++row.seeds;
    const RunState vs = v->run.state, rs = r->second->run.state;
    if (vs == DIVERGED && rs != DIVERGED) ++row.variant_diverged;
    if (rs == DIVERGED && vs != DIVERGED) ++row.reference_diverged;
    const double a = metric.Of(*v), b = metric.Of(*r->second);
    if (vs == SUCCEEDED && rs == SUCCEEDED && std::isfinite(a) && std::isfinite(b)) {
      samples.paired_variant.push_back(a);
      samples.paired_reference.push_back(b);
    }
  }
  TestRow(samples, alpha, &row);
  // The per-item scores of each pair whose runs scored the same items.
  std::vector<double> variant_items, reference_items;
  int64_t item_seeds = 0;
  for (const auto& [seed, v] : variant.by_seed) {
    auto r = reference->by_seed.find(seed);
    if (r == reference->by_seed.end()) continue;
    const ResultRun& a = *v;
    const ResultRun& b = *r->second;
    if (a.run.state != SUCCEEDED || b.run.state != SUCCEEDED || a.items.empty() ||
        a.items.size() != b.items.size()) {
      continue;
    }
    ++item_seeds;
    variant_items.insert(variant_items.end(), a.items.begin(), a.items.end());
    reference_items.insert(reference_items.end(), b.items.begin(), b.items.end());
  }
  TestItems(variant_items, reference_items, item_seeds, alpha, &row);
  return row;
}

}  // namespace

absl::StatusOr<Comparison> CompareResults(const ResultSet& results, const CompareOptions& options) {
  if (!(options.alpha > 0 && options.alpha < 0.5)) {
    return absl::InvalidArgumentError(
        absl::StrCat("compare: --alpha must be between 0 and 0.5, not ", options.alpha));
  }
  if (options.correction != "holm" && options.correction != "none") {
    return absl::InvalidArgumentError(absl::StrCat(
        "compare: unknown correction \"", options.correction, "\" (expected holm or none)"));
  }
  absl::StatusOr<Metric> metric = ParseMetric(options.metric, results);
  if (!metric.ok()) return metric.status();
  Comparison c;
  c.sweeps = results.label;
  c.metric = options.metric;
  c.heading = metric->heading;
  c.reference = options.reference.empty() ? results.reference : options.reference;
  c.alpha = options.alpha;
  c.correction = options.correction;
  c.lower_is_better = metric->lower_is_better;
  c.higher_is_better = metric->higher_is_better;
  c.excluded = results.excluded;
  if (!metric->named.empty()) {
    for (const ResultRun& r : results.runs) {
      if (r.metrics.count(metric->named) == 0) continue;
      if (const std::optional<RunConfig> config = ConfigOf(r)) {
        c.chance = EvalChanceLevel(metric->named, *config).value_or(kNaN);
      }
      break;
    }
  }

  std::vector<Group> groups;
  std::map<std::pair<std::string, std::string>, size_t> index;  // (variant, axes) -> group
  std::set<std::string> variants;
  for (const ResultRun& r : results.runs) {
    auto [it, added] = index.try_emplace({r.run.variant, r.run.axes}, groups.size());
    if (added) groups.push_back(Group{r.run.variant, r.run.axes, {}});
    groups[it->second].by_seed[r.run.seed] = &r;
    variants.insert(r.run.variant);
  }
  if (variants.count(c.reference) == 0) {
    return absl::NotFoundError(absl::StrCat("compare: no runs of reference variant \"", c.reference,
                                            "\" in ", results.label,
                                            " (variants: ", absl::StrJoin(variants, ", "), ")"));
  }
  for (const Group& g : groups) {
    if (g.variant == c.reference) continue;
    auto ref = index.find({c.reference, g.axes});
    c.rows.push_back(
        Row(g, ref == index.end() ? nullptr : &groups[ref->second], *metric, options.alpha));
  }
  JudgeRows(&c);
  return c;
}

}  // namespace ablate
