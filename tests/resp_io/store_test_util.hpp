// tests/resp_io/store_test_util.hpp: fixtures shared by the Redis-protocol store tests
// (remote_store, cluster_store, TLS): a namespace, batches of keys, span views of buffers, and a
// bit-exact put/get round trip.
//
//   const auto keys = kvtier::test::keys_n(6, /*salt=*/10);
//   kvtier::test::require_round_trip(store, keys, values);   // every key stored, then a hit, same bytes
#pragma once

#include <catch2/catch.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "kvtier/chunk_status.hpp"
#include "kvtier/chunker.hpp"
#include "kvtier/deadline.hpp"

namespace kvtier::test {

/// The key namespace of a store test (raw KV, 256-token chunks).
inline key_namespace test_ns(std::string model = "test-model") {
  return key_namespace{.model = std::move(model), .kv_format = "raw", .chunk_tokens = 256};
}

/// n keys {base + salt, 1..n}: a different salt gives a disjoint batch.
inline std::vector<chunk_key> keys_n(std::size_t n, std::uint64_t salt = 0, std::uint64_t base = 0xabc0) {
  std::vector<chunk_key> k;
  for (std::size_t i = 0; i < n; ++i) k.push_back(chunk_key{base + salt, i + 1});
  return k;
}

/// Span views of a vector of byte buffers (destinations / sources of a batch).
template <class V>
std::vector<std::span<std::byte>> spans(V& bufs) {
  return {bufs.begin(), bufs.end()};
}
template <class V>
std::vector<std::span<const std::byte>> cspans(const V& bufs) {
  return {bufs.begin(), bufs.end()};
}

/// Puts `src` under `keys`, gets them back into fresh buffers: every key stored, then a hit with
/// the same bytes.
template <class Store>
void require_round_trip(Store& store, const std::vector<chunk_key>& keys,
                        const std::vector<std::vector<std::byte>>& src,
                        std::chrono::milliseconds timeout = std::chrono::milliseconds(30000)) {
  std::vector<chunk_status> st(keys.size());
  REQUIRE_FALSE(store.put(keys, cspans(src), st, deadline_after(timeout)));
  for (auto x : st) REQUIRE(x == chunk_status::stored);
  std::vector<std::vector<std::byte>> dst;
  for (const auto& v : src) dst.emplace_back(v.size());
  REQUIRE_FALSE(store.get(keys, spans(dst), st, deadline_after(timeout)));
  for (std::size_t i = 0; i < keys.size(); ++i) {
    REQUIRE(st[i] == chunk_status::hit);
    REQUIRE(dst[i] == src[i]);
  }
}

}  // namespace kvtier::test
