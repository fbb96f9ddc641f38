// kvtier/kv_copy.hpp: gather a chunk's KV out of an engine's paged cache into the chunk's value
// bytes, and scatter it back (CPU implementation; kvtier/cuda/kv_copy.cuh is the GPU one).
//
// The chunk value format is layer-major, so any layer range is one contiguous byte range:
//
//   value = layer 0 | layer 1 | ... | layer L-1          each n * layer_bytes_per_token() bytes
//   layer = plane 0 (K or latent) | plane 1 (V)          each n * heads * head_bytes bytes
//   plane = token 0 | token 1 | ... | token n-1          each heads * head_bytes bytes, head 0 first
//
// where n is the chunk's token count. Token i of the chunk lives in the cache at slot slots[i]
// (= block * block_size + offset); a negative slot means "skip": gather leaves that token's rows
// of the chunk bytes untouched, scatter leaves the cache untouched there. A block table is the
// other way to name slots: token i sits at position first_token + i of the sequence, in block
// table[(first_token + i) / block_size] (a negative block id skips the token).
//
// Everything is checked before a byte moves (layout, pointer count, layer range, chunk length,
// every slot below num_blocks * block_size, and for a scatter no slot named twice), so a bad
// argument never leaves a half-copied cache:
// the call returns errc::invalid_argument and, when asked, a kv_layout_error naming the field.
//
//   auto cache = kvtier::kv_cache_view::per_layer(kvtier::kv_layout::vllm_mla(4, 1024, 64), layer_ptrs);
//   std::vector<std::byte> value(cache.layout.bytes_per_token() * slots.size());
//   kvtier::kv_gather(cache, slots, value);                              // paged → chunk (all layers)
//   kvtier::kv_scatter(cache, slots, kvtier::chunk_layers(cache.layout, slots.size(), value, {0, 2}),
//                      {.first = 0, .last = 2});                         // chunk → paged, layers 0 and 1
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "kvtier/errc.hpp"
#include "kvtier/kv_layout.hpp"

