// Chunker: known answers, chaining, namespace separation, tail policies, the
// hash concept, and the text form of keys.
#include <catch2/catch.hpp>

#include <cstring>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "core/chunker_kat.hpp"
#include "kvtier/chunker.hpp"
#include "kvtier/store/value_header.hpp"

// kvtier inlines xxHash but must not leave its configuration macros defined in the
// user's code: a user's own later #include <xxhash.h> would then compile xxHash's
// definitions into every such translation unit (duplicate symbols at link time).
#if defined(XXH_INLINE_ALL) || defined(XXH_IMPLEMENTATION) || defined(XXH_STATIC_LINKING_ONLY)
#error "a kvtier header leaked XXH_INLINE_ALL / XXH_IMPLEMENTATION / XXH_STATIC_LINKING_ONLY"
#endif

namespace {

std::vector<kvtier::token_id> iota_tokens(std::size_t n, kvtier::token_id first = 1) {
  std::vector<kvtier::token_id> t(n);
  std::iota(t.begin(), t.end(), first);
  return t;
}

std::string hex128(std::uint64_t hi, std::uint64_t lo) { return kvtier::chunk_key{hi, lo}.to_hex(); }

}  // namespace

TEST_CASE("chunker: the system's xxHash gives the published XXH3-128 values", "[unit]") {
  // Published XXH3-128 (seed 0) values; they anchor the KAT below to xxHash itself.
  XXH128_hash_t empty = XXH3_128bits_withSeed("", 0, 0);
  CHECK(hex128(empty.high64, empty.low64) == "99aa06d3014798d86001c324468d497f");
  XXH128_hash_t abc = XXH3_128bits_withSeed("abc", 3, 0);
  CHECK(hex128(abc.high64, abc.low64) == "06b05ab6733a618578af5f94892f3950");
  // The default chain from the all-zero key over no bytes is exactly that hash.
  CHECK(kvtier::xxh3_128::chain(kvtier::chunk_key{}, {}).to_hex() == "99aa06d3014798d86001c324468d497f");
}

TEST_CASE("chunker: known-answer vectors", "[unit]") {
  for (const auto& kat : kvtier::test::chunker_kats()) {
    INFO(kat.name);
    const kvtier::chunker<> ch(kat.ns, kat.tail);
    CHECK(ch.root().to_hex() == kat.root);
    const auto keys = ch.keys(kvtier::test::kat_tokens(kat.n_tokens));
    REQUIRE(keys.size() == kat.expected.size());
    REQUIRE(keys.size() == ch.key_count(kat.n_tokens));
    const std::string prefix = kvtier::remote_key_prefix(kat.ns);  // hashed once, as remote_store does
    for (std::size_t c = 0; c < keys.size(); ++c) {
      CHECK(kvtier::remote_key_text(kat.ns, keys[c]) == kat.expected[c]);
      CHECK(kvtier::remote_key_text(prefix, keys[c]) == kat.expected[c]);
    }
  }
}

TEST_CASE("chunker: one key per full chunk, chained", "[unit]") {
  kvtier::key_namespace ns{.model = "m", .kv_format = "f", .chunk_tokens = 4};
  kvtier::chunker<> ch(ns);
  const auto t = iota_tokens(10);
  const auto keys = ch.keys(t);
  REQUIRE(keys.size() == 2);
  CHECK(keys[0] == kvtier::xxh3_128::chain(ch.root(), std::as_bytes(std::span(t).first(4))));
  CHECK(keys[1] == kvtier::xxh3_128::chain(keys[0], std::as_bytes(std::span(t).subspan(4, 4))));
  // Key 1 covers the whole prefix: change token 0 and every key changes.
  auto t2 = t;
  t2[0] = 99;
  const auto keys2 = ch.keys(t2);
  CHECK(keys2[0] != keys[0]);
  CHECK(keys2[1] != keys[1]);
  // Same second chunk after a different first chunk: a different key.
  CHECK(ch.keys(std::span(t2).first(8))[1] != keys[1]);
  // Changing only chunk 1 leaves key 0 alone.
  auto t3 = t;
  t3[5] = 77;
  CHECK(ch.keys(t3)[0] == keys[0]);
  CHECK(ch.keys(t3)[1] != keys[1]);
}

TEST_CASE("chunker: extend() continues a chain exactly", "[unit]") {
  kvtier::chunker<> ch(kvtier::key_namespace{.model = "m", .chunk_tokens = 16});
  const auto t = iota_tokens(16 * 20 + 5, 1000);
  const auto whole = ch.keys(t);
  std::vector<kvtier::chunk_key> pieces;
  ch.keys(std::span(t).first(16 * 7), pieces);
  ch.extend(pieces.back(), std::span(t).subspan(16 * 7), pieces);
  CHECK(pieces == whole);
  // keys(span, out) appends.
  std::vector<kvtier::chunk_key> twice;
  ch.keys(t, twice);
  ch.keys(t, twice);
  REQUIRE(twice.size() == 2 * whole.size());
  CHECK(std::equal(whole.begin(), whole.end(), twice.begin() + whole.size()));
}

