// The `tune:` block: its parser (TuneParser, writing to the spec parser's SpecProblems) and the
// plan of a tuned sweep (MakeTunePlan, TunePlanText).
#include "orchestrator/sweep/tune.h"

#include "absl/strings/match.h"
#include "config/program_config.h"

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/text_format.h"
#include "config/eval_config.h"
#include "config/proto_yaml.h"
#include "google/protobuf/descriptor.h"

namespace ablate {

namespace pb = google::protobuf;

namespace {

const std::vector<std::string>& TuneKeys() {
  static const auto* keys = new std::vector<std::string>{
      "axis",  "values",           "range", "method",    "metric",         "mode",
      "rungs", "reduction_factor", "seeds", "tolerance", "max_spike_score"};
  return *keys;
}

// The field `path` (dotted, below RunConfig) names, or null.
const pb::FieldDescriptor* FieldAtPath(const std::string& path) {
  const pb::Descriptor* d = RunConfig::descriptor();
  const pb::FieldDescriptor* f = nullptr;
  for (absl::string_view part : absl::StrSplit(path, '.')) {
    if (d == nullptr) return nullptr;
    f = d->FindFieldByName(std::string(part));
    if (f == nullptr) return nullptr;
    d = f->cpp_type() == pb::FieldDescriptor::CPPTYPE_MESSAGE ? f->message_type() : nullptr;
  }
  return f;
}

bool IsNumeric(const pb::FieldDescriptor* f) {
  switch (f->cpp_type()) {
    case pb::FieldDescriptor::CPPTYPE_INT32:
    case pb::FieldDescriptor::CPPTYPE_INT64:
    case pb::FieldDescriptor::CPPTYPE_UINT32:
    case pb::FieldDescriptor::CPPTYPE_UINT64:
    case pb::FieldDescriptor::CPPTYPE_DOUBLE:
    case pb::FieldDescriptor::CPPTYPE_FLOAT:
      return true;
    default:
      return false;
  }
}

class TuneParser {
 public:
  TuneParser(const YAML::Node& node, SweepSpec* spec, SpecProblems* problems)
      : node_(node), spec_(*spec), problems_(*problems) {}

  void Parse() {
    TuneSpec tune;
    tune.line = YamlLine(node_);
    if (!node_.IsMap()) {
      Problem(tune.line, "tune", "expected a mapping with axis:, values: or range:, method:, ...");
      return;
    }
    CheckKeys();
    if (!problems_.empty()) return;
    ParseAxis(&tune);
    ParseMethod(&tune);
    ParseMetric(&tune);
    ParseValues(&tune);
    ParseAsha(&tune);
    ParseBoundary(&tune);
    if (!problems_.empty()) return;
    AxisSpec axis;
    axis.mode = AxisSpec::Mode::kProduct;
    axis.line = tune.line;
    for (const AxisAssignment& a : tune.values) axis.points.push_back({a});
    spec_.axes.push_back(std::move(axis));
    spec_.tune = std::move(tune);
  }

 private:
  void Problem(int line, const std::string& path, const std::string& what) {
    problems_.Add(line > 0 ? line : YamlLine(node_), path, what);
  }
  YAML::Node Child(const char* key) const { return YamlChild(node_, key); }
  int LineOfKey(const char* key) const {
    const YAML::Node n = Child(key);
    return n ? YamlLine(n) : YamlLine(node_);
  }
  // The scalar at `key` (which must be there), or "" with a problem.
  std::string Scalar(const char* key) {
    const YAML::Node n = Child(key);
    if (!n.IsScalar()) {
      Problem(LineOfKey(key), absl::StrCat("tune.", key), "expected a single value");
      return "";
    }
    return n.Scalar();
  }

  void CheckKeys() {
    for (auto it = node_.begin(); it != node_.end(); ++it) {
      const std::string key = it->first.IsScalar() ? it->first.Scalar() : "";
      if (std::find(TuneKeys().begin(), TuneKeys().end(), key) != TuneKeys().end()) continue;
      problems_.UnknownKey(YamlLine(it->first), "tune", key, TuneKeys());
    }
  }

