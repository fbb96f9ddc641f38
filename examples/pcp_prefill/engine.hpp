// examples/pcp_prefill/engine.hpp: a context-parallel prefill engine made of
// kvtier components, replaying a trace on a modeled clock.
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
// (fetch_queue, tiered_store, chunk_broadcast, byte checks); the engine waits
// for its real completion, but that real time never enters modeled time. Real
// servers (a store without `modeled_timing`) are timed by the wall clock
// instead: each rank measures its calls and the ranks agree on the maximum.
//
// KV: each rank keeps its KV in a paged host cache (kvtier::host_kv_cache, the
// layout from the timing model: vLLM MLA or FlashAttention NHD). A computed chunk
// is written into the pages and gathered from them before its put; a loaded chunk
// is scattered into them after the broadcast and checked there, gathered back and
// compared with what recompute would produce. Gather/scatter are real CPU work,
// not modeled time.
//
// Deadlines: one deadline per request, set when its lookup is issued
// (load_timeout_s later), covers every rank's lookup and load of that request;
// a rank whose I/O would end past it reports nothing loaded, and the agreed
// prefix recomputes. The collectives that agree on the outcome run after it,
// with their own generous deadline, so a late peer turns into "recompute",
// never into a rank that gave up the agreement while its peer was still in I/O.
//
// Per rank: L1 = modeled_l1, L2 = the caller's store, kvtier::tiered_store
// over both, a kvtier::fetch_queue for lookups and loads of owned chunks
// (c mod W). Lookup answers are kvtier::rank_answer values reduced with a min
// all-reduce; loaded chunks move owner -> all with kvtier::chunk_broadcast;
// kvtier::load_estimator drives `--policy cost` and `--mode split`.
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
#include <concepts>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "kvtier/chunk_broadcast.hpp"
#include "kvtier/chunker.hpp"
#include "kvtier/comm/inproc.hpp"
#include "kvtier/comm/recording.hpp"
#include "kvtier/cost_model.hpp"
#include "kvtier/detail/xxhash.hpp"
#include "kvtier/fetch_queue.hpp"
#include "kvtier/host_kv_cache.hpp"
#include "kvtier/lookup.hpp"
#include "kvtier/ownership.hpp"
#include "kvtier/store/tiered_store.hpp"
#include "model_stores.hpp"
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
  bool use_cache = true;                 ///< false: neither reads nor writes (prime passes keep it on)
  std::size_t max_batch_tokens = 32768;  ///< tokens computed per step
  std::size_t max_batch_requests = 256;  ///< requests per step (vLLM's default max_num_seqs)
  double load_timeout_s =
      10;                   ///< one deadline per request (modeled s), from its lookup, over every rank's I/O
  double cost_slack_s = 0;  ///< --policy cost: also load when predicted at most this much slower
  std::size_t fetch_workers = 8;  ///< fetch_queue threads per rank
  /// grouped: chosen from bench_chunk_broadcast at the real 12.4 MB chunk (gathered copies every byte
  /// twice through staging: 0.48x per_chunk there; grouped 0.83x with at most 1 + W collectives).
  kvtier::broadcast_mode broadcast = kvtier::broadcast_mode::grouped;
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
  bool symmetric_collectives = false;  ///< every rank issued the same collectives in the same order
  std::string fatal;                   ///< non-empty when the run aborted (a collective failed)
};

/// `Comm`: the ranks' communicator. The in-process one runs W rank threads (`run()`);
/// any other runs this process's rank of W processes (`run(comm)`).
template <class L2, kvtier::comm::communicator Comm = kvtier::comm::inproc_communicator>
class engine {
  using tiers_t = kvtier::tiered_store<modeled_l1, L2>;
  using comm_t = Comm;
  using rec_t = kvtier::comm::recording<comm_t&>;  // every rank's collectives, compared after the run
  static constexpr bool modeled = modeled_timing_v<L2>;
  static constexpr std::uint64_t none = std::numeric_limits<std::uint64_t>::max();
  static constexpr double never = std::numeric_limits<double>::infinity();

 public:
  engine(const std::vector<prepared_request>& reqs, const timing_model& tm, engine_options opt,
         std::vector<modeled_l1*> l1s, std::vector<L2*> l2s)
      : reqs_(reqs), tm_(tm), opt_(opt), l1s_(std::move(l1s)), l2s_(std::move(l2s)), own_(opt.world) {}

  /// Thread form: W rank threads over an in-process world.
  run_result run() requires std::is_same_v<Comm, kvtier::comm::inproc_communicator> {
    begin();
    kvtier::comm::inproc_world world(opt_.world);
    kvtier::comm::run_ranks(world, [&](comm_t& c) { rank_main(c); });
    result_.symmetric_collectives =
        std::all_of(calls_.begin(), calls_.end(), [&](const auto& c) { return c == calls_[0]; });
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
    rank_main(comm);
    if (result_.fatal.empty()) combine_over_ranks(comm);
    return finish();
  }

