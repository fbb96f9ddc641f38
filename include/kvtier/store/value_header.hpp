// kvtier/store/value_header.hpp: the frame in front of every value a remote store holds.
//
// Two format versions. Version 1 (below) has one checksum for the whole payload. Version 2 (see
// "format 2" further down) has one checksum per group of payload bytes (a group = a few layers of
// a layer-major chunk, kvtier/kv_copy.hpp), so a group can be verified, and used, as soon as its
// bytes are in, before the whole value arrived; a flipped byte fails exactly its own group.
// A reader reads the version it is configured for (value_format); a value of the other version
// has another total length and is refused (remote_store counts it as other_format).
//
// A stored version-1 value is `header (56 bytes) + payload`. The header names what the payload is
// (namespace fingerprint, chunk key), how long it is and its XXH3-64 checksum, and carries a
// checksum of its own, so a reader can refuse a value before trusting a single byte of it:
//
//   offset size  field (little-endian)
//        0    4  magic "KVTH"
//        4    2  format version (1)
//        6    2  header size (56)
//        8    8  namespace fingerprint (key_namespace::fingerprint())
//       16   16  chunk key (hi, lo)
//       32    8  payload length
//       40    8  XXH3-64 of the payload
//       48    8  XXH3-64 of bytes [0, 48) (the header's own checksum)
//
// check_value_header() needs only the 56 header bytes, so a reader can run it before any
// payload byte reaches the caller's buffer (remote_store does, through a parser gate): a value
// of another namespace, chunk key or length, or with a damaged header, is refused without
// touching that buffer. payload_matches() is the one check that needs the payload itself: a
// bit flip inside the payload (header intact) is found only after the payload bytes were read
// into the buffer; the reader must then report the value corrupt (never a hit), and the buffer's
// contents are not to be used.
//
//   auto hdr = kvtier::encode_value_header(ns.fingerprint(), key, payload);   // std::array
//   // store hdr followed by payload (two scatter-gather parts, no concatenation)
//   // reading: header into a small buffer, check it, only then payload into the caller's span
//   using kvtier::header_check;
//   if (kvtier::check_value_header(hdr_bytes, ns.fingerprint(), key, dst.size()) != header_check::ok)
//     return corrupt;                                  // dst untouched
//   read_payload_into(dst);
//   if (!kvtier::payload_matches(hdr_bytes, dst)) return corrupt;  // dst holds bad bytes: unused
//   /* dst is the stored chunk */
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string_view>
#include <vector>

#include "kvtier/detail/xxhash.hpp"

#include "kvtier/chunker.hpp"

