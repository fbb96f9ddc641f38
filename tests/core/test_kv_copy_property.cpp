// kv_copy properties over random named layouts (small shapes), view kinds, slot mappings with
// skipped tokens and layer ranges, against the one-head-at-a-time reference in kv_fixture.hpp:
//   - gather equals the reference gather (skipped tokens' chunk rows untouched);
//   - scatter after gather is the identity on the cache (into a cache of other bytes, exactly the
//     gathered entries change, to the source's bytes), and gather after scatter on the chunk;
//   - scatter touches exactly the reference's bytes: skipped slots and every other byte unchanged;
//   - gathers of consecutive layer ranges concatenate to the gather of the whole range;
//   - kv_pieces: the pieces put end to end are the gather, none touching the next (merged), the
//     pieces of an earlier call kept as they were (the slots in two calls), a skipped token or
//     heads apart refused.
// The shared default case count per property (tests/support/property.hpp; KVTIER_PROPERTY_CASES
// overrides).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "kvtier/kv_copy.hpp"
#include "support/kv_fixture.hpp"
#include "support/property.hpp"

using namespace kvtier;
using namespace kvtier::test;

namespace {

struct kv_case {
  kv_layout layout;
  view_kind kind;
  std::vector<std::int64_t> slots;
  std::uint64_t seed;
};

kv_case gen_case() {
  layout_params p;
  p.kind = *rc::gen::inRange(0, layout_kinds);
  p.layers = *rc::gen::inRange<std::uint32_t>(1, 5);
  p.blocks = *rc::gen::inRange<std::uint64_t>(1, 7);
  p.block_size = *rc::gen::inRange<std::uint32_t>(1, 9);
  p.heads = *rc::gen::inRange<std::uint32_t>(1, 4);
  p.head_size = *rc::gen::inRange<std::uint32_t>(1, 9);
  p.elem = *rc::gen::element<std::uint32_t>(1, 2, 4);
  kv_case k{make_layout(p),
            static_cast<view_kind>(*rc::gen::inRange(0, 3)),
            {},
            *rc::gen::arbitrary<std::uint64_t>()};
  RC_ASSERT(!k.layout.validate());
  const std::size_t n = *rc::gen::inRange<std::size_t>(0, k.layout.num_slots() + 1);
  k.slots = random_slots(k.layout, n, k.seed, *rc::gen::element(0u, 2u, 5u));
  return k;
}

std::size_t chunk_bytes(const kv_layout& l, std::size_t tokens, layer_range r) {
  return std::size_t{r.end(l) - r.first} * tokens * l.layer_bytes_per_token();
}

layer_range gen_range(const kv_layout& l) {
  const std::uint32_t a = *rc::gen::inRange<std::uint32_t>(0, l.num_layers + 1);
  const std::uint32_t b = *rc::gen::inRange<std::uint32_t>(a, l.num_layers + 1);
  return {a, b};
}

}  // namespace

TEST_CASE("kv_copy: gather equals the reference and scatter after gather is the identity", "[property]") {
  prop("gather == reference; scatter(gather) == identity", [] {
    const kv_case k = gen_case();
    const layer_range r = gen_range(k.layout);
    owned_cache src = make_cache(k.layout, k.kind, k.seed);
    std::vector<std::byte> init(chunk_bytes(k.layout, k.slots.size(), r));
    fill_bytes(init, k.seed ^ 0x77);
    std::vector<std::byte> chunk = init;
    RC_ASSERT(!kv_gather(src.view, k.slots, chunk, r));
    RC_ASSERT(chunk == ref_gather(src.view, k.slots, r, init));

    owned_cache dst = make_cache(k.layout, k.kind, ~k.seed);
    owned_cache want = make_cache(k.layout, k.kind, ~k.seed);
    for (std::uint32_t l = r.first; l < r.end(k.layout); ++l)  // the source's entries, by formula
      for (std::uint32_t p = 0; p < k.layout.planes; ++p)
        for (std::int64_t s : k.slots)
          if (s >= 0)
            for (std::uint32_t h = 0; h < k.layout.heads; ++h)
              std::memcpy(ref_entry(want.view, l, p, s, h), ref_entry(src.view, l, p, s, h),
                          k.layout.head_bytes);
    RC_ASSERT(!kv_scatter(dst.view, k.slots, chunk, r));
    RC_ASSERT(dst.snapshot() == want.snapshot());

    std::vector<std::byte> again = init;  // and gather after scatter gives the chunk back
    RC_ASSERT(!kv_gather(dst.view, k.slots, again, r));
    RC_ASSERT(again == chunk);
  });
}

