// Lookup: per-rank answers, the storage-layer form and the min-over-ranks
// reduction on hand-checked cases. The randomised proof is test_lookup_proof.
#include <catch2/catch.hpp>

#include <array>
#include <cstdint>
#include <limits>
#include <vector>

#include "kvtier/lookup.hpp"

namespace {

using starts_t = std::vector<std::uint64_t>;

// Every rank's answer under `policy` for a global presence pattern, by both forms.
struct ranks_view {
  std::vector<std::uint64_t> direct, storage;
};

template <class Policy>
ranks_view answers(const Policy& policy, const std::vector<bool>& present, std::uint64_t chunk_tokens) {
  const std::size_t n = present.size();
  const std::uint64_t end = n * chunk_tokens;
  ranks_view v;
  for (kvtier::rank_t r = 0; r < policy.world_size(); ++r) {
    const auto mine = kvtier::owned_chunks(policy, r, n);
    std::vector<bool> p;
    for (std::size_t c : mine) p.push_back(present[c]);
    const auto starts = kvtier::owned_starts(policy, r, n, chunk_tokens);
    v.direct.push_back(kvtier::rank_answer(starts, p, end));
    v.storage.push_back(
        kvtier::rank_answer_cumulative(kvtier::owned_cumulative_lengths(policy, r, n, chunk_tokens), p));
  }
  return v;
}

}  // namespace

TEST_CASE("lookup: W = 2, chunk 0 present, chunk 1 missing: rank 1 reports 256", "[unit]") {
  const kvtier::modulo_ownership own(2);
  const auto v = answers(own, {true, false, true, true}, 256);
  CHECK(v.direct == starts_t{1024, 256});  // rank 0 has all of its chunks: the end
  CHECK(v.storage == v.direct);
  CHECK(kvtier::min_over_ranks(v.direct) == 256);
  CHECK(kvtier::longest_present_prefix_tokens(std::vector<bool>{true, false, true, true}, 4, 256) == 256);
}

TEST_CASE("lookup: a rank with no hits reports its first owned start, not 0", "[unit]") {
  const starts_t starts{256, 768};
  const std::vector<bool> none{false, false};
  CHECK(kvtier::rank_answer(starts, none, 1024) == 256);
  CHECK(kvtier::rank_answer_cumulative(kvtier::cumulative_lengths(starts, 1024), none) == 256);
  // Outside shard mode the first owned start is 0, so the old answer is kept.
  CHECK(kvtier::rank_answer(starts_t{0, 256}, none, 512) == 0);
  // Nothing present anywhere: the whole prompt is recomputed.
  const auto v = answers(kvtier::modulo_ownership(4), std::vector<bool>(8, false), 256);
  CHECK(v.direct == starts_t{0, 256, 512, 768});
  CHECK(v.storage == v.direct);
  CHECK(kvtier::min_over_ranks(v.direct) == 0);
}

TEST_CASE("lookup: a rank that owns nothing reports the end", "[unit]") {
  const starts_t nothing;
  const std::vector<bool> no_presence;
  CHECK(kvtier::rank_answer(nothing, no_presence, 768) == 768);
  CHECK(kvtier::rank_answer_cumulative(kvtier::cumulative_lengths(nothing, 768), no_presence) == 768);
  // W = 8, 3 full chunks (plus a tail): ranks 3..7 own nothing and must not pull the minimum down.
  const auto v = answers(kvtier::modulo_ownership(8), {true, true, false}, 256);
  CHECK(v.direct == starts_t{768, 768, 512, 768, 768, 768, 768, 768});
  CHECK(v.storage == v.direct);
  CHECK(kvtier::min_over_ranks(v.direct) == 512);
}

TEST_CASE("lookup: all present gives the end of the last full chunk", "[unit]") {
  CHECK(kvtier::full_chunks_end_tokens(1000, 256) == 768);
  CHECK(kvtier::full_chunks_end_tokens(1024, 256) == 1024);
  CHECK(kvtier::full_chunks_end_tokens(255, 256) == 0);
  CHECK(kvtier::full_chunks_end_tokens(5, 0) == 0);
  const auto v = answers(kvtier::modulo_ownership(2), std::vector<bool>(3, true), 256);
  CHECK(v.direct == starts_t{768, 768});
  CHECK(kvtier::min_over_ranks(v.storage) == 768);
}

TEST_CASE("lookup: zero chunks", "[unit]") {
  const auto v = answers(kvtier::modulo_ownership(3), {}, 256);
  CHECK(v.direct == starts_t{0, 0, 0});
  CHECK(v.storage == v.direct);
  CHECK(kvtier::longest_present_prefix_tokens(std::vector<bool>{}, 0, 256) == 0);
}

TEST_CASE("lookup: a hit after a miss does not count", "[unit]") {
  const starts_t starts{0, 512, 1024};
  CHECK(kvtier::rank_answer(starts, std::vector<bool>{true, false, true}, 1536) == 512);
  CHECK(kvtier::rank_answer(starts, std::vector<bool>{false, true, true}, 1536) == 0);
  CHECK(kvtier::contiguous_hit_count(std::vector<int>{1, 1, 0, 1}, 4) == 2);
  CHECK(kvtier::contiguous_hit_count(std::vector<int>{1, 1, 1, 1}, 2) == 2);  // looks at n entries only
  CHECK(kvtier::longest_present_prefix_tokens(std::vector<int>{1, 0, 1}, 3, 256) == 256);
}

TEST_CASE("lookup: presence views", "[unit]") {
  const starts_t starts{0, 256};
  const std::array<bool, 2> arr{true, false};
  const bool raw[2] = {true, true};
  const std::vector<std::uint8_t> bytes{1, 0};
  CHECK(kvtier::rank_answer(starts, arr, 512) == 256);
  CHECK(kvtier::rank_answer(starts, raw, 512) == 512);
  CHECK(kvtier::rank_answer(starts, std::span<const bool>(arr), 512) == 256);
  CHECK(kvtier::rank_answer(starts, bytes, 512) == 256);
  static_assert(kvtier::presence_view<std::vector<bool>>);
  static_assert(!kvtier::presence_view<int>);
}

TEST_CASE("lookup: storage layer's cumulative-length vector", "[unit]") {
  CHECK(kvtier::cumulative_lengths(starts_t{256, 768}, 1024) == starts_t{256, 768, 1024});
  CHECK(kvtier::owned_cumulative_lengths(kvtier::modulo_ownership(2), 1, 4, 256) == starts_t{256, 768, 1024});
  CHECK(kvtier::owned_cumulative_lengths(kvtier::modulo_ownership(8), 5, 3, 256) == starts_t{768});
  const starts_t cum{256, 768, 1024};
  CHECK(kvtier::rank_answer_cumulative(cum, std::vector<bool>{true, false}) == 768);
  CHECK(kvtier::rank_answer_cumulative(cum, std::vector<bool>{false, false}) == 256);
  CHECK(kvtier::rank_answer_cumulative(cum, std::vector<bool>{true, true}) == 1024);
  CHECK(kvtier::rank_answer_cumulative(starts_t{}, std::vector<bool>{}) == 0);  // malformed: nothing cached
}

TEST_CASE("lookup: min over ranks", "[unit]") {
  CHECK(kvtier::min_over_ranks(starts_t{512, 256, 1024}) == 256);
  CHECK(kvtier::min_over_ranks(starts_t{7}) == 7);
  CHECK(kvtier::min_over_ranks(starts_t{}) == std::numeric_limits<std::uint64_t>::max());
}
