// Integration tests of cluster_store: scripted servers for the protocol paths a real cluster does
// not take on demand (redirect loops, ASK with ASKING, TRYAGAIN until the deadline, CLUSTER SHARDS
// fallback), then one real loopback cluster (3 masters + 3 replicas, shared by the test cases in
// order): 12.4 MB values bit-exact, per-key order across masters, pinned placement, a slot
// migrated key by key (ASK, then MOVED) with loads running, a master killed (failover), and every
// node down.
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "kvtier/resp/asio_connection.hpp"
#include "kvtier/resp/uring_connection.hpp"
#include "kvtier/store/cluster_store.hpp"
#include "resp_io/io_test_util.hpp"
#include "resp_io/store_test_util.hpp"
#include "support/deadline_check.hpp"
#include "support/redis_cluster.hpp"
#include "support/scripted_server.hpp"

using namespace std::chrono_literals;
using kvtier::chunk_key;
using kvtier::chunk_status;
using kvtier::cluster_options;
using kvtier::cluster_store;
using kvtier::deadline_after;
using kvtier::errc;
using kvtier::resp::asio_connection;
using kvtier::resp::uring_connection;
using kvtier::test::cspans;
using kvtier::test::keys_n;
using kvtier::test::pattern;
using kvtier::test::redis_cluster;
using kvtier::test::scripted_server;
using kvtier::test::spans;
using kvtier::test::test_ns;

static_assert(kvtier::chunk_store<cluster_store<asio_connection>>);
static_assert(kvtier::chunk_store<cluster_store<uring_connection>>);
static_assert(kvtier::piecewise_put_store<cluster_store<asio_connection>>);

namespace {

// This file's keys and namespace (distinct from the other store tests').
constexpr std::uint64_t key_base = 0xc1a0;
const std::string ns_model = "cluster-test";

cluster_options options_for(const std::string& url, std::string tag = {}) {
  auto u = kvtier::resp::parse_cluster_url(url);
  REQUIRE(u);
  cluster_options o{.seeds = u.seeds, .hash_tag = std::move(tag)};
  o.connection.reconnect_backoff_min = 5ms;
  o.connection.reconnect_backoff_max = 100ms;
  return o;
}

std::string seed(const scripted_server& s) { return "resp+cluster://127.0.0.1:" + std::to_string(s.port()); }

// A CLUSTER SLOTS reply giving every slot to 127.0.0.1:port.
std::string all_slots_to(std::uint16_t port) {
  return "*1\r\n*3\r\n:0\r\n:16383\r\n*2\r\n$9\r\n127.0.0.1\r\n:" + std::to_string(port) + "\r\n";
}

void require_by(kvtier::deadline dl) { REQUIRE(kvtier::test::returned_by(dl)); }

}  // namespace

TEST_CASE("cluster_store: a MOVED loop ends after max_rounds as error, by the deadline", "[integration]") {
  std::uint16_t self = 0;
  scripted_server loop([&](const std::vector<std::string>& cmd) -> std::string {
    if (cmd[0] == "CLUSTER") return all_slots_to(self);
    return "-MOVED 1 127.0.0.1:" + std::to_string(self) + "\r\n";  // "ask me again"
  });
  self = loop.port();
  cluster_store<asio_connection> store(test_ns(ns_model), options_for(seed(loop)));
  const auto keys = keys_n(3, 1, key_base);
  std::vector<chunk_status> st(keys.size(), chunk_status::hit);
  const auto dl = deadline_after(5s);
  const std::error_code ec = store.exists(keys, st, dl);
  require_by(dl);
  REQUIRE(ec == errc::server_error);
  for (auto s : st) REQUIRE(s == chunk_status::error);
  REQUIRE(store.stats().redirects == keys.size() * 6);  // max_rounds rounds, then it gives up
  REQUIRE(store.last_error().find("rounds") != std::string::npos);
}