TEST_CASE("kv_copy: scatter writes exactly the mapped entries; skipped slots stay untouched", "[property]") {
  prop("scatter == reference scatter, nothing else written", [] {
    const kv_case k = gen_case();
    const layer_range r = gen_range(k.layout);
    std::vector<std::byte> chunk(chunk_bytes(k.layout, k.slots.size(), r));
    fill_bytes(chunk, k.seed + 3);
    owned_cache got = make_cache(k.layout, k.kind, k.seed);
    owned_cache want = make_cache(k.layout, k.kind, k.seed);
    RC_ASSERT(!kv_scatter(got.view, k.slots, chunk, r));
    ref_scatter(want.view, k.slots, r, chunk);
    RC_ASSERT(got.snapshot() == want.snapshot());
  });
}

TEST_CASE("kv_copy: layer ranges concatenate to the whole", "[property]") {
  prop("gather of [0,a) ++ [a,b) ++ [b,L) == gather of [0,L)", [] {
    const kv_case k = gen_case();
    owned_cache c = make_cache(k.layout, k.kind, k.seed);
    const std::size_t n = k.slots.size();
    std::vector<std::byte> whole(chunk_bytes(k.layout, n, {}));
    std::vector<std::byte> parts(whole.size());
    fill_bytes(whole, 9);
    fill_bytes(parts, 9);
    RC_ASSERT(!kv_gather(c.view, k.slots, whole));
    const std::uint32_t a = *rc::gen::inRange<std::uint32_t>(0, k.layout.num_layers + 1);
    const std::uint32_t b = *rc::gen::inRange<std::uint32_t>(a, k.layout.num_layers + 1);
    for (layer_range r : {layer_range{0, a}, layer_range{a, b}, layer_range{b, k.layout.num_layers}})
      RC_ASSERT(!kv_gather(c.view, k.slots, chunk_layers(k.layout, n, std::span<std::byte>(parts), r), r));
    RC_ASSERT(parts == whole);
  });
}

