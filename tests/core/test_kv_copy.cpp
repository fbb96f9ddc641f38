// kv_layout and kv_copy: the named layouts against the engines' index formulas written out by
// hand, bytes_per_token, validation naming the wrong field, and gather/scatter edge cases.
#include <catch2/catch.hpp>

#include <cstdint>
#include <vector>

#include "kvtier/host_kv_cache.hpp"
#include "kvtier/kv_copy.hpp"
#include "kvtier/kv_layout.hpp"
#include "support/kv_fixture.hpp"

using namespace kvtier;
using kvtier::test::view_kind;

namespace {

// Byte offset of element (l, p, block, t, h, d) per the engine's tensor shape, row-major.
std::uint64_t flat(std::initializer_list<std::uint64_t> idx, std::initializer_list<std::uint64_t> shape,
                   std::uint64_t elem) {
  std::uint64_t off = 0;
  auto s = shape.begin();
  for (std::uint64_t i : idx) off = off * *s++ + i;
  return off * elem;
}

std::uint64_t entry_offset(const kv_layout& l, std::uint32_t p, std::uint64_t b, std::uint64_t t,
                           std::uint32_t h) {
  return p * l.plane_stride + b * l.block_stride + t * l.token_stride + h * l.head_stride;
}

}  // namespace

TEST_CASE("kv_layout: named layouts match the engines' tensor shapes", "[unit]") {
  const std::uint64_t NB = 5, BS = 4, H = 3, D = 8, E = 2;
  SECTION("vLLM FlashAttention NHD: (2, num_blocks, block_size, heads, head_size)") {
    auto l = kv_layout::vllm_flash_attn(2, NB, BS, H, D, E, kv_order::nhd);
    REQUIRE_FALSE(l.validate());
    CHECK(entry_offset(l, 1, 3, 2, 1) == flat({1, 3, 2, 1, 0}, {2, NB, BS, H, D}, E));
    CHECK(l.layer_stride == 2 * NB * BS * H * D * E);
    CHECK(l.bytes_per_token() == 2 * 2 * H * D * E);
  }
  SECTION("vLLM FlashAttention HND: (2, num_blocks, heads, block_size, head_size) in memory") {
    auto l = kv_layout::vllm_flash_attn(2, NB, BS, H, D, E, kv_order::hnd);
    REQUIRE_FALSE(l.validate());
    CHECK(entry_offset(l, 1, 3, 2, 1) == flat({1, 3, 1, 2, 0}, {2, NB, H, BS, D}, E));
  }
  SECTION("FlashInfer NHD and HND: (num_blocks, 2, ...)") {
    auto n = kv_layout::flashinfer(1, NB, BS, H, D, E, kv_order::nhd);
    auto h = kv_layout::flashinfer(1, NB, BS, H, D, E, kv_order::hnd);
    REQUIRE_FALSE(n.validate());
    REQUIRE_FALSE(h.validate());
    CHECK(entry_offset(n, 1, 3, 2, 1) == flat({3, 1, 2, 1, 0}, {NB, 2, BS, H, D}, E));
    CHECK(entry_offset(h, 1, 3, 2, 1) == flat({3, 1, 1, 2, 0}, {NB, 2, H, BS, D}, E));
  }
  SECTION("vLLM MLA: (num_blocks, block_size, 576), and the 656-byte fp8 format") {
    auto l = kv_layout::vllm_mla(61, NB, BS);
    REQUIRE_FALSE(l.validate());
    CHECK(l.bytes_per_token() == 61u * 576 * 2);
    CHECK(entry_offset(l, 0, 3, 2, 0) == flat({3, 2, 0}, {NB, BS, 576}, 2));
    auto f = kv_layout::vllm_mla_fp8(61, NB, BS);
    REQUIRE_FALSE(f.validate());
    CHECK(f.bytes_per_token() == 61u * 656);
    CHECK(entry_offset(f, 0, 3, 2, 0) == flat({3, 2, 0}, {NB, BS, 656}, 1));
  }
  SECTION("SGLang token pools: slot = token index") {
    auto m = kv_layout::sglang_mha(3, NB * BS, BS, H, D, E);
    REQUIRE_FALSE(m.validate());
    CHECK(m.num_slots() == NB * BS);
    CHECK(entry_offset(m, 0, 3, 2, 1) == flat({3 * BS + 2, 1, 0}, {NB * BS, H, D}, E));
    auto a = kv_layout::sglang_mla(3, NB * BS, BS);
    REQUIRE_FALSE(a.validate());
    CHECK(entry_offset(a, 0, 3, 2, 0) == flat({3 * BS + 2, 0, 0}, {NB * BS, 1, 576}, 2));
  }
  SECTION("cross-layer blocks: (num_blocks, layers, planes, block_size, heads, head_size)") {
    const std::uint64_t L = 3;
    auto l = kv_layout::cross_layer(L, NB, BS, 2, H, D, E);
    REQUIRE_FALSE(l.validate());
    CHECK(2 * l.layer_stride + entry_offset(l, 1, 3, 2, 1) ==
          flat({3, 2, 1, 2, 1, 0}, {NB, L, 2, BS, H, D}, E));
    CHECK(l.cache_extent() == NB * L * 2 * BS * H * D * E);
  }
}

