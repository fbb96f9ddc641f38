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
//   auto w = conn.wait_for_layer(l, dl);            // which tokens of layer l are in the pages
//   if (auto out = conn.load_result(id)) compute_from(out->loaded_end_token);  // agreed on all ranks
//   conn.save(id, slots_of(seq), 0, tokens.size()); // owners write their chunks, off the step
//                                                   // (or by layer: begin_save + save_layer(id, l))
//   if (!conn.finish(id).free_pages_now) pending.push_back(id);  // saves still read the pages:
//   for (auto done : conn.finished().saves) free_pages_of(done);  // after each step, never a wait
//   for (const auto& e : conn.errors(id)) log(e.message);  // this rank's own reasons, if any
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
// Layer by layer. With a data communicator distinct from the control one, the mover's threads
// run the broadcasts and, overlapped with the next group's broadcast, the scatters while the
// engine computes; wait_for_layer(l, dl) returns once layer l of every chunk of every running
// load is in this rank's pages (or the load's agreed reach ended short of it), running the
// step's agreement itself while group(l) is not yet agreed: with stream_groups (loads fetched
// layer group by layer group) the engine computes layer 0 while later groups still fetch.
// With one communicator the moves run inside step().
//
// Staging. A load's chunk values land in one staging block the connector owns; it lives until
// nothing can write it any more: a load cut short by its deadline leaves its block in
// quarantine until its fetch has completed, and the block is never reused before that. With
// options.data_writes_after_failure, the blocks of a failed move are never reused at all, so
// the data communicator may write straight into them (MPI with mpi_options::stage = false).
//
// Errors. What every rank agreed is load_result / load_errors; why this rank's own part ended
// short (a store error with the store's words, a corrupt value, a deadline, a failed move, a
// failed save) is errors(id), and finished().save_errors after finish(): local, never agreed,
// and no collective carries it.
//
// Blocking: begin_lookup, lookup, load, save, begin_save, save_layer, finish, finished,
// load_result, load_errors, errors and drain_events never block (load and finish may wait for one scatter of
// one layer group to end); step, wait_for_layer, wait_local and wait_for_save take a deadline (step, and
// wait_for_layer while a group is not yet agreed, are collectives: every rank calls them). Each
// call's bound is in its comment. A peer waits for this rank's step up to its own step deadline,
// so whatever the engine thread blocks on between two steps (wait_local, wait_for_save) must fit
// in what that leaves: free pages from the step loop when finished() lists their saves rather
// than waiting for a save. docs/engine_guide.md relates the deadlines in one table.
//
// Files: the options and results are in kvtier/connector/types.hpp; the step's words and what
// they decide in connector/detail/step.hpp; what an agreed load entry does (moves, target,
// outcome) in connector/detail/settle.hpp; the moves in connector/detail/mover.hpp; the saves
// (by request and by layer) in connector/detail/saver.hpp; the per-request state in
// connector/detail/state.hpp. This file is the public API with its examples in place (about a
// third of its lines are comments) and the engine thread's glue between those parts.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <system_error>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kvtier/chunker.hpp"
#include "kvtier/comm/communicator.hpp"
#include "kvtier/connector/detail/errors.hpp"
#include "kvtier/connector/detail/mover.hpp"
#include "kvtier/connector/detail/saver.hpp"
#include "kvtier/connector/detail/settle.hpp"
#include "kvtier/connector/detail/slow_tier.hpp"
#include "kvtier/connector/detail/state.hpp"
#include "kvtier/connector/detail/step.hpp"
#include "kvtier/connector/types.hpp"
#include "kvtier/cost_model.hpp"
#include "kvtier/deadline.hpp"
#include "kvtier/deployment_check.hpp"
#include "kvtier/errc.hpp"
#include "kvtier/fetch_queue.hpp"
#include "kvtier/kv_copy.hpp"
#include "kvtier/kv_layout.hpp"
#include "kvtier/lookup.hpp"
#include "kvtier/metrics.hpp"
#include "kvtier/ownership.hpp"
#include "kvtier/store/chunk_store.hpp"

namespace kvtier {

template <chunk_store Store, comm::communicator Control, comm::communicator Data = Control,
          ownership_policy Own = modulo_ownership>
class connector {
  using req_ptr = std::shared_ptr<detail::connector_request>;

