// The statistics behind `ablate compare` (docs/cli.md): Student's t distribution, the paired t
// test and Welch's unequal-variance test with their confidence intervals, Holm's step-down
// correction of a family of p-values, and the smallest difference a test of this size could
// detect. Pure functions of their inputs; thread-safe.
//
// Checked against SciPy on fixed inputs (tests/orchestrator/store/stats_cases.json is read by
// both stats_test.cc and tests/python/stats_scipy_test.py).
#ifndef ABLATE_ORCHESTRATOR_STORE_STATS_H_
#define ABLATE_ORCHESTRATOR_STORE_STATS_H_

#include <vector>

namespace ablate {

// Student's t distribution with `df` > 0 degrees of freedom (not necessarily whole: Welch's
// are not). NaN for df <= 0 or a NaN argument.
double StudentTCdf(double t, double df);
// The t with StudentTCdf(t, df) = p, for 0 < p < 1 (NaN otherwise).
double StudentTQuantile(double p, double df);

// A test of whether a difference (variant − reference) is zero, with its interval.
struct DifferenceTest {
  int n = 0;              // paired: the pairs; Welch: the smaller sample
  double delta = 0;       // the mean difference
  double se = 0;          // its standard error
  double df = 0;          // degrees of freedom
  double ci_low = 0, ci_high = 0;  // the (1 − alpha) interval of delta
  double p_value = 1;     // two-sided
  // The smallest true |delta| this test would find at `alpha` with 80% power:
  // (t_{1−alpha/2} + t_{0.8}) · se, the usual normal-shift approximation on the t scale.
  double min_detectable = 0;
};

// The paired t test of variant[i] − reference[i], i < n. Needs n >= 2 equal-length samples
// (nullopt-like: n = 0 otherwise). When every difference is the same the standard error is zero:
// p is 0 (or 1 when that difference is 0) and the interval is that one point.
DifferenceTest PairedTTest(const std::vector<double>& variant,
                           const std::vector<double>& reference, double alpha);

// Welch's t test of mean(variant) − mean(reference), samples of any sizes >= 2 (n = 0
// otherwise), with the Welch–Satterthwaite degrees of freedom.
DifferenceTest WelchTTest(const std::vector<double>& variant, const std::vector<double>& reference,
                          double alpha);

// Holm's step-down adjustment of a family of p-values, in the order given: the k-th smallest
// becomes max over j <= k of min(1, (m − j + 1) · p_(j)). NaN entries are left out of the family
// (and stay NaN).
std::vector<double> HolmAdjust(const std::vector<double>& p_values);

}  // namespace ablate

#endif  // ABLATE_ORCHESTRATOR_STORE_STATS_H_
