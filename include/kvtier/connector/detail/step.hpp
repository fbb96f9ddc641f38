// kvtier/connector/detail/step.hpp: the step agreement of kvtier::connector
// (kvtier/connector.hpp): the words each rank contributes per waiting request, their
// encoding in the one all-reduce (min) of a step, and what the agreed words decide: a
// lookup's plan after the policy, and a load's next moves and outcome. Pure functions of
// agreed values, so every rank decides the same. Not public API.
#pragma once

#include <algorithm>
#include <bit>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <mutex>
#include <optional>
#include <span>
#include <system_error>
#include <vector>

#include "kvtier/connector/detail/state.hpp"
#include "kvtier/connector/types.hpp"
#include "kvtier/cost_model.hpp"
#include "kvtier/deadline.hpp"
#include "kvtier/fetch_types.hpp"

namespace kvtier::detail {

/// One step's agreement, all reduced by min. The body is five words per waiting entry, then
/// the engine's own words (connector::step(dl, words)); the header says what every rank must
/// share before the body means anything:
///
///   [body, ~body, fp, ~fp, deployment, ~deployment]
///
/// `body` is the body's length in words, `fp` folds every entry's request id and kind and the
/// engine's word count (ranks whose request lists differ fail together instead of pairing one
/// request's values with another's), `deployment` folds every setting that shapes a collective
/// or decides what a key means (connector::deployment_word). A value and its complement reduced
/// by min give min and ~max: they agree exactly when every rank holds the same value.
///
/// The element count of every collective is agreed before it is issued: the first round is
/// always header + inline_body words (the body padded with zeros), so ranks that disagree on
/// the body's length still issue the same round and all learn it (MPI aborts a job whose ranks
/// pass different counts). Only a body longer than inline_body needs a second round, for the
/// rest, and its length is the agreed one. A word reduced by max travels as its complement.
struct step_message {
  static constexpr std::size_t header = 6, words = 5, inline_body = 48;
  std::vector<std::uint64_t> v;
  std::size_t entries = 0, body = 0;

  step_message(std::size_t n, std::span<const std::uint64_t> engine_words)
      : v(header + std::max(words * n + engine_words.size(), inline_body), 0),
        entries(n),
        body(words * n + engine_words.size()) {
    v[0] = body, v[1] = ~std::uint64_t{body};
    std::copy(engine_words.begin(), engine_words.end(),
              v.begin() + static_cast<std::ptrdiff_t>(header + words * n));
  }
  std::span<std::uint64_t> entry(std::size_t i) noexcept {
    return std::span(v).subspan(header + words * i, words);
  }
  /// The first round: always header + inline_body words.
  std::span<std::uint64_t> first_round() noexcept { return std::span(v).first(header + inline_body); }
  /// The second round, after a first round whose body length every rank shares: the rest of
  /// the body (empty when it fitted inline).
  std::span<std::uint64_t> second_round() noexcept { return std::span(v).subspan(header + inline_body); }
  /// The engine's words after the reduction, or 0s after a failed one.
  void agreed_words(std::error_code ec, std::span<std::uint64_t> out) const noexcept {
    if (ec) return std::fill(out.begin(), out.end(), 0);
    const auto first = v.begin() + static_cast<std::ptrdiff_t>(header + words * entries);
    std::copy(first, first + static_cast<std::ptrdiff_t>(out.size()), out.begin());
  }
  void seal(std::uint64_t fp, std::uint64_t deployment) noexcept {
    v[2] = fp, v[3] = ~fp, v[4] = deployment, v[5] = ~deployment;
  }
  // After the first round (reduced):
  bool same_shape() const noexcept { return v[0] == ~v[1] && v[0] == body; }
  bool same_deployment() const noexcept { return v[4] == ~v[5]; }
  bool same_requests() const noexcept { return v[2] == ~v[3]; }
};

inline std::uint64_t step_fp_mix(std::uint64_t h, std::uint64_t x) noexcept {
  h ^= x + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
  h *= 0xBF58476D1CE4E5B9ull;
  return h ^ (h >> 31);
}

/// The bits of an estimate (T0, B), for a fingerprint.
inline std::uint64_t estimate_fingerprint(const load_path& p) noexcept {
  return step_fp_mix(std::bit_cast<std::uint64_t>(p.fixed_cost_s),
                     std::bit_cast<std::uint64_t>(p.bandwidth_gb_per_s));
}

/// What an entry's fingerprint folds: the request id and kind; for a lookup the prompt length,
/// the number of keyed chunks and `plan_fp` (the estimate, under the cost and split policies:
/// the plan depends on all three); for a load its range. Ranks that differ in any of them fail
/// that step's agreement together.
inline std::uint64_t entry_fingerprint(const connector_request& r, std::uint64_t plan_fp) noexcept {
  const std::uint64_t h = step_fp_mix(step_fp_mix(0, r.id), r.lookup_agreed);
  if (!r.lookup_agreed)
    return step_fp_mix(step_fp_mix(step_fp_mix(h, r.prompt_tokens), r.keys.size()), plan_fp);
  return step_fp_mix(step_fp_mix(h, r.first_chunk), r.n);
}

inline constexpr std::uint64_t step_top = ~std::uint64_t{0};

/// A lookup's entry: [ready, answer tokens, -, -, -]. The agreed answer is the min over ranks
/// once every rank is ready (a rank not ready contributes ready 0, so min says "not yet").
struct lookup_words {
  bool ready = false;
  std::uint64_t answer_tokens = 0;