TEST_CASE("kv_pieces: the pieces end to end are the gather; a skipped token or heads apart are refused",
          "[property]") {
  prop("concat(kv_pieces) == gather, merged; refused with a negative slot or heads apart", [] {
    const kv_case k = gen_case();
    const layer_range r = gen_range(k.layout);
    owned_cache c = make_cache(k.layout, k.kind, k.seed);
    const std::byte mark[5] = {};
    std::vector<std::span<const std::byte>> pieces{std::span<const std::byte>(mark)};  // an earlier call's
    kv_layout_error why;
    const std::error_code ec = kv_pieces(c.view, k.slots, r, pieces, &why);
    RC_ASSERT(pieces.front().data() == mark);
    RC_ASSERT(pieces.front().size() == 5u);
    const bool skipped = std::any_of(k.slots.begin(), k.slots.end(), [](std::int64_t s) { return s < 0; });
    if (!k.layout.heads_contiguous() || skipped) {
      RC_ASSERT(ec == errc::invalid_argument);
      RC_ASSERT(why.field == (k.layout.heads_contiguous() ? "slots" : "layout"));
      RC_ASSERT(pieces.size() == 1u);
      return;
    }
    RC_ASSERT(!ec);
    std::vector<std::byte> all;
    for (std::size_t i = 1; i < pieces.size(); ++i) {
      RC_ASSERT(!pieces[i].empty());
      if (i + 1 < pieces.size()) RC_ASSERT(pieces[i].data() + pieces[i].size() != pieces[i + 1].data());
      all.insert(all.end(), pieces[i].begin(), pieces[i].end());
    }
    std::vector<std::byte> chunk(chunk_bytes(k.layout, k.slots.size(), r));
    RC_ASSERT(!kv_gather(c.view, k.slots, chunk, r));
    RC_ASSERT(all == chunk);

    // The slots in two calls into one vector (the second's first piece may touch the first's
    // last): the first call's pieces stay as they were, the second's are its own gather.
    const std::size_t m = *rc::gen::inRange<std::size_t>(0, k.slots.size() + 1);
    const std::span<const std::int64_t> head = std::span(k.slots).first(m),
                                        tail = std::span(k.slots).subspan(m);
    std::vector<std::span<const std::byte>> two;
    RC_ASSERT(!kv_pieces(c.view, head, r, two));
    const std::vector<std::span<const std::byte>> first_call = two;
    RC_ASSERT(!kv_pieces(c.view, tail, r, two));
    RC_ASSERT(two.size() >= first_call.size());
    for (std::size_t i = 0; i < first_call.size(); ++i)
      RC_ASSERT(two[i].data() == first_call[i].data() && two[i].size() == first_call[i].size());
    std::vector<std::byte> second;
    for (std::size_t i = first_call.size(); i < two.size(); ++i)
      second.insert(second.end(), two[i].begin(), two[i].end());
    std::vector<std::byte> tail_chunk(chunk_bytes(k.layout, tail.size(), r));
    RC_ASSERT(!kv_gather(c.view, tail, tail_chunk, r));
    RC_ASSERT(second == tail_chunk);
  });
}

TEST_CASE("kv_layout: a layout validate() accepts has disjoint entries inside its extent", "[property]") {
  prop("validate ok => entries disjoint and within cache_extent", [] {
    kv_layout l;
    l.num_layers = *rc::gen::inRange<std::uint32_t>(1, 4);
    l.num_blocks = *rc::gen::inRange<std::uint64_t>(1, 5);
    l.block_size = *rc::gen::inRange<std::uint32_t>(1, 5);
    l.planes = *rc::gen::inRange<std::uint32_t>(1, 3);
    l.heads = *rc::gen::inRange<std::uint32_t>(1, 4);
    l.elem_bytes = 1;
    l.head_bytes = *rc::gen::inRange<std::uint32_t>(1, 9);
    auto stride = [] { return *rc::gen::inRange<std::uint64_t>(0, 400); };
    l.layer_stride = *rc::gen::element<std::uint64_t>(0, 1) ? stride() * 8 : 0;
    l.plane_stride = stride();
    l.block_stride = stride();
    l.token_stride = stride();
    l.head_stride = stride();
    RC_PRE(!l.validate());
    const bool one_region = l.layer_stride != 0;
    const std::uint64_t extent = one_region ? l.cache_extent() : l.layer_extent();
    std::vector<std::uint8_t> used(extent, 0);
    for (std::uint32_t layer = 0; layer < (one_region ? l.num_layers : 1); ++layer)
      for (std::uint32_t p = 0; p < l.planes; ++p)
        for (std::uint64_t b = 0; b < l.num_blocks; ++b)
          for (std::uint32_t t = 0; t < l.block_size; ++t)
            for (std::uint32_t h = 0; h < l.heads; ++h) {
              const std::uint64_t at = layer * l.layer_stride + p * l.plane_stride + b * l.block_stride +
                                       t * l.token_stride + h * l.head_stride;
              RC_ASSERT(at + l.head_bytes <= extent);
              for (std::uint64_t i = at; i < at + l.head_bytes; ++i) RC_ASSERT(used[i]++ == 0);
            }
  });
}
