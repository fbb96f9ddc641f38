// kvtier/connector/detail/saver.hpp: the saves of kvtier::connector (kvtier/connector.hpp):
// a thread of its own puts an owner's chunks in the store from the pages (from where they lie,
// for a store that takes values in pieces; else gathered into a buffer first) with the save
// deadline, one save at a time in the order save() was called. Not public API.
//
// The saver calls the store itself rather than fetch_queue::put: a put on the queue would hold
// one of the fetch workers for up to the save deadline (2 s by default), so a slow save could
// delay a load's fetch past its own deadline and cut it short. Saves never delay loads here.
//
// Exceptions. Nothing a save throws (the buffer's allocation, a gather, the store's put) leaves
// the saver thread, where it would end the process: the job that ends the save (a whole save;
// the last group or the abandon of a save by layer) ends it failed, counted in save_failures,
// its pending count down exactly once, with the exception as its reason ("save of chunk 3: the
// store threw: <what()>", or "out of memory ..."); a group of a save by layer that throws makes
// that save's last job end it failed, nothing put.
#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "kvtier/connector/detail/errors.hpp"
#include "kvtier/connector/detail/state.hpp"
#include "kvtier/connector/types.hpp"
#include "kvtier/deadline.hpp"
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
  std::vector<std::byte> values;      // chunks.size() values, filled group by group (saver thread)
  std::vector<bool> failed;           // per chunk: a gather failed (saver thread)
  std::vector<value_hasher> hashers;  // per chunk: its checksums, group by group as gathered (saver thread)
  bool hashed_in_order = true;        // every group so far gathered in layer order (saver thread)
  std::optional<request_error> why;   // its first failure (saver thread)
  std::uint32_t gathered = 0;         // groups gathered (saver thread)
  bool broken = false;                // a group's job threw: the last one puts nothing (saver thread)
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
  bool ends = true;    // this job ends its save (false: a group of a save by layer before its last)
  bool ended = false;  // end_save ran for it (saver thread)
  std::optional<request_error> why;  // a whole save's first failure (saver thread)
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
    slice_putter_.start([](std::function<void()>& put) { put(); }, [](std::function<void()>&) {});
    worker_.start([this](save_job& job) { run(job); }, [this](save_job& job) { escaped(job); });
  }

  /// Queues a save; the request counts it pending (under shared.mu) until it ended. A save by
  /// layer counts once, from open() until its last group's job or its abandon job ended.
  /// If queueing it throws (out of memory), the count is taken back and the exception goes on.
  void submit(save_job job) {
    const connector_request_ptr r = job.r;
    const bool counted = !job.by_layer;
    if (counted) {
      std::lock_guard lock(shared_.mu);
      ++r->saves_pending;
    }
    try {
      worker_.submit(std::move(job));
    } catch (...) {
      if (counted) {
        std::lock_guard lock(shared_.mu);
        --r->saves_pending;
        shared_.saved.notify_all();
      }
      throw;
    }
  }

  /// connector::begin_save of `job` (its chunks and slots): opens r's save by layer; pending
  /// once if it has chunks. errc::invalid_argument while one is still being reported.
  std::error_code begin_by_layer(save_job job) {
    const connector_request_ptr& r = job.r;
    if (r->by_layer && r->by_layer->groups_submitted < geo_.groups)
      return make_error_code(errc::invalid_argument);
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
    if (ls.chunks.empty()) return {};
    try {  // the last group's job ends the save: one that could not be queued is not reported
      submit({.r = r, .by_layer = r->by_layer, .group = g, .ends = ls.groups_submitted == geo_.groups});
    } catch (...) {
      --ls.groups_submitted;
      ++ls.layers_left[g];
      ls.layer_seen[layer] = false;
      throw;
    }
    return {};
  }

  /// connector::finish: r's save by layer with groups never reported ends failed (nothing put).
  void abandon_by_layer(const connector_request_ptr& r) {
    if (const auto& ls = r->by_layer; ls && !ls->chunks.empty() && ls->groups_submitted < geo_.groups)
      submit({.r = r, .by_layer = ls, .abandon = true});
  }

  /// Runs the saves already submitted, then joins the thread (idempotent).
  void stop() {
    worker_.stop();
    slice_putter_.stop();
  }

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
  // What ends a save: the keys stored (their event), and whether it failed.
  struct save_end {
    std::vector<chunk_key> stored;
    bool failed = false;
  };

  // The job boundary on the saver thread: see "Exceptions" at the top of this file.
  void run(save_job& job) {
    bool in_store = false;  // the store's put is running: what throws now, the store threw
    save_end end;
    try {
      if (!job.by_layer && skip_late(job)) {
        end.failed = true;
      } else if (!job.by_layer) {
        run_whole(job, end, in_store);
      } else if (!run_layer(job, end, in_store)) {
        return;  // a group before the last of a save by layer: nothing ends yet
      }
    } catch (...) {
      const exception_words w = current_exception_words();
      if (job.by_layer) job.by_layer->broken = true;
      if (std::optional<request_error>& why = reason_of(job); !why) why = thrown_reason(job, w, in_store);
      if (!job.ends) return;  // a group before the last of a save by layer: the last one ends it
      end.stored.clear();     // nothing is known stored, and no event says so
      end.failed = true;
    }
    end_save(job, std::move(end));
  }

  // A whole save that waited save_timeout behind other saves is skipped (failed, counted in
  // saves_skipped): saves that cannot keep up with a slow store are dropped, not queued without
  // bound while they hold the request's pages.
  bool skip_late(save_job& job) {
    const auto waited = clock::now() - job.submitted;
    if (waited < save_timeout_) return false;
    counters_.saves_skipped.add();
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(waited).count();
    job.why = explain(job, job.chunks.empty() ? 0 : job.chunks.front(), make_error_code(errc::timeout),
                      "skipped: waited " + std::to_string(ms) + " ms behind slower saves (save_timeout " +
                          std::to_string(save_timeout_.count()) + " ms)",
                      false);
    return true;
  }

  // serial_worker's last resort, for what run() did not foresee (it lets nothing escape): a job
  // that ends its save and has not yet ends it failed, so no pending count is lost.
  void escaped(save_job& job) noexcept {
    if (job.by_layer) job.by_layer->broken = true;
    if (!job.ends || job.ended) return;
    save_end end;
    end.failed = true;
    end_save(job, std::move(end));
  }

  // A save's first failure: a save by layer's, or a whole save's (in the job).
  static std::optional<request_error>& reason_of(save_job& job) noexcept {
    return job.by_layer ? job.by_layer->why : job.why;
  }

  // One slice's put on the slice putter's thread: its end, and what it threw in words (the saver
  // throws them again as an exception of its own, so no exception object crosses threads).
  struct slice_put {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    std::optional<exception_words> threw;
    void finish(std::optional<exception_words> t) noexcept {
      {
        std::lock_guard lock(mu);
        threw = std::move(t);
        done = true;
      }
      cv.notify_all();
    }
    void wait() {
      std::unique_lock lock(mu);
      cv.wait(lock, [this] { return done; });
    }
  };

  // A whole save. A piecewise_put_store is handed each chunk as it lies in the pages
  // (kv_pieces), so no copy runs before the send: the pages are the request's until its saves end
  // (connector::save), and bytes changed under the send fail their checksum on read, never a hit.
  // When every chunk is there, that is one put, the store hashing each value just before it
  // sends it (as a put of already gathered bytes does: the pages are read once to hash, once to
  // send, nothing written). A chunk in pieces under min_piece_bytes on average (or with a
  // skipped token, which connector::save refuses before it queues) is gathered into the save's
  // buffer; such a save (and every save to another store) goes in slices of about slice_bytes:
  // each slice is made ready (gathered and hashed in the gather, or hashed in the pages) while
  // the slice before it is put on the slice putter's thread, so it costs about its put plus one
  // slice's gather. One deadline for every put.
  void run_whole(save_job& job, save_end& end, bool& in_store) {
    const std::size_t n = job.chunks.size(), cb = geo_.chunk_bytes;
    std::vector<std::vector<std::span<const std::byte>>> pieces(n);  // each chunk's bytes, in order
    std::vector<bool> from_pages(n, false);
    bool gathers = false;
    for (std::size_t k = 0; k < n; ++k)
      gathers |= !(from_pages[k] = in_pages(job.chunks[k], job.slots, pieces[k]));
    if (!gathers) {
      const std::vector<value_pieces> all(pieces.begin(), pieces.end());
      put(job, job.chunks, all, std::vector<bool>(n, false), job.why, end, in_store, {},
          deadline_after(save_timeout_));
      return;
    }
    // One buffer for every whole save (saves run one at a time on this thread): no fresh pages
    // to fault in and zero per save. Every byte a put sends is gathered first (or its chunk failed).
    if (gathers && whole_values_.size() < n * cb) whole_values_.resize(n * cb);
    const std::span<std::byte> values =
        gathers ? std::span(whole_values_).first(n * cb) : std::span<std::byte>();
    std::vector<value_pieces> ready(n);  // chunk k's pieces once made ready
    std::vector<bool> failed(n, false);
    std::vector<value_hasher> hashers(hashing() ? n : 0);
    const deadline dl = deadline_after(save_timeout_);
    const std::size_t per = std::max<std::size_t>(1, slice_bytes / std::max<std::size_t>(cb, 1));
    std::optional<request_error> put_why;  // the puts' first failure (the helper's while one runs)
    save_end slice_end;                    // the slice in flight's outcome (the helper's while it runs)
    std::shared_ptr<slice_put> in_flight;  // the put of the slice before (on slice_putter_)
    struct wait_for_put {                  // last: a gather that throws waits here for the put it overlaps
      std::shared_ptr<slice_put>& put;
      ~wait_for_put() {
        if (put) put->wait();
      }
    } const put_waited{in_flight};
    auto settle = [&] {  // the put in flight ended: its outcome joins the save's
      if (!in_flight) return;
      in_flight->wait();
      const std::optional<exception_words> threw = std::move(in_flight->threw);
      in_flight.reset();
      if (threw) {  // what the put threw, thrown again here: run() names it (the store threw)
        in_store = true;
        if (threw->out_of_memory) throw std::bad_alloc();
        throw std::runtime_error(threw->what);
      }
      end.stored.insert(end.stored.end(), slice_end.stored.begin(), slice_end.stored.end());
      end.failed |= slice_end.failed;
      slice_end = {};
    };
    for (std::size_t first = 0; first < n; first += per) {
      const std::size_t last = std::min(n, first + per);
      for (std::size_t k = first; k < last; ++k) {
        value_hasher* const h = hashers.empty() ? nullptr : &hashers[k];
        if (h) h->begin(store_format(), cb);
        if (from_pages[k]) {
          if (h)
            for (const auto& p : pieces[k]) h->update(p);
        } else {
          gather(job, job.chunks[k], job.slots, values, k, {}, failed, job.why, h);
          pieces[k].assign(1, values.subspan(k * cb, cb));
        }
        ready[k] = pieces[k];
      }
      settle();
      auto next = std::make_shared<slice_put>();
      slice_putter_.submit(
          [&, next, first, last,
           slice_failed = std::vector<bool>(failed.begin() + static_cast<std::ptrdiff_t>(first),
                                            failed.begin() + static_cast<std::ptrdiff_t>(last))] {
            std::optional<exception_words> threw;
            try {
              bool helper_in_store = false;
              put(job, std::span(job.chunks).subspan(first, last - first),
                  std::span<const value_pieces>(ready).subspan(first, last - first), slice_failed, put_why,
                  slice_end, helper_in_store,
                  hashers.empty() ? std::span<const value_hasher>()
                                  : std::span<const value_hasher>(hashers).subspan(first, last - first),
                  dl);
            } catch (...) {
              threw = current_exception_words();
            }
            next->finish(std::move(threw));
          });
      in_flight = std::move(next);  // only once queued: a put never queued is never waited for
    }
    settle();
    if (!job.why) job.why = put_why;
    if (whole_values_.size() > kept_buffer_bytes) std::vector<std::byte>().swap(whole_values_);
  }

  // Chunk c's bytes where they lie in the pages, into `out`, for a store that puts from pieces;
  // false (out empty) when the chunk is to be gathered instead (see run_whole).
  bool in_pages(std::size_t c, std::span<const std::int64_t> slots,
                std::vector<std::span<const std::byte>>& out) {
    if constexpr (piecewise_put_store<Store>) {
      // A slot the pages do not have fails here and again in the gather, which reports it.
      if (!kv_pieces(geo_.cache, geo_.chunk_slots(slots, c), {}, out) &&
          out.size() * min_piece_bytes <= geo_.chunk_bytes)
        return true;
      out.clear();
    }
    return false;
  }

  // A whole save is put in slices of about this many bytes, each while the next is made ready.
  static constexpr std::size_t slice_bytes = std::size_t{8} << 20;
  // run_whole's buffer is kept between saves up to this size (a larger one is given back).
  static constexpr std::size_t kept_buffer_bytes = std::size_t{256} << 20;
  // Pieces smaller than this on average (a page of a few tokens, or a token's rows apart) cost a
  // system call's iovec each: such a chunk is gathered into one buffer instead.
  static constexpr std::size_t min_piece_bytes = 4096;

  // The store takes checksums computed in the gather (one pass over the bytes: copy and hash).
  static constexpr bool hashing() noexcept { return prehashed_put_store<Store>; }
  value_format store_format() const {
    if constexpr (prehashed_put_store<Store>)
      return store_.format();
    else
      return value_format::v1();
  }

  // One layer group of a save by layer; the last one puts (an abandon job: the save fails).
  // True when this job ends the save (`end` says how).
  bool run_layer(save_job& job, save_end& end, bool& in_store) {
    layer_save& ls = *job.by_layer;
    if (job.abandon) {
      if (!ls.why)
        ls.why = explain(job, ls.chunks.front(), make_error_code(errc::invalid_argument),
                         "finished before layer group " + std::to_string(ls.gathered) + " of " +
                             std::to_string(geo_.groups) + " was reported saved (save_layer): nothing stored",
                         false);
      end.failed = true;
      return true;
    }
    // Groups reported in layer order are hashed as they are gathered; any other order: the store hashes.
    if (ls.hashed_in_order && (!hashing() || job.group != ls.gathered))
      ls.hashed_in_order = false, ls.hashers.clear();
    ++ls.gathered;
    if (!ls.broken) {
      if (ls.values.empty()) {
        ls.values.resize(ls.chunks.size() * geo_.chunk_bytes), ls.failed.assign(ls.chunks.size(), false);
        if (ls.hashed_in_order) {
          ls.hashers.resize(ls.chunks.size());
          for (auto& h : ls.hashers) h.begin(store_format(), geo_.chunk_bytes);
        }
      }
      for (std::size_t k = 0; k < ls.chunks.size(); ++k)
        if (!ls.failed[k])
          gather(job, ls.chunks[k], ls.slots, ls.values, k, geo_.group_layers(job.group), ls.failed, ls.why,
                 ls.hashers.empty() ? nullptr : &ls.hashers[k]);
    }
    if (!job.ends) return false;
    if (ls.broken) {  // an earlier group's job threw: nothing is put (ls.why says why)
      end.failed = true;
      return true;
    }
    std::vector<std::span<const std::byte>> whole(ls.chunks.size());
    std::vector<value_pieces> values(ls.chunks.size());
    for (std::size_t k = 0; k < whole.size(); ++k)
      whole[k] = std::span<const std::byte>(ls.values).subspan(k * geo_.chunk_bytes, geo_.chunk_bytes),
      values[k] = value_pieces(&whole[k], 1);
    put(job, ls.chunks, values, ls.failed, ls.why, end, in_store, ls.hashers, deadline_after(save_timeout_));
    return true;
  }

  // Gathers layers `layers` of prompt chunk c into value k of `values`; a failure marks it.
  // With `hasher`, each stretch of the value is hashed as it is copied (kv_gather's sink).
  void gather(const save_job& job, std::size_t c, std::span<const std::int64_t> slots,
              std::span<std::byte> values, std::size_t k, layer_range layers, std::vector<bool>& failed,
              std::optional<request_error>& why, value_hasher* hasher) {
    const std::span<std::byte> v = values.subspan(k * geo_.chunk_bytes, geo_.chunk_bytes);
    const std::span<std::byte> part =
        layers.last == UINT32_MAX ? v : chunk_layers(geo_.cache.layout, geo_.chunk_tokens, v, layers);
    const auto chunk_slots = geo_.chunk_slots(slots, c);
    // A skipped token's rows are not gathered: zeros, as in a fresh buffer, never an older save's bytes.
    if (std::any_of(chunk_slots.begin(), chunk_slots.end(), [](std::int64_t s) { return s < 0; }))
      std::fill(part.begin(), part.end(), std::byte{0});
    const std::error_code ec =
        hasher == nullptr ? kv_gather(geo_.cache, chunk_slots, part, layers)
                          : kv_gather(geo_.cache, chunk_slots, part, layers, nullptr,
                                      [hasher](std::span<const std::byte> bytes) { hasher->update(bytes); });
    if (ec) {
      failed[k] = true;
      if (!why) why = explain(job, c, ec, "gather from the pages: " + ec.message(), false);
    }
  }

  // Puts the chunks (those not failed; values[k]: chunk k's bytes in pieces, in the pages or
  // one piece gathered) with the save deadline: `end` gets the keys stored and whether the save
  // failed, `why` its first failure. `hashers` (one per chunk, or none): the checksums computed
  // in the pages or the gathers, put with the values when every one is complete (else the
  // store hashes).
  void put(const save_job& job, std::span<const std::size_t> chunks, std::span<const value_pieces> values,
           const std::vector<bool>& failed, std::optional<request_error>& why, save_end& end, bool& in_store,
           std::span<const value_hasher> hashers, deadline dl) {
    std::vector<chunk_key> keys;
    std::vector<std::size_t> chunk_of;  // the prompt chunk of each key
    std::vector<value_pieces> src;
    std::vector<value_digest> digests;
    bool hashed = hashers.size() == chunks.size();
    for (std::size_t k = 0; k < chunks.size(); ++k) {
      if (failed[k]) continue;
      keys.push_back(job.r->keys[chunks[k]]);
      chunk_of.push_back(chunks[k]);
      src.push_back(values[k]);
      if (hashed && (hashed = hashers[k].complete())) digests.push_back(hashers[k].digest());
    }
    if (!hashed) digests.clear();
    std::vector<chunk_status> st(keys.size(), chunk_status::error);
    in_store = true;
    std::error_code ec;
    if constexpr (piecewise_put_store<Store>) {
      ec = store_.put_pieces(keys, src, digests, st, dl);
    } else {  // a value not from the pages is one piece: the buffer it was gathered into
      std::vector<std::span<const std::byte>> whole;
      for (const value_pieces& v : src) whole.push_back(v.front());
      if constexpr (prehashed_put_store<Store>)
        ec = store_.put_prehashed(keys, whole, digests, st, dl);
      else
        ec = store_.put(keys, whole, st, dl);
    }
    in_store = false;
    for (std::size_t k = 0; k < keys.size(); ++k) {
      if (st[k] == chunk_status::stored) {
        end.stored.push_back(keys[k]);
      } else if (!why) {
        const auto [kec, text] = key_failure(st[k], ec, /*put=*/true);
        why = explain(job, chunk_of[k], kec, text, true);
      }
    }
    counters_.chunks_saved.add(end.stored.size());
    end.failed = ec || end.stored.size() != chunks.size();
    if (end.failed && !why) why = explain(job, chunks.front(), ec, ec.message(), true);
  }

  // Why a save ended by an exception, naming its first chunk: the store's put threw
  // (errc::store_threw, its words), or the save itself (its buffer: out of memory); empty when
  // not even the words can be allocated.
  std::optional<request_error> thrown_reason(const save_job& job, const exception_words& w,
                                             bool in_store) noexcept {
    try {
      const std::vector<std::size_t>& chunks = job.by_layer ? job.by_layer->chunks : job.chunks;
      const std::size_t c = chunks.empty() ? 0 : chunks.front();
      if (in_store)
        return explain(job, c, make_error_code(errc::store_threw), "the store threw: " + w.what, true);
      if (w.out_of_memory)
        return explain(job, c, std::make_error_code(std::errc::not_enough_memory),
                       "out of memory preparing the save (" + w.what + ")", false);
      return explain(job, c, make_error_code(errc::backend_error), "the save threw: " + w.what, false);
    } catch (...) {
      return std::nullopt;
    }
  }

  // A save ended: its stored keys (an event), its failure (counted) and reason, one pending save
  // less. Exactly once per save; never throws (what cannot be allocated is dropped: an event,
  // the reason), so the count always goes down.
  void end_save(save_job& job, save_end end) noexcept {
    if (end.failed) counters_.save_failures.add();
    std::optional<request_error>& why = reason_of(job);
    std::lock_guard lock(shared_.mu);
    try {
      for (const chunk_key& k : end.stored) shared_.remember_stored_locked(k);
      if (!end.stored.empty())
        shared_.events.push_back({kv_event::kind::stored, rank_, std::move(end.stored)});
    } catch (...) {  // out of memory: the keys are stored, only the event is lost
    }
    job.r->save_failed = job.r->save_failed || end.failed;
    if (why) {
      try {
        note_error_locked(*job.r, std::move(*why));
      } catch (...) {  // out of memory: the failure stays counted, without its reason
      }
    }
    counters_.save_latency.observe(clock::now() - (job.by_layer ? job.by_layer->begun : job.submitted));
    job.ended = true;
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
  std::vector<std::byte> whole_values_;           // run_whole's buffer, kept between saves (saver thread)
  serial_worker<std::function<void()>>
      slice_putter_;                // run_whole's puts, each while the next slice is made ready
  serial_worker<save_job> worker_;  // last: it stops before the members above go (the slice putter too)
};

}  // namespace kvtier::detail