TEST_CASE("cluster_store: TRYAGAIN for ever: retried with backoff until the deadline", "[integration]") {
  std::uint16_t self = 0;
  scripted_server busy([&](const std::vector<std::string>& cmd) -> std::string {
    if (cmd[0] == "CLUSTER") return all_slots_to(self);
    return "-TRYAGAIN Multiple keys request during rehashing of slot\r\n";
  });
  self = busy.port();
  auto opt = options_for(seed(busy));
  opt.max_rounds = 1000;
  opt.retry_backoff_min = 20ms;
  cluster_store<asio_connection> store(test_ns(ns_model), opt);
  const auto keys = keys_n(2, 2, key_base);
  std::vector<chunk_status> st(keys.size());
  const auto dl = deadline_after(300ms);
  REQUIRE(store.exists(keys, st, dl) == errc::timeout);
  require_by(dl);
  for (auto s : st) REQUIRE(s == chunk_status::timeout);
  REQUIRE(store.stats().retries >= 2);
  REQUIRE(busy.commands() < 100);  // it waited between rounds instead of spinning
}

TEST_CASE("cluster_store: ASK retries that key alone, after ASKING, on the named node", "[integration]") {
  std::uint16_t target_port = 0;
  std::atomic<int> asking_then_get{0};
  // The target answers a GET only right after ASKING on the same connection (else MOVED back).
  scripted_server target([&, asked = false](const std::vector<std::string>& cmd) mutable -> std::string {
    if (cmd[0] == "ASKING") return asked = true, "+OK\r\n";
    const bool was = std::exchange(asked, false);
    if (cmd[0] == "GET" && was) return ++asking_then_get, "$-1\r\n";
    return "-ERR expected ASKING first\r\n";
  });
  target_port = target.port();
  std::uint16_t self = 0;
  const auto keys = keys_n(4, 3, key_base);
  std::string asked_name;
  scripted_server source([&](const std::vector<std::string>& cmd) -> std::string {
    if (cmd[0] == "CLUSTER") return all_slots_to(self);
    if (cmd[0] == "GET" && cmd[1] == asked_name)
      return "-ASK 77 127.0.0.1:" + std::to_string(target_port) + "\r\n";
    return "$-1\r\n";  // the other keys: still here, absent
  });
  self = source.port();
  cluster_store<asio_connection> store(test_ns(ns_model), options_for(seed(source)));
  asked_name = store.key_text(keys[2]);
  std::vector<std::vector<std::byte>> dst(keys.size(), std::vector<std::byte>(100));
  std::vector<chunk_status> st(keys.size());
  auto d = spans(dst);
  REQUIRE_FALSE(store.get(keys, d, st, deadline_after(5s)));
  for (auto s : st) REQUIRE(s == chunk_status::miss);
  REQUIRE(asking_then_get == 1);
  REQUIRE(store.stats().redirects == 1);
  // ASK does not change the map: the next call asks the source first again.
  REQUIRE(store.node_of(keys[2])->port == self);
}

TEST_CASE("cluster_store: CLUSTER SHARDS when the server does not know CLUSTER SLOTS", "[integration]") {
  std::uint16_t self = 0;
  scripted_server shards_only([&](const std::vector<std::string>& cmd) -> std::string {
    if (cmd[0] == "CLUSTER" && cmd[1] == "SLOTS") return "-ERR unknown subcommand 'SLOTS'\r\n";
    if (cmd[0] == "CLUSTER")
      return "*1\r\n*4\r\n$5\r\nslots\r\n*2\r\n:0\r\n:16383\r\n$5\r\nnodes\r\n*1\r\n*6\r\n$2\r\nip\r\n$"
             "9\r\n127.0."
             "0.1\r\n$4\r\nport\r\n:" +
             std::to_string(self) + "\r\n$4\r\nrole\r\n$6\r\nmaster\r\n";
    return ":1\r\n";
  });
  self = shards_only.port();
  cluster_store<asio_connection> store(test_ns(ns_model), options_for(seed(shards_only)));
  const auto keys = keys_n(2, 4, key_base);
  std::vector<chunk_status> st(keys.size());
  REQUIRE_FALSE(store.exists(keys, st, deadline_after(5s)));
  for (auto s : st) REQUIRE(s == chunk_status::hit);
  REQUIRE(store.slot_map().covered() == 16384);
}