namespace kvtier {

/// Layout constants of the value header.
struct value_header {
  static constexpr std::size_t size = 56;
  static constexpr std::uint32_t magic = 0x4854564bu;  // "KVTH" read little-endian
  static constexpr std::uint16_t version = 1;
};

using value_header_bytes = std::array<std::byte, value_header::size>;

/// Outcome of check_value_header().
enum class header_check : std::uint8_t {
  ok,
  bad_magic,        ///< not a kvtier value
  bad_version,      ///< a format version (or header size) this reader does not know
  header_corrupt,   ///< the header's own checksum does not match
  wrong_namespace,  ///< written by another deployment (namespace fingerprint differs)
  wrong_key,        ///< the value of another chunk
  wrong_length,     ///< payload length differs from what the caller expects
  wrong_groups,     ///< format 2: checksum group size differs from the reader's
};

constexpr std::string_view to_string(header_check c) noexcept {
  switch (c) {
    case header_check::ok:
      return "ok";
    case header_check::bad_magic:
      return "bad magic";
    case header_check::bad_version:
      return "unknown format version";
    case header_check::header_corrupt:
      return "header checksum mismatch";
    case header_check::wrong_namespace:
      return "wrong namespace";
    case header_check::wrong_key:
      return "wrong chunk key";
    case header_check::wrong_length:
      return "wrong payload length";
    case header_check::wrong_groups:
      return "wrong checksum group size";
  }
  return "unknown";
}

namespace detail {
inline void vh_put(value_header_bytes& b, std::size_t at, std::uint64_t v, std::size_t n) noexcept {
  for (std::size_t i = 0; i < n; ++i) b[at + i] = static_cast<std::byte>(v >> (8 * i));
}
inline std::uint64_t vh_get(std::span<const std::byte> b, std::size_t at, std::size_t n) noexcept {
  std::uint64_t v = 0;
  for (std::size_t i = 0; i < n; ++i) v |= static_cast<std::uint64_t>(b[at + i]) << (8 * i);
  return v;
}
inline std::uint64_t vh_xxh3(const void* p, std::size_t n) noexcept { return xxh3_64(p, n); }
}  // namespace detail

/// The header of a payload of `length` bytes whose XXH3-64 is `payload_hash` (computed by the
/// caller, e.g. while it copied the bytes: value_hasher), stored as chunk `key`.
inline value_header_bytes encode_value_header(std::uint64_t ns_fingerprint, const chunk_key& key,
                                              std::size_t length, std::uint64_t payload_hash) noexcept {
  value_header_bytes b{};
  detail::vh_put(b, 0, value_header::magic, 4);
  detail::vh_put(b, 4, value_header::version, 2);
  detail::vh_put(b, 6, value_header::size, 2);
  detail::vh_put(b, 8, ns_fingerprint, 8);
  detail::vh_put(b, 16, key.hi, 8);
  detail::vh_put(b, 24, key.lo, 8);
  detail::vh_put(b, 32, length, 8);
  detail::vh_put(b, 40, payload_hash, 8);
  detail::vh_put(b, 48, detail::vh_xxh3(b.data(), 48), 8);
  return b;
}

/// The header for `payload` stored as chunk `key` of the namespace with `ns_fingerprint`.
inline value_header_bytes encode_value_header(std::uint64_t ns_fingerprint, const chunk_key& key,
                                              std::span<const std::byte> payload) noexcept {
  return encode_value_header(ns_fingerprint, key, payload.size(),
                             detail::vh_xxh3(payload.data(), payload.size()));
}

/// Checks everything in the header that can be checked before the payload is trusted.
inline header_check check_value_header(std::span<const std::byte, value_header::size> b,
                                       std::uint64_t ns_fingerprint, const chunk_key& key,
                                       std::size_t expected_length) noexcept {
  using detail::vh_get;
  if (vh_get(b, 0, 4) != value_header::magic) return header_check::bad_magic;
  if (vh_get(b, 4, 2) != value_header::version || vh_get(b, 6, 2) != value_header::size)
    return header_check::bad_version;
  if (vh_get(b, 48, 8) != detail::vh_xxh3(b.data(), 48)) return header_check::header_corrupt;
  if (vh_get(b, 8, 8) != ns_fingerprint) return header_check::wrong_namespace;
  if (vh_get(b, 16, 8) != key.hi || vh_get(b, 24, 8) != key.lo) return header_check::wrong_key;
  if (vh_get(b, 32, 8) != expected_length) return header_check::wrong_length;
  return header_check::ok;
}

/// True when `payload`'s XXH3-64 equals the checksum in header `b` (after check_value_header).
inline bool payload_matches(std::span<const std::byte, value_header::size> b,
                            std::span<const std::byte> payload) noexcept {
  return detail::vh_get(b, 40, 8) == detail::vh_xxh3(payload.data(), payload.size());
}

// ---- format 2: one checksum per group ------------------------------------------------------------
//
//   offset size  field (little-endian)
//        0    4  magic "KVTH"
//        4    2  format version (2)
//        6    2  header size (64 + 8 * groups)
//        8    8  namespace fingerprint
//       16   16  chunk key (hi, lo)
//       32    8  payload length
//       40    8  group bytes g (group i = payload bytes [i*g, min((i+1)*g, length)))
//       48    8  XXH3-64 of the checksum table (bytes [64, header size))
//       56    8  XXH3-64 of bytes [0, 56) (the header's own checksum; it covers the table's)
//       64  8*G  XXH3-64 of each group, G = ceil(length / g) (0 for an empty payload)
//
// With a layer-major chunk of L layers of b bytes, g = k * b makes each group k layers
// (layer_group_bytes() in kvtier/kv_copy.hpp).
//
//   kvtier::value_format f = kvtier::value_format::v2(4 * layer_bytes);
//   std::vector<std::byte> hdr(f.header_size(payload.size()));
//   kvtier::encode_value_header(f, ns.fingerprint(), key, payload, hdr);
//   // reading: check_value_header(f, hdr, ...) before any payload byte, then per group as it lands:
//   if (!kvtier::group_matches(hdr, g, f.group(payload, g))) /* group g is bad */;

/// The format a store writes and expects: version 1 (one checksum) or 2 (one per group).
struct value_format {
  std::uint16_t version = 1;
  std::uint64_t group_bytes = 0;  ///< version 2: payload bytes per group; 0 = one group for the whole payload

