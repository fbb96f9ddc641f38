// Unit and property tests of the stored-value header.
#include <catch2/catch.hpp>

#include <vector>

#include "kvtier/store/value_header.hpp"
#include "support/property.hpp"

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