  void ParseAxis(TuneSpec* tune) {
    if (!Child("axis")) {
      Problem(tune->line, "tune.axis",
              "missing: the numeric config field to tune (axis: train.optimizer.lr)");
      return;
    }
    tune->axis = Scalar("axis");
    if (tune->axis.empty()) return;
    const int line = LineOfKey("axis");
    const pb::FieldDescriptor* f = FieldAtPath(tune->axis);
    // A program's param (params.lr) takes whatever numbers the values give.
    const bool param = absl::StartsWith(tune->axis, kParamsPrefix) && spec_.base.has_program();
    if (!param && (f == nullptr || f->is_repeated() || !IsNumeric(f))) {
      Problem(line, "tune.axis",
              absl::StrCat("\"", tune->axis, "\" is not a numeric field of the run config ",
                           "(a path such as train.optimizer.lr or train.optimizer.warmup_steps)"));
      return;
    }
    for (const AxisSpec& axis : spec_.axes) {
      for (const AxisPoint& point : axis.points) {
        for (const AxisAssignment& a : point) {
          if (a.path != tune->axis) continue;
          Problem(line, "tune.axis",
                  absl::StrCat(tune->axis, " is also an axis (line ", axis.line,
                               "); tune it or grid it, not both"));
          return;
        }
      }
    }
    // A variant's override wins over an axis value: it would flatten every tuned value.
    for (const VariantSpec& v : spec_.variants) {
      using Overrides = std::pair<std::string, const YAML::Node*>;
      for (const auto& [prefix, node] : {Overrides{"train.", &v.train}, {"model.", &v.model}}) {
        if (!*node || tune->axis.rfind(prefix, 0) != 0) continue;
        const int at = LineOfPath(*node, tune->axis.substr(prefix.size()), -1);
        if (at < 0) continue;
        Problem(at, absl::StrCat("variants[", v.name, "].", tune->axis),
                "sets the tuned axis (tune.axis), which would override every tuned value");
      }
    }
  }

  void ParseMethod(TuneSpec* tune) {
    if (!Child("method")) return;
    const std::string method = Scalar("method");
    if (method == "grid") {
      tune->method = TuneSpec::Method::kGrid;
    } else if (method == "asha") {
      tune->method = TuneSpec::Method::kAsha;
    } else if (method == "boundary") {
      tune->method = TuneSpec::Method::kBoundary;
    } else if (!method.empty()) {
      Problem(LineOfKey("method"), "tune.method",
              absl::StrCat("unknown method \"", method, "\"; use grid, asha or boundary"));
    }
  }

  void ParseMetric(TuneSpec* tune) {
    if (Child("metric")) {
      tune->metric = Scalar("metric");
      // A metric by name: one the base's evals produce (docs/evals.md), or, for a program,
      // any name it reports (not known before it runs).
      const std::vector<std::string> evals = EvalMetricNames(spec_.base);
      const bool named = std::find(evals.begin(), evals.end(), tune->metric) != evals.end() ||
                         (spec_.base.has_program() && IsMetricName(tune->metric));
      if (!tune->metric.empty() && !named &&
          std::find(TuneMetrics().begin(), TuneMetrics().end(), tune->metric) ==
              TuneMetrics().end()) {
        Problem(LineOfKey("metric"), "tune.metric",
                absl::StrCat("unknown metric \"", tune->metric, "\"; use ",
                             absl::StrJoin(TuneMetrics(), ", "),
                             evals.empty() ? ", or a metric of the base's evals: (none)"
                                           : absl::StrCat(", or a metric of the base's evals: ",
                                                          absl::StrJoin(evals, ", "))));
      }
    }
    if (Child("mode")) {
      const std::string mode = Scalar("mode");
      if (mode == "max") {
        tune->maximize = true;
      } else if (mode != "min" && !mode.empty()) {
        Problem(LineOfKey("mode"), "tune.mode",
                absl::StrCat("expected min or max, got \"", mode, "\""));
      }
    }
  }