TEST_CASE("cluster_store: no seed reachable: clean errors by the deadline", "[integration]") {
  const auto port = kvtier::test::detail::pick_free_port();
  cluster_store<asio_connection> store(test_ns(ns_model),
                                       options_for("resp+cluster://127.0.0.1:" + std::to_string(port)));
  const auto keys = keys_n(2, 5, key_base);
  std::vector<chunk_status> st(keys.size(), chunk_status::hit);
  const auto dl = deadline_after(2s);
  REQUIRE(store.exists(keys, st, dl) == errc::connection_refused);
  require_by(dl);
  for (auto s : st) REQUIRE(s == chunk_status::error);
  REQUIRE(store.last_error().find(std::to_string(port)) != std::string::npos);
}

// ---- one real cluster for the rest (test cases run in this order) ----------------------------

namespace {
redis_cluster& cluster() {
  static redis_cluster c;  // 3 masters + 3 replicas; stopped by PID at exit
  return c;
}
}  // namespace

TEMPLATE_TEST_CASE("cluster_store: 12.4 MB values bit-exact across the masters", "[integration]",
                   asio_connection, uring_connection) {
  cluster_store<TestType> store(test_ns(ns_model), options_for(cluster().url()));
  const auto keys = keys_n(6, 10, key_base);
  std::vector<std::vector<std::byte>> src;
  for (unsigned i = 0; i < keys.size(); ++i) src.push_back(pattern(12'400'000, i));
  std::vector<chunk_status> st(keys.size());
  REQUIRE_FALSE(store.put(keys, cspans(src), st, deadline_after(30s)));
  for (auto s : st) REQUIRE(s == chunk_status::stored);
  std::vector<std::vector<std::byte>> dst(keys.size(), std::vector<std::byte>(12'400'000));
  auto d = spans(dst);
  REQUIRE_FALSE(store.get(keys, d, st, deadline_after(30s)));
  for (std::size_t i = 0; i < keys.size(); ++i) {
    REQUIRE(st[i] == chunk_status::hit);
    REQUIRE(dst[i] == src[i]);
  }
  std::set<std::uint16_t> masters;
  for (const auto& k : keys) masters.insert(store.node_of(k)->port);
  REQUIRE(masters.size() >= 2);  // spread placement: the batch really was split
  REQUIRE(store.slot_map().covered() == 16384);
  REQUIRE(store.stats().corrupt == 0);
}

TEST_CASE("cluster_store: many keys over every master come back in the caller's order", "[integration]") {
  cluster_store<asio_connection> store(test_ns(ns_model), options_for(cluster().url()));
  const auto keys = keys_n(200, 11, key_base);
  std::vector<std::vector<std::byte>> src;
  for (unsigned i = 0; i < keys.size(); ++i) src.push_back(pattern(100 + i, 1000 + i));
  // Every third key is never stored: a miss in its place.
  std::vector<chunk_key> stored_keys;
  std::vector<std::span<const std::byte>> stored_src;
  for (std::size_t i = 0; i < keys.size(); ++i)
    if (i % 3 != 0) stored_keys.push_back(keys[i]), stored_src.emplace_back(src[i]);
  std::vector<chunk_status> pst(stored_keys.size());
  REQUIRE_FALSE(store.put(stored_keys, stored_src, pst, deadline_after(10s)));
  for (auto s : pst) REQUIRE(s == chunk_status::stored);
  std::vector<chunk_status> st(keys.size());
  REQUIRE_FALSE(store.exists(keys, st, deadline_after(10s)));
  for (std::size_t i = 0; i < keys.size(); ++i)
    REQUIRE(st[i] == (i % 3 ? chunk_status::hit : chunk_status::miss));
  std::vector<std::vector<std::byte>> dst;
  for (const auto& s : src) dst.emplace_back(s.size(), std::byte{0x5a});
  auto d = spans(dst);
  REQUIRE_FALSE(store.get(keys, d, st, deadline_after(10s)));
  std::set<std::uint16_t> masters;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    INFO("key " << i);
    masters.insert(store.node_of(keys[i])->port);
    if (i % 3 == 0) {
      REQUIRE(st[i] == chunk_status::miss);
      REQUIRE(std::all_of(dst[i].begin(), dst[i].end(), [](std::byte b) { return b == std::byte{0x5a}; }));
    } else {
      REQUIRE(st[i] == chunk_status::hit);
      REQUIRE(dst[i] == src[i]);
    }
  }
  REQUIRE(masters.size() == 3);
}

