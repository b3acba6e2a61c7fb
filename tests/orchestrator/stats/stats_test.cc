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

}  // namespace
}  // namespace ablate
