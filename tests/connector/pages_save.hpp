// tests/connector/pages_save.hpp: a save that puts chunks from the pages where they lie, checked
// on any store that takes values in pieces (test_connector.cpp: memory_store; test_connector_redis.cpp:
// remote_store, which also takes the checksums the saver computed in the pages and the gather).
//
//   require_save_from_pages_loads_back(store, expect_digests): one rank on the calling thread.
//     Chunks 0, 1 and 3 of a prompt lie in consecutive blocks: one piece per layer in the pages
//     (36 KiB each, vLLM MLA), put from there. Chunk 2's tokens lie in other blocks in reverse
//     order: a row a piece (1152 bytes, under the saver's 4 KiB average), so it is gathered into
//     the saver's buffer and put as one piece. Checks what the store was given (keys, pieces,
//     where they lie, digests or none), then loads the prompt into fresh pages holding other
//     bytes and compares them with the model byte for byte. (A chunk with a skipped token, slot
//     -1, never reaches the saver: save() refuses it, test_connector_contract.cpp.)
#pragma once

#include <catch2/catch.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <span>
#include <utility>
#include <vector>

#include "connector/connector_rig.hpp"
#include "kvtier/comm/inproc.hpp"
#include "kvtier/connector.hpp"
#include "kvtier/host_kv_cache.hpp"
#include "kvtier/kv_copy.hpp"
#include "kvtier/store/chunk_store.hpp"

namespace kvtier::test {

/// `Inner` noting, for each value put_pieces is given, its key, its pieces and whether it came
/// with a digest (the saver's threads put; a test reads the log once the saves ended). Forwards
/// put_prehashed and format() when `Inner` has them, so the saver hashes as it would for Inner.
template <class Inner>
struct piece_log_store {
  struct entry {
    chunk_key key;
    std::vector<std::span<const std::byte>> pieces;
    bool digest = false;
  };
  Inner& inner;
  std::mutex mu;
  std::vector<entry> log;

