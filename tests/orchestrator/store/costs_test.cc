// What runs cost and what they reached by a compute budget (issue 44): a finished run's peak
// memory, training seconds and FLOPs in runs, run_summary and the comparison table; each step's
// training seconds beside its curve; and `ablate table --at-tokens / --at-flops`, each run's
// evaluation at or below a budget of tokens or FLOPs.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "config/param_count.h"
#include "orchestrator/store/format.h"
#include "orchestrator/store/reader.h"
#include "orchestrator/store/store.h"
#include "tests/orchestrator/store/store_fixture.h"
#include "tests/orchestrator/store/test_sweeps.h"
#include "tests/test_dir.h"

namespace ablate {
namespace {

using ::testing::HasSubstr;

class CostsTest : public testing::StoreFixture {
 protected:
  void SetUp() override {
    OpenStore("costs_test", testing::MakeSweep("costs", {"baseline", "g1"}, 2, 300), &ids_);
  }

  // Run `run` trains 300 steps: a point every 10 steps with its training seconds (step / 10),
  // evaluations at 100, 200 and 300 whose val loss is `base` - step / 1000; then it SUCCEEDED
  // with a peak of `peak` bytes.
  void Train(int64_t run, double base, int64_t peak) {
    RunTransition start = testing::MakeTransition(run, {PENDING}, RUNNING);
    absl::StatusOr<TransitionResult> started = store_->TransitionRun(start);
    ASSERT_TRUE(started.ok()) << started.status();
    MetricBatch b;
    b.run_id = run;
    b.attempt = started->attempt;
    b.seq = 1;
    for (int64_t step = 10; step <= 300; step += 10) {
      StepMetrics& m = b.steps.emplace_back();
      m.set_step(step);
      m.set_loss(base - step / 1000.0 + 0.5);
      m.set_grad_norm(1.0);
      m.set_lr(1e-3);
      m.set_tokens_per_s(1e4);
      m.set_elapsed_s(step / 10.0);
    }
    for (int64_t step : {100, 200, 300}) {
      EvalResult& e = b.evals.emplace_back();
      e.set_step(step);
      e.set_val_loss(base - step / 1000.0);
      e.set_val_ppl(std::exp(e.val_loss()));
      e.mutable_probes()->set_m_act(step);
    }
    ASSERT_TRUE(store_->ReportMetrics(b).ok());
    RunTransition end = testing::MakeTransition(run, {RUNNING}, SUCCEEDED);
    end.has_summary = true;
    end.summary.set_state(SUCCEEDED);
    end.summary.set_steps_done(300);
    end.summary.set_wall_s(30);
    end.summary.set_tokens_per_s(300.0 * TokensPerStep() / 30);
    end.summary.set_peak_memory_bytes(peak);
    end.summary.set_flops(300 * FlopsPerStep());
    *end.summary.mutable_final_eval() = b.evals.back();
    ASSERT_TRUE(store_->TransitionRun(end).ok());
  }

  // What MakeSweep's runs (DefaultRunConfig) train a step.
  static double TokensPerStep() {
    const TrainConfig t = DefaultTrainConfig();
    return static_cast<double>(t.batch_size()) * t.seq_len() * t.grad_accum();
  }
  static double FlopsPerStep() {
    return TokensPerStep() *
           TrainingFlopsPerToken(DefaultModelConfig(), DefaultTrainConfig().seq_len());
  }

