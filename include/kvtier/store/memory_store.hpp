// kvtier/store/memory_store.hpp: the host-memory L1 chunk store, an LRU bounded
// in payload bytes.
//
// Thread-safe: one mutex guards the index and the LRU order; the byte copies of
// get and put run outside it, so concurrent calls copy in parallel.
// get() copies a stored value straight into the caller's span, and only when the
// span has exactly the stored length; otherwise the key is chunk_status::corrupt.
// Values live in memory from `Allocator`, so an engine can hand the store pinned
// (page-locked) host memory for fast device copies: pinned_arena's allocator puts each
// value in one slot of a single registration (kvtier/pinned_arena.hpp). Give the store a
// capacity a few slots below the arena's, because a put allocates its slot before it
// evicts (and a get still copying keeps an evicted value's slot until it is done):
//
//   kvtier::memory_store l1(16ull << 30);                      // 16 GiB, std::allocator
//   auto arena = kvtier::pinned_arena::create({.slot_bytes = chunk, .slots = 1300}, ec);
//   kvtier::basic_memory_store<kvtier::pinned_arena::allocator> pinned(1290 * chunk, arena->get_allocator());
//   std::vector<kvtier::chunk_status> st(keys.size());
//   l1.put(keys, sources, st, kvtier::deadline_after(10ms));
//   l1.get(keys, destinations, st, kvtier::deadline_after(10ms));
//
// `Allocator` is any standard allocator of std::byte (allocate(n) / deallocate(p, n)),
// callable from several threads at once (copies run outside the lock);
// an allocation failure (bad_alloc) stores nothing for that key (status error).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <list>
#include <memory>
#include <mutex>
#include <new>
#include <span>
#include <system_error>
#include <type_traits>
#include <unordered_map>

#include "kvtier/chunker.hpp"
#include "kvtier/deadline.hpp"
#include "kvtier/detail/store_common.hpp"
#include "kvtier/errc.hpp"
#include "kvtier/store/chunk_store.hpp"

namespace kvtier {

template <class Allocator = std::allocator<std::byte>>
class basic_memory_store {
  using traits = std::allocator_traits<Allocator>;
  static_assert(std::is_same_v<typename traits::value_type, std::byte>,
                "kvtier::basic_memory_store: Allocator must allocate std::byte");

 public:
  using allocator_type = Allocator;

  /// Counts since construction.
  struct stats_type {
    std::uint64_t hits = 0, misses = 0, corrupt = 0;  ///< get and exists, per key
    std::uint64_t stores = 0;                         ///< put, per key stored
    std::uint64_t evictions = 0;                      ///< values dropped to make room
    std::uint64_t rejected = 0;                       ///< puts not stored (too large, allocation failed)
  };

  /// A store holding at most `capacity_bytes` payload bytes.
  explicit basic_memory_store(std::size_t capacity_bytes, const Allocator& alloc = Allocator())
      : capacity_(capacity_bytes), alloc_(alloc) {}

  basic_memory_store(const basic_memory_store&) = delete;
  basic_memory_store& operator=(const basic_memory_store&) = delete;
  ~basic_memory_store() { clear(); }

  /// status[i] = hit if keys[i] is stored, else miss. Does not refresh recency.
  std::error_code exists(std::span<const chunk_key> keys, std::span<chunk_status> status, deadline dl) {
    if (auto ec = detail::store_precheck(keys.size(), status.size(), status, dl)) return ec;
    std::lock_guard lock(mu_);
    for (std::size_t i = 0; i < keys.size(); ++i) {
      const bool found = index_.contains(keys[i]);
      status[i] = found ? chunk_status::hit : chunk_status::miss;
      ++(found ? stats_.hits : stats_.misses);
    }
    return {};
  }

  /// Copies each stored value into dst[i] if its length is dst[i].size() (hit,
  /// and the key becomes most recently used); another length is corrupt; absent is miss.
  /// The copy runs outside the store's lock on a pinned reference to the value, so
  /// concurrent gets copy in parallel and an eviction meanwhile frees the bytes after.
  std::error_code get(std::span<const chunk_key> keys, std::span<const std::span<std::byte>> dst,
                      std::span<chunk_status> status, deadline dl) {
    return get(keys, dst, status, dl, std::span<std::size_t>());
  }

  /// get(), and for each key stored with another length than dst[i] (corrupt), that length in
  /// stored_bytes[i]; the other entries are left as they were. `stored_bytes` is empty or has one
  /// entry per key (else invalid_argument). How a caller tells a destination of the wrong size
  /// apart (kvtier.Store.get in Python raises InvalidArgument then).
  std::error_code get(std::span<const chunk_key> keys, std::span<const std::span<std::byte>> dst,
                      std::span<chunk_status> status, deadline dl, std::span<std::size_t> stored_bytes) {
    if (!stored_bytes.empty() && stored_bytes.size() != keys.size())
      return make_error_code(errc::invalid_argument);
    if (auto ec = detail::store_precheck(keys.size(), dst.size(), status, dl)) return ec;
    for (std::size_t i = 0; i < keys.size(); ++i) {
      block ref;
      {
        std::lock_guard lock(mu_);
        auto it = index_.find(keys[i]);
        if (it == index_.end()) {
          status[i] = chunk_status::miss;
          ++stats_.misses;
          continue;
        }
        entry& e = *it->second;
        if (e.size != dst[i].size()) {
          status[i] = chunk_status::corrupt;
          if (!stored_bytes.empty()) stored_bytes[i] = e.size;
          ++stats_.corrupt;
          continue;
        }
        lru_.splice(lru_.begin(), lru_, it->second);
        ref = e.data;
        ++stats_.hits;
      }
      if (!dst[i].empty()) std::memcpy(dst[i].data(), ref.get(), dst[i].size());
      status[i] = chunk_status::hit;
    }
    return {};
  }