TEST_CASE("cluster_store: value format 2 (group checksums) across the masters; formats never mix",
          "[integration]") {
  // Format 2 comes from the shared codec (store/detail/remote_codec.hpp), as in remote_store.
  cluster_options o2 = options_for(cluster().url());
  o2.format = kvtier::value_format::v2(4096);
  cluster_store<asio_connection> v2(test_ns("cluster-v2"), o2);
  cluster_store<asio_connection> v1(test_ns("cluster-v2"), options_for(cluster().url()));
  REQUIRE(v2.ns().fingerprint() == v1.ns().fingerprint());
  const auto keys = keys_n(30, 23, key_base);
  const auto keys1 = keys_n(30, 24, key_base);
  std::vector<std::vector<std::byte>> src;
  for (unsigned i = 0; i < keys.size(); ++i) src.push_back(pattern(10000 + 997 * i, 300 + i));
  std::vector<chunk_status> st(keys.size());
  REQUIRE_FALSE(v2.put(keys, cspans(src), st, deadline_after(10s)));
  for (auto s : st) REQUIRE(s == chunk_status::stored);
  REQUIRE_FALSE(v1.put(keys1, cspans(src), st, deadline_after(10s)));
  for (auto s : st) REQUIRE(s == chunk_status::stored);
  std::set<std::uint16_t> masters;
  for (const auto& k : keys) masters.insert(v2.node_of(k)->port);
  REQUIRE(masters.size() >= 2);

  std::vector<std::vector<std::byte>> dst;
  for (const auto& s : src) dst.emplace_back(s.size(), std::byte{0x5a});
  auto d = spans(dst);
  REQUIRE_FALSE(v2.get(keys, d, st, deadline_after(10s)));
  for (std::size_t i = 0; i < keys.size(); ++i) {
    INFO("key " << i);
    REQUIRE(st[i] == chunk_status::hit);
    REQUIRE(dst[i] == src[i]);
  }
  // A version-1 value read by the version-2 store, and the other way round: refused before a
  // byte reaches the span.
  for (auto& b : dst) std::fill(b.begin(), b.end(), std::byte{0x5a});
  REQUIRE_FALSE(v2.get(keys1, d, st, deadline_after(10s)));
  for (auto s : st) REQUIRE(s == chunk_status::corrupt);
  REQUIRE(v2.stats().other_format == keys1.size());
  REQUIRE_FALSE(v1.get(keys, d, st, deadline_after(10s)));
  for (auto s : st) REQUIRE(s == chunk_status::corrupt);
  for (const auto& b : dst)
    REQUIRE(std::all_of(b.begin(), b.end(), [](std::byte x) { return x == std::byte{0x5a}; }));
  // A format that cannot frame the value (too many groups): refused before anything is sent.
  cluster_options tiny = options_for(cluster().url());
  tiny.format = kvtier::value_format::v2(1);
  cluster_store<asio_connection> t(test_ns("cluster-v2"), tiny);
  REQUIRE(t.get(keys, d, st, deadline_after(10s)) == errc::invalid_argument);
}

