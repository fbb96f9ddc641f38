// The lookup proof: for random world sizes, prompt lengths (with and without a
// partial tail), presence patterns and every ownership policy,
//   min over ranks of rank_answer() == longest_present_prefix_tokens(), and
//   the storage-layer form rank_answer_cumulative() == rank_answer() on every rank.
// 10,000 cases per property (KVTIER_PROPERTY_CASES overrides).
#include <catch2/catch.hpp>

#include <cstdint>
#include <vector>

#include "kvtier/lookup.hpp"
#include "support/property.hpp"

namespace {

enum class pattern : int { all, none, single_gap, random, prefix_then_random, count };

std::uint64_t splitmix(std::uint64_t& s) {
  std::uint64_t x = (s += 0x9E3779B97F4A7C15ull);
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// A case is a handful of small generated numbers; the presence vector is derived
// from them, so generating and shrinking stay cheap at 1000 chunks.
struct scenario {
  kvtier::rank_t world;
  std::size_t n_chunks;
  std::uint64_t chunk_tokens;
  std::uint64_t n_tokens;  // n_chunks * chunk_tokens + tail
  std::vector<std::uint8_t> present;
};

scenario gen_scenario() {
  using namespace rc;
  scenario s;
  s.world = *gen::inRange<kvtier::rank_t>(1, 65);
  s.n_chunks = *gen::inRange<std::size_t>(0, 1001);
  s.chunk_tokens = *gen::element<std::uint64_t>(1, 2, 16, 256, 1000, 4096);
  const bool with_tail = *gen::arbitrary<bool>();
  const std::uint64_t tail =
      with_tail && s.chunk_tokens > 1 ? *gen::inRange<std::uint64_t>(1, s.chunk_tokens) : 0;
  s.n_tokens = s.n_chunks * s.chunk_tokens + tail;

  const auto kind = static_cast<pattern>(*gen::inRange(0, static_cast<int>(pattern::count)));
  const std::size_t n = s.n_chunks;
  s.present.assign(n, kind == pattern::none ? 0 : 1);
  if (kind == pattern::single_gap && n > 0) {
    s.present[*gen::inRange<std::size_t>(0, n)] = 0;
  } else if (kind == pattern::random || kind == pattern::prefix_then_random) {
    const std::size_t keep = kind == pattern::prefix_then_random ? *gen::inRange<std::size_t>(0, n + 1) : 0;
    const std::uint64_t density_pct = *gen::inRange<std::uint64_t>(0, 101);
    std::uint64_t seed = *gen::arbitrary<std::uint64_t>();
    for (std::size_t c = keep; c < n; ++c) s.present[c] = splitmix(seed) % 100 < density_pct ? 1 : 0;
  }
  return s;
}

// Both statements for one policy and one scenario.
template <class Policy>
void check_policy(const Policy& policy, const scenario& s) {
  const kvtier::rank_t w = policy.world_size();
  const std::uint64_t end = kvtier::full_chunks_end_tokens(s.n_tokens, s.chunk_tokens);
  RC_ASSERT(end == s.n_chunks * s.chunk_tokens);  // the tail never counts

  // One pass over the chunks groups each rank's owned starts and presence bits
  // (owned_starts() per rank would cost W passes, W^2 for rendezvous).
  std::vector<std::vector<std::uint64_t>> starts(w);
  std::vector<std::vector<std::uint8_t>> present(w);
  for (std::size_t c = 0; c < s.n_chunks; ++c) {
    const kvtier::rank_t r = policy.owner(c);
    RC_ASSERT(r < w);
    starts[r].push_back(c * s.chunk_tokens);
    present[r].push_back(s.present[c]);
  }
  // The library's per-rank vectors agree with the grouping, on one chosen rank.
  const auto probe = *rc::gen::inRange<kvtier::rank_t>(0, w);
  RC_ASSERT(kvtier::owned_starts(policy, probe, s.n_chunks, s.chunk_tokens) == starts[probe]);
  RC_ASSERT(kvtier::owned_cumulative_lengths(policy, probe, s.n_chunks, s.chunk_tokens) ==
            kvtier::cumulative_lengths(starts[probe], end));

  std::vector<std::uint64_t> answers(w);
  for (kvtier::rank_t r = 0; r < w; ++r) {
    answers[r] = kvtier::rank_answer(starts[r], present[r], end);
    const auto storage =
        kvtier::rank_answer_cumulative(kvtier::cumulative_lengths(starts[r], end), present[r]);
    RC_ASSERT(storage == answers[r]);
    // No rank answers before its first owned chunk (a rank with no hits is not 0).
    RC_ASSERT((starts[r].empty() ? answers[r] == end : answers[r] >= starts[r].front()));
  }
  RC_ASSERT(kvtier::min_over_ranks(answers) ==
            kvtier::longest_present_prefix_tokens(s.present, s.n_chunks, s.chunk_tokens));
}

}  // namespace

TEST_CASE("lookup proof: modulo ownership", "[property]") {
  kvtier::test::prop("min over ranks == longest present prefix; storage form == direct form (c mod W)", [] {
    const scenario s = gen_scenario();
    check_policy(kvtier::modulo_ownership(s.world), s);
  });
}

TEST_CASE("lookup proof: block interleave ownership", "[property]") {
  kvtier::test::prop("min over ranks == longest present prefix; storage form == direct form ((c/I) mod W)",
                     [] {
                       const scenario s = gen_scenario();
                       const std::size_t block = *rc::gen::inRange<std::size_t>(1, 65);
                       check_policy(kvtier::block_interleave_ownership(s.world, block), s);
                     });
}

TEST_CASE("lookup proof: rendezvous ownership", "[property]") {
  kvtier::test::prop("min over ranks == longest present prefix; storage form == direct form (rendezvous)",
                     [] {
                       const scenario s = gen_scenario();
                       const auto seed = *rc::gen::arbitrary<std::uint64_t>();
                       check_policy(kvtier::rendezvous_ownership(s.world, seed), s);
                     });
}
