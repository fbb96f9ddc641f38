// kvtier/chunker.hpp: token ids -> prefix-chained chunk keys.
//
// A prompt is cut into chunks of `chunk_tokens` tokens. Key c identifies the
// whole prefix up to the end of chunk c, because it chains the previous key:
//
//   key[-1] = root(namespace)
//   key[c]  = H(key[c-1], little-endian bytes of tokens [c*T, (c+1)*T))
//
// The namespace (model, KV format, chunk size, layout version, ownership
// geometry) is folded into the root, so two deployments never share keys.
//
//   kvtier::key_namespace ns{.model = "glm-5.3-fp8", .kv_format = "mla-fp8",
//                            .chunk_tokens = 256, .ownership = "mod:8"};
//   kvtier::chunker<> chunk(ns);
//   std::vector<kvtier::chunk_key> keys = chunk.keys(tokens);   // one per full chunk
//   std::string redis_key = kvtier::remote_key_text(ns, keys[0]);
//
// Per-request key material (a LoRA adapter, a tenant salt, images) is folded into the chain:
//
//   const kvtier::media_item image{.offset = 40, .length = 576, .content_hash = pixels_hash};
//   auto keys = chunk.keys(tokens, {.adapter = "sql-lora-v2", .tenant_salt = tenant.salt,
//                                   .media = std::span(&image, 1)});
//
// Where tenants share a cache and must not be able to collide each other's keys on purpose,
// use the SHA-256 chain of kvtier/chunk_hash_openssl.hpp (kvtier::openssl) instead of XXH3.
#pragma once

#include <algorithm>
#include <array>
#include <bit>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "kvtier/detail/xxhash.hpp"

namespace kvtier {

static_assert(std::endian::native == std::endian::little,
              "kvtier hashes token ids as little-endian bytes; big-endian hosts are not supported");

/// A token id. 32 bits hold every vocabulary in use (151,552 for GLM).
using token_id = std::uint32_t;

/// A 128-bit chunk key. Value type; ordered and hashable.
struct chunk_key {
  std::uint64_t hi = 0;
  std::uint64_t lo = 0;

  friend constexpr auto operator<=>(const chunk_key&, const chunk_key&) = default;

  /// 32 lowercase hex digits, `hi` first. Stable across processes and hosts.
  void to_hex(char* out32) const noexcept {
    constexpr char digits[] = "0123456789abcdef";
    for (int i = 0; i < 16; ++i) out32[i] = digits[(hi >> (60 - 4 * i)) & 0xF];
    for (int i = 0; i < 16; ++i) out32[16 + i] = digits[(lo >> (60 - 4 * i)) & 0xF];
  }
  std::string to_hex() const {
    std::string s(32, '\0');
    to_hex(s.data());
    return s;
  }
};

/// std::unordered_map-compatible hash of a chunk_key (the key is already uniform).
struct chunk_key_hash {
  std::size_t operator()(const chunk_key& k) const noexcept {
    return static_cast<std::size_t>(k.lo ^ (k.hi * 0x9E3779B97F4A7C15ull));
  }
};

/// A chaining hash: given the previous key and a chunk's bytes, the next key.
template <class H>
concept chunk_hash_function = requires(const chunk_key& prev, std::span<const std::byte> bytes) {
  { H::chain(prev, bytes) } -> std::same_as<chunk_key>;
  { H::name } -> std::convertible_to<std::string_view>;
};

/// Default hash: XXH3-128 from the system's xxHash, inlined.
///
/// chain(prev, bytes) = XXH3_128bits_withSeed(bytes, seed = prev.lo), with prev.hi
/// xor-ed into the result's high half. Different prev.lo give independent seeds;
/// equal prev.lo with different prev.hi give different results, so no two distinct
/// (prev, bytes) pairs are mapped together by construction other than by a genuine
/// 128-bit collision. One pass over the bytes, no copy, no allocation.
struct xxh3_128 {
  static constexpr std::string_view name = "xxh3-128";
  static chunk_key chain(const chunk_key& prev, std::span<const std::byte> bytes) noexcept {
    XXH128_hash_t h = XXH3_128bits_withSeed(bytes.data(), bytes.size(), prev.lo);
    return chunk_key{h.high64 ^ prev.hi, h.low64};
  }
};

/// Everything that must differ for two deployments' KV bytes to differ.
struct key_namespace {
  std::string model{};               ///< model fingerprint (name + weights revision)
  std::string kv_format{};           ///< KV dtype / layout, e.g. "mla-latent-fp8"
  std::uint32_t chunk_tokens = 256;  ///< tokens per chunk
  std::uint32_t layout_version = 1;  ///< bumped when the stored byte layout changes
  std::string ownership = "mod:1";   ///< ownership geometry, e.g. "mod:8"