  void encode(std::span<std::uint64_t> e) const noexcept {
    e[0] = ready ? 1 : 0;
    e[1] = ready ? answer_tokens : step_top;
    e[2] = e[3] = e[4] = step_top;
  }
  static lookup_words decode(std::span<const std::uint64_t> e) noexcept { return {e[0] != 0, e[1]}; }
};

/// A load's entry: [fetched, reachable, landed, ok, ~elapsed us]. Agreed: the prefix every
/// rank has fetched, the most every rank can still reach, the prefix in every rank's pages,
/// whether every rank's moves and its own part succeeded, and the slowest rank's time.
struct load_words {
  std::size_t fetched = 0, reachable = 0, landed = 0;
  bool ok = true;
  std::uint64_t elapsed_us = 0;

  void encode(std::span<std::uint64_t> e) const noexcept {
    e[0] = fetched, e[1] = reachable, e[2] = landed, e[3] = ok ? 1 : 0, e[4] = ~elapsed_us;
  }
  static load_words decode(std::span<const std::uint64_t> e) noexcept {
    return {static_cast<std::size_t>(e[0]), static_cast<std::size_t>(e[1]), static_cast<std::size_t>(e[2]),
            e[3] != 0, ~e[4]};
  }
};

/// This rank's words for a lookup not yet agreed: its store's answer once the lookup completed
/// (`on_end` gets the result), "nothing cached" once its deadline passed (the lookup is
/// cancelled; `on_end` gets nullptr), else not ready. A rank that owns none of the chunks
/// answers `keyed_end`. Called at every step until the lookup is agreed, so on_end may run
/// more than once for one lookup.
template <class Queue, class OnEnd>
lookup_words lookup_contribution(connector_request& r, Queue& queue, std::uint64_t keyed_end, OnEnd on_end) {
  if (r.lookup_skipped) return {true, 0};
  if (!r.lookup.valid()) return {true, keyed_end};
  if (auto res = queue.poll(r.lookup)) {
    on_end(&*res);
    return {true, res->answer_tokens};
  }
  if (!expired(r.lookup_dl)) return {false, 0};
  queue.cancel(r.lookup);
  on_end(nullptr);
  return {true, 0};
}

/// This rank's words for a running load: the prefix its fetch has landed (all of it when it
/// owns none; nothing after a local failure), capped by limit_load; what it can still reach;
/// what the mover has scattered (read under shared.mu); the failure flag; the time so far.
template <class Queue>
load_words load_contribution(connector_request& r, const Queue& queue, connector_shared& shared,
                             std::size_t chunk_tokens) {
  std::size_t fetched = r.n;
  bool fetch_done = true;
  if (r.local_failure) {
    fetched = 0;
  } else if (r.fetch.valid()) {
    const fetch_progress p = queue.progress(r.fetch);
    fetched = std::min<std::size_t>(
        r.n, (p.answer_tokens - std::min(p.answer_tokens, r.range_first_token)) / chunk_tokens);
    fetch_done = p.complete || expired(r.load_dl);
  }
  fetched = std::min(fetched, r.cap);  // limit_load: never agree past this rank's cap
  std::lock_guard lock(shared.mu);
  return {.fetched = fetched,
          .reachable = std::min(fetch_done ? fetched : r.n, r.cap),
          .landed = r.local_failure ? 0 : r.landed_locked(),
          .ok = !(r.move_failed || r.local_failure),
          .elapsed_us = static_cast<std::uint64_t>(
              std::chrono::duration_cast<std::chrono::microseconds>(clock::now() - r.load_started).count())};
}

/// connector_options::stream_groups: the fetch lands layer group by layer group, and the load's
/// `fetched` word counts units instead of chunks, in group-major order: unit g * n + i is layer
/// group g of chunk i. This rank reports the first unit that it owns, inside its reach, and has
/// not verified (units of chunks other ranks own, or at or past its reach, count as done), so
/// the min over ranks U is a prefix of units every owner has, for the chunks below the agreed
/// reach R. `reachable` stays in chunks: the first owned chunk whose fetch ended short (n while
/// it runs). Without the reach a rank whose chunk i failed in group g would hold U at g * n + i
/// for good; with it, U passes such chunks once the fetch ended, and nothing at or past R moves.
inline std::size_t first_missing_unit(const connector_request& r, const fetch_progress& p,
                                      const connector_geometry& geo, std::size_t reach) noexcept {
  std::size_t first = geo.groups * r.n;
  for (std::size_t k = 0; k < r.fetch_chunks.size(); ++k) {
    const std::size_t i = r.fetch_chunks[k] - r.first_chunk;
    if (i >= reach) continue;
    const std::size_t bytes = k < p.landed_bytes.size() ? p.landed_bytes[k] : 0;
    std::uint32_t g = 0;
    while (g < geo.groups && bytes >= geo.group_end(g)) ++g;
    if (g < geo.groups) first = std::min(first, g * r.n + i);
  }
  return first;
}

/// load_contribution for stream_groups: [first missing unit, reach in chunks, landed, ok, time].
template <class Queue>
load_words streamed_contribution(connector_request& r, const Queue& queue, connector_shared& shared,
                                 const connector_geometry& geo) {
  std::size_t units = geo.groups * r.n, reach = r.n;
  if (r.local_failure) {
    units = reach = 0;
  } else if (r.fetch.valid()) {
    const fetch_progress p = queue.progress(r.fetch);
    // What did not land by now never will. A key whose every group is verified has landed,
    // though its store call (still running at the deadline) has not reported it yet.
    const std::size_t whole = geo.group_end(geo.groups - 1);
    if (p.complete || expired(r.load_dl))
      for (std::size_t k = 0; k < r.fetch_chunks.size() && k < p.landed_keys.size(); ++k)
        if (!p.landed_keys[k] && !(k < p.landed_bytes.size() && p.landed_bytes[k] >= whole))
          reach = std::min(reach, r.fetch_chunks[k] - r.first_chunk);
    reach = std::min(reach, r.cap);
    units = first_missing_unit(r, p, geo, reach);
  }
  reach = std::min(reach, r.cap);
  std::lock_guard lock(shared.mu);
  return {.fetched = units,
          .reachable = reach,
          .landed = r.local_failure ? 0 : r.landed_locked(),
          .ok = !(r.move_failed || r.local_failure),
          .elapsed_us = static_cast<std::uint64_t>(
              std::chrono::duration_cast<std::chrono::microseconds>(clock::now() - r.load_started).count())};
}

/// Ends a load with its agreed prefix of `chunks`: the pages past it are never written again
/// (the scatter gate), the counters count it, and it stops being a running load.
inline void end_load(connector_request& r, std::size_t chunks, std::size_t chunk_tokens,
                     connector_counters& counters, connector_shared& shared) {
  {
    std::lock_guard gate(r.scatter_mu);
    if (chunks < r.n) r.abandoned = true;
  }
  r.done = true;
  r.loaded_chunks = chunks;
  counters.load_latency.observe(clock::now() - r.load_started);
  r.loaded_end_token = r.range_first_token + static_cast<std::uint64_t>(chunks) * chunk_tokens;
  counters.tokens_loaded.add(r.loaded_end_token - r.range_first_token);
  if (chunks < r.n) {
    counters.loads_cut_short.add();
    counters.tokens_to_recompute.add(r.range_end_token - r.loaded_end_token);
  }
  std::lock_guard lock(shared.mu);
  std::erase_if(shared.active_loads, [&](const connector_request_ptr& p) { return p.get() == &r; });
  shared.landed.notify_all();
}

/// The load range [first, end) the policy plans for an agreed cached prefix of `hit` tokens:
/// full chunks only; none under the cost policy when recomputing is faster; in split mode the
/// estimator's split point (rounded down to a chunk), none when that leaves nothing to load.
struct planned_range {
  std::uint64_t first = 0, end = 0;
};
inline planned_range plan_load(const connector_options& opt, const load_estimator& est, std::uint64_t hit,
                               std::uint64_t prompt_tokens, std::uint64_t chunk_tokens, std::uint64_t world) {
  const std::uint64_t T = chunk_tokens;
  planned_range p{0, hit / T * T};
  if (opt.policy == load_policy::cost && !est.decide(opt.node, static_cast<double>(hit)).load) {
    p.end = 0;
  } else if (opt.policy == load_policy::split && hit > 0) {
    const double granularity = static_cast<double>(T) * static_cast<double>(world);
    const auto k = static_cast<std::uint64_t>(
        est.split(opt.node, static_cast<double>(hit), static_cast<double>(prompt_tokens), granularity)
            .k_tokens);
    p.first = std::min(p.end, k / T * T);
    if (p.first == p.end) p.first = p.end = 0;
  }
  return p;
}

/// What one agreed load entry decides for a load of n chunks of which `enqueued` are already
/// moving and whose final prefix is `target` (max: not yet known): move [enqueued, move_end),
/// the new target, and, when the outcome is agreed, the chunks loaded.
struct load_decision {
  std::size_t move_end = 0;
  std::size_t target = std::numeric_limits<std::size_t>::max();
  std::optional<std::size_t> loaded_chunks;  // set: the load ends with this prefix
  bool sample = false;                       // the outcome is a full fetch worth an estimator sample
};
inline load_decision decide_load(bool agreement_failed, const load_words& a, std::size_t n,
                                 std::size_t enqueued, std::size_t target) {
  load_decision d{enqueued, target, std::nullopt, false};
  if (agreement_failed || !a.ok) {
    // A failed agreement: nothing is known to be in every rank's pages. A failed move or
    // local failure: the chunks every rank has scattered (min over ranks) stay loaded.
    d.loaded_chunks = agreement_failed ? 0 : a.landed;
    return d;
  }
  d.move_end = std::max(enqueued, a.fetched);
  if (a.fetched == n || a.reachable <= a.fetched) d.target = a.fetched;
  if (d.target != std::numeric_limits<std::size_t>::max() && a.landed >= d.target) {
    d.loaded_chunks = d.target;
    d.sample = d.target > 0;
  }
  return d;
}

/// decide_load for stream_groups (a.fetched in units, see first_missing_unit): per layer group,
/// the chunks [enqueued_group[g], group_move_end[g]) to move now (never at or past the agreed
/// reach); the load's target once every unit below the reach is fetched (or the reach is 0);
/// its outcome once that many chunks are in every rank's pages.
struct streamed_decision {
  std::vector<std::size_t> group_move_end;
  std::size_t target = std::numeric_limits<std::size_t>::max();
  std::optional<std::size_t> loaded_chunks;
  bool sample = false;
};
inline streamed_decision decide_streamed_load(bool agreement_failed, const load_words& a, std::size_t n,
                                              std::span<const std::size_t> enqueued_group,
                                              std::size_t target) {
  streamed_decision d{{enqueued_group.begin(), enqueued_group.end()}, target, std::nullopt, false};
  if (agreement_failed || !a.ok) {
    d.loaded_chunks = agreement_failed ? 0 : a.landed;
    return d;
  }
  const std::size_t groups = enqueued_group.size(), units = a.fetched, reach = std::min(a.reachable, n);
  for (std::size_t g = 0; g < groups; ++g) {
    const std::size_t covered = units > g * n ? std::min(n, units - g * n) : 0;
    d.group_move_end[g] = std::max(enqueued_group[g], std::min(reach, covered));
  }
  const std::size_t last = (groups - 1) * n;  // chunk i is whole once unit last + i is fetched
  const std::size_t whole = std::min(reach, units > last ? units - last : 0);
  if (whole == n || reach <= whole) d.target = whole;
  if (d.target != std::numeric_limits<std::size_t>::max() && a.landed >= d.target) {
    d.loaded_chunks = d.target;
    d.sample = d.target > 0;
  }
  return d;
}

}  // namespace kvtier::detail
