// kvtier/host_kv_cache.hpp: a paged KV cache in host memory, in a real engine layout, with a
// block allocator and per-sequence block tables; what a CPU engine (and kvtier's examples) keeps
// its KV in, so every load goes paged → chunk value → store → chunk value → paged.
//
// The memory is one zeroed allocation of layout.cache_extent() bytes (one base, layer l at
// l * layer_stride: back to back for the per-layer layouts, interleaved inside each block for
// cross_layer), or one per layer when the layout has no layer_stride. Blocks are handed out from
// a free list (lowest first); a sequence's block table maps its positions to blocks, and chunk
// copies go through kv_gather / kv_scatter with that table. The allocation is calloc'd, not
// value-initialised: a large calloc maps fresh zero pages, so a cache sized for the worst case
// costs resident memory only for the blocks that are written (a vector<byte>(n) would touch
// every page up front).
//
// Thread safety: reserve/release are for one thread (the engine's scheduler); gathers and
// scatters of disjoint blocks may run on several threads at once.
//
// clang-format off
//   kvtier::host_kv_cache cache(kvtier::kv_layout::vllm_mla(/*layers=*/2, /*blocks=*/256, /*block_size=*/64));
//   kvtier::host_kv_cache::sequence seq;
//   if (!cache.reserve(seq, prompt_tokens)) { /* out of blocks */ }
//   std::vector<std::byte> value(cache.layout().bytes_per_token() * 256);
//   cache.gather(seq, c * 256, 256, value);    // chunk c → its value (layer-major)
//   cache.scatter(seq, c * 256, 256, value);   // and back
// clang-format on
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <new>
#include <span>
#include <stdexcept>
#include <system_error>
#include <vector>

#include "kvtier/errc.hpp"
#include "kvtier/kv_copy.hpp"
#include "kvtier/kv_layout.hpp"

namespace kvtier {

class host_kv_cache {
 public:
  /// A sequence's block table: blocks[i] holds positions [i * block_size, (i + 1) * block_size).
  struct sequence {
    std::vector<std::int32_t> blocks;
  };

  /// Allocates the cache for `layout` (zeroed). Throws std::invalid_argument with the
  /// layout's validation message (naming the field), or when num_blocks exceeds int32 ids.
  explicit host_kv_cache(kv_layout layout) {
    if (auto e = layout.validate()) throw std::invalid_argument(e.message);
    if (layout.num_blocks > static_cast<std::uint64_t>(INT32_MAX))
      throw std::invalid_argument("host_kv_cache: num_blocks above the int32 block ids of a block table");
    if (layout.layer_stride != 0) {
      view_ = kv_cache_view::one_base(layout, allocate(layout.cache_extent()));
    } else {
      std::vector<std::byte*> bases;
      for (std::uint32_t l = 0; l < layout.num_layers; ++l) bases.push_back(allocate(layout.layer_extent()));
      view_ = kv_cache_view::per_layer(layout, bases);
    }
    free_.reserve(layout.num_blocks);
    for (std::uint64_t b = layout.num_blocks; b > 0; --b) free_.push_back(static_cast<std::int32_t>(b - 1));
  }

  host_kv_cache(const host_kv_cache&) = delete;
  host_kv_cache& operator=(const host_kv_cache&) = delete;

  const kv_layout& layout() const noexcept { return view_.layout; }
  const kv_cache_view& view() const noexcept { return view_; }
  std::size_t free_blocks() const noexcept { return free_.size(); }
  /// Bytes of a chunk value of `tokens` tokens (all layers).
  std::size_t value_bytes(std::size_t tokens) const noexcept { return layout().bytes_per_token() * tokens; }

  /// Grows seq's table to cover positions [0, tokens); false, taking nothing, when too few
  /// blocks are free.
  bool reserve(sequence& seq, std::uint64_t tokens) {
    const std::uint64_t need = (tokens + layout().block_size - 1) / layout().block_size;
    if (need <= seq.blocks.size()) return true;
    if (need - seq.blocks.size() > free_.size()) return false;
    while (seq.blocks.size() < need) {
      seq.blocks.push_back(free_.back());
      free_.pop_back();
    }
    return true;
  }

  /// Gives seq's blocks back; its table becomes empty.
  void release(sequence& seq) {
    for (auto it = seq.blocks.rbegin(); it != seq.blocks.rend(); ++it) free_.push_back(*it);
    seq.blocks.clear();
  }

  /// Positions [first_token, first_token + tokens) of seq, layers r, into `value` (layer-major).
  std::error_code gather(const sequence& seq, std::uint64_t first_token, std::size_t tokens,
                         std::span<std::byte> value, layer_range r = {},
                         kv_layout_error* why = nullptr) const {
    return kv_gather(view_, block_table_ref{seq.blocks, first_token, tokens}, value, r, why);
  }

  /// `value` (layers r) into positions [first_token, first_token + tokens) of seq.
  std::error_code scatter(const sequence& seq, std::uint64_t first_token, std::size_t tokens,
                          std::span<const std::byte> value, layer_range r = {},
                          kv_layout_error* why = nullptr) const {
    return kv_scatter(view_, block_table_ref{seq.blocks, first_token, tokens}, value, r, why);
  }

 private:
  struct free_deleter {
    void operator()(std::byte* p) const noexcept { std::free(p); }
  };
  // Zeroed and lazily committed (see the top of the file); throws std::bad_alloc.
  std::byte* allocate(std::size_t bytes) {
    std::unique_ptr<std::byte, free_deleter> p(
        static_cast<std::byte*>(std::calloc(bytes == 0 ? 1 : bytes, 1)));
    if (!p) throw std::bad_alloc();
    memory_.push_back(std::move(p));  // on a throw here p is still owned and freed
    return memory_.back().get();
  }

  std::vector<std::unique_ptr<std::byte, free_deleter>> memory_;
  kv_cache_view view_;
  std::vector<std::int32_t> free_;  // lowest id at the back: handed out first
};

}  // namespace kvtier
