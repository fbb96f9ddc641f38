// examples/pcp_prefill/rank_state.hpp: what each rank of the engine keeps while it
// replays (its stores, queues, paged KV cache, modeled clock, and every request's
// state), and what the rank threads of one run write their results into.
//
// Per request there are two records: `ctl_state`, replicated (every rank holds the same
// values, derived only from agreed ones, so the ranks' schedules and collectives stay
// identical), and `local_request`, this rank's own (its pages, its
// store answers before they are agreed).
//
//   pcp::rank_env<pcp::modeled_l2> env;   // filled in by engine::rank_main
//   env.ctl[i].remaining -= take;          // replicated: every rank does the same
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <vector>

#include "engine_types.hpp"
#include "kvtier/comm/inproc.hpp"
#include "kvtier/comm/recording.hpp"
#include "kvtier/connector.hpp"
#include "kvtier/cost_model.hpp"
#include "kvtier/fetch_queue.hpp"
#include "kvtier/host_kv_cache.hpp"
#include "kvtier/store/tiered_store.hpp"
#include "model_stores.hpp"
#include "modeled_clock.hpp"

namespace pcp {

/// Replicated per-request control state: every rank holds the same values.
struct ctl_state {
  std::uint64_t hit = 0, l1_hit = 0, cached = 0, remaining = 0, split = 0;
  double arrival = 0, io_start = 0, deadline = 0;
  double lookup_end = never, load_start = 0, load_end = never;
  bool loading = false, started = false, front = false, front_done = false, loaded = false;
  std::string status;
  // Layer by layer: when each layer group is in the pages (modeled), when the request joins
  // the ready queue (its first layer's compute never waits), and whether its load's outcome
  // is still to be agreed in the step that computes it.
  std::vector<double> layer_ready;
  double ready_at = never;
  bool layer_pending = false;
};

/// One rank's own per-request data.
struct local_request {
  kvtier::host_kv_cache::sequence seq;  // the request's blocks in the paged cache (its KV's home)
  std::uint64_t lookup_answer = 0;      // the agreed one (before the modeled deadline)
  kvtier::deadline real_dl{};
  kvtier::clock::time_point
      load_began{};  // when this rank called its load (layer-streamed: each group's time)
};

/// One rank's world: its stores and queues (owned by engine::rank_main, which points
/// these at them), its scratch buffers, and the replicated schedule and clock.
template <class L2, kvtier::comm::communicator Comm = kvtier::comm::inproc_communicator>
struct rank_env {
  using tiers_t = kvtier::tiered_store<modeled_l1, L2>;
  using rec_t = kvtier::comm::recording<Comm&>;      // every rank's collectives, compared after the run
  using conn_t = kvtier::connector<tiers_t, rec_t>;  // lookups and their agreement (one per step)

  rec_t* comm = nullptr;
  tiers_t* tiers = nullptr;
  modeled_l1* l1 = nullptr;
  conn_t* conn = nullptr;
  kvtier::load_estimator* estimator = nullptr;
  modeled_io* io = nullptr;  // the modeled I/O times (every rank's, on this rank's timeline)
  kvtier::host_kv_cache* cache = nullptr;
  std::vector<std::byte> paged_scratch;  // a chunk gathered back from the pages for checking
  std::vector<local_request> loc;
  std::vector<std::byte> scratch;
  bool lead = false;
  // Replicated state: every rank holds the same values, derived from agreed ones.
  modeled_clock clock;
  std::int64_t step_wall_ns = 0;  // real time this step spent in store calls (not replicated)
  std::vector<ctl_state> ctl;
  std::deque<std::size_t> waiting, ready;
  std::vector<std::size_t> lookups, loads;
  std::vector<double> completions;  // completion times in order (closed loop arrivals)
  std::uint64_t collectives = 0;
  modeled_costs costs;
  // Offered load so far, from agreed arrivals and trace data only: compute
  // seconds of every arrived prompt over the arrival span.
  double offered_work_s = 0, first_arrival_s = 0, last_arrival_s = 0;
  std::size_t arrivals = 0;
  double offered_utilisation() const {
    const double span = last_arrival_s - first_arrival_s;
    return arrivals >= 2 && span > 0 ? offered_work_s / span : 0.0;
  }
};

/// What the rank threads of one run write into: the result (rank 0 fills the per-request
/// part; every rank its own first store error), and the counters every rank adds to.
struct run_tally {
  run_result result;
  std::atomic<std::int64_t> max_wall_ns{0};
  std::atomic<std::uint64_t> mismatches{0};
  std::atomic<std::uint64_t> failed_calls{0};
  std::vector<std::vector<kvtier::comm::collective_call>> calls;  // per rank, compared after the run
  std::mutex mu;  // guards result.fatal, result.l2_errors and calls
};

}  // namespace pcp
