// examples/pcp_prefill/engine.hpp: a context-parallel prefill engine made of
// kvtier components, replaying a trace on a modeled clock. This file is the
// engine's scheduling: arrivals, batches, the step loop, completions, and the
// run's results; the rest lives beside it:
//   engine_types.hpp       options, modes, prepared requests, results
//   request_lifecycle.hpp  a request's KV on every rank through one kvtier::connector per rank:
//                          lookup, agreement, decision, load into the pages, the paged check,
//                          write-back (deadlines, error paths)
//   modeled_clock.hpp      the modeled clock and the booking of modeled I/O times
//   rank_state.hpp         what each rank keeps (replicated and own per-request state)
//
// W ranks advance in lockstep: as threads of one process over kvtier::comm::inproc
// (`run()`), or one rank per process over any other communicator, e.g. MPI
// (`run(comm)`: the same rank loop, this process's rank only). Every scheduling
// decision derives from values all ranks agreed on through a collective or from
// replicated modeled times, so every rank issues the same collectives in the same
// order. Nothing in the rank loop is shared between ranks: the modeled clock is
// replicated (each rank books every rank's modeled I/O), so it runs alike in both
// forms; the process form combines its counters over the communicator after the loop.
//
// Time: each rank keeps the same modeled clock (`now`), which advances by
// events: a compute step (n/R), the modeled end of a lookup, load, broadcast or
// write-back, the next arrival. The data path runs for real between events
// (the connector, tiered_store, byte checks); the engine waits
// for its real completion, but that real time never enters modeled time. Real
// servers (a store without `modeled_timing`) are timed by the wall clock
// instead: each rank measures its calls and the ranks agree on the maximum.
//
// KV: each rank keeps its KV in a paged host cache (kvtier::host_kv_cache, the
// layout from the timing model: vLLM MLA or FlashAttention NHD). A computed chunk
// is written into the pages, and the connector gathers it from them to save it; a loaded chunk
// is scattered into them after the broadcast and checked there, gathered back and
// compared with what recompute would produce. Gather/scatter are real CPU work,
// not modeled time.
//
// Modes: recompute; sync (lookup and load inside the step, one request at a
// time, each paying T0: a naive tier); async (loads outside the step); split
// (compute tokens [0, k) on the step while the owners load [k, hit), k from
// kvtier::split_point on the estimator's (T0, B); then compute [hit, n)).
//
//   pcp::engine<pcp::modeled_l2> e(reqs, tm, opt, l1s, l2s);
//   pcp::run_result r = e.run();                       // W rank threads
//   pcp::engine<pcp::modeled_l2, kvtier::comm::mpi_communicator> p(reqs, tm, opt, l1s, l2s);
//   pcp::run_result q = p.run(mpi_comm);               // this process's rank (l1s/l2s[rank] set)
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <limits>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "engine_types.hpp"
#include "kvtier/comm/inproc.hpp"
#include "kvtier/comm/recording.hpp"
#include "kvtier/cost_model.hpp"
#include "kvtier/detail/xxhash.hpp"
#include "kvtier/fetch_queue.hpp"
#include "kvtier/host_kv_cache.hpp"
#include "kvtier/ownership.hpp"
#include "kvtier/store/tiered_store.hpp"
#include "model_stores.hpp"
#include "modeled_clock.hpp"
#include "rank_state.hpp"
#include "request_lifecycle.hpp"
#include "timing_model.hpp"
#include "trace.hpp"

namespace pcp {

/// `Comm`: the ranks' communicator. The in-process one runs W rank threads (`run()`);
/// any other runs this process's rank of W processes (`run(comm)`).
template <class L2, kvtier::comm::communicator Comm = kvtier::comm::inproc_communicator>
class engine {
  using comm_t = Comm;
  using env_t = rank_env<L2, Comm>;
  using tiers_t = typename env_t::tiers_t;
  using rec_t = typename env_t::rec_t;
  using lifecycle_t = request_lifecycle<L2, Comm>;
  static constexpr std::uint64_t none = std::numeric_limits<std::uint64_t>::max();

