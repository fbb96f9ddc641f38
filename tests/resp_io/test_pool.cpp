// Unit tests of connection_pool: size classes, the deadline to get a connection, lease hand-back, the
// breaker.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "kvtier/resp/pool.hpp"

using namespace std::chrono_literals;
using kvtier::deadline_after;
using kvtier::errc;
using kvtier::resp::batch;
using kvtier::resp::connection_options;
using kvtier::resp::connection_stats;
using kvtier::resp::request_size;

namespace {

// A connection that does no I/O: counts batches, so the pool's stats can be checked.
class fake_connection {
 public:
  explicit fake_connection(connection_options opt) : opt_(std::move(opt)) {}
  std::error_code execute(batch& b, kvtier::deadline) {
    ++stats_.batches;
    stats_.commands += b.size();
    return {};
  }
  std::error_code connect(kvtier::deadline) { return {}; }
  std::error_code ping(kvtier::deadline) { return {}; }
  void close() {}
  bool connected() const { return true; }
  const connection_options& options() const { return opt_; }
  connection_stats stats() const { return stats_; }

 private:
  connection_options opt_;
  connection_stats stats_{};
};
static_assert(kvtier::resp::connection<fake_connection>);
using pool_t = kvtier::resp::connection_pool<fake_connection>;

}  // namespace

TEST_CASE("pool: large requests leave the reserved connections to small ones", "[unit]") {
  pool_t pool(connection_options{}, {.connections = 3, .reserved_small = 1});
  pool_t::lease a, b, c, d;
  REQUIRE_FALSE(pool.acquire(request_size::large, deadline_after(1s), a));
  REQUIRE_FALSE(pool.acquire(request_size::large, deadline_after(1s), b));
  REQUIRE(a.index() != b.index());
  REQUIRE(a.index() >= 1);
  REQUIRE(b.index() >= 1);
  // Every large connection is busy: a third large request waits until its deadline ...
  REQUIRE(pool.acquire(request_size::large, deadline_after(30ms), c) == errc::timeout);
  REQUIRE_FALSE(c);
  // ... but a small one gets the reserved connection at once.
  REQUIRE_FALSE(pool.acquire(request_size::small, deadline_after(1s), c));
  REQUIRE(c.index() == 0);
  // Now nothing is free for anyone.
  REQUIRE(pool.acquire(request_size::small, deadline_after(30ms), d) == errc::timeout);
  b.release();
  REQUIRE_FALSE(pool.acquire(request_size::small, deadline_after(1s), d));
  REQUIRE(d.index() != a.index());
}

TEST_CASE("pool: small requests take the reserved connections first", "[unit]") {
  pool_t pool(connection_options{}, {.connections = 4, .reserved_small = 2});
  pool_t::lease s1, s2, s3;
  REQUIRE_FALSE(pool.acquire(request_size::small, deadline_after(1s), s1));
  REQUIRE_FALSE(pool.acquire(request_size::small, deadline_after(1s), s2));
  REQUIRE(s1.index() + s2.index() == 1);  // 0 and 1
  REQUIRE_FALSE(pool.acquire(request_size::small, deadline_after(1s), s3));
  REQUIRE(s3.index() >= 2);  // reserved ones busy: a small request may use a large connection
}

TEST_CASE("pool: a single connection is never reserved; a lease moves and returns once", "[unit]") {
  pool_t pool(connection_options{}, {.connections = 1, .reserved_small = 5});
  REQUIRE(pool.reserved_small() == 0);
  pool_t::lease a;
  REQUIRE_FALSE(pool.acquire(request_size::large, deadline_after(1s), a));
  pool_t::lease moved = std::move(a);
  REQUIRE_FALSE(a);
  REQUIRE(moved);
  a.release();  // an empty lease gives nothing back
  pool_t::lease b;
  REQUIRE(pool.acquire(request_size::small, deadline_after(20ms), b) == errc::timeout);
  batch bt;
  bt.add({"PING"});
  REQUIRE_FALSE(moved.conn().execute(bt, deadline_after(1s)));
  moved = pool_t::lease{};  // move-assigning an empty lease gives the connection back
  REQUIRE_FALSE(pool.acquire(request_size::small, deadline_after(1s), b));
  b.release();
  REQUIRE(pool.stats().batches == 1);  // counted once the connection came back
}

