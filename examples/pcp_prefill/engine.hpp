// examples/pcp_prefill/engine.hpp: a context-parallel prefill engine made of
// kvtier components, replaying a trace under the timing model.
//
// W ranks run as threads over kvtier::comm::inproc and advance in lockstep;
// every scheduling decision derives from values all ranks agreed on through a
// collective, so every rank issues the same collectives in the same order.
//
// Per rank: L1 = modeled_l1 (a kvtier::memory_store), L2 = the caller's store,
// kvtier::tiered_store over both, kvtier::rank_view views (owned chunks
// only, c mod W), a kvtier::fetch_queue (async mode) and a write-behind thread
// for L2 puts outside the step. Lookup answers are kvtier::rank_answer values
// reduced with a min all-reduce; loaded chunks move owner -> all ranks with
// kvtier::chunk_broadcast; kvtier::load_estimator drives `--policy cost`.
//
//   pcp::engine<pcp::modeled_l2> e(reqs, tm, clk, opt, l1s, l2s);
//   pcp::run_result r = e.run();
#pragma once

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "kvtier/chunk_broadcast.hpp"
#include "kvtier/chunker.hpp"
#include "kvtier/comm/inproc.hpp"
#include "kvtier/cost_model.hpp"
#include "kvtier/fetch_queue.hpp"
#include "kvtier/lookup.hpp"
#include "kvtier/ownership.hpp"
#include "kvtier/store/rank_view.hpp"
#include "kvtier/store/tiered_store.hpp"
#include "model_stores.hpp"
#include "timing_model.hpp"
#include "trace.hpp"

