// kvtier/kv_layout.hpp: how an engine's paged KV cache is laid out in memory.
//
// A kv_layout describes one engine's KV cache without owning or pointing at it: the number of
// layers, blocks and tokens per block, whether each layer holds K and V (2 planes) or one latent
// (1 plane, MLA), the KV heads and the bytes of one head of one token, and the byte strides of
// each of those dimensions. One entry of layer l, plane p, block b, token-in-block t, head h starts
//
//   plane_base(l, p) + b * block_stride + t * token_stride + h * head_stride
//
// and is head_bytes long. plane_base(l, p) comes from a kv_cache_view: one pointer per layer (a
// tensor per layer, as vLLM allocates), one per layer and plane (SGLang's separate K and V
// buffers), or one base for the whole cache (base + l * layer_stride + p * plane_stride; the
// cross-layer block layout). A slot is `block * block_size + token_in_block`.
//
// Named constructors give the layouts engines use today (all strides in bytes):
//
//   | constructor            | per-layer shape (outer → inner)                          |
//   | vllm_flash_attn(nhd)   | (2, num_blocks, block_size, heads, head_size)            |
//   | vllm_flash_attn(hnd)   | (2, num_blocks, heads, block_size, head_size) physically |
//   | flashinfer(nhd / hnd)  | (num_blocks, 2, block_size, heads, head_size) / (…, 2, heads, block_size, …) |
//   | vllm_mla               | (num_blocks, block_size, 576) of 2-byte elements         |
//   | vllm_mla_fp8           | (num_blocks, block_size, 656) bytes: 512 fp8 + 4 fp32 scales + 64 bf16 rope |
//   | sglang_mha             | K and V token pools, each (pool_tokens, heads, head_dim) |
//   | sglang_mla             | one token pool (pool_tokens, 1, 576)                     |
//   | cross_layer            | one tensor (num_blocks, layers, planes, block_size, heads, head_size) |
//
//   auto lay = kvtier::kv_layout::vllm_mla(/*layers=*/4, /*num_blocks=*/1024, /*block_size=*/64);
//   if (auto err = lay.validate()) throw std::invalid_argument(err.message);
//   std::size_t chunk_bytes = lay.bytes_per_token() * 256;   // 4 * 1152 * 256
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

namespace kvtier {

/// What is wrong with a kv_layout (or a view or slot mapping): the field and a sentence.
/// Converts to true when there is a problem.
struct kv_layout_error {
  std::string field;    ///< the offending field, e.g. "head_stride"; empty = no problem
  std::string message;  ///< a sentence naming the field, its value and the rule it breaks
  explicit operator bool() const noexcept { return !field.empty(); }
};

/// Token order inside a block: NHD (token, head, dim) or HND (head, token, dim).
enum class kv_order : std::uint8_t { nhd, hnd };

/// The shape and byte strides of a paged KV cache (see the file comment).
struct kv_layout {
  std::string name = "custom";     ///< for messages
  std::uint32_t num_layers = 0;    ///< layers the cache holds
  std::uint64_t num_blocks = 0;    ///< blocks (pages) per layer
  std::uint32_t block_size = 0;    ///< tokens per block
  std::uint32_t planes = 0;        ///< 2 = K and V, 1 = one latent (MLA)
  std::uint32_t heads = 0;         ///< KV heads (1 for MLA)
  std::uint32_t head_bytes = 0;    ///< bytes of one head of one token in one plane
  std::uint32_t elem_bytes = 0;    ///< element size; head_bytes is a multiple of it
  std::uint64_t layer_stride = 0;  ///< from layer l to l+1 when the view has one base (0: per-layer
                                   ///< pointers only; a one-base view of 2+ layers refuses it)
  std::uint64_t plane_stride = 0;  ///< from K to V inside a layer (planes == 2)
  std::uint64_t block_stride = 0;
  std::uint64_t token_stride = 0;
  std::uint64_t head_stride = 0;