 public:
  engine(const std::vector<prepared_request>& reqs, const timing_model& tm, engine_options opt,
         std::vector<modeled_l1*> l1s, std::vector<L2*> l2s)
      : reqs_(reqs),
        tm_(tm),
        opt_(opt),
        l1s_(std::move(l1s)),
        l2s_(std::move(l2s)),
        own_(opt.world),
        life_(reqs_, tm_, opt_, own_, l2s_, tally_) {}
  engine(const engine&) = delete;  // life_ refers to the members
  engine& operator=(const engine&) = delete;

  /// Thread form: W rank threads over an in-process world.
  run_result run() requires std::is_same_v<Comm, kvtier::comm::inproc_communicator> {
    begin();
    kvtier::comm::inproc_world world(opt_.world);
    // Layer by layer, the connector moves on a data communicator of its own: its mover's threads
    // broadcast and scatter each layer group while the engine goes on, and wait_for_layer waits
    // for them. (The process form keeps one communicator: the moves run inside step().)
    std::optional<kvtier::comm::inproc_world> data_world;
    if (layered()) data_world.emplace(opt_.world);
    kvtier::comm::run_ranks(world, [&](comm_t& c) {
      if (!data_world) return rank_main(c, nullptr);
      comm_t d = data_world->communicator_for(c.rank());
      rank_main(c, &d);
    });
    tally_.result.symmetric_collectives = std::all_of(tally_.calls.begin(), tally_.calls.end(),
                                                      [&](const auto& c) { return c == tally_.calls[0]; });
    return finish();
  }

  /// Process form: this process's rank (comm.rank(); its l1s/l2s entries must be set) of
  /// comm.size() == world processes. Every rank returns the counters summed (mismatches,
  /// failed calls) or maxed over the ranks, every rank's first store error, and whether the
  /// ranks' collective sequences matched (their digests compared); the per-request results
  /// and modeled costs are rank 0's, as in the thread form. A rank whose loop failed
  /// (`fatal`) returns at once without the closing collectives: its peers would wait on it,
  /// so the caller ends the job (MPI_Abort).
  run_result run(comm_t& comm) {
    if (comm.size() != opt_.world)
      throw std::invalid_argument("engine: the communicator has " + std::to_string(comm.size()) +
                                  " ranks, the options say world = " + std::to_string(opt_.world));
    if (!l1s_.at(comm.rank()) || !l2s_.at(comm.rank()))
      throw std::invalid_argument("engine: no L1/L2 store for rank " + std::to_string(comm.rank()));
    begin();
    rank_main(comm, nullptr);
    if (tally_.result.fatal.empty()) combine_over_ranks(comm);
    return finish();
  }

 private:
  // ---- run set-up and results ----------------------------------------------------------

  void begin() {
    tally_.result = run_result{};
    tally_.result.requests.resize(reqs_.size());
    tally_.result.l2_errors.resize(opt_.world);
    tally_.calls.assign(opt_.world, {});
    tally_.max_wall_ns = 0, tally_.mismatches = 0, tally_.failed_calls = 0;
    for (std::size_t i = 0; i < reqs_.size(); ++i) {
      auto& r = tally_.result.requests[i];
      r.id = reqs_[i].src->id;
      r.prompt_tokens = reqs_[i].src->tokens.size();
    }
  }
  run_result finish() {
    double first = never, last = 0;
    for (const auto& r : tally_.result.requests) {
      first = std::min(first, r.arrival_s);
      last = std::max(last, r.arrival_s + r.ttft_s);
    }
    tally_.result.makespan_s = reqs_.empty() ? 0 : last - first;
    tally_.result.max_step_io_wall_s = static_cast<double>(tally_.max_wall_ns.load()) * 1e-9;
    tally_.result.mismatched_chunks = tally_.mismatches.load();
    tally_.result.failed_l2_calls = tally_.failed_calls.load();
    return std::move(tally_.result);
  }

