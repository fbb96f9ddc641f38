// kvtier/connector.hpp: the request lifecycle an engine's KV connector follows, built from
// kvtier's parts (chunker, ownership, fetch_queue, the agreement of chunk_broadcast, kv_scatter).
//
// One connector per rank. Every rank calls the scheduler-side functions for the same requests
// in the same order, and step() once per engine step; the connector turns that into symmetric
// collectives that only agreed values decide:
//
//   kvtier::connector conn(chunker, kvtier::modulo_ownership(W), store, ctrl, data, cache.view(),
//                          {.policy = kvtier::load_policy::always});
//   conn.check_deployment(kvtier::deadline_after(5s));   // once: every rank configured alike
//   conn.begin_lookup(id, tokens);                  // never blocks: the owners ask their stores
//   conn.step(kvtier::deadline_after(50ms));        // once per engine step, on every rank
//   if (auto plan = conn.lookup(id)) {              // empty until every rank's answer is agreed
//     cache.reserve(seq, tokens.size());
//     if (plan->tokens_to_load()) conn.load(id, slots_of(seq));   // owners fetch, bytes move
//   }
//   conn.step(dl);  conn.wait_for_layer(l, dl);     // layer l of every loading chunk is in pages
//   if (auto out = conn.load_result(id)) compute_from(out->loaded_end_token);  // agreed on all ranks
//   conn.save(id, slots_of(seq), 0, tokens.size()); // owners write their chunks, off the step
//   if (!conn.finish(id).free_pages_now) ...        // free once finished() lists its saves
//
// The step. step(dl) issues exactly one all-reduce on the control communicator for everything
// that is waiting for agreement: each lookup (ready?, this rank's answer), each load (fetched
// prefix, the most it can still reach, chunks in pages, failure flag, time taken). What it
// agrees then decides everything else, the same on every rank: a lookup's plan (after the
// policy), the chunks that move owner -> every rank (one grouped broadcast per layer group on
// the data communicator, landing in connector-owned staging, then kv_scatter of that layer
// group into the pages), and a load's outcome. A timeout, a store error, a corrupt value, a
// failed move or a peer that stalls past a deadline only shortens an agreed prefix
// ("recompute from here"); no rank ever reports a prefix its peers did not agree on. A failed
// agreement ends every waiting lookup with nothing cached and every running load with
// nothing loaded, on every rank (in-process rounds fail together; on MPI a failed rank's peers
// fail their next step by its deadline).
//
// Layer by layer. With a data communicator distinct from the control one, a mover thread
// runs the broadcasts and scatters while the engine computes; wait_for_layer(l, dl) returns
// once layer l of every chunk agreed so far is in this rank's pages. With one communicator
// the moves run inside step().
//
// Staging. A load's chunk values land in one staging block the connector owns; it lives until
// nothing can write it any more: a load cut short by its deadline leaves its block in
// quarantine until its fetch has completed, and the block is never reused before that.
//
// Blocking: begin_lookup, lookup, load, save, finish, finished, load_result, load_errors and
// drain_events never block (load and finish may wait for one scatter of one layer group to
// end); step, wait_for_layer and wait_local take a deadline.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <system_error>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "kvtier/chunker.hpp"
#include "kvtier/comm/communicator.hpp"
#include "kvtier/cost_model.hpp"
#include "kvtier/deadline.hpp"
#include "kvtier/deployment_check.hpp"
#include "kvtier/detail/connector_state.hpp"
#include "kvtier/errc.hpp"
#include "kvtier/fetch_queue.hpp"
#include "kvtier/kv_copy.hpp"
#include "kvtier/kv_layout.hpp"
#include "kvtier/lookup.hpp"
#include "kvtier/metrics.hpp"
#include "kvtier/ownership.hpp"
#include "kvtier/store/chunk_store.hpp"

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
  prefill_node node{};           ///< cost and split: KV bytes per token, prefill speed
  load_path prior{0.001, 1.0};   ///< the estimator's prior (T0 s, GB/s), e.g. from a probe
  load_timeout load_deadline{};  ///< per load, from load()
  std::chrono::milliseconds lookup_timeout{50};
  std::chrono::milliseconds save_timeout{2000};
  save_policy saves = save_policy::write_through;
  std::uint32_t save_after_lookups = 2;  ///< selective: lookups of a chunk before it is saved
  std::uint32_t layers_per_group = 0;    ///< layers moved and scattered together (0: all)
  std::size_t max_bytes_in_flight = std::size_t{1} << 30;  ///< staging of running loads
  std::size_t fetch_workers = 2;
  std::size_t fetch_batch_chunks = 1;  ///< keys per store call (progress granularity; 0: one call)
  kvtier::metrics* metrics = nullptr;  ///< shared with the fetch queue (optional)
};

