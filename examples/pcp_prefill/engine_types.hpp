// examples/pcp_prefill/engine_types.hpp: what the engine is given and what it reports:
// its options (mode, policy, batch limits, the deadline), a trace
// request with its chunk keys, and the results of a run (per request, modeled costs,
// counters over every rank).
//
//   pcp::engine_options opt{.world = 4, .mode = pcp::load_mode::split};
//   auto prepared = pcp::prepare(requests, chunker);   // keys of each prompt's full chunks
//   pcp::run_result r = pcp::engine<pcp::modeled_l2>(prepared, tm, opt, l1s, l2s).run();
//   for (const pcp::request_result& q : r.requests) std::cout << q.id << " " << q.ttft_s << "\n";
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "kvtier/chunker.hpp"
#include "kvtier/cost_model.hpp"
#include "kvtier/ownership.hpp"
#include "timing_model.hpp"
#include "trace.hpp"

namespace pcp {

enum class load_mode { recompute, sync, async, split };
enum class load_policy { always, cost };

inline const char* to_string(load_mode m) {
  switch (m) {
    case load_mode::recompute:
      return "recompute";
    case load_mode::sync:
      return "sync";
    case load_mode::async:
      return "async";
    case load_mode::split:
      return "split";
  }
  return "?";
}
inline const char* to_string(load_policy p) { return p == load_policy::cost ? "cost" : "always"; }

struct engine_options {
  std::uint32_t world = 8;
  load_mode mode = load_mode::async;
  load_policy policy = load_policy::always;
  /// When a loaded request's compute may start: after its whole load (chunk), or layer by layer
  /// (layer, layer_streamed: async mode only; see load_granularity in timing_model.hpp).
  load_granularity granularity = load_granularity::chunk;
  bool use_cache = true;                 ///< false: neither reads nor writes (prime passes keep it on)
  std::size_t max_batch_tokens = 32768;  ///< tokens computed per step
  std::size_t max_batch_requests = 256;  ///< requests per step (vLLM's default max_num_seqs)
  double load_timeout_s =
      10;                   ///< one deadline per request (modeled s), from its lookup, over every rank's I/O
  double cost_slack_s = 0;  ///< --policy cost: also load when predicted at most this much slower
  std::size_t fetch_workers = 8;  ///< fetch_queue threads per rank
  /// The load estimator's starting (T0, B), refined by every measured load. The default is
  /// optimistic (the first hits load and teach it); a probe of the tier gives a better one.
  kvtier::load_path estimator_prior{.fixed_cost_s = 0, .bandwidth_gb_per_s = 1000};
  std::size_t closed_loop_clients = 0;  ///< > 0: that many clients, each sending its next request when
                                        ///< its last completes (trace arrival times ignored)
  bool progress = false;                ///< progress line on stderr
  bool timed = true;                    ///< false: the priming replay (every arrival at 0)
  /// Tokens each rank's paged KV cache holds: the KV of every request between its load and
  /// its completion lives there. 0: the trace's cacheable tokens, which no run can exceed (a
  /// request holds blocks only while in flight); a smaller cap aborts the run with a clear
  /// error when an overloaded replay queues more loaded requests than fit (--kv-cache-tokens).
  std::uint64_t kv_cache_tokens = 0;
  /// Test hook: after request `corrupt_paged_request` is scattered into rank
  /// `corrupt_paged_rank`'s pages, one byte of its first loaded chunk is flipped there (the
  /// paged check must catch it).
  std::size_t corrupt_paged_request = static_cast<std::size_t>(-1);
  kvtier::rank_t corrupt_paged_rank = 0;
};

/// A trace request with its chunk keys (full chunks before the last token: the
/// engine always computes at least one token).
struct prepared_request {
  const request* src = nullptr;
  std::vector<kvtier::chunk_key> keys;
  const kvtier::chunker<>* chunk = nullptr;  ///< what made the keys (the connector keys them alike)
  std::size_t n_chunks() const { return keys.size(); }
};

inline std::vector<prepared_request> prepare(const std::vector<request>& reqs,
                                             const kvtier::chunker<>& chunk) {
  std::vector<prepared_request> out(reqs.size());
  const std::size_t c = chunk.chunk_tokens();
  for (std::size_t i = 0; i < reqs.size(); ++i) {
    out[i].src = &reqs[i];
    out[i].chunk = &chunk;
    const std::size_t cacheable = (reqs[i].tokens.size() - 1) / c * c;
    out[i].keys = chunk.keys(std::span<const std::uint32_t>(reqs[i].tokens).first(cacheable));
  }
  return out;
}

struct request_result {
  std::string id;
  double arrival_s = 0;
  std::uint64_t prompt_tokens = 0, cached_tokens = 0, l1_tokens = 0, l2_tokens = 0;
  std::uint64_t lookup_tokens = 0;  ///< the agreed lookup answer (before the policy and the load)
  std::uint64_t split_tokens = 0;   ///< split mode: k, the front computed while the back loaded
  double queue_s = 0, load_s = 0, ttft_s = 0;
  double predicted_s = 0;  ///< the cost model's time for what was done, at the configured (T0, B); 0 if none
  std::string status;      ///< miss | hit | split | partial | policy_recompute | recompute | mismatch
};

/// Modeled seconds spent on each cost, summed over requests (a cost paid by
/// several ranks at once counts once, for its longest rank).
struct modeled_costs {
  double compute_s = 0, lookup_s = 0, load_s = 0, broadcast_s = 0, writeback_s = 0;
  std::uint64_t lookups = 0, loads = 0, broadcasts = 0, writebacks = 0;
};

struct run_result {
  std::vector<request_result> requests;
  double makespan_s = 0;          ///< first arrival to last completion, modeled
  double busy_s = 0;              ///< modeled compute time
  double max_io_stall_s = 0;      ///< longest modeled time one step waited on store I/O
  double max_step_io_wall_s = 0;  ///< longest real time one step spent inside store calls (CPU side)
  modeled_costs costs;
  std::uint64_t mismatched_chunks = 0;
  std::uint64_t failed_loads = 0;      ///< loads that came back shorter than looked up
  std::uint64_t failed_l2_calls = 0;   ///< store calls that returned an error, all ranks
  std::vector<std::string> l2_errors;  ///< per rank: its first store error ("" if none)
  std::uint64_t steps = 0;
  std::uint64_t collectives = 0;
  std::uint64_t layer_waits = 0;       ///< rank 0's connector::wait_for_layer calls (layer modes)
  bool symmetric_collectives = false;  ///< every rank issued the same collectives in the same order
  std::string fatal;                   ///< non-empty when the run aborted (a collective failed)
};

}  // namespace pcp