  /// Process form, after the loop: this rank's counters and first store error combined with
  /// every peer's, and the collective sequences compared by digest. The same collectives on
  /// every rank, unconditionally, on the unrecorded communicator.
  void combine_over_ranks(comm_t& comm) {
    namespace kc = kvtier::comm;
    const kvtier::rank_t me = comm.rank();
    const auto& calls = tally_.calls[me];
    std::vector<std::uint64_t> seq;
    for (const auto& c : calls)
      seq.insert(seq.end(),
                 {static_cast<std::uint64_t>(c.op), c.root, c.bytes, static_cast<std::uint64_t>(c.type),
                  static_cast<std::uint64_t>(c.reduce), c.group_depth});
    const std::uint64_t digest = XXH3_64bits(seq.data(), seq.size() * sizeof(std::uint64_t));
    // min of x and of ~x gives min and max: equal on every rank iff the digests are.
    std::uint64_t mins[5] = {digest, ~digest, calls.size(), ~static_cast<std::uint64_t>(calls.size()),
                             none - static_cast<std::uint64_t>(tally_.max_wall_ns.load())};
    std::uint64_t sums[2] = {tally_.mismatches.load(), tally_.failed_calls.load()};
    constexpr std::size_t err_bytes = 240;  // a rank's first store error, cut to this length
    std::vector<char> mine(err_bytes, '\0'), all(err_bytes * opt_.world);
    const std::string& e = tally_.result.l2_errors[me];
    std::copy_n(e.begin(), std::min(e.size(), err_bytes - 1), mine.begin());
    auto check = [&](std::error_code ec, const char* what) {
      if (ec) throw std::runtime_error(std::string("engine: ") + what + " over ranks: " + comm.last_error());
    };
    const auto dl = lifecycle_t::coll_dl();
    check(kc::all_reduce(comm, std::span<const std::uint64_t>(mins), std::span<std::uint64_t>(mins),
                         kc::reduce_op::min, dl),
          "min");
    check(kc::all_reduce(comm, std::span<const std::uint64_t>(sums), std::span<std::uint64_t>(sums),
                         kc::reduce_op::sum, dl),
          "sum");
    check(comm.all_gather(std::as_bytes(std::span(mine)), std::as_writable_bytes(std::span(all)), dl),
          "all-gather of store errors");
    tally_.result.symmetric_collectives = mins[0] == ~mins[1] && mins[2] == ~mins[3];
    tally_.max_wall_ns = static_cast<std::int64_t>(none - mins[4]);
    tally_.mismatches = sums[0];
    tally_.failed_calls = sums[1];
    for (kvtier::rank_t r = 0; r < opt_.world; ++r)
      tally_.result.l2_errors[r] = std::string(all.data() + r * err_bytes);
  }

  // ---- the rank's loop ----------------------------------------------------------------

  bool layered() const { return opt_.granularity != load_granularity::chunk; }

