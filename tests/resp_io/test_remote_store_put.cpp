// Integration tests of remote_store's put path on both transports (asio_connection,
// uring_connection) against redis-server (issue 28): a source rewritten while it is sent is read
// back as one whole version or as corrupt, never a mixed hit; a put cut by its deadline mid-value
// leaves nothing readable as a hit; put_prehashed (checksums computed by the caller, e.g. in the
// connector's gather) round-trips in both value formats, refuses digests of another format or
// length before sending anything, and a digest that does not match its bytes stores a value that
// reads back corrupt, never a hit. put_pieces (each value sent from its pieces, as the connector's
// saver sends a chunk from the pages) round-trips in both formats with and without the caller's
// digests, in batches, refuses wrong digests before sending anything, and passes the first two
// checks too. TLS runs the first two, both ways, in test_tls.cpp.
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
using kvtier::value_pieces;
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

// `v` cut at `cuts` (ascending offsets; a repeated one makes an empty piece) into consecutive pieces.
std::vector<std::span<const std::byte>> cut(const std::vector<std::byte>& v, std::vector<std::size_t> cuts) {
  std::vector<std::span<const std::byte>> pieces;
  std::size_t at = 0;
  cuts.push_back(v.size());
  for (std::size_t c : cuts) {
    pieces.push_back(std::span(v).subspan(at, c - at));
    at = c;
  }
  return pieces;
}

// The digest of a value in format f from its pieces, as a caller hashing the pages would.
value_digest digest_of_pieces(const value_format& f, std::span<const std::span<const std::byte>> pieces) {
  std::size_t n = 0;
  for (const auto& p : pieces) n += p.size();
  value_hasher h;
  h.begin(f, n);
  for (const auto& p : pieces) h.update(p);
  REQUIRE(h.complete());
  return h.digest();
}

}  // namespace

