// A silent server trips the pool's circuit breaker (resp/pool.hpp), against real servers: a black
// hole (a loopback listener that accepts but never reads or answers) on every transport, and a
// SIGSTOPped redis-server (plain and TLS), one rendezvous_store instance among live ones, and a
// TLS-only port spoken to in plain RESP. After `timeouts_to_trip` calls in a row time out (or
// connect and are hung up on before any reply), every call fails at once (no batch sent, no new
// timeout counted) with the last error in words; after each backoff the pool's prober sends a
// PING: silent again, it trips again at once; answered (SIGCONT), the server is back.
// Asserts on counts (batches, timeouts, refusals, trips), never on elapsed time.
#include <catch2/catch.hpp>

#include <signal.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "kvtier/metrics.hpp"
#include "kvtier/resp/asio_connection.hpp"
#include "kvtier/resp/uring_connection.hpp"
#include "kvtier/store/cluster_store.hpp"
#include "kvtier/store/remote_store.hpp"
#include "kvtier/store/rendezvous_store.hpp"
#include "resp_io/io_test_util.hpp"
#include "resp_io/store_test_util.hpp"
#include "support/redis_cluster.hpp"
#include "support/redis_server.hpp"
#if KVTIER_TEST_TLS
#include "kvtier/resp/asio_tls_connection.hpp"
#include "support/test_pki.hpp"
#endif

using namespace std::chrono_literals;
using kvtier::chunk_status;
using kvtier::deadline_after;
using kvtier::errc;
using kvtier::remote_store;
using kvtier::resp::asio_connection;
using kvtier::resp::uring_connection;
using kvtier::test::black_hole_server;  // accepts, never reads or answers: a hung host
using kvtier::test::keys_n;
using kvtier::test::options_for;
using kvtier::test::redis_server;
using kvtier::test::test_ns;

namespace {

// SIGSTOPs a server for the scope (SIGCONT on the way out, so its destructor can stop it).
class stopped {
 public:
  explicit stopped(const redis_server& s) : pid_(s.pid()) { ::kill(pid_, SIGSTOP); }
  stopped(const stopped&) = delete;
  stopped& operator=(const stopped&) = delete;
  ~stopped() { resume(); }
  void resume() {
    if (pid_ > 0) ::kill(std::exchange(pid_, -1), SIGCONT);
  }

 private:
  pid_t pid_;
};

constexpr std::size_t trip_after = 2;
constexpr auto short_call = 300ms;  // a call against a silent server costs this, once per timeout

// Trips after two timeouts in a row; `backoff` long enough (or not) for the test to probe.
kvtier::resp::pool_options pool_of(std::chrono::milliseconds backoff) {
  return {.connections = 2,
          .reserved_small = 1,
          .timeouts_to_trip = trip_after,
          .silence_backoff_min = backoff,
          .silence_backoff_max = backoff};
}

// Waits (bounded) until the prober has sent `n` probes and the last one has ended.
template <class Store>
void wait_until_probes(Store& store, std::uint64_t n) {
  for (int i = 0; i < 2000 && !(store.pool().breaker().probes >= n && store.pool().breaker().trips > n); ++i)
    std::this_thread::sleep_for(10ms);
  REQUIRE(store.pool().breaker().probes >= n);
}

// Waits (bounded) until a probe was answered and the server is up.
template <class Store>
void wait_until_up(Store& store) {
  for (int i = 0; i < 2000 && store.pool().breaker().down; ++i) std::this_thread::sleep_for(10ms);
  REQUIRE_FALSE(store.pool().breaker().down);
}

// Two calls time out, then ten calls (lookups and saves, each with a 2 s deadline) fail at once:
// no batch reaches a connection, no timeout is added, the store counts the refusals.
template <class Store>
void require_trips_then_fails_fast(Store& store) {
  const auto keys = keys_n(3);
  std::vector<chunk_status> st(keys.size());
  for (std::size_t i = 0; i < trip_after; ++i) {
    REQUIRE_FALSE(store.pool().breaker().down);
    REQUIRE(store.exists(keys, st, deadline_after(short_call)) == errc::timeout);
  }
  const auto b = store.pool().breaker();
  REQUIRE(b.down);
  REQUIRE(b.trips == 1);
  REQUIRE(store.stats().breaker_trips == 1);
  REQUIRE(b.consecutive_timeouts == trip_after);  // batches or handshakes that got no answer
  const auto before = store.pool().stats();
  const auto probes_before = store.pool().breaker().probes;
  std::vector<std::vector<std::byte>> src(keys.size(), std::vector<std::byte>(1000, std::byte{7}));
  for (int i = 0; i < 5; ++i) {
    std::fill(st.begin(), st.end(), chunk_status::hit);
    REQUIRE(store.exists(keys, st, deadline_after(2s)) == errc::timeout);  // a lookup: a miss, at once
    for (auto s : st) REQUIRE(s == chunk_status::timeout);
    REQUIRE(store.put(keys, kvtier::test::cspans(src), st, deadline_after(2s)) == errc::timeout);  // skipped
    for (auto s : st) REQUIRE(s == chunk_status::timeout);
  }
  const auto after = store.pool().stats();
  // Nothing was sent and no call waited for its deadline; only the prober's PINGs (off every
  // call, after a short backoff) may have gone meanwhile.
  const auto probes = store.pool().breaker().probes - probes_before;
  REQUIRE(after.batches - before.batches <= probes);
  REQUIRE(after.timeouts - before.timeouts <= probes);
  REQUIRE(after.connect_failures - before.connect_failures <= probes);
  REQUIRE(store.stats().down_refusals == 10);
  REQUIRE(store.pool().breaker().refusals == 10);
  std::string text;  // and in the metrics
  kvtier::write_prometheus(text, store.stats(), "kvtier_l2", "rank=\"0\"");
  INFO(text);
  REQUIRE(text.find("kvtier_l2_down_refusals_total{rank=\"0\"} 10\n") != std::string::npos);
  REQUIRE(text.find("kvtier_l2_breaker_trips_total{rank=\"0\"} 1\n") != std::string::npos);
  const std::string why = store.last_error();
  INFO(why);
  REQUIRE(why.find("server down (silent") != std::string::npos);
  REQUIRE(why.find("2 calls in a row timed out") != std::string::npos);
}

}  // namespace