  /// Bytes of one token in one layer (all planes and heads).
  std::uint64_t layer_bytes_per_token() const noexcept { return std::uint64_t{planes} * heads * head_bytes; }
  /// Bytes of one token over all layers: a chunk of n tokens holds n * bytes_per_token() bytes.
  std::uint64_t bytes_per_token() const noexcept { return layer_bytes_per_token() * num_layers; }
  /// Slots per layer (num_blocks * block_size).
  std::uint64_t num_slots() const noexcept { return num_blocks * block_size; }
  /// Bytes a single-plane-pointer region must span: the highest byte any entry touches, plus 1.
  std::uint64_t plane_extent() const noexcept {
    if (num_blocks == 0 || block_size == 0 || heads == 0) return 0;
    return (num_blocks - 1) * block_stride + (std::uint64_t{block_size} - 1) * token_stride +
           (std::uint64_t{heads} - 1) * head_stride + head_bytes;
  }
  /// Bytes a per-layer region must span (both planes).
  std::uint64_t layer_extent() const noexcept {
    return planes == 0 ? 0 : (std::uint64_t{planes} - 1) * plane_stride + plane_extent();
  }
  /// Bytes a single-base region must span (all layers).
  std::uint64_t cache_extent() const noexcept {
    return num_layers == 0 ? 0 : (std::uint64_t{num_layers} - 1) * layer_stride + layer_extent();
  }
  /// True when a token's heads are one contiguous run in a plane.
  bool heads_contiguous() const noexcept { return heads == 1 || head_stride == head_bytes; }

  /// The first problem found, naming its field; an empty error when the layout is usable.
  /// Checks: every count and size positive, planes 1 or 2, head_bytes a multiple of elem_bytes,
  /// no two entries overlapping (each stride at least the extent of the dimensions inside it),
  /// and the byte extents fit in 63 bits.
  kv_layout_error validate() const;

  // ---- named constructors (see the table in the file comment) --------------------------------

  /// vLLM FlashAttention backend: per layer (2, num_blocks, block_size, heads, head_size), NHD;
  /// HND keeps (heads, block_size) swapped in memory.
  static kv_layout vllm_flash_attn(std::uint32_t layers, std::uint64_t num_blocks, std::uint32_t block_size,
                                   std::uint32_t heads, std::uint32_t head_size, std::uint32_t elem_bytes = 2,
                                   kv_order order = kv_order::nhd) {
    kv_layout l = base("vllm_flash_attn", layers, num_blocks, block_size, 2, heads, head_size, elem_bytes);
    l.name += order == kv_order::nhd ? "_nhd" : "_hnd";
    const std::uint64_t hb = l.head_bytes, block = std::uint64_t{block_size} * heads * hb;
    l.block_stride = block;
    l.plane_stride = num_blocks * block;
    l.layer_stride = 2 * l.plane_stride;
    set_order(l, order);
    return l;
  }

  /// FlashInfer: per layer (num_blocks, 2, block_size, heads, head_size) for NHD, or
  /// (num_blocks, 2, heads, block_size, head_size) for HND.
  static kv_layout flashinfer(std::uint32_t layers, std::uint64_t num_blocks, std::uint32_t block_size,
                              std::uint32_t heads, std::uint32_t head_size, std::uint32_t elem_bytes = 2,
                              kv_order order = kv_order::nhd) {
    kv_layout l = base("flashinfer", layers, num_blocks, block_size, 2, heads, head_size, elem_bytes);
    l.name += order == kv_order::nhd ? "_nhd" : "_hnd";
    const std::uint64_t plane = std::uint64_t{block_size} * heads * l.head_bytes;
    l.plane_stride = plane;
    l.block_stride = 2 * plane;
    l.layer_stride = num_blocks * l.block_stride;
    set_order(l, order);
    return l;
  }

