#include "orchestrator/stats/stats.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>

namespace ablate {

MeanStd MeanAndStd(const std::vector<double>& values) {
  MeanStd out;
  double sum = 0;
  int64_t n = 0;
  for (double v : values) {
    if (!std::isfinite(v)) continue;
    sum += v;
    ++n;
  }
  if (n == 0) return out;
  out.mean = sum / static_cast<double>(n);
  if (n < 2) return out;
  double squares = 0;
  for (double v : values) {
    if (std::isfinite(v)) squares += (v - out.mean) * (v - out.mean);
  }
  out.std = std::sqrt(squares / static_cast<double>(n - 1));
  return out;
}

namespace {

// The continued fraction of the incomplete beta function (modified Lentz), which converges fast
// for x < (a + 1) / (a + b + 2).
double BetaContinuedFraction(double a, double b, double x) {
  constexpr double kTiny = 1e-300;
  constexpr double kEpsilon = 1e-15;
  const auto guard = [](double v) { return std::fabs(v) < kTiny ? kTiny : v; };
  double c = 1;
  double d = 1 / guard(1 - (a + b) * x / (a + 1));
  double h = d;
  for (int m = 1; m <= 500; ++m) {
    const double even = m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m));
    d = 1 / guard(1 + even * d);
    c = guard(1 + even / c);
    h *= d * c;
    const double odd = -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1));
    d = 1 / guard(1 + odd * d);
    c = guard(1 + odd / c);
    const double step = d * c;
    h *= step;
    if (std::fabs(step - 1) < kEpsilon) break;
  }
  return h;
}

// The regularized incomplete beta function I_x(a, b).
double RegularizedBeta(double a, double b, double x) {
  if (x <= 0) return 0;
  if (x >= 1) return 1;
  const double front = std::exp(std::lgamma(a + b) - std::lgamma(a) - std::lgamma(b) +
                                a * std::log(x) + b * std::log1p(-x));
  if (x < (a + 1) / (a + b + 2)) return front * BetaContinuedFraction(a, b, x) / a;
  return 1 - front * BetaContinuedFraction(b, a, 1 - x) / b;
}

// P(|T| >= |t|) for T ~ t(df): I_{df/(df+t²)}(df/2, 1/2), exact in the far tail where
// 1 − StudentTCdf would round to zero.
double TwoSidedP(double t, double df) {
  if (std::isinf(t)) return 0;
  return RegularizedBeta(df / 2, 0.5, df / (df + t * t));
}

double Mean(const std::vector<double>& v) {
  return std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
}

// The sample variance (n − 1).
double Variance(const std::vector<double>& v, double mean) {
  double sum = 0;
  for (double x : v) sum += (x - mean) * (x - mean);
  return sum / static_cast<double>(v.size() - 1);
}

// The test of `delta` with standard error `se` on `df` degrees of freedom.
DifferenceTest TestOf(int n, double delta, double se, double df, double alpha) {
  DifferenceTest t;
  t.n = n;
  t.delta = delta;
  t.se = se;
  t.df = df;
  const double critical = StudentTQuantile(1 - alpha / 2, df);
  t.ci_low = delta - critical * se;
  t.ci_high = delta + critical * se;
  // Every difference alike: no spread to test against. A nonzero one is as certain as the data
  // can make it; zero is no difference at all.
  t.p_value = se > 0 ? TwoSidedP(delta / se, df) : (delta == 0 ? 1.0 : 0.0);
  t.min_detectable = (critical + StudentTQuantile(0.8, df)) * se;
  return t;
}

}  // namespace

double StudentTCdf(double t, double df) {
  if (!(df > 0) || std::isnan(t)) return kNaN;
  const double tail = TwoSidedP(t, df) / 2;
  return t > 0 ? 1 - tail : tail;
}

double StudentTQuantile(double p, double df) {
  if (!(p > 0 && p < 1) || !(df > 0)) return kNaN;
  if (p < 0.5) return -StudentTQuantile(1 - p, df);
  // The CDF is increasing: bracket the answer, then halve the bracket to machine precision.
  double lo = 0, hi = 1;
  while (StudentTCdf(hi, df) < p && hi < 1e300) {
    lo = hi;
    hi *= 2;
  }
  for (int i = 0; i < 200 && hi - lo > 1e-15 * std::max(1.0, hi); ++i) {
    const double mid = (lo + hi) / 2;
    (StudentTCdf(mid, df) < p ? lo : hi) = mid;
  }
  return (lo + hi) / 2;
}

DifferenceTest PairedTTest(const std::vector<double>& variant, const std::vector<double>& reference,
                           double alpha) {
  if (variant.size() != reference.size() || variant.size() < 2) return {};
  std::vector<double> differences(variant.size());
  for (size_t i = 0; i < variant.size(); ++i) differences[i] = variant[i] - reference[i];
  const double n = static_cast<double>(differences.size());
  const double mean = Mean(differences);
  const double se = std::sqrt(Variance(differences, mean) / n);
  return TestOf(static_cast<int>(differences.size()), mean, se, n - 1, alpha);
}

