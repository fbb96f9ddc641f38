// remote_store with value format 2 (one checksum per group) against a real redis-server:
// round trip, a payload byte altered in the server fails (corrupt, bad_checksum, never a hit),
// a version-1 value read by a version-2 store is refused as other_format (and still read by a
// version-1 store), and a format that cannot frame the value is an invalid argument. Then
// get_by_group, the group-major ranged read (order, a corrupt group, a missing key, a value
// replaced between two ranged reads, a deadline mid-stream), and fetch_queue's stream_groups on it.
#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "kvtier/fetch_queue.hpp"
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

// ---- get_by_group: the group-major ranged read (GETRANGE per layer group) ----------------------

namespace {
constexpr std::size_t group_bytes = 100000;  // 300 kB values: 3 groups

struct ranged {
  redis_server srv;
  kvtier::key_namespace ns = v2_ns();
  value_format f = value_format::v2(group_bytes);
  remote_store<asio_connection> store{ns, options_for(srv.url()), f};
  std::vector<chunk_key> keys{{9, 1}, {9, 2}, {9, 3}};
  std::vector<std::vector<std::byte>> src{pattern(300000, 11), pattern(300000, 12), pattern(100000, 13)};
  std::vector<std::vector<std::byte>> out;
  std::vector<std::span<std::byte>> dst;
  std::vector<chunk_status> st;

  ranged() {
    for (const auto& s : src) out.emplace_back(s.size());
    for (auto& o : out) dst.emplace_back(o);
    st.assign(keys.size(), chunk_status::cancelled);
  }
  void put(std::size_t i, const std::vector<std::byte>& value) {
    std::span<const std::byte> s[] = {value};
    std::vector<chunk_status> ps(1);
    REQUIRE_FALSE(store.put(std::span(&keys[i], 1), s, ps, deadline_after(5s)));
    REQUIRE(ps[0] == chunk_status::stored);
  }
  void put_all() {
    for (std::size_t i = 0; i < keys.size(); ++i) put(i, src[i]);
  }
  std::string name(std::size_t i) const { return kvtier::remote_key_text(ns, keys[i]); }
  // Payload byte `at` of key i as stored (after its header).
  std::string offset(std::size_t i, std::size_t at) const {
    return std::to_string(f.header_size(src[i].size()) + at);
  }
};

bool group_is(const std::vector<std::byte>& got, const std::vector<std::byte>& want, std::size_t g) {
  const std::size_t a = g * group_bytes, z = std::min(want.size(), a + group_bytes);
  return std::equal(got.begin() + a, got.begin() + z, want.begin() + a);
}
bool group_is_zero(const std::vector<std::byte>& got, std::size_t g) {
  const std::size_t a = g * group_bytes, z = std::min(got.size(), a + group_bytes);
  return std::all_of(got.begin() + a, got.begin() + z, [](std::byte b) { return b == std::byte{0}; });
}
}  // namespace

TEST_CASE("remote_store get_by_group: group-major order, every group checked, reported per round",
          "[integration]") {
  ranged t;
  t.put_all();
  CHECK(t.store.groups_of(300000) == 3);
  CHECK(t.store.groups_of(100000) == 1);
  std::vector<std::vector<std::size_t>> rounds;
  REQUIRE_FALSE(
      t.store.get_by_group(t.keys, t.dst, t.st, deadline_after(10s), [&](std::span<const std::size_t> l) {
        rounds.emplace_back(l.begin(), l.end());
        if (rounds.size() == 1) {  // group 0 of every key is in, no byte of a later group yet
          for (std::size_t i = 0; i < 3; ++i) CHECK(group_is(t.out[i], t.src[i], 0));
          CHECK(group_is_zero(t.out[0], 1));
          CHECK(group_is_zero(t.out[1], 1));
        }
      }));
  CHECK(rounds == std::vector<std::vector<std::size_t>>{{1, 1, 1}, {2, 2, 1}, {3, 3, 1}});
  CHECK(t.st == std::vector<chunk_status>(3, chunk_status::hit));
  for (std::size_t i = 0; i < 3; ++i) CHECK(t.out[i] == t.src[i]);
  CHECK(t.store.stats().hits == 3);
  CHECK(t.store.stats().bytes_fetched == 700000);
}