TEST_CASE(
    "cluster_store: put_pieces stores each value's pieces as one value, over every master; "
    "digests checked",
    "[integration]") {
  cluster_options o = options_for(cluster().url());
  o.format = kvtier::value_format::v2(8192);
  cluster_store<asio_connection> store(test_ns("cluster-pieces"), o);
  const auto keys = keys_n(24, 31, key_base);
  std::vector<std::vector<std::byte>> src;
  for (unsigned i = 0; i < keys.size(); ++i) src.push_back(pattern(30000 + 1009 * i, 500 + i));
  // Each value in pieces of uneven sizes that straddle the 8 KiB groups, one of them empty.
  std::vector<std::vector<std::span<const std::byte>>> pieces(keys.size());
  for (std::size_t i = 0; i < keys.size(); ++i) {
    const std::span<const std::byte> v(src[i]);
    for (std::size_t at = 0, k = 0; at < v.size(); ++k) {
      const std::size_t n = std::min(v.size() - at, std::size_t{3000} + 2500 * (k % 5));
      pieces[i].push_back(v.subspan(at, n));
      if (k == 2) pieces[i].push_back(v.subspan(at + n, 0));
      at += n;
    }
  }
  const std::vector<kvtier::value_pieces> values(pieces.begin(), pieces.end());
  std::vector<chunk_status> st(keys.size());
  // Half the values with the caller's checksums (hashed over the pieces), half hashed by the store.
  const std::size_t half = keys.size() / 2;
  std::vector<kvtier::value_digest> digests;
  for (std::size_t i = 0; i < half; ++i) {
    kvtier::value_hasher h;
    h.begin(o.format, src[i].size());
    for (const auto& p : pieces[i]) h.update(p);
    digests.push_back(h.digest());
  }
  const auto first = std::span(keys).first(half), second = std::span(keys).subspan(half);
  REQUIRE_FALSE(store.put_pieces(first, std::span(values).first(half), digests, std::span(st).first(half),
                                 deadline_after(10s)));
  REQUIRE_FALSE(store.put_pieces(second, std::span(values).subspan(half), {}, std::span(st).subspan(half),
                                 deadline_after(10s)));
  for (auto s : st) REQUIRE(s == chunk_status::stored);
  std::set<std::uint16_t> masters;
  for (const auto& k : keys) masters.insert(store.node_of(k)->port);
  REQUIRE(masters.size() >= 2);
  std::vector<std::vector<std::byte>> dst;
  for (const auto& s : src) dst.emplace_back(s.size(), std::byte{0x5a});
  auto d = spans(dst);
  REQUIRE_FALSE(store.get(keys, d, st, deadline_after(10s)));
  for (std::size_t i = 0; i < keys.size(); ++i) {
    INFO("key " << i);
    REQUIRE(st[i] == chunk_status::hit);
    REQUIRE(dst[i] == src[i]);
  }
  // Digests of another length than their values: refused, nothing sent.
  const auto other = keys_n(2, 32, key_base);
  std::vector<chunk_status> ost(other.size(), chunk_status::miss);
  REQUIRE(store.put_pieces(other, std::span(values).first(2), std::span(digests).subspan(1, 2), ost,
                           deadline_after(10s)) == errc::invalid_argument);
  REQUIRE_FALSE(store.exists(other, ost, deadline_after(10s)));
  for (auto s : ost) REQUIRE(s == chunk_status::miss);
}

TEST_CASE("cluster_store: pinned placement keeps a rank's keys on one master", "[integration]") {
  cluster_store<asio_connection> store(test_ns(ns_model), options_for(cluster().url(), "rank3"));
  const auto keys = keys_n(50, 12, key_base);
  std::set<std::uint16_t> masters;
  for (const auto& k : keys) {
    REQUIRE(store.key_text(k).find("{rank3}") != std::string::npos);
    REQUIRE(kvtier::resp::hash_slot(store.key_text(k)) == kvtier::resp::hash_slot("rank3"));
  }
  std::vector<chunk_status> st(keys.size());
  std::vector<std::vector<std::byte>> src(keys.size(), pattern(64, 7));
  REQUIRE_FALSE(store.put(keys, cspans(src), st, deadline_after(10s)));
  for (const auto& k : keys) masters.insert(store.node_of(k)->port);
  REQUIRE(masters.size() == 1);
}