  /// Unambiguous serialisation: each field is length-prefixed, so no two
  /// different namespaces serialise to the same bytes.
  std::string canonical() const {
    std::string out = "kvtier-namespace/1";
    auto field = [&out](std::string_view name, std::string_view value) {
      out += '\n';
      out += name;
      out += '=';
      out += std::to_string(value.size());
      out += ':';
      out += value;
    };
    field("model", model);
    field("kv_format", kv_format);
    field("chunk_tokens", std::to_string(chunk_tokens));
    field("layout_version", std::to_string(layout_version));
    field("ownership", ownership);
    return out;
  }

  /// The root key: XXH3-128 of canonical() with the fixed seed root_seed.
  chunk_key root() const noexcept {
    const std::string c = canonical();
    XXH128_hash_t h = XXH3_128bits_withSeed(c.data(), c.size(), root_seed);
    return chunk_key{h.high64, h.low64};
  }

  /// 64-bit fingerprint of the namespace (the root's high half); stored in value
  /// headers so a value written under another namespace is rejected.
  std::uint64_t fingerprint() const noexcept { return root().hi; }

  /// 16 hex digits of fingerprint(); the namespace part of remote key names.
  std::string text() const { return chunk_key{fingerprint(), 0}.to_hex().substr(0, 16); }

  /// "kvtier\0\1" read as a big-endian integer: fixed forever, documented above.
  static constexpr std::uint64_t root_seed = 0x6b76746965720001ull;
};

/// The namespace part of every remote key name, "kvtier:<namespace 16 hex>:".
/// Hashes the namespace: compute it once (remote_store does) and pass it to
/// remote_key_text(prefix, key) for each key.
inline std::string remote_key_prefix(const key_namespace& ns) {
  std::string out = "kvtier:";
  out += ns.text();
  out += ':';
  return out;
}

/// The remote store's name for a chunk, "<prefix><key 32 hex>", from a prefix made
/// by remote_key_prefix(). No hashing: one allocation per key.
inline std::string remote_key_text(std::string_view prefix, const chunk_key& key) {
  std::string out;
  out.reserve(prefix.size() + 32);
  out += prefix;
  out.resize(prefix.size() + 32);
  key.to_hex(out.data() + prefix.size());
  return out;
}

/// The remote store's name for a chunk: "kvtier:<namespace 16 hex>:<key 32 hex>".
/// Convenience form that hashes the namespace on every call.
inline std::string remote_key_text(const key_namespace& ns, const chunk_key& key) {
  return remote_key_text(remote_key_prefix(ns), key);
}

namespace detail {
inline void append_le(std::string& s, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) s.push_back(static_cast<char>(v >> (8 * i)));
}
}  // namespace detail

/// What to do with the tokens after the last full chunk.
enum class tail_policy {
  drop,          ///< no key (the default: a partial chunk is never stored)
  hash_partial,  ///< one more key over the shorter tail
};

/// An input that is not text, placed in the prompt: the tokens [offset, offset + length) stand
/// for it (an image's placeholder tokens), and content_hash identifies its content (a hash of
/// the pixels, computed by the caller). Two prompts with the same placeholder tokens but
/// different images must not share keys; content_hash is what tells them apart.
struct media_item {
  std::uint64_t offset = 0;  ///< first token of the item in the prompt
  std::uint64_t length = 0;  ///< tokens it occupies (> 0)
  chunk_key content_hash{};  ///< 128 bits of the content's hash
};

/// Per-request key material beyond the tokens, folded into the chain:
///  - adapter: the LoRA adapter id (its KV differs from the base model's); "" = none;
///  - tenant_salt: separates tenants' keys: requests with different salts never share a key,
///    so no tenant can read or overwrite another's entries; "" = one shared key space;
///  - media: multimodal items; each is folded into every chunk its tokens overlap, so the
///    keys of those chunks and of all later chunks depend on the content.
/// A default key_material gives exactly the keys of chunker::keys(tokens).
struct key_material {
  std::string_view adapter{};
  std::string_view tenant_salt{};
  std::span<const media_item> media{};
};

/// Cuts token sequences into chained chunk keys.
template <chunk_hash_function Hash = xxh3_128>
class chunker {
 public:
  explicit chunker(key_namespace ns, tail_policy tail = tail_policy::drop)
      : ns_(std::move(ns)), root_(ns_.root()), tail_(tail) {
    if (ns_.chunk_tokens == 0) throw std::invalid_argument("kvtier::chunker: chunk_tokens must be > 0");
  }

  const key_namespace& ns() const noexcept { return ns_; }
  chunk_key root() const noexcept { return root_; }
  std::size_t chunk_tokens() const noexcept { return ns_.chunk_tokens; }

  /// Number of keys keys() produces for a prompt of n tokens.
  std::size_t key_count(std::size_t n_tokens) const noexcept {
    const std::size_t full = n_tokens / ns_.chunk_tokens;
    const bool tail = tail_ == tail_policy::hash_partial && n_tokens % ns_.chunk_tokens != 0;
    return full + (tail ? 1 : 0);
  }