  // Adds the value `text` (written at `line`) to tune->values, checked against the base config.
  void AddValue(TuneSpec* tune, const std::string& text, const YAML::Node& node, int line,
                const std::string& path) {
    double v;
    if (!absl::SimpleAtod(text, &v) || !std::isfinite(v)) {
      Problem(line, path, absl::StrCat("expected a number, got \"", text, "\""));
      return;
    }
    for (const AxisAssignment& a : tune->values) {
      double other;
      if (absl::SimpleAtod(a.text, &other) && other == v) {
        Problem(line, path, absl::StrCat("duplicate value ", text));
        return;
      }
    }
    AxisAssignment a;
    a.path = tune->axis;
    a.value = node;
    a.text = text;
    a.line = line;
    RunConfig scratch = spec_.base;
    const absl::Status s = OverlayYamlAtPath(a.value, spec_.file, line, a.path, &scratch);
    if (!s.ok()) {
      problems_.Absorb(s);
      return;
    }
    tune->values.push_back(std::move(a));
  }

  void ParseValues(TuneSpec* tune) {
    const YAML::Node values = Child("values"), range = Child("range");
    if (!values == !range) {
      Problem(tune->line, "tune",
              values ? "give values: or range:, not both"
                     : "missing: the values to try (values: [...] or range: {min, max, points})");
      return;
    }
    if (tune->axis.empty()) return;
    if (FieldAtPath(tune->axis) == nullptr &&
        !(absl::StartsWith(tune->axis, kParamsPrefix) && spec_.base.has_program())) {
      return;
    }
    if (tune->method == TuneSpec::Method::kBoundary && values) {
      Problem(YamlLine(values), "tune.values",
              "boundary bisects a range: give range: {min: X, max: Y} instead");
      return;
    }
    if (values) {
      if (!values.IsSequence() || values.size() == 0) {
        Problem(YamlLine(values), "tune.values", "expected a non-empty list of numbers");
        return;
      }
      for (size_t i = 0; i < values.size(); ++i) {
        const std::string path = absl::StrCat("tune.values[", i, "]");
        if (!values[i].IsScalar()) {
          Problem(YamlLine(values[i]), path, "expected a number");
          continue;
        }
        AddValue(tune, values[i].Scalar(), values[i], YamlLine(values[i]), path);
      }
      return;
    }
    ParseRange(range, tune);
  }

