// Chunker key material: LoRA adapter, tenant salt and media items folded into the chain, and
// (where kvtier::openssl is built) the SHA-256 chain.
#include <catch2/catch.hpp>

#include <cstring>
#include <numeric>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "kvtier/chunker.hpp"
#ifdef KVTIER_TEST_HAS_OPENSSL
#include "kvtier/chunk_hash_openssl.hpp"
#endif

using kvtier::chunk_key;
using kvtier::key_material;
using kvtier::media_item;

namespace {

std::vector<kvtier::token_id> iota_tokens(std::size_t n, kvtier::token_id first = 1) {
  std::vector<kvtier::token_id> t(n);
  std::iota(t.begin(), t.end(), first);
  return t;
}

const kvtier::key_namespace ns{.model = "m", .kv_format = "fp8", .chunk_tokens = 16, .ownership = "mod:2"};

// Every key of a differs from every key of b.
bool disjoint(const std::vector<chunk_key>& a, const std::vector<chunk_key>& b) {
  std::set<chunk_key> s(a.begin(), a.end());
  for (const chunk_key& k : b)
    if (s.count(k)) return false;
  return true;
}

}  // namespace

TEST_CASE("chunker material: empty material gives the plain keys", "[unit]") {
  const kvtier::chunker<> ch(ns, kvtier::tail_policy::hash_partial);
  const auto t = iota_tokens(16 * 5 + 3);
  CHECK(ch.keys(t, key_material{}) == ch.keys(t));
  CHECK(ch.root(key_material{}) == ch.root());
}

TEST_CASE("chunker material: adapter and tenant salt separate every key", "[unit]") {
  const kvtier::chunker<> ch(ns);
  const auto t = iota_tokens(16 * 6);
  const auto base = ch.keys(t);
  const auto lora_a = ch.keys(t, {.adapter = "lora-a"});
  const auto lora_b = ch.keys(t, {.adapter = "lora-b"});
  const auto tenant_1 = ch.keys(t, {.tenant_salt = "tenant-1"});
  const auto tenant_2 = ch.keys(t, {.tenant_salt = "tenant-2"});
  CHECK(lora_a == ch.keys(t, {.adapter = "lora-a"}));  // deterministic
  for (const auto* a : {&base, &lora_a, &lora_b, &tenant_1, &tenant_2})
    for (const auto* b : {&base, &lora_a, &lora_b, &tenant_1, &tenant_2})
      if (a != b) CHECK(disjoint(*a, *b));
  // Fields are length-prefixed: moving bytes between adapter and salt changes the keys.
  CHECK(disjoint(ch.keys(t, {.adapter = "ab", .tenant_salt = "c"}),
                 ch.keys(t, {.adapter = "a", .tenant_salt = "bc"})));
  CHECK(disjoint(ch.keys(t, {.adapter = "x"}), ch.keys(t, {.tenant_salt = "x"})));
}

TEST_CASE("chunker material: a media item changes its chunks and every later one", "[unit]") {
  const kvtier::chunker<> ch(ns, kvtier::tail_policy::hash_partial);
  const auto t = iota_tokens(16 * 6 + 5);                                    // 6 full chunks and a tail
  const media_item cat{.offset = 40, .length = 10, .content_hash = {1, 2}};  // chunks 2 and 3
  const media_item dog{.offset = 40, .length = 10, .content_hash = {1, 3}};
  const auto plain = ch.keys(t);
  const auto with_cat = ch.keys(t, {.media = std::span(&cat, 1)});
  const auto with_dog = ch.keys(t, {.media = std::span(&dog, 1)});
  REQUIRE(with_cat.size() == plain.size());
  for (std::size_t c = 0; c < plain.size(); ++c) {
    INFO("chunk " << c);
    if (c < 2) {
      CHECK(with_cat[c] == plain[c]);  // before the image: shared with the text-only prompt
      CHECK(with_dog[c] == plain[c]);
    } else {
      CHECK(with_cat[c] != plain[c]);
      CHECK(with_cat[c] != with_dog[c]);  // same placeholder tokens, other pixels
    }
  }
  // The same image at another position is another prompt.
  const media_item cat_later{.offset = 41, .length = 10, .content_hash = {1, 2}};
  CHECK(ch.keys(t, {.media = std::span(&cat_later, 1)})[2] != with_cat[2]);
  // An item in the tail only changes the tail key.
  const media_item tail_item{.offset = 97, .length = 2, .content_hash = {9, 9}};
  const auto with_tail = ch.keys(t, {.media = std::span(&tail_item, 1)});
  CHECK(std::equal(plain.begin(), plain.end() - 1, with_tail.begin()));
  CHECK(with_tail.back() != plain.back());
}