  /// Appends the keys of `tokens` to `out` (reuse `out` to avoid allocation).
  void keys(std::span<const token_id> tokens, std::vector<chunk_key>& out) const {
    extend(root_, tokens, out);
  }

  std::vector<chunk_key> keys(std::span<const token_id> tokens) const {
    std::vector<chunk_key> out;
    out.reserve(key_count(tokens.size()));
    keys(tokens, out);
    return out;
  }

  /// Continues a chain: keys of `tokens` as if they followed the chunk whose key
  /// is `prev` (use root() for a fresh prompt). `tokens` starts at a chunk boundary.
  void extend(chunk_key prev, std::span<const token_id> tokens, std::vector<chunk_key>& out) const {
    extend(prev, tokens, {}, out);
  }

  /// The root of a request with key material: root() with the adapter id and tenant salt
  /// folded in (root() itself when both are empty).
  chunk_key root(const key_material& m) const {
    if (m.adapter.empty() && m.tenant_salt.empty()) return root_;
    // Length-prefixed fields, padded to a length of 2 mod 4: token chunks are 0 mod 4 bytes
    // and media records 1 mod 4, so this input never equals another chain step's input.
    std::string r = "kvtier-material/1";
    for (std::string_view f : {m.adapter, m.tenant_salt}) {
      detail::append_le(r, f.size());
      r += f;
    }
    while (r.size() % 4 != 2) r += '\0';
    return Hash::chain(root_, std::as_bytes(std::span<const char>(r)));
  }

  /// Keys of a prompt with key material (see key_material). Throws std::invalid_argument for
  /// a media item that is empty or reaches past the prompt.
  void keys(std::span<const token_id> tokens, const key_material& m, std::vector<chunk_key>& out) const {
    extend(root(m), tokens, m.media, out);
  }

  std::vector<chunk_key> keys(std::span<const token_id> tokens, const key_material& m) const {
    std::vector<chunk_key> out;
    out.reserve(key_count(tokens.size()));
    keys(tokens, m, out);
    return out;
  }

  /// extend() with media items; their offsets count from the start of `tokens` (a chunk
  /// boundary), so a chain continued here equals the chain of the whole prompt.
  void extend(chunk_key prev, std::span<const token_id> tokens, std::span<const media_item> media,
              std::vector<chunk_key>& out) const {
    for (const media_item& it : media)
      if (it.length == 0 || it.offset > tokens.size() || it.length > tokens.size() - it.offset)
        throw std::invalid_argument("kvtier::chunker: media item at token " + std::to_string(it.offset) +
                                    " of length " + std::to_string(it.length) +
                                    " is empty or reaches past the prompt's " +
                                    std::to_string(tokens.size()) + " tokens");
    // Sorted once, so a chunk's record does not depend on the order the caller listed items in.
    std::vector<media_item> sorted(media.begin(), media.end());
    std::sort(sorted.begin(), sorted.end(), [](const media_item& a, const media_item& b) {
      return std::tie(a.offset, a.length, a.content_hash) < std::tie(b.offset, b.length, b.content_hash);
    });
    const std::size_t t = ns_.chunk_tokens;
    std::string record;  // media of the current chunk; no allocation without media
    const auto step = [&](std::size_t begin, std::size_t end) {
      if (!sorted.empty()) prev = fold_media(prev, sorted, begin, end, record);
      return Hash::chain(prev, std::as_bytes(tokens.subspan(begin, end - begin)));
    };
    std::size_t i = 0;
    for (; i + t <= tokens.size(); i += t) {
      prev = step(i, i + t);
      out.push_back(prev);
    }
    if (tail_ == tail_policy::hash_partial && i < tokens.size()) out.push_back(step(i, tokens.size()));
  }

 private:
  // Folds the media items overlapping tokens [begin, end) into prev (prev unchanged when none).
  // Record: per item, in sorted order, (offset - begin mod 2^64, length, hash.hi, hash.lo) as
  // 8-byte little-endian words, then one tag byte: 32k + 1 bytes, 1 mod 4, unlike any token
  // chunk. Offsets relative to the chunk keep extend() from any chunk boundary consistent.
  static chunk_key fold_media(chunk_key prev, std::span<const media_item> sorted, std::size_t begin,
                              std::size_t end, std::string& record) {
    record.clear();
    for (const media_item& it : sorted)
      if (it.offset < end && it.offset + it.length > begin)
        for (std::uint64_t w :
             {std::uint64_t{it.offset - begin}, it.length, it.content_hash.hi, it.content_hash.lo})
          detail::append_le(record, w);
    if (record.empty()) return prev;
    record += 'M';
    return Hash::chain(prev, std::as_bytes(std::span<const char>(record)));
  }

  key_namespace ns_;
  chunk_key root_;
  tail_policy tail_;
};

}  // namespace kvtier

template <>
struct std::hash<kvtier::chunk_key> : kvtier::chunk_key_hash {};