 private:
  /// Replicated per-request control state: every rank holds the same values.
  struct ctl_state {
    std::uint64_t hit = 0, l1_hit = 0, cached = 0, remaining = 0, split = 0;
    double arrival = 0, io_start = 0, deadline = 0;
    double lookup_end = never, load_start = 0, load_end = never;
    bool loading = false, started = false, front = false, front_done = false, loaded = false;
    std::string status;
  };
  /// One rank's own per-request data.
  struct local {
    std::vector<std::byte> buf;  // n_chunks * chunk_bytes: chunk values on their way to/from the store
    kvtier::host_kv_cache::sequence seq;  // the request's blocks in the paged cache (its KV's home)
    std::uint64_t lookup_answer = 0, load_answer = 0;
    kvtier::deadline real_dl{};
  };
  struct rank_env {
    rec_t* comm = nullptr;
    tiers_t* tiers = nullptr;
    modeled_l1* l1 = nullptr;
    kvtier::fetch_queue<tiers_t>* queue = nullptr;
    kvtier::load_estimator* estimator = nullptr;
    l2_timeline* line = nullptr;
    kvtier::host_kv_cache* cache = nullptr;
    std::vector<std::byte> paged_scratch;  // a chunk gathered back from the pages for checking
    std::vector<local> loc;
    std::vector<std::byte> scratch;
    std::vector<std::byte> staging;  // gathered broadcast
    bool lead = false;
    // Replicated state: every rank holds the same values, derived from agreed ones.
    double now = 0;         // the modeled clock
    double step_stall = 0;  // modeled seconds this step waited on store I/O
    std::int64_t step_wall_ns = 0;
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

  // ---- run set-up and results ----------------------------------------------------------

  void begin() {
    result_ = run_result{};
    result_.requests.resize(reqs_.size());
    result_.l2_errors.resize(opt_.world);
    calls_.assign(opt_.world, {});
    max_wall_ns_ = 0, mismatches_ = 0, failed_calls_ = 0;
    for (std::size_t i = 0; i < reqs_.size(); ++i) {
      auto& r = result_.requests[i];
      r.id = reqs_[i].src->id;
      r.prompt_tokens = reqs_[i].src->tokens.size();
    }
  }
  run_result finish() {
    double first = never, last = 0;
    for (const auto& r : result_.requests) {
      first = std::min(first, r.arrival_s);
      last = std::max(last, r.arrival_s + r.ttft_s);
    }
    result_.makespan_s = reqs_.empty() ? 0 : last - first;
    result_.max_step_io_wall_s = static_cast<double>(max_wall_ns_.load()) * 1e-9;
    result_.mismatched_chunks = mismatches_.load();
    result_.failed_l2_calls = failed_calls_.load();
    return std::move(result_);
  }

  /// Process form, after the loop: this rank's counters and first store error combined with
  /// every peer's, and the collective sequences compared by digest. The same collectives on
  /// every rank, unconditionally, on the unrecorded communicator.
  void combine_over_ranks(comm_t& comm) {
    namespace kc = kvtier::comm;
    const kvtier::rank_t me = comm.rank();
    const auto& calls = calls_[me];
    std::vector<std::uint64_t> seq;
    for (const auto& c : calls)
      seq.insert(seq.end(),
                 {static_cast<std::uint64_t>(c.op), c.root, c.bytes, static_cast<std::uint64_t>(c.type),
                  static_cast<std::uint64_t>(c.reduce), c.group_depth});
    const std::uint64_t digest = XXH3_64bits(seq.data(), seq.size() * sizeof(std::uint64_t));
    // min of x and of ~x gives min and max: equal on every rank iff the digests are.
    std::uint64_t mins[5] = {digest, ~digest, calls.size(), ~static_cast<std::uint64_t>(calls.size()),
                             none - static_cast<std::uint64_t>(max_wall_ns_.load())};
    std::uint64_t sums[2] = {mismatches_.load(), failed_calls_.load()};
    constexpr std::size_t err_bytes = 240;  // a rank's first store error, cut to this length
    std::vector<char> mine(err_bytes, '\0'), all(err_bytes * opt_.world);
    const std::string& e = result_.l2_errors[me];
    std::copy_n(e.begin(), std::min(e.size(), err_bytes - 1), mine.begin());
    auto check = [&](std::error_code ec, const char* what) {
      if (ec) throw std::runtime_error(std::string("engine: ") + what + " over ranks: " + comm.last_error());
    };
    const auto dl = coll_dl();
    check(kc::all_reduce(comm, std::span<const std::uint64_t>(mins), std::span<std::uint64_t>(mins),
                         kc::reduce_op::min, dl),
          "min");
    check(kc::all_reduce(comm, std::span<const std::uint64_t>(sums), std::span<std::uint64_t>(sums),
                         kc::reduce_op::sum, dl),
          "sum");
    check(comm.all_gather(std::as_bytes(std::span(mine)), std::as_writable_bytes(std::span(all)), dl),
          "all-gather of store errors");
    result_.symmetric_collectives = mins[0] == ~mins[1] && mins[2] == ~mins[3];
    max_wall_ns_ = static_cast<std::int64_t>(none - mins[4]);
    mismatches_ = sums[0];
    failed_calls_ = sums[1];
    for (kvtier::rank_t r = 0; r < opt_.world; ++r)
      result_.l2_errors[r] = std::string(all.data() + r * err_bytes);
  }