  void ParseRange(const YAML::Node& range, TuneSpec* tune) {
    const int line = YamlLine(range);
    if (!range.IsMap()) {
      Problem(line, "tune.range", "expected {min: X, max: Y, points: N, scale: log|linear}");
      return;
    }
    const bool boundary = tune->method == TuneSpec::Method::kBoundary;
    double min = 0, max = 0;
    int64_t points = 0;
    std::string scale = "log";
    for (auto it = range.begin(); it != range.end(); ++it) {
      const std::string key = it->first.Scalar();
      const std::string path = absl::StrCat("tune.range.", key);
      const YAML::Node v = it->second;
      const int at = YamlLine(v) > 0 ? YamlLine(v) : line;
      const std::string text = v.IsScalar() ? v.Scalar() : "";
      bool ok = v.IsScalar();
      if (key == "min") {
        ok = ok && absl::SimpleAtod(text, &min) && std::isfinite(min);
      } else if (key == "max") {
        ok = ok && absl::SimpleAtod(text, &max) && std::isfinite(max);
      } else if (boundary && (key == "points" || key == "scale")) {
        Problem(YamlLine(it->first), path,
                "boundary bisects on a log scale from min and max alone: no points or scale");
        continue;
      } else if (key == "points") {
        ok = ok && absl::SimpleAtoi(text, &points);
      } else if (key == "scale") {
        scale = text;
        ok = ok && (scale == "log" || scale == "linear");
      } else {
        Problem(YamlLine(it->first), "tune.range",
                absl::StrCat("unknown key \"", key, "\"; known keys: min, max, points, scale"));
        continue;
      }
      if (!ok) {
        Problem(at, path,
                key == "scale"    ? absl::StrCat("expected log or linear, got \"", text, "\"")
                : key == "points" ? "expected a whole number"
                                  : "expected a number");
      }
    }
    for (const char* key : {"min", "max", "points"}) {
      if (boundary && std::string(key) == "points") continue;
      if (!YamlChild(range, key)) {
        Problem(line, absl::StrCat("tune.range.", key), "missing");
      }
    }
    if (!problems_.empty()) return;
    if (!(min < max)) {
      Problem(line, "tune.range", absl::StrCat("min ", min, " must be below max ", max));
      return;
    }
    if (boundary) {
      if (min <= 0) {
        Problem(line, "tune.range.min",
                absl::StrCat("boundary bisects on a log scale: min must be > 0, got ", min));
        return;
      }
      tune->min = min;
      tune->max = max;
      const YAML::Node min_node = YamlChild(range, "min"), max_node = YamlChild(range, "max");
      AddValue(tune, min_node.Scalar(), min_node, YamlLine(min_node), "tune.range.min");
      AddValue(tune, max_node.Scalar(), max_node, YamlLine(max_node), "tune.range.max");
      return;
    }
    if (points < 2 || points > 1000) {
      Problem(line, "tune.range.points", absl::StrCat("must be in [2, 1000], got ", points));
      return;
    }
    if (scale == "log" && min <= 0) {
      Problem(line, "tune.range.min",
              absl::StrCat("a log range needs min > 0, got ", min, " (or scale: linear)"));
      return;
    }
    for (int64_t i = 0; i < points; ++i) {
      const double f = static_cast<double>(i) / static_cast<double>(points - 1);
      const double v = scale == "log" ? min * std::pow(max / min, f) : min + (max - min) * f;
      const std::string text = FormatTuneValue(i == points - 1 ? max : v);
      AddValue(tune, text, YAML::Node(text), line, absl::StrCat("tune.range (point ", i, ")"));
    }
  }

  // Whether `tune` is of `method` (named `name`); when not, each of `keys` given is a problem.
  bool KeysOfMethod(const TuneSpec& tune, TuneSpec::Method method, const char* name,
                    std::initializer_list<const char*> keys) {
    if (tune.method == method) return true;
    for (const char* key : keys) {
      if (Child(key)) {
        Problem(LineOfKey(key), absl::StrCat("tune.", key),
                absl::StrCat("only with method: ", name));
      }
    }
    return false;
  }

  // The finite number `key` gives, when it is there, in *value if `valid`; else a problem that
  // says what was `expected`.
  template <typename Valid>
  void ParseNumber(const char* key, const Valid& valid, const char* expected, double* value) {
    if (!Child(key)) return;
    double v = 0;
    if (!absl::SimpleAtod(Scalar(key), &v) || !valid(v) || !std::isfinite(v)) {
      Problem(LineOfKey(key), absl::StrCat("tune.", key), expected);
    } else {
      *value = v;
    }
  }

  void ParseBoundary(TuneSpec* tune) {
    if (!KeysOfMethod(*tune, TuneSpec::Method::kBoundary, "boundary",
                      {"tolerance", "max_spike_score"})) {
      return;
    }
    ParseNumber(
        "tolerance", [](double t) { return t > 1; },
        "expected a number > 1 (1.25: stop once unstable / stable <= 1.25)", &tune->tolerance);
    ParseNumber(
        "max_spike_score", [](double m) { return m >= 0; },
        "expected a number >= 0 (the fraction of steps with a spike a stable run may have)",
        &tune->max_spike_score);
  }