  static constexpr std::size_t v2_fixed = 64;
  static constexpr std::size_t max_groups = (0xffff - v2_fixed) / 8;  ///< header size fits 16 bits

  static constexpr value_format v1() noexcept { return {1, 0}; }
  static constexpr value_format v2(std::uint64_t group_bytes) noexcept { return {2, group_bytes}; }

  /// Group size used for a payload of `length` bytes (the whole payload when group_bytes is 0).
  constexpr std::uint64_t group_size(std::size_t length) const noexcept {
    return group_bytes != 0 ? group_bytes : (length == 0 ? 1 : length);
  }
  /// Checksum groups of a payload of `length` bytes (1 in version 1).
  constexpr std::size_t groups(std::size_t length) const noexcept {
    if (version == 1) return 1;
    const std::uint64_t g = group_size(length);
    return static_cast<std::size_t>(length / g + (length % g != 0));
  }
  /// Header bytes in front of a payload of `length` bytes; 0 when version 2 would need more
  /// than max_groups groups (the format cannot describe it: choose larger groups).
  constexpr std::size_t header_size(std::size_t length) const noexcept {
    if (version == 1) return value_header::size;
    const std::size_t n = groups(length);
    return n > max_groups ? 0 : v2_fixed + 8 * n;
  }
  /// Payload bytes of group i (the last group may be shorter).
  template <class Byte>
  std::span<Byte> group(std::span<Byte> payload, std::size_t i) const noexcept {
    if (version == 1) return payload;
    const std::uint64_t g = group_size(payload.size()), at = i * g;
    return payload.subspan(at, std::min<std::uint64_t>(g, payload.size() - at));
  }
  /// Payload bytes covered by the first k groups of a payload of `length` bytes (all of it once
  /// k reaches groups(length); version 1: all of it from k = 1). What "groups [0, k) landed" means
  /// in bytes, e.g. for remote_store::get_by_group's per-round report.
  constexpr std::size_t groups_end(std::size_t length, std::size_t k) const noexcept {
    if (version == 1 || k >= groups(length)) return k == 0 ? 0 : length;
    return static_cast<std::size_t>(k * group_size(length));
  }
  /// True when this is a format a reader can use: version 1, or 2 with an encodable group count.
  constexpr bool valid_for(std::size_t length) const noexcept {
    return (version == 1 && group_bytes == 0) || (version == 2 && header_size(length) != 0);
  }
};

/// The checksums of one payload in format `f`, as its header carries them: one (version 1) or
/// one per group (version 2), in order. value_hasher computes them while the bytes pass by.
struct value_digest {
  value_format format{};
  std::size_t length = 0;
  std::vector<std::uint64_t> hashes;