TEMPLATE_TEST_CASE("remote_store put: a source rewritten while it is sent is never a mixed hit",
                   "[integration]", asio_connection, uring_connection) {
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
  std::vector<std::vector<std::byte>> dst = {
      std::vector<std::byte>(1'000'000), std::vector<std::byte>(333), {}};
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

TEMPLATE_TEST_CASE(
    "remote_store put_pieces: a value sent from its pieces reads back whole, both formats, "
    "with and without the caller's digests",
    "[integration]", asio_connection, uring_connection) {
  redis_server srv;
  const value_format format = GENERATE(value_format::v1(), value_format::v2(4096));
  const bool with_digests = GENERATE(false, true);
  INFO("format " << format.version << ", digests " << with_digests);
  remote_store<TestType> store(test_ns(), options_for(url_of(srv)), format);
  const auto keys = keys_n(4, 0x2a0);
  const std::vector<std::vector<std::byte>> src = {pattern(50'000, 11), pattern(333, 12), pattern(0, 13),
                                                   pattern(200'000, 14)};
  // Pieces of uneven lengths that straddle v2's 4096-byte groups (a piece ending one byte into
  // a group, one spanning several, an empty one), a value in one piece, an empty value, and a
  // value over the small-request size in 7 pieces.
  const std::vector<std::vector<std::span<const std::byte>>> pieces = {
      cut(src[0], {1, 4097, 4097, 12'000, 12'288, 30'001}), cut(src[1], {}), cut(src[2], {}),
      cut(src[3], {5, 65'536, 70'000, 100'000, 131'072, 199'999})};
  const std::vector<value_pieces> values(pieces.begin(), pieces.end());
  std::vector<value_digest> digests;
  if (with_digests)
    for (const auto& p : pieces) digests.push_back(digest_of_pieces(format, p));
  std::vector<chunk_status> st(keys.size());
  REQUIRE_FALSE(store.put_pieces(keys, values, digests, st, deadline_after(30s)));
  for (auto s : st) REQUIRE(s == chunk_status::stored);
  std::vector<std::vector<std::byte>> dst;
  for (const auto& v : src) dst.emplace_back(v.size());
  REQUIRE_FALSE(store.get(keys, spans(dst), st, deadline_after(30s)));
  for (std::size_t i = 0; i < keys.size(); ++i) {
    INFO("value " << i);
    REQUIRE(st[i] == chunk_status::hit);
    const bool same = dst[i] == src[i];
    REQUIRE(same);
  }
  // As long on the server as the value put() stores from the whole value (header and payload).
  const auto whole_keys = keys_n(1, 0x2a1);
  const std::vector<std::span<const std::byte>> whole = {src[0]};
  REQUIRE_FALSE(store.put(whole_keys, whole, std::span(st).first(1), deadline_after(30s)));
  CHECK(srv.call({"STRLEN", kvtier::remote_key_text(test_ns(), keys[0])}) ==
        srv.call({"STRLEN", kvtier::remote_key_text(test_ns(), whole_keys[0])}));
  CHECK(store.stats().bad_checksum == 0);
}

TEMPLATE_TEST_CASE("remote_store put_pieces: a batch of many values, each in many pieces, reads back whole",
                   "[integration]", asio_connection, uring_connection) {
  redis_server srv;
  remote_store<TestType> store(test_ns(), options_for(url_of(srv)), value_format::v2(16'384));
  constexpr std::size_t n = 24;
  const auto keys = keys_n(n, 0x2a2);
  std::vector<std::vector<std::byte>> src;
  std::vector<std::vector<std::span<const std::byte>>> pieces;
  for (std::size_t i = 0; i < n; ++i) {
    src.push_back(pattern(1000 + i * 23'456, static_cast<unsigned>(20 + i)));  // 1 KB to 540 KB
    std::vector<std::size_t> cuts;
    for (std::size_t at = 777 * (i + 1) % 5000; at < src[i].size(); at += 3000 + i * 1111) cuts.push_back(at);
    pieces.push_back(cut(src[i], cuts));
  }
  const std::vector<value_pieces> values(pieces.begin(), pieces.end());
  std::vector<chunk_status> st(n);
  REQUIRE_FALSE(store.put_pieces(keys, values, {}, st, deadline_after(30s)));
  for (auto s : st) REQUIRE(s == chunk_status::stored);
  std::vector<std::vector<std::byte>> dst;
  for (const auto& v : src) dst.emplace_back(v.size());
  REQUIRE_FALSE(store.get(keys, spans(dst), st, deadline_after(30s)));
  for (std::size_t i = 0; i < n; ++i) {
    INFO("value " << i << " of " << src[i].size() << " bytes in " << pieces[i].size() << " pieces");
    REQUIRE(st[i] == chunk_status::hit);
    const bool same = dst[i] == src[i];
    REQUIRE(same);
  }
}

TEMPLATE_TEST_CASE(
    "remote_store put_pieces: digests of another count, format or length are refused, nothing sent",
    "[integration]", asio_connection, uring_connection) {
  redis_server srv;
  const value_format format = GENERATE(value_format::v1(), value_format::v2(4096));
  remote_store<TestType> store(test_ns(), options_for(url_of(srv)), format);
  const std::vector<std::vector<std::byte>> src = {pattern(20'000, 31), pattern(5'000, 32)};
  const std::vector<std::vector<std::span<const std::byte>>> pieces = {cut(src[0], {4000, 9000}),
                                                                       cut(src[1], {4096})};
  const std::vector<value_pieces> values(pieces.begin(), pieces.end());
  std::vector<value_digest> wrong = {digest_of_pieces(format, pieces[0]),
                                     digest_of_pieces(format, pieces[1])};
  const auto keys = keys_n(2, 0x2a3);
  std::vector<chunk_status> st(2);
  SECTION("one digest short") { wrong.pop_back(); }
  SECTION("one digest too many") { wrong.push_back(wrong[0]); }
  SECTION("another length") { wrong[1] = digest_of_pieces(format, std::span(pieces[1]).first(1)); }
  SECTION("another format") {
    wrong[0] = digest_of_pieces(format.version == 1 ? value_format::v2(4096) : value_format::v1(), pieces[0]);
  }
  SECTION("the digests of the other value (lengths swapped)") { std::swap(wrong[0], wrong[1]); }
  REQUIRE(store.put_pieces(keys, values, wrong, st, deadline_after(30s)) == errc::invalid_argument);
  REQUIRE_FALSE(store.exists(keys, st, deadline_after(30s)));
  for (auto s : st) REQUIRE(s == chunk_status::miss);
  CHECK(srv.call({"DBSIZE"}) == "0");
  // More values than keys or statuses: refused too.
  REQUIRE(store.put_pieces(std::span(keys).first(1), values, {}, st, deadline_after(30s)) ==
          errc::invalid_argument);
  REQUIRE(store.put_pieces(keys, values, {}, std::span(st).first(1), deadline_after(30s)) ==
          errc::invalid_argument);
  CHECK(srv.call({"DBSIZE"}) == "0");
}

TEMPLATE_TEST_CASE(
    "remote_store put_pieces: a source rewritten while it is sent from its pieces is never a "
    "mixed hit",
    "[integration]", asio_connection, uring_connection) {
  redis_server srv;
  remote_store<TestType> store(test_ns(), options_for(url_of(srv)));
  kvtier::test::require_torn_source_never_a_mixed_hit(store, 0x2a4, kvtier::test::piecewise_put{});
}

TEMPLATE_TEST_CASE(
    "remote_store put_pieces: cut by its deadline mid-value, nothing readable as a hit remains",
    "[integration]", asio_connection, uring_connection) {
  redis_server srv;
  remote_store<TestType> store(test_ns(), options_for(url_of(srv)));
  kvtier::test::require_cut_put_leaves_no_hit(store, srv, 0x2a5, kvtier::test::piecewise_put{});
}