  /// `data_inner`: the connector's data communicator (layer modes, thread form), else null.
  void rank_main(comm_t& inner, comm_t* data_inner) {
    const kvtier::rank_t r = inner.rank();
    rec_t comm(inner);
    std::optional<rec_t> data;  // its calls are recorded too, and compared like the control's
    if (data_inner) data.emplace(*data_inner);
    env_t env;
    env.comm = &comm;
    env.lead = r == 0;
    env.l1 = l1s_[r];
    tiers_t tiers(*env.l1, *l2s_[r],
                  kvtier::tiered_options{.writes = kvtier::write_policy::write_through, .promote = false});
    env.tiers = &tiers;
    modeled_io io(tm_, opt_.world, own_, lifecycle_t::has_l2());
    env.io = &io;
    kvtier::load_estimator est(opt_.estimator_prior);
    env.estimator = &est;
    env.loc.resize(reqs_.size());
    env.ctl.resize(reqs_.size());
    env.scratch.resize(tm_.chunk_bytes());
    env.paged_scratch.resize(tm_.chunk_bytes());
    std::uint64_t trace_tokens = 0;
    // Without loads a request holds blocks only inside store_computed (one at a time): the
    // largest request is enough. With loads, every loaded request waiting for compute holds some.
    const bool loads = opt_.use_cache && opt_.mode != load_mode::recompute;
    for (const auto& q : reqs_)
      trace_tokens = loads ? trace_tokens + q.n_chunks() * tm_.chunk_tokens
                           : std::max<std::uint64_t>(trace_tokens, q.n_chunks() * tm_.chunk_tokens);
    const std::uint64_t bt = tm_.kv_block_tokens;
    kvtier::host_kv_cache cache(tm_.kv_layout_for(std::max<std::uint64_t>(
        1, ((opt_.kv_cache_tokens ? std::min(trace_tokens, opt_.kv_cache_tokens) : trace_tokens) + bt - 1) /
               bt)));
    env.cache = &cache;
    // The connector runs each request's lookup, load and their agreement (one all-reduce per
    // step for everything that became ready) and scatters loaded chunks into the pages. Modeled
    // stores take no real time, so their I/O gets a generous real deadline (the modeled one is
    // applied to the agreed answers); real servers get the request's own.
    if (!reqs_.empty() && !reqs_.front().chunk)
      throw std::invalid_argument("engine: prepared requests without their chunker (use pcp::prepare)");
    const std::chrono::milliseconds io_budget = life_.io_budget();
    std::optional<typename env_t::conn_t> conn;
    if (!reqs_.empty())
      conn.emplace(*reqs_.front().chunk, own_, tiers, comm, data ? *data : comm, cache.view(),
                   kvtier::connector_options{
                       .load_deadline = {.base = io_budget, .per_thousand_tokens = {}, .cap = io_budget},
                       .lookup_timeout = io_budget,
                       .save_timeout = io_budget,                // the write-back's deadline (store_computed)
                       .layers_per_group = layered() ? 1u : 0u,  // layer by layer: one group per layer
                       .fetch_workers = opt_.fetch_workers,
                       .fetch_batch_chunks = 0,
                       // layer-streamed on a group-streaming store (remote_store): group-major
                       // ranged reads, each layer group agreed as it lands (wait_for_layer)
                       .stream_groups = opt_.granularity == load_granularity::layer_streamed});
    env.conn = conn ? &*conn : nullptr;
    try {
      loop(env);
    } catch (const std::exception& e) {
      std::lock_guard lock(tally_.mu);
      if (tally_.result.fatal.empty()) tally_.result.fatal = "rank " + std::to_string(r) + ": " + e.what();
    }
    conn.reset();  // its mover's threads stop: no data call runs after this
    {
      std::lock_guard lock(tally_.mu);
      tally_.calls[r] = comm.calls();
      if (data) tally_.calls[r].insert(tally_.calls[r].end(), data->calls().begin(), data->calls().end());
    }
    if (env.lead) {
      tally_.result.collectives = env.collectives;
      tally_.result.costs = env.costs;
    }
  }

  void admit(env_t& env, std::size_t i, bool cache, std::vector<std::size_t>& lookups) {
    ctl_state& c = env.ctl[i];
    c.arrival = arrival_at(env, i);
    if (env.lead) tally_.result.requests[i].arrival_s = c.arrival;
    if (env.arrivals++ == 0) env.first_arrival_s = c.arrival;
    env.last_arrival_s = c.arrival;
    env.offered_work_s += tm_.compute_s(static_cast<double>(reqs_[i].src->tokens.size()));
    if (!cache || reqs_[i].n_chunks() == 0) {
      c.remaining = reqs_[i].src->tokens.size();
      c.status = cache ? "miss" : "recompute";
      env.ready.push_back(i);
    } else if (opt_.mode == load_mode::sync) {
      env.waiting.push_back(i);
    } else {
      lookups.push_back(i);
    }
  }

