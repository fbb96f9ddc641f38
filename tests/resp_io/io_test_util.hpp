// tests/resp_io/io_test_util.hpp: helpers shared by the RESP connection and remote store tests.
#pragma once

#include <catch2/catch.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "kvtier/deadline.hpp"
#include "kvtier/resp/connection.hpp"
#include "kvtier/resp/url.hpp"
#include "support/deadline_check.hpp"

namespace kvtier::test {

/// Connection options for `url` (which must parse).
inline resp::connection_options options_for(const std::string& url) {
  auto r = resp::parse_url(url);
  REQUIRE(r);
  return resp::connection_options{.server = r.value};
}

/// n pseudo-random bytes (xorshift), different for each seed.
inline std::vector<std::byte> pattern(std::size_t n, unsigned seed) {
  std::vector<std::byte> v(n);
  std::uint64_t x = 0x9e3779b97f4a7c15ull * (seed + 1);
  for (std::size_t i = 0; i < n; ++i) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    v[i] = static_cast<std::byte>(x);
  }
  return v;
}

/// The call returned by its deadline, within kvtier::test::deadline_margin (scheduling
/// delay only; a call that waits past its deadline for anything fails this).
inline void require_returned_by(deadline dl) {
  const auto late = clock::now() - dl;
  INFO("returned " << std::chrono::duration_cast<std::chrono::milliseconds>(late).count()
                   << " ms past its deadline; allowed: " << deadline_margin.count() << " ms");
  REQUIRE(within_margin(late));
}

}  // namespace kvtier::test
