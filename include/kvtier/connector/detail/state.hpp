// kvtier/connector/detail/state.hpp: the per-request state behind kvtier::connector
// (kvtier/connector.hpp), what its engine thread shares with the mover and saver threads, and
// its staging blocks. Not public API.
#pragma once

#include <algorithm>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <new>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "kvtier/chunker.hpp"
#include "kvtier/connector/detail/recent_keys.hpp"
#include "kvtier/connector/types.hpp"
#include "kvtier/deadline.hpp"
#include "kvtier/detail/cv_wait.hpp"
#include "kvtier/errc.hpp"
#include "kvtier/fetch_types.hpp"
#include "kvtier/kv_copy.hpp"
#include "kvtier/kv_layout.hpp"
#include "kvtier/ownership.hpp"
#include "kvtier/store/chunk_store.hpp"

namespace kvtier::detail {

struct layer_save;  // connector/detail/saver.hpp

/// One request as this rank's connector sees it. Fields marked "mover" are written by the
/// mover and saver threads under the connector's mutex; the rest belong to the engine thread.
struct connector_request {
  request_id id = 0;
  std::uint64_t prompt_tokens = 0;
  std::vector<chunk_key> keys;  // one per full chunk

  // Lookup.
  fetch_handle lookup;  // empty when this rank owns none of the chunks
  deadline lookup_dl{};
  clock::time_point lookup_started{};
  std::vector<std::size_t> owned;  // this rank's owned chunks, ascending
  bool lookup_agreed = false;
  bool lookup_skipped = false;             // this rank did not ask its store (a tier judged slow)
  bool probe = false;                      // agreed: this load measures a tier judged slow
  std::uint64_t agreed_cached_tokens = 0;  // min over ranks, before the policy
  std::uint64_t load_first_token = 0;      // the policy's load range [first, end)
  std::uint64_t load_end_token = 0;

  // Load of tokens [range_first_token, range_end_token) inside the plan (relative chunk
  // indexes i in [0, n) stand for chunks first_chunk + i).
  bool loading = false;
  std::uint64_t range_first_token = 0, range_end_token = 0;
  bool local_failure = false;  // this rank could not start its part (bad slots, no staging)
  std::size_t first_chunk = 0, n = 0;
  std::shared_ptr<std::byte[]> staging;   // n chunk values; the mover holds copies while moving
  std::vector<std::int64_t> slots;        // slot of every prompt position below the load's end
  fetch_handle fetch;                     // empty when this rank owns no chunk of the range
  std::vector<std::size_t> fetch_chunks;  // the prompt chunk of each key of `fetch`
  deadline load_dl{};
  clock::time_point load_started{};
  std::size_t cap = std::numeric_limits<std::size_t>::max();  // limit_load: this rank's most
  bool cancelled_by_engine = false;         // cancel_load: its fetch ending short is no failure
  std::size_t enqueued = 0;                 // chunks agreed fetched and given to the mover
  std::vector<std::size_t> enqueued_group;  // per layer group: chunks given to the mover (mover mutex)
  std::size_t target = std::numeric_limits<std::size_t>::max();        // final agreed fetched prefix
  std::size_t agreed_reach = std::numeric_limits<std::size_t>::max();  // the most every rank can still reach
  bool done = false;                                                   // the outcome is agreed
  std::uint64_t loaded_end_token = 0;                                  // agreed: pages hold [first, this)
  std::size_t loaded_chunks = 0;  // agreed: (loaded_end_token - first) / T
  bool reported = false;          // listed once by finished()

  // Mover (under the connector's mutex).
  std::vector<std::size_t> group_landed;  // per layer group: chunks scattered, in order
  bool move_failed = false;
  std::size_t saves_pending = 0;
  std::shared_ptr<layer_save> by_layer;  // the save by layer (begin_save) being reported, if any
  bool save_failed = false;
  std::vector<request_error> errors;  // this rank's first reason per stage (see note_error_locked)

  // Scatter gate: once abandoned (finished, or its outcome agreed short), the mover never
  // writes this request's pages again; set under scatter_mu, which each scatter holds.
  std::mutex scatter_mu;
  bool abandoned = false;

  bool finish_called = false;
  bool fetch_explained = false;  // the load's fetch reason, if any, is in errors

  std::size_t landed_locked() const noexcept {
    std::size_t m = n;
    for (std::size_t g : group_landed) m = g < m ? g : m;
    return group_landed.empty() ? 0 : m;
  }
};

using connector_request_ptr = std::shared_ptr<connector_request>;

/// The cache and chunk geometry every part of a connector reads: the pages, the chunk size in
/// tokens and bytes, and how layers group for the moves (per_group layers in each of groups).
struct connector_geometry {
  kv_cache_view cache;
  std::size_t chunk_tokens = 0, chunk_bytes = 0;
  std::uint32_t per_group = 1, groups = 1;