  /// vLLM MLA: per layer (num_blocks, block_size, latent) with latent = kv_lora_rank + rope dim
  /// (576 for DeepSeek V2/V3) elements of elem_bytes (2 for bf16/fp16).
  static kv_layout vllm_mla(std::uint32_t layers, std::uint64_t num_blocks, std::uint32_t block_size,
                            std::uint32_t elem_bytes = 2, std::uint32_t latent = 576) {
    kv_layout l = base("vllm_mla", layers, num_blocks, block_size, 1, 1, latent, elem_bytes);
    token_major(l);
    return l;
  }

  /// vLLM MLA in the fp8 "ds_mla" format: 656 bytes per token and layer (512 fp8 latent values,
  /// 4 float32 scales, 64 bf16 rope values), per layer (num_blocks, block_size, 656) bytes.
  static kv_layout vllm_mla_fp8(std::uint32_t layers, std::uint64_t num_blocks, std::uint32_t block_size) {
    kv_layout l = base("vllm_mla_fp8", layers, num_blocks, block_size, 1, 1, 656, 1);
    token_major(l);
    return l;
  }

  /// SGLang MHA token pool: per layer a K buffer and a V buffer, each (pool_tokens, heads,
  /// head_dim) with token index = slot; page_size is the allocation granularity (block_size).
  /// pool_tokens includes SGLang's padding page and must be a multiple of page_size.
  /// Views pass the K and V buffers per layer (kv_cache_view::per_plane).
  static kv_layout sglang_mha(std::uint32_t layers, std::uint64_t pool_tokens, std::uint32_t page_size,
                              std::uint32_t heads, std::uint32_t head_dim, std::uint32_t elem_bytes = 2) {
    kv_layout l = base("sglang_mha", layers, page_size == 0 ? 0 : pool_tokens / page_size, page_size, 2,
                       heads, head_dim, elem_bytes);
    token_major(l);
    l.plane_stride = l.layer_stride;  // as if V followed K; views usually give both pointers
    l.layer_stride *= 2;
    return l;
  }

  /// SGLang MLA token pool: per layer one buffer (pool_tokens, 1, latent).
  static kv_layout sglang_mla(std::uint32_t layers, std::uint64_t pool_tokens, std::uint32_t page_size,
                              std::uint32_t elem_bytes = 2, std::uint32_t latent = 576) {
    kv_layout l = base("sglang_mla", layers, page_size == 0 ? 0 : pool_tokens / page_size, page_size, 1, 1,
                       latent, elem_bytes);
    token_major(l);
    return l;
  }

  /// A cross-layer block layout: one tensor (num_blocks, layers, planes, block_size, heads,
  /// head_size), so one block holds a token range of every layer (one base pointer).
  static kv_layout cross_layer(std::uint32_t layers, std::uint64_t num_blocks, std::uint32_t block_size,
                               std::uint32_t planes, std::uint32_t heads, std::uint32_t head_size,
                               std::uint32_t elem_bytes = 2) {
    kv_layout l = base("cross_layer", layers, num_blocks, block_size, planes, heads, head_size, elem_bytes);
    l.head_stride = l.head_bytes;
    l.token_stride = std::uint64_t{heads} * l.head_bytes;
    l.plane_stride = l.token_stride * block_size;
    l.layer_stride = l.plane_stride * planes;
    l.block_stride = l.layer_stride * layers;
    return l;
  }