TEST_CASE("chunker: namespaces never share keys", "[unit]") {
  const kvtier::key_namespace base{
      .model = "glm", .kv_format = "fp8", .chunk_tokens = 8, .ownership = "mod:8"};
  std::vector<kvtier::key_namespace> variants(7, base);
  variants[1].model = "glm2";
  variants[2].kv_format = "bf16";
  variants[3].layout_version = 2;
  variants[4].ownership = "mod:4";
  // Field boundaries are length-prefixed: moving a character between fields
  // gives a different namespace.
  variants[5].model = "glmf";
  variants[5].kv_format = "p8";
  variants[6].chunk_tokens = 16;  // also a different chunking of the same tokens
  const auto t = iota_tokens(64, 7);
  std::set<std::string> canon, roots, first_keys, fingerprints, remote_names;
  for (const auto& ns : variants) {
    kvtier::chunker<> ch(ns);
    canon.insert(ns.canonical());
    roots.insert(ch.root().to_hex());
    fingerprints.insert(ns.text());
    const auto keys = ch.keys(t);
    REQUIRE(!keys.empty());
    first_keys.insert(keys[0].to_hex());
    remote_names.insert(kvtier::remote_key_text(ns, keys[0]));
  }
  CHECK(canon.size() == variants.size());
  CHECK(roots.size() == variants.size());
  CHECK(fingerprints.size() == variants.size());
  CHECK(first_keys.size() == variants.size());
  CHECK(remote_names.size() == variants.size());
  // Same namespace, same keys (value semantics, no hidden state).
  CHECK(kvtier::chunker<>(base).keys(t) == kvtier::chunker<>(variants[0]).keys(t));
  CHECK(base.fingerprint() == base.root().hi);
}

TEST_CASE("chunker: tail policies", "[unit]") {
  const kvtier::key_namespace ns{.model = "m", .chunk_tokens = 4};
  const kvtier::chunker<> drop(ns);
  const kvtier::chunker<> partial(ns, kvtier::tail_policy::hash_partial);
  const auto t = iota_tokens(11);  // 2 full chunks + 3-token tail

  SECTION("default is drop") {
    CHECK(kvtier::chunker<>(ns).keys(t) == drop.keys(t));
    CHECK(drop.key_count(11) == 2);
    CHECK(drop.keys(t).size() == 2);
    CHECK(drop.keys(std::span(t).first(3)).empty());
    CHECK(drop.keys(std::span<const kvtier::token_id>{}).empty());
  }
  SECTION("hash_partial adds one key for the tail, after the same full-chunk keys") {
    const auto d = drop.keys(t), p = partial.keys(t);
    REQUIRE(p.size() == 3);
    CHECK(partial.key_count(11) == 3);
    CHECK(std::equal(d.begin(), d.end(), p.begin()));
    CHECK(p[2] == kvtier::xxh3_128::chain(p[1], std::as_bytes(std::span(t).subspan(8))));
    // The tail key depends on every tail token.
    auto t2 = t;
    t2[10] ^= 1;
    CHECK(partial.keys(t2)[2] != p[2]);
    // A 3-token tail and the full chunk that extends it have different keys.
    const auto longer = partial.keys(iota_tokens(12));
    REQUIRE(longer.size() == 3);
    CHECK(longer[2] != p[2]);
  }
  SECTION("no tail, no extra key") {
    const auto exact = iota_tokens(8);
    CHECK(partial.keys(exact) == drop.keys(exact));
    CHECK(partial.key_count(8) == 2);
    CHECK(partial.key_count(0) == 0);
    CHECK(partial.keys(std::span(exact).first(2)).size() == 1);
  }
}

TEST_CASE("chunker: rejects chunk_tokens == 0", "[unit]") {
  CHECK_THROWS_AS(kvtier::chunker<>(kvtier::key_namespace{.chunk_tokens = 0}), std::invalid_argument);
}

namespace {
// A deliberately weak hash that satisfies the concept: chunker must use it.
struct sum_hash {
  static constexpr std::string_view name = "sum";
  static kvtier::chunk_key chain(const kvtier::chunk_key& prev, std::span<const std::byte> bytes) {
    std::uint64_t s = prev.lo + 1;
    for (std::byte b : bytes) s += static_cast<std::uint64_t>(b);
    return {bytes.size(), s};
  }
};
static_assert(kvtier::chunk_hash_function<kvtier::xxh3_128>);
static_assert(kvtier::chunk_hash_function<sum_hash>);
static_assert(!kvtier::chunk_hash_function<int>);
}  // namespace

TEST_CASE("chunker: the hash is a template parameter", "[unit]") {
  const kvtier::key_namespace ns{.chunk_tokens = 2};
  kvtier::chunker<sum_hash> ch(ns);
  const std::vector<kvtier::token_id> t{1, 2, 3, 4};
  const auto keys = ch.keys(t);
  REQUIRE(keys.size() == 2);
  CHECK(keys[0] == sum_hash::chain(ch.root(), std::as_bytes(std::span(t).first(2))));
  CHECK(keys[0].hi == 8);  // 2 tokens x 4 bytes
  CHECK(keys[1].lo == keys[0].lo + 1 + 7);
}

TEST_CASE("chunker: key text is stable and unambiguous", "[unit]") {
  const kvtier::chunk_key k{0x0123456789abcdefull, 0xfedcba9876543210ull};
  CHECK(k.to_hex() == "0123456789abcdeffedcba9876543210");
  char buf[33];
  buf[32] = 'X';
  k.to_hex(buf);
  CHECK(std::string(buf, 32) == k.to_hex());
  CHECK(buf[32] == 'X');  // writes exactly 32 characters
  CHECK(kvtier::chunk_key{}.to_hex() == std::string(32, '0'));
  const kvtier::key_namespace ns{.model = "m"};
  const std::string name = kvtier::remote_key_text(ns, k);
  CHECK(name == "kvtier:" + ns.text() + ":0123456789abcdeffedcba9876543210");
  CHECK(ns.text().size() == 16);
  // Ordered and hashable.
  CHECK(kvtier::chunk_key{1, 0} > kvtier::chunk_key{0, 9});
  CHECK(std::hash<kvtier::chunk_key>{}(k) == kvtier::chunk_key_hash{}(k));
}
