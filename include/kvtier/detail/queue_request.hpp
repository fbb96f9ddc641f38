// kvtier/detail/queue_request.hpp: the shared state of one fetch_queue request
// (the public request types are in kvtier/fetch_types.hpp).
//
// Two locks, never held together:
//  - `mu` (this request) guards the completion decision (claimed, cancel_requested),
//    the callback and the published result. `completed` is written last, with release
//    order, so poll() reads it without the lock.
//  - the queue's mutex guards `where` and the prefetch fields below it.
#pragma once

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
#include "kvtier/fetch_types.hpp"

namespace kvtier {

namespace detail {

enum class queue_kind : std::uint8_t { load, lookup, prefetch };
enum class queue_where : std::uint8_t { queued, running, detached, finished };

struct queue_request {
  queue_kind kind = queue_kind::load;
  request_id id = 0;
  std::vector<chunk_key> keys;
  std::vector<std::span<std::byte>> dst;  // load: caller's buffers; prefetch: into staging
  chunk_layout layout;
  deadline dl{};
  clock::time_point submitted{};
  std::size_t bytes = 0;        // accounted against bytes in flight (destinations)
  std::size_t chunk_bytes = 0;  // prefetch: bytes per chunk

  // --- guarded by mu ---
  std::mutex mu;
  std::condition_variable cv;
  bool claimed = false;  // the one completion has been decided
  bool cancel_requested = false;
  std::function<void(const fetch_result&)> callback;
  fetch_result result;               // immutable once completed
  std::vector<chunk_status> landed;  // while running: hit for each key landed so far (sized on first use)
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
