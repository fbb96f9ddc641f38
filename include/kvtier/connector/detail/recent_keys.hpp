// kvtier/connector/detail/recent_keys.hpp: the newest N chunk keys a rank stored, in memory
// allocated (and touched) once at construction, so a connector's resident memory does not creep
// up for the hour it takes a stream to store N keys (issue 27's soak). Not public API.
//
//   recent_keys k(1 << 16);
//   k.insert(key);          // the oldest insertion is forgotten once N were made
//   if (k.erase(key)) ...;  // it was remembered
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "kvtier/chunker.hpp"

namespace kvtier::detail {

/// A set of the keys of the newest `capacity` insertions: a ring of the keys in insertion order
/// and an open-addressing index into it (linear probing, load at most one half). No allocation
/// after construction. Not thread-safe.
class recent_keys {
 public:
  explicit recent_keys(std::size_t capacity)
      : ring_(capacity == 0 ? 1 : capacity),
        index_(std::bit_ceil(2 * ring_.size()), 0),
        mask_(index_.size() - 1) {}

  std::size_t capacity() const noexcept { return ring_.size(); }
  std::size_t size() const noexcept { return size_; }
  bool contains(const chunk_key& k) const noexcept { return find(k) != npos; }

  /// Remembers k (false: it already was). When `capacity` insertions are remembered, the oldest
  /// one's key is forgotten first (unless it was erased or inserted again since).
  bool insert(const chunk_key& k) noexcept {
    if (contains(k)) return false;
    if (filled_ == ring_.size())
      forget_position(next_);
    else
      ++filled_;
    ring_[next_] = k;
    std::size_t i = home(k);
    while (index_[i] != 0) i = (i + 1) & mask_;
    index_[i] = static_cast<std::uint32_t>(next_ + 1);
    next_ = next_ + 1 == ring_.size() ? 0 : next_ + 1;
    ++size_;
    return true;
  }

  /// Forgets k; false when it was not remembered.
  bool erase(const chunk_key& k) noexcept {
    const std::size_t i = find(k);
    if (i == npos) return false;
    remove_slot(i);
    return true;
  }

 private:
  static constexpr std::size_t npos = static_cast<std::size_t>(-1);

  std::size_t home(const chunk_key& k) const noexcept { return chunk_key_hash{}(k)&mask_; }

  // The index slot that points at k's ring position, or npos.
  std::size_t find(const chunk_key& k) const noexcept {
    for (std::size_t i = home(k); index_[i] != 0; i = (i + 1) & mask_)
      if (ring_[index_[i] - 1] == k) return i;
    return npos;
  }

  // Ring position p is about to be reused: its key leaves the index if the index still points
  // at p (an erased key, or one inserted again at a newer position, is left alone).
  void forget_position(std::size_t p) noexcept {
    const std::size_t i = find(ring_[p]);
    if (i != npos && index_[i] - 1 == p) remove_slot(i);
  }

  // Linear probing's deletion: later entries of the probe run move back into the hole, so every
  // key stays reachable from its home slot without tombstones.
  void remove_slot(std::size_t i) noexcept {
    for (std::size_t j = (i + 1) & mask_; index_[j] != 0; j = (j + 1) & mask_) {
      const std::size_t h = home(ring_[index_[j] - 1]);
      const bool movable = i <= j ? (h <= i || h > j) : (h <= i && h > j);
      if (movable) index_[i] = index_[j], i = j;
    }
    index_[i] = 0;
    --size_;
  }

  std::vector<chunk_key> ring_;       // keys in insertion order, next_ is the oldest once filled
  std::vector<std::uint32_t> index_;  // ring position + 1 of each remembered key; 0: empty
  std::size_t mask_, next_ = 0, filled_ = 0, size_ = 0;
};

}  // namespace kvtier::detail