  void ParseAsha(TuneSpec* tune) {
    if (!KeysOfMethod(*tune, TuneSpec::Method::kAsha, "asha",
                      {"rungs", "reduction_factor", "seeds"})) {
      return;
    }
    const YAML::Node rungs = Child("rungs");
    tune->rungs_line = LineOfKey("rungs");
    if (!rungs) {
      Problem(tune->line, "tune.rungs",
              "missing: asha compares runs at these steps (rungs: [100, 300, 900])");
    } else if (!rungs.IsSequence() || rungs.size() == 0) {
      Problem(YamlLine(rungs), "tune.rungs", "expected a non-empty list of steps");
    } else {
      for (size_t i = 0; i < rungs.size(); ++i) {
        int64_t step;
        const std::string path = absl::StrCat("tune.rungs[", i, "]");
        if (!rungs[i].IsScalar() || !absl::SimpleAtoi(rungs[i].Scalar(), &step) || step <= 0) {
          Problem(YamlLine(rungs[i]), path, "expected a step > 0");
          return;
        }
        if (!tune->rungs.empty() && step <= tune->rungs.back()) {
          Problem(YamlLine(rungs[i]), path,
                  absl::StrCat("rungs must increase: ", step, " after ", tune->rungs.back()));
          return;
        }
        tune->rungs.push_back(step);
      }
    }
    ParseNumber(
        "reduction_factor", [](double f) { return f > 1; },
        "expected a number > 1 (3: the top third of each rung goes on)", &tune->reduction_factor);
    if (Child("seeds")) {
      const std::string seeds = Scalar("seeds");
      if (seeds == "first") {
        tune->seeds = TuneSpec::Seeds::kFirst;
      } else if (seeds != "all" && !seeds.empty()) {
        Problem(LineOfKey("seeds"), "tune.seeds",
                absl::StrCat("expected all or first, got \"", seeds, "\""));
      }
    }
  }