  connector_geometry(kv_cache_view c, std::size_t tokens, std::uint32_t layers_per_group)
      : cache(std::move(c)), chunk_tokens(tokens) {
    const std::uint32_t layers = cache.layout.num_layers;
    per_group = std::max(1u, layers_per_group == 0 ? layers : std::min(layers_per_group, layers));
    groups = (layers + per_group - 1) / per_group;
    chunk_bytes = cache.layout.bytes_per_token() * chunk_tokens;
  }
  layer_range group_layers(std::uint32_t g) const noexcept {
    return {g * per_group, std::min(cache.layout.num_layers, (g + 1) * per_group)};
  }
  /// Bytes of a chunk value up to the end of layer group g (layer-major: groups are contiguous).
  std::size_t group_end(std::uint32_t g) const noexcept {
    return static_cast<std::size_t>(chunk_layer_offset(
        cache.layout, chunk_tokens, std::min(cache.layout.num_layers, (g + 1) * per_group)));
  }
  /// Chunk i of a load's staging block, and layer group g of it.
  std::span<std::byte> staged(const connector_request& r, std::size_t i) const noexcept {
    return {r.staging.get() + i * chunk_bytes, chunk_bytes};
  }
  std::span<std::byte> staged_group(const connector_request& r, std::size_t i,
                                    std::uint32_t g) const noexcept {
    return chunk_layers(cache.layout, chunk_tokens, staged(r, i), group_layers(g));
  }
  /// The slots of prompt chunk c.
  std::span<const std::int64_t> chunk_slots(std::span<const std::int64_t> slots,
                                            std::size_t c) const noexcept {
    return slots.subspan(c * chunk_tokens, chunk_tokens);
  }
};

/// What the engine thread shares with the mover and saver threads, under `mu`: the running
/// loads (wait_for_layer waits on `landed` for them), router events, and the keys this rank
/// stored (so a later miss is reported evicted).
struct connector_shared {
  std::mutex mu;
  std::condition_variable landed;  // a layer group landed, a move failed, or a load ended
  std::condition_variable saved;   // a save ended
  std::vector<connector_request_ptr> active_loads;
  std::vector<kv_event> events;
  recent_keys stored{std::size_t{1} << 16};  // the keys this rank stored (the newest 65,536)

  /// A completed lookup's statuses: keys this rank stored that now miss are reported evicted.
  void note_evictions(const connector_request& r, const std::vector<chunk_status>& status, rank_t rank) {
    std::vector<chunk_key> gone;
    std::lock_guard lock(mu);
    for (std::size_t k = 0; k < status.size() && k < r.owned.size(); ++k)
      if (status[k] == chunk_status::miss && stored.erase(r.keys[r.owned[k]]))
        gone.push_back(r.keys[r.owned[k]]);
    if (!gone.empty()) events.push_back({kv_event::kind::evicted, rank, std::move(gone)});
  }

  /// connector::wait_for_layer: until layer group g of every chunk agreed so far for every
  /// running load is in the pages (`agreed(r)`: how many, read under mu); errc::timeout when dl
  /// passed first, a failed move's error (the first reason it noted) when one ended a wait.
  template <class Agreed>
  std::error_code wait_group_landed(std::size_t g, deadline dl, Agreed agreed) {
    std::unique_lock lock(mu);
    const bool ended = wait_until(landed, lock, dl, [&] {
      return std::all_of(active_loads.begin(), active_loads.end(), [&](const connector_request_ptr& r) {
        return r->move_failed || r->group_landed[g] >= agreed(*r);
      });
    });
    if (!ended) return make_error_code(errc::timeout);
    for (const connector_request_ptr& r : active_loads) {
      if (!r->move_failed || r->group_landed[g] >= agreed(*r)) continue;
      for (const request_error& e : r->errors)
        if (e.what == request_error::stage::load && e.ec) return e.ec;
      return make_error_code(errc::backend_error);
    }
    return {};
  }

  // Under mu: remembers a key this rank stored (the newest 65,536; no allocation).
  void remember_stored_locked(const chunk_key& k) noexcept { stored.insert(k); }
};

/// One thread that runs run(job) for each submitted job, in submission order: the mover's and
/// the saver's. stop() runs the jobs already submitted, then joins (idempotent). Declare it
/// after everything run() touches, so it stops before those go.
///
/// Exceptions: run() must end its job's bookkeeping whatever the job throws (a pending save
/// counted down, a load's move marked failed): the saver and the mover catch at their job
/// boundary, where that state can be ended properly. An exception that escapes run() anyway
/// would end the process on this thread (std::terminate), so the loop has a last resort: it
/// calls escaped(job), which must end what run() left of the job without throwing (a save's
/// pending count goes down, a batch's loads fail), then goes on with the next job. A catch that
/// only swallowed would leave a pending count up for good (wait_for_save would time out and
/// finished() never list the request) and loads waiting for moves that never come.
template <class Job>
class serial_worker {
 public:
  serial_worker() = default;
  serial_worker(const serial_worker&) = delete;
  serial_worker& operator=(const serial_worker&) = delete;
  ~serial_worker() { stop(); }