  /// True when it describes a payload of `length` bytes in format `f` (every checksum present).
  bool fits(const value_format& f, std::size_t bytes) const noexcept {
    return format.version == f.version && format.group_bytes == f.group_bytes && length == bytes &&
           hashes.size() == f.groups(bytes);
  }
};

namespace detail {
// Format 2's header around the checksum table already at out[64, size): fixed fields and checksums.
inline void vh_finish_v2(std::span<std::byte> out, std::size_t size, std::uint64_t ns_fingerprint,
                         const chunk_key& key, std::size_t length, std::uint64_t group_size) noexcept {
  auto put = [&](std::size_t at, std::uint64_t v, std::size_t n) {
    for (std::size_t i = 0; i < n; ++i) out[at + i] = static_cast<std::byte>(v >> (8 * i));
  };
  put(0, value_header::magic, 4);
  put(4, 2, 2);
  put(6, size, 2);
  put(8, ns_fingerprint, 8);
  put(16, key.hi, 8);
  put(24, key.lo, 8);
  put(32, length, 8);
  put(40, group_size, 8);
  put(48, vh_xxh3(out.data() + value_format::v2_fixed, size - value_format::v2_fixed), 8);
  put(56, vh_xxh3(out.data(), 56), 8);
}
inline void vh_put_at(std::span<std::byte> out, std::size_t at, std::uint64_t v) noexcept {
  for (std::size_t i = 0; i < 8; ++i) out[at + i] = static_cast<std::byte>(v >> (8 * i));
}
}  // namespace detail

/// Writes the header of a payload whose checksums are `d` (d.format, d.length) into `out`.
/// Returns the bytes written, or 0 when out is too short, the format cannot describe the payload
/// or `d` lacks a checksum.
inline std::size_t encode_value_header(const value_digest& d, std::uint64_t ns_fingerprint,
                                       const chunk_key& key, std::span<std::byte> out) noexcept {
  const value_format& f = d.format;
  const std::size_t size = f.header_size(d.length);
  if (!f.valid_for(d.length) || out.size() < size || !d.fits(f, d.length)) return 0;
  if (f.version == 1) {
    const value_header_bytes h = encode_value_header(ns_fingerprint, key, d.length, d.hashes[0]);
    std::memcpy(out.data(), h.data(), h.size());
    return h.size();
  }
  for (std::size_t i = 0; i < d.hashes.size(); ++i)
    detail::vh_put_at(out, value_format::v2_fixed + 8 * i, d.hashes[i]);
  detail::vh_finish_v2(out, size, ns_fingerprint, key, d.length, f.group_size(d.length));
  return size;
}

/// A payload's checksums in format `f`, computed as its bytes pass by (in order, any split): the
/// writer's half of value_check, e.g. inside the gather that copies a chunk into staging, so the
/// put that follows needs no pass of its own (remote_store::put_prehashed).
///
///   kvtier::value_hasher h;
///   h.begin(store.format(), value.size());
///   for (/* each piece copied into value, in order */) h.update(piece);
///   kvtier::value_digest d = h.digest();           // d.hashes: one per group
class value_hasher {
 public:
  /// A new payload of `length` bytes in format `f`, its checksums kept for digest().
  void begin(const value_format& f, std::size_t length) {
    digest_.hashes.assign(f.groups(length), 0);
    start(f, length);
    if (length == 0 && !digest_.hashes.empty()) digest_.hashes[0] = detail::vh_xxh3(nullptr, 0);
  }
  /// begin() without keeping the checksums: update() with an on_group only (value_check).
  void start(const value_format& f, std::size_t length) noexcept {
    digest_.format = f;
    digest_.length = length;
    groups_ = f.groups(length);
    group_ = in_group_ = seen_ = 0;
    group_size_ = f.version == 1 ? (length == 0 ? 1 : length) : f.group_size(length);
    XXH3_64bits_reset(&state_);
  }

  /// The next `piece` of the payload; `on_group(i, hash)` as group i ends. Bytes past the
  /// length are counted, never hashed (complete() then says no).
  template <class OnGroup>
  void update(std::span<const std::byte> piece, OnGroup&& on_group) noexcept {
    const std::size_t length = digest_.length;
    while (!piece.empty() && group_ < groups_) {
      const std::size_t group_len = std::min<std::uint64_t>(group_size_, length - group_ * group_size_);
      const std::size_t k = std::min(piece.size(), group_len - in_group_);
      detail::xxh3_update(&state_, piece.data(), k);
      piece = piece.subspan(k);
      in_group_ += k;
      seen_ += k;
      if (in_group_ == group_len) {
        on_group(group_, static_cast<std::uint64_t>(XXH3_64bits_digest(&state_)));
        XXH3_64bits_reset(&state_);
        ++group_;
        in_group_ = 0;
      }
    }
    seen_ += piece.size();
  }
  /// update() keeping each group's checksum (after begin()).
  void update(std::span<const std::byte> piece) noexcept {
    update(piece, [this](std::size_t i, std::uint64_t h) { digest_.hashes[i] = h; });
  }

