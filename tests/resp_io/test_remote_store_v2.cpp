// remote_store with value format 2 (one checksum per group) against a real redis-server:
// round trip, a payload byte altered in the server fails (corrupt, bad_checksum, never a hit),
// a version-1 value read by a version-2 store is refused as other_format (and still read by a
// version-1 store), and a format that cannot frame the value is an invalid argument.
#include <catch2/catch.hpp>

#include <chrono>
#include <string>
#include <vector>

#include "kvtier/resp/asio_connection.hpp"
#include "kvtier/store/remote_store.hpp"
#include "resp_io/io_test_util.hpp"
#include "support/redis_server.hpp"

using namespace std::chrono_literals;
using kvtier::chunk_key;
using kvtier::chunk_status;
using kvtier::deadline_after;
using kvtier::remote_store;
using kvtier::value_format;
using kvtier::resp::asio_connection;
using kvtier::test::options_for;
using kvtier::test::pattern;
using kvtier::test::redis_server;

namespace {
kvtier::key_namespace v2_ns() {
  return kvtier::key_namespace{.model = "v2-model", .kv_format = "raw", .chunk_tokens = 256};
}
}  // namespace

TEST_CASE("remote_store v2: groups round trip; an altered byte and a v1 value are refused", "[integration]") {
  redis_server srv;
  const auto ns = v2_ns();
  const auto f = value_format::v2(4000);  // 300 kB value: 75 groups
  remote_store<asio_connection> v2(ns, options_for(srv.url()), f);
  remote_store<asio_connection> v1(ns, options_for(srv.url()));
  const std::vector<chunk_key> keys{{5, 1}, {5, 2}};
  const auto a = pattern(300000, 1), b = pattern(300000, 2);
  std::vector<chunk_status> st(1);

  std::span<const std::byte> sa[] = {a};
  REQUIRE_FALSE(v2.put(std::span(&keys[0], 1), sa, st, deadline_after(5s)));
  REQUIRE(st[0] == chunk_status::stored);
  const std::string name0 = kvtier::remote_key_text(ns, keys[0]);
  REQUIRE(srv.call({"STRLEN", name0}) == std::to_string(f.header_size(a.size()) + a.size()));

  std::vector<std::byte> out(a.size());
  std::span<std::byte> d[] = {out};
  REQUIRE_FALSE(v2.get(std::span(&keys[0], 1), d, st, deadline_after(5s)));
  CHECK(st[0] == chunk_status::hit);
  CHECK(out == a);

  // One payload byte altered inside the server (group 37): corrupt, counted as a bad checksum.
  const std::size_t at = f.header_size(a.size()) + 37 * 4000 + 11;
  REQUIRE(srv.call({"SETRANGE", name0, std::to_string(at), "\x7f"}) ==
          std::to_string(f.header_size(a.size()) + a.size()));
  REQUIRE_FALSE(v2.get(std::span(&keys[0], 1), d, st, deadline_after(5s)));
  CHECK(st[0] == chunk_status::corrupt);
  CHECK(v2.stats().bad_checksum == 1);
  // The message names the key, its chunk and the group that failed (checked as the bytes landed).
  CHECK_THAT(v2.last_error(),
             Catch::Contains(name0) && Catch::Contains("checksum mismatch in group 37 of 75"));

  // A version-1 value: the v1 store reads it, the v2 store refuses it as the other format.
  std::span<const std::byte> sb[] = {b};
  REQUIRE_FALSE(v1.put(std::span(&keys[1], 1), sb, st, deadline_after(5s)));
  REQUIRE(st[0] == chunk_status::stored);
  REQUIRE_FALSE(v1.get(std::span(&keys[1], 1), d, st, deadline_after(5s)));
  CHECK(st[0] == chunk_status::hit);
  CHECK(out == b);
  std::fill(out.begin(), out.end(), std::byte{0});
  REQUIRE_FALSE(v2.get(std::span(&keys[1], 1), d, st, deadline_after(5s)));
  CHECK(st[0] == chunk_status::corrupt);
  CHECK(v2.stats().other_format == 1);
  CHECK(v2.stats().corrupt == 2);
  CHECK_THAT(v2.last_error(), Catch::Contains("a version-1 value (this store reads version 2)"));
  CHECK(out == std::vector<std::byte>(out.size()));  // refused before a byte reached the span

  // Too many groups for the format: refused up front.
  remote_store<asio_connection> tiny(ns, options_for(srv.url()), value_format::v2(1));
  st[0] = chunk_status::cancelled;
  CHECK(tiny.put(std::span(&keys[0], 1), sa, st, deadline_after(5s)) == kvtier::errc::invalid_argument);
  CHECK(st[0] == chunk_status::cancelled);
}
