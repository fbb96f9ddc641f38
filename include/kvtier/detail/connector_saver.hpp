// kvtier/detail/connector_saver.hpp: the saves of kvtier::connector (kvtier/connector.hpp):
// a thread of its own gathers an owner's chunks from the pages and puts them in the store with
// the save deadline, one save at a time in the order save() was called. Not public API.
//
// The saver calls the store itself rather than fetch_queue::put: a put on the queue would hold
// one of the fetch workers for up to the save deadline (2 s by default), so a slow save could
// delay a load's fetch past its own deadline and cut it short. Saves never delay loads here.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "kvtier/connector/types.hpp"
#include "kvtier/deadline.hpp"
#include "kvtier/detail/connector_errors.hpp"
#include "kvtier/detail/connector_state.hpp"
#include "kvtier/detail/cv_wait.hpp"
#include "kvtier/errc.hpp"
#include "kvtier/kv_copy.hpp"
#include "kvtier/store/chunk_store.hpp"

namespace kvtier::detail {

/// A save layer by layer (connector::begin_save / save_layer): its chunks are gathered from the
/// pages one layer group at a time, as the forward reports the group's layers final, into the
/// save's own buffer; the job that gathers the last group puts them all.
struct layer_save {
  std::vector<std::size_t> chunks;  // prompt indexes
  std::vector<std::int64_t> slots;
  std::vector<std::byte> values;       // chunks.size() values, filled group by group (saver thread)
  std::vector<bool> failed;            // per chunk: a gather failed (saver thread)
  std::optional<request_error> why;    // its first failure (saver thread)
  std::uint32_t gathered = 0;          // groups gathered (saver thread)
  std::vector<std::uint32_t> layers_left;  // per group: layers not yet reported (engine thread)
  std::vector<bool> layer_seen;            // per layer: reported (engine thread)
  std::uint32_t groups_submitted = 0;      // (engine thread)
  clock::time_point begun = clock::now();
};

/// Chunks (prompt indexes) of one request to save from the pages at `slots`; or, with
/// `by_layer`, layer group `group` of that save to gather (the last one puts), or with `abandon`
/// the end of a save whose remaining groups were never reported (it fails, nothing is put).
struct save_job {
  connector_request_ptr r;
  std::vector<std::size_t> chunks;
  std::vector<std::int64_t> slots;
  std::shared_ptr<layer_save> by_layer;
  std::uint32_t group = 0;
  bool abandon = false;
  clock::time_point submitted = clock::now();
};

template <chunk_store Store>
class connector_saver {
 public:
  connector_saver(Store& store, const connector_geometry& geo, connector_shared& shared,
                  connector_counters& counters, std::chrono::milliseconds save_timeout, rank_t rank)
      : store_(store),
        geo_(geo),
        shared_(shared),
        counters_(counters),
        save_timeout_(save_timeout),
        rank_(rank) {
    worker_.start([this](save_job& job) { run(job); });
  }

  /// Queues a save; the request counts it pending (under shared.mu) until it ended. A save by
  /// layer counts once, from open() until its last group's job or its abandon job ended.
  void submit(save_job job) {
    if (!job.by_layer) {
      std::lock_guard lock(shared_.mu);
      ++job.r->saves_pending;
    }
    worker_.submit(std::move(job));
  }

  /// connector::begin_save of `job` (its chunks and slots): opens r's save by layer; pending
  /// once if it has chunks. errc::invalid_argument while one is still being reported.
  std::error_code begin_by_layer(save_job job) {
    const connector_request_ptr& r = job.r;
    if (r->by_layer && r->by_layer->groups_submitted < geo_.groups) return make_error_code(errc::invalid_argument);
    auto ls = std::make_shared<layer_save>();
    ls->chunks = std::move(job.chunks);
    ls->slots = std::move(job.slots);
    for (std::uint32_t g = 0; g < geo_.groups; ++g)
      ls->layers_left.push_back(geo_.group_layers(g).last - geo_.group_layers(g).first);
    ls->layer_seen.assign(geo_.cache.layout.num_layers, false);
    if (!ls->chunks.empty()) {
      std::lock_guard lock(shared_.mu);
      ++r->saves_pending;
    }
    r->by_layer = std::move(ls);
    return {};
  }

