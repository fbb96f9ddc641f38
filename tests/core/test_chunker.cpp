#include <catch2/catch.hpp>

#include <numeric>
#include <set>
#include <vector>

#include "kvtier/chunker.hpp"

TEST_CASE("chunker: one key per full chunk, chained", "[unit]") {
  kvtier::key_namespace ns{.model = "m", .kv_format = "f", .chunk_tokens = 4};
  kvtier::chunker<> ch(ns);
  std::vector<kvtier::token_id> t(10);
  std::iota(t.begin(), t.end(), 1u);
  auto keys = ch.keys(t);
  REQUIRE(keys.size() == 2);
  // The second key depends on the first chunk: change token 0, every key changes.
  auto t2 = t;
  t2[0] = 99;
  auto keys2 = ch.keys(t2);
  CHECK(keys2[0] != keys[0]);
  CHECK(keys2[1] != keys[1]);
  // Tokens past the last full chunk do not matter under the default tail policy.
  auto t3 = t;
  t3[9] = 1234;
  CHECK(ch.keys(t3) == keys);
}
