// Unit and property tests of the stored-value header.
#include <catch2/catch.hpp>

#include <cstdint>
#include <vector>

#include "kvtier/store/value_header.hpp"
#include "support/property.hpp"

// The dispatch configuration xxhash.hpp sets for xxHash stays inside it.
#if defined(XXH_X86DISPATCH) || defined(XXH_DISPATCH_AVX2) || defined(XXH_DISPATCH_AVX512) || \
    defined(XXH_TARGET_AVX2) || defined(XXH_TARGET_AVX512)
#error "kvtier/detail/xxhash.hpp leaked xxHash's dispatch macros"
#endif

using kvtier::check_value_header;
using kvtier::chunk_key;
using kvtier::encode_value_header;
using kvtier::header_check;
using kvtier::payload_matches;
using kvtier::value_header;

namespace {
std::vector<std::byte> bytes_of(std::size_t n, unsigned seed) {
  std::vector<std::byte> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<std::byte>((i * 131 + seed) >> 3);
  return v;
}
}  // namespace

TEST_CASE("value_header: encode then check is ok; every field is checked", "[unit]") {
  const chunk_key key{0x0123456789abcdefull, 0xfedcba9876543210ull};
  const std::uint64_t ns = 0x1122334455667788ull;
  const auto payload = bytes_of(1000, 7);
  const auto h = encode_value_header(ns, key, payload);
  REQUIRE(h.size() == value_header::size);
  CHECK(static_cast<char>(h[0]) == 'K');
  CHECK(static_cast<char>(h[3]) == 'H');
  CHECK(check_value_header(h, ns, key, payload.size()) == header_check::ok);
  CHECK(payload_matches(h, payload));
  CHECK(check_value_header(h, ns + 1, key, payload.size()) == header_check::wrong_namespace);
  CHECK(check_value_header(h, ns, chunk_key{key.hi, key.lo + 1}, payload.size()) == header_check::wrong_key);
  CHECK(check_value_header(h, ns, key, payload.size() + 1) == header_check::wrong_length);
  auto bad = payload;
  bad[500] ^= std::byte{1};
  CHECK_FALSE(payload_matches(h, bad));

  auto m = h;
  m[0] = std::byte{'X'};
  CHECK(check_value_header(m, ns, key, payload.size()) == header_check::bad_magic);
  m = h;
  m[4] = std::byte{2};
  CHECK(check_value_header(m, ns, key, payload.size()) == header_check::bad_version);
  m = h;
  m[33] ^= std::byte{0x10};  // length field
  CHECK(check_value_header(m, ns, key, payload.size()) == header_check::header_corrupt);
  CHECK(to_string(header_check::wrong_key) == "wrong chunk key");
}

TEST_CASE("value_header: an empty payload has a valid header", "[unit]") {
  const auto h = encode_value_header(1, chunk_key{2, 3}, {});
  CHECK(check_value_header(h, 1, chunk_key{2, 3}, 0) == header_check::ok);
  CHECK(payload_matches(h, {}));
}

TEST_CASE("value_header: any single bit flip in the header is rejected", "[property]") {
  kvtier::test::prop(
      "bit flip rejected",
      [](std::uint64_t ns, std::uint64_t hi, std::uint64_t lo, std::uint16_t len, std::uint8_t pos_seed,
         std::uint8_t bit) {
        const chunk_key key{hi, lo};
        const auto payload = bytes_of(len, static_cast<unsigned>(hi));
        const auto h = encode_value_header(ns, key, payload);
        RC_ASSERT(check_value_header(h, ns, key, payload.size()) == header_check::ok);
        RC_ASSERT(payload_matches(h, payload));
        auto m = h;
        m[pos_seed % value_header::size] ^= static_cast<std::byte>(1u << (bit % 8));
        const bool accepted =
            check_value_header(m, ns, key, payload.size()) == header_check::ok && payload_matches(m, payload);
        RC_ASSERT(!accepted);
      },
      10000);
}

// ---- format 2: one checksum per group ----------------------------------------------------------