 private:
  static kv_layout base(const char* name, std::uint32_t layers, std::uint64_t num_blocks,
                        std::uint32_t block_size, std::uint32_t planes, std::uint32_t heads,
                        std::uint32_t head_size, std::uint32_t elem_bytes) {
    kv_layout l;
    l.name = name;
    l.num_layers = layers;
    l.num_blocks = num_blocks;
    l.block_size = block_size;
    l.planes = planes;
    l.heads = heads;
    l.elem_bytes = elem_bytes;
    const std::uint64_t hb = std::uint64_t{head_size} * elem_bytes;
    l.head_bytes = hb > UINT32_MAX ? 0 : static_cast<std::uint32_t>(hb);  // 0 fails validate()
    return l;
  }
  // One plane per layer region, (num_blocks, block_size, heads, head) in order.
  static void token_major(kv_layout& l) {
    l.head_stride = l.head_bytes;
    l.token_stride = std::uint64_t{l.heads} * l.head_bytes;
    l.block_stride = l.token_stride * l.block_size;
    l.layer_stride = l.block_stride * l.num_blocks;
  }
  static void set_order(kv_layout& l, kv_order order) {
    if (order == kv_order::nhd) {
      l.head_stride = l.head_bytes;
      l.token_stride = std::uint64_t{l.heads} * l.head_bytes;
    } else {
      l.token_stride = l.head_bytes;
      l.head_stride = std::uint64_t{l.block_size} * l.head_bytes;
    }
  }
};

inline kv_layout_error kv_layout::validate() const {
  auto bad = [this](const char* field, std::uint64_t value, const std::string& rule) {
    return kv_layout_error{field,
                           "kv_layout '" + name + "': " + field + " = " + std::to_string(value) + " " + rule};
  };
  if (num_layers == 0) return bad("num_layers", num_layers, "must be positive");
  if (num_blocks == 0) return bad("num_blocks", num_blocks, "must be positive");
  if (block_size == 0) return bad("block_size", block_size, "must be positive");
  if (planes != 1 && planes != 2) return bad("planes", planes, "must be 1 (latent) or 2 (K and V)");
  if (heads == 0) return bad("heads", heads, "must be positive");
  if (elem_bytes == 0) return bad("elem_bytes", elem_bytes, "must be positive");
  if (head_bytes == 0) return bad("head_bytes", head_bytes, "must be positive (and fit in 32 bits)");
  if (head_bytes % elem_bytes != 0)
    return bad("head_bytes", head_bytes,
               "must be a multiple of elem_bytes (" + std::to_string(elem_bytes) + ")");
  // Every extent must fit in 63 bits; checked by dividing so the check itself cannot overflow.
  constexpr std::uint64_t limit = std::uint64_t{1} << 62;
  struct dim {
    const char* field;
    std::uint64_t stride, count;
  };
  std::array<dim, 5> dims{{{"head_stride", head_stride, heads},
                           {"token_stride", token_stride, block_size},
                           {"block_stride", block_stride, num_blocks},
                           {"plane_stride", plane_stride, planes},
                           {"layer_stride", layer_stride, num_layers}}};
  for (const dim& d : dims)
    if (d.count > 1 && d.stride > limit / d.count)
      return bad(d.field, d.stride, "makes the cache extent overflow");
  // No two entries overlap: sorted by stride, each stride is at least the extent of everything
  // inside it. The layer dimension is checked only when a single-base view would use it.
  std::array<dim, 5> sorted = dims;
  std::size_t n = 5;
  if (layer_stride == 0) n = 4;  // per-layer pointers: layers live in separate regions
  std::stable_sort(sorted.begin(), sorted.begin() + n,
                   [](const dim& a, const dim& b) { return a.stride < b.stride; });
  std::uint64_t inner = head_bytes;
  for (std::size_t i = 0; i < n; ++i) {
    const dim& d = sorted[i];
    if (d.count <= 1) continue;
    if (d.stride < inner)
      return bad(d.field, d.stride,
                 "is smaller than the " + std::to_string(inner) +
                     " bytes of the dimensions inside it (entries would overlap)");
    if (inner > limit - (d.count - 1) * d.stride)
      return bad(d.field, d.stride, "makes the cache extent overflow");
    inner += (d.count - 1) * d.stride;
  }
  return {};
}

/// Where a paged cache lives: its layout and the base of every (layer, plane) region.
/// Host pointers for the CPU copies; device pointers for the CUDA ones.
struct kv_cache_view {
  kv_layout layout;
  std::vector<std::byte*> planes;  ///< planes[l * layout.planes + p] = base of layer l, plane p

