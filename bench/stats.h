// Order statistics the benchmarks print (header-only, no dependencies).
#ifndef ABLATE_BENCH_STATS_H_
#define ABLATE_BENCH_STATS_H_

#include <algorithm>
#include <cstddef>
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

}  // namespace ablate::bench

#endif  // ABLATE_BENCH_STATS_H_