TEST_CASE("value_header v2: layout, checks, and the other version refused", "[unit]") {
  const chunk_key key{11, 22};
  const std::uint64_t ns = 99;
  const auto payload = bytes_of(1000, 5);
  const auto f = kvtier::value_format::v2(300);  // groups of 300, 300, 300, 100 bytes
  REQUIRE(f.groups(payload.size()) == 4);
  REQUIRE(f.header_size(payload.size()) == 64 + 4 * 8);
  std::vector<std::byte> h(f.header_size(payload.size()));
  REQUIRE(kvtier::encode_value_header(f, ns, key, payload, h) == h.size());
  CHECK(static_cast<unsigned>(h[4]) == 2);
  CHECK(check_value_header(f, h, ns, key, payload.size()) == header_check::ok);
  CHECK(kvtier::first_bad_group(f, h, payload) == 4);
  CHECK(f.group(std::span<const std::byte>(payload), 3).size() == 100);
  CHECK(check_value_header(f, h, ns + 1, key, payload.size()) == header_check::wrong_namespace);
  CHECK(check_value_header(f, h, ns, chunk_key{11, 23}, payload.size()) == header_check::wrong_key);
  CHECK(check_value_header(kvtier::value_format::v2(250), h, ns, key, payload.size()) ==
        header_check::wrong_groups);
  CHECK(check_value_header(kvtier::value_format::v1(), h, ns, key, payload.size()) ==
        header_check::bad_version);
  const auto v1 = encode_value_header(ns, key, payload);
  CHECK(check_value_header(f, v1, ns, key, payload.size()) == header_check::bad_version);
  CHECK(check_value_header(kvtier::value_format::v1(), v1, ns, key, payload.size()) == header_check::ok);
  auto m = h;
  m[70] ^= std::byte{1};  // inside the checksum table: the header's checksums catch it
  CHECK(check_value_header(f, m, ns, key, payload.size()) == header_check::header_corrupt);

  // One group for the whole payload (group_bytes 0), and an empty payload (no groups).
  const auto whole = kvtier::value_format::v2(0);
  std::vector<std::byte> hw(whole.header_size(payload.size()));
  REQUIRE(hw.size() == 72);
  REQUIRE(kvtier::encode_value_header(whole, ns, key, payload, hw) == 72);
  CHECK(check_value_header(whole, hw, ns, key, payload.size()) == header_check::ok);
  std::vector<std::byte> he(whole.header_size(0));
  REQUIRE(kvtier::encode_value_header(whole, ns, key, {}, he) == 64);
  CHECK(check_value_header(whole, he, ns, key, 0) == header_check::ok);
  // Too many groups for the 16-bit header size: refused, not truncated.
  const auto tiny = kvtier::value_format::v2(1);
  CHECK(tiny.header_size(100000) == 0);
  CHECK_FALSE(tiny.valid_for(100000));
  std::vector<std::byte> big(1 << 20);
  CHECK(kvtier::encode_value_header(tiny, ns, key, std::vector<std::byte>(100000), big) == 0);
}

TEST_CASE("value_header v2: a flipped payload byte fails exactly its own group", "[property]") {
  kvtier::test::prop(
      "flipped byte fails only its group",
      [](std::uint16_t len_seed, std::uint16_t group_seed, std::uint32_t pos_seed, std::uint8_t bit) {
        const std::size_t len = 1 + len_seed % 5000;
        const auto f = kvtier::value_format::v2(1 + group_seed % 700);
        RC_PRE(f.valid_for(len));
        auto payload = bytes_of(len, len_seed);
        std::vector<std::byte> h(f.header_size(len));
        RC_ASSERT(kvtier::encode_value_header(f, 7, chunk_key{1, 2}, payload, h) == h.size());
        const std::size_t pos = pos_seed % len;
        payload[pos] ^= static_cast<std::byte>(1u << (bit % 8));
        const std::size_t own = pos / f.group_bytes;
        for (std::size_t g = 0; g < f.groups(len); ++g)
          RC_ASSERT(kvtier::group_matches(h, g, f.group(std::span<const std::byte>(payload), g)) ==
                    (g != own));
        RC_ASSERT(kvtier::first_bad_group(f, h, payload) == own);
      },
      10000);
}