 public:
  /// Throws std::invalid_argument naming what is wrong: ownership world != communicator size,
  /// control and data of different worlds, an invalid cache view, a cost or split policy
  /// without node figures, a key namespace whose `ownership` is not `own.geometry()` (its keys
  /// would be shared with deployments that place chunks on other ranks). `store`, `ctrl` and
  /// `data` must outlive the connector.
  connector(chunker<> chunk, Own own, Store& store, Control& ctrl, Data& data, kv_cache_view cache,
            connector_options opt = {})
      : chunk_(std::move(chunk)),
        own_(std::move(own)),
        store_(store),
        ctrl_(ctrl),
        data_(data),
        cache_(std::move(cache)),
        opt_(std::move(opt)),
        geo_(cache_, chunk_.chunk_tokens(), opt_.layers_per_group),
        queue_(store, {.workers = opt_.fetch_workers,
                       .max_batch_chunks = streamed_ ? 0 : opt_.fetch_batch_chunks,  // streamed: one call
                       .metrics = opt_.metrics,
                       .stream_groups = streamed_}),
        estimator_(opt_.prior, {.half_life_samples = opt_.estimator_half_life_samples}),
        mover_(data_, own_, geo_, shared_, separate_data(), opt_.data_writes_after_failure,
               counters_.quarantined_blocks, opt_.move_timeout),
        saver_(store_, geo_, shared_, counters_, opt_.save_timeout, rank()) {
    if (std::string why = detail::connector_setup_problem(own_, ctrl_, data_, cache_, opt_, chunk_.ns());
        !why.empty())
      throw std::invalid_argument("kvtier::connector: " + why);
    deployment_word_ = compute_deployment_word();
  }
  /// One communicator for the agreement and the moves (the moves then run inside step()).
  connector(chunker<> chunk, Own own, Store& store, Control& comm, kv_cache_view cache,
            connector_options opt = {}) requires std::same_as<Control, Data>
      : connector(std::move(chunk), std::move(own), store, comm, comm, std::move(cache), std::move(opt)) {}
  connector(const connector&) = delete;
  connector& operator=(const connector&) = delete;
  ~connector() {
    mover_.stop();
    saver_.stop();
    // The queue's workers may still write a running fetch into staging blocks (quarantined or
    // not): join them before the members that own that memory (declared after queue_) go.
    queue_.shutdown();
  }

  rank_t rank() const noexcept { return static_cast<rank_t>(ctrl_.rank()); }
  std::size_t chunk_bytes() const noexcept { return geo_.chunk_bytes; }
  const connector_counters& counters() const noexcept { return counters_; }
  const load_estimator& estimator() const noexcept { return estimator_; }

  /// Feeds the estimator one load of `bytes` that took `seconds` in the engine's own time (a
  /// modeled clock, say; with connector_options::wall_clock_samples off they are the only
  /// samples, so estimates are reproducible). The cost and split policies plan from the
  /// estimator on each rank, so call it with the same samples in the same order on every rank:
  /// under those policies a lookup entry's fingerprint folds the estimate, and ranks whose
  /// estimates differ fail the lookup together (nothing cached). errc::invalid_argument for 0
  /// bytes or seconds not positive and finite (nothing recorded).
  ///
  ///   conn.record_load_sample(c.bytes, modeled_clock.now() - c.load_started_s);  // every rank
  std::error_code record_load_sample(std::uint64_t bytes, double seconds) {
    return estimator_.record_bytes(bytes, seconds) ? std::error_code{}
                                                   : make_error_code(errc::invalid_argument);
  }

  /// Once at setup, on every rank (a collective on the control communicator): agrees that
  /// every rank has the same key namespace, ownership geometry, chunk size in tokens and bytes,
  /// value format (the store's format() when it has one), layers_per_group and stream_groups. A
  /// rank that differs makes every rank return errc::invalid_argument naming the field and the
  /// first rank that differs. Every step checks the same settings (folded into one word of its
  /// header) whether or not this was called: ranks that differ fail every step together
  /// (errc::invalid_argument, last_step_error() says why), never issue collectives of
  /// different shapes.
  ///
  ///   if (auto r = conn.check_deployment(kvtier::deadline_after(5s)); r.ec) throw
  ///   std::runtime_error(r.message);
  deployment_check_result check_deployment(deadline dl) { return agree_deployment(ctrl_, deployment(), dl); }

  // ---- scheduler side ----------------------------------------------------------------------

  /// Starts the lookup of a request: this rank asks its store about the chunks it owns. Never
  /// blocks. errc::invalid_argument for an id already known (nothing changes then).
  std::error_code begin_lookup(request_id id, std::span<const token_id> tokens, const key_material& m = {}) {
    return begin_lookup(id, tokens, tokens.size(), m);
  }