/// What a request's agreed lookup says to do: load tokens [load_first_token, load_end_token);
/// tokens below load_first_token are computed (split mode), and so is everything past the end.
struct load_plan {
  std::uint64_t cached_tokens = 0;  ///< the agreed cached prefix, before the policy
  std::uint64_t load_first_token = 0;
  std::uint64_t load_end_token = 0;
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

struct finish_result {
  bool free_pages_now = true;  ///< false: saves still read the pages; wait for finished()
};

/// Requests whose work ended since the previous finished() call.
struct finished_requests {
  std::vector<request_id> loads;  ///< load outcome agreed (load_result has a value)
  std::vector<request_id> saves;  ///< finished, and every save ended: free the pages
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
};

/// Appends the connector's counters in the Prometheus text format, as write_prometheus does.
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
                                                        {"quarantined_blocks_total", &c.quarantined_blocks}};
  for (const auto& [name, ctr] : all) {
    detail::store_prom_header(out, prefix, name, "counter", "kvtier connector lifecycle count.");
    detail::store_prom_line(out, prefix, name, labels, {}, static_cast<double>(ctr->value()));
  }
}

template <chunk_store Store, comm::communicator Control, comm::communicator Data = Control,
          ownership_policy Own = modulo_ownership>
class connector {
  using req_ptr = std::shared_ptr<detail::connector_request>;

 public:
  /// Throws std::invalid_argument naming what is wrong: ownership world != communicator size,
  /// control and data of different worlds, an invalid cache view, a cost or split policy
  /// without node figures. `store`, `ctrl` and `data` must outlive the connector.
  connector(chunker<> chunk, Own own, Store& store, Control& ctrl, Data& data, kv_cache_view cache,
            connector_options opt = {})
      : chunk_(std::move(chunk)),
        own_(std::move(own)),
        store_(store),
        ctrl_(ctrl),
        data_(data),
        cache_(std::move(cache)),
        opt_(std::move(opt)),
        queue_(store, {.workers = opt_.fetch_workers,
                       .max_batch_chunks = opt_.fetch_batch_chunks,
                       .metrics = opt_.metrics}),
        estimator_(opt_.prior) {
    if (static_cast<rank_t>(own_.world_size()) != static_cast<rank_t>(ctrl_.size()))
      throw std::invalid_argument("kvtier::connector: ownership world size " +
                                  std::to_string(own_.world_size()) + " != communicator size " +
                                  std::to_string(ctrl_.size()));
    if (ctrl_.rank() != data_.rank() || ctrl_.size() != data_.size())
      throw std::invalid_argument("kvtier::connector: control and data communicators differ in rank or size");
    if (auto e = cache_.validate()) throw std::invalid_argument("kvtier::connector: " + e.message);
    if (opt_.policy != load_policy::always &&
        !(opt_.node.prefill_tokens_per_s > 0 && opt_.node.kv_bytes_per_token > 0))
      throw std::invalid_argument("kvtier::connector: the cost and split policies need node figures");
    const std::uint32_t layers = cache_.layout.num_layers;
    per_group_ = opt_.layers_per_group == 0 ? layers : std::min(opt_.layers_per_group, layers);
    groups_ = (layers + per_group_ - 1) / per_group_;
    chunk_bytes_ = cache_.layout.bytes_per_token() * chunk_.chunk_tokens();
    lookups_seen_.assign(std::size_t{1} << 16, 0);
    staging_ = std::make_shared<detail::staging_pool>(opt_.max_bytes_in_flight);
    if (separate_data()) mover_ = std::thread([this] { move_loop(); });
    saver_ = std::thread([this] { save_loop(); });
  }
  /// One communicator for the agreement and the moves (the moves then run inside step()).
  connector(chunker<> chunk, Own own, Store& store, Control& comm, kv_cache_view cache,
            connector_options opt = {}) requires std::same_as<Control, Data>
      : connector(std::move(chunk), std::move(own), store, comm, comm, std::move(cache), std::move(opt)) {}
  connector(const connector&) = delete;
  connector& operator=(const connector&) = delete;
  ~connector() {
    {
      std::lock_guard lock(mu_);
      closing_ = true;
    }
    work_cv_.notify_all();
    if (mover_.joinable()) mover_.join();
    if (saver_.joinable()) saver_.join();
    // The queue's workers may still write a running fetch into staging blocks (quarantined or
    // not): join them before the members that own that memory (declared after queue_) go.
    queue_.shutdown();
  }

