// tests/support/kv_fixture.hpp: paged caches that own their memory, filled with seeded bytes,
// and a reference gather/scatter that addresses every entry from the layout's formula one head
// at a time (no run merging), for the kv_copy tests and the GPU check's CPU side.
//
//   auto c = kvtier::test::make_cache(kvtier::kv_layout::vllm_mla(2, 8, 16), view_kind::per_layer, 7);
//   auto want = kvtier::test::ref_gather(c.view, slots, {}, std::vector<std::byte>(n_bytes));
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "kvtier/kv_copy.hpp"
#include "kvtier/kv_layout.hpp"

namespace kvtier::test {

inline std::uint64_t splitmix64(std::uint64_t& s) {
  std::uint64_t x = (s += 0x9E3779B97F4A7C15ull);
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

inline void fill_bytes(std::span<std::byte> b, std::uint64_t seed) {
  for (std::size_t i = 0; i < b.size(); i += 8) {
    const std::uint64_t v = splitmix64(seed);
    std::memcpy(b.data() + i, &v, std::min<std::size_t>(8, b.size() - i));
  }
}

enum class view_kind : int { one_base, per_layer, per_plane };

/// A cache with its own buffers, sized from the layout's extents for the chosen view kind.
struct owned_cache {
  std::vector<std::vector<std::byte>> buffers;
  kv_cache_view view;

  /// Every byte of every buffer, concatenated (for whole-cache comparisons).
  std::vector<std::byte> snapshot() const {
    std::vector<std::byte> all;
    for (const auto& b : buffers) all.insert(all.end(), b.begin(), b.end());
    return all;
  }
};

inline owned_cache make_cache(const kv_layout& lay, view_kind kind, std::uint64_t seed) {
  owned_cache c;
  std::vector<std::byte*> ptrs;
  auto add = [&](std::uint64_t bytes) {
    c.buffers.emplace_back(bytes);
    fill_bytes(c.buffers.back(), seed + c.buffers.size());
    ptrs.push_back(c.buffers.back().data());
  };
  switch (kind) {
    case view_kind::one_base:
      add(lay.cache_extent());
      c.view = kv_cache_view::one_base(lay, ptrs[0]);
      break;
    case view_kind::per_layer:
      c.buffers.reserve(lay.num_layers);  // pointers stay valid
      for (std::uint32_t l = 0; l < lay.num_layers; ++l) add(lay.layer_extent());
      c.view = kv_cache_view::per_layer(lay, ptrs);
      break;
    case view_kind::per_plane:
      c.buffers.reserve(std::size_t{lay.num_layers} * lay.planes);
      for (std::uint32_t i = 0; i < lay.num_layers * lay.planes; ++i) add(lay.plane_extent());
      c.view = kv_cache_view::per_plane(lay, ptrs);
      break;
  }
  return c;
}

/// Address of head h of the token at `slot` in layer l, plane p, straight from the layout formula.
inline std::byte* ref_entry(const kv_cache_view& v, std::uint32_t l, std::uint32_t p, std::uint64_t slot,
                            std::uint32_t h) {
  const kv_layout& lay = v.layout;
  return v.plane(l, p) + (slot / lay.block_size) * lay.block_stride +
         (slot % lay.block_size) * lay.token_stride + std::uint64_t{h} * lay.head_stride;
}

/// Byte offset in a value of layers r of head h of chunk token i in layer l, plane p (the format
/// written out in kv_copy.hpp's comment, computed independently).
inline std::uint64_t ref_chunk_offset(const kv_layout& lay, std::size_t tokens, layer_range r,
                                      std::uint32_t l, std::uint32_t p, std::size_t i, std::uint32_t h) {
  return ((((std::uint64_t{l} - r.first) * lay.planes + p) * tokens + i) * lay.heads + h) * lay.head_bytes;
}

/// Reference gather of layers r into `chunk` (returned; rows of skipped tokens keep their bytes).
inline std::vector<std::byte> ref_gather(const kv_cache_view& v, std::span<const std::int64_t> slots,
                                         layer_range r, std::vector<std::byte> chunk) {
  const kv_layout& lay = v.layout;
  for (std::uint32_t l = r.first; l < r.end(lay); ++l)
    for (std::uint32_t p = 0; p < lay.planes; ++p)
      for (std::size_t i = 0; i < slots.size(); ++i)
        if (slots[i] >= 0)
          for (std::uint32_t h = 0; h < lay.heads; ++h)
            std::memcpy(chunk.data() + ref_chunk_offset(lay, slots.size(), r, l, p, i, h),
                        ref_entry(v, l, p, static_cast<std::uint64_t>(slots[i]), h), lay.head_bytes);
  return chunk;
}

/// Reference scatter of layers r from `chunk` into the cache.
inline void ref_scatter(const kv_cache_view& v, std::span<const std::int64_t> slots, layer_range r,
                        std::span<const std::byte> chunk) {
  const kv_layout& lay = v.layout;
  for (std::uint32_t l = r.first; l < r.end(lay); ++l)
    for (std::uint32_t p = 0; p < lay.planes; ++p)
      for (std::size_t i = 0; i < slots.size(); ++i)
        if (slots[i] >= 0)
          for (std::uint32_t h = 0; h < lay.heads; ++h)
            std::memcpy(ref_entry(v, l, p, static_cast<std::uint64_t>(slots[i]), h),
                        chunk.data() + ref_chunk_offset(lay, slots.size(), r, l, p, i, h), lay.head_bytes);
}

/// Small random parameters for one of the named layouts (kind in [0, layout_kinds)).
struct layout_params {
  int kind = 0;
  std::uint32_t layers = 1, block_size = 1, heads = 1, head_size = 1, elem = 1;
  std::uint64_t blocks = 1;
};
inline constexpr int layout_kinds = 9;

inline kv_layout make_layout(const layout_params& p) {
  switch (p.kind) {
    case 0:
      return kv_layout::vllm_flash_attn(p.layers, p.blocks, p.block_size, p.heads, p.head_size, p.elem,
                                        kv_order::nhd);
    case 1:
      return kv_layout::vllm_flash_attn(p.layers, p.blocks, p.block_size, p.heads, p.head_size, p.elem,
                                        kv_order::hnd);
    case 2:
      return kv_layout::flashinfer(p.layers, p.blocks, p.block_size, p.heads, p.head_size, p.elem,
                                   kv_order::nhd);
    case 3:
      return kv_layout::flashinfer(p.layers, p.blocks, p.block_size, p.heads, p.head_size, p.elem,
                                   kv_order::hnd);
    case 4:
      return kv_layout::vllm_mla(p.layers, p.blocks, p.block_size, p.elem, p.head_size);
    case 5:
      return kv_layout::vllm_mla_fp8(p.layers, p.blocks, p.block_size);
    case 6:
      return kv_layout::sglang_mha(p.layers, p.blocks * p.block_size, p.block_size, p.heads, p.head_size,
                                   p.elem);
    case 7:
      return kv_layout::sglang_mla(p.layers, p.blocks * p.block_size, p.block_size, p.elem, p.head_size);
    default:
      return kv_layout::cross_layer(p.layers, p.blocks, p.block_size, 1 + p.heads % 2, p.heads, p.head_size,
                                    p.elem);
  }
}

/// n distinct slots of the layout, some replaced by -1 (about one in `skip_one_in`, 0 = none),
/// drawn from `seed`; mostly ascending runs so both merged and single-token copies occur.
inline std::vector<std::int64_t> random_slots(const kv_layout& lay, std::size_t n, std::uint64_t seed,
                                              unsigned skip_one_in) {
  // Shuffle whole blocks, keep slots ascending inside each block: runs that break at block ends.
  std::vector<std::uint64_t> order(lay.num_blocks);
  for (std::uint64_t b = 0; b < lay.num_blocks; ++b) order[b] = b;
  for (std::uint64_t b = lay.num_blocks; b > 1; --b) std::swap(order[b - 1], order[splitmix64(seed) % b]);
  std::vector<std::int64_t> slots;
  for (std::uint64_t b : order)
    for (std::uint32_t t = 0; t < lay.block_size && slots.size() < n; ++t)
      slots.push_back(static_cast<std::int64_t>(b * lay.block_size + t));
  if (splitmix64(seed) % 4 == 0)  // sometimes a fully scattered order
    for (std::size_t i = slots.size(); i > 1; --i) std::swap(slots[i - 1], slots[splitmix64(seed) % i]);
  if (skip_one_in != 0)
    for (auto& s : slots)
      if (splitmix64(seed) % skip_one_in == 0) s = -1;
  return slots;
}

}  // namespace kvtier::test
