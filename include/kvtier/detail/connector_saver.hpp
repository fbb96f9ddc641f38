// kvtier/detail/connector_saver.hpp: the saves of kvtier::connector (kvtier/connector.hpp):
// a thread of its own gathers an owner's chunks from the pages and puts them in the store with
// the save deadline, one save at a time in the order save() was called. Not public API.
//
// The saver calls the store itself rather than fetch_queue::put: a put on the queue would hold
// one of the fetch workers for up to the save deadline (2 s by default), so a slow save could
// delay a load's fetch past its own deadline and cut it short. Saves never delay loads here.
#pragma once

#include <chrono>
#include <cstddef>
#include <mutex>
#include <span>
#include <system_error>
#include <utility>
#include <vector>

#include "kvtier/connector/types.hpp"
#include "kvtier/deadline.hpp"
#include "kvtier/detail/connector_state.hpp"
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

 private:
  void run(save_job& job) {
    const std::size_t bytes = geo_.chunk_bytes;
    std::vector<std::byte> values(job.chunks.size() * bytes);
    std::vector<chunk_key> keys;
    std::vector<std::span<const std::byte>> src;
    for (std::size_t k = 0; k < job.chunks.size(); ++k) {
      const std::size_t c = job.chunks[k];
      std::span<std::byte> v(values.data() + k * bytes, bytes);
      if (kv_gather(geo_.cache, geo_.chunk_slots(job.slots, c), v)) continue;
      keys.push_back(job.r->keys[c]);
      src.push_back(v);
    }
    std::vector<chunk_status> st(keys.size(), chunk_status::error);
    const std::error_code ec = store_.put(keys, src, st, deadline_after(save_timeout_));
    std::vector<chunk_key> stored;
    for (std::size_t k = 0; k < keys.size(); ++k)
      if (st[k] == chunk_status::stored) stored.push_back(keys[k]);
    counters_.chunks_saved.add(stored.size());
    const bool failed = ec || stored.size() != job.chunks.size();
    if (failed) counters_.save_failures.add();
    std::lock_guard lock(shared_.mu);
    for (const chunk_key& k : stored) shared_.remember_stored_locked(k);
    if (!stored.empty()) shared_.events.push_back({kv_event::kind::stored, rank_, std::move(stored)});
    job.r->save_failed = job.r->save_failed || failed;
    --job.r->saves_pending;
    shared_.saved.notify_all();
  }

  Store& store_;
  const connector_geometry& geo_;
  connector_shared& shared_;
  connector_counters& counters_;
  std::chrono::milliseconds save_timeout_;
  rank_t rank_;
  serial_worker<save_job> worker_;  // last: it stops before the members above go
};

}  // namespace kvtier::detail