  rank_t rank() const noexcept { return static_cast<rank_t>(ctrl_.rank()); }
  std::size_t chunk_bytes() const noexcept { return chunk_bytes_; }
  const connector_counters& counters() const noexcept { return counters_; }
  const load_estimator& estimator() const noexcept { return estimator_; }

  /// Once at setup, on every rank (a collective on the control communicator): agrees that
  /// every rank has the same key namespace, ownership geometry, chunk size in tokens and bytes,
  /// and value format (the store's format() when it has one). A rank that differs makes every
  /// rank return errc::invalid_argument naming the field and the first rank that differs.
  ///
  ///   if (auto r = conn.check_deployment(kvtier::deadline_after(5s)); r.ec) throw
  ///   std::runtime_error(r.message);
  deployment_check_result check_deployment(deadline dl) {
    value_format format = value_format::v1();
    if constexpr (requires { store_.format(); }) format = store_.format();
    return agree_deployment(ctrl_, deployment_fingerprint::of(chunk_.ns(), own_, chunk_bytes_, format), dl);
  }

  // ---- scheduler side ----------------------------------------------------------------------

  /// Starts the lookup of a request: this rank asks its store about the chunks it owns. Never
  /// blocks. errc::invalid_argument for an id already known (nothing changes then).
  std::error_code begin_lookup(request_id id, std::span<const token_id> tokens, const key_material& m = {}) {
    if (requests_.count(id)) return make_error_code(errc::invalid_argument);
    auto r = std::make_shared<detail::connector_request>();
    r->id = id;
    r->prompt_tokens = tokens.size();
    r->keys = chunk_.keys(tokens, m);
    r->owned = owned_chunks(own_, rank(), r->keys.size());
    r->lookup_dl = deadline_after(opt_.lookup_timeout);
    if (!r->owned.empty()) {
      std::vector<chunk_key> keys;
      for (std::size_t c : r->owned) keys.push_back(r->keys[c]), note_lookup(r->keys[c]);
      r->lookup = queue_.lookup(id, keys, chunk_layout::owned(owned_starts_of(*r, r->owned), end_of(*r)),
                                r->lookup_dl);
    }
    requests_.emplace(id, r);
    order_.push_back(id);
    counters_.lookups.add();
    return {};
  }

  /// The agreed plan, or empty while any rank's answer is not yet agreed (or for an unknown id).
  std::optional<load_plan> lookup(request_id id) const {
    const auto it = requests_.find(id);
    if (it == requests_.end() || !it->second->lookup_agreed) return std::nullopt;
    const auto& r = *it->second;
    return load_plan{r.agreed_cached_tokens, r.load_first_token, r.load_end_token};
  }

  /// Starts the load of a planned request into the pages at `slots` (slot of prompt position
  /// i; at least the plan's load_end_token entries). Never blocks. Call it on every rank.
  /// errc::invalid_argument when there is nothing to load or the slots do not fit the cache;
  /// then, if the plan has tokens to load, this rank still takes part (loading nothing), so
  /// its peers agree on nothing loaded instead of waiting for it.
  std::error_code load(request_id id, std::span<const std::int64_t> slots) {
    const auto it = requests_.find(id);
    if (it == requests_.end() || !it->second->lookup_agreed || it->second->loading ||
        it->second->load_end_token <= it->second->load_first_token)
      return make_error_code(errc::invalid_argument);
    detail::connector_request& r = *it->second;
    const std::size_t T = chunk_.chunk_tokens();
    r.loading = true;
    r.first_chunk = r.load_first_token / T;
    r.n = r.load_end_token / T - r.first_chunk;
    r.load_started = clock::now();
    r.load_dl = r.load_started + opt_.load_deadline.after(r.load_end_token - r.load_first_token);
    r.group_landed.assign(groups_, 0);
    counters_.loads.add();
    std::error_code ec;
    if (slots.size() < r.load_end_token || !slots_fit(slots.first(r.load_end_token))) {
      ec = make_error_code(errc::invalid_argument);
    } else if (!reserve_staging(r)) {
      ec = make_error_code(errc::queue_full);
    }
    if (ec) {
      r.local_failure = true;
      counters_.local_load_failures.add();
      return ec;
    }
    r.slots.assign(slots.begin(), slots.begin() + static_cast<std::ptrdiff_t>(r.load_end_token));
    std::vector<chunk_key> keys;
    std::vector<std::span<std::byte>> dst;
    std::vector<std::uint64_t> starts;
    for (std::size_t i = 0; i < r.n; ++i) {
      const std::size_t c = r.first_chunk + i;
      if (static_cast<rank_t>(own_.owner(c)) != rank()) continue;
      keys.push_back(r.keys[c]);
      dst.push_back(staged(r, i));
      starts.push_back(static_cast<std::uint64_t>(c) * T);
    }
    if (!keys.empty())
      r.fetch =
          queue_.submit(id, keys, dst, chunk_layout::owned(std::move(starts), r.load_end_token), r.load_dl);
    std::lock_guard lock(mu_);
    active_loads_.push_back(it->second);
    return {};
  }