  void start(std::function<void(Job&)> run, std::function<void(Job&)> escaped) {
    run_ = std::move(run);
    escaped_ = std::move(escaped);
    thread_ = std::thread([this] { loop(); });
  }
  bool running() const noexcept { return thread_.joinable(); }
  void submit(Job job) {
    {
      std::lock_guard lock(mu_);
      jobs_.push_back(std::move(job));
    }
    cv_.notify_all();
  }
  void stop() {
    {
      std::lock_guard lock(mu_);
      closing_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

 private:
  void loop() {
    for (;;) {
      Job job;
      {
        std::unique_lock lock(mu_);
        cv_.wait(lock, [&] { return closing_ || !jobs_.empty(); });
        if (jobs_.empty()) return;
        job = std::move(jobs_.front());
        jobs_.pop_front();
      }
      try {
        run_(job);
      } catch (...) {  // the last resort (see the class comment): the job's state ends here
        try {
          escaped_(job);
        } catch (...) {  // escaped() must not throw; if it does, the thread still lives
        }
      }
    }
  }

  std::function<void(Job&)> run_, escaped_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> jobs_;
  bool closing_ = false;
  std::thread thread_;
};

/// What makes a connector over these parts impossible, in words (empty: nothing).
template <class Own, class Control, class Data>
std::string connector_setup_problem(const Own& own, const Control& ctrl, const Data& data,
                                    const kv_cache_view& cache, const connector_options& opt) {
  if (static_cast<rank_t>(own.world_size()) != static_cast<rank_t>(ctrl.size()))
    return "ownership world size " + std::to_string(own.world_size()) + " != communicator size " +
           std::to_string(ctrl.size());
  if (ctrl.rank() != data.rank() || ctrl.size() != data.size())
    return "control and data communicators differ in rank or size";
  if (auto e = cache.validate()) return e.message;
  if (opt.policy != load_policy::always &&
      !(opt.node.prefill_tokens_per_s > 0 && opt.node.kv_bytes_per_token > 0))
    return "the cost and split policies need node figures";
  return {};
}

/// A key namespace folded under another ownership geometry than the connector's policy (empty:
/// they match): its keys would be shared with deployments of that other geometry, which place
/// the chunks on other ranks. Both named; the namespace's ownership must be own.geometry().
template <class Own>
std::string connector_namespace_problem(const Own& own, const key_namespace& ns) {
  if (ns.ownership == own.geometry()) return {};
  return "the key namespace's ownership '" + ns.ownership +
         "' differs from the ownership policy's geometry '" + own.geometry() + "' (world size " +
         std::to_string(own.world_size()) + "): build the namespace with ownership = '" + own.geometry() +
         "'";
}

/// connector_setup_problem, and the chunker's namespace against the ownership policy
/// (connector_namespace_problem).
template <class Own, class Control, class Data>
std::string connector_setup_problem(const Own& own, const Control& ctrl, const Data& data,
                                    const kv_cache_view& cache, const connector_options& opt,
                                    const key_namespace& ns) {
  if (std::string why = connector_setup_problem(own, ctrl, data, cache, opt); !why.empty()) return why;
  return connector_namespace_problem(own, ns);
}

/// Starts this rank's fetch of its owned chunks of load r into their staging slots (an empty
/// handle when it owns none of them).
template <class Queue, class Own>
fetch_handle fetch_owned(connector_request& r, Queue& queue, const Own& own, rank_t rank,
                         const connector_geometry& geo) {
  std::vector<chunk_key> keys;
  std::vector<std::span<std::byte>> dst;
  std::vector<std::uint64_t> starts;
  for (std::size_t i = 0; i < r.n; ++i) {
    const std::size_t c = r.first_chunk + i;
    if (static_cast<rank_t>(own.owner(c)) != rank) continue;
    keys.push_back(r.keys[c]);
    r.fetch_chunks.push_back(c);
    dst.push_back(geo.staged(r, i));
    starts.push_back(static_cast<std::uint64_t>(c) * geo.chunk_tokens);
  }
  if (keys.empty()) return {};
  return queue.submit(r.id, keys, dst, chunk_layout::owned(std::move(starts), r.range_end_token), r.load_dl);
}

/// How often each chunk was looked up on this rank, for the selective save policy: saturating
/// 8-bit counts in 65,536 slots by key hash (a collision only counts a chunk higher).
class lookup_counts {
 public:
  void note(const chunk_key& k) noexcept {
    std::uint8_t& n = seen_[slot(k)];
    if (n < 255) ++n;
  }
  std::uint8_t of(const chunk_key& k) const noexcept { return seen_[slot(k)]; }

 private:
  static std::size_t slot(const chunk_key& k) noexcept { return chunk_key_hash{}(k)&0xFFFF; }
  std::vector<std::uint8_t> seen_ = std::vector<std::uint8_t>(std::size_t{1} << 16, 0);
};

/// Staging blocks of finished loads whose fetch may still write them: each is held until its
/// fetch has completed, and only then goes back to the pool.
class quarantine {
 public:
  void hold(fetch_handle fetch, std::shared_ptr<std::byte[]> staging) {
    held_.push_back({std::move(fetch), std::move(staging)});
  }
  template <class Queue>
  void release_completed(const Queue& queue) {
    std::erase_if(held_, [&](const entry& q) { return queue.poll(q.fetch).has_value(); });
  }

 private:
  struct entry {
    fetch_handle fetch;
    std::shared_ptr<std::byte[]> staging;
  };
  std::vector<entry> held_;
};

/// The staging blocks of a connector's loads. A block goes back to the pool only when its last
/// holder (the request, a mover batch, the quarantine) lets go, so a block that an abandoned
/// load's fetch may still write is never handed out again before that fetch completed. The
/// blocks given back most recently are kept idle (at most max_idle_blocks of them and `idle_cap`
/// bytes; a load takes the smallest one that holds it), so a steady stream of loads does not
/// page fresh memory in for every load, while the extra blocks of a burst (loads cut short by a
/// slow server, their blocks quarantined until each fetch ends) are freed once it is over
/// instead of staying resident for the life of the process.
class staging_pool : public std::enable_shared_from_this<staging_pool> {
 public:
  /// Idle blocks kept at most: a few loads at once reuse blocks; more page fresh memory in.
  static constexpr std::size_t max_idle_blocks = 4;

  explicit staging_pool(std::size_t idle_cap) : idle_cap_(idle_cap) {}

  /// A block of at least `bytes`, or empty when `max_in_flight` would be exceeded or memory ran
  /// out. `bytes` counts against max_in_flight whatever the size of the idle block reused.
  std::shared_ptr<std::byte[]> take(std::size_t bytes, std::size_t max_in_flight) {
    idle_block block;
    {
      std::lock_guard lock(mu_);
      if (bytes > max_in_flight - std::min(max_in_flight, in_flight_)) return nullptr;
      auto best = idle_.end();
      for (auto it = idle_.begin(); it != idle_.end(); ++it)
        if (it->bytes >= bytes && (best == idle_.end() || it->bytes < best->bytes)) best = it;
      if (best != idle_.end()) {
        block = std::move(*best);
        idle_bytes_ -= block.bytes;
        idle_.erase(best);
      }
      in_flight_ += bytes;
    }
    if (!block.data) block = {std::unique_ptr<std::byte[]>(new (std::nothrow) std::byte[bytes]), bytes};
    if (!block.data) {
      std::lock_guard lock(mu_);
      in_flight_ -= bytes;
      return nullptr;
    }
    return {block.data.release(), [self = shared_from_this(), bytes, size = block.bytes](std::byte* p) {
              self->give_back(p, size, bytes);
            }};
  }

  std::size_t in_flight() const {
    std::lock_guard lock(mu_);
    return in_flight_;
  }
  /// Idle blocks and their bytes, now.
  std::pair<std::size_t, std::size_t> idle() const {
    std::lock_guard lock(mu_);
    return {idle_.size(), idle_bytes_};
  }

 private:
  struct idle_block {
    std::unique_ptr<std::byte[]> data;
    std::size_t bytes = 0;
  };

  // `size`: the block's own size; `counted`: what its load counted in flight.
  void give_back(std::byte* p, std::size_t size, std::size_t counted) noexcept {
    idle_block block{std::unique_ptr<std::byte[]>(p), size};
    idle_block dropped;  // the oldest idle block when the pool is full: freed after the lock
    std::lock_guard lock(mu_);
    in_flight_ -= counted;
    if (size > idle_cap_) return;
    if (idle_.size() >= max_idle_blocks || idle_bytes_ + size > idle_cap_) {
      if (idle_.empty()) return;
      dropped = std::move(idle_.front());
      idle_bytes_ -= dropped.bytes;
      idle_.erase(idle_.begin());
      if (idle_bytes_ + size > idle_cap_) return;
    }
    try {
      idle_.push_back(std::move(block));
      idle_bytes_ += size;
    } catch (...) {  // no room to remember it: the block is freed
    }
  }

  mutable std::mutex mu_;
  std::size_t idle_cap_, in_flight_ = 0, idle_bytes_ = 0;
  std::vector<idle_block> idle_;  // oldest given back first
};

}  // namespace kvtier::detail