TEST_CASE("kv_layout: validation names the wrong field", "[unit]") {
  auto good = kv_layout::vllm_flash_attn(2, 8, 16, 4, 64);
  REQUIRE_FALSE(good.validate());
  auto field_of = [](kv_layout l) { return l.validate().field; };
  auto l = good;
  l.num_layers = 0;
  CHECK(field_of(l) == "num_layers");
  l = good;
  l.planes = 3;
  CHECK(field_of(l) == "planes");
  l = good;
  l.head_bytes = 129;  // not a multiple of elem_bytes 2
  CHECK(field_of(l) == "head_bytes");
  l = good;
  l.token_stride = 4 * 128 - 2;  // tokens would overlap their heads
  auto e = l.validate();
  CHECK(e.field == "token_stride");
  CHECK(e.message.find("overlap") != std::string::npos);
  CHECK(e.message.find("vllm_flash_attn_nhd") != std::string::npos);
  l = good;
  l.block_stride = UINT64_MAX / 4;
  CHECK(field_of(l) == "block_stride");
  l = good;
  l.num_blocks = 0;
  CHECK(field_of(l) == "num_blocks");
  CHECK(field_of(kv_layout::vllm_mla(1, 1, 0)) == "block_size");
  CHECK(field_of(kv_layout::sglang_mha(1, 64, 16, 0, 64)) == "heads");
}

TEST_CASE("kv_cache_view: layers or planes folded onto one address are refused", "[unit]") {
  // One base and layer_stride 0: every layer would land on layer 0 (issue 18, bug 3).
  auto folded = kv_layout::vllm_mla(3, 4, 8);
  folded.layer_stride = 0;
  REQUIRE_FALSE(folded.validate());  // fine for per-layer pointers
  std::vector<std::byte> buf(folded.cache_extent() * 3);
  auto one = kv_cache_view::one_base(folded, buf.data());
  auto e = one.validate();
  CHECK(e.field == "layer_stride");
  CHECK(e.message.find("layer 0 plane 0 and layer 1 plane 0") != std::string::npos);
  std::vector<std::int64_t> slots{0, 5, 9};
  std::vector<std::byte> chunk(folded.bytes_per_token() * slots.size(), std::byte{7});
  const auto before = buf;
  kv_layout_error why;
  CHECK(kv_scatter(one, slots, chunk, {}, &why) == errc::invalid_argument);
  CHECK(why.field == "layer_stride");
  CHECK(kv_gather(one, slots, chunk) == errc::invalid_argument);
  CHECK(buf == before);
  // One layer over one base needs no layer stride.
  auto single = kv_layout::vllm_mla(1, 4, 8);
  single.layer_stride = 0;
  CHECK_FALSE(kv_cache_view::one_base(single, buf.data()).validate());
  // Per-layer pointers with layer_stride 0 are the normal case; the same pointer twice is not.
  std::vector<std::byte> l0(folded.layer_extent()), l1(folded.layer_extent()), l2(folded.layer_extent());
  std::byte* distinct[] = {l0.data(), l1.data(), l2.data()};
  CHECK_FALSE(kv_cache_view::per_layer(folded, distinct).validate());
  std::byte* repeated[] = {l0.data(), l1.data(), l0.data()};
  e = kv_cache_view::per_layer(folded, repeated).validate();
  CHECK(e.field == "layer_stride");
  CHECK(e.message.find("layer 0 plane 0 and layer 2 plane 0") != std::string::npos);
  // Per-plane pointers (SGLang's K and V pools): V given as K is refused as "planes".
  auto mha = kv_layout::sglang_mha(2, 64, 16, 2, 8);
  std::vector<std::vector<std::byte>> pools(4, std::vector<std::byte>(mha.plane_extent()));
  std::byte* kv[] = {pools[0].data(), pools[1].data(), pools[2].data(), pools[1].data()};
  e = kv_cache_view::per_plane(mha, kv).validate();
  CHECK(e.field == "planes");
  CHECK(e.message.find("layer 0 plane 1 and layer 1 plane 1") != std::string::npos);
  kv[3] = pools[3].data();
  CHECK_FALSE(kv_cache_view::per_plane(mha, kv).validate());
}