TEMPLATE_TEST_CASE(
    "silent server: a black hole trips the breaker after two timeouts, then calls fail at once",
    "[integration]", asio_connection, uring_connection) {
  black_hole_server hole;
  remote_store<TestType> store(test_ns(), options_for(hole.url()), pool_of(60s));
  require_trips_then_fails_fast(store);
}

TEST_CASE("silent server: a SIGSTOPped redis-server trips the breaker; a half-open probe brings it back",
          "[integration]") {
  redis_server srv;
  remote_store<asio_connection> store(test_ns(), options_for(srv.url()), pool_of(200ms));
  const auto keys = keys_n(3);
  std::vector<std::vector<std::byte>> src(keys.size(), std::vector<std::byte>(1000, std::byte{9}));
  kvtier::test::require_round_trip(store, keys, src);
  std::vector<chunk_status> st(keys.size());
  {
    stopped pause(srv);
    require_trips_then_fails_fast(store);
    // The backoff ends: the prober's PING (not a caller's call) times out and trips the breaker
    // again at once (no second timeout needed); calls meanwhile are still refused at once.
    wait_until_probes(store, 1);
    REQUIRE(store.pool().breaker().trips >= 2);
    const auto timeouts = store.pool().stats().timeouts;
    const auto probes = store.pool().breaker().probes;
    const auto refusals = store.pool().breaker().refusals;
    REQUIRE(store.exists(keys, st, deadline_after(10s)) == errc::timeout);
    REQUIRE(store.pool().breaker().refusals == refusals + 1);  // refused, not let through as a probe
    REQUIRE(store.pool().stats().timeouts - timeouts <= store.pool().breaker().probes - probes);
    REQUIRE(store.pool().breaker().down);
    pause.resume();
    // Back: a later probe is answered and the server is up, with no call of ours to bring it.
    wait_until_up(store);
    REQUIRE_FALSE(store.exists(keys, st, deadline_after(10s)));
    for (auto s : st) REQUIRE(s == chunk_status::hit);
  }
  const auto b = store.pool().breaker();
  REQUIRE_FALSE(b.down);
  REQUIRE(b.probes >= 2);
  REQUIRE(b.consecutive_timeouts == 0);
  kvtier::test::require_round_trip(store, keys, src);  // every call goes through again
}

TEST_CASE("silent server: one silent rendezvous_store instance fails fast; the others keep serving",
          "[integration]") {
  redis_server live;
  black_hole_server hole;
  remote_store<asio_connection> a(test_ns(), options_for(live.url()), pool_of(60s));
  remote_store<asio_connection> b(test_ns(), options_for(hole.url()), pool_of(60s));
  kvtier::rendezvous_store<remote_store<asio_connection>> l2({&a, &b});
  const auto keys = keys_n(32);
  std::vector<std::vector<std::byte>> src(keys.size(), std::vector<std::byte>(500, std::byte{3}));
  std::vector<chunk_status> st(keys.size());
  for (std::size_t i = 0; i < trip_after; ++i)
    REQUIRE(l2.put(keys, kvtier::test::cspans(src), st, deadline_after(short_call)) == errc::timeout);
  REQUIRE(b.pool().breaker().down);
  REQUIRE_FALSE(a.pool().breaker().down);
  const auto sent = b.pool().stats().batches;
  REQUIRE(l2.put(keys, kvtier::test::cspans(src), st, deadline_after(2s)) == errc::timeout);
  std::size_t stored = 0, refused = 0;
  for (auto s : st) (s == chunk_status::stored ? stored : refused) += 1;
  REQUIRE(stored > 0);   // the live instance's keys
  REQUIRE(refused > 0);  // the silent one's, skipped at once
  REQUIRE(b.pool().stats().batches == sent);
  REQUIRE(b.stats().down_refusals == 1);
  REQUIRE(a.stats().down_refusals == 0);
}