  /// base of layer l, plane p.
  std::byte* plane(std::uint32_t l, std::uint32_t p) const noexcept {
    return planes[std::size_t{l} * layout.planes + p];
  }

  /// One allocation for the whole cache: layer l plane p at base + l*layer_stride + p*plane_stride.
  static kv_cache_view one_base(kv_layout lay, std::byte* base) {
    kv_cache_view v{std::move(lay), {}};
    v.planes.resize(std::size_t{v.layout.num_layers} * v.layout.planes);
    for (std::uint32_t l = 0; l < v.layout.num_layers; ++l)
      for (std::uint32_t p = 0; p < v.layout.planes; ++p)
        v.planes[std::size_t{l} * v.layout.planes + p] =
            base + l * v.layout.layer_stride + p * v.layout.plane_stride;
    return v;
  }
  /// One tensor per layer (vLLM): plane p of layer l at layers[l] + p*plane_stride.
  static kv_cache_view per_layer(kv_layout lay, std::span<std::byte* const> layers) {
    kv_cache_view v{std::move(lay), {}};
    for (std::byte* b : layers)
      for (std::uint32_t p = 0; p < v.layout.planes; ++p) v.planes.push_back(b + p * v.layout.plane_stride);
    return v;
  }
  /// One buffer per layer and plane (SGLang's K and V pools): planes as k0, v0, k1, v1, ...
  static kv_cache_view per_plane(kv_layout lay, std::span<std::byte* const> layer_planes) {
    return kv_cache_view{std::move(lay), std::vector<std::byte*>(layer_planes.begin(), layer_planes.end())};
  }

  /// The layout's problem, a pointer count that does not match it, a null pointer, or two
  /// (layer, plane) regions at the same address (field "planes"; "layer_stride" when a one-base
  /// view's layer_stride of 0 put every layer there). Two regions at one address would fold two
  /// layers onto one: every copy would succeed and the checksums would cover the wrong bytes.
  kv_layout_error validate() const {
    if (auto e = layout.validate()) return e;
    const std::size_t want = std::size_t{layout.num_layers} * layout.planes;
    if (planes.size() != want)
      return {"planes",
              "kv_cache_view of '" + layout.name + "': " + std::to_string(planes.size()) +
                  " plane pointers, the layout needs num_layers * planes = " + std::to_string(want)};
    for (std::size_t i = 0; i < planes.size(); ++i)
      if (planes[i] == nullptr)
        return {"planes",
                "kv_cache_view of '" + layout.name + "': plane pointer " + std::to_string(i) + " is null"};
    return duplicate_planes();
  }

 private:
  // The first two (layer, plane) pointers that are equal, in words.
  kv_layout_error duplicate_planes() const {
    std::vector<std::size_t> order(planes.size());
    for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::sort(order.begin(), order.end(), [this](std::size_t a, std::size_t b) {
      return std::less<const std::byte*>{}(planes[a], planes[b]) || (planes[a] == planes[b] && a < b);
    });
    for (std::size_t k = 1; k < order.size(); ++k) {
      const std::size_t a = order[k - 1], b = order[k];
      if (planes[a] != planes[b]) continue;
      const std::size_t p = layout.planes;
      auto name = [p](std::size_t i) {
        return "layer " + std::to_string(i / p) + " plane " + std::to_string(i % p);
      };
      if (layout.layer_stride == 0 && a % p == b % p)
        return {"layer_stride", "kv_cache_view of '" + layout.name + "': layer_stride = 0 puts " + name(a) +
                                    " and " + name(b) +
                                    " at the same address; a view with one base pointer needs a "
                                    "layer_stride that covers a layer (or pass one pointer per layer)"};
      return {"planes", "kv_cache_view of '" + layout.name + "': " + name(a) + " and " + name(b) +
                            " have the same base pointer (two regions would fold onto one)"};
    }
    return {};
  }
};

}  // namespace kvtier