TEST_CASE("pool: a waiter is woken by a release and each connection has one holder", "[unit][tsan]") {
  pool_t pool(connection_options{}, {.connections = 3, .reserved_small = 1});
  std::vector<std::atomic<int>> holders(3);
  std::atomic<int> violations{0}, acquired{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < 6; ++t) {
    ts.emplace_back([&, t] {
      for (int i = 0; i < 300; ++i) {
        pool_t::lease l;
        const auto kind = (t + i) % 3 == 0 ? request_size::small : request_size::large;
        if (pool.acquire(kind, kvtier::no_deadline, l)) continue;
        if (kind == request_size::large && l.index() == 0) violations.fetch_add(1);
        if (holders[l.index()].fetch_add(1) != 0) violations.fetch_add(1);
        std::this_thread::yield();
        holders[l.index()].fetch_sub(1);
        acquired.fetch_add(1);
      }
    });
  }
  for (auto& t : ts) t.join();
  REQUIRE(violations == 0);
  REQUIRE(acquired == 6 * 300);
}

namespace {

// A connection whose connects fail until told otherwise: in backoff for `backoff` after each
// failed attempt (like connection_base), so the pool's breaker can be driven without a server.
class flaky_connection {
 public:
  explicit flaky_connection(connection_options opt) : opt_(std::move(opt)) {}
  static inline std::atomic<bool> server_up{false};
  static inline kvtier::clock::duration backoff = std::chrono::hours(1);
  std::error_code execute(batch&, kvtier::deadline) {
    ++stats_.batches;
    if (server_up) return connected_ = true, std::error_code{};
    ++stats_.connect_failures;
    connected_ = false;
    next_attempt_ = kvtier::clock::now() + backoff;
    last_error_ = "127.0.0.1:1: connect (connection refused)";
    return make_error_code(errc::connection_refused);
  }
  std::error_code connect(kvtier::deadline) { return {}; }
  std::error_code ping(kvtier::deadline) { return {}; }
  void close() {}
  bool connected() const { return connected_; }
  const connection_options& options() const { return opt_; }
  connection_stats stats() const { return stats_; }
  std::optional<kvtier::clock::time_point> down_until() const {
    if (connected_ || next_attempt_ <= kvtier::clock::now()) return std::nullopt;
    return next_attempt_;
  }
  std::error_code last_connect_error() const { return make_error_code(errc::connection_refused); }
  const std::string& last_error() const { return last_error_; }

 private:
  connection_options opt_;
  connection_stats stats_{};
  bool connected_ = false;
  kvtier::clock::time_point next_attempt_{};
  std::string last_error_;
};

}  // namespace

TEST_CASE("pool: a connection back in reconnect backoff trips the pool; a success closes it", "[unit]") {
  using flaky_pool = kvtier::resp::connection_pool<flaky_connection>;
  flaky_connection::server_up = false;
  flaky_connection::backoff = std::chrono::hours(1);
  flaky_pool pool(connection_options{}, {.connections = 3, .reserved_small = 1});
  batch b;
  b.add({"PING"});
  {
    flaky_pool::lease l;
    REQUIRE_FALSE(pool.acquire(request_size::small, deadline_after(1s), l));
    REQUIRE(l.conn().execute(b, deadline_after(1s)) == errc::connection_refused);
  }
  REQUIRE(pool.down());
  // Every later call fails at once with the connect error, whatever its size or deadline, and no
  // other connection is lent to try again.
  for (auto kind : {request_size::small, request_size::large}) {
    flaky_pool::lease l;
    std::string why;
    REQUIRE(pool.acquire(kind, kvtier::no_deadline, l, &why) == errc::connection_refused);
    REQUIRE_FALSE(l);
    REQUIRE(why.find("server down") != std::string::npos);
    REQUIRE(why.find("connection refused") != std::string::npos);
  }
  REQUIRE(pool.stats().connect_failures == 1);
  REQUIRE(pool.stats().down_refusals == 2);

  // Once the backoff has ended a call may try again; a success closes the breaker.
  flaky_connection::backoff = std::chrono::nanoseconds(0);
  flaky_connection::server_up = true;
  flaky_pool fresh(connection_options{}, {.connections = 2});
  flaky_connection::server_up = false;
  {
    flaky_pool::lease l;
    REQUIRE_FALSE(fresh.acquire(request_size::small, deadline_after(1s), l));
    REQUIRE(l.conn().execute(b, deadline_after(1s)) == errc::connection_refused);
  }
  REQUIRE_FALSE(fresh.down());  // a backoff that has already ended does not trip it
  flaky_connection::server_up = true;
  flaky_pool::lease l;
  REQUIRE_FALSE(fresh.acquire(request_size::large, deadline_after(1s), l));
  REQUIRE_FALSE(l.conn().execute(b, deadline_after(1s)));
}

