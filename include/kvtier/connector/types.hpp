// kvtier/connector/types.hpp: the options, plans, outcomes, events and counters of
// kvtier::connector (kvtier/connector.hpp, which includes this header).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "kvtier/chunker.hpp"
#include "kvtier/cost_model.hpp"
#include "kvtier/deadline.hpp"
#include "kvtier/fetch_types.hpp"
#include "kvtier/metrics.hpp"
#include "kvtier/ownership.hpp"

namespace kvtier {

/// Whether a cached prefix is loaded: always, when the cost model says loading beats
/// recomputing (load_estimator::decide), or split (compute [0, k) while loading [k, hit)).
enum class load_policy : std::uint8_t { always, cost, split };

/// Which chunks save() writes: all of them, or only those looked up at least
/// connector_options::save_after_lookups times (SGLang HiCache's "selective").
enum class save_policy : std::uint8_t { write_through, selective };

/// A load's deadline: base + per_thousand_tokens x (tokens / 1000), at most cap.
/// Example: {200ms, 20ms, 5s}.after(16'384) is 527 ms.
struct load_timeout {
  std::chrono::milliseconds base{200};
  std::chrono::milliseconds per_thousand_tokens{20};
  std::chrono::milliseconds cap{5000};
  clock::duration after(std::uint64_t tokens) const noexcept {
    const auto d = base + std::chrono::duration_cast<clock::duration>(per_thousand_tokens) *
                              static_cast<std::int64_t>(tokens) / 1000;
    return std::min<clock::duration>(d, cap);
  }
};

struct connector_options {
  load_policy policy = load_policy::always;
  prefill_node node{};             ///< cost and split: KV bytes per token, prefill speed
  load_path prior{0.001, 1.0};     ///< the estimator's prior (T0 s, GB/s), e.g. from a probe
  bool wall_clock_samples = true;  ///< each load's agreed wall time feeds the estimator; off:
                                   ///< only connector::record_load_sample does (a modeled clock)
  load_timeout load_deadline{};    ///< per load, from load()
  /// cost and split, with wall_clock_samples: a load's deadline is at most the time recomputing
  /// its tokens takes (at least 5 ms), so a load slower than recomputing is cut there and its rest
  /// recomputed; the cut still feeds the estimator (connector/detail/slow_tier.hpp).
  bool race_recompute = true;
  /// cost and split: once 3 loads in a row took as long as recomputing their tokens (lost the
  /// race), or the estimate declines a hit right after a lost race, the tier is judged slow: lookups skip the
  /// store (counted in lookups_skipped) and nothing is loaded; every probe_every-th lookup asks the store and
  /// loads its hit, to measure the tier again. A probe faster than recomputing ends the judgement and
  /// restarts the estimator from `prior`. 0: no judgement, lookups always ask the store.
  std::uint32_t probe_every = 32;
  /// The estimator's memory: a sample's weight halves after this many newer ones (cost, split).
  double estimator_half_life_samples = 16;
  std::chrono::milliseconds lookup_timeout{50};
  std::chrono::milliseconds save_timeout{2000};
  /// The least time an agreed move gets, counted from when the mover starts it. Moves are
  /// agreed on every rank, so they must not fail for being late: a move that started after its
  /// load's deadline (the reach agreed as the deadline passed) would fail at once, and a failed
  /// call poisons an MPI or NCCL data communicator for every later load. A move's deadline is
  /// the later of its load's deadline and this. With one communicator the moves run inside
  /// step(), so a step can run this much past its own deadline.
  std::chrono::milliseconds move_timeout{1000};
  save_policy saves = save_policy::write_through;
  std::uint32_t save_after_lookups = 2;  ///< selective: lookups of a chunk before it is saved
  std::uint32_t layers_per_group = 0;    ///< layers moved and scattered together (0: all)
  std::size_t max_bytes_in_flight = std::size_t{1} << 30;  ///< staging of running loads
  std::size_t fetch_workers = 2;
  /// Keys per store call (progress granularity; 0: one call). Whole-chunk loads only: a
  /// streamed load (stream_groups) is always one group-major call for all of a rank's chunks,
  /// since its agreed units are group-major over the whole load (batches would land batch 1's
  /// group 1 only after group 0 of every later batch).
  std::size_t fetch_batch_chunks = 1;
  /// Loads stream by layer group: the owners read group-major (a group_streaming_store such as
  /// remote_store with value_format::v2 groups; ignored for other stores) and each step agrees,
  /// and the mover moves, the layer groups every owner has verified, before later groups are
  /// fetched. Every rank must set it alike (it is folded into the step's fingerprint). The
  /// fetch is one group-major call for all of a rank's chunks (fetch_batch_chunks is ignored):
  /// remote_store::get_by_group spreads each group's round over its connection pool.
  bool stream_groups = false;
  kvtier::metrics* metrics = nullptr;  ///< shared with the fetch queue (optional)
  /// The data communicator may still write a receive buffer after a call to it failed (MPI
  /// created with mpi_options::stage = false, which then skips its own two staging copies):
  /// the staging block of a failed move is never reused or freed (counted as quarantined).
  bool data_writes_after_failure = false;
};

/// What a request's agreed lookup says to do: load tokens [load_first_token, load_end_token);
/// tokens below load_first_token are computed (split mode), and so is everything past the end.
struct load_plan {
  std::uint64_t cached_tokens = 0;  ///< the agreed cached prefix, before the policy
  std::uint64_t load_first_token = 0;
  std::uint64_t load_end_token = 0;
  std::uint64_t prompt_tokens = 0;  ///< the whole prompt (keyed or not); past the load, computed
  std::uint64_t tokens_to_load() const noexcept { return load_end_token - load_first_token; }
};

/// A load's agreed outcome: pages hold tokens [load_first_token, loaded_end_token) on every
/// rank; tokens [loaded_end_token, requested_end_token) failed and must be recomputed.
struct load_outcome {
  std::uint64_t load_first_token = 0;
  std::uint64_t loaded_end_token = 0;
  std::uint64_t requested_end_token = 0;
  bool complete() const noexcept { return loaded_end_token == requested_end_token; }
};

/// What wait_for_layer(l) found for one load: layer l of tokens [first_token, ready_end_token)
/// is in this rank's pages, verified. The engine computes layer l of the rest of the load's
/// range itself (or recomputes those tokens later, from the outcome's end).
struct layer_ready {
  request_id id = 0;
  std::uint64_t first_token = 0;          ///< the load's first token
  std::uint64_t ready_end_token = 0;      ///< layer l holds [first_token, this) in the pages
  std::uint64_t requested_end_token = 0;  ///< the load's end
  bool complete() const noexcept { return ready_end_token == requested_end_token; }
};

/// connector::wait_for_layer's answer. With `ec` empty, every rank got the same answer (the
/// ready ends are agreed) and each listed load's pages hold what its entry says. With an error
/// (a deadline, a failed agreement, a failed move) the entries still say only what is in this
/// rank's pages, but they are this rank's own: a peer may have more; the loads' agreed
/// outcomes (load_result) account for the failure on every rank.
///
///   auto w = conn.wait_for_layer(l, dl);
///   for (const kvtier::layer_ready& x : w.loads)
///     if (!x.complete()) compute_layer_tokens(l, x.id, x.ready_end_token, x.requested_end_token);
struct layer_wait {
  std::error_code ec;
  std::vector<layer_ready> loads;  ///< every load started and not yet finished, in begin_lookup order
  /// The entry of request `id`, or nullptr when it has no load listed.
  const layer_ready* find(request_id id) const noexcept {
    for (const layer_ready& x : loads)
      if (x.id == id) return &x;
    return nullptr;
  }
  /// ec is empty and every listed load holds layer l of its whole range.
  bool complete() const noexcept {
    return !ec && std::all_of(loads.begin(), loads.end(), [](const layer_ready& x) { return x.complete(); });
  }
};

struct finish_result {
  bool free_pages_now = true;  ///< false: saves still read the pages; wait for finished()
};

/// Why one part of a request ended short or failed on this rank: this rank's own reason, never
/// agreed (what every rank agreed is connector::load_result / load_errors; only the rank that
/// failed has a reason). The message names the rank, the part and the chunk, with the store's
/// own words when it keeps them (a store with last_error(), e.g. remote_store):
///
///   "rank 1: save of chunk 3: authentication failed (store: WRONGPASS invalid username-password pair)"
///   "rank 0: load of chunk 2: corrupt value (header or checksum mismatch)"
struct request_error {
  enum class stage : std::uint8_t { lookup, load, save };
  request_id id = 0;
  stage what = stage::lookup;
  std::size_t chunk = 0;  ///< the prompt chunk it names: the first one that failed
  std::error_code ec;     ///< the store's or the communicator's error, errc::corrupt_value,
                          ///< errc::timeout...; empty for a key the store did not have (a load of
                          ///< a chunk gone since its lookup) or did not keep (a put it refused
                          ///< without an error, e.g. a tier that stores nothing)
  std::string message;
};

constexpr std::string_view to_string(request_error::stage s) noexcept {
  switch (s) {
    case request_error::stage::lookup:
      return "lookup";
    case request_error::stage::load:
      return "load";
    case request_error::stage::save:
      return "save";
  }
  return "?";
}

/// Requests whose work ended since the previous finished() call.
struct finished_requests {
  std::vector<request_id> loads;  ///< load outcome agreed (load_result has a value)
  std::vector<request_id> saves;  ///< finished, and every save ended: free the pages
  /// This rank's first save failure of each request finished since the last call (those in
  /// `saves`, and those whose saves had all ended when finish() was called).
  std::vector<request_error> save_errors;
};

/// For a KV-aware router: chunks this rank wrote, or found gone that it had written.
struct kv_event {
  enum class kind : std::uint8_t { stored, evicted } what = kind::stored;
  rank_t rank = 0;
  std::vector<chunk_key> keys;
};

/// Counts of the lifecycle (the fetch queue's figures go to connector_options::metrics).
struct connector_counters {
  counter lookups, loads, loads_cut_short, tokens_loaded, tokens_to_recompute, agreement_failures,
      local_load_failures, chunks_saved, save_failures, quarantined_blocks;
  counter lookups_skipped;  ///< cost, split: lookups that skipped a tier judged slower than recomputing
  counter
      saves_skipped;  ///< saves dropped after waiting save_timeout behind other saves (also in save_failures)
  histogram lookup_latency;  ///< begin_lookup to the agreed plan
  histogram load_latency;    ///< load() to the agreed outcome
  histogram layer_wait;      ///< each wait_for_layer call
  histogram step_latency;    ///< each step's agreement (its one all-reduce)
  histogram save_latency;    ///< save() or begin_save() to the put's end (stored or failed)
};

/// Appends the connector's counters and latency histograms in the Prometheus text format, as
/// write_prometheus does.
inline void write_prometheus(std::string& out, const connector_counters& c,
                             std::string_view prefix = "kvtier_connector", std::string_view labels = {}) {
  const std::pair<const char*, const counter*> all[] = {{"lookups_total", &c.lookups},
                                                        {"loads_total", &c.loads},
                                                        {"loads_cut_short_total", &c.loads_cut_short},
                                                        {"tokens_loaded_total", &c.tokens_loaded},
                                                        {"tokens_to_recompute_total", &c.tokens_to_recompute},
                                                        {"agreement_failures_total", &c.agreement_failures},
                                                        {"local_load_failures_total", &c.local_load_failures},
                                                        {"chunks_saved_total", &c.chunks_saved},
                                                        {"save_failures_total", &c.save_failures},
                                                        {"quarantined_blocks_total", &c.quarantined_blocks},
                                                        {"lookups_skipped_total", &c.lookups_skipped},
                                                        {"saves_skipped_total", &c.saves_skipped}};
  for (const auto& [name, ctr] : all) {
    detail::store_prom_header(out, prefix, name, "counter", "kvtier connector lifecycle count.");
    detail::store_prom_line(out, prefix, name, labels, {}, static_cast<double>(ctr->value()));
  }
  const std::pair<const char*, const histogram*> hists[] = {{"lookup_seconds", &c.lookup_latency},
                                                            {"load_seconds", &c.load_latency},
                                                            {"layer_wait_seconds", &c.layer_wait},
                                                            {"step_seconds", &c.step_latency},
                                                            {"save_seconds", &c.save_latency}};
  for (const auto& [name, h] : hists)
    detail::store_prom_histogram(out, prefix, name, "kvtier connector lifecycle latency.", labels, *h);
}

}  // namespace kvtier
