// kvtier/store/rank_view.hpp: one rank's view of a store partitioned by chunk
// ownership. (Not itself a chunk_store: its calls take the whole prompt's keys.)
//
// Rank r stores, looks up and loads only the chunks it owns under the ownership
// policy, so rank r of every engine touches the same partition and can use its
// own server instance (resp://valkey-{rank}:6379). Calls take the whole prompt's
// keys (prompt_keys[c] is chunk c) and pick the owned ones themselves:
//
//   kvtier::remote_store<conn> l2_r(chunk.ns(), ...);     // this rank's instance
//   kvtier::rank_view view(l2_r, kvtier::modulo_ownership(8), rank, chunk.ns());  // chunk_tokens from ns
//   kvtier::rank_lookup a = view.lookup(keys, prompt_tokens, dl);  // rank answer, in tokens
//   std::uint64_t hit = a.answer_tokens;
//   all_reduce_value(comm, hit, reduce_op::min, dl);      // longest cached prefix
//   auto mine = view.owned_chunks(hit / view.chunk_tokens());  // chunks this rank loads
//   std::vector<kvtier::chunk_status> st(mine.size());
//   view.get_owned(keys, chunk_buffers, st, dl);          // chunk_buffers: one per prompt chunk
//   view.put_owned(keys, chunk_buffers, st, dl);          // writes back only owned chunks
//
// Sizes: prompt-indexed spans (keys, dst, src) have one entry per prompt chunk;
// entries of chunks another rank owns are ignored (may be empty). `status` has
// one entry per owned chunk, in ascending chunk order (owned_chunks(n).size()).
// The backend is held by reference and must outlive the view.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <ranges>
#include <span>
#include <stdexcept>
#include <system_error>
#include <vector>

#include "kvtier/chunker.hpp"
#include "kvtier/deadline.hpp"
#include "kvtier/detail/store_common.hpp"
#include "kvtier/errc.hpp"
#include "kvtier/lookup.hpp"
#include "kvtier/ownership.hpp"
#include "kvtier/store/chunk_store.hpp"

namespace kvtier {

/// What rank_view::lookup reports: the rank answer in tokens, and the store's
/// error (empty when the call worked; misses are not errors).
struct rank_lookup {
  std::uint64_t answer_tokens = 0;
  std::error_code ec;
};

template <chunk_store Store, ownership_policy Ownership>
class rank_view {
 public:
  /// chunk_tokens: tokens per chunk, the chunker's (chunker::chunk_tokens()); the form
  /// below takes it from the chunker's namespace. Throws std::invalid_argument if
  /// rank >= policy.world_size() or chunk_tokens == 0.
  rank_view(Store& backend, Ownership policy, rank_t rank, std::size_t chunk_tokens)
      : backend_(backend), policy_(std::move(policy)), rank_(rank), chunk_tokens_(chunk_tokens) {
    if (rank >= static_cast<rank_t>(policy_.world_size()))
      throw std::invalid_argument("kvtier::rank_view: rank out of range");
    if (chunk_tokens == 0) throw std::invalid_argument("kvtier::rank_view: chunk_tokens must be > 0");
  }
  /// The same with ns.chunk_tokens: `rank_view view(store, own, r, chunk.ns())`.
  rank_view(Store& backend, Ownership policy, rank_t rank, const key_namespace& ns)
      : rank_view(backend, std::move(policy), rank, std::size_t{ns.chunk_tokens}) {}

  rank_t rank() const noexcept { return rank_; }
  std::size_t chunk_tokens() const noexcept { return chunk_tokens_; }
  const Ownership& policy() const noexcept { return policy_; }
  Store& backend() noexcept { return backend_; }

  bool owns(std::size_t chunk) const { return static_cast<rank_t>(policy_.owner(chunk)) == rank_; }

