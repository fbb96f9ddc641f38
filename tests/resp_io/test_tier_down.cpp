// A down tier fails fast (the connection's and the pool's circuit breaker), against real
// redis-server processes: a stopped server and a wrong password. While the connection is in
// reconnect backoff, every call with a 2 s deadline returns at once with the last connect error
// instead of sleeping until the next attempt; the pool says the tier is down; the store's
// last_error names the cause; a fetch_queue put against the stopped server never holds the
// caller. Asserts on error codes and connect-attempt counts, never on elapsed time.
#include <catch2/catch.hpp>

#include <chrono>
#include <string>
#include <vector>

#include "kvtier/fetch_queue.hpp"
#include "kvtier/resp/asio_connection.hpp"
#include "kvtier/store/remote_store.hpp"
#include "resp_io/io_test_util.hpp"
#include "resp_io/store_test_util.hpp"
#include "support/redis_server.hpp"

using namespace std::chrono_literals;
using kvtier::chunk_status;
using kvtier::deadline_after;
using kvtier::errc;
using kvtier::remote_store;
using kvtier::resp::asio_connection;
using kvtier::test::keys_n;
using kvtier::test::options_for;
using kvtier::test::redis_server;
using kvtier::test::test_ns;

namespace {

// A backoff far longer than the test: every call after the first failed connect is inside it.
kvtier::resp::connection_options long_backoff(const std::string& url) {
  auto o = options_for(url);
  o.reconnect_backoff_min = 60s;
  o.reconnect_backoff_max = 60s;
  return o;
}

std::uint64_t connect_attempts(const kvtier::resp::connection_stats& s) {
  return s.connects + s.connect_failures;
}

}  // namespace

TEST_CASE("tier down: a stopped server costs one connect attempt, then every call fails at once",
          "[integration]") {
  redis_server srv;
  remote_store<asio_connection> store(test_ns(), long_backoff(srv.url()),
                                      {.connections = 2, .reserved_small = 1});
  const auto keys = keys_n(3);
  std::vector<chunk_status> st(keys.size());
  REQUIRE_FALSE(store.exists(keys, st, deadline_after(2s)));
  REQUIRE_FALSE(store.pool().down());
  srv.kill();

  // The first call finds the connection closed by the peer and tries once: refused.
  REQUIRE(store.exists(keys, st, deadline_after(2s)) == errc::connection_refused);
  REQUIRE(store.pool().down());
  REQUIRE(store.pool().down_until().has_value());
  const std::uint64_t attempts = connect_attempts(store.pool().stats());
  // Ten more calls with a 2 s deadline each: none tries again (the backoff is 60 s), none waits.
  for (int i = 0; i < 10; ++i) {
    std::fill(st.begin(), st.end(), chunk_status::hit);
    REQUIRE(store.exists(keys, st, deadline_after(2s)) == errc::connection_refused);
    for (auto s : st) REQUIRE(s == chunk_status::error);
  }
  // A large get would take the other connection (never tried): the pool refuses it too.
  std::vector<std::vector<std::byte>> big(keys.size(), std::vector<std::byte>(200'000));
  const std::vector<std::span<std::byte>> dst(big.begin(), big.end());
  REQUIRE(store.get(keys, dst, st, deadline_after(2s)) == errc::connection_refused);
  REQUIRE(connect_attempts(store.pool().stats()) == attempts);
  REQUIRE(store.pool().stats().down_refusals == 11);
  // The message says the server is down, and why (the refused connect, with the address).
  const std::string why = store.last_error();
  INFO(why);
  REQUIRE(why.find("server down") != std::string::npos);
  REQUIRE(why.find(std::to_string(srv.port())) != std::string::npos);

  // A write-back through the fetch queue: queued and completed off the caller's thread.
  kvtier::fetch_queue q(store, {.workers = 1});
  std::vector<std::byte> v(64);
  const std::vector<std::span<const std::byte>> src(keys.size(), v);
  const kvtier::fetch_handle h = q.put(1, keys, src, deadline_after(2s));
  const std::optional<kvtier::fetch_result> r = q.wait(h, deadline_after(10s));
  REQUIRE(r.has_value());
  REQUIRE(r->ec == errc::connection_refused);
  for (auto s : r->status) REQUIRE(s == chunk_status::error);
  REQUIRE(connect_attempts(store.pool().stats()) == attempts);
}

TEST_CASE("tier down: a wrong password fails at once while in backoff, with the server's words",
          "[integration]") {
  redis_server srv({.extra_args = {"--requirepass", "right"}, .harness_password = "right"});
  auto u = kvtier::resp::parse_url("resp://:wrong@127.0.0.1:" + std::to_string(srv.port()));
  REQUIRE(u);
  kvtier::resp::connection_options o{.server = u.value};
  o.reconnect_backoff_min = 60s;
  remote_store<asio_connection> store(test_ns(), o);
  const auto keys = keys_n(2);
  std::vector<chunk_status> st(keys.size());
  REQUIRE(store.exists(keys, st, deadline_after(2s)) == errc::auth_failed);
  REQUIRE(connect_attempts(store.pool().stats()) == 1);
  for (int i = 0; i < 5; ++i) REQUIRE(store.exists(keys, st, deadline_after(2s)) == errc::auth_failed);
  REQUIRE(connect_attempts(store.pool().stats()) == 1);
  REQUIRE(store.pool().down());
  INFO(store.last_error());
  REQUIRE(store.last_error().find("WRONGPASS") != std::string::npos);
}

TEST_CASE("tier down: the breaker closes once the server is back and the backoff has ended",
          "[integration]") {
  redis_server srv;
  auto o = options_for(srv.url());
  o.reconnect_backoff_min = 0ms;  // no backoff: the next call tries again
  o.reconnect_backoff_max = 0ms;
  remote_store<asio_connection> store(test_ns(), o);
  const auto keys = keys_n(2);
  std::vector<chunk_status> st(keys.size());
  srv.kill();
  REQUIRE(store.exists(keys, st, deadline_after(2s)) == errc::connection_refused);
  REQUIRE_FALSE(store.pool().down());  // a zero backoff never trips it
  srv.restart();
  REQUIRE_FALSE(store.exists(keys, st, deadline_after(5s)));
  REQUIRE_FALSE(store.pool().down());
}

TEST_CASE("messages: a deadline already past says so", "[integration]") {
  redis_server srv;
  remote_store<asio_connection> store(test_ns(), options_for(srv.url()));
  const auto keys = keys_n(2);
  std::vector<chunk_status> st(keys.size());
  REQUIRE(store.exists(keys, st, kvtier::clock::now() - 1ms) == errc::timeout);
  for (auto s : st) REQUIRE(s == chunk_status::timeout);
  INFO(store.last_error());
  REQUIRE(store.last_error().find("deadline had passed") != std::string::npos);
  REQUIRE(store.last_error().find("no pooled connection") == std::string::npos);
}