TEST_CASE("pool: why a call got no connection: deadline already past, or none free in time", "[unit]") {
  pool_t pool(connection_options{}, {.connections = 1});
  pool_t::lease a, b;
  std::string why;
  REQUIRE(pool.acquire(request_size::small, kvtier::clock::now() - 1ms, a, &why) == errc::timeout);
  REQUIRE(why.find("deadline had passed") != std::string::npos);
  REQUIRE_FALSE(pool.acquire(request_size::small, deadline_after(1s), a));
  REQUIRE(pool.acquire(request_size::small, deadline_after(20ms), b, &why) == errc::timeout);
  REQUIRE(why.find("no pooled connection came free") != std::string::npos);
}

namespace {

// A connection to a server that accepts each connect and hangs up before any reply (a TLS-only
// port spoken to in plain RESP) until told otherwise: every call connects anew and fails.
class hangup_connection {
 public:
  explicit hangup_connection(connection_options opt) : opt_(std::move(opt)) {}
  static inline std::atomic<bool> server_speaks{false};
  std::error_code execute(batch&, kvtier::deadline) {
    ++stats_.batches, ++stats_.connects;
    if (server_speaks) return ++stats_.bytes_read, std::error_code{};
    ++stats_.failures;
    return make_error_code(errc::connection_lost);
  }
  std::error_code connect(kvtier::deadline) { return {}; }
  std::error_code ping(kvtier::deadline dl) {
    batch b;
    return execute(b, dl);
  }
  void close() {}
  bool connected() const { return false; }
  const connection_options& options() const { return opt_; }
  connection_stats stats() const { return stats_; }
  const std::string& last_error() const { return last_error_; }

 private:
  connection_options opt_;
  connection_stats stats_{};
  std::string last_error_ = "127.0.0.1:1: the server closed the connection before any reply";
};

}  // namespace

TEST_CASE("pool: a server that hangs up before any reply trips the breaker; the prober brings it back",
          "[unit]") {
  using hangup_pool = kvtier::resp::connection_pool<hangup_connection>;
  hangup_connection::server_speaks = false;
  hangup_pool pool(connection_options{}, {.connections = 2,
                                          .reserved_small = 1,
                                          .timeouts_to_trip = 2,
                                          .silence_backoff_min = 1ms,
                                          .silence_backoff_max = 1ms});
  batch b;
  b.add({"EXISTS", "k"});
  for (int i = 0; i < 2; ++i) {
    REQUIRE_FALSE(pool.breaker().down);
    hangup_pool::lease l;
    REQUIRE_FALSE(pool.acquire(request_size::small, deadline_after(10s), l));
    REQUIRE(l.conn().execute(b, deadline_after(10s)) == errc::connection_lost);
  }
  REQUIRE(pool.breaker().down);
  REQUIRE(pool.breaker().trips >= 1);
  {  // refused at once with the call's own error and words, however long its deadline
    hangup_pool::lease l;
    std::string why;
    REQUIRE(pool.acquire(request_size::large, deadline_after(10s), l, &why) == errc::connection_lost);
    REQUIRE_FALSE(l);
    REQUIRE(why.find("server down (failing") != std::string::npos);
    REQUIRE(why.find("before any reply") != std::string::npos);
  }
  // The prober's PINGs (never a caller's call) find the server back.
  hangup_connection::server_speaks = true;
  for (int i = 0; i < 2000 && pool.breaker().down; ++i) std::this_thread::sleep_for(5ms);
  REQUIRE_FALSE(pool.breaker().down);
  REQUIRE(pool.breaker().probes >= 1);
  hangup_pool::lease l;
  REQUIRE_FALSE(pool.acquire(request_size::small, deadline_after(10s), l));
  REQUIRE_FALSE(l.conn().execute(b, deadline_after(10s)));
}