  std::error_code exists(std::span<const chunk_key> k, std::span<chunk_status> st, deadline dl) {
    return inner.exists(k, st, dl);
  }
  std::error_code get(std::span<const chunk_key> k, std::span<const std::span<std::byte>> dst,
                      std::span<chunk_status> st, deadline dl) {
    return inner.get(k, dst, st, dl);
  }
  std::error_code put(std::span<const chunk_key> k, std::span<const std::span<const std::byte>> src,
                      std::span<chunk_status> st, deadline dl) {
    return inner.put(k, src, st, dl);
  }
  std::error_code put_prehashed(std::span<const chunk_key> k, std::span<const std::span<const std::byte>> src,
                                std::span<const value_digest> digests, std::span<chunk_status> st,
                                deadline dl) requires prehashed_put_store<Inner> {
    return inner.put_prehashed(k, src, digests, st, dl);
  }
  value_format format() const requires prehashed_put_store<Inner> { return inner.format(); }
  std::error_code put_pieces(std::span<const chunk_key> k, std::span<const value_pieces> values,
                             std::span<const value_digest> digests, std::span<chunk_status> st, deadline dl) {
    {
      std::lock_guard lock(mu);
      for (std::size_t i = 0; i < k.size() && i < values.size(); ++i)
        log.push_back({k[i], {values[i].begin(), values[i].end()}, i < digests.size()});
    }
    return inner.put_pieces(k, values, digests, st, dl);
  }
};

template <class Inner>
void require_save_from_pages_loads_back(Inner& inner, bool expect_digests) {
  constexpr std::size_t T = rig_chunk_tokens, chunks = 4;
  comm::inproc_world world(1);  // one rank, on this thread: it owns every chunk
  comm::inproc_communicator c = world.communicator_for(0);
  piece_log_store<Inner> store{inner};
  static_assert(piecewise_put_store<piece_log_store<Inner>>);
  static_assert(prehashed_put_store<piece_log_store<Inner>> == prehashed_put_store<Inner>);
  const std::vector<token_id> prompt = rig_prompt(chunks * T + 5, 11);
  host_kv_cache cache(rig_layout());
  const kv_layout& lay = cache.layout();
  connector conn(chunker<>(rig_ns("mod:1")), modulo_ownership(1), store, c, cache.view(), rig_options());
  host_kv_cache::sequence seq, apart;
  REQUIRE(cache.reserve(seq, prompt.size()));
  REQUIRE(cache.reserve(apart, T));
  compute_into(cache, seq, 0, prompt.size());
  std::vector<std::int64_t> slots = slots_of(cache, seq, prompt.size());
  const std::vector<std::int64_t> apart_slots = slots_of(cache, apart, T);
  const std::size_t layer_row = lay.layer_bytes_per_token();
  std::vector<std::byte> row(lay.bytes_per_token());
  for (std::size_t i = 0; i < T; ++i) {  // chunk 2's token i into the apart blocks, reversed
    const std::uint64_t pos = 2 * T + i;
    slots[pos] = apart_slots[T - 1 - i];
    for (std::uint32_t l = 0; l < lay.num_layers; ++l)
      for (std::size_t b = 0; b < layer_row; ++b) row[l * layer_row + b] = model_byte(pos, l, b);
    REQUIRE_FALSE(kv_scatter(cache.view(), std::span(slots).subspan(pos, 1), row));
  }
  REQUIRE_FALSE(conn.save(1, prompt, slots, 0, prompt.size()));
  REQUIRE_FALSE(conn.wait_for_save(1, deadline_after(std::chrono::seconds(30))));
  CHECK(conn.errors(1).empty());
  conn.finish(1);
  CHECK(conn.counters().chunks_saved.value() == chunks);

  // What the store was given: chunks 0, 1, 3 as one piece per layer inside the pages, at the
  // chunk's first slot in that layer; chunk 2 as one piece outside them.
  const std::vector<chunk_key> keys = chunker<>(rig_ns("mod:1")).keys(prompt);
  const std::byte* const pages = cache.view().plane(0, 0);
  const auto in_pages = [&](std::span<const std::byte> p) {
    return p.data() >= pages && p.data() + p.size() <= pages + lay.cache_extent();
  };
  {
    std::lock_guard lock(store.mu);
    REQUIRE(store.log.size() == chunks);
    for (std::size_t k = 0; k < chunks; ++k) {
      INFO("chunk " << k);
      const auto& e = store.log[k];
      CHECK(e.key == keys[k]);
      CHECK(e.digest == expect_digests);
      if (k == 2) {
        REQUIRE(e.pieces.size() == 1);
        CHECK(e.pieces[0].size() == T * lay.bytes_per_token());
        CHECK_FALSE(in_pages(e.pieces[0]));
        continue;
      }
      REQUIRE(e.pieces.size() == lay.num_layers);
      const auto first = static_cast<std::uint64_t>(slots[k * T]);
      for (std::uint32_t l = 0; l < lay.num_layers; ++l) {
        CHECK(in_pages(e.pieces[l]));
        CHECK(e.pieces[l].data() == cache.view().plane(l, 0) + first / lay.block_size * lay.block_stride +
                                        first % lay.block_size * lay.token_stride);
        CHECK(e.pieces[l].size() == T * layer_row);
      }
    }
  }

  // Loaded into fresh pages (seq and apart kept: the load cannot find the bytes already there).
  const auto plan = lookup_agreed(conn, 2, prompt);
  REQUIRE(plan);
  CHECK(plan->cached_tokens == chunks * T);
  host_kv_cache::sequence fresh;
  REQUIRE(cache.reserve(fresh, prompt.size()));
  const std::vector<std::int64_t> fresh_slots = slots_of(cache, fresh, prompt.size());
  const std::vector<std::byte> junk(lay.bytes_per_token() * prompt.size(), std::byte{0xa5});
  REQUIRE_FALSE(kv_scatter(cache.view(), fresh_slots, junk));
  REQUIRE(wrong_bytes(cache, fresh, 0, chunks * T) > 0);
  REQUIRE_FALSE(conn.load(2, fresh_slots));
  REQUIRE(step_until(conn, [&] { return conn.load_result(2).has_value(); }));
  const auto outcome = conn.load_result(2);
  REQUIRE(outcome);
  CHECK(outcome->complete());
  CHECK(outcome->loaded_end_token == chunks * T);
  CHECK(conn.load_errors(2).empty());
  CHECK(wrong_bytes(cache, fresh, 0, chunks * T) == 0);
  conn.finish(2);
  cache.release(fresh);
  cache.release(apart);
  cache.release(seq);
}

}  // namespace kvtier::test
