// The spike and divergence detectors on synthetic sequences.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "config/model_config.h"
#include "worker/train/spike.h"

namespace ablate {
namespace {

TEST(CatastrophicSpikeDetectorTest, FiresAtTenTimesTheEarlyMax) {
  CatastrophicSpikeDetector d(10.0, 3);
  EXPECT_FALSE(d.Observe(2.0));
  EXPECT_FALSE(d.Observe(3.0));
  EXPECT_FALSE(d.Observe(100.0));  // still warming up: part of the baseline
  EXPECT_FALSE(d.Observe(999.0));
  auto hit = d.Observe(1000.0);
  ASSERT_TRUE(hit.has_value());
  EXPECT_DOUBLE_EQ(*hit, 1000.0);
  EXPECT_FALSE(d.Observe(std::numeric_limits<double>::quiet_NaN()));
}

TEST(StatisticalSpikeDetectorTest, FiresAboveMeanPlusKSigmaAndKeepsSpikesOut) {
  StatisticalSpikeDetector d(4, 2.0);
  for (double v : {1.0, 3.0, 1.0, 3.0}) EXPECT_FALSE(d.Observe(v));  // mean 2, std 1
  EXPECT_FALSE(d.Observe(4.0));  // exactly mean + 2 sigma: not above
  // Window now {3, 1, 3, 4}: mean 2.75, std sqrt(1.1875).
  const double threshold = 2.75 + 2.0 * std::sqrt(1.1875);
  auto hit = d.Observe(10.0);
  ASSERT_TRUE(hit.has_value());
  EXPECT_NEAR(*hit, threshold, 1e-12);
  auto again = d.Observe(10.0);  // the spike did not enter the window
  ASSERT_TRUE(again.has_value());
  EXPECT_NEAR(*again, threshold, 1e-12);
}

TEST(StatisticalSpikeDetectorTest, SilentUntilWindowIsFull) {
  StatisticalSpikeDetector d(128, 6.0);
  for (int i = 0; i < 127; ++i) EXPECT_FALSE(d.Observe(i % 2 ? 1e6 : 0.0));
}

TEST(DivergenceDetectorTest, NeedsMoreThanPatienceConsecutiveSteps) {
  DivergenceDetector d(2.0, 4, 5);
  for (int i = 0; i < 5; ++i) EXPECT_FALSE(d.Observe(1.0));
  // A level shift, not a divergence: the window mean catches up before 5 steps in a row.
  for (int i = 0; i < 10; ++i) EXPECT_FALSE(d.Observe(10.0)) << i;

  DivergenceDetector e(2.0, 2, 3);
  for (int i = 0; i < 3; ++i) e.Observe(1.0);
  EXPECT_FALSE(e.Observe(100.0));  // mean 1
  EXPECT_FALSE(e.Observe(300.0));  // mean 34
  auto hit = e.Observe(1000.0);    // mean 133.67: third step in a row above 2x
  ASSERT_TRUE(hit.has_value());
  EXPECT_NEAR(*hit, (1.0 + 100.0 + 300.0) / 3, 1e-9);
}

TEST(SpikeMonitorTest, NonFiniteStepsEndTheRunAfterTheLimit) {
  SpikeConfig c = DefaultTrainConfig().spike();
  SpikeMonitor m(c, 1000);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  auto v1 = m.Observe(1, nan, 1.0);
  EXPECT_TRUE(v1.nonfinite);
  EXPECT_FALSE(v1.diverged);
  ASSERT_EQ(v1.events.size(), 1u);
  EXPECT_EQ(v1.events[0].kind(), SPIKE_NONFINITE);
  EXPECT_EQ(v1.events[0].signal(), "loss");
  EXPECT_FALSE(m.Observe(2, 1.0, INFINITY).diverged);
  auto v3 = m.Observe(3, nan, nan);
  EXPECT_TRUE(v3.diverged);
  EXPECT_NE(v3.reason.find("3 consecutive"), std::string::npos);
}

TEST(SpikeMonitorTest, AFiniteStepResetsTheNonFiniteCount) {
  SpikeMonitor m(DefaultTrainConfig().spike(), 1000);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  m.Observe(1, nan, 1.0);
  m.Observe(2, nan, 1.0);
  m.Observe(3, 1.0, 1.0);
  EXPECT_FALSE(m.Observe(4, nan, 1.0).diverged);
}

TEST(SpikeMonitorTest, ReportsGradNormSpikesWithBaseline) {
  SpikeConfig c = DefaultTrainConfig().spike();
  c.set_catastrophic_warmup(2);
  SpikeMonitor m(c, 1000);
  m.Observe(1, 3.0, 1.0);
  m.Observe(2, 3.0, 2.0);
  auto v = m.Observe(3, 3.0, 25.0);
  EXPECT_TRUE(v.spike);
  ASSERT_EQ(v.events.size(), 1u);
  EXPECT_EQ(v.events[0].signal(), "grad_norm");
  EXPECT_EQ(v.events[0].kind(), SPIKE_CATASTROPHIC);
  EXPECT_DOUBLE_EQ(v.events[0].value(), 25.0);
  EXPECT_DOUBLE_EQ(v.events[0].baseline(), 20.0);
  EXPECT_EQ(v.events[0].step(), 3);
}

TEST(SpikeMonitorTest, AGradNormNotReportedOrStuckAtZeroIsNoSpike) {
  // A program that reports no grad norm (nanoGPT's lines): only the loss is watched. Before,
  // its 0 made every step after the warmup a catastrophic spike (0 >= 10 x 0).
  SpikeMonitor m(DefaultTrainConfig().spike(), 1000);
  for (int64_t step = 1; step <= 300; ++step) {
    const SpikeMonitor::Verdict v = m.Observe(step, 2.0, std::nullopt);
    ASSERT_TRUE(v.events.empty()) << "step " << step << ": " << v.events[0].DebugString();
  }
  // A loss spike is still seen.
  EXPECT_TRUE(m.Observe(301, 200.0, std::nullopt).spike);
  // A reported grad norm that stays 0 has no scale to spike against.
  CatastrophicSpikeDetector d(10.0, 5);
  for (int i = 0; i < 50; ++i) EXPECT_FALSE(d.Observe(0.0).has_value()) << i;
}

TEST(SpikeMonitorTest, DivergenceWindowIsFivePercentOfTheRunAtLeastHundred) {
  SpikeConfig c = DefaultTrainConfig().spike();
  c.set_divergence_min_window(10);
  SpikeMonitor m(c, 400);  // window max(10, 20) = 20
  for (int i = 1; i <= 20; ++i) m.Observe(i, 1.0, 1.0);
  bool diverged = false;
  for (int i = 21; i <= 26 && !diverged; ++i) diverged = m.Observe(i, 5.0, 1.0).diverged;
  EXPECT_TRUE(diverged);
}

// The policies of a sweep's `spike:` (docs/training.md), without a trainer.
TEST(SpikePolicyTest, EachPolicyDecidesTheStepAndMarksItsEvents) {
  auto spiking = [] {
    SpikeMonitor::Verdict v;
    v.spike = true;
    SpikeEvent e;
    e.set_kind(SPIKE_CATASTROPHIC);
    v.events.push_back(e);
    return v;
  };
  SpikeMonitor::Verdict v = spiking();
  SpikeDecision d = ApplySpikePolicy(SPIKE_RECORD, 0, &v);
  EXPECT_FALSE(d.skip || d.roll_back || v.diverged);
  EXPECT_EQ(v.events[0].action(), SPIKE_ACTION_RECORDED);

  v = spiking();
  d = ApplySpikePolicy(SPIKE_SKIP, 0, &v);
  EXPECT_TRUE(d.skip);
  EXPECT_EQ(v.events[0].action(), SPIKE_ACTION_SKIPPED);

  v = spiking();
  d = ApplySpikePolicy(SPIKE_ROLLBACK, 0, &v);
  EXPECT_TRUE(d.roll_back);
  EXPECT_EQ(v.events[0].action(), SPIKE_ACTION_ROLLED_BACK);
  v = spiking();
  d = ApplySpikePolicy(SPIKE_ROLLBACK, kMaxRollbacks, &v);  // rolled back enough: skipped
  EXPECT_TRUE(d.skip && !d.roll_back);

  v = spiking();
  d = ApplySpikePolicy(SPIKE_STOP, 0, &v);
  EXPECT_TRUE(v.diverged);
  EXPECT_EQ(v.reason, "spike with policy STOP");
  EXPECT_EQ(v.events[0].action(), SPIKE_ACTION_STOPPED);

  SpikeMonitor::Verdict nonfinite;
  nonfinite.nonfinite = true;
  EXPECT_TRUE(ApplySpikePolicy(SPIKE_RECORD, 0, &nonfinite).skip);
}

}  // namespace
}  // namespace ablate