TEST_CASE("kv_cache_view: FlashInfer's interleaved K and V planes are accepted and copy exactly", "[unit]") {
  // K and V of a block sit side by side (plane_stride < a plane's extent): interleaved, not folded.
  for (const kv_order order : {kv_order::nhd, kv_order::hnd}) {
    const auto lay = kv_layout::flashinfer(3, 5, 4, 2, 8, 2, order);
    REQUIRE(lay.plane_stride < lay.plane_extent());
    for (const view_kind kind : {view_kind::one_base, view_kind::per_layer}) {
      auto c = test::make_cache(lay, kind, 11);
      REQUIRE_FALSE(c.view.validate());
      const std::vector<std::int64_t> slots{3, -1, 0, 19, 7};
      const std::size_t bytes = lay.bytes_per_token() * slots.size();
      std::vector<std::byte> got(bytes, std::byte{1});
      REQUIRE_FALSE(kv_gather(c.view, slots, got));
      CHECK(got == test::ref_gather(c.view, slots, {}, std::vector<std::byte>(bytes, std::byte{1})));
    }
  }
}

TEST_CASE("kv_gather with a sink: every byte of the chunk once, in order, as it was gathered", "[unit]") {
  // What the connector's saver hashes in the gather (one pass): the sink's stretches put end to
  // end are the gathered chunk, for all layers and for a layer range (a save by layer group).
  const auto lay = kv_layout::flashinfer(4, 5, 4, 2, 8, 2, kv_order::hnd);
  auto c = test::make_cache(lay, view_kind::per_layer, 13);
  const std::vector<std::int64_t> slots{3, 0, 19, 7, 8};
  for (const layer_range r : {layer_range{}, layer_range{1, 3}}) {
    const std::size_t bytes = lay.bytes_per_token() * slots.size() * (r.end(lay) - r.first) / lay.num_layers;
    std::vector<std::byte> got(bytes), seen;
    REQUIRE_FALSE(kv_gather(c.view, slots, got, r, nullptr, [&](std::span<const std::byte> s) {
      REQUIRE(s.data() == got.data() + seen.size());  // in order, no gap, no byte twice
      seen.insert(seen.end(), s.begin(), s.end());
    }));
    CHECK(seen == got);
    std::vector<std::byte> plain(bytes);
    REQUIRE_FALSE(kv_gather(c.view, slots, plain, r));
    CHECK(plain == got);
  }
}

TEST_CASE("kv_copy: bad arguments are refused before any byte moves, naming the field", "[unit]") {
  auto c = test::make_cache(kv_layout::vllm_mla(2, 4, 8, 2, 16), view_kind::per_layer, 1);
  const auto before = c.snapshot();
  std::vector<std::int64_t> slots{0, 1, 31, 5};
  const std::size_t bytes = c.view.layout.bytes_per_token() * slots.size();
  std::vector<std::byte> chunk(bytes, std::byte{0x5a});
  kv_layout_error why;

  slots[2] = 32;  // = num_slots
  CHECK(kv_scatter(c.view, slots, chunk, {}, &why) == errc::invalid_argument);
  CHECK(why.field == "slots");
  CHECK(why.message.find("slots[2] = 32") != std::string::npos);
  slots[2] = 5;  // = slots[3]: two tokens into one slot
  CHECK(kv_scatter(c.view, slots, chunk, {}, &why) == errc::invalid_argument);
  CHECK(why.field == "slots");
  CHECK(why.message.find("slots[2] and slots[3] are both 5") != std::string::npos);
  CHECK_FALSE(kv_gather(c.view, slots, std::span<std::byte>(chunk)));  // reading one slot twice is fine
  CHECK(c.snapshot() == before);
  slots[2] = 31;
  std::vector<std::byte> short_chunk(bytes - 1);
  CHECK(kv_scatter(c.view, slots, short_chunk, {}, &why) == errc::invalid_argument);
  CHECK(why.field == "chunk");
  CHECK(kv_scatter(c.view, slots, chunk, {1, 3}, &why) == errc::invalid_argument);
  CHECK(why.field == "layers");
  auto missing = c.view;
  missing.planes.pop_back();
  CHECK(kv_scatter(missing, slots, chunk, {}, &why) == errc::invalid_argument);
  CHECK(why.field == "planes");
  const std::int32_t table[] = {1};
  CHECK(kv_scatter(c.view, block_table_ref{table, 4, 8}, chunk, {}, &why) == errc::invalid_argument);
  CHECK(why.field == "block_table");
  CHECK(c.snapshot() == before);
  CHECK(kv_gather(c.view, slots, short_chunk) == errc::invalid_argument);
}