  /// Indexes of the owned chunks among the first n, ascending.
  std::vector<std::size_t> owned_chunks(std::size_t n_chunks) const {
    return kvtier::owned_chunks(policy_, rank_, n_chunks);
  }
  /// Start tokens of the owned chunks among the first n: the rank's owned-start vector.
  std::vector<std::uint64_t> owned_starts(std::size_t n_chunks) const {
    return kvtier::owned_starts(policy_, rank_, n_chunks, chunk_tokens_);
  }
  /// The owned entries of a prompt-indexed sequence (a std::vector, std::span,
  /// std::array of keys, buffers, ...), in order.
  template <std::ranges::random_access_range R>
  std::vector<std::ranges::range_value_t<R>> select(const R& prompt_items) const {
    std::vector<std::ranges::range_value_t<R>> out;
    const auto n = static_cast<std::size_t>(std::ranges::size(prompt_items));
    for (std::size_t c = 0; c < n; ++c)
      if (owns(c)) out.push_back(std::ranges::begin(prompt_items)[static_cast<std::ptrdiff_t>(c)]);
    return out;
  }
  std::vector<chunk_key> owned_keys(std::span<const chunk_key> prompt_keys) const {
    return select(prompt_keys);
  }

  /// Presence of the owned chunks (status: one per owned chunk).
  std::error_code exists_owned(std::span<const chunk_key> prompt_keys, std::span<chunk_status> status,
                               deadline dl) {
    std::vector<chunk_key> keys = owned_keys(prompt_keys);
    if (keys.size() != status.size()) return make_error_code(errc::invalid_argument);
    return backend_.exists(keys, status, dl);
  }

  /// Loads the owned chunks into their prompt-indexed destinations.
  std::error_code get_owned(std::span<const chunk_key> prompt_keys,
                            std::span<const std::span<std::byte>> prompt_dst, std::span<chunk_status> status,
                            deadline dl) {
    if (prompt_dst.size() != prompt_keys.size()) return make_error_code(errc::invalid_argument);
    std::vector<chunk_key> keys = owned_keys(prompt_keys);
    if (keys.size() != status.size()) return make_error_code(errc::invalid_argument);
    std::vector<std::span<std::byte>> dst = select(prompt_dst);
    return backend_.get(keys, dst, status, dl);
  }

  /// Stores the owned chunks from their prompt-indexed sources.
  std::error_code put_owned(std::span<const chunk_key> prompt_keys,
                            std::span<const std::span<const std::byte>> prompt_src,
                            std::span<chunk_status> status, deadline dl) {
    if (prompt_src.size() != prompt_keys.size()) return make_error_code(errc::invalid_argument);
    std::vector<chunk_key> keys = owned_keys(prompt_keys);
    if (keys.size() != status.size()) return make_error_code(errc::invalid_argument);
    std::vector<std::span<const std::byte>> src = select(prompt_src);
    return backend_.put(keys, src, status, dl);
  }

  /// The rank's lookup answer (kvtier::rank_answer over its owned chunks): the
  /// start token of its first owned chunk that is not present, or the end of the
  /// prompt's last keyed chunk, never past prompt_tokens (with a hashed partial
  /// tail, tail_policy::hash_partial, the last key covers fewer tokens). A failed
  /// call counts its unfinished keys as not present, so the answer only ever
  /// shrinks ("recompute from here"): a rank whose call failed reports its first
  /// owned start, not 0.
  ///
  /// prompt_tokens must match the keys (either tail policy): more than
  /// (keys - 1) * chunk_tokens and less than (keys + 1) * chunk_tokens; else
  /// {0, errc::invalid_argument} and no store call. This call blocks until `dl`;
  /// fetch_queue::lookup is the non-blocking form (see phase_deadlines in deadline.hpp).
  ///
  /// Example: 300 tokens, 256-token chunks, hash_partial (2 keys), all present:
  /// answer_tokens == 300 (not 512), so prompt_tokens - answer_tokens never wraps.
  rank_lookup lookup(std::span<const chunk_key> prompt_keys, std::uint64_t prompt_tokens, deadline dl) {
    const std::uint64_t n = prompt_keys.size(), t = chunk_tokens_;
    if ((n > 0 && prompt_tokens <= (n - 1) * t) || prompt_tokens >= (n + 1) * t)
      return {0, make_error_code(errc::invalid_argument)};
    const std::vector<std::uint64_t> starts = owned_starts(prompt_keys.size());
    std::vector<chunk_status> status(starts.size(), chunk_status::error);
    const std::error_code ec = exists_owned(prompt_keys, status, dl);
    const std::uint64_t end = std::min(n * t, prompt_tokens);
    return {rank_answer(std::span<const std::uint64_t>(starts), detail::store_hit_view{status}, end), ec};
  }

 private:
  Store& backend_;
  Ownership policy_;
  rank_t rank_;
  std::size_t chunk_tokens_;
};

}  // namespace kvtier
