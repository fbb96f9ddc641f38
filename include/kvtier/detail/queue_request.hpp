// kvtier/detail/queue_request.hpp: the shared state of one fetch_queue request.
//
// Two locks, never held together:
//  - `mu` (this request) guards the completion decision (claimed, cancel_requested),
//    the callback and the published result. `state` is written last, with release
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

#include "kvtier/chunker.hpp"
#include "kvtier/deadline.hpp"
#include "kvtier/store/chunk_store.hpp"

namespace kvtier {

/// The caller's name for a request (e.g. the engine's request id); a prefetch
/// and the load that reuses it share one.
using request_id = std::uint64_t;

/// Where each key's chunk lies in the prompt, in tokens: what turns per-chunk
/// statuses into a prefix length.
struct chunk_layout {
  std::vector<std::uint64_t> starts;  ///< start token of each key's chunk, ascending
  std::uint64_t end_tokens = 0;       ///< the prefix reported when every chunk hits

  /// Keys for chunks first_chunk, first_chunk + 1, ... of chunk_tokens tokens each.
  static chunk_layout contiguous(std::size_t first_chunk, std::size_t n_chunks, std::size_t chunk_tokens) {
    chunk_layout l;
    l.starts.reserve(n_chunks);
    for (std::size_t i = 0; i < n_chunks; ++i)
      l.starts.push_back(static_cast<std::uint64_t>(first_chunk + i) * chunk_tokens);
    l.end_tokens = static_cast<std::uint64_t>(first_chunk + n_chunks) * chunk_tokens;
    return l;
  }
  /// A rank's owned chunks: its owned-start vector (kvtier::owned_starts) and the
  /// end the rank reports when none of them is missing (kvtier::rank_answer).
  static chunk_layout owned(std::vector<std::uint64_t> owned_starts, std::uint64_t end_tokens) {
    return chunk_layout{std::move(owned_starts), end_tokens};
  }
};

/// Where a request stands.
enum class fetch_state : std::uint8_t {
  pending,  ///< queued or running
  done,     ///< the store calls ran; see status and prefix_tokens
  failed,   ///< never ran to the end: cancelled, shut down, or refused (see ec)
};

/// What poll() and wait() report.
struct fetch_result {
  fetch_state state = fetch_state::pending;
  /// failed: why (cancelled, shutdown, queue_full, too_large, invalid_argument,
  /// backend_error). done: the store's whole-batch error (e.g. timeout), or empty.
  std::error_code ec;
  /// The contiguous prefix in tokens: kvtier::rank_answer(layout.starts, status == hit,
  /// layout.end_tokens). Load: loaded and usable; lookup: present; prefetch: staged.
  /// Nothing at or past the first non-hit chunk is ever inside it. For a failed
  /// request it is the first start (nothing loaded).
  std::uint64_t prefix_tokens = 0;
  std::size_t prefix_chunks = 0;     ///< leading hit chunks (those inside prefix_tokens)
  std::vector<chunk_status> status;  ///< one per key (empty while pending)
};

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
  fetch_result result;  // immutable once state != pending
  std::atomic<fetch_state> state{fetch_state::pending};

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

}  // namespace detail
}  // namespace kvtier