TEST_CASE("kv_copy: a block table addresses the same slots as the slot mapping", "[unit]") {
  auto c = test::make_cache(kv_layout::vllm_flash_attn(3, 6, 4, 2, 8), view_kind::per_layer, 2);
  const std::int32_t table[] = {5, -1, 0, 2};  // positions 6..15: blocks 1 (skipped), 2, 3
  block_table_ref t{table, 6, 10};
  const auto slots = slots_from_block_table(t, 4);
  REQUIRE(slots == std::vector<std::int64_t>{-1, -1, 0, 1, 2, 3, 8, 9, 10, 11});
  const std::size_t bytes = c.view.layout.bytes_per_token() * slots.size();
  std::vector<std::byte> a(bytes, std::byte{1}), b(bytes, std::byte{1});
  REQUIRE_FALSE(kv_gather(c.view, slots, a));
  REQUIRE_FALSE(kv_gather(c.view, t, b));
  CHECK(a == b);
  CHECK(a == test::ref_gather(c.view, slots, {}, std::vector<std::byte>(bytes, std::byte{1})));
}

TEST_CASE("kv_copy: chunk_layers is the layer range's sub-span of a whole value", "[unit]") {
  auto lay = kv_layout::vllm_mla_fp8(4, 2, 4);
  std::vector<std::byte> value(lay.bytes_per_token() * 3);
  auto mid = chunk_layers(lay, 3, std::span<std::byte>(value), {1, 3});
  CHECK(mid.data() == value.data() + 656 * 3);
  CHECK(mid.size() == 2u * 656 * 3);
  CHECK(chunk_layers(lay, 3, std::span<std::byte>(value), {}).size() == value.size());
  CHECK(layer_group_bytes(lay, 3, 2) == mid.size());
  // A range out of order, past the last layer, or past the value's end: empty, and why.
  kv_layout_error why;
  CHECK(chunk_layers(lay, 3, std::span<std::byte>(value), {3, 1}, &why).empty());
  CHECK(why.field == "layers");
  CHECK(why.message.find("[3, 1)") != std::string::npos);
  why = {};
  CHECK(chunk_layers(lay, 3, std::span<std::byte>(value), {2, 5}, &why).empty());
  CHECK(why.field == "layers");
  why = {};
  CHECK(chunk_layers(lay, 4, std::span<std::byte>(value), {2, 4}, &why).empty());
  CHECK(why.field == "chunk");
  // The empty span makes the copy of that range refuse, so no byte moves.
  auto c = test::make_cache(lay, view_kind::per_layer, 3);
  const std::vector<std::int64_t> slots{0, 1, 2};
  CHECK(kv_gather(c.view, slots, chunk_layers(lay, 3, std::span<std::byte>(value), {3, 1}), {3, 1}) ==
        errc::invalid_argument);
  CHECK_FALSE(kv_gather(c.view, slots, chunk_layers(lay, 3, std::span<std::byte>(value), {2, 4}), {2, 4}));
}

