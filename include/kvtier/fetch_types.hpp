// kvtier/fetch_types.hpp: the public request types of kvtier::fetch_queue.
//
// A request is pending until it completes; poll() and wait() return
// std::optional<fetch_result>, empty while pending, so a pending load cannot be
// read as "0 tokens loaded":
//
//   if (std::optional<kvtier::fetch_result> r = queue.poll(h)) {
//     std::uint64_t prefix = r->answer_tokens;   // done or failed: agree on this
//   } else {
//     // still pending: the destinations still belong to the queue
//   }
//
// Buffers: the destinations of a load belong to the queue from submit() until
// the request has completed, i.e. until poll()/wait() return a value or the
// on_complete callback runs. This holds after cancel() too: cancel() only asks;
// a running store call is not interrupted, and the request completes (as failed,
// errc::cancelled) only once that call has returned. From then on the queue
// never writes the destinations again, so the caller may recompute into them.
// The sources of a put (fetch_queue::put) belong to the queue the same way: valid
// and unchanged until the put has completed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "kvtier/chunk_status.hpp"

namespace kvtier {

struct metrics;

/// The caller's name for a request (e.g. the engine's request id); a prefetch
/// and the load that reuses it share one.
using request_id = std::uint64_t;

/// Where each key's chunk lies in the prompt, in tokens: what turns per-chunk
/// statuses into a prefix length.
struct chunk_layout {
  std::vector<std::uint64_t> starts;  ///< start token of each key's chunk, ascending
  std::uint64_t end_tokens = 0;       ///< the prefix reported when every chunk hits

