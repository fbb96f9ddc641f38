// kvtier/connector/detail/settle.hpp: what one agreed load entry of a step does to a running
// load of kvtier::connector (kvtier/connector.hpp): the moves it hands to the mover, its target
// and agreed reach, and its outcome once agreed. Both load modes (whole chunks, and
// stream_groups' units); pure functions of agreed values apart from the mover's mutex, so every
// rank settles alike. Not public API.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <optional>
#include <vector>

#include "kvtier/connector/detail/mover.hpp"
#include "kvtier/connector/detail/state.hpp"
#include "kvtier/connector/detail/step.hpp"

namespace kvtier::detail {

/// A load's agreed outcome: `chunks` loaded; `sample`: a full fetch worth an estimator sample
/// of the slowest rank's `elapsed_us`.
struct load_conclusion {
  std::size_t chunks = 0;
  bool sample = false;
  std::uint64_t elapsed_us = 0;
  bool timed = false;  // elapsed_us is agreed (the step's agreement did not fail)
};

/// Settles load r on one agreed entry (`failed`: the step's agreement failed): records the
/// agreed reach, appends the newly agreed chunks to `batch` (streamed: per layer group, units
/// u = g * n + i), sets the target, and returns the outcome once it is agreed.
inline std::optional<load_conclusion> settle_load_entry(const connector_request_ptr& r, bool failed,
                                                        load_words agreed, bool streamed,
                                                        connector_shared& shared,
                                                        std::vector<move_item>& batch) {
  // A reach once agreed is final: a late hit (a store call that returns after the load's
  // deadline with more than its rank reported) never extends it, so nothing already reported
  // as the end of what the pages will hold (a layer wait's answer) is contradicted later.
  if (!failed) {
    r->agreed_reach = std::min(r->agreed_reach, agreed.reachable);
    agreed.reachable = r->agreed_reach;
    if (!streamed) agreed.fetched = std::min(agreed.fetched, r->agreed_reach);
  }
  std::optional<std::size_t> loaded;
  bool sample = false;
  if (streamed) {
    const streamed_decision d = decide_streamed_load(failed, agreed, r->n, r->enqueued_group, r->target);
    for (std::uint32_t g = 0; g < d.group_move_end.size(); ++g)
      if (d.group_move_end[g] > r->enqueued_group[g])
        batch.push_back({r, r->enqueued_group[g], d.group_move_end[g], g});
    {
      std::lock_guard lock(shared.mu);
      r->enqueued_group = d.group_move_end;
    }
    r->target = d.target, loaded = d.loaded_chunks, sample = d.sample;
  } else {
    const load_decision d = decide_load(failed, agreed, r->n, r->enqueued, r->target);
    if (d.move_end > r->enqueued) {
      batch.push_back({r, r->enqueued, d.move_end});
      std::lock_guard lock(shared.mu);
      r->enqueued = d.move_end;
      std::fill(r->enqueued_group.begin(), r->enqueued_group.end(), d.move_end);
    }
    r->target = d.target, loaded = d.loaded_chunks, sample = d.sample;
  }
  if (!loaded) return std::nullopt;
  return load_conclusion{*loaded, sample, agreed.elapsed_us, !failed};
}

/// Layer group g of every chunk of load r is agreed (or its outcome is): everything below its
/// agreed reach has been handed to the mover (connector::wait_for_layer). Agreed values only.
inline bool group_agreed(const connector_request& r, std::uint32_t g, bool streamed) noexcept {
  const std::size_t moved = streamed ? r.enqueued_group[g] : r.enqueued;
  return r.done || moved >= std::min(r.n, r.agreed_reach);
}

/// The chunks of load r whose layer group g every rank agreed to move and may still hold: those
/// handed to the mover, below the agreed reach and the target (a limit_load or a cut can lower
/// them after the move was agreed); the outcome's chunks once it is agreed. Agreed values only.
/// Under shared.mu (enqueued_group).
inline std::size_t group_agreed_chunks(const connector_request& r, std::uint32_t g, bool streamed) noexcept {
  if (r.done) return r.loaded_chunks;
  const std::size_t moved = streamed ? r.enqueued_group[g] : r.enqueued;
  return std::min({moved, r.n, r.agreed_reach, r.target});
}

}  // namespace kvtier::detail