TEST_CASE("host_kv_cache: blocks, sequences, and a chunk moved between sequences", "[unit]") {
  for (const kv_layout& lay : {kv_layout::vllm_mla(2, 6, 4), kv_layout::cross_layer(3, 6, 4, 2, 2, 8)}) {
    host_kv_cache cache(lay);
    CHECK(cache.free_blocks() == 6);
    host_kv_cache::sequence a, b;
    REQUIRE(cache.reserve(a, 9));  // 3 blocks
    CHECK(a.blocks == std::vector<std::int32_t>{0, 1, 2});
    CHECK_FALSE(cache.reserve(b, 4 * 4));  // 4 blocks: only 3 free, nothing taken
    CHECK(b.blocks.empty());
    REQUIRE(cache.reserve(b, 12));
    CHECK(cache.free_blocks() == 0);

    std::vector<std::byte> value(cache.value_bytes(5)), back(cache.value_bytes(5));
    test::fill_bytes(value, 3);
    REQUIRE_FALSE(cache.scatter(a, 3, 5, value));  // positions 3..7 of a: blocks 0 and 1
    REQUIRE_FALSE(cache.gather(a, 3, 5, back));
    CHECK(back == value);
    REQUIRE_FALSE(cache.scatter(b, 6, 5, back));  // the same chunk at another place of b
    std::vector<std::byte> again(value.size());
    REQUIRE_FALSE(cache.gather(b, 6, 5, again));
    CHECK(again == value);
    kv_layout_error why;
    CHECK(cache.gather(a, 10, 5, again, {}, &why) == errc::invalid_argument);  // past a's table
    CHECK(why.field == "block_table");
    cache.release(a);
    CHECK(a.blocks.empty());
    CHECK(cache.free_blocks() == 3);
  }
  try {
    host_kv_cache bad(kv_layout::vllm_flash_attn(2, 4, 16, 0, 64));
    FAIL("a layout without heads was accepted");
  } catch (const std::invalid_argument& e) {
    CHECK(std::string(e.what()).find("heads") != std::string::npos);
  }
}

namespace {

// The pieces of kv_pieces put end to end.
std::vector<std::byte> concat(std::span<const std::span<const std::byte>> pieces) {
  std::vector<std::byte> all;
  for (const auto& p : pieces) all.insert(all.end(), p.begin(), p.end());
  return all;
}

// kv_gather of `slots`, layers r, into a fresh chunk.
std::vector<std::byte> gathered(const kv_cache_view& v, std::span<const std::int64_t> slots,
                                layer_range r = {}) {
  std::vector<std::byte> chunk(std::size_t{r.end(v.layout) - r.first} * slots.size() *
                               v.layout.layer_bytes_per_token());
  REQUIRE_FALSE(kv_gather(v, slots, chunk, r));
  return chunk;
}

// vLLM FlashAttention NHD with each token's row followed by 16 bytes of padding (token_stride >
// heads * head_bytes): no two rows of a block touch.
kv_layout padded_layout() {
  auto l = kv_layout::vllm_flash_attn(2, 4, 4, 2, 8, 2, kv_order::nhd);  // a row: 2 heads of 16 bytes
  l.token_stride = 48;
  l.block_stride = 4 * l.token_stride;
  l.plane_stride = 4 * l.block_stride;
  l.layer_stride = 2 * l.plane_stride;
  return l;
}

}  // namespace

TEST_CASE("kv_pieces: the pieces put end to end are what kv_gather writes", "[unit]") {
  // Slots in runs and apart, out of order, across blocks; every layout with a token's heads together.
  const std::vector<std::int64_t> slots{5, 6, 7, 8, 9, 2, 14, 0, 13, 12};
  struct named {
    const char* what;
    kv_layout layout;
  };
  for (const named& n : {named{"vllm_mla", kv_layout::vllm_mla(3, 4, 4, 2, 16)},
                         named{"vllm_flash_attn nhd (K and V)", kv_layout::vllm_flash_attn(3, 4, 4, 2, 8)},
                         named{"flashinfer nhd", kv_layout::flashinfer(3, 4, 4, 2, 8, 2, kv_order::nhd)},
                         named{"padded token_stride", padded_layout()}}) {
    REQUIRE_FALSE(n.layout.validate());
    for (const view_kind kind : {view_kind::one_base, view_kind::per_layer, view_kind::per_plane}) {
      const auto c = test::make_cache(n.layout, kind, 21);
      const std::uint32_t layers = n.layout.num_layers;
      for (const layer_range r : {layer_range{}, layer_range{1, layers}, layer_range{1, 2}}) {
        INFO(n.what << ", view " << static_cast<int>(kind) << ", layers [" << r.first << ", "
                    << r.end(n.layout) << ")");
        std::vector<std::span<const std::byte>> pieces;
        kv_layout_error why;
        REQUIRE_FALSE(kv_pieces(c.view, slots, r, pieces, &why));
        CHECK(concat(pieces) == gathered(c.view, slots, r));
      }
    }
  }
}

