// bench/connector/forward_rows.hpp: the "engine forward" rows bench_connector (ranks as threads)
// and bench_connector_mpi (ranks as processes) print: a whole-chunk connector against a
// stream_groups one, each through kvtier_bench::connector_forward (load(), wait_for_layer(l) and a
// modeled compute per layer, then steps until the outcome) at each of forward_computes.
//
//   kvtier_bench::forward_samples fs;
//   auto n = kvtier_bench::forward_round(whole, streamed, id0, rig, cache.view(), slots, true, warm_up,
//                                        barrier, keep ? &fs : nullptr);   // n.wrong, n.short_loads
//   kvtier_bench::print_forward("redis", fs);                            // medians, streamed / whole
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdio>
#include <iterator>
#include <span>
#include <vector>

#include "connector/load_rig.hpp"
#include "support/stats.hpp"

namespace kvtier_bench {

/// Modeled compute per layer: none (the forward waits only for the load), and 10 ms (a sleep, the
/// engine's GPU time, not this host's cores): about one layer group's share of the ~50 ms load
/// here (4 groups of 2 layers), so later groups can land under the compute of earlier ones.
inline constexpr std::chrono::microseconds forward_computes[] = {std::chrono::microseconds(0),
                                                                 std::chrono::milliseconds(10)};
inline constexpr std::size_t n_computes = std::size(forward_computes);

/// One rank's forward_times per round: [0 whole, 1 streamed][compute].
struct forward_samples {
  std::vector<forward_times> v[2][n_computes];
};

inline double forward_median(const std::vector<forward_times>& v, double forward_times::*m) {
  if (v.empty()) return 0;
  std::vector<double> x;
  for (const auto& f : v) x.push_back(f.*m);
  return median(x);
}

struct forward_counts {
  std::size_t wrong = 0, short_loads = 0;
};

/// One round of the forward rows: whole then (if `with_streamed`) streamed, each at every
/// compute; ids id0 .. id0 + 7.
/// `barrier()` lines the ranks up before each forward. In the warm-up the pages are cleared
/// before and checked byte for byte after each forward; `keep` (if not null) gets the times.
template <class Whole, class Streamed, class Barrier>
forward_counts forward_round(Whole& whole, Streamed& streamed, kvtier::request_id id0, const load_rig& rig,
                             const kvtier::kv_cache_view& cache, std::span<const std::int64_t> slots,
                             bool with_streamed, bool warm_up, Barrier&& barrier, forward_samples* keep) {
  forward_counts n;
  for (int mode = 0; mode < (with_streamed ? 2 : 1); ++mode) {
    for (std::size_t ci = 0; ci < n_computes; ++ci) {
      if (warm_up) load_rig::clear(cache, slots);
      barrier();
      const kvtier::request_id id = id0 + 4 * mode + ci;
      const forward_times ft =
          mode ? connector_forward(streamed, id, rig.prompt, slots, load_rig::layers, forward_computes[ci])
               : connector_forward(whole, id, rig.prompt, slots, load_rig::layers, forward_computes[ci]);
      n.short_loads += ft.loaded != load_rig::C * load_rig::T;
      if (warm_up) n.wrong += rig.wrong_chunks(cache, slots);
      if (keep) keep->v[mode][ci].push_back(ft);
    }
  }
  return n;
}

/// Per compute: each mode's medians (ms from load(): layer 0 ready, last layer ready, forward
/// end, outcome agreed), then streamed / whole.
inline void print_forward(const char* label, const forward_samples& fs) {
  using ft = forward_times;
  for (std::size_t ci = 0; ci < n_computes; ++ci) {
    const auto c_ms = static_cast<long long>(forward_computes[ci].count() / 1000);
    for (int mode = 0; mode < 2 && !fs.v[mode][ci].empty(); ++mode) {
      const auto& v = fs.v[mode][ci];
      std::printf(
          "%-12s forward, %2lld ms/layer, %-8s: layer 0 ready %7.1f ms | last layer %7.1f | end %7.1f | "
          "outcome %7.1f\n",
          label, c_ms, mode ? "streamed" : "whole", forward_median(v, &ft::first_layer) * 1e3,
          forward_median(v, &ft::last_layer) * 1e3, forward_median(v, &ft::forward_end) * 1e3,
          forward_median(v, &ft::outcome) * 1e3);
    }
    if (!fs.v[0][ci].empty() && !fs.v[1][ci].empty()) {
      const auto ratio = [&](double ft::*m) {
        return forward_median(fs.v[1][ci], m) / forward_median(fs.v[0][ci], m);
      };
      std::printf(
          "%-12s forward, %2lld ms/layer, streamed / whole: layer 0 %.2fx | last layer %.2fx | end %.2fx | "
          "outcome %.2fx\n",
          label, c_ms, ratio(&ft::first_layer), ratio(&ft::last_layer), ratio(&ft::forward_end),
          ratio(&ft::outcome));
    }
  }
}

}  // namespace kvtier_bench
