// The statistics behind `ablate table` and `ablate compare` (docs/cli.md): the mean and sample
// standard deviation, Student's t distribution, the paired t test and Welch's unequal-variance
// test with their confidence intervals, Holm's step-down correction of a family of p-values, and
// the smallest difference a test of this size could detect. Numbers in, numbers out: no store,
// no SQL (library ablate_stats). Pure functions of their inputs; thread-safe.
//
// Checked against SciPy on fixed inputs (tests/orchestrator/stats/stats_cases.json is read by
// both stats_test.cc and tests/python/stats_scipy_test.py).
#ifndef ABLATE_ORCHESTRATOR_STATS_STATS_H_
#define ABLATE_ORCHESTRATOR_STATS_STATS_H_

#include <cstdint>
#include <limits>
#include <vector>

namespace ablate {

// No value: a metric a run did not report, a statistic of too few values.
inline constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// The mean ± sample standard deviation (n - 1) of one metric over a group's values.
struct MeanStd {
  double mean = kNaN;  // NaN: no value
  double std = kNaN;   // NaN when fewer than 2 values
};

// The sample mean and standard deviation (n - 1) of the finite values, in their order.
MeanStd MeanAndStd(const std::vector<double>& values);

// Student's t distribution with `df` > 0 degrees of freedom (not necessarily whole: Welch's
// are not). NaN for df <= 0 or a NaN argument.
double StudentTCdf(double t, double df);
// The t with StudentTCdf(t, df) = p, for 0 < p < 1 (NaN otherwise).
double StudentTQuantile(double p, double df);

// A test of whether a difference (variant − reference) is zero, with its interval.
struct DifferenceTest {
  int n = 0;                       // paired: the pairs; Welch: the smaller sample
  double delta = 0;                // the mean difference
  double se = 0;                   // its standard error
  double df = 0;                   // degrees of freedom
  double ci_low = 0, ci_high = 0;  // the (1 − alpha) interval of delta
  double p_value = 1;              // two-sided
  // The smallest true |delta| this test would find at `alpha` with 80% power:
  // (t_{1−alpha/2} + t_{0.8}) · se, the usual normal-shift approximation on the t scale.
  double min_detectable = 0;
};

// The paired t test of variant[i] − reference[i], i < n. Needs n >= 2 equal-length samples
// (nullopt-like: n = 0 otherwise). When every difference is the same the standard error is zero:
// p is 0 (or 1 when that difference is 0) and the interval is that one point.
DifferenceTest PairedTTest(const std::vector<double>& variant, const std::vector<double>& reference,
                           double alpha);

// Welch's t test of mean(variant) − mean(reference), samples of any sizes >= 2 (n = 0
// otherwise), with the Welch–Satterthwaite degrees of freedom.
DifferenceTest WelchTTest(const std::vector<double>& variant, const std::vector<double>& reference,
                          double alpha);

// Holm's step-down adjustment of a family of p-values, in the order given: the k-th smallest
// becomes max over j <= k of min(1, (m − j + 1) · p_(j)). NaN entries are left out of the family
// (and stay NaN).
std::vector<double> HolmAdjust(const std::vector<double>& p_values);

// Tests over items (`ablate compare` on an evaluation task's accuracies: the same items scored by
// two runs of a seed, pooled over seeds).

// The standard normal quantile: the z with Phi(z) = p, for 0 < p < 1 (NaN otherwise).
double NormalQuantile(double p);

// The Wilson score interval (Wilson 1927) of a proportion: `successes` of `n` trials at level
// 1 − alpha. NaN bounds for n = 0. Successes need not be whole (a tie shared 1/k counts 1/k).
struct Interval {
  double low = kNaN, high = kNaN;
};
Interval WilsonInterval(double successes, int64_t n, double alpha);

// McNemar's exact test: the two-sided binomial p of `b` items the reference alone got right
// against `c` the variant alone got right, under p = 1/2; 1 when b + c = 0.
double McNemarExactP(int64_t b, int64_t c);

// A paired bootstrap of the mean of `differences` (variant − reference per item): `resamples`
// resamples of the items with replacement from a fixed `seed` (the same answer every time). The
// interval is the percentile interval at 1 − alpha; the p-value two-sided, of the resampled
// means centred on the observed one as far from it as the observed one is from 0:
// (1 + count) / (1 + resamples). n = 0: NaN.
struct BootstrapTest {
  double delta = kNaN, ci_low = kNaN, ci_high = kNaN, p_value = kNaN;
};
BootstrapTest PairedBootstrap(const std::vector<double>& differences, double alpha, int resamples,
                              uint64_t seed);

}  // namespace ablate

#endif  // ABLATE_ORCHESTRATOR_STATS_STATS_H_