TEST_CASE("kv_pieces: a padded token_stride gives one piece per token row, none merged", "[unit]") {
  const kv_layout lay = padded_layout();
  const auto c = test::make_cache(lay, view_kind::per_layer, 22);
  const std::vector<std::int64_t> slots{4, 5, 6, 7, 8};  // block 1 whole, then block 2's first token
  std::vector<std::span<const std::byte>> pieces;
  REQUIRE_FALSE(kv_pieces(c.view, slots, {}, pieces));
  REQUIRE(pieces.size() == std::size_t{lay.num_layers} * lay.planes * slots.size());
  for (const auto& p : pieces) CHECK(p.size() == 32u);  // one row: 2 heads of 16 bytes, no padding
  // Piece i of (layer, plane) is token i's row, where the formula puts it.
  for (std::uint32_t l = 0; l < lay.num_layers; ++l)
    for (std::uint32_t p = 0; p < lay.planes; ++p)
      for (std::size_t i = 0; i < slots.size(); ++i)
        CHECK(pieces[(l * lay.planes + p) * slots.size() + i].data() ==
              test::ref_entry(c.view, l, p, static_cast<std::uint64_t>(slots[i]), 0));
  CHECK(concat(pieces) == gathered(c.view, slots));
}

TEST_CASE("kv_pieces: neighbours that touch in memory are merged into one piece", "[unit]") {
  SECTION("vllm_mla, consecutive blocks, per-layer pointers: one piece per layer") {
    const auto lay = kv_layout::vllm_mla(2, 6, 4, 2, 16);
    const auto c = test::make_cache(lay, view_kind::per_layer, 23);
    std::vector<std::int64_t> slots;
    for (std::int64_t s = 4; s < 16; ++s) slots.push_back(s);  // blocks 1, 2, 3 in order
    std::vector<std::span<const std::byte>> pieces;
    REQUIRE_FALSE(kv_pieces(c.view, slots, {}, pieces));
    REQUIRE(pieces.size() == 2);
    for (std::uint32_t l = 0; l < 2; ++l) {
      CHECK(pieces[l].data() == c.view.plane(l, 0) + 4 * lay.token_stride);
      CHECK(pieces[l].size() == 12 * lay.layer_bytes_per_token());
    }
    CHECK(concat(pieces) == gathered(c.view, slots));
  }
  SECTION("vllm_mla over one base, every slot in order: the whole cache is one piece") {
    const auto lay = kv_layout::vllm_mla(3, 2, 4, 2, 16);
    const auto c = test::make_cache(lay, view_kind::one_base, 24);
    const std::vector<std::int64_t> slots{0, 1, 2, 3, 4, 5, 6, 7};
    std::vector<std::span<const std::byte>> pieces;
    REQUIRE_FALSE(kv_pieces(c.view, slots, {}, pieces));
    REQUIRE(pieces.size() == 1);
    CHECK(pieces[0].data() == c.buffers[0].data());
    CHECK(pieces[0].size() == c.buffers[0].size());
  }
  SECTION("vllm_flash_attn nhd, blocks 1 and 2 in order: one piece per layer and plane") {
    const auto lay = kv_layout::vllm_flash_attn(2, 4, 4, 2, 8);
    const auto c = test::make_cache(lay, view_kind::per_layer, 25);
    const std::vector<std::int64_t> slots{4, 5, 6, 7, 8, 9, 10, 11};
    std::vector<std::span<const std::byte>> pieces;
    REQUIRE_FALSE(kv_pieces(c.view, slots, {}, pieces));
    REQUIRE(pieces.size() == 4);
    for (std::uint32_t l = 0; l < 2; ++l)
      for (std::uint32_t p = 0; p < 2; ++p) {
        CHECK(pieces[l * 2 + p].data() == c.view.plane(l, p) + lay.block_stride);
        CHECK(pieces[l * 2 + p].size() == 8 * lay.token_stride);
      }
    CHECK(concat(pieces) == gathered(c.view, slots));
  }
  SECTION("tokens in reverse order touch only backwards: one piece per token row") {
    const auto lay = kv_layout::vllm_mla(1, 2, 4, 2, 16);
    const auto c = test::make_cache(lay, view_kind::per_layer, 26);
    const std::vector<std::int64_t> slots{3, 2, 1, 0};
    std::vector<std::span<const std::byte>> pieces;
    REQUIRE_FALSE(kv_pieces(c.view, slots, {}, pieces));
    CHECK(pieces.size() == 4);
    CHECK(concat(pieces) == gathered(c.view, slots));
  }
}

