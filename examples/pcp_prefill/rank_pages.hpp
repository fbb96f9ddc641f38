// examples/pcp_prefill/rank_pages.hpp: a request's KV in this rank's paged host cache
// (env.cache, the request's sequence in env.loc): reserving its blocks, and one chunk's value
// scattered into its pages or gathered back from them. Real CPU work, not modeled time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>

#include "timing_model.hpp"

namespace pcp {

/// Blocks for request i's first `tokens` positions in the paged cache. Every rank reserves
/// the same tokens for the same requests in the same order, so all ranks agree on failure.
template <class Env>
void reserve_pages(Env& env, const timing_model& tm, std::size_t i, std::uint64_t tokens) {
  if (!env.cache->reserve(env.loc[i].seq, tokens))
    throw std::runtime_error("paged KV cache full (" + std::to_string(env.cache->layout().num_blocks) +
                             " blocks of " + std::to_string(tm.kv_block_tokens) +
                             " tokens): raise --kv-cache-tokens");
}
/// Chunk value `v` (chunk c of request i) into the request's pages, or the pages back into `v`.
template <class Env>
void to_pages(Env& env, const timing_model& tm, std::size_t i, std::size_t c, std::span<const std::byte> v) {
  if (auto ec = env.cache->scatter(env.loc[i].seq, c * tm.chunk_tokens, tm.chunk_tokens, v))
    throw std::runtime_error("paged KV scatter: " + ec.message());
}
template <class Env>
void from_pages(Env& env, const timing_model& tm, std::size_t i, std::size_t c, std::span<std::byte> v) {
  if (auto ec = env.cache->gather(env.loc[i].seq, c * tm.chunk_tokens, tm.chunk_tokens, v))
    throw std::runtime_error("paged KV gather: " + ec.message());
}

}  // namespace pcp
