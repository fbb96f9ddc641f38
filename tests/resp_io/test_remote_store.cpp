// Integration tests of remote_store (the L2 chunk store) over both transports against real
// redis-server processes: misses, verified hits, wrong-length and corrupted values, server
// death and restart, a server that never answers, and 12.4 MB chunks bit-exact.
#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "kvtier/resp/asio_connection.hpp"
#include "kvtier/resp/uring_connection.hpp"
#include "kvtier/store/remote_store.hpp"
#include "resp_io/io_test_util.hpp"
#include "resp_io/store_test_util.hpp"
#include "support/redis_server.hpp"

using namespace std::chrono_literals;
using kvtier::chunk_key;
using kvtier::chunk_status;
using kvtier::deadline_after;
using kvtier::errc;
using kvtier::remote_store;
using kvtier::resp::asio_connection;
using kvtier::resp::uring_connection;
using kvtier::test::black_hole_server;
using kvtier::test::cspans;
using kvtier::test::keys_n;
using kvtier::test::options_for;
using kvtier::test::pattern;
using kvtier::test::redis_server;
using kvtier::test::require_returned_by;
using kvtier::test::spans;
using kvtier::test::test_ns;

static_assert(kvtier::chunk_store<remote_store<asio_connection>>);
static_assert(kvtier::chunk_store<remote_store<uring_connection>>);

namespace {

std::string as_string(std::span<const std::byte> b) {
  return {reinterpret_cast<const char*>(b.data()), b.size()};
}

}  // namespace

TEMPLATE_TEST_CASE("remote_store: missing keys are misses at once; put, exists, get", "[integration]",
                   asio_connection, uring_connection) {
  redis_server srv;
  remote_store<TestType> store(test_ns(), options_for(srv.url()));
  const auto keys = keys_n(5);
  std::vector<chunk_status> st(keys.size(), chunk_status::cancelled);

  std::vector<std::vector<std::byte>> dst(keys.size(), std::vector<std::byte>(4096));
  auto d = spans(dst);
  const auto dl = deadline_after(10s);
  REQUIRE_FALSE(store.get(keys, d, st, dl));
  for (auto s : st) REQUIRE(s == chunk_status::miss);
  REQUIRE(kvtier::clock::now() < dl - 8s);  // "at once": nowhere near the deadline
  REQUIRE_FALSE(store.exists(keys, st, deadline_after(2s)));
  for (auto s : st) REQUIRE(s == chunk_status::miss);

  std::vector<std::vector<std::byte>> src;
  for (std::size_t i = 0; i < keys.size(); ++i) src.push_back(pattern(4096, static_cast<unsigned>(i)));
  const std::vector<chunk_key> first3(keys.begin(), keys.begin() + 3);
  std::vector<chunk_status> st3(3);
  const auto all_src = cspans(src);
  const std::vector<std::span<const std::byte>> first3_src(all_src.begin(), all_src.begin() + 3);
  REQUIRE_FALSE(store.put(first3, first3_src, st3, deadline_after(2s)));
  for (auto s : st3) REQUIRE(s == chunk_status::stored);

  REQUIRE_FALSE(store.exists(keys, st, deadline_after(2s)));
  CHECK(st == std::vector{chunk_status::hit, chunk_status::hit, chunk_status::hit, chunk_status::miss,
                          chunk_status::miss});
  REQUIRE_FALSE(store.get(keys, d, st, deadline_after(2s)));
  CHECK(st == std::vector{chunk_status::hit, chunk_status::hit, chunk_status::hit, chunk_status::miss,
                          chunk_status::miss});
  for (int i = 0; i < 3; ++i) REQUIRE(dst[i] == src[i]);
  // Keys carry the namespace's text form.
  REQUIRE(srv.call({"EXISTS", kvtier::remote_key_text(test_ns(), keys[0])}) == "1");

  // Size mismatches touch nothing.
  std::vector<chunk_status> short_st(2, chunk_status::cancelled);
  REQUIRE(store.get(keys, d, short_st, deadline_after(2s)) == errc::invalid_argument);
  REQUIRE(short_st[0] == chunk_status::cancelled);
  const auto s = store.stats();
  CHECK(s.hits == 3);
  CHECK(s.misses == 7);
  CHECK(s.corrupt == 0);
}

