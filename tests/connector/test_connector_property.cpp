// Property: the connector's agreed lookup is the min over ranks of the rank answers, which is
// the longest present prefix, over random presence patterns, world sizes and ownership policies.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <variant>
#include <vector>

#include <catch2/catch.hpp>

#include "connector/connector_rig.hpp"
#include "kvtier/comm/inproc.hpp"
#include "kvtier/connector.hpp"
#include "kvtier/lookup.hpp"
#include "kvtier/ownership.hpp"
#include "kvtier/store/memory_store.hpp"
#include "support/property.hpp"

using namespace kvtier;
using namespace kvtier::test;

namespace {

constexpr std::size_t T = 16;

kv_layout tiny_layout() {
  return kv_layout::vllm_mla(1, /*num_blocks=*/8, /*block_size=*/16, 2, /*latent=*/4);
}

// Every rank's agreed cached prefix for a prompt whose chunk c is stored iff present[c].
template <ownership_policy Own>
std::vector<std::uint64_t> agreed_lookups(const Own& own, const std::vector<bool>& present,
                                          std::size_t tail) {
  const rank_t W = own.world_size();
  const key_namespace ns{
      .model = "property", .kv_format = "tiny", .chunk_tokens = T, .ownership = own.geometry()};
  const std::vector<token_id> prompt = rig_prompt(present.size() * T + tail, present.size());
  const chunker<> chunk(ns);
  const std::vector<chunk_key> keys = chunk.keys(prompt);
  std::vector<std::uint64_t> agreed(W, ~std::uint64_t{0});
  comm::inproc_world world(W);
  comm::run_ranks(world, [&](comm::inproc_communicator& c) {
    const rank_t r = c.rank();
    memory_store store(1 << 20);
    host_kv_cache cache(tiny_layout());
    const std::vector<std::byte> value(cache.value_bytes(T), std::byte{7});
    for (std::size_t k = 0; k < keys.size(); ++k) {
      if (!present[k] || static_cast<rank_t>(own.owner(k)) != r) continue;  // each rank stores what it owns
      chunk_status st{};
      const std::span<const std::byte> src(value);
      store.put(std::span(&keys[k], 1), std::span(&src, 1), std::span(&st, 1), no_deadline);
    }
    connector_options opt = rig_options();
    opt.fetch_workers = 1;
    connector conn(chunk, own, store, c, cache.view(), opt);
    if (auto plan = lookup_agreed(conn, 1, prompt)) agreed[r] = plan->cached_tokens;
  });
  return agreed;
}

}  // namespace

TEST_CASE("connector property: the agreed lookup is the min over ranks of the rank answers", "[property]") {
  prop("agreed lookup == min over ranks == longest present prefix", [] {
    const auto W = *rc::gen::inRange<rank_t>(1, 6);
    const auto n = *rc::gen::inRange<std::size_t>(0, 12);
    const auto present =
        *rc::gen::container<std::vector<bool>>(n, rc::gen::weightedElement<bool>({{4, true}, {1, false}}));
    const auto tail = *rc::gen::inRange<std::size_t>(0, T);
    const int kind = *rc::gen::inRange(0, 3);
    const auto check = [&](const auto& own) {
      std::vector<std::uint64_t> answers;
      for (rank_t r = 0; r < W; ++r) {
        const auto starts = owned_starts(own, r, n, T);
        std::vector<bool> mine;
        for (std::size_t c : owned_chunks(own, r, n)) mine.push_back(present[c]);
        answers.push_back(rank_answer(std::span<const std::uint64_t>(starts), mine, n * T));
      }
      const std::uint64_t expect = min_over_ranks(answers);
      RC_ASSERT(expect == longest_present_prefix_tokens(present, n, T));
      for (std::uint64_t a : agreed_lookups(own, present, tail)) RC_ASSERT(a == expect);
    };
    if (kind == 0) check(modulo_ownership(W));
    if (kind == 1) check(block_interleave_ownership(W, *rc::gen::inRange<std::size_t>(1, 4)));
    if (kind == 2) check(rendezvous_ownership(W, *rc::gen::arbitrary<std::uint64_t>()));
  });
}