  /// load() with a block table: table[b] is the block of positions [b * block_size, ...).
  std::error_code load(request_id id, std::span<const std::int32_t> block_table) {
    const auto it = requests_.find(id);
    const std::uint64_t end = it == requests_.end() ? 0 : it->second->load_end_token;
    const auto slots = slots_from_block_table({block_table, 0, end}, cache_.layout.block_size);
    return load(id, slots);
  }

  /// Blocks until this rank's own part of load `id` has ended (its fetch completed, or it owns
  /// nothing to fetch), or `dl` passes (errc::timeout). Local: no collective, nothing agreed.
  /// An engine (or a test) that calls it on every rank before step() gets the whole load
  /// agreed in one step. errc::invalid_argument for an id with no load started.
  ///
  ///   conn.load(id, slots);
  ///   conn.wait_local(id, kvtier::deadline_after(50ms));  // then step(): one agreement
  std::error_code wait_local(request_id id, deadline dl) const {
    const auto it = requests_.find(id);
    if (it == requests_.end() || !it->second->loading) return make_error_code(errc::invalid_argument);
    const detail::connector_request& r = *it->second;
    if (r.local_failure || !r.fetch.valid()) return {};
    const fetch_progress p = queue_.wait_progress(r.fetch, std::numeric_limits<std::size_t>::max(), dl);
    return p.complete ? std::error_code{} : make_error_code(errc::timeout);
  }

  /// The agreed outcome of a load, or empty while it runs.
  std::optional<load_outcome> load_result(request_id id) const {
    const auto it = requests_.find(id);
    if (it == requests_.end() || !it->second->done) return std::nullopt;
    const auto& r = *it->second;
    return load_outcome{r.load_first_token, r.loaded_end_token, r.load_end_token};
  }

  /// The chunks of a load that failed (agreed on every rank): recompute from the first one.
  std::vector<std::size_t> load_errors(request_id id) const {
    std::vector<std::size_t> out;
    if (auto o = load_result(id))
      for (std::uint64_t t = o->loaded_end_token; t < o->requested_end_token; t += chunk_.chunk_tokens())
        out.push_back(t / chunk_.chunk_tokens());
    return out;
  }

  /// Writes the request's full chunks in [first_token, end_token) that this rank owns (and the
  /// write policy admits) from the pages at `slots`, off the step: a saver thread gathers and
  /// puts them with its own deadline. Never blocks. The pages must stay until finished()
  /// lists the request's saves. errc::invalid_argument for an unknown id or short slots.
  std::error_code save(request_id id, std::span<const std::int64_t> slots, std::uint64_t first_token,
                       std::uint64_t end_token) {
    const auto it = requests_.find(id);
    if (it == requests_.end() || end_token > slots.size() || !slots_fit(slots.first(end_token)))
      return make_error_code(errc::invalid_argument);
    const std::size_t T = chunk_.chunk_tokens();
    save_job job{it->second, {}, {}};
    for (std::size_t c = (first_token + T - 1) / T; c < end_token / T && c < it->second->keys.size(); ++c)
      if (static_cast<rank_t>(own_.owner(c)) == rank() && admitted(it->second->keys[c]))
        job.chunks.push_back(c);
    if (job.chunks.empty()) return {};
    job.slots.assign(slots.begin(), slots.begin() + static_cast<std::ptrdiff_t>(end_token));
    {
      std::lock_guard lock(mu_);
      ++it->second->saves_pending;
      saves_.push_back(std::move(job));
    }
    work_cv_.notify_all();
    return {};
  }

  /// Ends a request on this rank (call it at the same point on every rank): no later step
  /// agrees on it and its pages are never written again. free_pages_now is false while saves
  /// still read them; finished() then lists the request once they end.
  finish_result finish(request_id id) {
    const auto it = requests_.find(id);
    if (it == requests_.end()) return {};
    const req_ptr r = it->second;
    {
      std::lock_guard gate(r->scatter_mu);
      r->abandoned = true;
    }
    if (r->fetch.valid() && !queue_.poll(r->fetch)) {  // the fetch may still write its staging
      quarantine_.push_back({r->fetch, r->staging});
      counters_.quarantined_blocks.add();
    }
    requests_.erase(it);
    order_.erase(std::find(order_.begin(), order_.end(), id));
    std::lock_guard lock(mu_);
    std::erase(active_loads_, r);
    landed_cv_.notify_all();
    r->finish_called = true;
    if (r->saves_pending == 0) return {true};
    finishing_.push_back(r);
    return {false};
  }

