// Integration tests of remote_store's put path on both transports (asio_connection,
// uring_connection) against redis-server (issue 28): a source rewritten while it is sent is read
// back as one whole version or as corrupt, never a mixed hit; a put cut by its deadline mid-value
// leaves nothing readable as a hit; put_prehashed (checksums computed by the caller, e.g. in the
// connector's gather) round-trips in both value formats, refuses digests of another format or
// length before sending anything, and a digest that does not match its bytes stores a value that
// reads back corrupt, never a hit. TLS runs the first two in test_tls.cpp.
#include <catch2/catch.hpp>

#include <chrono>
#include <vector>

#include "kvtier/resp/asio_connection.hpp"
#include "kvtier/resp/uring_connection.hpp"
#include "kvtier/store/remote_store.hpp"
#include "resp_io/io_test_util.hpp"
#include "resp_io/put_safety.hpp"
#include "resp_io/store_test_util.hpp"
#include "support/redis_server.hpp"

using namespace std::chrono_literals;
using kvtier::chunk_key;
using kvtier::chunk_status;
using kvtier::deadline_after;
using kvtier::errc;
using kvtier::remote_store;
using kvtier::value_digest;
using kvtier::value_format;
using kvtier::value_hasher;
using kvtier::resp::asio_connection;
using kvtier::resp::uring_connection;
using kvtier::test::cspans;
using kvtier::test::keys_n;
using kvtier::test::options_for;
using kvtier::test::pattern;
using kvtier::test::redis_server;
using kvtier::test::spans;
using kvtier::test::test_ns;

namespace {

std::string url_of(const redis_server& s) { return "resp://127.0.0.1:" + std::to_string(s.port()); }

// The digest of `v` in format f, hashed in uneven pieces (as a gather would).
value_digest digest_in_pieces(const value_format& f, const std::vector<std::byte>& v) {
  value_hasher h;
  h.begin(f, v.size());
  for (std::size_t at = 0, step = 777; at < v.size(); at += step, step = step * 3 % 100'003 + 1)
    h.update(std::span(v).subspan(at, std::min(step, v.size() - at)));
  REQUIRE(h.complete());
  return h.digest();
}

}  // namespace

TEMPLATE_TEST_CASE("remote_store put: a source rewritten while it is sent is never a mixed hit", "[integration]",
                   asio_connection, uring_connection) {
  redis_server srv;
  remote_store<TestType> store(test_ns(), options_for(url_of(srv)));
  kvtier::test::require_torn_source_never_a_mixed_hit(store, 0x28a);
}

TEMPLATE_TEST_CASE("remote_store put: cut by its deadline mid-value, nothing readable as a hit remains",
                   "[integration]", asio_connection, uring_connection) {
  redis_server srv;
  remote_store<TestType> store(test_ns(), options_for(url_of(srv)));
  kvtier::test::require_cut_put_leaves_no_hit(store, srv, 0x28b);
}

TEMPLATE_TEST_CASE("remote_store put_prehashed: the caller's checksums, both formats; wrong digests refused",
                   "[integration]", asio_connection, uring_connection) {
  redis_server srv;
  const value_format format = GENERATE(value_format::v1(), value_format::v2(100'000));
  remote_store<TestType> store(test_ns(), options_for(url_of(srv)), format);
  const auto keys = keys_n(3, 0x28c);
  const std::vector<std::vector<std::byte>> src = {pattern(1'000'000, 1), pattern(333, 2), pattern(0, 3)};
  std::vector<value_digest> digests;
  for (const auto& v : src) digests.push_back(digest_in_pieces(format, v));
  std::vector<chunk_status> st(keys.size());
  REQUIRE_FALSE(store.put_prehashed(keys, cspans(src), digests, st, deadline_after(30s)));
  std::vector<std::vector<std::byte>> dst = {std::vector<std::byte>(1'000'000), std::vector<std::byte>(333), {}};
  REQUIRE_FALSE(store.get(keys, spans(dst), st, deadline_after(30s)));
  for (std::size_t i = 0; i < keys.size(); ++i) {
    REQUIRE(st[i] == chunk_status::hit);
    const bool same = dst[i] == src[i];
    REQUIRE(same);
  }

  // Digests of another length or format, or one missing: refused before anything is sent.
  const auto fresh = keys_n(3, 0x28d);
  std::vector<value_digest> wrong = digests;
  SECTION("another length") { wrong[1].length = 334; }
  SECTION("another format") {
    wrong[0] = digest_in_pieces(format.version == 1 ? value_format::v2(100'000) : value_format::v1(), src[0]);
  }
  SECTION("one digest short") { wrong.pop_back(); }
  REQUIRE(store.put_prehashed(fresh, cspans(src), wrong, st, deadline_after(30s)) == errc::invalid_argument);
  REQUIRE_FALSE(store.exists(fresh, st, deadline_after(30s)));
  for (auto s : st) REQUIRE(s == chunk_status::miss);
}

TEMPLATE_TEST_CASE("remote_store put_prehashed: a digest that does not match its bytes reads back corrupt",
                   "[integration]", asio_connection, uring_connection) {
  redis_server srv;
  const value_format format = GENERATE(value_format::v1(), value_format::v2(4096));
  remote_store<TestType> store(test_ns(), options_for(url_of(srv)), format);
  const auto keys = keys_n(1, 0x28e);
  std::vector<std::vector<std::byte>> src = {pattern(50'000, 5)};
  std::vector<value_digest> digests = {digest_in_pieces(format, src[0])};
  src[0][12'345] ^= std::byte{1};  // the bytes changed after they were hashed
  std::vector<chunk_status> st(1);
  REQUIRE_FALSE(store.put_prehashed(keys, cspans(src), digests, st, deadline_after(30s)));
  REQUIRE(st[0] == chunk_status::stored);
  std::vector<std::vector<std::byte>> dst = {std::vector<std::byte>(50'000)};
  REQUIRE_FALSE(store.get(keys, spans(dst), st, deadline_after(30s)));
  REQUIRE(st[0] == chunk_status::corrupt);
  REQUIRE(store.stats().bad_checksum == 1);
}
