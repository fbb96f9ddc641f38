// bench/support/stats.hpp: the one median every kvtier benchmark reports.
//
//   std::vector<double> seconds = ...;        // one entry per repetition
//   double m = kvtier_bench::median(seconds);   // middle value; mean of the two middles if even
#pragma once

#include <algorithm>
#include <cstddef>
#include <vector>

namespace kvtier_bench {

/// Median of the samples (0 for none). Takes a copy: callers keep their order.
inline double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

}  // namespace kvtier_bench