TEST_CASE("value_check: the checksum while the bytes land equals the one-pass check, any split",
          "[property]") {
  kvtier::test::prop(
      "streamed verdict == first_bad_group",
      [](std::uint16_t len_seed, std::uint16_t group_seed, std::uint32_t pos_seed, std::uint8_t bit, bool v2,
         bool flip, std::uint16_t piece_seed) {
        const std::size_t len = len_seed % 6000;  // 0 included: no byte lands at all
        const auto f = v2 ? kvtier::value_format::v2(1 + group_seed % 900) : kvtier::value_format::v1();
        RC_PRE(f.valid_for(len));
        auto payload = bytes_of(len, len_seed);
        std::vector<std::byte> h(f.header_size(len));
        RC_ASSERT(kvtier::encode_value_header(f, 7, chunk_key{1, 2}, payload, h) == h.size());
        if (flip && len > 0) payload[pos_seed % len] ^= static_cast<std::byte>(1u << (bit % 8));
        kvtier::value_check c;
        c.expect(f, 7, chunk_key{1, 2}, len);
        RC_ASSERT(c.header(h) == header_check::ok);
        const std::size_t step = 1 + piece_seed % 2000;  // pieces as the parser hands them over
        for (std::size_t at = 0; at < len; at += step)
          c.payload(std::span<const std::byte>(payload).subspan(at, std::min(step, len - at)));
        const std::size_t bad = kvtier::first_bad_group(f, h, payload);
        RC_ASSERT(c.seen() == len);
        RC_ASSERT(c.bad_group() == bad);
        RC_ASSERT(c.payload_ok() == (bad == f.groups(len)));
        RC_ASSERT(c.payload_ok() == !(flip && len > 0));
      },
      10000);
  // Not every byte seen: never ok. A header of another chunk: refused, never ok.
  const auto payload = bytes_of(1000, 1);
  const auto h = encode_value_header(9, chunk_key{3, 4}, payload);
  kvtier::value_check c;
  c.expect(kvtier::value_format::v1(), 9, chunk_key{3, 4}, payload.size());
  REQUIRE(c.header(h) == header_check::ok);
  c.payload(std::span<const std::byte>(payload).first(999));
  CHECK_FALSE(c.payload_ok());
  c.expect(kvtier::value_format::v1(), 9, chunk_key{3, 5}, payload.size());
  CHECK(c.header(h) == header_check::wrong_key);
  c.payload(payload);
  CHECK_FALSE(c.payload_ok());
}

TEST_CASE("value_hasher: the digest of any split writes the header the payload itself writes", "[property]") {
  kvtier::test::prop(
      "encode(digest) == encode(payload)",
      [](std::uint16_t len_seed, std::uint16_t group_seed, bool v2, std::uint16_t piece_seed) {
        const std::size_t len = len_seed % 6000;  // 0 included
        const auto f = v2 ? kvtier::value_format::v2(1 + group_seed % 900) : kvtier::value_format::v1();
        RC_PRE(f.valid_for(len));
        const auto payload = bytes_of(len, len_seed);
        kvtier::value_hasher hasher;
        hasher.begin(f, len);
        const std::size_t step = 1 + piece_seed % 2000;  // pieces as a gather hands them over
        for (std::size_t at = 0; at < len; at += step)
          hasher.update(std::span<const std::byte>(payload).subspan(at, std::min(step, len - at)));
        RC_ASSERT(hasher.complete());
        std::vector<std::byte> from_payload(f.header_size(len)), from_digest(f.header_size(len));
        RC_ASSERT(kvtier::encode_value_header(f, 7, chunk_key{1, 2}, payload, from_payload) == from_payload.size());
        RC_ASSERT(kvtier::encode_value_header(hasher.digest(), 7, chunk_key{1, 2}, from_digest) ==
                  from_digest.size());
        RC_ASSERT(from_digest == from_payload);
      },
      10000);
  // A digest short of its bytes, or of another format, writes no header.
  const auto payload = bytes_of(1000, 1);
  kvtier::value_hasher hasher;
  hasher.begin(kvtier::value_format::v2(100), payload.size());
  hasher.update(std::span<const std::byte>(payload).first(999));
  CHECK_FALSE(hasher.complete());
  kvtier::value_digest d = hasher.digest();
  d.hashes.pop_back();
  std::vector<std::byte> out(kvtier::value_format::v2(100).header_size(payload.size()));
  CHECK(kvtier::encode_value_header(d, 7, chunk_key{1, 2}, out) == 0);
  CHECK_FALSE(hasher.digest().fits(kvtier::value_format::v2(200), payload.size()));
  CHECK_FALSE(hasher.digest().fits(kvtier::value_format::v1(), payload.size()));
}