TEMPLATE_TEST_CASE("remote_store: wrong-length, corrupted and foreign values are corrupt, counted",
                   "[integration]", asio_connection, uring_connection) {
  redis_server srv;
  const auto ns = test_ns();
  remote_store<TestType> store(ns, options_for(srv.url()));
  const auto keys = keys_n(6, 7);
  const auto payload = pattern(10000, 3);
  auto name = [&](std::size_t i) { return kvtier::remote_key_text(ns, keys[i]); };

  // 0: raw bytes of another length written with a plain SET
  REQUIRE(srv.call({"SET", name(0), "not a kvtier value"}) == "OK");
  // 1: a valid header, one payload bit flipped
  auto h = kvtier::encode_value_header(ns.fingerprint(), keys[1], payload);
  auto bad = payload;
  bad[1234] ^= std::byte{4};
  REQUIRE(srv.call({"SET", name(1), as_string(h) + as_string(bad)}) == "OK");
  // 2: the right length but garbage everywhere (bad magic)
  REQUIRE(srv.call({"SET", name(2), std::string(kvtier::value_header::size + payload.size(), 'x')}) == "OK");
  // 3: another chunk's value stored under this key (wrong key in the header)
  h = kvtier::encode_value_header(ns.fingerprint(), keys[0], payload);
  REQUIRE(srv.call({"SET", name(3), as_string(h) + as_string(payload)}) == "OK");
  // 4: a value written under another namespace's fingerprint
  h = kvtier::encode_value_header(test_ns("other").fingerprint(), keys[4], payload);
  REQUIRE(srv.call({"SET", name(4), as_string(h) + as_string(payload)}) == "OK");
  // 5: a good value, whose caller expects a different length
  h = kvtier::encode_value_header(ns.fingerprint(), keys[5], payload);
  REQUIRE(srv.call({"SET", name(5), as_string(h) + as_string(payload)}) == "OK");
  // 6 (extra): a list under a key: WRONGTYPE error reply
  const chunk_key list_key{1, 1};
  REQUIRE(srv.call({"RPUSH", kvtier::remote_key_text(ns, list_key), "x"}) == "1");

  std::vector<chunk_key> all = keys;
  all.push_back(list_key);
  std::vector<std::vector<std::byte>> dst(all.size(), std::vector<std::byte>(payload.size()));
  dst[5].resize(payload.size() - 1);
  auto d = spans(dst);
  std::vector<chunk_status> st(all.size());
  REQUIRE_FALSE(store.get(all, d, st, deadline_after(2s)));
  for (int i = 0; i < 6; ++i) {
    INFO("key " << i);
    REQUIRE(st[i] == chunk_status::corrupt);
  }
  REQUIRE(st[6] == chunk_status::error);
  const auto s = store.stats();
  CHECK(s.corrupt == 6);
  CHECK(s.wrong_length == 2);  // 0 (raw) and 5 (caller length)
  CHECK(s.bad_checksum == 1);
  CHECK(s.bad_header == 3);
  // Each corrupt value is named with its chunk and why (one at a time: the last one is kept).
  const std::string why[] = {"stored length 18, expected 10056 (header + payload)",
                             "payload checksum mismatch",
                             "header: bad magic",
                             "header: wrong chunk key",
                             "header: wrong namespace",
                             "stored length 10056, expected 10055 (header + payload)"};
  for (std::size_t i = 0; i < 6; ++i) {
    INFO("key " << i);
    std::vector<std::byte> one(dst[i].size());
    std::span<std::byte> od[] = {one};
    REQUIRE_FALSE(store.get(std::span(&keys[i], 1), od, std::span(&st[i], 1), deadline_after(2s)));
    char hex[32];
    keys[i].to_hex(hex);
    CHECK_THAT(store.last_error(), Catch::Contains(name(i)) && Catch::Contains(std::string(hex, 32)) &&
                                       Catch::Contains("corrupt: " + why[i]));
  }
  CHECK(s.hits == 0);

  // The connection stayed in sync: a good value still reads back.
  dst[5].resize(payload.size());
  std::vector<chunk_status> one(1);
  std::vector<std::span<std::byte>> d5{std::span<std::byte>(dst[5])};
  REQUIRE_FALSE(store.get(std::span(&keys[5], 1), d5, one, deadline_after(2s)));
  REQUIRE(one[0] == chunk_status::hit);
  REQUIRE(dst[5] == payload);
}

