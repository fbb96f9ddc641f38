// examples/pcp_prefill/request_lifecycle.hpp: the life of one request's KV on every
// rank, at the same points on every rank, on one kvtier::connector per rank: the lookup
// and its agreement (the min over ranks), the decision (load, split or recompute), the
// load by each chunk's owner, moved owner -> all and scattered into the request's pages
// by the connector, every loaded byte checked there, and the write-back of what was
// computed (connector::save by each chunk's owner, waited for with wait_for_save). The engine
// (engine.hpp) calls it from its step loop and keeps the scheduling; this file keeps the
// modeled clock's bookings of each request's I/O and the checks. A rank's failures are counted,
// its first kept in the connector's words ("rank 1: save of chunk 3: authentication failed ...").
//
// Deadlines: one deadline per request, set when its lookup is issued
// (load_timeout_s later, modeled), covers every rank's lookup and load of that request: a
// lookup that would end past it finds nothing, and a rank whose load would end past it
// takes none of its chunks (connector::limit_load), so the agreed prefix ends before its
// first one and the rest recomputes. The connector's steps that agree the outcomes have
// their own generous deadline, so a late peer turns into "recompute", never into a rank
// that gave up the agreement while its peer was still in I/O.
//
// Per rank: L1 = modeled_l1, L2 = the caller's store, kvtier::tiered_store over both, and
// the connector over them (its fetch queue looks up and loads the owned chunks, c mod W).
// Every loop around connector::step() stops on an agreed condition (a lookup's plan, a
// load's outcome), so every rank takes the same steps. The L1 answers and the paged
// check are agreed by all-reduces of their own. kvtier::load_estimator (the engine's,
// fed modeled times) drives `--policy cost` and `--mode split`. Modeled stores are timed
// on the modeled clock (modeled_clock.hpp); real servers by the wall clock, each rank
// measuring its calls and the ranks agreeing on the longest.
//
//   pcp::request_lifecycle<pcp::modeled_l2> life(reqs, tm, opt, own, l2s, tally);
//   life.issue_lookups(env, {i});   // at arrival, on every rank: begin_lookup, steps until agreed
//   life.decide(env, {i});          // once its lookup ended: choose, start the load
//   life.finish_load(env, i);       // once its load ended: steps until its outcome, check, queue
//   life.store_computed(env, i);    // once computed: save what this rank owns, wait for it
#pragma once

#include <algorithm>
#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <mutex>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "engine_types.hpp"
#include "kvtier/comm/recover.hpp"
#include "kvtier/connector.hpp"
#include "kvtier/cost_model.hpp"
#include "kvtier/fetch_queue.hpp"
#include "kvtier/lookup.hpp"
#include "kvtier/ownership.hpp"
#include "model_stores.hpp"
#include "rank_agree.hpp"
#include "rank_pages.hpp"
#include "rank_state.hpp"
#include "timing_model.hpp"

namespace pcp {

/// One object serves every rank of a run (each call takes that rank's `env`); it holds
/// only the run's configuration and the tally the ranks report into.
template <class L2, kvtier::comm::communicator Comm = kvtier::comm::inproc_communicator>
class request_lifecycle {
 public:
  using env_t = rank_env<L2, Comm>;
  static constexpr bool modeled = modeled_timing_v<L2>;
  static constexpr bool has_l2() { return !std::is_same_v<L2, null_store>; }

  request_lifecycle(const std::vector<prepared_request>& reqs, const timing_model& tm,
                    const engine_options& opt, const kvtier::modulo_ownership& own,
                    const std::vector<L2*>& l2s, run_tally& tally)
      : reqs_(reqs), tm_(tm), opt_(opt), own_(own), l2s_(l2s), tally_(tally) {}

