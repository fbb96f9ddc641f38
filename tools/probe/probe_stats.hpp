// tools/probe/probe_stats.hpp: percentiles as kvtier-probe and bench_resp_get report them.
//
//   double p99 = kvtier_probe::percentile(latencies, 0.99);
#pragma once

#include <algorithm>
#include <cstddef>
#include <vector>

namespace kvtier_probe {

/// Linear interpolation between closest ranks (the rule the reference measurements used);
/// p in [0, 1]; 0 for no samples.
inline double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const double pos = p * static_cast<double>(v.size() - 1);
  const auto lo = static_cast<std::size_t>(pos);
  const std::size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (pos - static_cast<double>(lo));
}

}  // namespace kvtier_probe