TEST_CASE("silent server: a SIGSTOPped cluster master trips its own node's breaker; the others serve",
          "[integration]") {
  kvtier::test::redis_cluster cluster({.masters = 3, .replicas_per_master = 0});
  auto u = kvtier::resp::parse_cluster_url(cluster.url());
  REQUIRE(u);
  kvtier::cluster_store<asio_connection> store(test_ns(), {.seeds = u.seeds, .pool = pool_of(60s)});
  const auto keys = keys_n(24);
  std::vector<std::vector<std::byte>> src(keys.size(), std::vector<std::byte>(500, std::byte{4}));
  kvtier::test::require_round_trip(store, keys, src);
  std::vector<bool> on_stopped(keys.size());
  std::size_t n_stopped = 0;
  for (std::size_t i = 0; i < keys.size(); ++i)
    n_stopped += on_stopped[i] = store.node_of(keys[i])->port == cluster.node(0).port();
  REQUIRE(n_stopped > 0);
  REQUIRE(n_stopped < keys.size());
  std::vector<chunk_status> st(keys.size());
  stopped pause(cluster.node(0));
  for (std::size_t i = 0; i < trip_after; ++i)
    REQUIRE(store.exists(keys, st, deadline_after(short_call)) == errc::timeout);
  REQUIRE(store.stats().breaker_trips == 1);  // the stopped master's pool only
  const auto refused = store.stats().down_refusals;
  // The live masters answer; the stopped one's keys are refused at once (not by the 10 s deadline:
  // its breaker is down for 60 s, so a call that waited would time out with every key unserved).
  REQUIRE(store.exists(keys, st, deadline_after(10s)));
  for (std::size_t i = 0; i < keys.size(); ++i) REQUIRE((st[i] == chunk_status::hit) == !on_stopped[i]);
  REQUIRE(store.stats().down_refusals > refused);
  REQUIRE(store.stats().breaker_trips == 1);
  INFO(store.last_error());
  REQUIRE(store.last_error().find("server down (silent") != std::string::npos);
}

#if KVTIER_TEST_TLS
TEST_CASE("silent server: a SIGSTOPped TLS server trips the breaker too", "[integration]") {
  static kvtier::test::test_pki pki;
  redis_server srv({.tls_args = pki.server_args("server")});
  auto u = kvtier::resp::parse_url("rediss://127.0.0.1:" + std::to_string(srv.tls_port()));
  REQUIRE(u);
  kvtier::resp::connection_options o{.server = u.value};
  o.tls.ca_file = pki.path("ca.pem");
  o.tls.cert_file = pki.path("client.pem");
  o.tls.key_file = pki.path("client.key");
  remote_store<kvtier::resp::asio_tls_connection> store(test_ns(), o, pool_of(60s));
  const auto keys = keys_n(3);
  std::vector<std::vector<std::byte>> src(keys.size(), std::vector<std::byte>(1000, std::byte{5}));
  kvtier::test::require_round_trip(store, keys, src);
  stopped pause(srv);
  require_trips_then_fails_fast(store);
}

TEST_CASE("silent server: a TLS-only port spoken to in plain RESP trips the breaker; calls then fail at once",
          "[integration]") {
  static kvtier::test::test_pki pki;
  redis_server srv({.tls_args = pki.server_args("server")});
  // Each call connects (TCP), sends its command, and the server hangs up before any reply.
  remote_store<asio_connection> store(
      test_ns(), options_for("resp://127.0.0.1:" + std::to_string(srv.tls_port())), pool_of(60s));
  const auto keys = keys_n(3);
  std::vector<chunk_status> st(keys.size());
  for (std::size_t i = 0; i < trip_after; ++i) {
    REQUIRE_FALSE(store.pool().breaker().down);
    REQUIRE(store.exists(keys, st, deadline_after(10s)) == errc::connection_lost);
  }
  const auto b = store.pool().breaker();
  REQUIRE(b.down);
  REQUIRE(b.trips == 1);
  REQUIRE(b.consecutive_timeouts == trip_after);
  const auto before = store.pool().stats();
  std::vector<std::vector<std::byte>> src(keys.size(), std::vector<std::byte>(1000, std::byte{6}));
  for (int i = 0; i < 5; ++i) {
    REQUIRE(store.exists(keys, st, deadline_after(10s)) == errc::connection_lost);  // a miss, at once
    REQUIRE(store.put(keys, kvtier::test::cspans(src), st, deadline_after(10s)) == errc::connection_lost);
  }
  const auto after = store.pool().stats();
  REQUIRE(after.connects == before.connects);  // no call reconnected
  REQUIRE(after.batches == before.batches);
  REQUIRE(store.stats().down_refusals == 10);
  const std::string why = store.last_error();
  INFO(why);
  REQUIRE(why.find("server down (failing") != std::string::npos);
  REQUIRE(why.find("before any reply") != std::string::npos);
}
#endif
