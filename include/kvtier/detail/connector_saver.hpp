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

/// Chunks (prompt indexes) of one request to save from the pages at `slots`.
struct save_job {
  connector_request_ptr r;
  std::vector<std::size_t> chunks;
  std::vector<std::int64_t> slots;
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

  /// Queues a save; the request counts it pending (under shared.mu) until it ended.
  void submit(save_job job) {
    {
      std::lock_guard lock(shared_.mu);
      ++job.r->saves_pending;
    }
    worker_.submit(std::move(job));
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
    const std::size_t bytes = geo_.chunk_bytes;
    std::vector<std::byte> values(job.chunks.size() * bytes);
    std::vector<chunk_key> keys;
    std::vector<std::size_t> chunk_of;  // the prompt chunk of each key
    std::vector<std::span<const std::byte>> src;
    std::optional<request_error> why;  // the first failure of this save, in words
    for (std::size_t k = 0; k < job.chunks.size(); ++k) {
      const std::size_t c = job.chunks[k];
      std::span<std::byte> v(values.data() + k * bytes, bytes);
      if (const std::error_code ec = kv_gather(geo_.cache, geo_.chunk_slots(job.slots, c), v)) {
        if (!why) why = explain(job, c, ec, "gather from the pages: " + ec.message(), false);
        continue;
      }
      keys.push_back(job.r->keys[c]);
      chunk_of.push_back(c);
      src.push_back(v);
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
    const bool failed = ec || stored.size() != job.chunks.size();
    if (failed && !why) why = explain(job, job.chunks.front(), ec, ec.message(), true);
    if (failed) counters_.save_failures.add();
    std::lock_guard lock(shared_.mu);
    for (const chunk_key& k : stored) shared_.remember_stored_locked(k);
    if (!stored.empty()) shared_.events.push_back({kv_event::kind::stored, rank_, std::move(stored)});
    job.r->save_failed = job.r->save_failed || failed;
    if (why) note_error_locked(*job.r, std::move(*why));
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