  /// Requests whose loads were agreed, or whose saves ended after finish(), since the last call.
  finished_requests finished() {
    finished_requests out;
    for (request_id id : order_) {
      auto& r = *requests_.at(id);
      if (r.done && !r.reported) r.reported = true, out.loads.push_back(id);
    }
    std::lock_guard lock(mu_);
    for (auto it = finishing_.begin(); it != finishing_.end();) {
      if ((*it)->saves_pending == 0) {
        out.saves.push_back((*it)->id);
        it = finishing_.erase(it);
      } else {
        ++it;
      }
    }
    return out;
  }

  /// The router events since the last call.
  std::vector<kv_event> drain_events() {
    std::lock_guard lock(mu_);
    return std::exchange(events_, {});
  }

  // ---- once per engine step, on every rank -------------------------------------------------

  /// Agrees, in one all-reduce on the control communicator, on every lookup and load waiting
  /// for it, and starts the moves that agreement allows. The error of a failed agreement (its
  /// lookups then plan nothing and its loads load nothing, on every rank); else empty.
  std::error_code step(deadline dl) {
    release_quarantine();
    std::vector<req_ptr> waiting;
    for (request_id id : order_) {
      const req_ptr& r = requests_.at(id);
      if (!r->lookup_agreed || (r->loading && !r->done)) waiting.push_back(r);
    }
    if (waiting.empty()) return {};
    detail::step_message msg(waiting.size());
    std::uint64_t fp = 0;
    for (std::size_t i = 0; i < waiting.size(); ++i) {
      fp = detail::step_fp_mix(detail::step_fp_mix(fp, waiting[i]->id), waiting[i]->lookup_agreed);
      contribute(*waiting[i], msg.entry(i));
    }
    msg.seal(fp);
    std::error_code ec = comm::all_reduce(ctrl_, std::span<const std::uint64_t>(msg.v), std::span(msg.v),
                                          comm::reduce_op::min, dl);
    if (!ec && !msg.consistent(waiting.size())) ec = make_error_code(errc::collective_mismatch);
    if (ec) counters_.agreement_failures.add();
    std::vector<move_item> batch;
    for (std::size_t i = 0; i < waiting.size(); ++i) {
      detail::connector_request& r = *waiting[i];
      if (!r.lookup_agreed)
        settle_lookup(r, ec, msg.entry(i));
      else
        settle_load(r, ec, msg.entry(i), waiting[i], batch);
    }
    if (!batch.empty()) {
      if (separate_data()) {
        {
          std::lock_guard lock(mu_);
          moves_.push_back(std::move(batch));
        }
        work_cv_.notify_all();
      } else {
        run_moves(batch);
      }
    }
    return ec;
  }

  // ---- worker side -------------------------------------------------------------------------

  /// Returns once layer `layer` of every chunk agreed so far for every running load is in this
  /// rank's pages (or its load ended), or errc::timeout when dl passes first.
  std::error_code wait_for_layer(std::uint32_t layer, deadline dl) {
    const std::size_t g = std::min<std::size_t>(layer / per_group_, groups_ - 1);
    std::unique_lock lock(mu_);
    const auto ready = [&] {
      return std::all_of(active_loads_.begin(), active_loads_.end(), [&](const req_ptr& r) {
        return r->move_failed || r->group_landed[g] >= r->enqueued;
      });
    };
    if (dl == no_deadline)
      landed_cv_.wait(lock, ready);
    else if (!landed_cv_.wait_until(lock, dl, ready))
      return make_error_code(errc::timeout);
    return {};
  }

 private:
  struct move_item {
    req_ptr r;
    std::size_t begin, end;  // relative chunks
  };
  struct save_job {
    req_ptr r;
    std::vector<std::size_t> chunks;
    std::vector<std::int64_t> slots;
  };
  struct quarantined {
    fetch_handle fetch;
    std::shared_ptr<std::byte[]> staging;
  };

