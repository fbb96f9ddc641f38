// examples/pcp_prefill/modeled_clock.hpp: each rank's modeled clock and the booking of
// modeled I/O times on it (timing_model.hpp has the costs, this file says when each
// lookup, load, broadcast and write-back ends).
//
// The clock is replicated: every rank books every rank's modeled I/O on its own copy of
// the L2 timeline, in rank order, from agreed values only, so every copy holds the same
// times without a collective, in the thread form and the process form alike. Real
// servers (a store without `modeled_timing`) are not booked here: the engine times
// them by the wall clock and the ranks agree on the longest.
//
//   pcp::modeled_clock clock;
//   kvtier::modulo_ownership own(8);
//   pcp::modeled_io io(tm, /*world*/ 8, own, /*has_l2*/ true);   // keeps tm and own by reference
//   const double end = io.lookup_end(/*n_chunks*/ 64, clock.now);
//   clock.wait_until(end);       // a step that waits for it: the clock moves, the wait is stall
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "kvtier/ownership.hpp"
#include "timing_model.hpp"

namespace pcp {

/// A modeled time that never comes: an I/O not issued, no event pending.
inline constexpr double never = std::numeric_limits<double>::infinity();

/// Chunks of [c0, c1) that `rank` owns.
inline std::size_t owned_in(const kvtier::modulo_ownership& own, kvtier::rank_t rank, std::size_t c0,
                            std::size_t c1) {
  std::size_t k = 0;
  for (std::size_t c = c0; c < c1; ++c) k += own.owner(c) == rank;
  return k;
}

/// One rank's modeled clock (seconds). It advances by events: a compute step, the modeled
/// end of an I/O the step waits for, the next arrival.
struct modeled_clock {
  double now = 0;
  double step_stall = 0;  ///< modeled seconds the current step waited on store I/O

  /// The step waits for an I/O that ends at modeled time `end`: the clock moves there and
  /// the wait counts as stall. Every wait on I/O goes through here.
  void wait_until(double end) {
    if (end > now) step_stall += end - now, now = end;
  }
};

/// The modeled end of every rank's I/O for one request, booked on this rank's copy of the
/// L2 instances' timeline. Each call books every rank's part (ranks 0..W-1).
class modeled_io {
 public:
  modeled_io(const timing_model& tm, std::uint32_t world, const kvtier::modulo_ownership& own, bool has_l2)
      : tm_(tm), world_(world), own_(own), has_l2_(has_l2), line_(tm) {}

  /// Forgets bookings that ended by `now`.
  void prune(double now) { line_.prune(now); }

  /// Every rank's lookup of its owned keys among a request's `n_chunks`, issued at `at`:
  /// the end of the slowest.
  double lookup_end(std::size_t n_chunks, double at) {
    if (!has_l2_) return at;
    double end = at;
    for (kvtier::rank_t r = 0; r < world_; ++r) {
      const double keys = static_cast<double>(owned_in(own_, r, 0, n_chunks));
      end = std::max(end, line_.serve(r, at + tm_.l2_rtt_s, keys * tm_.l2_key_s));
    }
    return end;
  }

  /// Every rank's load of its owned chunks in [c0, c1) (those below c_l1 from L1), issued
  /// at `at`: each rank's end, in rank order.
  std::vector<double> load_ends(std::size_t c0, std::size_t c1, std::size_t c_l1, double at) {
    std::vector<double> end(world_, at);
    for (kvtier::rank_t r = 0; r < world_; ++r) {
      const auto [from_l1, from_l2] = owned_bytes(r, c0, c1, c_l1);
      const double after_l1 = at + tm_.l1_load_s(from_l1);
      end[r] =
          from_l2 > 0 && has_l2_ ? line_.serve(r, after_l1 + tm_.l2_t0_s, tm_.l2_hold_s(from_l2)) : after_l1;
    }
    return end;
  }

  /// Layer by layer (--load-granularity layer*): when layer group g (0..groups-1) of a load of
  /// chunks [c0, c1) is in every rank's pages, given each rank's fetch end `ends` (load_ends),
  /// a fetch being cut at `cap` (the request's deadline). Group g moves once every rank has
  /// fetched it and the previous group has moved: one step that agrees it (one collective),
  /// then one grouped broadcast (the group's bytes the busiest receiver gets / interconnect,
  /// plus one collective). Whole-chunk fetches (`streamed` false: one GET per chunk, what
  /// remote_store does) bring every group at the rank's fetch end; group-major ranged reads
  /// (modeled) bring group g at (g+1)/groups of the rank's transfer from its last tier.
  std::vector<double> group_landings(std::size_t c0, std::size_t c1, std::size_t c_l1,
                                     const std::vector<double>& ends, std::uint32_t groups, bool streamed,
                                     double cap) const {
    const double per_group = broadcast_s(c0, c1, 0) / groups + tm_.collective_s;
    std::vector<double> land(groups, 0);
    double moved = 0;
    for (std::uint32_t g = 0; g < groups; ++g) {
      double fetched = 0;
      for (kvtier::rank_t r = 0; r < world_; ++r) {
        const auto [from_l1, from_l2] = owned_bytes(r, c0, c1, c_l1);
        const double transfer =
            from_l2 > 0 && has_l2_ ? tm_.l2_hold_s(from_l2) : from_l1 / (tm_.l1_gbps * 1e9);
        const double left = streamed ? transfer * static_cast<double>(groups - 1 - g) / groups : 0.0;
        fetched = std::max(fetched, ends[r] - left);
      }
      moved = std::max(moved, std::min(fetched, cap) + tm_.collective_s) + per_group;
      land[g] = moved;
    }
    return land;
  }

  /// Every rank's write-back of its owned chunks in [c0, c1) at `at`: the end of the slowest.
  double writeback_end(std::size_t c0, std::size_t c1, double at) {
    double end = at;
    for (kvtier::rank_t r = 0; r < world_; ++r) {
      const double bytes = static_cast<double>(owned_in(own_, r, c0, c1)) * tm_.chunk_model_bytes();
      if (bytes > 0 && has_l2_) end = std::max(end, line_.serve(r, at + tm_.l2_t0_s, tm_.l2_hold_s(bytes)));
    }
    return end;
  }

  /// The owner -> all broadcast of chunks [c0, c1) in `collectives` collectives: what the
  /// busiest receiver got over the interconnect, plus the collectives' latency.
  double broadcast_s(std::size_t c0, std::size_t c1, std::uint64_t collectives) const {
    std::size_t received = 0;
    for (kvtier::rank_t q = 0; q < world_; ++q)
      received = std::max(received, (c1 - c0) - owned_in(own_, q, c0, c1));
    return tm_.broadcast_s(static_cast<double>(received) * tm_.chunk_model_bytes(), collectives);
  }

 private:
  /// Modeled bytes `rank` loads of chunks [c0, c1): from L1 (those below c_l1), from L2.
  std::pair<double, double> owned_bytes(kvtier::rank_t rank, std::size_t c0, std::size_t c1,
                                        std::size_t c_l1) const {
    const double cb = tm_.chunk_model_bytes();
    return {static_cast<double>(owned_in(own_, rank, c0, std::max(c0, std::min(c1, c_l1)))) * cb,
            static_cast<double>(owned_in(own_, rank, std::max(c0, c_l1), c1)) * cb};
  }

  const timing_model& tm_;
  std::uint32_t world_;
  const kvtier::modulo_ownership& own_;
  bool has_l2_;
  l2_timeline line_;
};

}  // namespace pcp
