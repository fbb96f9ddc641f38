// Ownership: the three policies, the concept, and the per-rank owned vectors.
#include <catch2/catch.hpp>

#include <set>
#include <string>
#include <vector>

#include "kvtier/ownership.hpp"

static_assert(kvtier::ownership_policy<kvtier::modulo_ownership>);
static_assert(kvtier::ownership_policy<kvtier::block_interleave_ownership>);
static_assert(kvtier::ownership_policy<kvtier::rendezvous_ownership>);
static_assert(!kvtier::ownership_policy<int>);

namespace {

std::vector<kvtier::rank_t> owners(const auto& policy, std::size_t n) {
  std::vector<kvtier::rank_t> out;
  for (std::size_t c = 0; c < n; ++c) out.push_back(policy.owner(c));
  return out;
}

// Every chunk belongs to exactly one rank; owned_chunks / owned_starts list
// them ascending and agree with owner().
void check_partition(const auto& policy, std::size_t n_chunks, std::size_t chunk_tokens) {
  const kvtier::rank_t w = policy.world_size();
  std::vector<int> seen(n_chunks, 0);
  for (kvtier::rank_t r = 0; r < w; ++r) {
    const auto mine = kvtier::owned_chunks(policy, r, n_chunks);
    const auto starts = kvtier::owned_starts(policy, r, n_chunks, chunk_tokens);
    REQUIRE(mine.size() == starts.size());
    for (std::size_t k = 0; k < mine.size(); ++k) {
      REQUIRE(mine[k] < n_chunks);
      CHECK(policy.owner(mine[k]) == r);
      CHECK(starts[k] == mine[k] * chunk_tokens);
      if (k > 0) CHECK(mine[k - 1] < mine[k]);
      ++seen[mine[k]];
    }
  }
  for (std::size_t c = 0; c < n_chunks; ++c) CHECK(seen[c] == 1);
}

}  // namespace

TEST_CASE("ownership: modulo", "[unit]") {
  const kvtier::modulo_ownership own(8);
  CHECK(own.world_size() == 8);
  CHECK(own.geometry() == "mod:8");
  CHECK(owners(own, 10) == std::vector<kvtier::rank_t>{0, 1, 2, 3, 4, 5, 6, 7, 0, 1});
  CHECK(kvtier::owned_chunks(own, 3, 20) == std::vector<std::size_t>{3, 11, 19});
  CHECK(kvtier::owned_starts(own, 3, 20, 256) == std::vector<std::uint64_t>{768, 2816, 4864});
  CHECK(kvtier::owned_starts(own, 7, 7, 256).empty());  // owns nothing in a short prompt
  CHECK(kvtier::owned_chunks(kvtier::modulo_ownership(1), 0, 4) == std::vector<std::size_t>{0, 1, 2, 3});
  for (kvtier::rank_t w : {1u, 2u, 3u, 8u, 64u}) check_partition(kvtier::modulo_ownership(w), 200, 256);
}

TEST_CASE("ownership: block interleave", "[unit]") {
  const kvtier::block_interleave_ownership own(2, 3);
  CHECK(own.geometry() == "block:3:2");
  CHECK(owners(own, 8) == std::vector<kvtier::rank_t>{0, 0, 0, 1, 1, 1, 0, 0});
  CHECK(kvtier::owned_chunks(own, 1, 12) == std::vector<std::size_t>{3, 4, 5, 9, 10, 11});
  CHECK(kvtier::owned_starts(own, 1, 7, 16) == std::vector<std::uint64_t>{48, 64, 80});
  // Block 1 is modulo.
  CHECK(owners(kvtier::block_interleave_ownership(5, 1), 50) == owners(kvtier::modulo_ownership(5), 50));
  for (kvtier::rank_t w : {1u, 2u, 7u, 64u})
    for (std::size_t b : {1u, 2u, 5u, 64u})
      check_partition(kvtier::block_interleave_ownership(w, b), 300, 16);
}

TEST_CASE("ownership: rendezvous", "[unit]") {
  const kvtier::rendezvous_ownership own(8);
  CHECK(own.geometry() == "rendezvous:8:0");
  CHECK(kvtier::rendezvous_ownership(8, 42).geometry() == "rendezvous:8:42");
  // Known answers: which server holds which chunk must never change silently.
  CHECK(owners(own, 16) == std::vector<kvtier::rank_t>{0, 7, 3, 4, 6, 4, 2, 4, 4, 7, 2, 6, 4, 1, 7, 7});
  CHECK(owners(kvtier::rendezvous_ownership(8, 42), 16) ==
        std::vector<kvtier::rank_t>{6, 5, 2, 5, 2, 2, 1, 5, 3, 6, 3, 5, 6, 5, 0, 6});
  // Deterministic across instances, always in range.
  CHECK(owners(own, 1000) == owners(kvtier::rendezvous_ownership(8), 1000));
  for (kvtier::rank_t w : {1u, 2u, 3u, 64u})
    check_partition(kvtier::rendezvous_ownership(w, w * 7), 300, 256);
  // Balanced in expectation: 80,000 chunks over 8 ranks, each within 5% of 10,000
  // (a binomial standard deviation is ~94, so this is a ~5-sigma band).
  std::vector<std::size_t> count(8, 0);
  for (std::size_t c = 0; c < 80000; ++c) ++count[own.owner(c)];
  for (std::size_t n : count) CHECK((n > 9500 && n < 10500));
  // Growing W moves only the chunks the new rank wins (the rendezvous property).
  const kvtier::rendezvous_ownership bigger(9);
  for (std::size_t c = 0; c < 2000; ++c)
    if (bigger.owner(c) != 8) CHECK(bigger.owner(c) == own.owner(c));
}

TEST_CASE("ownership: geometries differ between policies and sizes", "[unit]") {
  const std::set<std::string> g{kvtier::modulo_ownership(8).geometry(),
                                kvtier::modulo_ownership(4).geometry(),
                                kvtier::block_interleave_ownership(8, 1).geometry(),
                                kvtier::block_interleave_ownership(8, 2).geometry(),
                                kvtier::rendezvous_ownership(8).geometry(),
                                kvtier::rendezvous_ownership(8, 1).geometry()};
  CHECK(g.size() == 6);
}

TEST_CASE("ownership: invalid geometry is rejected", "[unit]") {
  CHECK_THROWS_AS(kvtier::modulo_ownership(0), std::invalid_argument);
  CHECK_THROWS_AS(kvtier::block_interleave_ownership(0, 1), std::invalid_argument);
  CHECK_THROWS_AS(kvtier::block_interleave_ownership(2, 0), std::invalid_argument);
  CHECK_THROWS_AS(kvtier::rendezvous_ownership(0), std::invalid_argument);
}
