// The `tune:` block (orchestrator/sweep/tune.h): parsing into the last axis, the run keys it
// gives, the plan it costs, and the plan's probes against the bisection's (ASHA's rule and the
// bisection alone: tests/orchestrator/coordinator/asha_test.cc, bisection_test.cc).
#include "orchestrator/sweep/tune.h"

#include <cmath>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "orchestrator/coordinator/bisection.h"
#include "orchestrator/sweep/expand.h"
#include "orchestrator/sweep/spec.h"

namespace ablate {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr char kBase[] = R"(
base:
  model: {d_model: 64, num_layers: 2, num_heads: 4, num_kv_heads: 4, head_dim: 16,
          ffn_dim: 256, max_seq_len: 64}
  train: {steps: 90, batch_size: 4, seq_len: 64, optimizer: {warmup_steps: 10}}
variants: [baseline, g1_elementwise]
budget: {match: ffn, reference: baseline, tolerance: 0.01}
seeds: [0, 1]
)";

ExpandedSweep Expand(const std::string& text) {
  absl::StatusOr<SweepSpec> spec = ParseSweepSpecText(text, "s.yaml");
  EXPECT_TRUE(spec.ok()) << spec.status();
  if (!spec.ok()) return {};
  absl::StatusOr<ExpandedSweep> sweep = ExpandSweep(*spec, {.code_version = "test"});
  EXPECT_TRUE(sweep.ok()) << sweep.status();
  return sweep.ok() ? *sweep : ExpandedSweep();
}