TEMPLATE_TEST_CASE("remote_store: a foreign value of the right length never reaches the caller's buffer",
                   "[integration]", asio_connection, uring_connection) {
  redis_server srv;
  const auto ns = test_ns();
  remote_store<TestType> store(ns, options_for(srv.url()));
  auto name = [&](const chunk_key& k) { return kvtier::remote_key_text(ns, k); };
  const std::byte sentinel{0xEE};
  // A small value (arrives with its header in one read, through the parser's buffer) and one
  // larger than the parser's 64 KiB buffer (its payload would be read straight into dst).
  for (std::size_t size : {std::size_t{1000}, std::size_t{300000}}) {
    INFO("payload " << size);
    const chunk_key a{0x5150, size}, b{0x5151, size}, c{0x5152, size};
    const auto payload = pattern(size, 9);
    std::vector<chunk_status> st(1);
    std::vector<std::span<const std::byte>> src{std::span<const std::byte>(payload)};
    REQUIRE_FALSE(store.put(std::span(&a, 1), src, st, deadline_after(5s)));
    REQUIRE(st[0] == chunk_status::stored);
    // b: the raw bytes of a's value, copied server-side (valid frame, a's key in the header)
    REQUIRE(srv.call({"COPY", name(a), name(b)}) == "1");
    // c: a valid frame for key c, written under another namespace's fingerprint
    const auto h = kvtier::encode_value_header(test_ns("other").fingerprint(), c, payload);
    REQUIRE(srv.call({"SET", name(c), as_string(h) + as_string(payload)}) == "OK");

    const auto before = store.stats();
    const std::vector<chunk_key> keys{b, c};
    std::vector<std::vector<std::byte>> dst(2, std::vector<std::byte>(size, sentinel));
    auto d = spans(dst);
    std::vector<chunk_status> st2(2);
    REQUIRE_FALSE(store.get(keys, d, st2, deadline_after(5s)));
    for (std::size_t i = 0; i < 2; ++i) {
      INFO("key " << i);
      CHECK(st2[i] == chunk_status::corrupt);
      CHECK(std::count(dst[i].begin(), dst[i].end(), sentinel) == static_cast<std::ptrdiff_t>(size));
    }
    const auto after = store.stats();
    CHECK(after.bad_header - before.bad_header == 2);
    CHECK(after.hits == before.hits);

    // The stream stayed in sync: a's own value still reads back.
    std::vector<std::span<std::byte>> d0{std::span<std::byte>(dst[0])};
    REQUIRE_FALSE(store.get(std::span(&a, 1), d0, st, deadline_after(5s)));
    CHECK(st[0] == chunk_status::hit);
    CHECK(dst[0] == payload);
  }
}