TEST_CASE("kv_pieces: a second call appending to the same vector never merges into the first call's pieces",
          "[unit]") {
  const auto lay = kv_layout::vllm_mla(1, 2, 4, 2, 16);
  const auto c = test::make_cache(lay, view_kind::per_layer, 27);
  const std::vector<std::int64_t> first{0, 1}, second{2, 3};  // slot 2's row starts where slot 1's ends
  std::vector<std::span<const std::byte>> pieces;
  REQUIRE_FALSE(kv_pieces(c.view, first, {}, pieces));
  REQUIRE(pieces.size() == 1);
  const std::span<const std::byte> one = pieces[0];
  REQUIRE_FALSE(kv_pieces(c.view, second, {}, pieces));
  REQUIRE(pieces.size() == 2);
  CHECK(pieces[0].data() == one.data());
  CHECK(pieces[0].size() == one.size());                           // the first call's piece kept its length
  CHECK(pieces[1].data() == pieces[0].data() + pieces[0].size());  // they do touch
  CHECK(concat(std::span(pieces).first(1)) == gathered(c.view, first));
  CHECK(concat(std::span(pieces).subspan(1)) == gathered(c.view, second));
}

TEST_CASE("kv_pieces: refusals name the field and leave the pieces as they were", "[unit]") {
  const std::byte mark[3] = {};
  const std::vector<std::span<const std::byte>> before{std::span<const std::byte>(mark)};
  auto refused = [&](const kv_cache_view& v, std::span<const std::int64_t> slots, layer_range r) {
    std::vector<std::span<const std::byte>> pieces = before;
    kv_layout_error why;
    const std::error_code ec = kv_pieces(v, slots, r, pieces, &why);
    CHECK(ec == errc::invalid_argument);
    CHECK(pieces.size() == 1);
    CHECK(pieces[0].data() == mark);
    CHECK(pieces[0].size() == 3);
    return why;
  };
  const auto mla = test::make_cache(kv_layout::vllm_mla(2, 4, 4, 2, 16), view_kind::per_layer, 28);
  SECTION("a skipped token (negative slot): slots") {
    const std::vector<std::int64_t> slots{0, -1, 2};
    const auto why = refused(mla.view, slots, {});
    CHECK(why.field == "slots");
    CHECK(why.message.find("slots[1] is negative") != std::string::npos);
  }
  SECTION("a token's heads apart (HND): layout") {
    const auto hnd = test::make_cache(kv_layout::vllm_flash_attn(2, 4, 4, 2, 8, 2, kv_order::hnd),
                                      view_kind::per_layer, 29);
    const std::vector<std::int64_t> slots{0, 1, 2};
    const auto why = refused(hnd.view, slots, {});
    CHECK(why.field == "layout");
    CHECK(why.message.find("vllm_flash_attn_hnd") != std::string::npos);
  }
  SECTION("kv_gather's checks: a slot past the cache, a layer range outside, a plane missing") {
    const std::vector<std::int64_t> past{0, 16}, fine{0, 1};
    CHECK(refused(mla.view, past, {}).field == "slots");
    CHECK(refused(mla.view, fine, {1, 3}).field == "layers");
    CHECK(refused(mla.view, fine, {2, 1}).field == "layers");
    auto missing = mla.view;
    missing.planes.pop_back();
    CHECK(refused(missing, fine, {}).field == "planes");
  }
  // An HND layout with one head has its heads together: accepted.
  const auto one_head =
      test::make_cache(kv_layout::vllm_flash_attn(1, 4, 4, 1, 8, 2, kv_order::hnd), view_kind::per_layer, 30);
  const std::vector<std::int64_t> slots{1, 2, 3};
  std::vector<std::span<const std::byte>> pieces;
  REQUIRE_FALSE(kv_pieces(one_head.view, slots, {}, pieces));
  CHECK(concat(pieces) == gathered(one_head.view, slots));
}