DifferenceTest WelchTTest(const std::vector<double>& variant, const std::vector<double>& reference,
                          double alpha) {
  if (variant.size() < 2 || reference.size() < 2) return {};
  const double nv = static_cast<double>(variant.size());
  const double nr = static_cast<double>(reference.size());
  const double mv = Mean(variant), mr = Mean(reference);
  const double qv = Variance(variant, mv) / nv, qr = Variance(reference, mr) / nr;
  const double se = std::sqrt(qv + qr);
  // Welch–Satterthwaite; with no spread on either side the smaller sample's df stands in.
  const double df = se > 0 ? (qv + qr) * (qv + qr) / (qv * qv / (nv - 1) + qr * qr / (nr - 1))
                           : std::min(nv, nr) - 1;
  return TestOf(static_cast<int>(std::min(variant.size(), reference.size())), mv - mr, se, df,
                alpha);
}

std::vector<double> HolmAdjust(const std::vector<double>& p_values) {
  std::vector<size_t> order;
  for (size_t i = 0; i < p_values.size(); ++i) {
    if (!std::isnan(p_values[i])) order.push_back(i);
  }
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return p_values[a] < p_values[b]; });
  std::vector<double> adjusted(p_values.size(), kNaN);
  const double m = static_cast<double>(order.size());
  double running = 0;
  for (size_t k = 0; k < order.size(); ++k) {
    running = std::max(running, std::min(1.0, (m - static_cast<double>(k)) * p_values[order[k]]));
    adjusted[order[k]] = running;
  }
  return adjusted;
}

double NormalQuantile(double p) {
  if (!(p > 0 && p < 1)) return kNaN;
  // Bisection on Phi(z) = erfc(-z / sqrt 2) / 2: 200 halvings of [-40, 40] reach the double's
  // resolution, and need nothing beyond <cmath>.
  double lo = -40, hi = 40;
  for (int i = 0; i < 200 && hi - lo > 1e-15; ++i) {
    const double mid = (lo + hi) / 2;
    if (0.5 * std::erfc(-mid / std::sqrt(2.0)) < p) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  return (lo + hi) / 2;
}

Interval WilsonInterval(double successes, int64_t n, double alpha) {
  Interval out;
  if (n <= 0) return out;
  const double z = NormalQuantile(1 - alpha / 2);
  const double nn = static_cast<double>(n);
  const double phat = successes / nn;
  const double z2 = z * z;
  const double centre = (phat + z2 / (2 * nn)) / (1 + z2 / nn);
  const double half = z / (1 + z2 / nn) * std::sqrt(phat * (1 - phat) / nn + z2 / (4 * nn * nn));
  out.low = std::max(0.0, centre - half);
  out.high = std::min(1.0, centre + half);
  return out;
}

double McNemarExactP(int64_t b, int64_t c) {
  const int64_t n = b + c;
  if (n <= 0) return 1;
  const int64_t k = std::min(b, c);
  // log of sum_{i <= k} C(n, i) / 2^n, summed from the largest term down (log-sum-exp).
  const auto log_term = [&](int64_t i) {
    return std::lgamma(static_cast<double>(n) + 1) - std::lgamma(static_cast<double>(i) + 1) -
           std::lgamma(static_cast<double>(n - i) + 1) - static_cast<double>(n) * std::log(2.0);
  };
  const double top = log_term(k);
  double sum = 0;
  for (int64_t i = k; i >= 0; --i) {
    const double t = std::exp(log_term(i) - top);
    sum += t;
    if (t < 1e-18 * sum) break;  // the terms fall geometrically below k <= n / 2
  }
  return std::min(1.0, 2 * std::exp(top + std::log(sum)));
}

BootstrapTest PairedBootstrap(const std::vector<double>& differences, double alpha, int resamples,
                              uint64_t seed) {
  BootstrapTest out;
  const size_t n = differences.size();
  if (n == 0 || resamples < 1) return out;
  out.delta = std::accumulate(differences.begin(), differences.end(), 0.0) / static_cast<double>(n);
  std::mt19937_64 gen(seed);
  // Uniform in [0, n): rejection of the low values that would bias x % n (the std distributions
  // differ between standard libraries; this does not).
  const uint64_t threshold = (0 - static_cast<uint64_t>(n)) % n;
  const auto below_n = [&] {
    for (;;) {
      const uint64_t x = gen();
      if (x >= threshold) return static_cast<size_t>(x % n);
    }
  };
  std::vector<double> means(static_cast<size_t>(resamples));
  int64_t as_far = 0;
  for (double& m : means) {
    double sum = 0;
    for (size_t i = 0; i < n; ++i) sum += differences[below_n()];
    m = sum / static_cast<double>(n);
    if (std::fabs(m - out.delta) >= std::fabs(out.delta)) ++as_far;
  }
  std::sort(means.begin(), means.end());
  const auto at = [&](double q) {
    const double pos = q * static_cast<double>(resamples - 1);
    const auto i = static_cast<size_t>(std::floor(pos));
    const size_t j = std::min(i + 1, means.size() - 1);
    return means[i] + (pos - static_cast<double>(i)) * (means[j] - means[i]);
  };
  out.ci_low = at(alpha / 2);
  out.ci_high = at(1 - alpha / 2);
  out.p_value = static_cast<double>(1 + as_far) / static_cast<double>(1 + resamples);
  return out;
}

}  // namespace ablate