TEMPLATE_TEST_CASE("remote_store: 12.4 MB chunks round-trip bit-exact", "[integration]", asio_connection,
                   uring_connection) {
  redis_server srv({.unix_socket = true});
  constexpr std::size_t chunk_bytes = 12'400'000;
  const auto keys = keys_n(8, 99);
  std::vector<std::vector<std::byte>> src, dst;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    src.push_back(pattern(chunk_bytes, static_cast<unsigned>(i + 10)));
    dst.emplace_back(chunk_bytes);
  }
  std::vector<chunk_status> st(keys.size());
  for (const std::string& url : {srv.url(), srv.unix_url()}) {
    INFO(url);
    remote_store<TestType> store(test_ns(), options_for(url));
    REQUIRE_FALSE(store.put(keys, cspans(src), st, deadline_after(20s)));
    for (auto s : st) REQUIRE(s == chunk_status::stored);
    for (auto& v : dst) std::fill(v.begin(), v.end(), std::byte{0});
    auto d = spans(dst);
    REQUIRE_FALSE(store.get(keys, d, st, deadline_after(20s)));
    for (std::size_t i = 0; i < keys.size(); ++i) {
      REQUIRE(st[i] == chunk_status::hit);
      REQUIRE(dst[i] == src[i]);
    }
    REQUIRE(store.stats().bytes_fetched == keys.size() * chunk_bytes);
  }
}

TEMPLATE_TEST_CASE("remote_store: server killed, every key errors; after restart it works", "[integration]",
                   asio_connection, uring_connection) {
  redis_server srv;
  remote_store<TestType> store(test_ns(), options_for(srv.url()));
  const auto keys = keys_n(4, 5);
  std::vector<std::vector<std::byte>> src;
  for (std::size_t i = 0; i < keys.size(); ++i) src.push_back(pattern(1 << 20, static_cast<unsigned>(i)));
  std::vector<chunk_status> st(keys.size());
  REQUIRE_FALSE(store.put(keys, cspans(src), st, deadline_after(5s)));

  srv.kill();
  std::vector<std::vector<std::byte>> dst(keys.size(), std::vector<std::byte>(1 << 20));
  auto d = spans(dst);
  const auto dl = deadline_after(2s);
  const std::error_code ec = store.get(keys, d, st, dl);
  REQUIRE(ec);
  require_returned_by(dl);
  for (auto s : st) REQUIRE((s == chunk_status::error || s == chunk_status::timeout));

  srv.restart();  // empty: the chunks are gone, the store answers misses again
  REQUIRE_FALSE(store.get(keys, d, st, deadline_after(2s)));
  for (auto s : st) REQUIRE(s == chunk_status::miss);
  REQUIRE_FALSE(store.put(keys, cspans(src), st, deadline_after(5s)));
  REQUIRE_FALSE(store.get(keys, d, st, deadline_after(5s)));
  for (std::size_t i = 0; i < keys.size(); ++i) {
    REQUIRE(st[i] == chunk_status::hit);
    REQUIRE(dst[i] == src[i]);
  }
}

TEMPLATE_TEST_CASE("remote_store: a server that never answers: every key times out at the deadline",
                   "[integration]", asio_connection, uring_connection) {
  black_hole_server hole;
  remote_store<TestType> store(test_ns(), options_for(hole.url()));
  const auto keys = keys_n(3);
  std::vector<chunk_status> st(keys.size(), chunk_status::hit);
  const auto dl = deadline_after(250ms);
  REQUIRE(store.exists(keys, st, dl) == errc::timeout);
  REQUIRE(kvtier::clock::now() >= dl);
  require_returned_by(dl);
  for (auto s : st) REQUIRE(s == chunk_status::timeout);
  // An already expired deadline: every key timeout, no I/O.
  std::fill(st.begin(), st.end(), chunk_status::hit);
  REQUIRE(store.exists(keys, st, kvtier::clock::now() - 1ms) == errc::timeout);
  for (auto s : st) REQUIRE(s == chunk_status::timeout);
  REQUIRE(store.stats().timeouts == 2);
}

