// kvtier/detail/connector_state.hpp: the per-request state and the step agreement's encoding
// behind kvtier::connector (kvtier/connector.hpp). Not public API.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <mutex>
#include <new>
#include <span>
#include <utility>
#include <vector>

#include "kvtier/chunker.hpp"
#include "kvtier/deadline.hpp"
#include "kvtier/fetch_types.hpp"

namespace kvtier::detail {

/// One request as this rank's connector sees it. Fields marked "mover" are written by the
/// mover and saver threads under the connector's mutex; the rest belong to the engine thread.
struct connector_request {
  request_id id = 0;
  std::uint64_t prompt_tokens = 0;
  std::vector<chunk_key> keys;  // one per full chunk

  // Lookup.
  fetch_handle lookup;  // empty when this rank owns none of the chunks
  deadline lookup_dl{};
  std::vector<std::size_t> owned;  // this rank's owned chunks, ascending
  bool lookup_agreed = false;
  std::uint64_t agreed_cached_tokens = 0;  // min over ranks, before the policy
  std::uint64_t load_first_token = 0;      // the policy's load range [first, end)
  std::uint64_t load_end_token = 0;

  // Load (relative chunk indexes i in [0, n) stand for chunks first_chunk + i).
  bool loading = false;
  bool local_failure = false;  // this rank could not start its part (bad slots, no staging)
  std::size_t first_chunk = 0, n = 0;
  std::shared_ptr<std::byte[]> staging;  // n chunk values; the mover holds copies while moving
  std::vector<std::int64_t> slots;       // slot of every prompt position below the load's end
  fetch_handle fetch;                    // empty when this rank owns no chunk of the range
  deadline load_dl{};
  clock::time_point load_started{};
  std::size_t enqueued = 0;  // chunks agreed fetched and given to the mover
  std::size_t target = std::numeric_limits<std::size_t>::max();  // final agreed fetched prefix
  bool done = false;                                             // the outcome is agreed
  std::uint64_t loaded_end_token = 0;                            // agreed: pages hold [first, this)
  bool reported = false;                                         // listed once by finished()

  // Mover (under the connector's mutex).
  std::vector<std::size_t> group_landed;  // per layer group: chunks scattered, in order
  bool move_failed = false;
  std::size_t saves_pending = 0;
  bool save_failed = false;

  // Scatter gate: once abandoned (finished, or its outcome agreed short), the mover never
  // writes this request's pages again; set under scatter_mu, which each scatter holds.
  std::mutex scatter_mu;
  bool abandoned = false;

  bool finish_called = false;

  std::size_t landed_locked() const noexcept {
    std::size_t m = n;
    for (std::size_t g : group_landed) m = g < m ? g : m;
    return group_landed.empty() ? 0 : m;
  }
};

/// One step's agreement: a header [entries, fp, ~fp] and five words per entry, all reduced by
/// min. The fingerprint folds every entry's request id and kind, so ranks whose request lists
/// differ fail the agreement together instead of pairing one request's values with another's.
/// A word that must be reduced by max travels as its complement.
struct step_message {
  static constexpr std::size_t header = 3, words = 5;
  std::vector<std::uint64_t> v;

  explicit step_message(std::size_t entries) : v(header + words * entries, 0) { v[0] = entries; }
  std::span<std::uint64_t> entry(std::size_t i) noexcept {
    return std::span(v).subspan(header + words * i, words);
  }
  void seal(std::uint64_t fp) noexcept { v[1] = fp, v[2] = ~fp; }
  bool consistent(std::size_t entries) const noexcept { return v[0] == entries && v[1] == ~v[2]; }
};

inline std::uint64_t step_fp_mix(std::uint64_t h, std::uint64_t x) noexcept {
  h ^= x + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
  h *= 0xBF58476D1CE4E5B9ull;
  return h ^ (h >> 31);
}

/// The staging blocks of a connector's loads. A block goes back to the pool only when its last
/// holder (the request, a mover batch, the quarantine) lets go, so a block that an abandoned
/// load's fetch may still write is never handed out again before that fetch completed. Idle
/// blocks are kept by size, up to `idle_cap` bytes, so a steady stream of loads does not page
/// fresh memory in for every load.
class staging_pool : public std::enable_shared_from_this<staging_pool> {
 public:
  explicit staging_pool(std::size_t idle_cap) : idle_cap_(idle_cap) {}

  /// A block of `bytes`, or empty when `max_in_flight` would be exceeded or memory ran out.
  std::shared_ptr<std::byte[]> take(std::size_t bytes, std::size_t max_in_flight) {
    std::unique_ptr<std::byte[]> block;
    {
      std::lock_guard lock(mu_);
      if (bytes > max_in_flight - std::min(max_in_flight, in_flight_)) return nullptr;
      const auto it =
          std::find_if(idle_.begin(), idle_.end(), [&](const auto& b) { return b.first == bytes; });
      if (it != idle_.end()) {
        block = std::move(it->second);
        idle_bytes_ -= bytes;
        idle_.erase(it);
      }
      in_flight_ += bytes;
    }
    if (!block) block.reset(new (std::nothrow) std::byte[bytes]);
    if (!block) {
      std::lock_guard lock(mu_);
      in_flight_ -= bytes;
      return nullptr;
    }
    return {block.release(), [self = shared_from_this(), bytes](std::byte* p) { self->give_back(p, bytes); }};
  }

  std::size_t in_flight() const {
    std::lock_guard lock(mu_);
    return in_flight_;
  }

 private:
  void give_back(std::byte* p, std::size_t bytes) noexcept {
    std::unique_ptr<std::byte[]> block(p);
    std::lock_guard lock(mu_);
    in_flight_ -= bytes;
    if (idle_bytes_ + bytes > idle_cap_) return;
    try {
      idle_.emplace_back(bytes, std::move(block));
      idle_bytes_ += bytes;
    } catch (...) {  // no room to remember it: the block is freed
    }
  }

  mutable std::mutex mu_;
  std::size_t idle_cap_, in_flight_ = 0, idle_bytes_ = 0;
  std::vector<std::pair<std::size_t, std::unique_ptr<std::byte[]>>> idle_;
};

}  // namespace kvtier::detail
