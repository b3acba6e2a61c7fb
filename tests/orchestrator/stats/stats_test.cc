// The statistics of `ablate table` and `ablate compare` (orchestrator/stats/stats.h) against values
// computed with SciPy (stats_cases.json, checked against SciPy and R's published sleep examples by
// tests/python/stats_scipy_test.py). The comparison built on them: tests/orchestrator/store/
// compare_test.cc.
#include "orchestrator/stats/stats.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace ablate {
namespace {

nlohmann::json Cases() {
  std::ifstream in(std::string(ABLATE_SOURCE_DIR) + "/tests/orchestrator/stats/stats_cases.json");
  return nlohmann::json::parse(in);
}

void ExpectClose(double have, double want, const std::string& what) {
  EXPECT_NEAR(have, want, 1e-9 * std::max(1.0, std::fabs(want))) << what;
}

TEST(StatsTest, DifferenceTestsMatchScipy) {
  const nlohmann::json cases = Cases();
  ASSERT_GE(cases["tests"].size(), 7u);
  for (const nlohmann::json& c : cases["tests"]) {
    const auto variant = c["variant"].get<std::vector<double>>();
    const auto reference = c["reference"].get<std::vector<double>>();
    const double alpha = c["alpha"].get<double>();
    const DifferenceTest t = c["kind"] == "paired" ? PairedTTest(variant, reference, alpha)
                                                   : WelchTTest(variant, reference, alpha);
    const std::string name = c["name"].get<std::string>();
    const nlohmann::json& e = c["expected"];
    ASSERT_GT(t.n, 0) << name;
    for (const char* key : {"delta", "df", "ci_low", "ci_high", "p_value", "min_detectable"}) {
      const double have = std::string(key) == "delta"     ? t.delta
                          : std::string(key) == "df"      ? t.df
                          : std::string(key) == "ci_low"  ? t.ci_low
                          : std::string(key) == "ci_high" ? t.ci_high
                          : std::string(key) == "p_value" ? t.p_value
                                                          : t.min_detectable;
      ExpectClose(have, e[key].get<double>(), name + ": " + key);
    }
  }
}

TEST(StatsTest, HolmAndTheTDistributionMatchScipy) {
  const nlohmann::json cases = Cases();
  for (const nlohmann::json& c : cases["holm"]) {
    const std::vector<double> adjusted = HolmAdjust(c["p"].get<std::vector<double>>());
    const auto expected = c["expected"].get<std::vector<double>>();
    ASSERT_EQ(adjusted.size(), expected.size());
    for (size_t i = 0; i < adjusted.size(); ++i) ExpectClose(adjusted[i], expected[i], "holm");
  }
  for (const nlohmann::json& c : cases["t"]) {
    const double df = c["df"].get<double>();
    ExpectClose(StudentTCdf(c["x"].get<double>(), df), c["cdf"].get<double>(), "cdf");
    ExpectClose(StudentTQuantile(c["p"].get<double>(), df), c["quantile"].get<double>(),
                "quantile");
  }
}

TEST(StatsTest, EdgeCases) {
  // Holm leaves NaN (rows without a test) out of the family.
  const std::vector<double> adjusted = HolmAdjust({0.01, std::nan(""), 0.04});
  EXPECT_NEAR(adjusted[0], 0.02, 1e-15);
  EXPECT_TRUE(std::isnan(adjusted[1]));
  EXPECT_NEAR(adjusted[2], 0.04, 1e-15);
  // Too few values: no test.
  EXPECT_EQ(PairedTTest({1.0}, {2.0}, 0.05).n, 0);
  EXPECT_EQ(WelchTTest({1.0, 2.0}, {2.0}, 0.05).n, 0);
  EXPECT_EQ(PairedTTest({1.0, 2.0}, {2.0}, 0.05).n, 0);
  // Every difference the same: certain, the interval one point.
  const DifferenceTest same = PairedTTest({2.0, 3.0, 4.0}, {1.5, 2.5, 3.5}, 0.05);
  EXPECT_EQ(same.p_value, 0.0);
  EXPECT_NEAR(same.ci_low, 0.5, 1e-12);
  EXPECT_NEAR(same.ci_high, 0.5, 1e-12);
  EXPECT_EQ(PairedTTest({2.0, 3.0}, {2.0, 3.0}, 0.05).p_value, 1.0);
  EXPECT_TRUE(std::isnan(StudentTQuantile(1.0, 3)));
  EXPECT_TRUE(std::isnan(StudentTCdf(1.0, 0)));
}

TEST(StatsTest, MeanAndSampleStdOfTheFiniteValues) {
  const MeanStd m = MeanAndStd({1.0, std::nan(""), 2.0, 3.0});
  EXPECT_DOUBLE_EQ(m.mean, 2.0);
  EXPECT_DOUBLE_EQ(m.std, 1.0);
  const MeanStd one = MeanAndStd({5.0});
  EXPECT_DOUBLE_EQ(one.mean, 5.0);
  EXPECT_TRUE(std::isnan(one.std));
  EXPECT_TRUE(std::isnan(MeanAndStd({}).mean));
}

// The tests over items against SciPy 1.10 (Debian 12's python3-scipy):
// scipy.stats.binomtest(k, n).proportion_ci(method='wilson') and, for McNemar's exact test,
// scipy.stats.binomtest(min(b, c), b + c, 0.5).pvalue.
TEST(StatsTest, WilsonIntervalsAndMcNemarAgreeWithSciPy) {
  EXPECT_NEAR(NormalQuantile(0.975), 1.959963984540054, 1e-12);
  EXPECT_NEAR(NormalQuantile(0.5), 0, 1e-12);
  EXPECT_TRUE(std::isnan(NormalQuantile(0)));
  const struct {
    double k;
    int64_t n;
    double low, high;
  } wilson[] = {{7, 10, 0.39677814746114526, 0.892208732593699},
                {0, 20, 0.0, 0.16112515805281935},
                {45, 50, 0.7863976856252034, 0.9565242350681095}};
  for (const auto& w : wilson) {
    const Interval i = WilsonInterval(w.k, w.n, 0.05);
    EXPECT_NEAR(i.low, w.low, 1e-12) << w.k << "/" << w.n;
    EXPECT_NEAR(i.high, w.high, 1e-12) << w.k << "/" << w.n;
  }
  EXPECT_TRUE(std::isnan(WilsonInterval(0, 0, 0.05).low));
  EXPECT_NEAR(McNemarExactP(3, 12), 0.03515625, 1e-15);
  EXPECT_NEAR(McNemarExactP(12, 3), 0.03515625, 1e-15);
  EXPECT_EQ(McNemarExactP(10, 10), 1.0);
  EXPECT_NEAR(McNemarExactP(0, 5), 0.0625, 1e-15);
  EXPECT_NEAR(McNemarExactP(40, 60), 0.05688793364098088, 1e-12);
  EXPECT_EQ(McNemarExactP(0, 0), 1.0);
}

// The paired bootstrap: the same answer from the same seed, an interval around the mean
// difference, a small p for a clear shift and 1 for none.
TEST(StatsTest, PairedBootstrapIsSeededAndCentred) {
  std::vector<double> shifted, none;
  for (int i = 0; i < 200; ++i) {
    shifted.push_back(0.1 + 0.05 * ((i % 7) - 3));
    none.push_back((i % 2) == 0 ? 0.2 : -0.2);
  }
  const BootstrapTest a = PairedBootstrap(shifted, 0.05, 1000, 0);
  const BootstrapTest b = PairedBootstrap(shifted, 0.05, 1000, 0);
  EXPECT_EQ(a.ci_low, b.ci_low);
  EXPECT_EQ(a.p_value, b.p_value);
  EXPECT_NEAR(a.delta, 0.0985, 1e-12);  // 28 whole cycles of the 7 offsets, then -3..0
  EXPECT_LT(a.ci_low, a.delta);
  EXPECT_GT(a.ci_high, a.delta);
  EXPECT_NEAR(a.p_value, 1.0 / 1001, 1e-12);
  const BootstrapTest zero = PairedBootstrap(none, 0.05, 1000, 0);
  EXPECT_EQ(zero.delta, 0);
  EXPECT_EQ(zero.p_value, 1.0);
  EXPECT_TRUE(std::isnan(PairedBootstrap({}, 0.05, 1000, 0).p_value));
}

}  // namespace
}  // namespace ablate