  bool separate_data() const noexcept {
    return static_cast<const void*>(&ctrl_) != static_cast<const void*>(&data_);
  }
  std::uint64_t end_of(const detail::connector_request& r) const noexcept {
    return std::min<std::uint64_t>(r.keys.size() * chunk_.chunk_tokens(), r.prompt_tokens);
  }
  std::vector<std::uint64_t> owned_starts_of(const detail::connector_request&,
                                             const std::vector<std::size_t>& chunks) const {
    std::vector<std::uint64_t> s;
    for (std::size_t c : chunks) s.push_back(static_cast<std::uint64_t>(c) * chunk_.chunk_tokens());
    return s;
  }
  bool slots_fit(std::span<const std::int64_t> slots) const noexcept {
    const auto n = static_cast<std::int64_t>(cache_.layout.num_slots());
    return std::all_of(slots.begin(), slots.end(), [n](std::int64_t s) { return s < n; });
  }
  std::span<std::byte> staged(detail::connector_request& r, std::size_t i) const noexcept {
    return {r.staging.get() + i * chunk_bytes_, chunk_bytes_};
  }
  std::span<std::byte> staged_group(detail::connector_request& r, std::size_t i,
                                    std::uint32_t g) const noexcept {
    const layer_range lr = group_layers(g);
    return chunk_layers(cache_.layout, chunk_.chunk_tokens(), staged(r, i), lr);
  }
  layer_range group_layers(std::uint32_t g) const noexcept {
    return {g * per_group_, std::min(cache_.layout.num_layers, (g + 1) * per_group_)};
  }

  // One staging block per load, counted in flight until its last holder lets go.
  bool reserve_staging(detail::connector_request& r) {
    r.staging = staging_->take(r.n * chunk_bytes_, opt_.max_bytes_in_flight);
    return r.staging != nullptr;
  }
  void release_quarantine() {
    std::erase_if(quarantine_, [this](const quarantined& q) { return queue_.poll(q.fetch).has_value(); });
  }

  void note_lookup(const chunk_key& k) {
    std::uint8_t& n = lookups_seen_[chunk_key_hash{}(k) & (lookups_seen_.size() - 1)];
    if (n < 255) ++n;
  }
  bool admitted(const chunk_key& k) const {
    return opt_.saves == save_policy::write_through ||
           lookups_seen_[chunk_key_hash{}(k) & (lookups_seen_.size() - 1)] >= opt_.save_after_lookups;
  }

  // This rank's words of one entry (see detail::step_message).
  void contribute(detail::connector_request& r, std::span<std::uint64_t> e) {
    constexpr std::uint64_t top = ~std::uint64_t{0};
    if (!r.lookup_agreed) {
      if (!r.lookup.valid()) {
        e[0] = 1, e[1] = end_of(r);
      } else if (auto res = queue_.poll(r.lookup)) {
        e[0] = 1, e[1] = res->answer_tokens;
        note_evictions(r, res->status);
      } else if (expired(r.lookup_dl)) {
        queue_.cancel(r.lookup);
        e[0] = 1, e[1] = 0;  // a lookup past its deadline answers "nothing cached"
      } else {
        e[0] = 0, e[1] = top;
      }
      e[2] = e[3] = e[4] = top;
      return;
    }
    std::size_t fetched = r.n;
    bool fetch_done = true;
    if (r.local_failure) {
      fetched = 0;
    } else if (r.fetch.valid()) {
      const fetch_progress p = queue_.progress(r.fetch);
      const std::size_t T = chunk_.chunk_tokens();
      fetched =
          std::min<std::size_t>(r.n, (p.answer_tokens - std::min(p.answer_tokens, r.load_first_token)) / T);
      fetch_done = p.complete || expired(r.load_dl);
    }
    std::lock_guard lock(mu_);
    e[0] = fetched;
    e[1] = fetch_done ? fetched : r.n;
    e[2] = r.local_failure ? 0 : r.landed_locked();
    e[3] = (r.move_failed || r.local_failure) ? 0 : 1;
    e[4] = ~static_cast<std::uint64_t>(
        std::chrono::duration_cast<std::chrono::microseconds>(clock::now() - r.load_started).count());
  }

  void note_evictions(const detail::connector_request& r, const std::vector<chunk_status>& status) {
    std::vector<chunk_key> gone;
    std::lock_guard lock(mu_);
    for (std::size_t k = 0; k < status.size() && k < r.owned.size(); ++k)
      if (status[k] == chunk_status::miss && stored_.erase(r.keys[r.owned[k]]))
        gone.push_back(r.keys[r.owned[k]]);
    if (gone.empty()) return;
    events_.push_back({kv_event::kind::evicted, rank(), std::move(gone)});
  }