namespace pcp {

enum class load_mode { recompute, sync, async };
enum class load_policy { always, cost };

inline const char* to_string(load_mode m) {
  return m == load_mode::recompute ? "recompute" : m == load_mode::sync ? "sync" : "async";
}
inline const char* to_string(load_policy p) { return p == load_policy::cost ? "cost" : "always"; }

struct engine_options {
  std::uint32_t world = 8;
  load_mode mode = load_mode::async;
  load_policy policy = load_policy::always;
  bool use_cache = true;                 ///< false: neither reads nor writes (prime passes keep it on)
  std::size_t max_batch_tokens = 32768;  ///< tokens computed per step
  std::size_t max_batch_requests = 256;  ///< requests per step (vLLM's default max_num_seqs)
  double load_timeout_s = 10;            ///< modeled seconds; a load past it recomputes
  double cost_slack_s = 0;               ///< --policy cost: also load when predicted at most this much slower
  std::size_t fetch_workers = 8;         ///< fetch_queue threads per rank (a load's T0 occupies one)
  kvtier::broadcast_mode broadcast = kvtier::broadcast_mode::gathered;  ///< 2 collectives per load
  bool progress = false;                                                ///< progress line on stderr
  bool timed = true;                                                    ///< false: the untimed priming replay
};

/// A trace request with its chunk keys (full chunks before the last token: the
/// engine always computes at least one token).
struct prepared_request {
  const request* src = nullptr;
  std::vector<kvtier::chunk_key> keys;
  std::size_t n_chunks() const { return keys.size(); }
};

inline std::vector<prepared_request> prepare(const std::vector<request>& reqs,
                                             const kvtier::chunker<>& chunk) {
  std::vector<prepared_request> out(reqs.size());
  const std::size_t c = chunk.chunk_tokens();
  for (std::size_t i = 0; i < reqs.size(); ++i) {
    out[i].src = &reqs[i];
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
  double queue_s = 0, load_s = 0, ttft_s = 0;
  std::string status;  ///< miss | hit | partial | policy_recompute | recompute | mismatch
};

struct run_result {
  std::vector<request_result> requests;
  double makespan_s = 0;      ///< first arrival to last completion, modeled
  double busy_s = 0;          ///< modeled compute time
  double max_io_stall_s = 0;  ///< longest time one step spent blocked in store calls
  std::uint64_t mismatched_chunks = 0;
  std::uint64_t failed_loads = 0;  ///< loads that came back shorter than looked up
  std::uint64_t steps = 0;
  std::uint64_t collectives = 0;
  std::string fatal;  ///< non-empty when the run aborted (a collective failed)
};

namespace detail {

/// L2 puts outside the step: one thread per rank, in submission order.
template <class Store>
class write_behind {
 public:
  write_behind(Store& s, const model_clock& clk, double timeout_s)
      : store_(s), clk_(clk), timeout_s_(timeout_s), thread_([this] { loop(); }) {}
  ~write_behind() { close(); }
  void push(std::vector<kvtier::chunk_key> keys, std::vector<std::vector<std::byte>> data) {
    {
      std::lock_guard lock(mu_);
      jobs_.push_back({std::move(keys), std::move(data)});
    }
    cv_.notify_one();
  }
  /// Writes everything queued, then stops.
  void close() {
    {
      std::lock_guard lock(mu_);
      if (closed_) return;
      closed_ = true;
    }
    cv_.notify_one();
    thread_.join();
  }

 private:
  struct job {
    std::vector<kvtier::chunk_key> keys;
    std::vector<std::vector<std::byte>> data;
  };
  void loop() {
    for (;;) {
      job j;
      {
        std::unique_lock lock(mu_);
        cv_.wait(lock, [&] { return closed_ || !jobs_.empty(); });
        if (jobs_.empty()) return;
        j = std::move(jobs_.front());
        jobs_.pop_front();
      }
      std::vector<std::span<const std::byte>> src(j.data.begin(), j.data.end());
      std::vector<kvtier::chunk_status> st(j.keys.size());
      (void)store_.put(j.keys, src, st,
                       kvtier::clock::now() + clk_.real(timeout_s_) + std::chrono::seconds(5));
    }
  }
  Store& store_;
  const model_clock& clk_;
  double timeout_s_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<job> jobs_;
  bool closed_ = false;
  std::thread thread_;
};

}  // namespace detail

template <class L2>
class engine {
  using tiers_t = kvtier::tiered_store<modeled_l1, L2>;
  using view_t = kvtier::rank_view<tiers_t, kvtier::modulo_ownership>;
  using l1_view_t = kvtier::rank_view<modeled_l1, kvtier::modulo_ownership>;
  using comm_t = kvtier::comm::inproc_communicator;
  static constexpr std::uint64_t none = std::numeric_limits<std::uint64_t>::max();

 public:
  engine(const std::vector<prepared_request>& reqs, const timing_model& tm, model_clock& clk,
         engine_options opt, std::vector<modeled_l1*> l1s, std::vector<L2*> l2s)
      : reqs_(reqs),
        tm_(tm),
        clk_(clk),
        opt_(opt),
        l1s_(std::move(l1s)),
        l2s_(std::move(l2s)),
        own_(opt.world) {}

  run_result run() {
    result_ = run_result{};
    result_.requests.resize(reqs_.size());
    for (std::size_t i = 0; i < reqs_.size(); ++i) {
      auto& r = result_.requests[i];
      r.id = reqs_[i].src->id;
      r.arrival_s = opt_.timed ? reqs_[i].src->t : 0;
      r.prompt_tokens = reqs_[i].src->tokens.size();
    }
    clk_.restart(opt_.timed ? tm_.time_scale : 0);
    kvtier::comm::inproc_world world(opt_.world);
    kvtier::comm::run_ranks(world, [&](comm_t& c) { rank_main(c); });
    double first = 1e300, last = 0;
    for (const auto& r : result_.requests) {
      first = std::min(first, r.arrival_s);
      last = std::max(last, r.arrival_s + r.ttft_s);
    }
    result_.makespan_s = reqs_.empty() ? 0 : last - first;
    result_.max_io_stall_s = clk_.to_model(std::chrono::nanoseconds(max_stall_ns_.load()));
    result_.mismatched_chunks = mismatches_.load();
    return std::move(result_);
  }

 private:
  /// Replicated per-request control state: every rank holds the same values.
  struct ctl_state {
    std::uint64_t hit = 0, l1_hit = 0, cached = 0, remaining = 0;
    bool loading = false, started = false;
    std::string status;
  };
  /// One rank's own per-request data.
  struct local {
    std::vector<std::byte> buf;  // n_chunks * chunk_bytes: this rank's copy of the prompt's KV
    kvtier::fetch_handle lookup, load;
    kvtier::clock::time_point load_started{};
  };
  struct rank_env {
    comm_t* comm = nullptr;
    tiers_t* tiers = nullptr;
    view_t* view = nullptr;
    l1_view_t* l1_view = nullptr;
    modeled_l1* l1 = nullptr;
    L2* l2 = nullptr;
    kvtier::fetch_queue<tiers_t>* queue = nullptr;
    detail::write_behind<L2>* writer = nullptr;
    kvtier::load_estimator* estimator = nullptr;
    std::vector<local> loc;
    std::vector<std::byte> scratch;
    std::vector<std::byte> staging;  // gathered broadcast
    std::int64_t step_stall_ns = 0;
    bool lead = false;
    // Replicated scheduling state: every rank holds the same values, derived from agreed ones.
    std::vector<ctl_state> ctl;
    std::deque<std::size_t> waiting, ready;
    std::vector<std::size_t> lookups, loads;
    std::uint64_t collectives = 0;
    // Offered load so far, from agreed arrivals and trace data only (so every rank sees the
    // same value): compute seconds of every arrived prompt over the arrival span.
    double offered_work_s = 0, first_arrival_s = 0, last_arrival_s = 0;
    std::size_t arrivals = 0;
    double offered_utilisation() const {
      const double span = last_arrival_s - first_arrival_s;
      return arrivals >= 2 && span > 0 ? offered_work_s / span : 0.0;
    }
  };

  kvtier::deadline coll_dl() const { return kvtier::clock::now() + std::chrono::seconds(300); }
  /// The deadline of a load or store call; untimed (priming) calls get a generous real one.
  kvtier::deadline load_dl() const {
    return kvtier::clock::now() +
           (opt_.timed ? clk_.real(opt_.load_timeout_s) : kvtier::clock::duration(std::chrono::seconds(60)));
  }

  void all_reduce_min(rank_env& env, std::vector<std::uint64_t>& v) {
    if (v.empty()) return;
    ++env.collectives;
    if (auto ec =
            kvtier::comm::all_reduce(*env.comm, std::span<const std::uint64_t>(v),
                                     std::span<std::uint64_t>(v), kvtier::comm::reduce_op::min, coll_dl()))
      throw std::runtime_error("all_reduce failed: " + ec.message() + ": " + env.comm->last_error());
  }

  template <class F>
  auto timed_io(rank_env& env, F&& f) {
    const auto t = kvtier::clock::now();
    auto ec = f();
    env.step_stall_ns +=
        std::chrono::duration_cast<std::chrono::nanoseconds>(kvtier::clock::now() - t).count();
    return ec;
  }

  std::span<std::byte> slot(rank_env& env, std::size_t i, std::size_t c) {
    local& l = env.loc[i];
    const std::size_t cb = tm_.chunk_bytes();
    if (l.buf.size() != reqs_[i].n_chunks() * cb) l.buf.assign(reqs_[i].n_chunks() * cb, std::byte{0});
    return std::span<std::byte>(l.buf).subspan(c * cb, cb);
  }

  std::span<const std::uint32_t> chunk_tokens_of(std::size_t i, std::size_t c) const {
    return std::span<const std::uint32_t>(reqs_[i].src->tokens)
        .subspan(c * tm_.chunk_tokens, tm_.chunk_tokens);
  }

  /// The rank answers (whole tiers, L1 alone) of request i, from a finished lookup.
  std::pair<std::uint64_t, std::uint64_t> lookup_answers(rank_env& env, std::size_t i,
                                                         const kvtier::fetch_result* async_res) {
    const auto keys = std::span<const kvtier::chunk_key>(reqs_[i].keys);
    const std::uint64_t keyed_tokens = reqs_[i].n_chunks() * tm_.chunk_tokens;  // full chunks only
    const auto dl = load_dl();
    std::uint64_t a = 0;
    if (async_res) {
      a = async_res->answer_tokens;  // a failed lookup reports the first owned start: nothing cached
    } else {
      // A failed lookup only shrinks the answer (its error is counted by the store).
      a = timed_io(env,
                   [&] { return env.view->lookup(keys, tm_.chunk_tokens, keyed_tokens, dl).answer_tokens; });
    }
    const std::uint64_t a1 =
        env.l1_view->lookup(keys, tm_.chunk_tokens, keyed_tokens, dl).answer_tokens;  // host memory, no I/O
    return {a, a1};
  }

  /// After the lookups of `done` (in this order) finished on every rank: agree
  /// on their answers, decide load or recompute, start loads (async) or queue.
  void decide(rank_env& env, const std::vector<std::size_t>& done,
              const std::vector<std::uint64_t>& answers) {
    for (std::size_t k = 0; k < done.size(); ++k) {
      const std::size_t i = done[k];
      ctl_state& c = env.ctl[i];
      c.hit = answers[2 * k];
      c.l1_hit = std::min(answers[2 * k + 1], c.hit);
      if (env.lead) result_.requests[i].lookup_tokens = c.hit;
      bool load = c.hit > 0;
      if (load && opt_.policy == load_policy::cost) {
        // Load iff it is predicted to finish before recompute would, counting the
        // compute already queued ahead and the delay recomputing would impose on the
        // requests behind it at the offered utilisation (min_saving_s = -(backlog +
        // externality)), give or take the latency the operator trades for GPU time.
        double backlog = opt_.cost_slack_s;
        for (std::size_t j : env.ready) backlog += tm_.compute_s(static_cast<double>(env.ctl[j].remaining));
        const double l2_part = static_cast<double>(c.hit - c.l1_hit);
        const double tokens = l2_part > 0 ? l2_part : static_cast<double>(c.hit);
        backlog += kvtier::recompute_externality_s(tm_.compute_s(tokens), env.offered_utilisation());
        load = env.estimator->decide(tm_.node(), tokens, -backlog).load;
        if (!load) c.status = "policy_recompute";
      }
      c.loading = load;
      if (!load) {
        c.cached = 0;
        c.remaining = reqs_[i].src->tokens.size();
        if (c.status.empty()) c.status = "miss";
        env.ready.push_back(i);
      }
    }
  }

  /// Starts the async load of request i's owned chunks below its agreed hit.
  void start_load(rank_env& env, std::size_t i) {
    const std::size_t hc = static_cast<std::size_t>(env.ctl[i].hit / tm_.chunk_tokens);
    const auto mine = kvtier::owned_chunks(own_, env.comm->rank(), hc);
    std::vector<kvtier::chunk_key> keys;
    std::vector<std::span<std::byte>> dst;
    for (std::size_t c : mine) keys.push_back(reqs_[i].keys[c]), dst.push_back(slot(env, i, c));
    auto layout = kvtier::chunk_layout::owned(
        kvtier::owned_starts(own_, env.comm->rank(), hc, tm_.chunk_tokens), env.ctl[i].hit);
    env.loc[i].load = env.queue->submit(i, keys, dst, std::move(layout), load_dl());
  }

  /// Every rank loaded what it could of request i (loaded_r tokens): agree on the
  /// prefix, move the chunks owner -> all, verify every byte, and queue the rest
  /// of the prompt for compute.
  void finish_load(rank_env& env, std::size_t i, std::uint64_t loaded_r, kvtier::clock::duration took) {
    ctl_state& c = env.ctl[i];
    const std::size_t hc = static_cast<std::size_t>(c.hit / tm_.chunk_tokens);
    kvtier::chunk_span_buffers bufs;
    bufs.sources.resize(hc);
    bufs.destinations.resize(hc);
    for (std::size_t k = 0; k < hc; ++k) {
      bufs.destinations[k] = slot(env, i, k);
      bufs.sources[k] = bufs.destinations[k];  // in place: the owner's loaded chunk is its destination
    }
    kvtier::broadcast_params p{.n_chunks = hc,
                               .chunk_tokens = tm_.chunk_tokens,
                               .chunk_bytes = tm_.chunk_bytes(),
                               .mode = opt_.broadcast,
                               .request_id = i};
    if (opt_.broadcast == kvtier::broadcast_mode::gathered) {
      const std::size_t need = kvtier::gathered_staging_bytes(own_, hc, tm_.chunk_bytes());
      if (env.staging.size() < need) env.staging.resize(need);
      p.staging = std::span<std::byte>(env.staging).first(need);
    }
    const auto r = kvtier::chunk_broadcast(*env.comm, own_, std::min(loaded_r, c.hit), bufs, p, coll_dl());
    env.collectives += r.collectives;
    const std::uint64_t agreed = r.ec ? 0 : r.agreed_tokens;
    // Verify every loaded byte against what recompute would produce.
    std::uint64_t first_bad = agreed;
    std::uint64_t bad = 0;
    for (std::size_t k = 0; k < agreed / tm_.chunk_tokens; ++k) {
      if (!verify_payload(slot(env, i, k), chunk_tokens_of(i, k), k * tm_.chunk_tokens, env.scratch)) {
        ++bad;
        first_bad = std::min<std::uint64_t>(first_bad, k * tm_.chunk_tokens);
      }
    }
    if (bad) mismatches_ += bad;
    const std::uint64_t took_us = static_cast<std::uint64_t>(std::max(0.0, clk_.to_model(took)) * 1e6);
    std::vector<std::uint64_t> v{first_bad, none - took_us, bad ? 0u : 1u};
    all_reduce_min(env, v);
    const std::uint64_t load_us = none - v[1];
    c.cached = std::min(agreed, v[0]);
    c.remaining = reqs_[i].src->tokens.size() - c.cached;
    c.loading = false;
    if (v[2] == 0)
      c.status = "mismatch";
    else if (c.cached < c.hit)
      c.status = "partial";
    else
      c.status = "hit";
    if (c.cached < c.hit && env.lead) ++result_.failed_loads;
    if (env.estimator && c.cached > c.l1_hit) {  // every rank records the same agreed sample
      env.estimator->record(kvtier::kv_gb(static_cast<double>(c.cached - c.l1_hit), tm_.bytes_per_token),
                            static_cast<double>(load_us) * 1e-6);
    }
    if (env.lead) result_.requests[i].load_s = static_cast<double>(load_us) * 1e-6;
    env.ready.push_back(i);
  }

  /// Sync mode: lookup and load request i inside the step (every rank waits).
  void sync_lookup_and_load(rank_env& env, std::size_t i) {
    const auto t = kvtier::clock::now();
    const auto [a, a1] = lookup_answers(env, i, nullptr);
    std::vector<std::uint64_t> v{a, a1};
    all_reduce_min(env, v);
    decide(env, {i}, v);
    if (!env.ctl[i].loading) return;
    const std::size_t hc = static_cast<std::size_t>(env.ctl[i].hit / tm_.chunk_tokens);
    const auto mine = kvtier::owned_chunks(own_, env.comm->rank(), hc);
    std::vector<std::span<std::byte>> dst(hc);
    for (std::size_t c : mine) dst[c] = slot(env, i, c);
    std::vector<kvtier::chunk_status> st(mine.size(), kvtier::chunk_status::error);
    const auto keys = std::span<const kvtier::chunk_key>(reqs_[i].keys).first(hc);
    timed_io(env, [&] { return env.view->get_owned(keys, dst, st, load_dl()); });
    const auto starts = kvtier::owned_starts(own_, env.comm->rank(), hc, tm_.chunk_tokens);
    const std::uint64_t loaded = kvtier::rank_answer(std::span<const std::uint64_t>(starts),
                                                     kvtier::detail::store_hit_view{st}, env.ctl[i].hit);
    finish_load(env, i, loaded, kvtier::clock::now() - t);
  }

  /// Request i finished computing: each rank stores the chunks it owns that it computed.
  void store_computed(rank_env& env, std::size_t i) {
    const ctl_state& c = env.ctl[i];
    const std::size_t from = static_cast<std::size_t>(c.cached / tm_.chunk_tokens), to = reqs_[i].n_chunks();
    std::vector<kvtier::chunk_key> keys;
    std::vector<std::span<const std::byte>> src;
    for (std::size_t k = from; k < to; ++k) {
      if (own_.owner(k) != env.comm->rank()) continue;
      auto s = slot(env, i, k);
      fill_payload(s, chunk_tokens_of(i, k), k * tm_.chunk_tokens);
      keys.push_back(reqs_[i].keys[k]);
      src.emplace_back(s);
    }
    if (!keys.empty()) {
      std::vector<kvtier::chunk_status> st(keys.size());
      if (opt_.mode == load_mode::sync || !opt_.timed) {
        timed_io(env, [&] { return env.tiers->put(keys, src, st, load_dl()); });
      } else {
        (void)env.l1->put(keys, src, st, load_dl());  // host memory
        std::vector<std::vector<std::byte>> copy;
        for (auto s : src) copy.emplace_back(s.begin(), s.end());
        env.writer->push(std::move(keys), std::move(copy));
      }
    }
    env.loc[i] = local{};
  }

  void rank_main(comm_t& comm) {
    const kvtier::rank_t r = comm.rank();
    rank_env env;
    env.comm = &comm;
    env.lead = r == 0;
    env.l1 = l1s_[r];
    env.l2 = l2s_[r];
    tiers_t tiers(*env.l1, *env.l2,
                  kvtier::tiered_options{.writes = kvtier::write_policy::write_through, .promote = false});
    view_t view(tiers, own_, r);
    l1_view_t l1_view(*env.l1, own_, r);
    env.tiers = &tiers;
    env.view = &view;
    env.l1_view = &l1_view;
    kvtier::fetch_queue<tiers_t> queue(tiers, {.workers = opt_.fetch_workers});
    env.queue = &queue;
    detail::write_behind<L2> writer(*env.l2, clk_, opt_.load_timeout_s);
    env.writer = &writer;
    // Optimistic prior (no fixed cost, fast link): the first hits load and teach it.
    kvtier::load_estimator est(kvtier::load_path{.fixed_cost_s = 0, .bandwidth_gb_per_s = 1000});
    env.estimator = &est;
    env.loc.resize(reqs_.size());
    env.ctl.resize(reqs_.size());
    env.scratch.resize(tm_.chunk_bytes());
    try {
      // Time starts once every rank is set up (threads started, stores ready).
      std::vector<std::uint64_t> barrier{0};
      all_reduce_min(env, barrier);
      if (env.lead) clk_.restart(opt_.timed ? tm_.time_scale : 0);
      all_reduce_min(env, barrier);
      loop(env);
    } catch (const std::exception& e) {
      std::lock_guard lock(fatal_mu_);
      if (result_.fatal.empty()) result_.fatal = "rank " + std::to_string(r) + ": " + e.what();
    }
    queue.shutdown();
    writer.close();
    if (env.lead) result_.collectives = env.collectives;
  }

  void loop(rank_env& env) {
    const std::size_t n = reqs_.size();
    const bool cache = opt_.use_cache && opt_.mode != load_mode::recompute;
    std::size_t arrived = 0, completed = 0, next_local = 0;
    auto last_progress = kvtier::clock::now();
    while (completed < n) {
      env.step_stall_ns = 0;
      // 1. Agree on arrivals and on which in-flight lookups/loads finished on every rank.
      const auto now = kvtier::clock::now();
      while (next_local < n && (!opt_.timed || clk_.at(reqs_[next_local].src->t) <= now)) ++next_local;
      std::vector<std::uint64_t> v{next_local};
      for (std::size_t i : env.lookups) v.push_back(queue_done(env, env.loc[i].lookup));
      for (std::size_t i : env.loads) v.push_back(queue_done(env, env.loc[i].load));
      all_reduce_min(env, v);
      std::vector<std::size_t> lookups_done, loads_done, still;
      for (std::size_t k = 0; k < env.lookups.size(); ++k)
        (v[1 + k] ? lookups_done : still).push_back(env.lookups[k]);
      env.lookups.swap(still);
      still.clear();
      for (std::size_t k = 0; k < env.loads.size(); ++k)
        (v[1 + lookups_done.size() + env.lookups.size() + k] ? loads_done : still).push_back(env.loads[k]);
      env.loads.swap(still);

      for (; arrived < v[0]; ++arrived) {
        const std::size_t i = arrived;
        ctl_state& c = env.ctl[i];
        if (env.arrivals++ == 0) env.first_arrival_s = reqs_[i].src->t;
        env.last_arrival_s = reqs_[i].src->t;
        env.offered_work_s += tm_.compute_s(static_cast<double>(reqs_[i].src->tokens.size()));
        if (!cache || reqs_[i].n_chunks() == 0) {
          c.remaining = reqs_[i].src->tokens.size();
          c.status = cache ? "miss" : "recompute";
          env.ready.push_back(i);
        } else if (opt_.mode == load_mode::sync) {
          env.waiting.push_back(i);
        } else {
          auto layout = kvtier::chunk_layout::owned(
              kvtier::owned_starts(own_, env.comm->rank(), reqs_[i].n_chunks(), tm_.chunk_tokens),
              reqs_[i].n_chunks() * tm_.chunk_tokens);
          env.loc[i].lookup =
              env.queue->lookup(i, env.view->owned_keys(reqs_[i].keys), std::move(layout), load_dl());
          env.loc[i].load_started = kvtier::clock::now();
          env.lookups.push_back(i);
        }
      }
      if (!lookups_done.empty()) {
        std::vector<std::uint64_t> answers;
        for (std::size_t i : lookups_done) {
          const auto res = env.queue->poll(env.loc[i].lookup).value();
          const auto [a, a1] = lookup_answers(env, i, &res);
          answers.push_back(a), answers.push_back(a1);
        }
        all_reduce_min(env, answers);
        decide(env, lookups_done, answers);
        for (std::size_t i : lookups_done)
          if (env.ctl[i].loading) start_load(env, i), env.loads.push_back(i);
      }
      for (std::size_t i : loads_done) {
        const auto res = env.queue->poll(env.loc[i].load).value();
        const std::uint64_t loaded = res.state == kvtier::fetch_state::done ? res.answer_tokens : 0;
        // The lookup and the load together are this request's load time.
        finish_load(env, i, loaded, kvtier::clock::now() - env.loc[i].load_started);
      }

      // 2. Schedule a batch, FCFS. Sync mode looks up and loads inside the step.
      const auto step_start = kvtier::clock::now();
      std::vector<std::pair<std::size_t, std::uint64_t>> batch;
      std::size_t tokens = 0;
      std::deque<std::size_t> keep;
      while (tokens < opt_.max_batch_tokens && batch.size() < opt_.max_batch_requests) {
        if (env.ready.empty() && opt_.mode == load_mode::sync && !env.waiting.empty()) {
          const std::size_t i = env.waiting.front();
          env.waiting.pop_front();
          sync_lookup_and_load(env, i);
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
        note_stall(env);
        idle_wait(env, next_local, n);
        continue;
      }
      // 3. Compute (modeled), all ranks together.
      const auto compute_start = kvtier::clock::now();
      const double dur = tm_.compute_s(static_cast<double>(tokens));
      if (opt_.timed) model_clock::sleep_until(compute_start + clk_.real(dur));
      const auto compute_end = kvtier::clock::now();
      if (env.lead) {
        result_.busy_s += dur;
        ++result_.steps;
      }
      // 4. Completions: store owned chunks, record.
      for (auto [i, take] : batch) {
        ctl_state& c = env.ctl[i];
        if (env.lead && !c.started) {
          auto& rr = result_.requests[i];
          rr.queue_s = std::max(0.0, clk_.to_model(compute_start - clk_.start()) - rr.arrival_s - rr.load_s);
        }
        c.started = true;
        c.remaining -= take;
        if (c.remaining > 0) continue;
        store_computed(env, i);
        ++completed;
        if (env.lead) {
          auto& rr = result_.requests[i];
          rr.ttft_s = clk_.to_model(compute_end - clk_.start()) - rr.arrival_s;
          rr.cached_tokens = c.cached;
          rr.l1_tokens = std::min(c.l1_hit, c.cached);
          rr.l2_tokens = c.cached - rr.l1_tokens;
          rr.status = c.status;
        }
      }
      (void)step_start;
      note_stall(env);
      if (env.lead && opt_.progress &&
          kvtier::clock::now() - last_progress > std::chrono::milliseconds(500)) {
        last_progress = kvtier::clock::now();
        std::fprintf(stderr, "\r  [%s] %zu/%zu done, t=%.1f s, loading %zu, ready %zu, waiting %zu   ",
                     to_string(opt_.mode), completed, n, clk_.now(), env.loads.size() + env.lookups.size(),
                     env.ready.size(), env.waiting.size());
      }
    }
    if (env.lead && opt_.progress)
      std::fprintf(stderr, "\r  [%s] %zu/%zu done%40s\n", to_string(opt_.mode), completed, n, "");
  }

  std::uint64_t queue_done(rank_env& env, const kvtier::fetch_handle& h) {
    return env.queue->poll(h).has_value() ? 1 : 0;
  }

  void note_stall(rank_env& env) {
    std::int64_t cur = max_stall_ns_.load();
    while (env.step_stall_ns > cur && !max_stall_ns_.compare_exchange_weak(cur, env.step_stall_ns)) {
    }
  }

  /// Nothing to compute: wait for the next arrival or poll in-flight I/O again soon.
  void idle_wait(const rank_env& env, std::size_t next_local, std::size_t n) const {
    if (!opt_.timed) return;
    auto until = kvtier::clock::now() +
                 std::min<kvtier::clock::duration>(clk_.real(0.01), std::chrono::milliseconds(2));
    if (env.lookups.empty() && env.loads.empty() && next_local < n)
      until = std::max(until, std::min(clk_.at(reqs_[next_local].src->t),
                                       kvtier::clock::now() + std::chrono::milliseconds(20)));
    model_clock::sleep_until(until);
  }

  const std::vector<prepared_request>& reqs_;
  const timing_model& tm_;
  model_clock& clk_;
  engine_options opt_;
  std::vector<modeled_l1*> l1s_;
  std::vector<L2*> l2s_;
  kvtier::modulo_ownership own_;
  run_result result_;
  std::atomic<std::int64_t> max_stall_ns_{0};
  std::atomic<std::uint64_t> mismatches_{0};
  std::mutex fatal_mu_;
};

}  // namespace pcp