  SweepIds ids_;
};

TEST_F(CostsTest, ARunsCostIsStoredAndShownBesideItsMetrics) {
  // runs: baseline s0, g1 s0, baseline s1, g1 s1
  Train(ids_.run_ids[0], 2.0, 100'000'000);
  Train(ids_.run_ids[1], 1.9, 120'000'000);
  Train(ids_.run_ids[2], 2.0, 300'000'000);
  Train(ids_.run_ids[3], 1.9, 120'000'000);
  absl::StatusOr<QueryResult> summary = store_->reader().ReadOnlyQuery(
      "SELECT peak_memory_bytes, train_seconds, flops FROM run_summary ORDER BY run_id LIMIT 1");
  ASSERT_TRUE(summary.ok()) << summary.status();
  EXPECT_EQ(std::get<int64_t>(summary->rows[0][0]), 100'000'000);
  EXPECT_DOUBLE_EQ(std::get<double>(summary->rows[0][1]), 30.0);
  EXPECT_DOUBLE_EQ(std::get<double>(summary->rows[0][2]), 300 * FlopsPerStep());

  absl::StatusOr<ComparisonTable> table = store_->reader().GetComparisonTable("costs");
  ASSERT_TRUE(table.ok()) << table.status();
  const ComparisonRow& base = table->rows[0];
  EXPECT_DOUBLE_EQ(base.peak_memory_bytes.mean, 200'000'000);
  EXPECT_DOUBLE_EQ(base.train_seconds.mean, 30);
  EXPECT_DOUBLE_EQ(base.flops.mean, 300 * FlopsPerStep());
  // Both formats show the costs: what each must hold.
  const std::pair<const char*, std::vector<const char*>> kFormats[] = {
      {"markdown",
       {"| memory | train time | eval time | tokens/s | FLOPs | params |",
        "| 200.0 MB | 30 s | — |"}},
      {"csv",
       {",peak_memory_bytes_mean,peak_memory_bytes_std,train_seconds_mean,",
        ",200000000,141421356.23730952,30,0,"}},
  };
  for (const auto& [format, parts] : kFormats) {
    absl::StatusOr<std::string> text = FormatComparisonTable(*table, format);
    ASSERT_TRUE(text.ok()) << format;
    for (const char* part : parts) EXPECT_THAT(*text, HasSubstr(part)) << format;
  }

  // Each curve point carries its training seconds.
  std::map<int64_t, std::vector<double>> elapsed;
  absl::StatusOr<std::map<int64_t, std::vector<std::pair<int64_t, double>>>> curves =
      store_->reader().SweepCurves(ids_.sweep_id, CurveMetric::kLoss, 100, &elapsed);
  ASSERT_TRUE(curves.ok()) << curves.status();
  const auto& points = curves->at(ids_.run_ids[0]);
  ASSERT_EQ(points.size(), 3u);  // 100, 200, 300 (step 0 has no row)
  ASSERT_EQ(elapsed.at(ids_.run_ids[0]).size(), 3u);
  for (size_t i = 0; i < points.size(); ++i) {
    EXPECT_DOUBLE_EQ(elapsed.at(ids_.run_ids[0])[i], points[i].first / 10.0);
  }
}

// A compute-matched table: each run's last evaluation at or below the budget, the same runs.
TEST_F(CostsTest, AtTokensAndAtFlopsReadEachRunsEvaluationBelowTheBudget) {
  for (size_t i = 0; i < ids_.run_ids.size(); ++i) {
    Train(ids_.run_ids[i], i % 2 == 0 ? 2.0 : 1.9, 1);
  }
  ResultSelection at;
  at.sweeps = {"costs"};
  at.at_tokens = 250 * TokensPerStep();  // the evaluation of step 200
  absl::StatusOr<ComparisonTable> table = store_->reader().GetComparisonTable(at);
  ASSERT_TRUE(table.ok()) << table.status();
  EXPECT_NEAR(table->rows[0].val_loss.mean, 2.0 - 0.2, 1e-12);
  EXPECT_NEAR(table->rows[1].val_loss.mean, 1.9 - 0.2, 1e-12);
  EXPECT_NEAR(table->rows[0].m_act.mean, 200, 1e-12);
  at.at_tokens = 0;
  at.at_flops = 100 * FlopsPerStep();  // exactly step 100's
  table = store_->reader().GetComparisonTable(at);
  ASSERT_TRUE(table.ok()) << table.status();
  EXPECT_NEAR(table->rows[0].val_loss.mean, 2.0 - 0.1, 1e-12);
  // Below the first evaluation: no value, the runs still counted.
  at.at_flops = 50 * FlopsPerStep();
  table = store_->reader().GetComparisonTable(at);
  ASSERT_TRUE(table.ok()) << table.status();
  EXPECT_TRUE(std::isnan(table->rows[0].val_loss.mean));
  EXPECT_EQ(table->rows[0].n, 2);
  // Without a budget: the final evaluation.
  table = store_->reader().GetComparisonTable("costs");
  ASSERT_TRUE(table.ok()) << table.status();
  EXPECT_NEAR(table->rows[0].val_loss.mean, 2.0 - 0.3, 1e-12);
}

}  // namespace
}  // namespace ablate