  /// The real budget of each lookup, load and save of the connector (its deadlines): modeled
  /// stores take no real time, so a generous one; real servers get load_timeout_s of wall time.
  std::chrono::milliseconds io_budget() const {
    return modeled ? std::chrono::milliseconds(60'000)
                   : std::chrono::duration_cast<std::chrono::milliseconds>(
                         std::chrono::duration<double>(opt_.load_timeout_s));
  }

  /// The deadline of the collectives that agree on outcomes (rank_agree.hpp).
  static kvtier::deadline coll_dl() { return agree_deadline(); }

  /// Issues the lookups of requests `ids` at the current modeled time and sets
  /// their modeled end (their real I/O has finished when this returns).
  void issue_lookups(env_t& env, const std::vector<std::size_t>& ids) {
    if (ids.empty()) return;
    if (!modeled) {
      // One real deadline per request: an agreed budget (a duration, the min over ranks), which
      // each rank turns into a deadline on its own clock as the agreement returns, not an
      // agreed steady_clock instant (each host's clock counts from its own boot).
      ++env.collectives;
      const kvtier::comm::agreed_budget b =
          kvtier::comm::agree_budget(*env.comm,
                                     std::chrono::duration_cast<kvtier::clock::duration>(
                                         std::chrono::duration<double>(opt_.load_timeout_s)),
                                     coll_dl());
      if (b.ec) throw std::runtime_error(b.message);
      const kvtier::deadline dl = b.local_deadline();
      for (std::size_t i : ids) env.loc[i].real_dl = dl;
    }
    // The connector: each rank's owners ask their stores (never blocks), then steps until every
    // one of these lookups is agreed (the min over ranks), a condition every rank sees alike, so
    // every rank takes the same steps. A failed agreement ends them with nothing cached.
    const auto began = kvtier::clock::now();
    for (std::size_t i : ids) {
      ctl_state& c = env.ctl[i];
      c.io_start = env.clock.now;
      c.deadline = env.clock.now + opt_.load_timeout_s;
      if (auto ec = env.conn->begin_lookup(i, keyed_tokens(i), reqs_[i].src->tokens.size()))
        throw std::runtime_error("connector: begin_lookup of request " + std::to_string(i) + ": " +
                                 ec.message());
    }
    const auto agreed = [&] {
      return std::all_of(ids.begin(), ids.end(),
                         [&](std::size_t i) { return env.conn->lookup(i).has_value(); });
    };
    for (std::size_t steps = 0; !agreed(); ++steps) {  // bounded: each lookup by its deadline
      if (steps == max_steps) throw std::runtime_error("connector: lookups not agreed after max_steps steps");
      (void)env.conn->step(coll_dl());           // a failed agreement: in errors(), counted below
      if (!agreed()) std::this_thread::yield();  // an engine computes its batch here
    }
    for (std::size_t i : ids) note_reasons(env, i, kvtier::request_error::stage::lookup);  // this rank's own
    std::vector<double> took(ids.size(), std::chrono::duration<double>(kvtier::clock::now() - began).count());
    if (!modeled) took = agree_max_s(env, took);
    for (std::size_t k = 0; k < ids.size(); ++k) {
      ctl_state& c = env.ctl[ids[k]];
      env.loc[ids[k]].lookup_answer = env.conn->lookup(ids[k])->cached_tokens;  // agreed
      const double end =
          modeled ? env.io->lookup_end(reqs_[ids[k]].n_chunks(), env.clock.now) : env.clock.now + took[k];
      // Past the request's deadline the lookup counts as failed: nothing cached (on every rank:
      // the modeled and the agreed times are the same everywhere).
      if (end > c.deadline) env.loc[ids[k]].lookup_answer = 0;
      c.lookup_end = std::min(end, c.deadline);
      env.costs.lookup_s += c.lookup_end - env.clock.now;
      ++env.costs.lookups;
    }
  }

  /// The lookups of `done` (in this order) finished on every rank: agree on their
  /// answers, decide load / split / recompute, and start the loads.
  void decide(env_t& env, const std::vector<std::size_t>& done) {
    // The lookups' answers are agreed (issue_lookups); the L1 answers are not part of the
    // connector's step, so one all-reduce agrees them (the min: the L1 prefix on every rank).
    std::vector<std::uint64_t> v;
    for (std::size_t i : done) v.push_back(l1_answer(env, i));
    all_reduce_min(env, v);
    const double g = static_cast<double>(opt_.world) * tm_.chunk_tokens;  // one round of owners
    const kvtier::load_path configured{.fixed_cost_s = tm_.l2_t0_s,
                                       .bandwidth_gb_per_s = tm_.l2_total_gbps(opt_.world)};
    for (std::size_t k = 0; k < done.size(); ++k) {
      const std::size_t i = done[k];
      ctl_state& c = env.ctl[i];
      const double n = static_cast<double>(reqs_[i].src->tokens.size());
      c.hit = env.loc[i].lookup_answer;
      c.l1_hit = std::min(v[k], c.hit);
      if (env.lead) tally_.result.requests[i].lookup_tokens = c.hit;
      bool load = c.hit > 0;
      const double l2_part = static_cast<double>(c.hit - c.l1_hit);
      const double tokens = l2_part > 0 ? l2_part : static_cast<double>(c.hit);
      if (load && opt_.mode == load_mode::split) {
        const auto plan = env.estimator->split(tm_.node(), static_cast<double>(c.hit), n, g);
        c.split = std::min<std::uint64_t>(c.hit, static_cast<std::uint64_t>(plan.k_tokens));
        if (env.lead && modeled && has_l2())
          tally_.result.requests[i].predicted_s =
              kvtier::split_point(tm_.node(), configured, static_cast<double>(c.hit), n, g).predicted_s;
        if (c.split >= c.hit) load = false, c.status = "policy_recompute";
      } else if (load && opt_.policy == load_policy::cost) {
        // Load iff it is predicted to finish before recompute would, counting the
        // compute already queued ahead and the delay recomputing would impose on the
        // requests behind it at the offered utilisation (min_saving_s = -(backlog +
        // externality)), give or take the latency the operator trades for GPU time.
        double backlog = opt_.cost_slack_s;
        for (std::size_t j : env.ready) backlog += tm_.compute_s(static_cast<double>(env.ctl[j].remaining));
        backlog += kvtier::recompute_externality_s(tm_.compute_s(tokens), env.offered_utilisation());
        load = env.estimator->decide(tm_.node(), tokens, -backlog).load;
        if (!load) c.status = "policy_recompute";
      }
      if (load && env.lead && modeled && has_l2() && opt_.mode != load_mode::split)
        tally_.result.requests[i].predicted_s =
            kvtier::split_time_s(tm_.node(), configured, static_cast<double>(c.hit), n, 0);
      c.loading = load;
      if (!load) {
        c.cached = 0;
        c.split = 0;
        c.remaining = reqs_[i].src->tokens.size();
        if (c.status.empty()) c.status = "miss";
        env.ready.push_back(i);
        continue;
      }
      if (c.split > 0) {  // the front computes on the step while the back loads
        c.front = true;
        c.remaining = c.split;
        env.ready.push_back(i);
      }
    }
    std::vector<std::size_t> starting;
    for (std::size_t i : done)
      if (env.ctl[i].loading) starting.push_back(i);
    start_loads(env, starting);
  }

  /// Every rank loaded what it could of request i: agree on the prefix, move the
  /// chunks owner -> all (modeled interconnect time on the step), verify every
  /// byte, and queue what is left of the prompt for compute. `in_step` (layer by layer,
  /// from compute_layers): the request is being computed already and the moves were
  /// overlapped with it (booked in its layer_ready times), so the clock does not move and
  /// nothing is queued.
  void finish_load(env_t& env, std::size_t i, bool in_step = false) {
    ctl_state& c = env.ctl[i];
    const std::size_t c0 = chunks(c.split);
    // Every rank's fetch has ended (start_loads waited for it): step until the load's outcome is
    // agreed (an agreed condition: every rank takes the same steps). The steps agree the
    // fetched prefix (the min over ranks, each rank's cap included), move its chunks owner ->
    // every rank and scatter them into the pages; a failed agreement loads nothing anywhere.
    for (std::size_t steps = 0; !env.conn->load_result(i); ++steps) {
      if (steps == max_steps) throw std::runtime_error("connector: load not agreed after max_steps steps");
      (void)env.conn->step(coll_dl());  // a failed agreement: in errors(), counted below
      if (!env.conn->load_result(i)) std::this_thread::yield();
    }
    const std::uint64_t agreed = env.conn->load_result(i)->loaded_end_token;
    note_reasons(env, i, kvtier::request_error::stage::load);  // why this rank's part ended short
    // Modeled interconnect time: what the busiest receiver got, plus the collectives' latency:
    // the two steps that agree the fetched prefix and the outcome, and one grouped broadcast
    // per layer group (one group: all layers).
    const double bcast =
        env.io->broadcast_s(c0, chunks(agreed), in_step ? 2 + layers() : connector_collectives);
    if (!in_step) env.clock.now += bcast;
    env.costs.broadcast_s += bcast;
    ++env.costs.broadcasts;
    // The agreed chunks are in the request's pages (the connector scattered them), where its KV
    // lives from now on; every loaded byte is checked there, in the paged layout, against what
    // recompute would produce (each chunk gathered back from the pages). Real CPU work, not
    // modeled time.
    if (i == opt_.corrupt_paged_request && env.comm->rank() == opt_.corrupt_paged_rank &&
        chunks(agreed) > c0) {
      auto v = std::span<std::byte>(env.paged_scratch);
      from_pages(env, tm_, i, c0, v);
      v[v.size() / 2] ^= std::byte{0x01};
      to_pages(env, tm_, i, c0, v);
    }
    std::uint64_t first_bad = agreed;
    std::uint64_t bad = 0;
    for (std::size_t k = c0; k < chunks(agreed); ++k) {
      from_pages(env, tm_, i, k, env.paged_scratch);
      if (!verify_payload(env.paged_scratch, chunk_tokens_of(i, k), k * tm_.chunk_tokens, env.scratch)) {
        ++bad;
        first_bad = std::min<std::uint64_t>(first_bad, k * tm_.chunk_tokens);
      }
    }
    if (bad) tally_.mismatches += bad;
    std::vector<std::uint64_t> v{first_bad, bad ? 0u : 1u};
    all_reduce_min(env, v);
    c.cached = std::max(c.split, std::min(agreed, v[0]));
    c.loading = false;
    c.loaded = true;
    if (v[1] == 0)
      c.status = "mismatch";
    else if (c.cached < c.hit)
      c.status = "partial";
    else
      c.status = c.split > 0 ? "split" : "hit";
    if (c.cached < c.hit && env.lead) ++tally_.result.failed_loads;
    const std::uint64_t l2_from = std::max(c.split, c.l1_hit);
    if (env.estimator && c.cached > l2_from &&
        c.load_end > c.load_start)  // every rank records the same sample
      env.estimator->record(kvtier::kv_gb(static_cast<double>(c.cached - l2_from), tm_.bytes_per_token),
                            c.load_end - c.load_start);
    if (env.lead) tally_.result.requests[i].load_s = c.load_end - c.io_start;
    if (in_step) return;
    if (!c.front || c.front_done) {
      c.front = false;
      c.remaining = reqs_[i].src->tokens.size() - c.cached;
      env.ready.push_back(i);
    }
  }

  /// Layer by layer: request i's ready time came (its layer groups land in time for a step
  /// starting now): it joins the ready queue to compute its suffix past the planned hit; its
  /// load's outcome is agreed in the step that first computes it (compute_layers).
  void layer_ready(env_t& env, std::size_t i) {
    ctl_state& c = env.ctl[i];
    c.layer_pending = true;
    c.remaining = reqs_[i].src->tokens.size() - c.hit;
    env.ready.push_back(i);
  }

  /// Layer by layer: computes a batch that starts at `start` and takes `dur` (modeled), layer
  /// after layer, and returns its end. Layer l starts once layer l of the batch's loading
  /// requests is in the pages (modeled: their layer_ready) and the previous layer is done.
  /// For real: one connector step agrees what every rank fetched (layer: every rank's fetch has
  /// ended, start_loads waited for it) and hands those chunks to the mover, then the engine waits
  /// for each layer (connector::wait_for_layer) before that layer's compute (layer-streamed on real
  /// servers: it agrees group l itself while later groups still fetch, and the time group l
  /// landed, the longest over ranks, is that layer's ready time on the clock); once the batch is
  /// computed the loads' outcomes are agreed and checked (finish_load). A load that came back
  /// short voids what this step computed of its request: it recomputes from the agreed prefix.
  double compute_layers(env_t& env, const std::vector<std::pair<std::size_t, std::uint64_t>>& batch,
                        double start, double dur) {
    std::vector<std::pair<std::size_t, std::uint64_t>> pending;
    for (const auto& b : batch)
      if (env.ctl[b.first].layer_pending) pending.push_back(b);
    if (pending.empty()) return start + dur;
    (void)env.conn->step(coll_dl());  // a failed agreement: in errors(), counted by finish_load
    const std::uint32_t n_layers = layers();
    double t = start;
    for (std::uint32_t l = 0; l < n_layers; ++l) {
      // A load cut short lists a ready end below its range: the request recomputes from its agreed
      // outcome once the batch is computed (finish_load), so this modeled compute covers it.
      if (auto w = env.conn->wait_for_layer(l, coll_dl()); w.ec) note_error(env, w.ec, "layer wait");
      if (env.lead) ++tally_.result.layer_waits;
      if (streamed_real()) {  // group l landed: when, since each load began (the longest over ranks)
        std::vector<double> took;
        for (const auto& b : pending)
          took.push_back(
              std::chrono::duration<double>(kvtier::clock::now() - env.loc[b.first].load_began).count());
        took = agree_max_s(env, took);
        for (std::size_t k = 0; k < pending.size(); ++k) {
          ctl_state& c = env.ctl[pending[k].first];
          c.layer_ready[l] = std::min(c.load_start + took[k], c.deadline);
          c.load_end = c.layer_ready[l];
        }
      }
      for (const auto& [i, take] : pending) t = std::max(t, env.ctl[i].layer_ready[l]);
      t += dur / n_layers;
    }
    for (const auto& [i, take] : pending) {
      ctl_state& c = env.ctl[i];
      if (streamed_real()) env.costs.load_s += c.load_end - c.load_start;  // start_loads booked none
      finish_load(env, i, /*in_step*/ true);
      c.layer_pending = false;
      if (c.cached >= c.hit) continue;
      // The engine subtracts `take` after the step; a request whose rest continues next step
      // (remaining > take) is in the ready queue already.
      if (c.remaining <= take) env.ready.push_front(i);
      c.remaining = reqs_[i].src->tokens.size() - c.cached + take;
    }
    return t;
  }

  /// Sync mode: lookup and load request i inside the step (every rank waits).
  void sync_lookup_and_load(env_t& env, std::size_t i) {
    issue_lookups(env, {i});
    env.clock.wait_until(env.ctl[i].lookup_end);
    decide(env, {i});
    if (!env.ctl[i].loaded && env.ctl[i].loading) {
      env.clock.wait_until(env.ctl[i].load_end);
      finish_load(env, i);
    }
  }

  /// Request i finished computing: each rank saves the chunks it owns that it computed (L1
  /// and L2, write-through) through the connector, which gathers them from the pages and puts
  /// them off this thread by its own deadline. The step waits for the save before the pages go
  /// back, so every rank frees them at the same point and the ranks' reservations stay alike.
  /// Sync: the modeled step waits for the write-back too.
  void store_computed(env_t& env, std::size_t i) {
    const ctl_state& c = env.ctl[i];
    // Chunks below the hit are in L2 already (a load cut short or a recompute by policy
    // leaves them there), except a mismatched one, which is overwritten with good bytes.
    const std::size_t from = chunks(c.status == "mismatch" ? c.cached : std::max(c.cached, c.hit));
    const std::size_t to = reqs_[i].n_chunks();
    bool pages_free = true;
    const auto t = kvtier::clock::now();
    if (from < to) {
      reserve_pages(env, tm_, i, static_cast<std::uint64_t>(to) * tm_.chunk_tokens);
      // Compute writes the chunk's KV into the pages; the connector gathers the value from them.
      for (std::size_t k = from; k < to; ++k) {
        if (own_.owner(k) != env.comm->rank()) continue;
        fill_payload(env.paged_scratch, chunk_tokens_of(i, k), k * tm_.chunk_tokens);
        to_pages(env, tm_, i, k, env.paged_scratch);
      }
      pages_free = write_back(env, i, from, to);
    }
    if (from < to && opt_.timed) {
      double end = env.clock.now;
      if (modeled)
        end = env.io->writeback_end(from, to, env.clock.now);
      else if (opt_.mode == load_mode::sync)  // agreed by every rank, so only where it is waited for
        end = env.clock.now +
              agree_max_s(env, {std::chrono::duration<double>(kvtier::clock::now() - t).count()})[0];
      env.costs.writeback_s += end - env.clock.now;
      env.costs.writebacks += has_l2() || !modeled;
      if (opt_.mode == load_mode::sync) env.clock.wait_until(end);
    }
    env.conn->finish(i);  // nothing of it is agreed or written by the connector any more
    if (pages_free) env.cache->release(env.loc[i].seq);
    env.loc[i] = local_request{};
  }

 private:
  static constexpr std::size_t max_steps = 10'000'000;  ///< steps to agree one step's lookups
  /// Collectives of one load agreed by the connector after its fetch ended: two steps (the
  /// fetched prefix, then the outcome) and one grouped broadcast per layer group (one group).
  static constexpr std::uint64_t connector_collectives = 3;
  /// Layer groups of a load in the layer modes (one layer each): the paged cache's layers.
  std::uint32_t layers() const { return std::max<std::uint32_t>(1, tm_.kv_layers); }
  /// Layer-streamed on real servers: the fetch streams by layer group under the compute.
  bool streamed_real() const { return !modeled && opt_.granularity == load_granularity::layer_streamed; }

  /// Starts the loads of `ids` (owned chunks in [split, hit)) at the current modeled
  /// time and sets their modeled end (their real I/O has finished when this returns).
  void start_loads(env_t& env, const std::vector<std::size_t>& ids) {
    if (ids.empty()) return;
    const kvtier::rank_t me = env.comm->rank();
    std::vector<kvtier::clock::time_point> began;
    for (std::size_t i : ids) {
      const ctl_state& c = env.ctl[i];
      // The chunks land in the request's pages: [0, hit) are reserved now (the front of a
      // split is computed into them too).
      reserve_pages(env, tm_, i, c.hit);
      const std::vector<std::int64_t> slots = kvtier::slots_from_block_table(
          {env.loc[i].seq.blocks, 0, c.hit}, static_cast<std::uint32_t>(tm_.kv_block_tokens));
      began.push_back(kvtier::clock::now());
      env.loc[i].load_began = began.back();
      // This rank's owners fetch [split, hit); a local failure makes this rank load nothing.
      note_error(env, env.conn->load(i, slots, c.split, c.hit), "load");
    }
    std::vector<double> took;
    std::vector<double> ends;
    for (std::size_t k = 0; k < ids.size(); ++k) {
      if (streamed_real()) {  // the fetch goes on under the compute: compute_layers waits per layer
        took.push_back(0);
        continue;
      }
      // Wait for this rank's own fetch (by its deadline, and slack) so that the outcome is
      // agreed in the steps of finish_load, whatever the threads' timing.
      if (env.conn->wait_local(ids[k], real_dl(env, ids[k]) + std::chrono::seconds(5)))
        note_error(env, kvtier::make_error_code(kvtier::errc::timeout), "load");
      took.push_back(std::chrono::duration<double>(kvtier::clock::now() - began[k]).count());
    }
    if (!modeled) took = agree_max_s(env, took);
    for (std::size_t k = 0; k < ids.size(); ++k) {
      const std::size_t i = ids[k];
      ctl_state& c = env.ctl[i];
      c.load_start = env.clock.now;
      double end = env.clock.now + (modeled ? 0.0 : took[k]);
      if (modeled) {
        ends = env.io->load_ends(chunks(c.split), chunks(c.hit), chunks(c.l1_hit), env.clock.now);
        end = *std::max_element(ends.begin(), ends.end());
        if (ends[me] > c.deadline) limit_to_deadline(env, i);
      } else if (end > c.deadline) {
        limit_to_deadline(env, i);
      }
      c.load_end = std::min(end, c.deadline);  // past the deadline the engine stops waiting
      if (opt_.granularity != load_granularity::chunk)
        set_layer_ready(env, i, modeled ? ends : std::vector<double>(opt_.world, c.load_end));
      env.costs.load_s += c.load_end - c.load_start;
      ++env.costs.loads;
      if (opt_.mode != load_mode::sync) env.loads.push_back(i);
    }
  }

  /// Layer by layer: when each layer of load i is in every rank's pages (each rank's fetch
  /// ending at `ends`), and the earliest step start at which none of its layers waits: layer
  /// l of a step that computes c seconds of it starts l*c/L after the step (c: its suffix, at
  /// most one batch; a longer step only starts later layers later).
  void set_layer_ready(env_t& env, std::size_t i, const std::vector<double>& ends) {
    ctl_state& c = env.ctl[i];
    if (streamed_real()) {  // measured in compute_layers, as each group lands: it may join now
      c.layer_ready.assign(layers(), env.clock.now);
      c.ready_at = env.clock.now;
      return;
    }
    c.layer_ready = env.io->group_landings(chunks(c.split), chunks(c.hit), chunks(c.l1_hit), ends, layers(),
                                           opt_.granularity == load_granularity::layer_streamed, c.deadline);
    const double per_layer = tm_.compute_s(static_cast<double>(std::min<std::uint64_t>(
                                 reqs_[i].src->tokens.size() - c.hit, opt_.max_batch_tokens))) /
                             layers();
    c.ready_at = env.clock.now;
    for (std::uint32_t l = 0; l < layers(); ++l)
      c.ready_at = std::max(c.ready_at, c.layer_ready[l] - l * per_layer);
  }

  /// This rank's part of load i would end past the request's deadline: it takes none of its
  /// chunks, so the agreed prefix ends before its first owned chunk of [split, hit).
  void limit_to_deadline(env_t& env, std::size_t i) {
    const ctl_state& c = env.ctl[i];
    const std::uint64_t stop = first_start(env.comm->rank(), chunks(c.split), chunks(c.hit));
    if (auto ec = env.conn->limit_load(i, chunks(stop) - chunks(c.split)))
      throw std::runtime_error("connector: limit_load of request " + std::to_string(i) + ": " + ec.message());
  }

  /// A rank's answer when it found nothing in [c0, c1): its first owned start, or the end.
  std::uint64_t first_start(kvtier::rank_t rank, std::size_t c0, std::size_t c1) const {
    for (std::size_t c = c0; c < c1; ++c)
      if (own_.owner(c) == rank) return static_cast<std::uint64_t>(c) * tm_.chunk_tokens;
    return static_cast<std::uint64_t>(c1) * tm_.chunk_tokens;
  }
  /// This rank's L1 answer for request i (host memory; part of the lookup).
  std::uint64_t l1_answer(env_t& env, std::size_t i) {
    const kvtier::rank_t me = env.comm->rank();
    std::vector<kvtier::chunk_key> keys;
    for (std::size_t k = 0; k < reqs_[i].n_chunks(); ++k)
      if (own_.owner(k) == me) keys.push_back(reqs_[i].keys[k]);
    std::vector<kvtier::chunk_status> st(keys.size(), kvtier::chunk_status::error);
    (void)step_io(env, [&] { return env.l1->exists(keys, st, kvtier::no_deadline); });
    const auto starts = owned_starts_in(me, 0, reqs_[i].n_chunks());
    return kvtier::rank_answer(std::span<const std::uint64_t>(starts), kvtier::detail::store_hit_view{st},
                               reqs_[i].n_chunks() * tm_.chunk_tokens);
  }

  /// The real deadline of a request's I/O: modeled stores take no real time, so a
  /// generous one; real servers get the request's own (load_timeout_s of wall time).
  kvtier::deadline real_dl(const env_t& env, std::size_t i) const {
    return modeled ? kvtier::clock::now() + std::chrono::seconds(60) : env.loc[i].real_dl;
  }

  /// Runs a store call of the step thread, timing its real duration.
  template <class F>
  auto step_io(env_t& env, F&& f) {
    const auto t = kvtier::clock::now();
    auto r = f();
    env.step_wall_ns +=
        std::chrono::duration_cast<std::chrono::nanoseconds>(kvtier::clock::now() - t).count();
    return r;
  }
  void note_error(env_t& env, const std::error_code& ec, const char* what) {
    if (!ec) return;
    std::string e = std::string(what) + ": " + ec.message();
    // A store that keeps its last failure in words (the server's or OpenSSL's) says why.
    if constexpr (requires(const L2& s) {
                    { s.last_error() } -> std::convertible_to<std::string>;
                  }) {
      const std::string why = l2s_[env.comm->rank()]->last_error();
      if (!why.empty() && why != ec.message()) e += " (" + why + ")";
    }
    note_failure(env, std::move(e));
  }
  /// One failed store call in words: counted, and kept when it is this rank's first.
  void note_failure(env_t& env, std::string text) {
    ++tally_.failed_calls;
    std::lock_guard lock(tally_.mu);
    std::string& e = tally_.result.l2_errors[env.comm->rank()];
    if (e.empty()) e = std::move(text);
  }
  /// The connector's reason for this rank's part of request i's `stage`, if any (its own, never
  /// agreed); one with no error code is a key not had or kept (--l2 none), not a failed call.
  void note_reasons(env_t& env, std::size_t i, kvtier::request_error::stage stage) {
    for (const kvtier::request_error& e : env.conn->errors(i))
      if (e.what == stage && e.ec) note_failure(env, e.message);
  }

  /// Saves request i's owned chunks in [from, to) from its pages (connector::save, off this
  /// thread) and waits for it, by the save's deadline and slack. True when the pages may be
  /// freed: a save still running past that keeps them (never reused while it may read them).
  bool write_back(env_t& env, std::size_t i, std::size_t from, std::size_t to) {
    const std::uint64_t end = static_cast<std::uint64_t>(to) * tm_.chunk_tokens;
    const std::vector<std::int64_t> slots = kvtier::slots_from_block_table(
        {env.loc[i].seq.blocks, 0, end}, static_cast<std::uint32_t>(tm_.kv_block_tokens));
    const std::uint64_t first = static_cast<std::uint64_t>(from) * tm_.chunk_tokens;
    // A request that was never looked up (recompute mode) is keyed by the save itself.
    const std::error_code ec = env.conn->lookup(i) ? env.conn->save(i, slots, first, end)
                                                   : env.conn->save(i, keyed_tokens(i), slots, first, end);
    if (ec) throw std::runtime_error("connector: save of request " + std::to_string(i) + ": " + ec.message());
    const kvtier::deadline dl = kvtier::clock::now() + io_budget() + std::chrono::seconds(30);
    const std::error_code waited = step_io(env, [&] { return env.conn->wait_for_save(i, dl); });
    note_error(env, waited, "store");  // a save past its own deadline and the slack
    note_reasons(env, i, kvtier::request_error::stage::save);
    (void)env.conn->drain_events();  // no router here: the stored events are not kept
    return !waited;
  }

  /// Request i's tokens that are keyed: its full chunks.
  std::span<const std::uint32_t> keyed_tokens(std::size_t i) const {
    return std::span<const std::uint32_t>(reqs_[i].src->tokens).first(reqs_[i].n_chunks() * tm_.chunk_tokens);
  }
  std::span<const std::uint32_t> chunk_tokens_of(std::size_t i, std::size_t c) const {
    return std::span<const std::uint32_t>(reqs_[i].src->tokens)
        .subspan(c * tm_.chunk_tokens, tm_.chunk_tokens);
  }
  /// Start tokens of this rank's owned chunks in [c0, c1).
  std::vector<std::uint64_t> owned_starts_in(kvtier::rank_t rank, std::size_t c0, std::size_t c1) const {
    std::vector<std::uint64_t> s;
    for (std::size_t c = c0; c < c1; ++c)
      if (own_.owner(c) == rank) s.push_back(static_cast<std::uint64_t>(c) * tm_.chunk_tokens);
    return s;
  }
  std::size_t chunks(std::uint64_t tokens) const {
    return static_cast<std::size_t>(tokens / tm_.chunk_tokens);
  }

  const std::vector<prepared_request>& reqs_;
  const timing_model& tm_;
  const engine_options& opt_;
  const kvtier::modulo_ownership& own_;
  const std::vector<L2*>& l2s_;
  run_tally& tally_;
};

}  // namespace pcp