  /// connector::save_layer: counts layer `layer` of r's save by layer down; its group's gather
  /// is queued once every layer of the group was reported. errc::invalid_argument for no save by
  /// layer, a layer out of range, or one reported already.
  std::error_code report_layer(const connector_request_ptr& r, std::uint32_t layer) {
    if (!r->by_layer || layer >= geo_.cache.layout.num_layers || r->by_layer->layer_seen[layer])
      return make_error_code(errc::invalid_argument);
    layer_save& ls = *r->by_layer;
    ls.layer_seen[layer] = true;
    const std::uint32_t g = layer / geo_.per_group;
    if (--ls.layers_left[g] > 0) return {};
    ++ls.groups_submitted;
    if (!ls.chunks.empty()) submit({.r = r, .by_layer = r->by_layer, .group = g});
    return {};
  }

  /// connector::finish: r's save by layer with groups never reported ends failed (nothing put).
  void abandon_by_layer(const connector_request_ptr& r) {
    if (const auto& ls = r->by_layer; ls && !ls->chunks.empty() && ls->groups_submitted < geo_.groups)
      submit({.r = r, .by_layer = ls, .abandon = true});
  }

  /// Runs the saves already submitted, then joins the thread (idempotent).
  void stop() { worker_.stop(); }

  /// connector::finish of r: true when none of its saves still runs (its save failure, if any,
  /// goes to the next finished()'s save_errors); else r is kept until finished() lists it.
  bool finish(connector_request_ptr r) {
    std::lock_guard lock(shared_.mu);
    r->finish_called = true;
    if (r->saves_pending) {
      finishing_.push_back(std::move(r));
      return false;
    }
    append_save_errors(*r, ended_errors_);
    return true;
  }

  /// `known` if set, else the held request `id`, if any; under shared.mu.
  connector_request_ptr find_locked(connector_request_ptr known, request_id id) const {
    if (known) return known;
    const auto it =
        std::find_if(finishing_.begin(), finishing_.end(), [&](const auto& f) { return f->id == id; });
    return it == finishing_.end() ? nullptr : *it;
  }

  /// connector::wait_for_save of `known` (a request not finished) or of the held request `id`.
  std::error_code wait(connector_request_ptr known, request_id id, deadline dl) {
    std::unique_lock lock(shared_.mu);
    const connector_request_ptr r = find_locked(std::move(known), id);
    if (!r) return make_error_code(errc::invalid_argument);
    if (!wait_until(shared_.saved, lock, dl, [&] { return r->saves_pending == 0; }))
      return make_error_code(errc::timeout);
    return {};
  }

  /// connector::errors of `known` or of the held request `id`.
  std::vector<request_error> errors(connector_request_ptr known, request_id id) const {
    std::lock_guard lock(shared_.mu);
    const connector_request_ptr r = find_locked(std::move(known), id);
    return r ? r->errors : std::vector<request_error>{};
  }

  /// Moves the kept requests whose saves all ended into `out.saves`, and the save failures of
  /// those and of the requests finished since the last call into `out.save_errors`.
  void take_ended(finished_requests& out) {
    std::lock_guard lock(shared_.mu);
    out.save_errors = std::exchange(ended_errors_, {});
    std::erase_if(finishing_, [&](const connector_request_ptr& r) {
      if (r->saves_pending) return false;
      out.saves.push_back(r->id);
      append_save_errors(*r, out.save_errors);
      return true;
    });
  }

 private:
  void run(save_job& job) {
    if (job.by_layer) return run_layer(job);
    std::vector<std::byte> values(job.chunks.size() * geo_.chunk_bytes);
    std::vector<bool> failed(job.chunks.size(), false);
    std::optional<request_error> why;  // the first failure of this save, in words
    for (std::size_t k = 0; k < job.chunks.size(); ++k)
      gather(job, job.chunks[k], job.slots, values, k, {}, failed, why);
    put(job, job.chunks, values, failed, std::move(why));
  }

  // One layer group of a save by layer; the last one puts (an abandon job: the save fails).
  void run_layer(save_job& job) {
    layer_save& ls = *job.by_layer;
    if (job.abandon) {
      if (!ls.why)
        ls.why = explain(job, ls.chunks.front(), make_error_code(errc::invalid_argument),
                         "finished before layer group " + std::to_string(ls.gathered) + " of " +
                             std::to_string(geo_.groups) + " was reported saved (save_layer): nothing stored",
                         false);
      counters_.save_failures.add();
      return end_save(job, {}, false, std::move(ls.why));
    }
    if (ls.values.empty()) ls.values.resize(ls.chunks.size() * geo_.chunk_bytes), ls.failed.assign(ls.chunks.size(), false);
    for (std::size_t k = 0; k < ls.chunks.size(); ++k)
      if (!ls.failed[k]) gather(job, ls.chunks[k], ls.slots, ls.values, k, geo_.group_layers(job.group), ls.failed, ls.why);
    if (++ls.gathered == geo_.groups) put(job, ls.chunks, ls.values, ls.failed, std::move(ls.why));
  }