  /// Every byte of the payload (and no more) went through update().
  bool complete() const noexcept { return seen_ == digest_.length; }
  std::size_t seen() const noexcept { return seen_; }
  std::size_t groups() const noexcept { return groups_; }
  /// The checksums (valid once complete(), after begin()).
  const value_digest& digest() const noexcept { return digest_; }

 private:
  XXH3_state_t state_{};
  value_digest digest_;
  std::size_t groups_ = 0, group_ = 0, in_group_ = 0, seen_ = 0;
  std::uint64_t group_size_ = 1;
};

/// Writes the header of `payload` in format `f` into `out` (f.header_size(payload.size()) bytes).
/// Returns the bytes written, or 0 when out is too short or f cannot describe the payload.
inline std::size_t encode_value_header(const value_format& f, std::uint64_t ns_fingerprint,
                                       const chunk_key& key, std::span<const std::byte> payload,
                                       std::span<std::byte> out) noexcept {
  const std::size_t size = f.header_size(payload.size());
  if (!f.valid_for(payload.size()) || out.size() < size) return 0;
  if (f.version == 1) {
    const value_header_bytes h = encode_value_header(ns_fingerprint, key, payload);
    std::memcpy(out.data(), h.data(), h.size());
    return h.size();
  }
  for (std::size_t i = 0; i < f.groups(payload.size()); ++i) {
    const auto g = f.group(payload, i);
    detail::vh_put_at(out, value_format::v2_fixed + 8 * i, detail::vh_xxh3(g.data(), g.size()));
  }
  detail::vh_finish_v2(out, size, ns_fingerprint, key, payload.size(), f.group_size(payload.size()));
  return size;
}

/// check_value_header for format `f`: `b` must be exactly f.header_size(expected_length) bytes.
/// A value of the other version is bad_version; of another group size, wrong_groups.
inline header_check check_value_header(const value_format& f, std::span<const std::byte> b,
                                       std::uint64_t ns_fingerprint, const chunk_key& key,
                                       std::size_t expected_length) noexcept {
  using detail::vh_get;
  if (b.size() < 8 || vh_get(b, 0, 4) != value_header::magic) return header_check::bad_magic;
  if (vh_get(b, 4, 2) != f.version || vh_get(b, 6, 2) != b.size()) return header_check::bad_version;
  if (f.version == 1) {
    if (b.size() != value_header::size) return header_check::bad_version;
    return check_value_header(b.first<value_header::size>(), ns_fingerprint, key, expected_length);
  }
  if (b.size() < value_format::v2_fixed) return header_check::bad_version;
  if (vh_get(b, 56, 8) != detail::vh_xxh3(b.data(), 56) ||
      vh_get(b, 48, 8) !=
          detail::vh_xxh3(b.data() + value_format::v2_fixed, b.size() - value_format::v2_fixed))
    return header_check::header_corrupt;
  if (vh_get(b, 8, 8) != ns_fingerprint) return header_check::wrong_namespace;
  if (vh_get(b, 16, 8) != key.hi || vh_get(b, 24, 8) != key.lo) return header_check::wrong_key;
  if (vh_get(b, 32, 8) != expected_length) return header_check::wrong_length;
  if (vh_get(b, 40, 8) != f.group_size(expected_length) || b.size() != f.header_size(expected_length))
    return header_check::wrong_groups;
  return header_check::ok;
}

/// Format 2: true when `group_payload` (group i's bytes) matches its checksum in header `b`
/// (after check_value_header accepted b). Format 1 headers: the whole payload, i must be 0.
inline bool group_matches(std::span<const std::byte> b, std::size_t i,
                          std::span<const std::byte> group_payload) noexcept {
  if (b.size() == value_header::size)
    return i == 0 && payload_matches(b.first<value_header::size>(), group_payload);
  const std::size_t at = value_format::v2_fixed + 8 * i;
  return at + 8 <= b.size() &&
         detail::vh_get(b, at, 8) == detail::vh_xxh3(group_payload.data(), group_payload.size());
}

/// One value checked while its bytes arrive, so the payload is read once: header() once the
/// header bytes are in (before any payload byte is accepted), then payload() over each piece
/// as it lands (in order, any split), each group's XXH3-64 updated on bytes still hot in cache
/// and compared when the group ends. bad_group() after the last byte: the first failing group,
/// or groups() when every group matched.
///
///   kvtier::value_check c;
///   c.expect(format, ns.fingerprint(), key, dst.size());
///   if (c.header(hdr) != kvtier::header_check::ok) return corrupt;  // dst untouched
///   while (/* piece lands in dst */) c.payload(piece);
///   if (!c.payload_ok()) return corrupt;                               // group c.bad_group()
class value_check {
 public:
  /// What the value must be: its format, namespace, chunk and payload length.
  void expect(const value_format& f, std::uint64_t ns_fingerprint, const chunk_key& key,
              std::size_t length) noexcept {
    format_ = f;
    fingerprint_ = ns_fingerprint;
    key_ = key;
    length_ = length;
    header_ = {};
    verdict_ = header_check::bad_magic;
    unchecked_ = 0;
    groups_ = f.groups(length);
    bad_ = groups_;
    hasher_.start(f, length);
  }

