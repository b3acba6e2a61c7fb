// Sweep specs: the YAML a researcher writes (docs/spec.md), parsed and checked.
//
// Parsing checks everything that can be checked without expanding: keys, types, enum values,
// preset and group names, duplicate variant names, axis shapes, filter and budget references.
// Expansion (orchestrator/sweep/expand.h) then checks each run's config and budget. Every problem is
// reported as "FILE:LINE: field.path: what is wrong", one per line, in one InvalidArgument.
// Pure functions; thread-safe. A SweepSpec keeps YAML nodes (for error lines and late overlays)
// and is not meant to be shared across threads while in use.
#ifndef ABLATE_ORCHESTRATOR_SWEEP_SPEC_H_
#define ABLATE_ORCHESTRATOR_SWEEP_SPEC_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/ablate.pb.h"
#include "yaml-cpp/yaml.h"

namespace ablate {

// One entry of `variants:` after group expansion.
struct VariantSpec {
  std::string name;         // unique in the sweep
  std::string preset;       // "" for a custom variant (overrides only)
  std::string description;  // the preset's one-liner, the entry's `description`, or "custom"
  YAML::Node model;         // overrides overlaid after the preset (null when none)
  YAML::Node train;         // overrides of the training config (null when none)
  YAML::Node params;        // a program's params it overrides (null when none)
  std::optional<BudgetRule> budget;  // the entry's own rule, replacing the sweep's
  YAML::Node node;          // the entry itself (for error lines); null for a group member
  int line = 0;             // where the entry (or its group) is written
};

// One field assignment of an axis point: `path` = `value`.
struct AxisAssignment {
  std::string path;   // dotted, below RunConfig: "train.optimizer.lr"
  YAML::Node value;   // a scalar (or a mapping for a message field)
  std::string text;   // the value as written, for reports
  int line = 0;
};
using AxisPoint = std::vector<AxisAssignment>;

// One entry of `axes:`, already expanded into its points.
struct AxisSpec {
  enum class Mode { kProduct, kZip, kList };
  Mode mode = Mode::kProduct;
  std::vector<AxisPoint> points;
  int line = 0;
};

// One entry of `filters:`: a run matches when every condition holds. `exclude` drops matching
// runs; `only` drops the others. Filters apply in order.
struct FilterSpec {
  struct Condition {
    std::string key;                  // "variant", "seed" or a dotted field path
    std::vector<std::string> names;   // for "variant": any of these
    std::vector<uint64_t> seeds;      // for "seed": any of these
    YAML::Node value;                 // for a field path: the value to compare
    int line = 0;
  };
  bool exclude = true;
  std::vector<Condition> conditions;
  int line = 0;
};

// The `tune:` block (docs/spec.md, "Tuning"): one numeric field searched per variant and per
// point of the other axes. Its values become one more product axis, the last, so a `grid` tune
// expands to exactly the runs (and run keys) of the same `axes:` entry.
struct TuneSpec {
  enum class Method { kGrid, kAsha, kBoundary };
  enum class Seeds { kAll, kFirst };
  std::string axis;                   // dotted path below RunConfig of a numeric scalar field
  std::vector<AxisAssignment> values; // `values:`, or the points of `range:` ("%.6g" text)
  Method method = Method::kGrid;
  std::string metric = "val_loss";    // val_loss, val_ppl, gate_score, m_act, f_attn
  bool maximize = false;              // `mode: max`
  std::vector<int64_t> rungs;         // asha: increasing, > 0
  double reduction_factor = 3;        // asha: > 1
  Seeds seeds = Seeds::kAll;          // asha: decide on the mean over every seed, or on the first
  // boundary: the bracket to bisect (values holds min and max), the ratio unstable / stable at
  // which it stops, and the spike score above which a run is unstable.
  double min = 0, max = 0;
  double tolerance = 1.25;
  double max_spike_score = 0;
  int line = 0;
  int rungs_line = 0;
};

struct SweepSpec {
  std::string file;         // for error messages and reports
  std::string name;         // `sweep:`, required
  std::string description;  // `description:`
  RunConfig base;           // DefaultRunConfig() overlaid with `base:` and `spike:`
  YAML::Node base_node;     // the `base:` node (null when absent)
  std::vector<VariantSpec> variants;
  std::vector<AxisSpec> axes;
  std::vector<uint64_t> seeds;  // `seeds:`; default: the base's train.seed
  int seeds_line = 0;           // of `seeds:`; 0 without one
  std::vector<FilterSpec> filters;
  BudgetRule budget;        // `budget:` over DefaultBudgetRule(); match NONE when absent
  int budget_line = 0;
  std::string reference;    // the variant added parameters are counted against
  Resources resources;      // `resources:`; device defaults to the kind of train.device
  int32_t priority = 1;     // `priority:`, higher first
  std::optional<TuneSpec> tune;  // `tune:`; its values are also the last entry of `axes`
};

// The most runs a spec may expand to before filters (seeds x axis points x variants), checked
// while parsing: expansion time and memory grow with it, so a few lines of `axes:` must not make
// the coordinator build millions of configs (found with tests/fuzz/spec_fuzz). The coordinator's
// own limit on the runs it queues (10,000 by default) is lower.
inline constexpr int64_t kMaxSpecRuns = 100000;
// The most runs a sweep may have after filters, by default: ExpandSweep counts them before it
// builds any (ExpandOptions::max_runs), and a coordinator queues at most this many per sweep
// (CoordinatorOptions::max_runs_per_sweep).
inline constexpr int64_t kDefaultMaxRuns = 10000;
// The longest sweep or variant name, and the longest description, a spec may give (each is
// copied into every run).
inline constexpr size_t kMaxNameBytes = 256;
inline constexpr size_t kMaxDescriptionBytes = 4096;

absl::StatusOr<SweepSpec> ParseSweepSpec(const YAML::Node& root, const std::string& file);
absl::StatusOr<SweepSpec> ParseSweepSpecText(const std::string& text, const std::string& file);
// NotFound naming the path when the file cannot be read.
absl::StatusOr<SweepSpec> LoadSweepSpecFile(const std::string& path);

}  // namespace ablate

#endif  // ABLATE_ORCHESTRATOR_SWEEP_SPEC_H_