TEST(TuneSpecTest, AGridTuneIsTheSameRunsAsTheSameAxis) {
  const ExpandedSweep axis = Expand(absl::StrCat("sweep: s", kBase, R"(
axes:
  - product: {train.optimizer.lr: [1e-3, 2e-3, 4e-3]}
)"));
  const ExpandedSweep tuned = Expand(absl::StrCat("sweep: s", kBase, R"(
tune:
  axis: train.optimizer.lr
  values: [1e-3, 2e-3, 4e-3]
)"));
  ASSERT_EQ(axis.runs_size(), 12);
  ASSERT_EQ(tuned.runs_size(), 12);
  for (int i = 0; i < axis.runs_size(); ++i) {
    EXPECT_EQ(tuned.runs(i).run_key(), axis.runs(i).run_key()) << i;
    EXPECT_EQ(tuned.runs(i).axes(0).value(), axis.runs(i).axes(0).value()) << i;
    EXPECT_EQ(tuned.runs(i).tune().group(), tuned.runs(i).variant());
    EXPECT_EQ(tuned.runs(i).tune().stop_at_step(), 0);  // grid: every run trains to its end
  }
  EXPECT_DOUBLE_EQ(tuned.runs(2).tune().value(), 2e-3);  // runs: seed, value, variant
  EXPECT_EQ(tuned.tune().method(), "grid");
  EXPECT_EQ(tuned.tune().max_steps(), 12 * 90);
  EXPECT_EQ(tuned.tune().expected_steps(), 12 * 90);
}

TEST(TuneSpecTest, AshaRunsPauseAtTheFirstRungAndAreGroupedByVariantAndTheOtherAxes) {
  const ExpandedSweep s = Expand(absl::StrCat("sweep: s", kBase, R"(
axes:
  - product: {train.optimizer.warmup_steps: [0, 10]}
tune:
  axis: train.optimizer.lr
  range: {min: 1e-3, max: 1e-1, points: 9}
  method: asha
  rungs: [10, 30, 90]
  reduction_factor: 3
)"));
  // 2 seeds x 2 warmups x 9 values x 2 variants.
  ASSERT_EQ(s.runs_size(), 72);
  std::vector<std::string> values;
  for (int i = 0; i < 9; ++i) values.push_back(s.runs(2 * i).axes(1).value());
  EXPECT_THAT(values, ElementsAre("0.001", "0.00177828", "0.00316228", "0.00562341", "0.01",
                                  "0.0177828", "0.0316228", "0.0562341", "0.1"));
  EXPECT_EQ(s.runs(0).tune().group(), "baseline train.optimizer.warmup_steps=0");
  EXPECT_EQ(s.runs(1).tune().group(), "g1_elementwise train.optimizer.warmup_steps=0");
  EXPECT_EQ(s.runs(0).tune().stop_at_step(), 10);
  EXPECT_FALSE(s.runs(0).tune().held());
  // Per group and seed: 9 x 10 + 3 x 20 + 1 x 60 steps, against 9 x 90.
  EXPECT_EQ(s.tune().max_steps(), 72 * 90);
  EXPECT_EQ(s.tune().expected_steps(), 8 * (90 + 60 + 60));
  EXPECT_THAT(TunePlanText(s.tune()),
              HasSubstr("tune asha over train.optimizer.lr: 9 values; rungs 10, 30, 90 (factor 3, "
                        "seeds all, by lowest val_loss); at most 72 runs, 6,480 steps; expected "
                        "1,680 steps (26% of the grid)"));
}

TEST(TuneSpecTest, WithSeedsFirstTheOtherSeedsWaitAndTrainStraightThrough) {
  const ExpandedSweep s = Expand(absl::StrCat("sweep: s", kBase, R"(
tune:
  axis: train.optimizer.lr
  values: [1e-3, 2e-3, 4e-3]
  method: asha
  rungs: [30]
  seeds: first
)"));
  ASSERT_EQ(s.runs_size(), 12);
  for (const RunSpec& r : s.runs()) {
    EXPECT_EQ(r.tune().held(), r.seed() == 1) << r.index();
    EXPECT_EQ(r.tune().stop_at_step(), r.seed() == 1 ? 0 : 30) << r.index();
  }
  // Per variant: seed 0 takes 3 x 30 + 1 x 60, the winner's seed 1 another 90.
  EXPECT_EQ(s.tune().expected_steps(), 2 * (90 + 60 + 90));
  EXPECT_EQ(s.tune().first_seed(), 0u);
}

TEST(TuneSpecTest, BadBlocksNameTheLineAndField) {
  const auto error = [](const std::string& tune) {
    absl::StatusOr<SweepSpec> spec =
        ParseSweepSpecText(absl::StrCat("sweep: s", kBase, "tune:\n", tune), "s.yaml");
    return spec.ok() ? std::string("parsed") : std::string(spec.status().message());
  };
  EXPECT_THAT(error("  axis: train.optimizer.lr\n"), HasSubstr("tune: missing: the values to try"));
  EXPECT_THAT(error("  axis: train.optimizer.lr\n  values: [1e-3]\n  methd: asha\n"),
              HasSubstr("unknown key \"methd\" (did you mean \"method\"?)"));
  EXPECT_THAT(error("  axis: train.optimizer.lr\n  values: [1e-3, 1e-3]\n"),
              HasSubstr("tune.values[1]: duplicate value 1e-3"));
  EXPECT_THAT(error("  axis: train.optimizer.lr\n  values: [fast]\n"),
              HasSubstr("tune.values[0]: expected a number, got \"fast\""));
  EXPECT_THAT(error("  axis: train.optimizer.lr\n  values: [1e-3]\n  method: asha\n"),
              HasSubstr("tune.rungs: missing"));
  EXPECT_THAT(error("  axis: train.optimizer.lr\n  values: [1e-3]\n  method: boundary\n"),
              HasSubstr("boundary bisects a range: give range: {min: X, max: Y} instead"));
  EXPECT_THAT(error("  axis: train.optimizer.lr\n  range: {min: 1e-3, max: 1, points: 5}\n"
                    "  method: boundary\n"),
              HasSubstr("no points or scale"));
  EXPECT_THAT(error("  axis: train.optimizer.lr\n  range: {min: 1e-3, max: 1}\n"
                    "  method: boundary\n  tolerance: 1\n"),
              HasSubstr("tune.tolerance: expected a number > 1"));
  EXPECT_THAT(error("  axis: train.optimizer.lr\n  values: [1e-3]\n  tolerance: 2\n"),
              HasSubstr("tune.tolerance: only with method: boundary"));
  EXPECT_THAT(error("  axis: train.optimizer.lr\n  values: [1e-3]\n  metric: bleu\n"),
              HasSubstr("unknown metric \"bleu\"; use val_loss, val_ppl, gate_score"));
  EXPECT_THAT(error("  axis: model.gate.position\n  values: [1]\n"),
              HasSubstr("is not a numeric field of the run config"));
  EXPECT_THAT(error("  axis: train.optimizer.lr\n  values: [1e-3]\n  method: asha\n"
                    "  rungs: [10]\n  reduction_factor: 1\n"),
              HasSubstr("tune.reduction_factor: expected a number > 1"));
}

// ---- Boundary ----

TEST(BoundaryTest, BisectionFindsTheBoundaryOfASyntheticStabilityFunction) {
  const ExpandedSweep s = Expand(absl::StrCat("sweep: s", kBase, R"(
tune:
  axis: train.optimizer.lr
  range: {min: 1e-3, max: 1e-1}
  method: boundary
  tolerance: 1.25
)"));
  // min and max, with every seed: 2 variants x 2 seeds x 2 values.
  ASSERT_EQ(s.runs_size(), 8);
  EXPECT_EQ(s.tune().max_probes(), 5);  // log2(ln 100 / ln 1.25) = 4.4
  EXPECT_EQ(s.tune().max_runs(), 8 + 4 * 5);
  EXPECT_THAT(TunePlanText(s.tune()),
              HasSubstr("tune boundary over train.optimizer.lr; bisects [0.001, 0.1] on a log "
                        "scale to a ratio of 1.25 (at most 5 probes after min and max"));
  const auto stable = [](double x) { return x < 0.0123; };
  std::vector<BoundaryProbe> probes;
  for (double v : {1e-3, 1e-1}) probes.push_back({v, true, false, stable(v)});
  std::vector<double> tried;
  BoundaryStep step;
  for (int i = 0; i < 20; ++i) {
    step = NextBoundaryStep(probes, 1e-3, 1e-1, 1.25);
    if (step.kind != BoundaryStep::Kind::kProbe) break;
    tried.push_back(step.next);
    probes.push_back({step.next, false, false, false});
    // While it trains, nothing else happens.
    EXPECT_EQ(NextBoundaryStep(probes, 1e-3, 1e-1, 1.25).kind, BoundaryStep::Kind::kWait);
    probes.back().done = true;
    probes.back().stable = stable(step.next);
  }
  ASSERT_EQ(step.kind, BoundaryStep::Kind::kDone);
  EXPECT_THAT(tried, ElementsAre(0.01, 0.0316228, 0.0177828, 0.0133352, 0.0115478));
  EXPECT_LE(static_cast<int>(tried.size()), s.tune().max_probes());
  ASSERT_TRUE(step.stable.has_value() && step.unstable.has_value());
  EXPECT_LT(*step.stable, 0.0123);
  EXPECT_GE(*step.unstable, 0.0123);
  EXPECT_LE(*step.unstable / *step.stable, 1.25);
}

}  // namespace
}  // namespace ablate

namespace ablate {
namespace {

// A tune may rank by a metric the base's evals produce (docs/evals.md); any other name is refused
// naming those it may use. The top-level evals: reaches every run.
TEST(TuneSpecTest, RanksByAMetricOfTheEvals) {
  const std::string evals = "evals:\n  - {task: mqar, pairs: 8, samples: 4}\n";
  const ExpandedSweep s = Expand(absl::StrCat("sweep: s", kBase, evals, R"(tune:
  axis: train.optimizer.lr
  values: [1e-3, 3e-3]
  metric: mqar@8
  mode: max
)"));
  ASSERT_EQ(s.runs_size(), 8);
  EXPECT_EQ(s.tune().metric(), "mqar@8");
  EXPECT_TRUE(s.tune().maximize());
  for (const RunSpec& r : s.runs()) {
    ASSERT_EQ(r.config().train().evals_size(), 1);
    EXPECT_EQ(r.config().train().evals(0).task(), "mqar");
  }
  absl::StatusOr<SweepSpec> bad = ParseSweepSpecText(
      absl::StrCat("sweep: s", kBase, evals,
                   "tune:\n  axis: train.optimizer.lr\n  values: [1e-3]\n  metric: mqar@16\n"),
      "s.yaml");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(std::string(bad.status().message()),
              HasSubstr("unknown metric \"mqar@16\"; use val_loss, val_ppl, gate_score, m_act, "
                        "f_attn, sink_rate, or a metric of the base's evals: mqar@8"));
  // A bad evals: entry is a spec error naming its field.
  bad = ParseSweepSpecText(absl::StrCat("sweep: s", kBase, "evals:\n  - {task: passkey}\n"),
                           "s.yaml");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("train.evals[0]"));
}

}  // namespace
}  // namespace ablate