namespace kvtier {

/// Layers [first, last) of a cache; the default is every layer.
struct layer_range {
  std::uint32_t first = 0;
  std::uint32_t last = UINT32_MAX;  ///< UINT32_MAX = up to the layout's num_layers
  std::uint32_t end(const kv_layout& l) const noexcept { return last == UINT32_MAX ? l.num_layers : last; }
};

/// A block table: token i of the chunk is at sequence position first_token + i.
struct block_table_ref {
  std::span<const std::int32_t> blocks;  ///< block id of each block_size positions; negative = skip
  std::uint64_t first_token = 0;
  std::size_t num_tokens = 0;
};

/// Byte offset of layer l in the value of a chunk of `tokens` tokens.
inline std::uint64_t chunk_layer_offset(const kv_layout& lay, std::size_t tokens, std::uint32_t l) noexcept {
  return std::uint64_t{l} * tokens * lay.layer_bytes_per_token();
}

/// Bytes of `layers_per_group` layers of a chunk of `tokens` tokens: the group size that makes
/// each checksum group of value format 2 (value_format::v2) exactly that many whole layers.
inline std::uint64_t layer_group_bytes(const kv_layout& lay, std::size_t tokens,
                                       std::uint32_t layers_per_group) noexcept {
  return std::uint64_t{layers_per_group} * tokens * lay.layer_bytes_per_token();
}

/// The bytes of layers `r` inside a whole chunk value (one contiguous sub-span). A range that
/// is not ordered (first > last), ends past num_layers, or a value too short for those layers
/// gives an empty span and, when asked, `why` (field "layers" or "chunk"): a copy of that range
/// then refuses the empty span, so no byte moves.
template <class Byte>
std::span<Byte> chunk_layers(const kv_layout& lay, std::size_t tokens, std::span<Byte> value, layer_range r,
                             kv_layout_error* why = nullptr) {
  const std::uint32_t last = r.end(lay);
  if (r.first > last || last > lay.num_layers) {
    if (why)
      *why = {"layers", "layer range [" + std::to_string(r.first) + ", " + std::to_string(last) +
                            ") is not inside [0, " + std::to_string(lay.num_layers) + ") of '" + lay.name +
                            "'"};
    return {};
  }
  const std::uint64_t a = chunk_layer_offset(lay, tokens, r.first), b = chunk_layer_offset(lay, tokens, last);
  if (b > value.size()) {
    if (why)
      *why = {"chunk", "chunk value holds " + std::to_string(value.size()) + " bytes; layers [" +
                           std::to_string(r.first) + ", " + std::to_string(last) + ") of " +
                           std::to_string(tokens) + " tokens of '" + lay.name + "' end at byte " +
                           std::to_string(b)};
    return {};
  }
  return value.subspan(a, b - a);
}

/// Slot of each token of a block table (negative where the block id is negative).
inline std::vector<std::int64_t> slots_from_block_table(block_table_ref t, std::uint32_t block_size) {
  std::vector<std::int64_t> slots(t.num_tokens, -1);
  for (std::size_t i = 0; i < t.num_tokens && block_size != 0; ++i) {
    const std::uint64_t pos = t.first_token + i, blk = pos / block_size;
    if (blk < t.blocks.size() && t.blocks[blk] >= 0)
      slots[i] = std::int64_t{t.blocks[blk]} * block_size + static_cast<std::int64_t>(pos % block_size);
  }
  return slots;
}

namespace detail {

// Consecutive chunk tokens whose slots are consecutive inside one block: one memcpy per run and
// plane when a token's heads are contiguous and tokens follow each other in the block.
struct kv_run {
  std::uint64_t token;  // first chunk token
  std::uint64_t slot;   // its slot
  std::uint64_t count;  // tokens in the run
};

inline std::vector<kv_run> kv_runs(const kv_layout& lay, std::span<const std::int64_t> slots) {
  const bool mergeable =
      lay.heads_contiguous() && lay.token_stride == std::uint64_t{lay.heads} * lay.head_bytes;
  std::vector<kv_run> runs;
  for (std::size_t i = 0; i < slots.size(); ++i) {
    if (slots[i] < 0) continue;
    const auto s = static_cast<std::uint64_t>(slots[i]);
    if (mergeable && !runs.empty()) {
      kv_run& r = runs.back();
      if (r.token + r.count == i && r.slot + r.count == s && s % lay.block_size != 0) {
        ++r.count;
        continue;
      }
    }
    runs.push_back({i, s, 1});
  }
  return runs;
}

// The first two chunk tokens a scatter would write to one slot (sorted copy; slots are few).
inline kv_layout_error duplicate_slots(std::span<const std::int64_t> slots, const std::string& layout_name) {
  std::vector<std::pair<std::int64_t, std::size_t>> seen;
  seen.reserve(slots.size());
  for (std::size_t i = 0; i < slots.size(); ++i)
    if (slots[i] >= 0) seen.emplace_back(slots[i], i);
  std::sort(seen.begin(), seen.end());
  for (std::size_t k = 1; k < seen.size(); ++k)
    if (seen[k].first == seen[k - 1].first)
      return {"slots", "slots[" + std::to_string(seen[k - 1].second) + "] and slots[" +
                           std::to_string(seen[k].second) + "] are both " + std::to_string(seen[k].first) +
                           ": a scatter would write two tokens into one slot of '" + layout_name + "'"};
  return {};
}

// Checks everything a copy needs; on a problem fills *why (if given) and returns invalid_argument.
// A scatter (`writes_cache`) also refuses two tokens with one slot: which one the slot keeps
// would depend on the order of the writes (on the GPU, threads race on the same bytes).
inline std::error_code kv_copy_check(const kv_cache_view& cache, std::span<const std::int64_t> slots,
                                     std::size_t chunk_bytes, layer_range r, kv_layout_error* why,
                                     bool writes_cache) {
  auto fail = [why](kv_layout_error e) {
    if (why) *why = std::move(e);
    return make_error_code(errc::invalid_argument);
  };
  if (auto e = cache.validate()) return fail(std::move(e));
  const kv_layout& lay = cache.layout;
  const std::uint32_t last = r.end(lay);
  if (r.first > last || last > lay.num_layers)
    return fail({"layers", "layer range [" + std::to_string(r.first) + ", " + std::to_string(last) +
                               ") is not inside [0, " + std::to_string(lay.num_layers) + ") of '" + lay.name +
                               "'"});
  const std::uint64_t want = std::uint64_t{last - r.first} * slots.size() * lay.layer_bytes_per_token();
  if (chunk_bytes != want)
    return fail({"chunk", "chunk span holds " + std::to_string(chunk_bytes) + " bytes; " +
                              std::to_string(slots.size()) + " tokens of " + std::to_string(last - r.first) +
                              " layers of '" + lay.name + "' are " + std::to_string(want)});
  const std::uint64_t n = lay.num_slots();
  for (std::size_t i = 0; i < slots.size(); ++i)
    if (slots[i] >= 0 && static_cast<std::uint64_t>(slots[i]) >= n)
      return fail({"slots", "slots[" + std::to_string(i) + "] = " + std::to_string(slots[i]) +
                                " is not below num_blocks * block_size = " + std::to_string(n) + " of '" +
                                lay.name + "'"});
  if (writes_cache)
    if (auto e = duplicate_slots(slots, lay.name)) return fail(std::move(e));
  return {};
}

// A block table must name a block (or a negative id) for every position of the chunk.
inline std::error_code block_table_check(const kv_layout& lay, const block_table_ref& t,
                                         kv_layout_error* why) {
  if (lay.block_size == 0) return {};  // kv_copy_check reports the layout
  const std::uint64_t need = t.num_tokens == 0 ? 0 : (t.first_token + t.num_tokens - 1) / lay.block_size + 1;
  if (need <= t.blocks.size()) return {};
  if (why)
    *why = {"block_table", "block table has " + std::to_string(t.blocks.size()) + " entries; tokens [" +
                               std::to_string(t.first_token) + ", " +
                               std::to_string(t.first_token + t.num_tokens) + ") need " +
                               std::to_string(need) + " blocks of " + std::to_string(lay.block_size)};
  return make_error_code(errc::invalid_argument);
}

// Nothing to do after a plane was copied.
struct kv_no_sink {
  void operator()(std::span<const std::byte>) const noexcept {}
};

// The one copy loop of gather (ToChunk) and scatter. `on_plane` sees each plane's chunk bytes
// once they are written (in chunk order, still in cache: a gather hashes them there).
template <bool ToChunk, class OnPlane = kv_no_sink>
void kv_copy_runs(const kv_cache_view& cache, std::span<const kv_run> runs, std::size_t tokens,
                  std::byte* chunk, layer_range r, OnPlane&& on_plane = {}) noexcept {
  const kv_layout& lay = cache.layout;
  const std::uint64_t row = std::uint64_t{lay.heads} * lay.head_bytes;  // one token, one plane
  const std::uint64_t plane_bytes = row * tokens;
  const bool heads_together = lay.heads_contiguous();
  auto move = [](std::byte* c, std::byte* p, std::size_t n) {
    if constexpr (ToChunk)
      std::memcpy(c, p, n);
    else
      std::memcpy(p, c, n);
  };
  std::byte* out = chunk;
  for (std::uint32_t l = r.first; l < r.end(lay); ++l) {
    for (std::uint32_t p = 0; p < lay.planes; ++p, out += plane_bytes) {
      std::byte* const base = cache.plane(l, p);
      for (const kv_run& run : runs) {
        std::byte* src = base + (run.slot / lay.block_size) * lay.block_stride +
                         (run.slot % lay.block_size) * lay.token_stride;
        std::byte* dst = out + run.token * row;
        if (heads_together) {  // a run of merged tokens is contiguous on both sides
          move(dst, src, run.count * row);
          continue;
        }
        for (std::uint64_t h = 0; h < lay.heads; ++h)
          move(dst + h * lay.head_bytes, src + h * lay.head_stride, lay.head_bytes);
      }
      on_plane(std::span<const std::byte>(out, plane_bytes));
    }
  }
}

}  // namespace detail

/// kv_gather calling `on_copied(bytes)` with each stretch of `chunk` as soon as it is written,
/// in order, every byte of `chunk` once (one plane of one layer at a time, still in cache): e.g.
/// a value_hasher's update, so the chunk is hashed in the same pass that copies it.
template <class OnCopied>
std::error_code kv_gather(const kv_cache_view& cache, std::span<const std::int64_t> slots,
                          std::span<std::byte> chunk, layer_range r, kv_layout_error* why,
                          OnCopied&& on_copied) {
  if (auto ec = detail::kv_copy_check(cache, slots, chunk.size(), r, why, /*writes_cache=*/false)) return ec;
  const auto runs = detail::kv_runs(cache.layout, slots);
  detail::kv_copy_runs<true>(cache, runs, slots.size(), chunk.data(), r, on_copied);
  return {};
}

/// Copies tokens slots[i] of layers r out of the paged cache into `chunk` (layer-major, see the
/// file comment); `chunk` holds exactly those layers. Skipped tokens' rows stay untouched.
inline std::error_code kv_gather(const kv_cache_view& cache, std::span<const std::int64_t> slots,
                                 std::span<std::byte> chunk, layer_range r = {},
                                 kv_layout_error* why = nullptr) {
  return kv_gather(cache, slots, chunk, r, why, detail::kv_no_sink{});
}

/// Copies `chunk` (layers r, layer-major) into the paged cache at slots[i]; a negative slot's
/// cache bytes stay untouched. Two tokens with the same slot are refused (field "slots"), as on
/// the GPU; a gather may read one slot for several tokens.
inline std::error_code kv_scatter(const kv_cache_view& cache, std::span<const std::int64_t> slots,
                                  std::span<const std::byte> chunk, layer_range r = {},
                                  kv_layout_error* why = nullptr) {
  if (auto ec = detail::kv_copy_check(cache, slots, chunk.size(), r, why, /*writes_cache=*/true)) return ec;
  const auto runs = detail::kv_runs(cache.layout, slots);
  // The loop reads from `chunk` only in the scatter direction.
  detail::kv_copy_runs<false>(cache, runs, slots.size(), const_cast<std::byte*>(chunk.data()), r);
  return {};
}

/// Where a chunk's value lies in the pages, without copying it: appends to `out` the pieces of
/// the cache whose concatenation, in order, is what kv_gather(cache, slots, chunk, r) writes
/// into `chunk` (one piece per run of tokens consecutive in a block and plane; neighbours that
/// touch in memory are merged). A sender writes them from the pages (writev) instead of copying
/// the value first: remote_store::put_pieces. The same checks as kv_gather, and two more: every
/// token must be there (a negative slot: field "slots") and a token's heads must be contiguous
/// (else a piece per head: field "layout"); errc::invalid_argument then, `out` as it was.
///
///   std::vector<std::span<const std::byte>> pieces;
///   if (!kvtier::kv_pieces(cache, slots, {}, pieces)) {       // one chunk: slots.size() tokens
///     const kvtier::value_pieces value[] = {pieces};
///     l2.put_pieces(keys, value, {}, st, dl);                     // keys, st: one entry
///   }
inline std::error_code kv_pieces(const kv_cache_view& cache, std::span<const std::int64_t> slots,
                                 layer_range r, std::vector<std::span<const std::byte>>& out,
                                 kv_layout_error* why = nullptr) {
  const kv_layout& lay = cache.layout;
  const std::uint32_t last = r.last == UINT32_MAX ? lay.num_layers : r.last;
  const std::uint64_t bytes =
      last >= r.first ? std::uint64_t{last - r.first} * slots.size() * lay.layer_bytes_per_token() : 0;
  if (auto ec = detail::kv_copy_check(cache, slots, bytes, r, why, /*writes_cache=*/false)) return ec;
  auto refuse = [why](const char* field, std::string text) {
    if (why) *why = {field, std::move(text)};
    return make_error_code(errc::invalid_argument);
  };
  if (!lay.heads_contiguous())
    return refuse("layout",
                  "the heads of a token are not contiguous in '" + lay.name + "': a piece per head");
  for (std::size_t i = 0; i < slots.size(); ++i)
    if (slots[i] < 0)
      return refuse(
          "slots", "slots[" + std::to_string(i) + "] is negative: a skipped token has no bytes in the pages");
  const auto runs = detail::kv_runs(lay, slots);
  const std::uint64_t row = std::uint64_t{lay.heads} * lay.head_bytes;
  const bool rows_together = lay.token_stride == row;
  const std::size_t first_piece = out.size();  // never merged into a piece of an earlier call
  for (std::uint32_t l = r.first; l < last; ++l)
    for (std::uint32_t p = 0; p < lay.planes; ++p) {
      const std::byte* const base = cache.plane(l, p);
      for (const detail::kv_run& run : runs) {
        const std::byte* src = base + (run.slot / lay.block_size) * lay.block_stride +
                               (run.slot % lay.block_size) * lay.token_stride;
        // A merged run's rows follow each other (kv_runs merges only then); else one row a token.
        const std::uint64_t per = rows_together ? run.count : 1;
        for (std::uint64_t t = 0; t < run.count; t += per) {
          const std::span<const std::byte> piece(src + t * lay.token_stride, per * row);
          if (out.size() > first_piece && out.back().data() + out.back().size() == piece.data())
            out.back() = std::span<const std::byte>(out.back().data(), out.back().size() + piece.size());
          else
            out.push_back(piece);
        }
      }
    }
  return {};
}

/// kv_gather with a block table instead of a slot mapping.
inline std::error_code kv_gather(const kv_cache_view& cache, block_table_ref table,
                                 std::span<std::byte> chunk, layer_range r = {},
                                 kv_layout_error* why = nullptr) {
  if (auto ec = detail::block_table_check(cache.layout, table, why)) return ec;
  const auto slots = slots_from_block_table(table, cache.layout.block_size);
  return kv_gather(cache, slots, chunk, r, why);
}

/// kv_scatter with a block table instead of a slot mapping.
inline std::error_code kv_scatter(const kv_cache_view& cache, block_table_ref table,
                                  std::span<const std::byte> chunk, layer_range r = {},
                                  kv_layout_error* why = nullptr) {
  if (auto ec = detail::block_table_check(cache.layout, table, why)) return ec;
  const auto slots = slots_from_block_table(table, cache.layout.block_size);
  return kv_scatter(cache, slots, chunk, r, why);
}

}  // namespace kvtier
