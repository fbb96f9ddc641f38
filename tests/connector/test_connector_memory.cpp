// What a connector keeps in memory between requests (issue 27's soak): the staging pool keeps a
// few idle blocks for the next loads, and a burst of loads held at once (a slow server: blocks
// quarantined until each fetch ends) is freed once it is over, not kept for the process's life;
// the keys a rank stored are the newest N, in a table allocated once.
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <random>
#include <vector>

#include <catch2/catch.hpp>

#include "kvtier/connector/detail/recent_keys.hpp"
#include "kvtier/connector/detail/state.hpp"

using kvtier::detail::staging_pool;

namespace {

constexpr std::size_t chunk = 4096;
constexpr std::size_t no_limit = std::size_t{1} << 40;

}  // namespace

TEST_CASE("staging pool: a burst of blocks held at once leaves at most max_idle_blocks idle",
          "[connector][memory]") {
  const auto pool = std::make_shared<staging_pool>(std::size_t{1} << 30);
  {
    std::vector<std::shared_ptr<std::byte[]>> burst;
    for (std::size_t i = 0; i < 40; ++i) burst.push_back(pool->take((1 + i % 8) * chunk, no_limit));
    for (const auto& b : burst) REQUIRE(b);
    CHECK(pool->in_flight() == 5 * 36 * chunk);  // 40 loads of 1..8 chunks
  }
  CHECK(pool->in_flight() == 0);
  const auto [blocks, bytes] = pool->idle();
  CHECK(blocks == staging_pool::max_idle_blocks);
  CHECK(bytes <= staging_pool::max_idle_blocks * 8 * chunk);
}

TEST_CASE("staging pool: a steady stream reuses idle blocks, the smallest that holds the load",
          "[connector][memory]") {
  const auto pool = std::make_shared<staging_pool>(std::size_t{1} << 30);
  std::byte* big = nullptr;
  std::byte* small = nullptr;
  {
    const auto a = pool->take(6 * chunk, no_limit);
    const auto b = pool->take(2 * chunk, no_limit);
    big = a.get(), small = b.get();
  }
  for (int round = 0; round < 50; ++round) {
    const auto s = pool->take(2 * chunk, no_limit);  // the 2-chunk block, not the 6-chunk one
    CHECK(s.get() == small);
    const auto l = pool->take(5 * chunk, no_limit);  // the 6-chunk block holds 5 chunks
    CHECK(l.get() == big);
    CHECK(pool->in_flight() == 7 * chunk);  // what the loads asked for, not the blocks' sizes
  }
  const auto [blocks, bytes] = pool->idle();
  CHECK(blocks == 2);
  CHECK(bytes == 8 * chunk);
}

TEST_CASE("staging pool: idle bytes stay under the cap and in-flight bytes under the limit",
          "[connector][memory]") {
  const auto pool = std::make_shared<staging_pool>(3 * chunk);
  {
    const auto a = pool->take(2 * chunk, no_limit);
    const auto b = pool->take(2 * chunk, no_limit);
    const auto c = pool->take(4 * chunk, no_limit);  // larger than the cap: freed when given back
    CHECK_FALSE(pool->take(chunk, 8 * chunk));       // 8 chunks in flight: no room for one more
  }
  const auto [blocks, bytes] = pool->idle();
  CHECK(blocks == 1);
  CHECK(bytes == 2 * chunk);
}

TEST_CASE("recent keys: the newest N insertions are remembered, the older ones forgotten",
          "[connector][memory]") {
  kvtier::detail::recent_keys keys(1000);
  for (std::uint64_t i = 0; i < 3000; ++i) CHECK(keys.insert({i, i * 7}));
  CHECK(keys.size() == 1000);
  for (std::uint64_t i = 0; i < 3000; ++i) CHECK(keys.contains({i, i * 7}) == (i >= 2000));
  CHECK_FALSE(keys.insert({2500, 2500 * 7}));  // already there: no insertion
  CHECK(keys.erase({2500, 2500 * 7}));
  CHECK_FALSE(keys.erase({2500, 2500 * 7}));
  CHECK(keys.size() == 999);
}

TEST_CASE("recent keys: random inserts and erases agree with a model of the newest N insertions",
          "[connector][memory]") {
  // Few distinct keys and a small table: long probe runs that wrap, keys erased and inserted again.
  for (const std::size_t capacity : {1u, 3u, 8u, 33u}) {
    kvtier::detail::recent_keys keys(capacity);
    std::map<std::uint64_t, std::uint64_t> inserted_at;  // key -> its insertion's number, while remembered
    std::uint64_t insertions = 0;
    std::mt19937_64 rng(capacity);
    const auto key = [](std::uint64_t v) { return kvtier::chunk_key{v >> 2, v * 0x9E3779B97F4A7C15ull}; };
    const auto remembered = [&](std::uint64_t v) {
      const auto it = inserted_at.find(v);
      return it != inserted_at.end() && it->second + capacity >= insertions;
    };
    for (int op = 0; op < 20000; ++op) {
      const std::uint64_t v = rng() % (2 * capacity + 3);
      if (rng() % 3 != 0) {
        const bool was = remembered(v);
        CHECK(keys.insert(key(v)) == !was);
        if (!was) inserted_at[v] = insertions++;
      } else {
        const bool was = remembered(v);
        CHECK(keys.erase(key(v)) == was);
        inserted_at.erase(v);
      }
      std::size_t n = 0;
      for (std::uint64_t w = 0; w < 2 * capacity + 3; ++w) {
        n += remembered(w);
        REQUIRE(keys.contains(key(w)) == remembered(w));
      }
      REQUIRE(keys.size() == n);
    }
  }
}