  void settle_lookup(detail::connector_request& r, std::error_code ec, std::span<const std::uint64_t> e) {
    if (!ec && e[0] == 0) return;  // some rank's answer is not in yet
    r.lookup_agreed = true;
    const std::uint64_t hit = ec ? 0 : std::min(e[1], end_of(r));
    const std::uint64_t T = chunk_.chunk_tokens();
    r.agreed_cached_tokens = hit;
    r.load_first_token = 0;
    r.load_end_token = hit / T * T;  // only full chunks are loaded
    if (opt_.policy == load_policy::cost && !estimator_.decide(opt_.node, static_cast<double>(hit)).load) {
      r.load_end_token = 0;
    } else if (opt_.policy == load_policy::split && hit > 0) {
      const double granularity = static_cast<double>(T) * static_cast<double>(own_.world_size());
      const auto k = static_cast<std::uint64_t>(
          estimator_
              .split(opt_.node, static_cast<double>(hit), static_cast<double>(r.prompt_tokens), granularity)
              .k_tokens);
      r.load_first_token = std::min(r.load_end_token, k / T * T);
      if (r.load_first_token == r.load_end_token) r.load_first_token = r.load_end_token = 0;
    }
  }

  void settle_load(detail::connector_request& r, std::error_code ec, std::span<const std::uint64_t> e,
                   const req_ptr& self, std::vector<move_item>& batch) {
    if (ec || e[3] == 0) {
      // A failed agreement: nothing is known to be in every rank's pages. A failed move or
      // local failure: the chunks every rank has scattered (min over ranks) stay loaded.
      end_load(r, ec ? 0 : static_cast<std::size_t>(e[2]));
      return;
    }
    const auto agreed = static_cast<std::size_t>(e[0]), limit = static_cast<std::size_t>(e[1]);
    if (agreed > r.enqueued) {
      batch.push_back({self, r.enqueued, agreed});
      std::lock_guard lock(mu_);
      r.enqueued = agreed;
    }
    if (agreed == r.n || limit <= agreed) r.target = agreed;
    if (r.target != std::numeric_limits<std::size_t>::max() && e[2] >= r.target) {
      const double seconds = static_cast<double>(~e[4]) * 1e-6;
      if (r.target > 0)
        estimator_.record_bytes(r.target * chunk_bytes_, seconds);  // same samples on every rank
      end_load(r, r.target);
    }
  }

  void end_load(detail::connector_request& r, std::size_t chunks) {
    {
      std::lock_guard gate(r.scatter_mu);  // nothing past the agreed prefix is written any more
      if (chunks < r.n) r.abandoned = true;
    }
    r.done = true;
    r.loaded_end_token = r.load_first_token + static_cast<std::uint64_t>(chunks) * chunk_.chunk_tokens();
    counters_.tokens_loaded.add(r.loaded_end_token - r.load_first_token);
    if (chunks < r.n) {
      counters_.loads_cut_short.add();
      counters_.tokens_to_recompute.add(r.load_end_token - r.loaded_end_token);
    }
    std::lock_guard lock(mu_);
    std::erase_if(active_loads_, [&](const req_ptr& p) { return p.get() == &r; });
    landed_cv_.notify_all();
  }

  // ---- the mover: one grouped broadcast per layer group, then its scatter ------------------

  void run_moves(const std::vector<move_item>& batch) {
    const rank_t me = rank();
    deadline dl = deadline::min();
    for (const move_item& m : batch) dl = std::max(dl, m.r->load_dl);
    for (std::uint32_t g = 0; g < groups_; ++g) {
      std::error_code ec = data_.group_start();
      for (const move_item& m : batch)
        for (std::size_t i = m.begin; i < m.end; ++i) {
          const rank_t owner = static_cast<rank_t>(own_.owner(m.r->first_chunk + i));
          const std::span<std::byte> s = staged_group(*m.r, i, g);
          const std::error_code b = data_.broadcast(
              owner == me ? std::span<const std::byte>(s) : std::span<const std::byte>{}, s, owner, dl);
          if (b && !ec) ec = b;
        }
      if (std::error_code e = data_.group_end(dl); e && !ec) ec = e;
      if (ec) {  // no later group of this batch runs: its failure is agreed at the next step
        std::lock_guard lock(mu_);
        for (const move_item& m : batch) m.r->move_failed = true;
        landed_cv_.notify_all();
        return;
      }
      for (const move_item& m : batch) scatter_group(*m.r, m.begin, m.end, g);
    }
  }