namespace {
// Moves `slot` from master `from` to master `to` the way redis-cli --cluster reshard does, one
// key at a time, calling `between()` after each key (loads see ASK for migrated keys), then
// assigns the slot (target first, then source, then the others).
template <class F>
void migrate_slot(redis_cluster& c, unsigned slot, std::size_t from, std::size_t to, F between) {
  const std::string s = std::to_string(slot), from_id = c.id(from), to_id = c.id(to);
  REQUIRE(c.node(to).call({"CLUSTER", "SETSLOT", s, "IMPORTING", from_id}) == "OK");
  REQUIRE(c.node(from).call({"CLUSTER", "SETSLOT", s, "MIGRATING", to_id}) == "OK");
  for (int guard = 0; guard < 10000; ++guard) {
    const std::string names = c.node(from).call({"CLUSTER", "GETKEYSINSLOT", s, "1"});
    if (names == "[]") break;
    const std::string name = names.substr(1, names.size() - 2);
    const std::string r = c.node(from).call(
        {"MIGRATE", "127.0.0.1", std::to_string(c.node(to).port()), name, "0", "5000"}, 10s);
    REQUIRE(r == "OK");
    between();
  }
  for (std::size_t i : {to, from}) REQUIRE(c.node(i).call({"CLUSTER", "SETSLOT", s, "NODE", to_id}) == "OK");
  for (std::size_t i = 0; i < c.size(); ++i) {
    if (i == from || i == to || !c.node(i).running()) continue;
    (void)c.node(i).call({"CLUSTER", "SETSLOT", s, "NODE", to_id});  // replicas refuse: fine
  }
}
}  // namespace