TEMPLATE_TEST_CASE("remote_store: server error replies are per-key errors; the stream stays in sync",
                   "[integration]", asio_connection, uring_connection) {
  const auto keys = keys_n(4, 11);
  std::vector<std::vector<std::byte>> src;
  for (std::size_t i = 0; i < keys.size(); ++i) src.push_back(pattern(1 << 20, static_cast<unsigned>(i)));
  std::vector<chunk_status> st(keys.size());

  SECTION("OOM on SET (maxmemory, noeviction)") {
    redis_server srv({.extra_args = {"--maxmemory", "2mb", "--maxmemory-policy", "noeviction"}});
    remote_store<TestType> store(test_ns(), options_for(srv.url()));
    REQUIRE_FALSE(store.put(keys, cspans(src), st, deadline_after(5s)));
    std::size_t stored = 0;
    for (auto s : st) {
      REQUIRE((s == chunk_status::stored || s == chunk_status::error));
      stored += s == chunk_status::stored;
    }
    REQUIRE(stored < keys.size());  // 4 MiB never fit in 2 MB
    REQUIRE(store.stats().errors == keys.size() - stored);
    // What was stored reads back verified; what was refused is a miss; same connection.
    std::vector<std::vector<std::byte>> dst(keys.size(), std::vector<std::byte>(1 << 20));
    std::vector<chunk_status> got(keys.size());
    auto d = spans(dst);
    REQUIRE_FALSE(store.get(keys, d, got, deadline_after(5s)));
    for (std::size_t i = 0; i < keys.size(); ++i) {
      INFO("key " << i);
      REQUIRE(got[i] == (st[i] == chunk_status::hit ? chunk_status::hit : chunk_status::miss));
      if (got[i] == chunk_status::hit) REQUIRE(dst[i] == src[i]);
    }
    // The batch was spread over the pool's large connections; none had to reconnect.
    REQUIRE(store.pool().stats().connects <= store.pool().size() - store.pool().reserved_small());
    REQUIRE(store.pool().stats().failures == 0);
  }

  SECTION("NOAUTH: a server that wants a password the URL does not give") {
    redis_server srv({.extra_args = {"--requirepass", "pw"}, .harness_password = "pw"});
    remote_store<TestType> store(test_ns(), options_for(srv.url()));
    REQUIRE_FALSE(store.exists(keys, st, deadline_after(2s)));
    for (auto s : st) REQUIRE(s == chunk_status::error);
    // Redis refuses a large bulk from an unauthenticated client with an error reply and then
    // closes the connection: the first key gets the reply, the others the lost connection.
    const std::error_code put_ec = store.put(keys, cspans(src), st, deadline_after(5s));
    REQUIRE((!put_ec || put_ec == errc::connection_lost));
    for (auto s : st) REQUIRE(s == chunk_status::error);
    std::vector<std::vector<std::byte>> dst(keys.size(), std::vector<std::byte>(1 << 20));
    auto d = spans(dst);
    // The put was spread over several connections, each closed by the server just after its
    // refusal: a connection whose close had not arrived yet when the get went out is lost now.
    const std::error_code get_ec = store.get(keys, d, st, deadline_after(2s));
    REQUIRE((!get_ec || get_ec == errc::connection_lost));
    for (auto s : st) REQUIRE(s == chunk_status::error);
    REQUIRE(store.stats().errors >= 2 * keys.size());
    REQUIRE(store.stats().hits == 0);
    // The server's own words reach the caller, with the command and the server's address.
    const std::string why = store.last_error();
    INFO(why);
    REQUIRE(why.find("NOAUTH") != std::string::npos);
    REQUIRE(why.find(std::to_string(srv.port())) != std::string::npos);
  }

  SECTION("a db the server does not have: the server's text, not only 'server replied with an error'") {
    redis_server srv;
    remote_store<TestType> store(test_ns(), options_for(srv.url() + "/99"));
    REQUIRE(store.exists(keys, st, deadline_after(2s)) == errc::server_error);
    for (auto s : st) REQUIRE(s == chunk_status::error);
    const std::string why = store.last_error();
    INFO(why);
    REQUIRE(why.find("SELECT: ERR DB index is out of range") != std::string::npos);
  }
}