  void scatter_group(detail::connector_request& r, std::size_t begin, std::size_t end, std::uint32_t g) {
    const std::size_t T = chunk_.chunk_tokens();
    for (std::size_t i = begin; i < end; ++i) {
      bool ok = true;
      {
        std::lock_guard gate(r.scatter_mu);
        if (r.abandoned) return;
        const std::size_t c = r.first_chunk + i;
        ok = !kv_scatter(cache_, std::span<const std::int64_t>(r.slots).subspan(c * T, T),
                         staged_group(r, i, g), group_layers(g));
      }
      std::lock_guard lock(mu_);
      if (ok)
        r.group_landed[g] = i + 1;
      else
        r.move_failed = true;
      landed_cv_.notify_all();
      if (!ok) return;
    }
  }

  void move_loop() {
    for (;;) {
      std::vector<move_item> batch;
      {
        std::unique_lock lock(mu_);
        work_cv_.wait(lock, [&] { return closing_ || !moves_.empty(); });
        if (moves_.empty()) return;
        batch = std::move(moves_.front());
        moves_.pop_front();
      }
      run_moves(batch);
    }
  }

  // ---- the saver: gathers an owner's chunks from the pages and puts them -------------------

  void save_loop() {
    for (;;) {
      save_job job;
      {
        std::unique_lock lock(mu_);
        work_cv_.wait(lock, [&] { return closing_ || !saves_.empty(); });
        if (saves_.empty()) return;
        job = std::move(saves_.front());
        saves_.pop_front();
      }
      run_save(job);
    }
  }

  void run_save(save_job& job) {
    const std::size_t T = chunk_.chunk_tokens();
    std::vector<std::byte> values(job.chunks.size() * chunk_bytes_);
    std::vector<chunk_key> keys;
    std::vector<std::span<const std::byte>> src;
    for (std::size_t k = 0; k < job.chunks.size(); ++k) {
      const std::size_t c = job.chunks[k];
      std::span<std::byte> v(values.data() + k * chunk_bytes_, chunk_bytes_);
      if (kv_gather(cache_, std::span<const std::int64_t>(job.slots).subspan(c * T, T), v)) continue;
      keys.push_back(job.r->keys[c]);
      src.push_back(v);
    }
    std::vector<chunk_status> st(keys.size(), chunk_status::error);
    const std::error_code ec = store_.put(keys, src, st, deadline_after(opt_.save_timeout));
    std::vector<chunk_key> stored;
    for (std::size_t k = 0; k < keys.size(); ++k)
      if (st[k] == chunk_status::stored) stored.push_back(keys[k]);
    counters_.chunks_saved.add(stored.size());
    const bool failed = ec || stored.size() != job.chunks.size();
    if (failed) counters_.save_failures.add();
    std::lock_guard lock(mu_);
    for (const chunk_key& k : stored) remember_stored(k);
    if (!stored.empty()) events_.push_back({kv_event::kind::stored, rank(), std::move(stored)});
    job.r->save_failed = job.r->save_failed || failed;
    --job.r->saves_pending;
  }

  // Under mu_: the keys this rank stored, so a later miss is reported evicted (bounded).
  void remember_stored(const chunk_key& k) {
    if (!stored_.insert(k).second) return;
    stored_order_.push_back(k);
    if (stored_order_.size() > (std::size_t{1} << 16)) {
      stored_.erase(stored_order_.front());
      stored_order_.pop_front();
    }
  }

  chunker<> chunk_;
  Own own_;
  Store& store_;
  Control& ctrl_;
  Data& data_;
  kv_cache_view cache_;
  connector_options opt_;
  fetch_queue<Store> queue_;
  load_estimator estimator_;
  connector_counters counters_;
  std::uint32_t per_group_ = 1, groups_ = 1;
  std::size_t chunk_bytes_ = 0;

  // Engine thread.
  std::unordered_map<request_id, req_ptr> requests_;
  std::vector<request_id> order_;  // begin_lookup order: the order of the step's entries
  std::vector<quarantined> quarantine_;
  std::vector<std::uint8_t> lookups_seen_;
  std::shared_ptr<detail::staging_pool> staging_;

  // Shared with the mover and saver threads.
  std::mutex mu_;
  std::condition_variable work_cv_, landed_cv_;
  std::deque<std::vector<move_item>> moves_;
  std::deque<save_job> saves_;
  std::vector<req_ptr> finishing_;
  std::vector<req_ptr> active_loads_;  // loads started and not yet agreed or finished
  std::vector<kv_event> events_;
  std::unordered_set<chunk_key, chunk_key_hash> stored_;
  std::deque<chunk_key> stored_order_;
  bool closing_ = false;
  std::thread mover_, saver_;
};

/// Deduction for the one-communicator form.
template <chunk_store Store, comm::communicator Control, ownership_policy Own>
connector(chunker<>, Own, Store&, Control&, kv_cache_view, connector_options = {})
    -> connector<Store, Control, Control, Own>;

}  // namespace kvtier