  const YAML::Node node_;
  SweepSpec& spec_;
  SpecProblems& problems_;
};

}  // namespace

void ParseTuneBlock(const YAML::Node& node, SweepSpec* spec, SpecProblems* problems) {
  TuneParser(node, spec, problems).Parse();
}

bool IsMetricName(const std::string& name) {
  return !name.empty() && name.size() <= 128 &&
         name.find_first_of(" \t\n'\"`;") == std::string::npos;
}

const std::vector<std::string>& TuneMetrics() {
  static const auto* metrics = new std::vector<std::string>{"val_loss", "val_ppl", "gate_score",
                                                            "m_act",    "f_attn",  "sink_rate"};
  return *metrics;
}

TunePlan MakeTunePlan(const TuneSpec& tune, const ExpandedSweep& sweep) {
  TunePlan plan;
  plan.set_axis(tune.axis);
  plan.set_method(tune.method == TuneSpec::Method::kAsha       ? "asha"
                  : tune.method == TuneSpec::Method::kBoundary ? "boundary"
                                                               : "grid");
  plan.set_metric(tune.metric);
  plan.set_maximize(tune.maximize);
  for (const AxisAssignment& a : tune.values) {
    double v = 0;
    (void)absl::SimpleAtod(a.text, &v);
    plan.add_values(v);
  }
  for (int64_t r : tune.rungs) plan.add_rungs(r);
  plan.set_reduction_factor(tune.reduction_factor);
  plan.set_seeds(tune.seeds == TuneSpec::Seeds::kFirst ? "first" : "all");
  int64_t max_steps = 0;
  // Per group: its trials (values) and seeds, and its runs' steps.
  struct Group {
    std::set<double> values;
    std::set<uint64_t> seeds;
    int64_t steps = 0;
  };
  std::map<std::string, Group> groups;
  for (const RunSpec& run : sweep.runs()) {
    max_steps += run.config().train().steps();
    Group& g = groups[run.tune().group()];
    g.values.insert(run.tune().value());
    g.seeds.insert(run.seed());
    g.steps = std::max<int64_t>(g.steps, run.config().train().steps());
  }
  plan.set_max_runs(sweep.runs_size());
  plan.set_max_steps(max_steps);
  if (tune.method == TuneSpec::Method::kBoundary) {
    plan.set_min(tune.min);
    plan.set_max(tune.max);
    plan.set_tolerance(tune.tolerance);
    plan.set_max_spike_score(tune.max_spike_score);
    // Each probe halves log(unstable / stable), from log(max / min) down to log(tolerance).
    const double halvings = std::log2(std::log(tune.max / tune.min) / std::log(tune.tolerance));
    const int probes = halvings > 0 ? static_cast<int>(std::ceil(halvings - 1e-9)) : 0;
    plan.set_max_probes(probes);
    // min and max are in the sweep; each probe adds a run per group and seed like them.
    plan.set_max_runs(sweep.runs_size() + sweep.runs_size() / 2 * probes);
    plan.set_max_steps(max_steps + max_steps / 2 * probes);
    plan.set_expected_steps(plan.max_steps());
    return plan;
  }
  if (tune.method != TuneSpec::Method::kAsha) {
    plan.set_expected_steps(max_steps);
    return plan;
  }
  plan.set_trains_through(
      sweep.runs_size() > 0 &&
      std::all_of(sweep.runs().begin(), sweep.runs().end(), [](const RunSpec& run) {
        return run.config().has_program() && !HasCapability(run.config().program(), "pause");
      }));
  if (plan.trains_through()) {
    // Who is stopped, and when, depends on the order trials arrive at their rungs: no estimate.
    plan.set_expected_steps(max_steps);
    return plan;
  }
  int64_t expected = 0;
  for (const auto& [name, g] : groups) {
    const int64_t seeds = static_cast<int64_t>(g.seeds.size());
    const int64_t deciding = tune.seeds == TuneSpec::Seeds::kFirst ? 1 : seeds;
    int64_t n = static_cast<int64_t>(g.values.size());
    int64_t at = 0;
    for (int64_t rung : tune.rungs) {
      if (rung >= g.steps) break;
      expected += n * (rung - at) * deciding;
      n = std::max<int64_t>(1, static_cast<int64_t>(std::floor(n / tune.reduction_factor)));
      at = rung;
    }
    expected += n * (g.steps - at) * deciding;
    if (tune.seeds == TuneSpec::Seeds::kFirst) expected += (seeds - 1) * g.steps;
  }
  plan.set_expected_steps(expected);
  return plan;
}

std::string TunePlanText(const TunePlan& plan) {
  std::string out = absl::StrCat("tune ", plan.method(), " over ", plan.axis());
  if (plan.method() != "boundary") absl::StrAppend(&out, ": ", plan.values_size(), " values");
  if (plan.method() == "boundary") {
    absl::StrAppend(&out, "; bisects [", FormatTuneValue(plan.min()), ", ",
                    FormatTuneValue(plan.max()), "] on a log scale to a ratio of ",
                    FormatTuneValue(plan.tolerance()), " (at most ", plan.max_probes(),
                    " probes after min and max; unstable: diverged or spike score above ",
                    FormatTuneValue(plan.max_spike_score()), ")");
  }
  if (plan.method() == "asha") {
    std::vector<std::string> rungs;
    for (int64_t r : plan.rungs()) rungs.push_back(absl::StrCat(r));
    absl::StrAppend(&out, "; rungs ", absl::StrJoin(rungs, ", "), " (factor ",
                    plan.reduction_factor(), ", seeds ", plan.seeds(), ", by ",
                    plan.maximize() ? "highest " : "lowest ", plan.metric(), ")");
  }
  absl::StrAppend(&out, "; at most ", plan.max_runs(), " runs, ", FormatCount(plan.max_steps()),
                  " steps");
  if (plan.method() == "asha" && plan.trains_through()) {
    absl::StrAppend(&out,
                    "; the program cannot pause (no pause in capabilities): runs train on past "
                    "their rungs, and a value that arrives at a rung outside the top 1/",
                    plan.reduction_factor(), " of the values there so far is stopped there");
  } else if (plan.method() == "asha" && plan.max_steps() > 0) {
    absl::StrAppend(
        &out, "; expected ", FormatCount(plan.expected_steps()), " steps (",
        static_cast<int64_t>(std::lround(100.0 * plan.expected_steps() / plan.max_steps())),
        "% of the grid)");
  }
  return out;
}

}  // namespace ablate