  /// begin_lookup() of a request whose prompt has `prompt_tokens` tokens of which only the
  /// first keyed_tokens.size() are keyed (looked up and loadable): the policy plans with the
  /// whole prompt (the split point, what is left to compute) and the plan reports it. Call it
  /// with the same figures on every rank: ranks whose prompt lengths or key counts differ fail
  /// the lookup's agreement together (nothing cached). Throws std::invalid_argument when
  /// prompt_tokens is less than the keyed tokens.
  ///
  ///   conn.begin_lookup(id, std::span(tokens).first(4096), tokens.size());  // key 4,096 of 6,000
  std::error_code begin_lookup(request_id id, std::span<const token_id> keyed_tokens,
                               std::uint64_t prompt_tokens, const key_material& m = {}) {
    if (prompt_tokens < keyed_tokens.size())
      throw std::invalid_argument("kvtier::connector::begin_lookup: prompt_tokens " +
                                  std::to_string(prompt_tokens) + " < the " +
                                  std::to_string(keyed_tokens.size()) + " keyed tokens");
    if (requests_.count(id)) return make_error_code(errc::invalid_argument);
    auto r = std::make_shared<detail::connector_request>();
    r->id = id;
    r->prompt_tokens = prompt_tokens;
    r->keys = chunk_.keys(keyed_tokens, m);
    r->owned = owned_chunks(own_, rank(), r->keys.size());
    r->lookup_started = clock::now();
    r->lookup_dl = deadline_after(opt_.lookup_timeout);
    r->lookup_skipped = !r->owned.empty() && slow_tier_.skip_lookup(opt_);
    if (r->lookup_skipped) {
      counters_.lookups_skipped.add();
    } else if (!r->owned.empty()) {
      std::vector<chunk_key> keys;
      for (std::size_t c : r->owned) keys.push_back(r->keys[c]), lookup_counts_.note(r->keys[c]);
      r->lookup =
          queue_.lookup(id, keys, chunk_layout::owned(owned_starts_of(r->owned), end_of(*r)), r->lookup_dl);
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
    return load_plan{r.agreed_cached_tokens, r.load_first_token, r.load_end_token, r.prompt_tokens};
  }

  /// Starts the load of a planned request into the pages at `slots` (slot of prompt position
  /// i; at least the plan's load_end_token entries). Never blocks. Call it on every rank.
  /// errc::invalid_argument when there is nothing to load or the slots do not give a page to
  /// every token of the load (a slot < 0, e.g. kv_copy's "skip", or past the cache; a block
  /// table shorter than the plan); then, if the plan has tokens to load, this rank still takes
  /// part (loading nothing), so its peers agree on nothing loaded instead of waiting for it, and
  /// errors(id) says which position.
  std::error_code load(request_id id, std::span<const std::int64_t> slots) {
    const auto it = requests_.find(id);
    if (it == requests_.end()) return make_error_code(errc::invalid_argument);
    return load(id, slots, it->second->load_first_token, it->second->load_end_token);
  }

  /// load() of tokens [first_token, end_token) only: a range the engine chooses inside the plan,
  /// in whole chunks (both multiples of the chunk size, plan.load_first_token <= first_token <
  /// end_token <= plan.load_end_token), e.g. only what its own L1 lacks. `slots` needs at least
  /// end_token entries. Call it with the same range on every rank: ranks whose ranges differ
  /// fail the load's agreement together (nothing loaded, on every rank). Throws
  /// std::invalid_argument naming the range when it is not whole chunks inside the plan;
  /// otherwise as load(id, slots), and the outcome's requested_end_token is end_token.
  ///
  ///   auto plan = conn.lookup(id);        // [0, 192) cached, chunks of 32 tokens
  ///   conn.load(id, slots, 64, 160);      // chunks 2, 3, 4; the engine has [0, 64) already
  std::error_code load(request_id id, std::span<const std::int64_t> slots, std::uint64_t first_token,
                       std::uint64_t end_token) {
    const auto it = requests_.find(id);
    if (it == requests_.end() || !it->second->lookup_agreed || it->second->loading ||
        it->second->load_end_token <= it->second->load_first_token)
      return make_error_code(errc::invalid_argument);
    detail::connector_request& r = *it->second;
    const std::size_t T = chunk_.chunk_tokens();
    if (first_token % T || end_token % T || first_token >= end_token || first_token < r.load_first_token ||
        end_token > r.load_end_token)
      throw std::invalid_argument("kvtier::connector::load: tokens [" + std::to_string(first_token) + ", " +
                                  std::to_string(end_token) + ") are not whole chunks of " +
                                  std::to_string(T) + " tokens inside the plan [" +
                                  std::to_string(r.load_first_token) + ", " +
                                  std::to_string(r.load_end_token) + ")");
    r.loading = true;
    r.range_first_token = first_token;
    r.range_end_token = end_token;
    r.first_chunk = first_token / T;
    r.n = end_token / T - r.first_chunk;
    r.load_started = clock::now();
    r.load_dl = detail::slow_tier_guard::load_deadline(opt_, r.load_started, end_token - first_token);
    r.group_landed.assign(geo_.groups, 0);
    r.enqueued_group.assign(geo_.groups, 0);
    counters_.loads.add();
    std::error_code ec;
    std::string why = slots_problem(slots, first_token, end_token);
    if (!why.empty()) {
      ec = make_error_code(errc::invalid_argument);
      why = "this rank's slots do not give a page to every token: " + why;
    } else if (!reserve_staging(r)) {
      ec = make_error_code(errc::queue_full);
      why = "no staging: max_bytes_in_flight reached";
    }
    if (ec) {
      r.local_failure = true;
      counters_.local_load_failures.add();
      note_error(r, detail::describe_error(id, request_error::stage::load, rank(), r.first_chunk, ec, why));
      return ec;
    }
    r.slots.assign(slots.begin(), slots.begin() + static_cast<std::ptrdiff_t>(end_token));
    r.fetch = detail::fetch_owned(r, queue_, own_, rank(), geo_);
    std::lock_guard lock(shared_.mu);
    shared_.active_loads.push_back(it->second);
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
  /// Bound: min(`dl`, the load's own deadline, connector_options::load_deadline from load()).
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

  /// Caps this rank's part of load `id` at its first `chunks` chunks (counted from the load's
  /// first chunk): the agreed prefix is then at most the least cap over ranks, agreed through
  /// the step like every other outcome, so every rank ends the load with the same prefix. A cap
  /// only lowers (one above an earlier cap changes nothing). Local, never blocks.
  /// errc::invalid_argument for an id with no load running (unknown, not started, or its
  /// outcome already agreed).
  ///
  ///   conn.limit_load(id, 3);   // this rank takes at most 3 chunks: every rank loads <= 3
  std::error_code limit_load(request_id id, std::size_t chunks) {
    const auto it = requests_.find(id);
    if (it == requests_.end() || !it->second->loading || it->second->done)
      return make_error_code(errc::invalid_argument);
    it->second->cap = std::min(it->second->cap, chunks);
    return {};
  }

  /// limit_load(id, 0), and this rank's fetch of the load is cancelled (TensorRT-LLM's
  /// cancel_load): every rank's outcome is nothing loaded, the engine recomputes from the
  /// load's first token. The same errors as limit_load.
  std::error_code cancel_load(request_id id) {
    if (std::error_code ec = limit_load(id, 0)) return ec;
    auto& r = *requests_.at(id);
    r.cancelled_by_engine = true;  // its fetch's cancelled end is no failure (detail::fetch_failure)
    if (r.fetch.valid()) queue_.cancel(r.fetch);
    return {};
  }

  /// The agreed outcome of a load, or empty while it runs.
  std::optional<load_outcome> load_result(request_id id) const {
    const auto it = requests_.find(id);
    if (it == requests_.end() || !it->second->done) return std::nullopt;
    const auto& r = *it->second;
    return load_outcome{r.range_first_token, r.loaded_end_token, r.range_end_token};
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
  /// lists the request's saves. errc::invalid_argument, nothing queued, for an unknown id or
  /// slots that do not give a page to every token of the full chunks it covers (short, a slot
  /// < 0 or past the cache): a chunk is never stored from memory that is not its page.
  std::error_code save(request_id id, std::span<const std::int64_t> slots, std::uint64_t first_token,
                       std::uint64_t end_token) {
    std::optional<detail::save_job> job = owned_save(id, slots, first_token, end_token);
    if (!job) return make_error_code(errc::invalid_argument);
    if (!job->chunks.empty()) saver_.submit(std::move(*job));
    return {};
  }

  /// save() layer by layer (vLLM's save_kv_layer): the same chunks, gathered from the pages one
  /// layer group at a time on the saver thread as the forward reports each layer final with
  /// save_layer(), so the gathers overlap the rest of the forward; put once the last group is
  /// gathered. Never blocks. finish() before every layer was reported ends the save failed
  /// (nothing stored; errors(id) names the group). errc::invalid_argument as save(), or while a
  /// save by layer of the request is still being reported.
  ///
  ///   conn.begin_save(id, slots, 0, tokens.size());
  ///   for (std::uint32_t l = 0; l < layers; ++l) compute_layer(l), conn.save_layer(id, l);
  ///   conn.wait_for_save(id, dl);
  std::error_code begin_save(request_id id, std::span<const std::int64_t> slots, std::uint64_t first_token,
                             std::uint64_t end_token) {
    std::optional<detail::save_job> job = owned_save(id, slots, first_token, end_token);
    return job ? saver_.begin_by_layer(std::move(*job)) : make_error_code(errc::invalid_argument);
  }

  /// Layer `layer` of the pages of the request's save by layer (begin_save) is final: once every
  /// layer of its group is, the saver gathers that group. Never blocks. errc::invalid_argument
  /// for no save by layer begun, a layer out of range, or one reported already.
  std::error_code save_layer(request_id id, std::uint32_t layer) {
    const req_ptr r = known(id);
    return r ? saver_.report_layer(r, layer) : make_error_code(errc::invalid_argument);
  }

  /// save() of a request this connector never looked up (an engine that computed a prompt
  /// without asking, say in a recompute-only mode): keys `tokens` as begin_lookup would, and the
  /// request is known from here on only to save, wait_for_save, errors and finish (no step
  /// agrees on it). errc::invalid_argument for an id already known (use the form above), or as
  /// the form above.
  ///
  ///   conn.save(id, tokens, slots, 0, tokens.size());   // never looked up: write it through
  ///   conn.wait_for_save(id, dl);  conn.finish(id);
  std::error_code save(request_id id, std::span<const token_id> tokens, std::span<const std::int64_t> slots,
                       std::uint64_t first_token, std::uint64_t end_token, const key_material& m = {}) {
    if (requests_.count(id)) return make_error_code(errc::invalid_argument);
    auto r = std::make_shared<detail::connector_request>();
    r->id = id;
    r->prompt_tokens = tokens.size();
    r->keys = chunk_.keys(tokens, m);
    requests_.emplace(id, r);
    if (std::error_code ec = save(id, slots, first_token, end_token)) {
      requests_.erase(id);
      return ec;
    }
    return {};
  }

  /// This rank's own reasons for request `id` so far, the first of each stage: why its lookup
  /// answered short (a store error, a corrupt value, no answer by the lookup deadline), why its
  /// part of the load ended short (a store error, a corrupt value, a chunk gone since the
  /// lookup, the load deadline, a failed move or scatter, slots that do not fit), why a save
  /// failed, each naming the chunk, with the store's words when it keeps them; a failed step
  /// agreement too. Local, never blocks, no collective: only the rank that failed has a reason
  /// (the outcome, load_result, stays agreed on every rank). Until finish(), or until finished()
  /// lists the request's saves; after that its save failure is in finished().save_errors. Empty
  /// for an unknown id.
  ///
  ///   conn.wait_for_save(id, dl);
  ///   for (const kvtier::request_error& e : conn.errors(id)) std::cerr << e.message << '\n';
  ///   // rank 1: save of chunk 3: authentication failed (store: WRONGPASS invalid username-password pair)
  std::vector<request_error> errors(request_id id) const { return saver_.errors(known(id), id); }

  /// Blocks until every save of request `id` queued so far has ended (stored or failed; then
  /// errors(id) says why one failed), or `dl` passes (errc::timeout). Local: no collective.
  /// Before or after finish(), until finished() has listed the request's saves.
  /// Bound: min(`dl`, (k + 1) x save_timeout + the gathers) for a save queued behind k others
  /// (the saver runs one save at a time, each put by save_timeout from its start; a server whose
  /// breaker tripped refuses at once). Between two steps this delays this rank's next step and
  /// a peer's step waits for it: an engine frees pages when finished() lists the request
  /// (vLLM's get_finished) and keeps wait_for_save for shutdown, when no step follows.
  /// errc::invalid_argument for an id neither known nor finishing.
  ///
  ///   conn.save(id, slots, 0, tokens.size());
  ///   conn.wait_for_save(id, kvtier::deadline_after(2s));  // vLLM's wait_for_save
  std::error_code wait_for_save(request_id id, deadline dl) { return saver_.wait(known(id), id, dl); }

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
      quarantine_.hold(r->fetch, r->staging);
      counters_.quarantined_blocks.add();
    }
    saver_.abandon_by_layer(r);  // a save by layer whose layers were not all reported: it fails
    requests_.erase(it);
    if (const auto o = std::find(order_.begin(), order_.end(), id); o != order_.end()) order_.erase(o);
    {
      std::lock_guard lock(shared_.mu);
      std::erase(shared_.active_loads, r);
      shared_.landed.notify_all();
    }
    return {saver_.finish(r)};
  }

  /// Requests whose loads were agreed, or whose saves ended after finish(), since the last call,
  /// and this rank's save failures of the requests finished since then (save_errors).
  finished_requests finished() {
    finished_requests out;
    for (request_id id : order_) {
      auto& r = *requests_.at(id);
      if (r.done && !r.reported) r.reported = true, out.loads.push_back(id);
    }
    saver_.take_ended(out);
    return out;
  }

  /// The router events since the last call.
  std::vector<kv_event> drain_events() {
    std::lock_guard lock(shared_.mu);
    return std::exchange(shared_.events, {});
  }

  // ---- once per engine step, on every rank -------------------------------------------------

  /// Agrees, in one all-reduce on the control communicator, on every lookup and load waiting
  /// for it, and starts the moves that agreement allows. Bound: returns by `dl` (waiting at most
  /// that long for the slowest peer to reach its step; with one communicator the moves it
  /// starts run inside it, by the same `dl`). The error of a failed agreement (its
  /// lookups then plan nothing and its loads load nothing, on every rank; last_step_error()
  /// says why in words); else empty. Its first all-reduce has the same element count on every
  /// rank whatever each passes; a second one, of an agreed count, follows only when many
  /// requests wait at once (more than 9).
  std::error_code step(deadline dl) { return step(dl, {}); }

  /// Why the last step's agreement failed, in words (empty after one that succeeded): the
  /// communicator's error, or which of the ranks' inputs differed.
  const std::string& last_step_error() const noexcept { return last_step_error_; }

  /// step() with the engine's own words in the same all-reduce: `words` goes in as this rank's
  /// values and comes back as the min over ranks (for a max, pass complements; to check that
  /// every rank holds the same x, pass x and ~x). Pass the same number of words on every rank
  /// (a different count fails the step on every rank with errc::collective_mismatch). On a
  /// failed agreement every word is set to 0, so a rank never acts on values its peers did
  /// not agree. With words, the step issues its all-reduce even when nothing else waits.
  ///
  ///   std::uint64_t w[2] = {l1_answer_tokens, first_mismatched_chunk};  // per request, say
  ///   if (!conn.step(dl, w)) use(w[0], w[1]);                           // min over ranks
  std::error_code step(deadline dl, std::span<std::uint64_t> words) {
    quarantine_.release_completed(queue_);
    std::vector<req_ptr> waiting;
    for (request_id id : order_) {
      const req_ptr& r = requests_.at(id);
      if (!r->lookup_agreed || (r->loading && !r->done)) waiting.push_back(r);
    }
    if (waiting.empty() && words.empty()) return {};
    detail::step_message msg(waiting.size(), words);
    const std::uint64_t plan_fingerprint =
        opt_.policy == load_policy::always
            ? 0
            : detail::step_fp_mix(detail::estimate_fingerprint(estimator_.estimate()),
                                  slow_tier_.fingerprint());
    std::uint64_t fp = 0;
    for (std::size_t i = 0; i < waiting.size(); ++i) {
      fp = detail::step_fp_mix(fp, detail::entry_fingerprint(*waiting[i], plan_fingerprint));
      contribute(*waiting[i], msg.entry(i));
    }
    if (streamed_) fp = detail::step_fp_mix(fp, 0x53545245414d4544ull);  // "STREAMED": units, not chunks
    msg.seal(detail::step_fp_mix(fp, words.size()), deployment_word_);
    const clock::time_point agreeing = clock::now();
    std::error_code ec = agree(msg, dl);
    counters_.step_latency.observe(clock::now() - agreeing);
    if (ec) counters_.agreement_failures.add();
    msg.agreed_words(ec, words);
    std::vector<detail::move_item> batch;
    for (std::size_t i = 0; i < waiting.size(); ++i) {
      if (!waiting[i]->lookup_agreed)
        settle_lookup(*waiting[i], ec, msg.entry(i));
      else
        settle_load(waiting[i], ec, msg.entry(i), batch);
    }
    mover_.submit(std::move(batch));
    return ec;
  }

  // ---- worker side -------------------------------------------------------------------------

  /// Waits until layer `layer` of every chunk every rank agreed to load is in this rank's
  /// pages, and says, per load, which tokens of that layer are there (vLLM's
  /// wait_for_layer_load): the answer's entry for a load is [first_token, ready_end_token). A
  /// load whose agreed reach ended short (its deadline passed, a chunk was gone, a store failed)
  /// lists a ready end below its requested end: compute layer `layer` of the rest yourself, or
  /// recompute those tokens from the outcome's end afterwards (load_result / load_errors,
  /// vLLM's get_block_ids_with_load_errors). Nothing is ever listed as ready that is not in the
  /// pages, and what is listed stays there until finish(). A reach once agreed is final (a late
  /// store hit never extends it): no answer with ec empty lists more for a layer than an earlier
  /// one did, and the connector never writes a layer's pages past an agreed answer's ready end.
  /// Bound: returns by `dl` (while it agrees a group it is a collective: a peer waits for it up
  /// to that peer's own `dl`).
  ///
  /// A collective when a running load has not yet agreed layer group(layer) of all its chunks:
  /// this rank waits for its own part of that group (until a quarter of dl's time is left), then
  /// runs the step's agreement (step(dl), with one word that says whether that wait ran out;
  /// one rank's running out ends the wait on every rank with errc::timeout, the load going on),
  /// until the group is agreed. Which loads need it follows only from agreed values, so call it
  /// for the same layers in the same order on every rank, from the thread that calls step().
  /// Otherwise local: no collective.
  ///
  /// Answers: ec empty: the entries are agreed (equal on every rank). errc::timeout (dl passed
  /// first, on every rank or only on this one while a scatter ran), a failed agreement (step's
  /// errors) or a failed move's error: the entries say what this rank's pages hold, a peer may
  /// hold more; finish the forward and recompute from each load's agreed outcome.
  ///
  ///   conn.load(id, slots);                       // stream_groups: group 0 lands first
  ///   for (std::uint32_t l = 0; l < layers; ++l) {
  ///     const kvtier::layer_wait w = conn.wait_for_layer(l, dl);
  ///     const kvtier::layer_ready* x = w.find(id);  // layer l of [first, ready_end) is in the pages
  ///     compute_layer(l, /*from=*/x ? x->ready_end_token : 0);
  ///   }
  ///   while (!conn.load_result(id)) conn.step(dl);  // cut short? recompute from its end
  layer_wait wait_for_layer(std::uint32_t layer, deadline dl) {
    const auto g = static_cast<std::uint32_t>(std::min<std::size_t>(layer / geo_.per_group, geo_.groups - 1));
    const clock::time_point called = clock::now();
    layer_wait out;
    out.ec = agree_group(g, dl);
    if (!out.ec)
      out.ec = shared_.wait_group_landed(g, dl, [&](const detail::connector_request& r) {
        return detail::group_agreed_chunks(r, g, streamed_);
      });
    out.loads = layer_answers(g);
    counters_.layer_wait.observe(clock::now() - called);
    return out;
  }

 private:
  // wait_for_layer: steps until group g of every running load is agreed (see there).
  std::error_code agree_group(std::uint32_t g, deadline dl) {
    // This rank's own waits end a quarter of the call's time before dl, which the step keeps.
    const deadline own_part = local_io_deadline(dl, time_left(dl) / 4);
    for (;;) {
      std::vector<req_ptr> pending;
      for (request_id id : order_)
        if (const req_ptr& r = requests_.at(id); r->loading && !detail::group_agreed(*r, g, streamed_))
          pending.push_back(r);
      if (pending.empty()) return {};
      const std::size_t bytes = streamed_ ? geo_.group_end(g) : geo_.chunk_bytes;
      for (const req_ptr& r : pending)
        if (!r->local_failure && r->fetch.valid())
          (void)queue_.wait_landed_bytes(r->fetch, bytes, std::min(own_part, r->load_dl));
      std::uint64_t go = expired(own_part) ? 0 : 1;  // min over ranks: 0 once any rank's time is up
      if (std::error_code ec = step(dl, std::span(&go, 1))) return ec;
      if (go == 0) return make_error_code(errc::timeout);
    }
  }

  // The step's one all-reduce (two when its body outgrows the first round; see
  // detail::step_message), and what the agreed header says of the ranks.
  std::error_code agree(detail::step_message& msg, deadline dl) {
    const auto reduce = [&](std::span<std::uint64_t> part) {
      return comm::all_reduce(ctrl_, std::span<const std::uint64_t>(part), part, comm::reduce_op::min, dl);
    };
    if (std::error_code ec = reduce(msg.first_round())) return step_failed(ec, ctrl_.last_error());
    if (!msg.same_deployment())
      return step_failed(make_error_code(errc::invalid_argument),
                         "ranks differ in their deployment (key namespace, ownership, chunk size, value "
                         "format, layers_per_group or stream_groups): check_deployment() names the field");
    if (!msg.same_shape())
      return step_failed(make_error_code(errc::collective_mismatch),
                         "ranks called step() with different numbers of waiting requests or words");
    if (!msg.second_round().empty())
      if (std::error_code ec = reduce(msg.second_round())) return step_failed(ec, ctrl_.last_error());
    if (!msg.same_requests())
      return step_failed(make_error_code(errc::collective_mismatch),
                         "ranks called step() over different requests, load ranges or word counts");
    last_step_error_.clear();
    return {};
  }
  std::error_code step_failed(std::error_code ec, std::string_view why) {
    last_step_error_ = "step agreement failed: " + ec.message();
    if (!why.empty() && why != ec.message()) last_step_error_ += " (" + std::string(why) + ")";
    return ec;
  }

  // Every setting that shapes a collective or decides what a key means, folded: the step's
  // header carries it, so ranks configured differently fail every step with a clear error
  // instead of issuing collectives of different shapes (check_deployment names the field).
  std::uint64_t compute_deployment_word() const {
    std::uint64_t h = 0;
    for (std::uint64_t x : detail::deployment_row(deployment())) h = detail::step_fp_mix(h, x);
    return h;
  }
  deployment_fingerprint deployment() const {
    value_format format = value_format::v1();
    if constexpr (requires { store_.format(); }) format = store_.format();
    deployment_fingerprint f = deployment_fingerprint::of(chunk_.ns(), own_, geo_.chunk_bytes, format);
    f.layers_per_group = geo_.per_group;
    f.stream_groups = streamed_ ? 1 : 0;
    return f;
  }

  // Per load started and not finished: the tokens of layer group g in this rank's pages that
  // every rank agreed to move (see wait_for_layer).
  std::vector<layer_ready> layer_answers(std::uint32_t g) {
    std::vector<layer_ready> out;
    const std::size_t T = chunk_.chunk_tokens();
    std::lock_guard lock(shared_.mu);
    for (request_id id : order_) {
      const detail::connector_request& r = *requests_.at(id);
      if (!r.loading) continue;
      const std::size_t landed = r.local_failure || r.group_landed.empty() ? 0 : r.group_landed[g];
      const std::size_t ready = std::min(landed, detail::group_agreed_chunks(r, g, streamed_));
      out.push_back({id, r.range_first_token, r.range_first_token + ready * T, r.range_end_token});
    }
    return out;
  }

  req_ptr known(request_id id) const {
    const auto it = requests_.find(id);
    return it == requests_.end() ? nullptr : it->second;
  }
  bool separate_data() const noexcept {
    return static_cast<const void*>(&ctrl_) != static_cast<const void*>(&data_);
  }
  std::uint64_t end_of(const detail::connector_request& r) const noexcept {
    return std::min<std::uint64_t>(r.keys.size() * chunk_.chunk_tokens(), r.prompt_tokens);
  }
  std::vector<std::uint64_t> owned_starts_of(const std::vector<std::size_t>& chunks) const {
    std::vector<std::uint64_t> s;
    for (std::size_t c : chunks) s.push_back(static_cast<std::uint64_t>(c) * chunk_.chunk_tokens());
    return s;
  }
  // Why `slots` does not give a page to every position of [first, end) (empty: it does). A
  // negative slot means "skip this token" to kv_copy; to the connector it is a token with no
  // page, which a load would report loaded and a save would store as zeros under its real key.
  std::string slots_problem(std::span<const std::int64_t> slots, std::uint64_t first,
                            std::uint64_t end) const {
    if (slots.size() < end)
      return std::to_string(slots.size()) + " slots for positions up to " + std::to_string(end);
    const auto n = static_cast<std::int64_t>(cache_.layout.num_slots());
    for (std::uint64_t p = first; p < end; ++p)
      if (slots[p] < 0 || slots[p] >= n)
        return "position " + std::to_string(p) + " has slot " + std::to_string(slots[p]) +
               (slots[p] < 0 ? " (no page)" : "") + ", outside the cache's " + std::to_string(n) + " slots";
    return {};
  }

  // One staging block per load, counted in flight until its last holder lets go.
  bool reserve_staging(detail::connector_request& r) {
    r.staging = staging_->take(r.n * geo_.chunk_bytes, opt_.max_bytes_in_flight);
    return r.staging != nullptr;
  }

  // The chunks of [first_token, end_token) this rank owns and admits, to save from `slots`;
  // empty for an unknown id or slots that do not fit.
  std::optional<detail::save_job> owned_save(request_id id, std::span<const std::int64_t> slots,
                                             std::uint64_t first_token, std::uint64_t end_token) const {
    const req_ptr r = known(id);
    if (!r || first_token > end_token || end_token > slots.size()) return std::nullopt;
    const std::size_t T = chunk_.chunk_tokens();
    detail::save_job job{.r = r};
    for (std::size_t c = (first_token + T - 1) / T; c < end_token / T && c < r->keys.size(); ++c)
      if (static_cast<rank_t>(own_.owner(c)) == rank() && admitted(r->keys[c])) job.chunks.push_back(c);
    // Every position of every chunk it covers has a page (any rank's chunk: the same call on
    // every rank must fail alike), before anything is queued.
    const std::uint64_t covered_end = std::min<std::uint64_t>(end_token / T, r->keys.size()) * T;
    const std::uint64_t covered_first = std::min(covered_end, (first_token + T - 1) / T * T);
    if (!slots_problem(slots, covered_first, covered_end).empty()) return std::nullopt;
    if (!job.chunks.empty())
      job.slots.assign(slots.begin(), slots.begin() + static_cast<std::ptrdiff_t>(end_token));
    return job;
  }

  bool admitted(const chunk_key& k) const {
    return opt_.saves == save_policy::write_through || lookup_counts_.of(k) >= opt_.save_after_lookups;
  }

  // This rank's words of one entry (see detail::lookup_words and detail::load_words).
  void contribute(detail::connector_request& r, std::span<std::uint64_t> e) {
    if (r.lookup_agreed) {
      if (!r.fetch_explained && !r.local_failure && r.fetch.valid()) explain_fetch(r);
      if (streamed_) return detail::streamed_contribution(r, queue_, shared_, geo_).encode(e);
      return detail::load_contribution(r, queue_, shared_, chunk_.chunk_tokens()).encode(e);
    }
    detail::lookup_contribution(r, queue_, end_of(r), [&](const fetch_result* res) {
      if (res) shared_.note_evictions(r, res->status, rank());
      note_error(r, detail::lookup_failure(r, res, rank(), opt_.lookup_timeout, store_));
    }).encode(e);
  }

  // Once this rank's fetch of load r completed, or the load's deadline passed first: its reason.
  void explain_fetch(detail::connector_request& r) {
    const std::optional<fetch_result> res = queue_.poll(r.fetch);
    if (!res && !expired(r.load_dl)) return;
    r.fetch_explained = true;
    note_error(r, detail::fetch_failure(r, res ? &*res : nullptr, queue_.progress(r.fetch), rank(), store_));
  }

  void note_error(detail::connector_request& r, std::optional<request_error> e) {
    if (!e) return;
    std::lock_guard lock(shared_.mu);
    detail::note_error_locked(r, std::move(*e));
  }

  void settle_lookup(detail::connector_request& r, std::error_code ec, std::span<const std::uint64_t> e) {
    const detail::lookup_words agreed = detail::lookup_words::decode(e);
    if (!ec && !agreed.ready) return;  // some rank's answer is not in yet
    r.lookup_agreed = true;
    counters_.lookup_latency.observe(clock::now() - r.lookup_started);
    if (ec)
      note_error(r,
                 detail::agreement_failure(r, request_error::stage::lookup, rank(), 0, ec, last_step_error_));
    const std::uint64_t hit = ec ? 0 : std::min(agreed.answer_tokens, end_of(r));
    const detail::planned_range p = slow_tier_.plan(opt_, estimator_, hit, r.prompt_tokens,
                                                    chunk_.chunk_tokens(), own_.world_size(), r.probe);
    r.agreed_cached_tokens = hit;
    r.load_first_token = p.first;
    r.load_end_token = p.end;
  }

  void settle_load(const req_ptr& r, std::error_code ec, std::span<const std::uint64_t> e,
                   std::vector<detail::move_item>& batch) {
    if (ec)
      note_error(*r, detail::agreement_failure(*r, request_error::stage::load, rank(), r->first_chunk, ec,
                                               last_step_error_));
    if (const auto c =
            detail::settle_load_entry(r, bool(ec), detail::load_words::decode(e), streamed_, shared_, batch))
      conclude_load(*r, *c);
  }

  // The slowest rank's time feeds the estimator (the same sample on every rank): a full load's,
  // or a cut one's extrapolated to all its chunks (a tier slower than recomputing is learnt
  // from the loads its race deadline cuts, detail/slow_tier.hpp).
  void conclude_load(detail::connector_request& r, const detail::load_conclusion& c) {
    const std::size_t chunks = c.chunks;
    const double elapsed_s = static_cast<double>(c.elapsed_us) * 1e-6;
    if (c.timed && opt_.wall_clock_samples) {
      if (opt_.policy == load_policy::always) {
        if (c.sample) estimator_.record_bytes(chunks * geo_.chunk_bytes, elapsed_s);
      } else if (r.n > 0) {
        estimator_.record_bytes(r.n * geo_.chunk_bytes,
                                detail::slow_tier_guard::sample_seconds(r.n, chunks, elapsed_s));
        if (slow_tier_.concluded(opt_, r.n * chunk_.chunk_tokens(), chunks == r.n, elapsed_s, r.probe))
          estimator_.reset();
      }
    }
    detail::end_load(r, chunks, chunk_.chunk_tokens(), counters_, shared_);
  }

  chunker<> chunk_;
  Own own_;
  Store& store_;
  Control& ctrl_;
  Data& data_;
  kv_cache_view cache_;
  connector_options opt_;
  const bool streamed_ = group_streaming_store<Store> && opt_.stream_groups;  // loads stream by group
  detail::connector_geometry geo_;
  fetch_queue<Store> queue_;
  load_estimator estimator_;
  detail::slow_tier_guard slow_tier_;  // cost, split: probes of a tier judged slower than recomputing
  connector_counters counters_;

  // Engine thread.
  std::uint64_t deployment_word_ = 0;  // compute_deployment_word(), once
  std::string last_step_error_;
  std::unordered_map<request_id, req_ptr> requests_;
  std::vector<request_id> order_;  // begin_lookup order: the order of the step's entries
  detail::quarantine quarantine_;
  detail::lookup_counts lookup_counts_;  // selective saves
  std::shared_ptr<detail::staging_pool> staging_ =
      std::make_shared<detail::staging_pool>(opt_.max_bytes_in_flight);

  // Shared with the mover and saver threads; they start last and stop first (~connector).
  detail::connector_shared shared_;
  detail::connector_mover<Data, Own> mover_;
  detail::connector_saver<Store> saver_;
};

/// Deduction for the one-communicator form.
template <chunk_store Store, comm::communicator Control, ownership_policy Own>
connector(chunker<>, Own, Store&, Control&, kv_cache_view, connector_options = {})
    -> connector<Store, Control, Control, Own>;

}  // namespace kvtier