  // ---- helpers --------------------------------------------------------------------

  static kvtier::deadline coll_dl() { return kvtier::clock::now() + std::chrono::seconds(300); }
  /// The real deadline of a request's I/O: modeled stores take no real time, so a
  /// generous one; real servers get the request's own (load_timeout_s of wall time).
  kvtier::deadline real_dl(const rank_env& env, std::size_t i) const {
    return modeled ? kvtier::clock::now() + std::chrono::seconds(60) : env.loc[i].real_dl;
  }

  void all_reduce_min(rank_env& env, std::vector<std::uint64_t>& v) {
    if (v.empty()) return;
    ++env.collectives;
    if (auto ec =
            kvtier::comm::all_reduce(*env.comm, std::span<const std::uint64_t>(v),
                                     std::span<std::uint64_t>(v), kvtier::comm::reduce_op::min, coll_dl()))
      throw std::runtime_error("all_reduce failed: " + ec.message() + ": " + env.comm->last_error());
  }
  /// Real servers: the ranks' measured durations (seconds) -> the longest of each.
  std::vector<double> agree_max_s(rank_env& env, const std::vector<double>& mine) {
    std::vector<std::uint64_t> v;
    for (double d : mine) v.push_back(none - static_cast<std::uint64_t>(std::max(0.0, d) * 1e9));
    all_reduce_min(env, v);
    std::vector<double> out;
    for (auto x : v) out.push_back(static_cast<double>(none - x) * 1e-9);
    return out;
  }

  /// Runs a store call of the step thread, timing its real duration.
  template <class F>
  auto step_io(rank_env& env, F&& f) {
    const auto t = kvtier::clock::now();
    auto r = f();
    env.step_wall_ns +=
        std::chrono::duration_cast<std::chrono::nanoseconds>(kvtier::clock::now() - t).count();
    return r;
  }
  /// The step waits for an I/O that ends at modeled time `end`: the clock moves
  /// there and the wait counts as stall. Every wait on I/O goes through here.
  void wait_io(rank_env& env, double end) {
    if (end > env.now) env.step_stall += end - env.now, env.now = end;
  }
  void note_error(rank_env& env, const std::error_code& ec, const char* what) {
    if (!ec) return;
    ++failed_calls_;
    std::lock_guard lock(fatal_mu_);
    std::string& e = result_.l2_errors[env.comm->rank()];
    if (!e.empty()) return;
    e = std::string(what) + ": " + ec.message();
    // A store that keeps its last failure in words (the server's or OpenSSL's) says why.
    if constexpr (requires(const L2& s) {
                    { s.last_error() } -> std::convertible_to<std::string>;
                  }) {
      const std::string why = l2s_[env.comm->rank()]->last_error();
      if (!why.empty() && why != ec.message()) e += " (" + why + ")";
    }
  }

