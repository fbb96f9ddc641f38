// kvtier/detail/queue_request.hpp: the shared state of one fetch_queue request
// (the public request types are in kvtier/fetch_types.hpp).
//
// Two locks, never held together:
//  - `mu` (this request) guards the completion decision (claimed, cancel_requested),
//    the callback and the published result. `completed` is written last, with release
//    order, so poll() reads it without the lock.
//  - the queue's mutex guards `where` and the prefetch fields below it.
#pragma once

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <system_error>
#include <vector>

#include "kvtier/chunk_status.hpp"
#include "kvtier/chunker.hpp"
#include "kvtier/deadline.hpp"
#include "kvtier/detail/store_common.hpp"
#include "kvtier/fetch_types.hpp"
#include "kvtier/lookup.hpp"

namespace kvtier {

namespace detail {

enum class queue_kind : std::uint8_t { load, lookup, prefetch, put };
enum class queue_where : std::uint8_t { queued, running, detached, finished };

struct queue_request {
  queue_kind kind = queue_kind::load;
  request_id id = 0;
  std::vector<chunk_key> keys;
  std::vector<std::span<std::byte>> dst;        // load: caller's buffers; prefetch: into staging
  std::vector<std::span<const std::byte>> src;  // put: caller's sources
  chunk_layout layout;
  deadline dl{};
  clock::time_point submitted{};
  std::size_t bytes = 0;        // accounted against bytes in flight (destinations, put sources)
  std::size_t chunk_bytes = 0;  // prefetch: bytes per chunk

  // --- guarded by mu ---
  std::mutex mu;
  std::condition_variable cv;
  bool claimed = false;  // the one completion has been decided
  bool cancel_requested = false;
  std::function<void(const fetch_result&)> callback;
  fetch_result result;               // immutable once completed
  std::vector<chunk_status> landed;  // while running: hit for each key landed so far (sized on first use)
  std::vector<std::size_t> landed_bytes;  // while running: leading bytes verified per key (stream_groups)
  std::atomic<bool> completed{false};

  // --- guarded by the queue's mutex ---
  queue_where where = queue_where::queued;
  // prefetch: staging buffer and who may still read it
  std::unique_ptr<std::byte[]> staging;   // bytes == keys * chunk_bytes, not zero-filled
  std::size_t staging_accounted = 0;      // bytes of staging still counted in flight
  bool work_finished = false;             // prefetch: result published, staging final
  bool retained = false;                  // prefetch: still in the queue's map under its id
  bool consumer_alive = false;            // prefetch: a load holds it and has not finished
  std::shared_ptr<queue_request> source;  // load: the prefetch it reuses, if any
};

/// A key has landed when its store call reported it done: a hit (load, lookup,
/// prefetch), or stored (put).
inline bool queue_key_landed(queue_kind k, chunk_status s) noexcept {
  return s == (k == queue_kind::put ? chunk_status::stored : chunk_status::hit);
}

/// Publishes the keys among `which` that landed, and wakes wait_progress().
inline void queue_note_landed(queue_request& r, std::span<const std::size_t> which,
                              std::span<const chunk_status> status) {
  {
    std::lock_guard lock(r.mu);
    if (r.landed.size() != r.keys.size()) r.landed.assign(r.keys.size(), chunk_status::miss);
    for (std::size_t i : which)
      if (queue_key_landed(r.kind, status[i])) r.landed[i] = chunk_status::hit;
  }
  r.cv.notify_all();
}

/// Publishes the leading bytes verified so far of the keys `which` (a group-major store call's
/// round, fetch_queue_options::stream_groups), and wakes wait_progress().
inline void queue_note_bytes(queue_request& r, std::span<const std::size_t> which,
                             std::span<const std::size_t> bytes) {
  {
    std::lock_guard lock(r.mu);
    if (r.landed_bytes.size() != r.keys.size()) r.landed_bytes.assign(r.keys.size(), 0);
    for (std::size_t k = 0; k < which.size(); ++k)
      r.landed_bytes[which[k]] = std::max(r.landed_bytes[which[k]], bytes[k]);
  }
  r.cv.notify_all();
}

/// Payload bytes of key i of a request (its destination; 0 for a lookup or a put).
inline std::size_t queue_key_bytes(const queue_request& r, std::size_t i) noexcept {
  return (r.kind == queue_kind::load || r.kind == queue_kind::prefetch) && i < r.dst.size() ? r.dst[i].size()
                                                                                            : 0;
}

/// Leading keys landed (`landed` marks each landed key hit).
inline std::size_t queue_leading_landed(const std::vector<chunk_status>& landed) noexcept {
  std::size_t n = 0;
  while (n < landed.size() && landed[n] == chunk_status::hit) ++n;
  return n;
}

/// Under r.mu: the result's landed keys once completed, else what landed so far.
inline fetch_progress queue_progress_locked(const queue_request& r) {
  fetch_progress p;
  const bool done = r.completed.load(std::memory_order_acquire);
  p.landed_keys.assign(r.keys.size(), false);
  p.landed_bytes.assign(r.keys.size(), 0);
  for (std::size_t i = 0; i < r.landed_bytes.size() && i < r.keys.size(); ++i)
    p.landed_bytes[i] = r.landed_bytes[i];
  if (done) {
    for (std::size_t i = 0; i < r.result.status.size() && i < r.keys.size(); ++i)
      if (queue_key_landed(r.kind, r.result.status[i]))
        p.landed_keys[i] = true, ++p.landed, p.landed_bytes[i] = queue_key_bytes(r, i);
    p.complete = true;
    p.answer_tokens = r.result.answer_tokens;
    p.answer_chunks = r.result.answer_chunks;
    return p;
  }
  for (std::size_t i = 0; i < r.landed.size() && i < r.keys.size(); ++i)
    if (r.landed[i] == chunk_status::hit)
      p.landed_keys[i] = true, ++p.landed, p.landed_bytes[i] = queue_key_bytes(r, i);
  p.answer_chunks = queue_leading_landed(r.landed);
  if (r.kind != queue_kind::put && r.layout.starts.size() == r.keys.size()) {
    p.answer_tokens = r.landed.empty()
                          ? (r.layout.starts.empty() ? r.layout.end_tokens : r.layout.starts.front())
                          : rank_answer(std::span<const std::uint64_t>(r.layout.starts),
                                        store_hit_view{r.landed}, r.layout.end_tokens);
  }
  return p;
}

/// How fetch_queue makes and opens handles (fetch_handle's constructor is private).
struct fetch_handle_access {
  static fetch_handle make(std::shared_ptr<queue_request> r) {
    const request_id id = r->id;
    return fetch_handle(std::move(r), id);
  }
  static const std::shared_ptr<queue_request>& get(const fetch_handle& h) noexcept { return h.req_; }
};

}  // namespace detail
}  // namespace kvtier
