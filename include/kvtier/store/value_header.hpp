// kvtier/store/value_header.hpp: the frame in front of every value a remote store holds.
//
// A stored value is `header (56 bytes) + payload`. The header names what the payload is
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

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string_view>

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
  }
  return "unknown";
}

namespace detail {
inline void vh_put(value_header_bytes& b, std::size_t at, std::uint64_t v, std::size_t n) noexcept {
  for (std::size_t i = 0; i < n; ++i) b[at + i] = static_cast<std::byte>(v >> (8 * i));
}
inline std::uint64_t vh_get(std::span<const std::byte, value_header::size> b, std::size_t at,
                            std::size_t n) noexcept {
  std::uint64_t v = 0;
  for (std::size_t i = 0; i < n; ++i) v |= static_cast<std::uint64_t>(b[at + i]) << (8 * i);
  return v;
}
inline std::uint64_t vh_xxh3(const void* p, std::size_t n) noexcept { return XXH3_64bits(p, n); }
}  // namespace detail

/// The header for `payload` stored as chunk `key` of the namespace with `ns_fingerprint`.
inline value_header_bytes encode_value_header(std::uint64_t ns_fingerprint, const chunk_key& key,
                                              std::span<const std::byte> payload) noexcept {
  value_header_bytes b{};
  detail::vh_put(b, 0, value_header::magic, 4);
  detail::vh_put(b, 4, value_header::version, 2);
  detail::vh_put(b, 6, value_header::size, 2);
  detail::vh_put(b, 8, ns_fingerprint, 8);
  detail::vh_put(b, 16, key.hi, 8);
  detail::vh_put(b, 24, key.lo, 8);
  detail::vh_put(b, 32, payload.size(), 8);
  detail::vh_put(b, 40, detail::vh_xxh3(payload.data(), payload.size()), 8);
  detail::vh_put(b, 48, detail::vh_xxh3(b.data(), 48), 8);
  return b;
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

}  // namespace kvtier
