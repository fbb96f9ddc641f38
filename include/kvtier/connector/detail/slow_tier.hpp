// kvtier/connector/detail/slow_tier.hpp: what keeps a tier slower than recomputing from
// slowing the engine, under the cost and split policies (kvtier/connector.hpp):
//
// - A load races recomputing: its deadline is at most the time recomputing its tokens takes
//   (connector_options::race_recompute), so a load that would lose is cut and recomputed.
// - Every load teaches the estimator, a cut one too: a load cut at chunk c of n took at least
//   elapsed * (n + 1) / (c + 1) for all n (its progress, extrapolated; c = 0 still counts).
// - A load that took at least as long as recomputing its tokens lost the race; after
//   `lost_to_judge` lost races in a row, or once the estimate declines a hit right after a lost
//   race, the tier is judged slow: lookups skip the store (answer:
//   nothing cached, counted in lookups_skipped) and the plan loads nothing. Every probe_every-th
//   lookup while judged slow asks the store anyway and loads its hit (a probe). A probe that
//   loads all of it faster than recomputing ends the judgement and restarts the estimator from
//   its prior (what it learnt while the tier was slow no longer holds).
//
// Symmetric: the judgement, the probe count and the probe decision change only on agreed values
// (the agreed hit, a load's agreed outcome and the slowest rank's time), and the state is folded
// into the lookup's fingerprint, so ranks that differ fail the lookup together. A rank's own
// choice to skip its store only lowers its answer, and the agreed hit is the min. Not public API.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>

#include "kvtier/connector/detail/step.hpp"
#include "kvtier/connector/types.hpp"
#include "kvtier/cost_model.hpp"
#include "kvtier/deadline.hpp"

namespace kvtier::detail {

class slow_tier_guard {
 public:
  /// Lost races in a row that judge the tier slow (one late load on a busy host does not).
  static constexpr std::uint32_t lost_to_judge = 3;

  static bool active(const connector_options& opt) noexcept {
    return opt.policy != load_policy::always && opt.probe_every > 0 && opt.node.prefill_tokens_per_s > 0;
  }
  bool judged_slow() const noexcept { return slow_; }

  /// begin_lookup: skip the store (this rank answers "nothing cached") unless a probe is due.
  bool skip_lookup(const connector_options& opt) const noexcept {
    return active(opt) && slow_ && !probe_due(opt);
  }

  /// Folded into a lookup entry's fingerprint: the judgement and the probe count shape the plan.
  std::uint64_t fingerprint() const noexcept { return declined_ << 1 | (slow_ ? 1 : 0); }

  /// settle_lookup's plan for the agreed hit; `probe` says whether this lookup is a probe.
  planned_range plan(const connector_options& opt, const load_estimator& est, std::uint64_t hit,
                     std::uint64_t prompt_tokens, std::uint64_t chunk_tokens, std::uint64_t world,
                     bool& probe) {
    probe = false;
    if (!active(opt) || !slow_) {
      const planned_range p = plan_load(opt, est, hit, prompt_tokens, chunk_tokens, world);
      // The last load lost the race and the estimate now declines a hit: judged slow (else
      // nothing would be loaded, so measured, again).
      if (active(opt) && lost_in_row_ > 0 && hit >= chunk_tokens && p.end <= p.first)
        slow_ = true, declined_ = 1;
      return p;
    }
    if (probe_due(opt) && hit >= chunk_tokens) {
      probe = true, declined_ = 0;
      return {0, hit / chunk_tokens * chunk_tokens};
    }
    ++declined_;
    return {};
  }

  /// A load of `tokens` ended agreed after `elapsed_s` (the slowest rank's), `complete` or cut.
  /// True when the tier is back (a probe won): the caller restarts the estimator.
  bool concluded(const connector_options& opt, std::uint64_t tokens, bool complete, double elapsed_s,
                 bool probe) {
    if (!active(opt)) return false;
    if (elapsed_s >= race_s(opt, tokens)) {  // lost the race
      if (++lost_in_row_ >= lost_to_judge && !slow_) slow_ = true, declined_ = 0;
      return false;
    }
    lost_in_row_ = 0;
    if (!(slow_ && probe && complete)) return false;
    slow_ = false, declined_ = 0;
    return true;
  }

  /// The load's deadline: the configured one, or sooner when recomputing would be done first.
  static clock::time_point load_deadline(const connector_options& opt, clock::time_point started,
                                         std::uint64_t tokens) {
    const clock::time_point dl = started + opt.load_deadline.after(tokens);
    // Only when the wall clock is the engine's (wall_clock_samples): on a modeled clock the
    // node's figures say nothing about how long a real load may take here.
    if (opt.policy == load_policy::always || !opt.race_recompute || !opt.wall_clock_samples ||
        !(opt.node.prefill_tokens_per_s > 0))
      return dl;
    const auto race = std::chrono::duration<double>(race_s(opt, tokens));
    return std::min(dl, started + std::chrono::duration_cast<clock::duration>(race));
  }

  /// The estimator's sample for a load of n chunks that ended with `chunks` loaded after
  /// `elapsed_s` (the slowest rank's): seconds for all n chunks.
  static double sample_seconds(std::size_t n, std::size_t chunks, double elapsed_s) noexcept {
    return chunks >= n ? elapsed_s : elapsed_s * static_cast<double>(n + 1) / static_cast<double>(chunks + 1);
  }

 private:
  // Below this a race deadline would cut loads (and judge the tier) for the scheduling noise
  // of a busy host: steps and moves of a few milliseconds.
  static constexpr double min_race_s = 0.005;
  // Seconds by which a load of `tokens` must end to beat recomputing them.
  static double race_s(const connector_options& opt, std::uint64_t tokens) noexcept {
    return std::max(recompute_time_s(opt.node, static_cast<double>(tokens)), min_race_s);
  }
  bool probe_due(const connector_options& opt) const noexcept { return declined_ + 1 >= opt.probe_every; }
  bool slow_ = false;              // agreed: the tier is judged slower than recomputing
  std::uint64_t declined_ = 0;     // agreed lookups since the judgement or the last probe
  std::uint32_t lost_in_row_ = 0;  // agreed loads in a row that lost the race
};

}  // namespace kvtier::detail
