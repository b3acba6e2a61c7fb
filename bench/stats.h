// Order statistics the benchmarks print (header-only, no dependencies).
#ifndef ABLATE_BENCH_STATS_H_
#define ABLATE_BENCH_STATS_H_

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <utility>
#include <vector>

namespace ablate::bench {

// The q-quantile of v (0 <= q <= 1), interpolated between neighbours; 0 when v is empty.
inline double Quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double pos = q * static_cast<double>(v.size() - 1);
  const size_t lo = static_cast<size_t>(pos);
  const size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (pos - static_cast<double>(lo)) * (v[hi] - v[lo]);
}

// A distribution-free 95% confidence interval for the median of v: the order statistics
// v_(k) and v_(n-k+1), k the largest count with P(Binomial(n, 1/2) <= k - 1) <= 2.5%.
// {nan, nan} with fewer than 6 values, where no such k exists.
inline std::pair<double, double> MedianInterval(std::vector<double> v) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const size_t n = v.size();
  std::sort(v.begin(), v.end());
  // P(Binomial(n, 1/2) = k), built up term by term: C(n, k) / 2^n.
  double term = std::pow(0.5, static_cast<double>(n)), cdf = 0;
  size_t k = 0;
  while (k <= n && cdf + term <= 0.025) {
    cdf += term;
    term = term * static_cast<double>(n - k) / static_cast<double>(k + 1);
    ++k;
  }
  if (k == 0) return {nan, nan};
  return {v[k - 1], v[n - k]};
}

}  // namespace ablate::bench

#endif  // ABLATE_BENCH_STATS_H_