TEST_CASE("remote_store get_by_group: a corrupt group and a missing key fail only their keys",
          "[integration]") {
  ranged t;
  t.put(0, t.src[0]);
  t.put(1, t.src[1]);  // key 2 is never stored: a miss
  // One byte of key 1's group 1 altered in the server: groups 0 land, group 1 fails.
  REQUIRE(t.srv.call({"SETRANGE", t.name(1), t.offset(1, group_bytes + 17), "\x7f"}) ==
          std::to_string(t.f.header_size(300000) + 300000));
  std::vector<std::size_t> last;
  REQUIRE_FALSE(
      t.store.get_by_group(t.keys, t.dst, t.st, deadline_after(10s),
                           [&](std::span<const std::size_t> l) { last.assign(l.begin(), l.end()); }));
  CHECK(t.st == std::vector<chunk_status>{chunk_status::hit, chunk_status::corrupt, chunk_status::miss});
  CHECK(last == std::vector<std::size_t>{3, 1, 0});
  CHECK(t.out[0] == t.src[0]);
  CHECK(group_is(t.out[1], t.src[1], 0));
  CHECK(group_is_zero(t.out[1], 2));  // never read past the failed group
  CHECK(t.store.stats().bad_checksum == 1);
  CHECK(t.store.stats().misses == 1);
  CHECK_THAT(t.store.last_error(),
             Catch::Contains(t.name(1)) && Catch::Contains("checksum mismatch in group 1"));
}

TEST_CASE("remote_store get_by_group: a value replaced between two ranged reads is corrupt, never a hit",
          "[integration]") {
  ranged t;
  t.put_all();
  const auto other = pattern(300000, 99);    // same length, other bytes: group 1 fails the old header
  const auto shorter = pattern(150000, 98);  // another length: group 1's range comes back short
  int round = 0;
  REQUIRE_FALSE(
      t.store.get_by_group(t.keys, t.dst, t.st, deadline_after(10s), [&](std::span<const std::size_t>) {
        if (++round != 1) return;
        t.put(0, other);
        t.put(1, shorter);
      }));
  CHECK(t.st == std::vector<chunk_status>{chunk_status::corrupt, chunk_status::corrupt, chunk_status::hit});
  CHECK(t.out[2] == t.src[2]);
  CHECK(t.store.stats().bad_checksum == 1);
  CHECK(t.store.stats().wrong_length == 1);
  CHECK(t.store.stats().hits == 1);
  // Written fresh, the replaced values read whole again.
  std::fill(t.st.begin(), t.st.end(), chunk_status::cancelled);
  REQUIRE_FALSE(t.store.get_by_group(std::span(t.keys).first(1), std::span(t.dst).first(1),
                                     std::span(t.st).first(1), deadline_after(10s)));
  CHECK(t.st[0] == chunk_status::hit);
  CHECK(t.out[0] == other);
}

TEST_CASE("remote_store get_by_group: a deadline passing mid-stream keeps the groups that landed",
          "[integration]") {
  ranged t;
  t.put_all();
  const kvtier::deadline dl = deadline_after(1500ms);
  std::vector<std::vector<std::size_t>> rounds;
  const std::error_code ec =
      t.store.get_by_group(t.keys, t.dst, t.st, dl, [&](std::span<const std::size_t> l) {
        rounds.emplace_back(l.begin(), l.end());
        for (int k = 0; k < 1000 && !kvtier::expired(dl); ++k) std::this_thread::sleep_for(5ms);  // bounded
      });
  CHECK(ec == kvtier::errc::timeout);
  REQUIRE(rounds.size() >= 1);
  CHECK(rounds[0] == std::vector<std::size_t>{1, 1, 1});
  CHECK(rounds.back() == std::vector<std::size_t>{1, 1, 1});  // nothing landed after the deadline
  CHECK(t.st == std::vector<chunk_status>{chunk_status::timeout, chunk_status::timeout, chunk_status::hit});
  CHECK(group_is(t.out[0], t.src[0], 0));
  CHECK(t.out[2] == t.src[2]);
}

TEST_CASE("fetch_queue stream_groups over remote_store: the group-major read, progress in bytes",
          "[integration]") {
  ranged t;
  t.put_all();
  // Key 1's group 2 altered in the server: its groups 0 and 1 land, then it is corrupt.
  REQUIRE(t.srv.call({"SETRANGE", t.name(1), t.offset(1, 2 * group_bytes + 5), "\x7f"}) ==
          std::to_string(t.f.header_size(300000) + 300000));
  static_assert(kvtier::group_streaming_store<remote_store<asio_connection>>);
  kvtier::fetch_queue q(t.store, {.workers = 1, .stream_groups = true});
  const auto layout = kvtier::chunk_layout::contiguous(0, 3, 256);
  auto h = q.submit(1, t.keys, t.dst, layout, deadline_after(10s));
  const auto r = q.wait(h, deadline_after(20s));
  REQUIRE(r);
  CHECK(r->status == std::vector<chunk_status>{chunk_status::hit, chunk_status::corrupt, chunk_status::hit});
  CHECK(r->answer_chunks == 1);
  const kvtier::fetch_progress p = q.progress(h);
  CHECK(p.landed_bytes == std::vector<std::size_t>{300000, 2 * group_bytes, 100000});
  CHECK(t.out[0] == t.src[0]);
  CHECK(t.out[2] == t.src[2]);
  CHECK(group_is(t.out[1], t.src[1], 1));
  CHECK(t.store.stats().bad_checksum == 1);
}
