// kvtier/lookup.hpp: each rank's cache-lookup answer and the min-over-ranks
// reduction that turns them into the longest cached prefix of the whole prompt.
//
// Pure functions, no I/O. Rank r owns some of the prompt's C full chunks (see
// ownership.hpp) and asks its own store which of them are present. Its answer
// a_r is the start token of its first missing owned chunk, or the end of the
// last full chunk (C * chunk_tokens) when none of its chunks is missing. Then
//
//   min over r of a_r == longest prefix of present chunks, in tokens,
//
// because the first missing chunk of the prompt is owned by some rank, which
// reports exactly its start, and every other rank reports a start at or after
// it (every chunk before it is present). A rank with no hits reports the start
// of its first owned chunk, not 0: with W = 2 and chunk 1 missing, rank 1
// reports 256 even though chunk 0 (rank 0's) is present.
//
//   kvtier::modulo_ownership own(8);
//   auto starts  = kvtier::owned_starts(own, rank, n_chunks, 256);
//   std::vector<bool> present = store_exists(keys of rank's chunks);
//   std::uint64_t a = kvtier::rank_answer(starts, present, n_chunks * 256);
//   std::uint64_t hit = comm.all_reduce_min(a);    // == kvtier::min_over_ranks(all answers)
//
// Under tail_policy::drop the partial tail chunk never takes part, so the answer
// is at most the end of the last full chunk (see full_chunks_end_tokens()). Under
// tail_policy::hash_partial the last key covers a shorter tail: pass the prompt's
// token count as end_tokens (rank_view::lookup does), never keys * chunk_tokens.
//
// Names: every function here that returns a rank's answer in tokens says
// "rank_answer" (rank_answer, rank_answer_cumulative; chunk_broadcast.hpp has
// rank_answer_loaded; fetch_result and rank_lookup carry answer_tokens).
// contiguous_hit_count() counts chunks, not tokens.
#pragma once

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include "kvtier/ownership.hpp"

namespace kvtier {

/// Anything that says, for index k, whether entry k is present: std::vector<bool>,
/// std::span<const bool>, std::vector<std::uint8_t>, a plain array, ...
template <class P>
concept presence_view = requires(const P& p, std::size_t k) {
  {static_cast<bool>(p[k])};
};

/// End of the last full chunk of an n-token prompt: (n / chunk_tokens) * chunk_tokens.
/// Example: full_chunks_end_tokens(1000, 256) == 768.
constexpr std::uint64_t full_chunks_end_tokens(std::uint64_t n_tokens, std::uint64_t chunk_tokens) noexcept {
  return chunk_tokens == 0 ? 0 : n_tokens / chunk_tokens * chunk_tokens;
}

/// Rank answer, direct form. `owned_starts[k]` is the start token of the rank's
/// k-th owned chunk (ascending), `present[k]` is truthy iff that chunk is
/// present, `end_tokens` is the end of the prompt's last full chunk.
/// Returns owned_starts[k] for the first k with !present[k], else end_tokens.
///
/// `present` must have at least owned_starts.size() entries.
///
/// Example (W = 2, chunk 256, 4 full chunks, rank 1 owns chunks 1 and 3; the
/// braced lists stand for vectors):
///   rank_answer({256, 768}, {true, false}, 1024) == 768
///   rank_answer({256, 768}, {false, true}, 1024) == 256   // no hits: first owned start, not 0
///   rank_answer({256, 768}, {true, true}, 1024)  == 1024  // all present: the end
///   rank_answer({}, {}, 1024)                    == 1024  // owns nothing: the end
template <class Present>
requires presence_view<Present> std::uint64_t rank_answer(std::span<const std::uint64_t> owned_starts,
                                                          const Present& present, std::uint64_t end_tokens) {
  for (std::size_t k = 0; k < owned_starts.size(); ++k)
    if (!static_cast<bool>(present[k])) return owned_starts[k];
  return end_tokens;
}

/// The scheduler's reduction: the smallest answer. For an empty span, the
/// identity of min (UINT64_MAX), as an all-reduce over no ranks would give.
///
/// Example: min_over_ranks({512, 256, 1024}) == 256.
inline std::uint64_t min_over_ranks(std::span<const std::uint64_t> answers) noexcept {
  std::uint64_t m = std::numeric_limits<std::uint64_t>::max();
  for (std::uint64_t a : answers) m = std::min(m, a);
  return m;
}

/// Number of leading present entries among the first `n`: the storage layer's
/// count of contiguous hits. Example: contiguous_hit_count({1, 1, 0, 1}, 4) == 2.
template <class Present>
requires presence_view<Present> std::size_t contiguous_hit_count(const Present& present, std::size_t n) {
  std::size_t k = 0;
  while (k < n && static_cast<bool>(present[k])) ++k;
  return k;
}

/// The custom cumulative-length vector a rank hands its storage layer: entry k
/// is the start token of its k-th owned chunk, and one last entry holds
/// `end_tokens`, so entry h is "how far the prompt is covered after h hits".
///
/// Example (W = 2, chunk 256, 4 full chunks, rank 1):
///   cumulative_lengths({256, 768}, 1024) == {256, 768, 1024}
inline std::vector<std::uint64_t> cumulative_lengths(std::span<const std::uint64_t> owned_starts,
                                                     std::uint64_t end_tokens) {
  std::vector<std::uint64_t> out;
  out.reserve(owned_starts.size() + 1);
  out.assign(owned_starts.begin(), owned_starts.end());
  out.push_back(end_tokens);
  return out;
}

/// cumulative_lengths() for rank r under `policy`, for a prompt of `n_chunks`
/// full chunks of `chunk_tokens` tokens.
template <ownership_policy P>
std::vector<std::uint64_t> owned_cumulative_lengths(const P& policy, rank_t r, std::size_t n_chunks,
                                                    std::size_t chunk_tokens) {
  std::vector<std::uint64_t> out = owned_starts(policy, r, n_chunks, chunk_tokens);
  out.push_back(static_cast<std::uint64_t>(n_chunks) * chunk_tokens);
  return out;
}

/// Rank answer, storage-layer form: count the contiguous hits h over the rank's
/// owned chunks, then read entry h of the cumulative-length vector (size K + 1
/// for K owned chunks, see cumulative_lengths()). Equals rank_answer() for the
/// same rank; the property tests check that. An empty vector (malformed input)
/// gives 0, the safe "nothing cached" answer.
///
/// Example: rank_answer_cumulative({256, 768, 1024}, {true, false}) == 768
///          rank_answer_cumulative({256, 768, 1024}, {false, false}) == 256
///          rank_answer_cumulative({1024}, {}) == 1024
template <class Present>
requires presence_view<Present> std::uint64_t rank_answer_cumulative(
    std::span<const std::uint64_t> cumulative, const Present& present) {
  if (cumulative.empty()) return 0;
  return cumulative[contiguous_hit_count(present, cumulative.size() - 1)];
}

/// Ground truth over the whole prompt: `present[c]` for every chunk c in
/// [0, n_chunks); returns (index of the first missing chunk) * chunk_tokens, or
/// n_chunks * chunk_tokens when all are present.
///
/// Example: longest_present_prefix_tokens({1, 0, 1}, 3, 256) == 256
///          longest_present_prefix_tokens({1, 1, 1}, 3, 256) == 768
template <class Present>
requires presence_view<Present> std::uint64_t longest_present_prefix_tokens(const Present& present,
                                                                            std::size_t n_chunks,
                                                                            std::uint64_t chunk_tokens) {
  return static_cast<std::uint64_t>(contiguous_hit_count(present, n_chunks)) * chunk_tokens;
}

}  // namespace kvtier