  /// Keys for full chunks first_chunk, first_chunk + 1, ... of chunk_tokens tokens
  /// each (tail_policy::drop). With a hashed partial tail use the form below.
  static chunk_layout contiguous(std::size_t first_chunk, std::size_t n_chunks, std::size_t chunk_tokens) {
    return contiguous(first_chunk, n_chunks, chunk_tokens,
                      static_cast<std::uint64_t>(first_chunk + n_chunks) * chunk_tokens);
  }
  /// Keys for chunks first_chunk, first_chunk + 1, ... of chunk_tokens tokens each,
  /// of a prompt of prompt_tokens tokens. The end is the end of the last chunk, but
  /// never past the prompt: with a hashed partial tail (tail_policy::hash_partial)
  /// the last key covers fewer than chunk_tokens tokens.
  /// Example: contiguous(0, 2, 256, 300).end_tokens == 300 (not 512).
  static chunk_layout contiguous(std::size_t first_chunk, std::size_t n_chunks, std::size_t chunk_tokens,
                                 std::uint64_t prompt_tokens) {
    chunk_layout l;
    l.starts.reserve(n_chunks);
    for (std::size_t i = 0; i < n_chunks; ++i)
      l.starts.push_back(static_cast<std::uint64_t>(first_chunk + i) * chunk_tokens);
    const std::uint64_t end = static_cast<std::uint64_t>(first_chunk + n_chunks) * chunk_tokens;
    l.end_tokens = end < prompt_tokens ? end : prompt_tokens;
    return l;
  }
  /// A rank's owned chunks: its owned-start vector (kvtier::owned_starts) and the
  /// end the rank reports when none of them is missing (see kvtier::rank_answer).
  static chunk_layout owned(std::vector<std::uint64_t> owned_starts, std::uint64_t end_tokens) {
    return chunk_layout{std::move(owned_starts), end_tokens};
  }
};

/// How a completed request ended. (A pending request has no fetch_result at all.)
enum class fetch_state : std::uint8_t {
  done,    ///< the store calls ran (or one threw: ec store_threw); see status and answer_tokens
  failed,  ///< never ran to the end: cancelled, shut down, refused, or the queue failed (see ec)
};

/// What poll() and wait() report once a request has completed.
struct fetch_result {
  fetch_state state = fetch_state::failed;
  /// failed: why (cancelled, shutdown, queue_full, too_large, invalid_argument,
  /// backend_error: the queue's own bookkeeping ran out of memory). done: the store's
  /// whole-batch error (e.g. timeout), or empty; errc::store_threw when a store call threw
  /// (the keys it and later calls did not answer are chunk_status::error, message says what
  /// it threw). A put: status holds chunk_status::stored per key written, answer_chunks the
  /// leading stored keys, answer_tokens 0 (a put has no layout).
  std::error_code ec;
  /// The rank answer in tokens: kvtier::rank_answer(layout.starts, status == hit,
  /// layout.end_tokens). Load: loaded and usable; lookup: present; prefetch: staged.
  /// Nothing at or past the first non-hit chunk is ever inside it. For a failed
  /// request it is the rank's first owned start, layout.starts.front() (nothing
  /// loaded), NOT 0: with ownership, earlier chunks are other ranks' to answer for.
  std::uint64_t answer_tokens = 0;
  std::size_t answer_chunks = 0;     ///< leading hit chunks (those inside answer_tokens)
  std::vector<chunk_status> status;  ///< one per key (may be empty for a refused request)
  /// The failure in words when the queue has some beyond ec.message(), else empty: for
  /// errc::store_threw "the store threw: <the exception's what()>".
  std::string message;
};

/// A request's progress while it runs (fetch_queue::progress / wait_progress): which keys have
/// landed, i.e. whose value is in its destination and was verified by the store (a hit; for a
/// put: reported stored, and answer_tokens stays 0), and the
/// rank answer over them: the loaded prefix so far. Landed keys stay landed, so answer_tokens
/// only grows, and it never exceeds the completed result's answer_tokens. Keys land one store
/// call at a time (fetch_queue_options::max_batch_chunks keys per call), each with all its layer
/// groups: a store verifies a whole value before it reports a hit, so "layers up to l of chunks
/// below c" is "chunks below c". With fetch_queue_options::stream_groups over a store that reads
/// group-major (group_streaming_store, e.g. remote_store), landed_bytes grows group by group
/// within a call: group 0 of every key of the call, then group 1, ...
///
///   auto p = q.progress(h);
///   bool group_in = p.landed_bytes[i] >= group_end;   // key i's bytes [0, group_end) verified
struct fetch_progress {
  std::uint64_t answer_tokens = 0;  ///< rank answer over the keys landed so far
  std::size_t answer_chunks = 0;    ///< leading keys landed (those inside answer_tokens)
  std::size_t landed = 0;           ///< keys landed, in any order
  std::vector<bool> landed_keys;    ///< per key
  /// Per key: its leading payload bytes in the destination, verified (all of them once the key
  /// landed; with stream_groups, the layer groups verified so far; 0 for lookups and puts).
  /// Only grows while the request runs; a key that failed keeps the groups that landed before.
  std::vector<std::size_t> landed_bytes;
  bool complete = false;  ///< the request completed: these equal its result
};

/// Points where fetch_queue_options::fault_injector is called (a test seam).
enum class fetch_queue_fault : std::uint8_t {
  enqueue,       ///< enqueue, where queue bookkeeping allocates
  worker_alloc,  ///< a worker, where it allocates a request's status vector
  start_thread,  ///< the constructor, before starting each worker thread
};

struct fetch_queue_options {
  std::size_t workers = 2;                                 ///< threads calling the store
  std::size_t max_requests = 256;                          ///< submitted and not completed
  std::size_t max_bytes_in_flight = std::size_t{4} << 30;  ///< destinations + prefetch staging + put sources
  std::size_t max_batch_chunks = 0;    ///< split a request into store calls of this many keys (0: one call);
                                       ///< cancellation is noticed between calls
  kvtier::metrics* metrics = nullptr;  ///< optional
  /// Loads (and prefetches) read group-major when the store can (group_streaming_store, e.g.
  /// remote_store::get_by_group): progress then reports each key's layer groups as they land
  /// (fetch_progress::landed_bytes). Ignored for other stores.
  bool stream_groups = false;
  /// Test seam, empty in production: called at each fetch_queue_fault point, where
  /// the queue allocates or starts a thread; throwing from it (std::bad_alloc,
  /// std::system_error) simulates that failure there. Lets tests prove that such a
  /// failure neither leaks a slot nor terminates the process.
  std::function<void(fetch_queue_fault)> fault_injector{};
};

/// Counts at one instant.
struct fetch_queue_stats {
  std::size_t queued = 0;              ///< waiting for a worker
  std::size_t requests_in_flight = 0;  ///< submitted and not completed
  std::size_t bytes_in_flight = 0;     ///< destinations of unfinished loads + staged prefetches
  std::size_t prefetches_held = 0;     ///< prefetches kept for a later load
};

namespace detail {
struct queue_request;
struct fetch_handle_access;
}  // namespace detail

/// A submitted request. Cheap to copy; keeps the request's state alive.
class fetch_handle {
 public:
  fetch_handle() = default;
  bool valid() const noexcept { return req_ != nullptr; }
  request_id id() const noexcept { return id_; }

 private:
  friend struct detail::fetch_handle_access;
  fetch_handle(std::shared_ptr<detail::queue_request> r, request_id id) : req_(std::move(r)), id_(id) {}
  std::shared_ptr<detail::queue_request> req_;
  request_id id_ = 0;
};

}  // namespace kvtier