  // Gathers layers `layers` of prompt chunk c into value k of `values`; a failure marks it.
  void gather(const save_job& job, std::size_t c, std::span<const std::int64_t> slots, std::span<std::byte> values,
              std::size_t k, layer_range layers, std::vector<bool>& failed, std::optional<request_error>& why) {
    const std::span<std::byte> v = values.subspan(k * geo_.chunk_bytes, geo_.chunk_bytes);
    const std::span<std::byte> part = layers.last == UINT32_MAX
                                          ? v
                                          : chunk_layers(geo_.cache.layout, geo_.chunk_tokens, v, layers);
    if (const std::error_code ec = kv_gather(geo_.cache, geo_.chunk_slots(slots, c), part, layers)) {
      failed[k] = true;
      if (!why) why = explain(job, c, ec, "gather from the pages: " + ec.message(), false);
    }
  }

  // Puts the gathered chunks (those not failed) with the save deadline, and ends the save.
  void put(const save_job& job, std::span<const std::size_t> chunks, std::span<const std::byte> values,
           const std::vector<bool>& failed, std::optional<request_error> why) {
    std::vector<chunk_key> keys;
    std::vector<std::size_t> chunk_of;  // the prompt chunk of each key
    std::vector<std::span<const std::byte>> src;
    for (std::size_t k = 0; k < chunks.size(); ++k) {
      if (failed[k]) continue;
      keys.push_back(job.r->keys[chunks[k]]);
      chunk_of.push_back(chunks[k]);
      src.push_back(values.subspan(k * geo_.chunk_bytes, geo_.chunk_bytes));
    }
    std::vector<chunk_status> st(keys.size(), chunk_status::error);
    const std::error_code ec = store_.put(keys, src, st, deadline_after(save_timeout_));
    std::vector<chunk_key> stored;
    for (std::size_t k = 0; k < keys.size(); ++k) {
      if (st[k] == chunk_status::stored) {
        stored.push_back(keys[k]);
      } else if (!why) {
        const auto [kec, text] = key_failure(st[k], ec, /*put=*/true);
        why = explain(job, chunk_of[k], kec, text, true);
      }
    }
    counters_.chunks_saved.add(stored.size());
    const bool bad = ec || stored.size() != chunks.size();
    if (bad && !why) why = explain(job, chunks.front(), ec, ec.message(), true);
    if (bad) counters_.save_failures.add();
    end_save(job, std::move(stored), bad, std::move(why));
  }

  // A save ended: its stored keys (an event), its failure, one pending save less.
  void end_save(const save_job& job, std::vector<chunk_key> stored, bool failed, std::optional<request_error> why) {
    std::lock_guard lock(shared_.mu);
    for (const chunk_key& k : stored) shared_.remember_stored_locked(k);
    if (!stored.empty()) shared_.events.push_back({kv_event::kind::stored, rank_, std::move(stored)});
    job.r->save_failed = job.r->save_failed || failed || job.abandon;
    if (why) note_error_locked(*job.r, std::move(*why));
    counters_.save_latency.observe(clock::now() - (job.by_layer ? job.by_layer->begun : job.submitted));
    --job.r->saves_pending;
    shared_.saved.notify_all();
  }

  static void append_save_errors(const connector_request& r, std::vector<request_error>& out) {
    for (const request_error& e : r.errors)
      if (e.what == request_error::stage::save) out.push_back(e);
  }

  request_error explain(const save_job& job, std::size_t chunk, std::error_code ec, std::string_view why,
                        bool from_store) {
    return describe_error(job.r->id, request_error::stage::save, rank_, chunk, ec, why,
                          from_store ? store_words(store_) : std::string{});
  }

  Store& store_;
  const connector_geometry& geo_;
  connector_shared& shared_;
  connector_counters& counters_;
  std::chrono::milliseconds save_timeout_;
  rank_t rank_;
  std::vector<connector_request_ptr> finishing_;  // finished with saves pending (under shared.mu)
  std::vector<request_error> ended_errors_;       // of requests whose saves had ended at finish()
  serial_worker<save_job> worker_;                // last: it stops before the members above go
};

}  // namespace kvtier::detail