  /// Finished lookups and loads (modeled end <= now), in order of their end.
  void process_io(env_t& env) {
    auto take_done = [&](std::vector<std::size_t>& pending, double ctl_state::*end) {
      std::vector<std::size_t> done, still;
      for (std::size_t i : pending) (env.ctl[i].*end <= env.clock.now ? done : still).push_back(i);
      pending.swap(still);
      std::stable_sort(done.begin(), done.end(),
                       [&](std::size_t a, std::size_t b) { return env.ctl[a].*end < env.ctl[b].*end; });
      return done;
    };
    const auto lookups_done = take_done(env.lookups, &ctl_state::lookup_end);
    if (!lookups_done.empty()) life_.decide(env, lookups_done);
    for (std::size_t i : take_done(env.loads, load_event())) {
      if (layered()) {  // its layers land in time for a step from now: it joins the queue
        life_.layer_ready(env, i);
        continue;
      }
      env.clock.wait_until(env.ctl[i].load_end);  // already ended: an async step never waits here
      life_.finish_load(env, i);
    }
  }

  /// The event that ends a running load's wait: its load's end, or (layer by layer) the time
  /// it may join the ready queue.
  using time_member = double ctl_state::*;
  time_member load_event() const { return layered() ? &ctl_state::ready_at : &ctl_state::load_end; }

  double next_event(const env_t& env, std::size_t admitted) const {
    double t = admitted < reqs_.size() ? arrival_at(env, admitted) : never;
    for (std::size_t i : env.lookups) t = std::min(t, env.ctl[i].lookup_end);
    for (std::size_t i : env.loads) t = std::min(t, env.ctl[i].*load_event());
    return t;
  }