TEST_CASE("cluster_store: a slot migrated while loads run: verified hits, ASK then MOVED, no wrong byte",
          "[integration]") {
  redis_cluster& c = cluster();
  // Pinned: all keys share one slot, so migrating that slot moves all of them one by one.
  const std::string tag = "migrate-me";
  const unsigned slot = kvtier::resp::hash_slot(tag);
  cluster_store<asio_connection> writer(test_ns(ns_model), options_for(c.url(), tag));
  const auto keys = keys_n(16, 13, key_base);
  std::vector<std::vector<std::byte>> src;
  for (unsigned i = 0; i < keys.size(); ++i) src.push_back(pattern(300'000 + i, 2000 + i));
  std::vector<chunk_status> st(keys.size());
  REQUIRE_FALSE(writer.put(keys, cspans(src), st, deadline_after(10s)));
  for (auto s : st) REQUIRE(s == chunk_status::stored);
  const std::size_t from = c.master_of_slot(slot);
  REQUIRE(from < c.size());
  std::size_t to = 0;
  for (std::size_t i = 0; i < c.size(); ++i)
    if (i != from && c.node(i).call({"ROLE"}).rfind("[master", 0) == 0) to = i;

  cluster_store<asio_connection> reader(test_ns(ns_model), options_for(c.url(), tag));
  std::atomic<bool> stop{false};
  std::atomic<std::size_t> loads{0}, hits{0}, wrong{0}, other{0};
  auto load_all = [&](cluster_store<asio_connection>& store) {
    std::vector<std::vector<std::byte>> dst;
    for (const auto& s : src) dst.emplace_back(s.size());
    auto d = spans(dst);
    std::vector<chunk_status> got(keys.size());
    (void)store.get(keys, d, got, deadline_after(5s));
    for (std::size_t i = 0; i < keys.size(); ++i) {
      if (got[i] == chunk_status::hit) {
        ++hits;
        if (dst[i] != src[i]) ++wrong;
      } else if (got[i] != chunk_status::miss) {
        ++other;
      }
    }
    ++loads;
  };
  std::thread loader([&] {
    while (!stop) load_all(reader);
  });
  migrate_slot(c, slot, from, to, [&] { load_all(writer); });
  stop = true;
  loader.join();
  load_all(writer);
  load_all(reader);
  INFO("loads " << loads << " hits " << hits << " other " << other);
  REQUIRE(wrong == 0);
  REQUIRE(other == 0);
  REQUIRE(hits == loads * keys.size());   // nothing was lost: every key a verified hit
  REQUIRE(writer.stats().redirects > 0);  // ASK during the migration, MOVED after it
  REQUIRE(writer.node_of(keys[0])->port == c.node(to).port());
  REQUIRE(reader.node_of(keys[0])->port == c.node(to).port());
}

TEST_CASE("cluster_store: a master killed: loads recover after the failover", "[integration]") {
  redis_cluster& c = cluster();
  cluster_store<asio_connection> store(test_ns(ns_model), options_for(c.url()));
  const auto keys = keys_n(24, 14, key_base);
  std::vector<std::vector<std::byte>> src;
  for (unsigned i = 0; i < keys.size(); ++i) src.push_back(pattern(50'000, 3000 + i));
  std::vector<chunk_status> st(keys.size());
  REQUIRE_FALSE(store.put(keys, cspans(src), st, deadline_after(10s)));
  const std::size_t victim = c.master_of_slot(kvtier::resp::hash_slot(store.key_text(keys[0])));
  REQUIRE(victim < c.size());
  // Let the replicas catch up (WAIT needs the writer's own connection: poll the offsets instead).
  for (int i = 0; i < 200; ++i) {
    const std::string role = c.node(victim).call({"ROLE"});  // [master,OFF,[[ip,port,ROFF]]]
    const auto a = role.find(','), b = role.find(',', a + 1);
    const std::string off = role.substr(a + 1, b - a - 1);
    if (role.size() > off.size() && role.find("," + off + "]]") != std::string::npos) break;
    std::this_thread::sleep_for(20ms);
  }
  c.node(victim).kill();
  const auto give_up = kvtier::clock::now() + 20s;
  std::size_t failed_calls = 0, wrong = 0;
  bool recovered = false;
  while (!recovered && kvtier::clock::now() < give_up) {
    std::vector<std::vector<std::byte>> dst(keys.size());
    for (std::size_t i = 0; i < keys.size(); ++i) dst[i].resize(src[i].size());
    auto d = spans(dst);
    const auto dl = deadline_after(500ms);
    const std::error_code ec = store.get(keys, d, st, dl);
    require_by(dl);
    recovered = !ec;
    for (std::size_t i = 0; i < keys.size(); ++i) {
      if (st[i] == chunk_status::hit && dst[i] != src[i]) ++wrong;
      if (recovered && st[i] != chunk_status::hit) recovered = false;
    }
    if (!recovered) ++failed_calls, std::this_thread::sleep_for(100ms);
  }
  INFO("failed calls before recovery: " << failed_calls << "; " << store.last_error());
  REQUIRE(recovered);
  REQUIRE(wrong == 0);
  REQUIRE(store.stats().map_refreshes >= 2);
}

TEST_CASE("cluster_store: every node down: clean errors by the deadline", "[integration]") {
  redis_cluster& c = cluster();
  cluster_store<asio_connection> store(test_ns(ns_model), options_for(c.url()));
  REQUIRE_FALSE(store.refresh(deadline_after(5s)));
  for (std::size_t i = 0; i < c.size(); ++i) c.node(i).kill();
  const auto keys = keys_n(8, 15, key_base);
  std::vector<std::vector<std::byte>> dst(keys.size(), std::vector<std::byte>(1000));
  auto d = spans(dst);
  std::vector<chunk_status> st(keys.size(), chunk_status::hit);
  const auto dl = deadline_after(2s);
  const std::error_code ec = store.get(keys, d, st, dl);
  require_by(dl);
  REQUIRE(ec);
  for (auto s : st) REQUIRE((s == chunk_status::error || s == chunk_status::timeout));
  REQUIRE_FALSE(store.last_error().empty());
}