  std::span<std::byte> slot(rank_env& env, std::size_t i, std::size_t c) {
    local& l = env.loc[i];
    const std::size_t cb = tm_.chunk_bytes();
    if (l.buf.size() != reqs_[i].n_chunks() * cb) l.buf.assign(reqs_[i].n_chunks() * cb, std::byte{0});
    return std::span<std::byte>(l.buf).subspan(c * cb, cb);
  }
  /// Blocks for request i's first `tokens` positions in the paged cache. Every rank reserves
  /// the same tokens for the same requests in the same order, so all ranks agree on failure.
  void reserve_pages(rank_env& env, std::size_t i, std::uint64_t tokens) {
    if (!env.cache->reserve(env.loc[i].seq, tokens))
      throw std::runtime_error("paged KV cache full (" + std::to_string(env.cache->layout().num_blocks) +
                               " blocks of " + std::to_string(tm_.kv_block_tokens) +
                               " tokens): raise --kv-cache-tokens");
  }
  /// Chunk value `v` (chunk c of request i) into the request's pages, or the pages back into `v`.
  void to_pages(rank_env& env, std::size_t i, std::size_t c, std::span<const std::byte> v) {
    if (auto ec = env.cache->scatter(env.loc[i].seq, c * tm_.chunk_tokens, tm_.chunk_tokens, v))
      throw std::runtime_error("paged KV scatter: " + ec.message());
  }
  void from_pages(rank_env& env, std::size_t i, std::size_t c, std::span<std::byte> v) {
    if (auto ec = env.cache->gather(env.loc[i].seq, c * tm_.chunk_tokens, tm_.chunk_tokens, v))
      throw std::runtime_error("paged KV gather: " + ec.message());
  }
  std::span<const std::uint32_t> chunk_tokens_of(std::size_t i, std::size_t c) const {
    return std::span<const std::uint32_t>(reqs_[i].src->tokens)
        .subspan(c * tm_.chunk_tokens, tm_.chunk_tokens);
  }
  /// Chunks of [c0, c1) that `rank` owns.
  std::size_t owned_in(kvtier::rank_t rank, std::size_t c0, std::size_t c1) const {
    std::size_t k = 0;
    for (std::size_t c = c0; c < c1; ++c) k += own_.owner(c) == rank;
    return k;
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

  double arrival_at(const rank_env& env, std::size_t j) const {
    if (!opt_.timed) return 0;
    const std::size_t c = opt_.closed_loop_clients;
    if (c == 0) return reqs_[j].src->t;
    if (j < c) return 0;
    return j - c < env.completions.size() ? env.completions[j - c] : never;
  }

  // ---- modeled I/O times (replicated: every rank books every rank's I/O) --------------

  /// Every rank's lookup of request i's owned keys, issued at `at`: the end of the slowest.
  double model_lookup(rank_env& env, std::size_t i, double at) {
    if (!modeled || !has_l2()) return at;
    double end = at;
    for (kvtier::rank_t r = 0; r < opt_.world; ++r) {
      const double keys = static_cast<double>(owned_in(r, 0, reqs_[i].n_chunks()));
      end = std::max(end, env.line->serve(r, at + tm_.l2_rtt_s, keys * tm_.l2_key_s));
    }
    return end;
  }
  /// Every rank's load of its owned chunks in [c0, c1) (those below c_l1 from L1), issued
  /// at `at`: each rank's end, in rank order.
  std::vector<double> model_load(rank_env& env, std::size_t c0, std::size_t c1, std::size_t c_l1, double at) {
    std::vector<double> end(opt_.world, at);
    const double cb = tm_.chunk_model_bytes();
    for (kvtier::rank_t r = 0; r < opt_.world; ++r) {
      const double from_l1 = static_cast<double>(owned_in(r, c0, std::max(c0, std::min(c1, c_l1)))) * cb;
      const double from_l2 = static_cast<double>(owned_in(r, std::max(c0, c_l1), c1)) * cb;
      const double after_l1 = at + tm_.l1_load_s(from_l1);
      end[r] = from_l2 > 0 && has_l2() ? env.line->serve(r, after_l1 + tm_.l2_t0_s, tm_.l2_hold_s(from_l2))
                                       : after_l1;
    }
    return end;
  }
  /// Every rank's write-back of its owned chunks in [c0, c1) at `at`: the end of the slowest.
  double model_writeback(rank_env& env, std::size_t c0, std::size_t c1, double at) {
    double end = at;
    for (kvtier::rank_t r = 0; r < opt_.world; ++r) {
      const double bytes = static_cast<double>(owned_in(r, c0, c1)) * tm_.chunk_model_bytes();
      if (bytes > 0 && has_l2())
        end = std::max(end, env.line->serve(r, at + tm_.l2_t0_s, tm_.l2_hold_s(bytes)));
    }
    return end;
  }
  static constexpr bool has_l2() { return !std::is_same_v<L2, null_store>; }

  // ---- lookups ------------------------------------------------------------------------

  /// Issues the lookups of requests `ids` at the current modeled time and sets
  /// their modeled end (their real I/O has finished when this returns).
  void issue_lookups(rank_env& env, const std::vector<std::size_t>& ids) {
    if (ids.empty()) return;
    if (!modeled) {  // one real deadline per request, from an agreed instant (the latest rank's now)
      std::vector<double> t0 = agree_max_s(
          env, std::vector<double>(
                   1, std::chrono::duration<double>(kvtier::clock::now().time_since_epoch()).count()));
      const auto at = kvtier::clock::time_point(
          std::chrono::duration_cast<kvtier::clock::duration>(std::chrono::duration<double>(t0[0])));
      for (std::size_t i : ids)
        env.loc[i].real_dl = at + std::chrono::duration_cast<kvtier::clock::duration>(
                                      std::chrono::duration<double>(opt_.load_timeout_s));
    }
    const kvtier::rank_t me = env.comm->rank();
    std::vector<kvtier::fetch_handle> hs;
    std::vector<kvtier::clock::time_point> began;
    for (std::size_t i : ids) {
      ctl_state& c = env.ctl[i];
      c.io_start = env.now;
      c.deadline = env.now + opt_.load_timeout_s;
      std::vector<kvtier::chunk_key> keys;
      for (std::size_t k = 0; k < reqs_[i].n_chunks(); ++k)
        if (own_.owner(k) == me) keys.push_back(reqs_[i].keys[k]);
      began.push_back(kvtier::clock::now());
      hs.push_back(env.queue->lookup(i, keys,
                                     kvtier::chunk_layout::owned(owned_starts_in(me, 0, reqs_[i].n_chunks()),
                                                                 reqs_[i].n_chunks() * tm_.chunk_tokens),
                                     real_dl(env, i)));
    }
    std::vector<double> took;
    for (std::size_t k = 0; k < ids.size(); ++k) {
      const std::size_t i = ids[k];
      const auto res = completed(env, hs[k], real_dl(env, i));
      took.push_back(std::chrono::duration<double>(kvtier::clock::now() - began[k]).count());
      note_error(env, res.ec, "lookup");
      const bool ok = res.state == kvtier::fetch_state::done;
      env.loc[i].lookup_answer = ok ? res.answer_tokens : first_start(me, 0, reqs_[i].n_chunks());
    }
    if (!modeled) took = agree_max_s(env, took);
    for (std::size_t k = 0; k < ids.size(); ++k) {
      ctl_state& c = env.ctl[ids[k]];
      const double end = modeled ? model_lookup(env, ids[k], env.now) : env.now + took[k];
      // Past the request's deadline the lookup counts as failed: nothing cached.
      if (end > c.deadline) env.loc[ids[k]].lookup_answer = first_start(me, 0, reqs_[ids[k]].n_chunks());
      c.lookup_end = std::min(end, c.deadline);
      env.costs.lookup_s += c.lookup_end - env.now;
      ++env.costs.lookups;
    }
  }
  /// The result of a submitted fetch. Its store calls end by `dl`; should the result still
  /// be missing a while after that, the fetch is cancelled and waited for, because the
  /// request's buffers may be reused only once it has completed (a running call is not stopped).
  kvtier::fetch_result completed(rank_env& env, const kvtier::fetch_handle& h, kvtier::deadline dl) {
    if (auto r = env.queue->wait(h, dl + std::chrono::seconds(5))) return *std::move(r);
    env.queue->cancel(h);
    if (auto r = env.queue->wait(h, kvtier::clock::now() + std::chrono::seconds(60))) return *std::move(r);
    throw std::runtime_error("fetch_queue: a cancelled fetch did not complete within 60 s");
  }

  /// A rank's answer when it found nothing in [c0, c1): its first owned start, or the end.
  std::uint64_t first_start(kvtier::rank_t rank, std::size_t c0, std::size_t c1) const {
    for (std::size_t c = c0; c < c1; ++c)
      if (own_.owner(c) == rank) return static_cast<std::uint64_t>(c) * tm_.chunk_tokens;
    return static_cast<std::uint64_t>(c1) * tm_.chunk_tokens;
  }
  /// This rank's L1 answer for request i (host memory; part of the lookup).
  std::uint64_t l1_answer(rank_env& env, std::size_t i) {
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

  /// The lookups of `done` (in this order) finished on every rank: agree on their
  /// answers, decide load / split / recompute, and start the loads.
  void decide(rank_env& env, const std::vector<std::size_t>& done) {
    std::vector<std::uint64_t> v;
    for (std::size_t i : done) v.push_back(env.loc[i].lookup_answer), v.push_back(l1_answer(env, i));
    all_reduce_min(env, v);
    const double g = static_cast<double>(opt_.world) * tm_.chunk_tokens;  // one round of owners
    const kvtier::load_path configured{.fixed_cost_s = tm_.l2_t0_s,
                                       .bandwidth_gb_per_s = tm_.l2_total_gbps(opt_.world)};
    for (std::size_t k = 0; k < done.size(); ++k) {
      const std::size_t i = done[k];
      ctl_state& c = env.ctl[i];
      const double n = static_cast<double>(reqs_[i].src->tokens.size());
      c.hit = v[2 * k];
      c.l1_hit = std::min(v[2 * k + 1], c.hit);
      if (env.lead) result_.requests[i].lookup_tokens = c.hit;
      bool load = c.hit > 0;
      const double l2_part = static_cast<double>(c.hit - c.l1_hit);
      const double tokens = l2_part > 0 ? l2_part : static_cast<double>(c.hit);
      if (load && opt_.mode == load_mode::split) {
        const auto plan = env.estimator->split(tm_.node(), static_cast<double>(c.hit), n, g);
        c.split = std::min<std::uint64_t>(c.hit, static_cast<std::uint64_t>(plan.k_tokens));
        if (env.lead && modeled && has_l2())
          result_.requests[i].predicted_s =
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
        result_.requests[i].predicted_s =
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

  // ---- loads --------------------------------------------------------------------------

  /// Starts the loads of `ids` (owned chunks in [split, hit)) at the current modeled
  /// time and sets their modeled end (their real I/O has finished when this returns).
  void start_loads(rank_env& env, const std::vector<std::size_t>& ids) {
    if (ids.empty()) return;
    const kvtier::rank_t me = env.comm->rank();
    std::vector<kvtier::fetch_handle> hs;
    std::vector<kvtier::clock::time_point> began;
    for (std::size_t i : ids) {
      const ctl_state& c = env.ctl[i];
      const std::size_t c0 = chunks(c.split), c1 = chunks(c.hit);
      std::vector<kvtier::chunk_key> keys;
      std::vector<std::span<std::byte>> dst;
      for (std::size_t k = c0; k < c1; ++k)
        if (own_.owner(k) == me) keys.push_back(reqs_[i].keys[k]), dst.push_back(slot(env, i, k));
      began.push_back(kvtier::clock::now());
      hs.push_back(env.queue->submit(
          i, keys, dst, kvtier::chunk_layout::owned(owned_starts_in(me, c0, c1), c.hit), real_dl(env, i)));
    }
    std::vector<double> took;
    for (std::size_t k = 0; k < ids.size(); ++k) {
      const std::size_t i = ids[k];
      const ctl_state& c = env.ctl[i];
      const auto res = completed(env, hs[k], real_dl(env, i));
      took.push_back(std::chrono::duration<double>(kvtier::clock::now() - began[k]).count());
      note_error(env, res.ec, "load");
      const bool ok = res.state == kvtier::fetch_state::done;
      env.loc[i].load_answer = ok ? res.answer_tokens : first_start(me, chunks(c.split), chunks(c.hit));
    }
    if (!modeled) took = agree_max_s(env, took);
    for (std::size_t k = 0; k < ids.size(); ++k) {
      const std::size_t i = ids[k];
      ctl_state& c = env.ctl[i];
      c.load_start = env.now;
      double end = env.now + (modeled ? 0.0 : took[k]);
      if (modeled) {
        const auto ends = model_load(env, chunks(c.split), chunks(c.hit), chunks(c.l1_hit), env.now);
        end = *std::max_element(ends.begin(), ends.end());
        if (ends[me] > c.deadline) env.loc[i].load_answer = first_start(me, chunks(c.split), chunks(c.hit));
      } else if (end > c.deadline) {
        env.loc[i].load_answer = first_start(me, chunks(c.split), chunks(c.hit));
      }
      c.load_end = std::min(end, c.deadline);  // past the deadline the engine stops waiting
      env.costs.load_s += c.load_end - c.load_start;
      ++env.costs.loads;
      if (opt_.mode != load_mode::sync) env.loads.push_back(i);
    }
  }

  /// Every rank loaded what it could of request i: agree on the prefix, move the
  /// chunks owner -> all (modeled interconnect time on the step), verify every
  /// byte, and queue what is left of the prompt for compute.
  void finish_load(rank_env& env, std::size_t i) {
    ctl_state& c = env.ctl[i];
    const std::size_t c0 = chunks(c.split), c1 = chunks(c.hit), n = c1 - c0;
    kvtier::chunk_span_buffers bufs;
    bufs.sources.resize(n);
    bufs.destinations.resize(n);
    for (std::size_t k = 0; k < n; ++k) {
      bufs.destinations[k] = slot(env, i, c0 + k);
      bufs.sources[k] = bufs.destinations[k];  // in place: the owner's loaded chunk is its destination
    }
    // The split point is a multiple of W chunks, so chunk c0 + k has the owner of chunk k.
    kvtier::broadcast_params p{.n_chunks = n,
                               .chunk_tokens = tm_.chunk_tokens,
                               .chunk_bytes = tm_.chunk_bytes(),
                               .mode = opt_.broadcast,
                               .request_id = kvtier::load_id{i}};
    if (opt_.broadcast == kvtier::broadcast_mode::gathered) {
      const std::size_t need = kvtier::gathered_staging_bytes(own_, n, tm_.chunk_bytes());
      if (env.staging.size() < need) env.staging.resize(need);
      p.staging = std::span<std::byte>(env.staging).first(need);
    }
    const std::uint64_t loaded = std::clamp(env.loc[i].load_answer, c.split, c.hit) - c.split;
    const auto r = kvtier::chunk_broadcast(*env.comm, own_, loaded, bufs, p, coll_dl());
    env.collectives += r.collectives;
    const std::uint64_t agreed = c.split + (r.ec ? 0 : r.agreed_tokens);
    // Modeled interconnect time: what the busiest receiver got, plus the collectives' latency.
    std::size_t received = 0;
    for (kvtier::rank_t q = 0; q < opt_.world; ++q)
      received = std::max(received, (chunks(agreed) - c0) - owned_in(q, c0, chunks(agreed)));
    const double bcast =
        tm_.broadcast_s(static_cast<double>(received) * tm_.chunk_model_bytes(), r.collectives);
    env.now += bcast;
    env.costs.broadcast_s += bcast;
    ++env.costs.broadcasts;
    // The agreed chunks go into the request's pages (scatter), where its KV lives from now on;
    // every loaded byte is then checked there, in the paged layout, against what recompute
    // would produce (each chunk gathered back from the pages). Real CPU work, not modeled time.
    reserve_pages(env, i, agreed);
    for (std::size_t k = c0; k < chunks(agreed); ++k) to_pages(env, i, k, slot(env, i, k));
    if (i == opt_.corrupt_paged_request && env.comm->rank() == opt_.corrupt_paged_rank &&
        chunks(agreed) > c0) {
      auto v = std::span<std::byte>(env.paged_scratch);
      from_pages(env, i, c0, v);
      v[v.size() / 2] ^= std::byte{0x01};
      to_pages(env, i, c0, v);
    }
    std::vector<std::byte>().swap(env.loc[i].buf);  // the chunk values are no longer needed
    std::uint64_t first_bad = agreed;
    std::uint64_t bad = 0;
    for (std::size_t k = c0; k < chunks(agreed); ++k) {
      from_pages(env, i, k, env.paged_scratch);
      if (!verify_payload(env.paged_scratch, chunk_tokens_of(i, k), k * tm_.chunk_tokens, env.scratch)) {
        ++bad;
        first_bad = std::min<std::uint64_t>(first_bad, k * tm_.chunk_tokens);
      }
    }
    if (bad) mismatches_ += bad;
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
    if (c.cached < c.hit && env.lead) ++result_.failed_loads;
    const std::uint64_t l2_from = std::max(c.split, c.l1_hit);
    if (env.estimator && c.cached > l2_from &&
        c.load_end > c.load_start)  // every rank records the same sample
      env.estimator->record(kvtier::kv_gb(static_cast<double>(c.cached - l2_from), tm_.bytes_per_token),
                            c.load_end - c.load_start);
    if (env.lead) result_.requests[i].load_s = c.load_end - c.io_start;
    if (!c.front || c.front_done) {
      c.front = false;
      c.remaining = reqs_[i].src->tokens.size() - c.cached;
      env.ready.push_back(i);
    }
  }

  /// Sync mode: lookup and load request i inside the step (every rank waits).
  void sync_lookup_and_load(rank_env& env, std::size_t i) {
    issue_lookups(env, {i});
    wait_io(env, env.ctl[i].lookup_end);
    decide(env, {i});
    if (!env.ctl[i].loaded && env.ctl[i].loading) {
      wait_io(env, env.ctl[i].load_end);
      finish_load(env, i);
    }
  }

  /// Request i finished computing: each rank stores the chunks it owns that it
  /// computed (L1 and L2, write-through). Sync: the step waits for the write-back.
  void store_computed(rank_env& env, std::size_t i) {
    const ctl_state& c = env.ctl[i];
    // Chunks below the hit are in L2 already (a load cut short or a recompute by policy
    // leaves them there), except a mismatched one, which is overwritten with good bytes.
    const std::size_t from = chunks(c.status == "mismatch" ? c.cached : std::max(c.cached, c.hit));
    const std::size_t to = reqs_[i].n_chunks();
    std::vector<kvtier::chunk_key> keys;
    std::vector<std::span<const std::byte>> src;
    if (from < to) reserve_pages(env, i, static_cast<std::uint64_t>(to) * tm_.chunk_tokens);
    for (std::size_t k = from; k < to; ++k) {
      if (own_.owner(k) != env.comm->rank()) continue;
      auto s = slot(env, i, k);
      // Compute writes the chunk's KV into the pages; the value stored is gathered from them.
      fill_payload(env.paged_scratch, chunk_tokens_of(i, k), k * tm_.chunk_tokens);
      to_pages(env, i, k, env.paged_scratch);
      from_pages(env, i, k, s);
      keys.push_back(reqs_[i].keys[k]);
      src.emplace_back(s);
    }
    const auto t = kvtier::clock::now();
    if (!keys.empty()) {
      std::vector<kvtier::chunk_status> st(keys.size());
      // A write-back is not part of the request's load: its own deadline.
      const auto dl =
          kvtier::clock::now() + (modeled ? kvtier::clock::duration(std::chrono::seconds(60))
                                          : std::chrono::duration_cast<kvtier::clock::duration>(
                                                std::chrono::duration<double>(opt_.load_timeout_s)));
      note_error(env, step_io(env, [&] { return env.tiers->put(keys, src, st, dl); }), "store");
    }
    if (from < to && opt_.timed) {
      double end = env.now;
      if (modeled)
        end = model_writeback(env, from, to, env.now);
      else if (opt_.mode == load_mode::sync)  // agreed by every rank, so only where it is waited for
        end =
            env.now + agree_max_s(env, {std::chrono::duration<double>(kvtier::clock::now() - t).count()})[0];
      env.costs.writeback_s += end - env.now;
      env.costs.writebacks += has_l2() || !modeled;
      if (opt_.mode == load_mode::sync) wait_io(env, end);
    }
    env.cache->release(env.loc[i].seq);
    env.loc[i] = local{};
  }

  // ---- the rank's loop ----------------------------------------------------------------

  void rank_main(comm_t& inner) {
    const kvtier::rank_t r = inner.rank();
    rec_t comm(inner);
    rank_env env;
    env.comm = &comm;
    env.lead = r == 0;
    env.l1 = l1s_[r];
    tiers_t tiers(*env.l1, *l2s_[r],
                  kvtier::tiered_options{.writes = kvtier::write_policy::write_through, .promote = false});
    env.tiers = &tiers;
    kvtier::fetch_queue<tiers_t> queue(tiers, {.workers = opt_.fetch_workers});
    env.queue = &queue;
    l2_timeline line(tm_);
    env.line = &line;
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
    try {
      loop(env);
    } catch (const std::exception& e) {
      std::lock_guard lock(fatal_mu_);
      if (result_.fatal.empty()) result_.fatal = "rank " + std::to_string(r) + ": " + e.what();
    }
    queue.shutdown();
    {
      std::lock_guard lock(fatal_mu_);
      calls_[r] = comm.calls();
    }
    if (env.lead) {
      result_.collectives = env.collectives;
      result_.costs = env.costs;
    }
  }

  void admit(rank_env& env, std::size_t i, bool cache, std::vector<std::size_t>& lookups) {
    ctl_state& c = env.ctl[i];
    c.arrival = arrival_at(env, i);
    if (env.lead) result_.requests[i].arrival_s = c.arrival;
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
  void process_io(rank_env& env) {
    auto take_done = [&](std::vector<std::size_t>& pending, double ctl_state::*end) {
      std::vector<std::size_t> done, still;
      for (std::size_t i : pending) (env.ctl[i].*end <= env.now ? done : still).push_back(i);
      pending.swap(still);
      std::stable_sort(done.begin(), done.end(),
                       [&](std::size_t a, std::size_t b) { return env.ctl[a].*end < env.ctl[b].*end; });
      return done;
    };
    const auto lookups_done = take_done(env.lookups, &ctl_state::lookup_end);
    if (!lookups_done.empty()) decide(env, lookups_done);
    for (std::size_t i : take_done(env.loads, &ctl_state::load_end)) {
      wait_io(env, env.ctl[i].load_end);  // already ended: an async step never waits here
      finish_load(env, i);
    }
  }

  double next_event(const rank_env& env, std::size_t admitted) const {
    double t = admitted < reqs_.size() ? arrival_at(env, admitted) : never;
    for (std::size_t i : env.lookups) t = std::min(t, env.ctl[i].lookup_end);
    for (std::size_t i : env.loads) t = std::min(t, env.ctl[i].load_end);
    return t;
  }

  void loop(rank_env& env) {
    const std::size_t n = reqs_.size();
    const bool cache = opt_.use_cache && opt_.mode != load_mode::recompute;
    std::size_t admitted = 0, completed = 0;
    auto last_progress = kvtier::clock::now();
    while (completed < n) {
      env.step_stall = 0;
      env.step_wall_ns = 0;
      env.line->prune(env.now);
      // 1. Arrivals up to now (their lookups are issued at once), then finished I/O.
      std::vector<std::size_t> new_lookups;
      while (admitted < n && arrival_at(env, admitted) <= env.now) admit(env, admitted++, cache, new_lookups);
      issue_lookups(env, new_lookups);
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
        note_step(env);
        const double t = next_event(env, admitted);
        if (t == never) throw std::runtime_error("engine: nothing to compute and no event pending");
        env.now = std::max(env.now, t);
        continue;
      }
      // 3. Compute (modeled), all ranks together.
      const double compute_start = env.now;
      const double dur = tm_.compute_s(static_cast<double>(tokens));
      env.now += dur;
      env.costs.compute_s += dur;
      if (env.lead) {
        result_.busy_s += dur;
        ++result_.steps;
      }
      // 4. Completions: store owned chunks, record.
      for (auto [i, take] : batch) {
        ctl_state& c = env.ctl[i];
        if (env.lead && !c.started) {
          auto& rr = result_.requests[i];
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
        const double done_at = env.now;
        store_computed(env, i);
        ++completed;
        env.completions.push_back(done_at);
        if (env.lead) {
          auto& rr = result_.requests[i];
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
                     to_string(opt_.mode), completed, n, env.now, env.loads.size() + env.lookups.size(),
                     env.ready.size(), env.waiting.size());
      }
    }
    if (env.lead && opt_.progress)
      std::fprintf(stderr, "\r  [%s] %zu/%zu done%40s\n", to_string(opt_.mode), completed, n, "");
  }

  void note_step(rank_env& env) {
    if (env.lead) result_.max_io_stall_s = std::max(result_.max_io_stall_s, env.step_stall);
    std::int64_t cur = max_wall_ns_.load();
    while (env.step_wall_ns > cur && !max_wall_ns_.compare_exchange_weak(cur, env.step_wall_ns)) {
    }
  }

  const std::vector<prepared_request>& reqs_;
  const timing_model& tm_;
  engine_options opt_;
  std::vector<modeled_l1*> l1s_;
  std::vector<L2*> l2s_;
  kvtier::modulo_ownership own_;
  run_result result_;
  std::atomic<std::int64_t> max_wall_ns_{0};
  std::atomic<std::uint64_t> mismatches_{0};
  std::atomic<std::uint64_t> failed_calls_{0};
  std::vector<std::vector<kvtier::comm::collective_call>> calls_;
  std::mutex fatal_mu_;
};

}  // namespace pcp