  /// Checks the header (kept: its checksums are compared as the groups end). Returns the verdict.
  header_check header(std::span<const std::byte> h) noexcept {
    header_ = h;
    verdict_ = check_value_header(format_, h, fingerprint_, key_, length_);
    if (verdict_ == header_check::ok) {
      hasher_.start(format_, length_);
      if (length_ == 0 && format_.version == 1 && !payload_matches(h.first<value_header::size>(), {}))
        bad_ = 0;  // an empty payload's checksum is checked here: no byte will land
    }
    return verdict_;
  }
  /// The header's verdict (bad_magic before header()).
  header_check header_verdict() const noexcept { return verdict_; }

  /// The next `piece` of the payload, as it landed (after header() said ok).
  void payload(std::span<const std::byte> piece) noexcept {
    if (verdict_ != header_check::ok) {  // never after a refused header; counted, never checked
      unchecked_ += piece.size();
      return;
    }
    hasher_.update(piece, [this](std::size_t i, std::uint64_t h) {
      if (bad_ == groups_ && h != expected(i)) bad_ = i;
    });
  }

  /// Every payload byte arrived, the header was ok and every group's checksum matched.
  bool payload_ok() const noexcept {
    return verdict_ == header_check::ok && seen() == length_ && bad_ == groups_;
  }
  /// Payload bytes seen so far.
  std::size_t seen() const noexcept { return unchecked_ + hasher_.seen(); }
  /// The first group whose checksum failed, or groups() when none did (so far).
  std::size_t bad_group() const noexcept { return bad_; }
  std::size_t groups() const noexcept { return groups_; }

 private:
  std::uint64_t expected(std::size_t i) const noexcept {
    return header_.size() == value_header::size ? detail::vh_get(header_, 40, 8)
                                                : detail::vh_get(header_, value_format::v2_fixed + 8 * i, 8);
  }

  value_hasher hasher_;
  value_format format_{};
  std::uint64_t fingerprint_ = 0;
  chunk_key key_{};
  std::size_t length_ = 0, unchecked_ = 0, groups_ = 0, bad_ = 0;
  std::span<const std::byte> header_{};
  header_check verdict_ = header_check::bad_magic;
};

/// The first group of `payload` whose checksum fails, or f.groups(payload.size()) when all match.
inline std::size_t first_bad_group(const value_format& f, std::span<const std::byte> b,
                                   std::span<const std::byte> payload) noexcept {
  const std::size_t n = f.groups(payload.size());
  for (std::size_t i = 0; i < n; ++i)
    if (!group_matches(b, i, f.group(payload, i))) return i;
  return n;
}

}  // namespace kvtier