TEST_CASE("chunker material: media order does not matter; extend() continues with media", "[unit]") {
  const kvtier::chunker<> ch(ns);
  const auto t = iota_tokens(16 * 6);
  const media_item items[] = {{.offset = 3, .length = 20, .content_hash = {5, 6}},
                              {.offset = 70, .length = 4, .content_hash = {7, 8}}};
  const media_item reversed[] = {items[1], items[0]};
  const auto keys = ch.keys(t, {.tenant_salt = "s", .media = items});
  CHECK(keys == ch.keys(t, {.tenant_salt = "s", .media = reversed}));
  // Continue after chunk 2 with the item offsets counted from there: the same keys.
  std::vector<chunk_key> cont;
  const media_item rest[] = {{.offset = 70 - 32, .length = 4, .content_hash = {7, 8}}};
  ch.extend(keys[1], std::span(t).subspan(32), rest, cont);
  CHECK(std::equal(cont.begin(), cont.end(), keys.begin() + 2));
}

TEST_CASE("chunker material: a media record can never be taken for token bytes", "[unit]") {
  // With 8-token chunks a record of 32 bytes would be one chunk of tokens: a prompt that put
  // those 8 tokens before the image chunk's tokens would then get the image chunk's key. The
  // record's tag byte (33 bytes, not a multiple of 4) rules that out.
  const kvtier::key_namespace small{.model = "m", .chunk_tokens = 8};
  const kvtier::chunker<> ch(small);
  const auto t = iota_tokens(16);
  const media_item img{.offset = 8, .length = 8, .content_hash = {0x1111, 0x2222}};
  const auto with_img = ch.keys(t, {.media = std::span(&img, 1)});
  // The record of chunk 1 without the tag: (offset - 8 = 0, length 8, hash hi, hash lo).
  const std::uint64_t words[4] = {0, 8, 0x1111, 0x2222};
  std::vector<kvtier::token_id> forged(t.begin(), t.begin() + 8);
  const auto* w = reinterpret_cast<const kvtier::token_id*>(words);
  forged.insert(forged.end(), w, w + 8);
  forged.insert(forged.end(), t.begin() + 8, t.end());
  const auto forged_keys = ch.keys(forged);
  CHECK(std::find(forged_keys.begin(), forged_keys.end(), with_img[1]) == forged_keys.end());
}

TEST_CASE("chunker material: media items outside the prompt are refused by name", "[unit]") {
  const kvtier::chunker<> ch(ns);
  const auto t = iota_tokens(32);
  const media_item past{.offset = 30, .length = 5};
  const media_item empty{.offset = 3, .length = 0};
  CHECK_THROWS_WITH(ch.keys(t, {.media = std::span(&past, 1)}),
                    Catch::Contains("media item at token 30 of length 5") && Catch::Contains("32 tokens"));
  CHECK_THROWS_AS(ch.keys(t, {.media = std::span(&empty, 1)}), std::invalid_argument);
}

#ifdef KVTIER_TEST_HAS_OPENSSL
TEST_CASE("chunker material: the SHA-256 chain", "[unit]") {
  // SHA-256(16 zero bytes || "abc"), first 16 bytes, read as two little-endian words
  // (python3: hashlib.sha256(bytes(16) + b"abc").digest()[:16]).
  const std::string abc = "abc";
  const chunk_key k = kvtier::sha256_128::chain(chunk_key{}, std::as_bytes(std::span(abc)));
  CHECK(k.to_hex() == "76b932d2f67f7e270d215dd0e8664a3f");
  const kvtier::chunker<kvtier::sha256_128> sha(ns);
  const kvtier::chunker<> xxh(ns);
  const auto t = iota_tokens(16 * 4);
  const media_item img{.offset = 20, .length = 4, .content_hash = {3, 4}};
  CHECK(disjoint(sha.keys(t), xxh.keys(t)));
  CHECK(disjoint(sha.keys(t, {.tenant_salt = "a"}), sha.keys(t, {.tenant_salt = "b"})));
  const auto plain = sha.keys(t);
  const auto with_img = sha.keys(t, {.media = std::span(&img, 1)});
  CHECK(with_img[0] == plain[0]);
  CHECK(with_img[1] != plain[1]);
}
#endif