  /// Stores a copy of src[i] under keys[i] (replacing any older value), evicting
  /// least recently used values to make room. stored = written; error = not stored
  /// (larger than the whole capacity, or the allocator failed). The copy into the
  /// new value runs outside the store's lock.
  std::error_code put(std::span<const chunk_key> keys, std::span<const std::span<const std::byte>> src,
                      std::span<chunk_status> status, deadline dl) {
    if (auto ec = detail::store_precheck(keys.size(), src.size(), status, dl)) return ec;
    for (std::size_t i = 0; i < keys.size(); ++i) status[i] = put_one(keys[i], value_pieces(&src[i], 1));
    return {};
  }

  /// put() of values given in pieces (values[i]: their concatenation, e.g. kv_pieces of a
  /// chunk in an engine's pages): each copied once, straight into the stored value. This store
  /// keeps no checksums: `digests` must be empty (else invalid_argument, nothing stored).
  std::error_code put_pieces(std::span<const chunk_key> keys, std::span<const value_pieces> values,
                             std::span<const value_digest> digests, std::span<chunk_status> status,
                             deadline dl) {
    if (!digests.empty()) return make_error_code(errc::invalid_argument);
    if (auto ec = detail::store_precheck(keys.size(), values.size(), status, dl)) return ec;
    for (std::size_t i = 0; i < keys.size(); ++i) status[i] = put_one(keys[i], values[i]);
    return {};
  }

  /// Removes `key`; true if it was stored.
  bool erase(const chunk_key& key) {
    std::lock_guard lock(mu_);
    auto it = index_.find(key);
    if (it == index_.end()) return false;
    drop(it->second);
    index_.erase(it);
    return true;
  }

  /// Removes every value.
  void clear() {
    std::lock_guard lock(mu_);
    for (auto it = lru_.begin(); it != lru_.end();) it = drop(it);
    index_.clear();
  }

  bool contains(const chunk_key& key) const {
    std::lock_guard lock(mu_);
    return index_.contains(key);
  }
  std::size_t size_bytes() const {
    std::lock_guard lock(mu_);
    return used_;
  }
  std::size_t entry_count() const {
    std::lock_guard lock(mu_);
    return index_.size();
  }
  std::size_t capacity_bytes() const noexcept { return capacity_; }
  stats_type stats() const {
    std::lock_guard lock(mu_);
    return stats_;
  }
  allocator_type get_allocator() const { return alloc_; }

 private:
  // A value's bytes from the allocator, shared by the LRU entry and any get copying
  // from it; freed by whoever lets go last.
  struct block_deleter {
    Allocator alloc;
    std::size_t size;
    void operator()(std::byte* p) noexcept { traits::deallocate(alloc, p, size); }
  };
  using block = std::shared_ptr<std::byte>;
  struct entry {
    chunk_key key;
    block data;  // null for an empty value
    std::size_t size;
  };
  using list_type = std::list<entry>;

  // Unlinks the LRU node (a get still copying keeps the bytes alive); the caller fixes index_.
  typename list_type::iterator drop(typename list_type::iterator it) {
    used_ -= it->size;
    return lru_.erase(it);
  }

  // Stores the concatenation of `pieces` under `key`.
  chunk_status put_one(const chunk_key& key, value_pieces pieces) {
    std::size_t size = 0;
    for (const auto& p : pieces) size += p.size();
    if (size > capacity_) {
      std::lock_guard lock(mu_);
      ++stats_.rejected;
      return chunk_status::error;
    }
    block data;
    try {  // allocate and copy before taking the lock
      if (size != 0) {
        std::byte* p = traits::allocate(alloc_, size);
        data = block(p, block_deleter{alloc_, size});  // frees p itself if this throws
        for (const auto& piece : pieces) {
          if (!piece.empty()) std::memcpy(p, piece.data(), piece.size());
          p += piece.size();
        }
      }
    } catch (...) {
      std::lock_guard lock(mu_);
      ++stats_.rejected;
      return chunk_status::error;
    }
    std::lock_guard lock(mu_);
    if (auto it = index_.find(key); it != index_.end()) {  // replace: the old bytes go first
      drop(it->second);
      index_.erase(it);
    }
    while (used_ + size > capacity_ && !lru_.empty()) {
      index_.erase(lru_.back().key);
      drop(std::prev(lru_.end()));
      ++stats_.evictions;
    }
    try {
      lru_.push_front(entry{key, std::move(data), size});
      try {
        index_.emplace(key, lru_.begin());
      } catch (...) {
        lru_.pop_front();
        throw;
      }
    } catch (...) {  // bad_alloc from the list or the map
      ++stats_.rejected;
      return chunk_status::error;
    }
    used_ += size;
    ++stats_.stores;
    return chunk_status::stored;
  }

  std::size_t capacity_;
  Allocator alloc_;
  mutable std::mutex mu_;
  list_type lru_;  // front = most recently used
  std::unordered_map<chunk_key, typename list_type::iterator, chunk_key_hash> index_;
  std::size_t used_ = 0;
  stats_type stats_;
};

/// The L1 store with the default allocator.
using memory_store = basic_memory_store<>;

static_assert(chunk_store<memory_store>);
static_assert(piecewise_put_store<memory_store>);

}  // namespace kvtier