  void loop(env_t& env) {
    const std::size_t n = reqs_.size();
    const bool cache = opt_.use_cache && opt_.mode != load_mode::recompute;
    std::size_t admitted = 0, completed = 0;
    auto last_progress = kvtier::clock::now();
    while (completed < n) {
      env.clock.step_stall = 0;
      env.step_wall_ns = 0;
      env.io->prune(env.clock.now);
      // 1. Arrivals up to now (their lookups are issued at once), then finished I/O.
      std::vector<std::size_t> new_lookups;
      while (admitted < n && arrival_at(env, admitted) <= env.clock.now)
        admit(env, admitted++, cache, new_lookups);
      life_.issue_lookups(env, new_lookups);
      for (std::size_t i : new_lookups) env.lookups.push_back(i);
      process_io(env);

      // 2. Schedule a batch, FCFS. Sync mode looks up and loads inside the step.
      std::vector<std::pair<std::size_t, std::uint64_t>> batch;
      std::size_t tokens = 0;
      std::deque<std::size_t> keep;
      while (tokens < opt_.max_batch_tokens && batch.size() < opt_.max_batch_requests) {
        if (env.ready.empty() && opt_.mode == load_mode::sync && !env.waiting.empty()) {
          const std::size_t i = env.waiting.front();
          env.waiting.pop_front();
          life_.sync_lookup_and_load(env, i);
          continue;
        }
        if (env.ready.empty()) break;
        const std::size_t i = env.ready.front();
        env.ready.pop_front();
        const std::uint64_t take =
            std::min<std::uint64_t>(env.ctl[i].remaining, opt_.max_batch_tokens - tokens);
        batch.emplace_back(i, take);
        tokens += take;
        if (take < env.ctl[i].remaining) keep.push_back(i);
      }
      for (auto it = keep.rbegin(); it != keep.rend(); ++it)
        env.ready.push_front(*it);  // continues next step

      if (batch.empty()) {
        note_step(env);
        const double t = next_event(env, admitted);
        if (t == never) throw std::runtime_error("engine: nothing to compute and no event pending");
        env.clock.now = std::max(env.clock.now, t);
        continue;
      }
      // 3. Compute (modeled), all ranks together.
      const double compute_start = env.clock.now;
      const double dur = tm_.compute_s(static_cast<double>(tokens));
      // Layer by layer, a layer waits for its groups of the batch's loads (none when each
      // joined at its ready time; the wait counts as stall).
      const double end =
          layered() ? life_.compute_layers(env, batch, compute_start, dur) : compute_start + dur;
      env.clock.step_stall += end - (compute_start + dur);
      env.clock.now = end;
      env.costs.compute_s += dur;
      if (env.lead) {
        tally_.result.busy_s += dur;
        ++tally_.result.steps;
      }
      // 4. Completions: store owned chunks, record.
      for (auto [i, take] : batch) {
        ctl_state& c = env.ctl[i];
        if (env.lead && !c.started) {
          auto& rr = tally_.result.requests[i];
          rr.queue_s = std::max(0.0, compute_start - rr.arrival_s - (c.front ? 0.0 : rr.load_s));
        }
        c.started = true;
        c.remaining -= take;
        if (c.remaining > 0) continue;
        if (c.front) {  // split: the front is computed; the rest follows once the back has loaded
          c.front_done = true;
          if (c.loaded) {
            c.front = false;
            c.remaining = reqs_[i].src->tokens.size() - c.cached;
            env.ready.push_back(i);
          }
          continue;
        }
        const double done_at = env.clock.now;
        life_.store_computed(env, i);
        ++completed;
        env.completions.push_back(done_at);
        if (env.lead) {
          auto& rr = tally_.result.requests[i];
          rr.ttft_s = done_at - rr.arrival_s;
          rr.cached_tokens = c.cached - c.split;
          rr.split_tokens = c.split;
          rr.l1_tokens = c.split > 0 ? 0 : std::min(c.l1_hit, c.cached);
          rr.l2_tokens = rr.cached_tokens - rr.l1_tokens;
          rr.status = c.status;
        }
      }
      note_step(env);
      if (env.lead && opt_.progress &&
          kvtier::clock::now() - last_progress > std::chrono::milliseconds(500)) {
        last_progress = kvtier::clock::now();
        std::fprintf(stderr, "\r  [%s] %zu/%zu done, t=%.1f s, loading %zu, ready %zu, waiting %zu   ",
                     to_string(opt_.mode), completed, n, env.clock.now, env.loads.size() + env.lookups.size(),
                     env.ready.size(), env.waiting.size());
      }
    }
    if (env.lead && opt_.progress)
      std::fprintf(stderr, "\r  [%s] %zu/%zu done%40s\n", to_string(opt_.mode), completed, n, "");
  }

  void note_step(env_t& env) {
    if (env.lead) tally_.result.max_io_stall_s = std::max(tally_.result.max_io_stall_s, env.clock.step_stall);
    std::int64_t cur = tally_.max_wall_ns.load();
    while (env.step_wall_ns > cur && !tally_.max_wall_ns.compare_exchange_weak(cur, env.step_wall_ns)) {
    }
  }

  /// Request j's arrival: the trace's time, or (closed loop) the completion that frees its client.
  double arrival_at(const env_t& env, std::size_t j) const {
    if (!opt_.timed) return 0;
    const std::size_t c = opt_.closed_loop_clients;
    if (c == 0) return reqs_[j].src->t;
    if (j < c) return 0;
    return j - c < env.completions.size() ? env.completions[j - c] : never;
  }

  const std::vector<prepared_request>& reqs_;
  const timing_model& tm_;
  engine_options opt_;
  std::vector<modeled_l1*> l1s_;
  std::vector<L2*> l2s_;
  kvtier::modulo_ownership own_;
  run_tally tally_;
  lifecycle_t life_;  // after what it refers to
};

}  // namespace pcp