// XXH3 kernels chosen at run time (kvtier/detail/xxhash.hpp): each must give the build's own
// hash, one-shot and streamed in any split, at every length class XXH3 distinguishes (<= 16,
// <= 128, <= 240 bytes, then stripes of 64, the 256-byte internal buffer, blocks of 1024).
namespace {
using kvtier::detail::xxh3_unit;
std::vector<xxh3_unit> xxh3_units_here() {
  std::vector<xxh3_unit> u;
  for (xxh3_unit x : {xxh3_unit::avx2, xxh3_unit::avx512})
    if (kvtier::detail::xxh3_unit_available(x)) u.push_back(x);
  return u;
}
std::vector<unsigned char> random_bytes(std::size_t n, std::uint64_t seed) {
  std::vector<unsigned char> v(n);
  for (auto& b : v) {
    seed ^= seed << 13, seed ^= seed >> 7, seed ^= seed << 17;
    b = static_cast<unsigned char>(seed >> 24);
  }
  return v;
}
std::uint64_t streamed(xxh3_unit u, const std::vector<unsigned char>& v, std::size_t step) {
  XXH3_state_t s;
  XXH3_64bits_reset(&s);
  for (std::size_t at = 0; at < v.size(); at += step)
    kvtier::detail::xxh3_update_on(u, &s, v.data() + at, std::min(step, v.size() - at));
  return XXH3_64bits_digest(&s);
}
}  // namespace

TEST_CASE("xxh3 kernels: every unit hashes as the build's own, at the length boundaries", "[unit]") {
  const auto units = xxh3_units_here();
  INFO("units available besides the build's: " << units.size());
  std::vector<std::size_t> lengths;
  for (std::size_t n = 0; n <= 300; ++n) lengths.push_back(n);  // 240: the short/long switch
  for (std::size_t b : {512u, 1024u, 2048u, 4096u, 65536u, 262144u, 1048576u})
    for (std::size_t d : {b - 65, b - 64, b - 1, b, b + 1, b + 63, b + 64}) lengths.push_back(d);
  for (std::size_t n : lengths) {
    const auto v = random_bytes(n, 0x9E3779B97F4A7C15ull + n);
    const std::uint64_t want = XXH3_64bits(v.data(), v.size());
    CHECK(kvtier::detail::xxh3_64(v.data(), v.size()) == want);
    for (xxh3_unit u : units) {
      INFO("unit " << static_cast<int>(u) << ", length " << n);
      CHECK(kvtier::detail::xxh3_64_on(u, v.data(), v.size()) == want);
      for (std::size_t step : {std::size_t{1}, std::size_t{63}, std::size_t{64}, std::size_t{256},
                               std::size_t{1000}, std::size_t{1024}, std::size_t{65536}})
        if (n / step < 20000) CHECK(streamed(u, v, step) == want);
    }
  }
}

TEST_CASE("xxh3 kernels: any input, any split, same hash as the build's", "[property]") {
  const auto units = xxh3_units_here();
  kvtier::test::prop("xxh3_update_on(u) == XXH3_64bits",
                     [&](std::uint32_t len_seed, std::uint64_t seed, std::uint16_t step_seed) {
                       const std::size_t len = len_seed % 20000;
                       const auto v = random_bytes(len, seed | 1);
                       const std::uint64_t want = XXH3_64bits(v.data(), v.size());
                       const std::size_t step = 1 + step_seed % 3000;
                       RC_ASSERT(streamed(xxh3_unit::build, v, step) == want);
                       for (xxh3_unit u : units) {
                         RC_ASSERT(kvtier::detail::xxh3_64_on(u, v.data(), v.size()) == want);
                         RC_ASSERT(streamed(u, v, step) == want);
                       }
                     });
}
