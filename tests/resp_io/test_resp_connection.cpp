// Integration tests of the RESP connections (Asio and io_uring) against real redis-server
// processes started on free loopback ports, and a black-hole server.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "kvtier/resp/asio_connection.hpp"
#include "kvtier/resp/uring_connection.hpp"
#include "resp_io/io_test_util.hpp"
#include "support/redis_server.hpp"

using namespace std::chrono_literals;
using kvtier::deadline_after;
using kvtier::errc;
using kvtier::resp::asio_connection;
using kvtier::resp::batch;
using kvtier::resp::type;
using kvtier::resp::uring_connection;
using kvtier::test::black_hole_server;
using kvtier::test::options_for;
using kvtier::test::pattern;
using kvtier::test::redis_server;
using kvtier::test::require_returned_by;

TEMPLATE_TEST_CASE("connection: pipelined commands, misses and error replies", "[integration]",
                   asio_connection, uring_connection) {
  redis_server srv;
  TestType conn(options_for(srv.url()));
  REQUIRE_FALSE(conn.connected());
  REQUIRE_FALSE(conn.ping(deadline_after(2s)));
  REQUIRE(conn.connected());

  batch b;
  for (int i = 0; i < 100; ++i) b.add({"SET", "k" + std::to_string(i), "v" + std::to_string(i)});
  for (int i = 0; i < 100; ++i) b.add({"GET", "k" + std::to_string(i)});
  b.add({"GET", "missing"});
  b.add({"INCR", "k1"});  // error reply: not an integer
  b.add({"DBSIZE"});
  REQUIRE_FALSE(conn.execute(b, deadline_after(5s)));
  REQUIRE(b.completed() == 203);
  for (int i = 0; i < 100; ++i) {
    REQUIRE(b.reply(i).str == "OK");
    REQUIRE(b.reply(100 + i).str == "v" + std::to_string(i));
  }
  REQUIRE(b.reply(200).is_null());
  REQUIRE(b.reply(201).is_error());
  REQUIRE(kvtier::resp::reply_error(b.reply(201)) == errc::server_error);
  REQUIRE(b.reply(202).kind == type::integer);
  REQUIRE(b.reply(202).integer == 100);

  // A GET into a destination of the wrong size: stream stays in sync, nothing delivered.
  std::vector<std::byte> small(3);
  b.clear();
  b.add_into({"GET", "k10"}, std::span<std::byte>(small));
  b.add_into({"GET", "k11"}, std::span<std::byte>(small.data(), 2));
  b.add_into({"GET", "missing"}, std::span<std::byte>(small));
  b.add({"PING"});
  REQUIRE_FALSE(conn.execute(b, deadline_after(5s)));
  REQUIRE(b.reply(0).into_destination);
  REQUIRE(std::string(reinterpret_cast<const char*>(small.data()), 3) == "v10");
  REQUIRE_FALSE(b.reply(1).into_destination);
  REQUIRE(b.reply(1).length == 3);  // "v11" does not fit 2 bytes: read and discarded
  REQUIRE(b.reply(2).is_null());
  REQUIRE(b.reply(3).str == "PONG");
  REQUIRE(conn.stats().connects == 1);
}

TEMPLATE_TEST_CASE("connection: 12.4 MB values round-trip bit-exact (TCP and Unix socket)", "[integration]",
                   asio_connection, uring_connection) {
  redis_server srv({.unix_socket = true});
  constexpr std::size_t value_bytes = 12'400'000;
  constexpr int values = 8;
  std::vector<std::vector<std::byte>> src, dst;
  for (int i = 0; i < values; ++i) {
    src.push_back(pattern(value_bytes, static_cast<unsigned>(i)));
    dst.emplace_back(value_bytes);
  }
  for (const std::string& url : {srv.url(), srv.unix_url()}) {
    INFO(url);
    TestType conn(options_for(url));
    batch b;
    std::vector<std::span<const std::byte>> parts;
    for (int i = 0; i < values; ++i) parts.emplace_back(src[i]);
    for (int i = 0; i < values; ++i)
      b.add_with_payload({"SET", "big" + std::to_string(i)},
                         std::span<const std::span<const std::byte>>(parts).subspan(i, 1));
    REQUIRE_FALSE(conn.execute(b, deadline_after(20s)));
    for (int i = 0; i < values; ++i) REQUIRE(b.reply(i).str == "OK");
    b.clear();
    for (int i = 0; i < values; ++i) {
      std::fill(dst[i].begin(), dst[i].end(), std::byte{0});
      b.add_into({"GET", "big" + std::to_string(i)}, std::span<std::byte>(dst[i]));
    }
    REQUIRE_FALSE(conn.execute(b, deadline_after(20s)));
    for (int i = 0; i < values; ++i) {
      REQUIRE(b.reply(i).into_destination);
      REQUIRE(b.reply(i).length == value_bytes);
      REQUIRE(dst[i] == src[i]);
    }
  }
}

// Asio's payload reads set SO_RCVLOWAT to the slice they wait for: the mark must never ask for
// more than the reply still holds (its last slice, an odd length, a value after a value) nor
// stall behind a receive buffer smaller than the mark (a fixed 16 KiB buffer here).
TEMPLATE_TEST_CASE("connection: payloads of odd lengths arrive whole, also through a small socket buffer",
                   "[integration]", asio_connection, uring_connection) {
  redis_server srv;
  const std::vector<std::size_t> lengths = {1, 4095, 65537, (1u << 20) - 1, (1u << 20) + 1, 3'000'001};
  for (int buffer : {0, 16 << 10}) {
    INFO("socket_buffer_bytes " << buffer);
    auto opt = options_for(srv.url());
    opt.socket_buffer_bytes = buffer;
    TestType conn(opt);
    std::vector<std::vector<std::byte>> src, dst;
    batch b;
    std::vector<std::span<const std::byte>> parts;
    for (std::size_t i = 0; i < lengths.size(); ++i) {
      src.push_back(pattern(lengths[i], static_cast<unsigned>(i + 3)));
      dst.emplace_back(lengths[i]);
    }
    for (const auto& v : src) parts.emplace_back(v);
    for (std::size_t i = 0; i < lengths.size(); ++i)
      b.add_with_payload({"SET", "odd" + std::to_string(i)},
                         std::span<const std::span<const std::byte>>(parts).subspan(i, 1));
    REQUIRE_FALSE(conn.execute(b, deadline_after(20s)));
    // One value per batch (its last slice ends the batch) and all of them in one batch.
    for (std::size_t i = 0; i < lengths.size(); ++i) {
      b.clear();
      b.add_into({"GET", "odd" + std::to_string(i)}, std::span<std::byte>(dst[i]));
      REQUIRE_FALSE(conn.execute(b, deadline_after(20s)));
      REQUIRE(b.reply(0).into_destination);
      REQUIRE(dst[i] == src[i]);
    }
    b.clear();
    for (std::size_t i = 0; i < lengths.size(); ++i) {
      std::fill(dst[i].begin(), dst[i].end(), std::byte{0});
      b.add_into({"GET", "odd" + std::to_string(i)}, std::span<std::byte>(dst[i]));
    }
    b.add({"PING"});  // a small reply after the payloads: the mark is back at 1 byte
    REQUIRE_FALSE(conn.execute(b, deadline_after(20s)));
    for (std::size_t i = 0; i < lengths.size(); ++i) REQUIRE(dst[i] == src[i]);
    REQUIRE(b.reply(lengths.size()).str == "PONG");
  }
}

TEMPLATE_TEST_CASE("connection: a batch that takes far more reads than one turn of the receive loop",
                   "[integration]", asio_connection, uring_connection) {
  // A 32-byte parser buffer makes every read short: 300 replies and a 1 MiB value take hundreds
  // of reads, more than the Asio transport's receive loop does inline before it hands the loop
  // back to its io_context (max_reads_inline), so that hand-over is exercised too.
  redis_server srv;
  auto opt = options_for(srv.url());
  opt.limits.buffer_bytes = kvtier::resp::parser::min_buffer_bytes;
  TestType conn(opt);
  const auto big = pattern(1 << 20, 7);
  const std::span<const std::byte> big_part(big);
  batch b;
  b.add_with_payload({"SET", "big"}, std::span(&big_part, 1));
  for (int i = 0; i < 300; ++i) b.add({"SET", "k" + std::to_string(i), "value-" + std::to_string(i)});
  REQUIRE_FALSE(conn.execute(b, deadline_after(10s)));
  std::vector<std::byte> dst(big.size());
  b.clear();
  for (int i = 0; i < 300; ++i) b.add({"GET", "k" + std::to_string(i)});
  b.add_into({"GET", "big"}, std::span<std::byte>(dst));
  b.add({"PING"});
  REQUIRE_FALSE(conn.execute(b, deadline_after(10s)));
  REQUIRE(b.completed() == 302);
  for (int i = 0; i < 300; ++i) REQUIRE(b.reply(i).str == "value-" + std::to_string(i));
  REQUIRE(b.reply(300).into_destination);
  REQUIRE(dst == big);
  REQUIRE(b.reply(301).str == "PONG");
  REQUIRE(conn.stats().connects == 1);
}

TEMPLATE_TEST_CASE("connection: a server that never answers times out at the deadline", "[integration]",
                   asio_connection, uring_connection) {
  black_hole_server hole;
  TestType conn(options_for(hole.url()));
  batch b;
  std::vector<std::byte> dst(1 << 20);
  b.add_into({"GET", "x"}, std::span<std::byte>(dst));
  for (int round = 0; round < 2; ++round) {
    const auto t0 = kvtier::clock::now();
    const auto dl = deadline_after(300ms);
    const std::error_code ec = conn.execute(b, dl);
    REQUIRE(ec == errc::timeout);
    REQUIRE(kvtier::clock::now() >= dl);  // not before the deadline: it really waited
    require_returned_by(dl);
    REQUIRE(b.completed() == 0);
    REQUIRE_FALSE(conn.connected());  // closed: stream position unknown
    (void)t0;
  }
  REQUIRE(conn.stats().timeouts == 2);
  REQUIRE(hole.accepted() == 2);  // re-established for the second request
}

TEMPLATE_TEST_CASE("connection: a server that answers garbage is a protocol error, not a hang",
                   "[integration]", asio_connection, uring_connection) {
  for (const std::string garbage : {"hello world\r\n", "$99999999999\r\n", "*-5\r\n:1\r\n"}) {
    INFO(garbage);
    black_hole_server liar(garbage);
    TestType conn(options_for(liar.url()));
    batch b;
    b.add({"GET", "k"});
    const auto dl = deadline_after(2s);
    const std::error_code ec = conn.execute(b, dl);
    REQUIRE((ec == errc::protocol_error || ec == errc::too_large));
    REQUIRE(kvtier::clock::now() < dl);  // detected from the bytes, not by the deadline
    REQUIRE_FALSE(conn.connected());
  }
}

TEMPLATE_TEST_CASE("connection: an HTTP server on the port is a protocol error, named as such",
                   "[integration]", asio_connection, uring_connection) {
  // An HTTP/1.x status line, and the bare HTML body (no CR anywhere) that Python's http.server
  // sends to a request line it cannot parse: neither is RESP, whether or not a CRLF follows.
  for (const std::string http : {"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n",
                                 "<!DOCTYPE HTML>\n<html lang=\"en\">\n<head>\n"}) {
    INFO(http);
    black_hole_server web(http);
    TestType conn(options_for(web.url()));
    batch b;
    b.add({"GET", "k"});
    const auto dl = deadline_after(2s);
    REQUIRE(conn.execute(b, dl) == errc::protocol_error);
    REQUIRE(kvtier::clock::now() < dl);  // from the first byte, not by the deadline
    REQUIRE(conn.last_error().find("not RESP") != std::string::npos);
  }
}

TEMPLATE_TEST_CASE("connection: a wrong password is auth_failed, also while backing off", "[integration]",
                   asio_connection, uring_connection) {
  redis_server srv({.extra_args = {"--requirepass", "right"}, .harness_password = "right"});
  auto opt = options_for("resp://:wrong@127.0.0.1:" + std::to_string(srv.port()));
  opt.reconnect_backoff_min = 1000ms;
  TestType conn(opt);
  REQUIRE(conn.ping(deadline_after(2s)) == errc::auth_failed);
  INFO(conn.last_error());
  REQUIRE(conn.last_error().find("AUTH: WRONGPASS") != std::string::npos);
  REQUIRE(conn.ping(deadline_after(100ms)) == errc::auth_failed);  // inside the backoff
  REQUIRE(conn.stats().connect_failures == 1);
}

TEMPLATE_TEST_CASE("connection: a large write to a server that never reads times out", "[integration]",
                   asio_connection, uring_connection) {
  black_hole_server hole;
  TestType conn(options_for(hole.url()));
  const auto big = pattern(64u << 20, 1);  // more than the socket buffers hold
  std::span<const std::byte> part(big);
  batch b;
  b.add_with_payload({"SET", "k"}, std::span<const std::span<const std::byte>>(&part, 1));
  const auto dl = deadline_after(300ms);
  REQUIRE(conn.execute(b, dl) == errc::timeout);
  require_returned_by(dl);
}

TEMPLATE_TEST_CASE("connection: server killed mid-batch, then restarted", "[integration]", asio_connection,
                   uring_connection) {
  redis_server srv({.extra_args = {"--enable-debug-command", "yes"}});
  TestType conn(options_for(srv.url()));
  REQUIRE_FALSE(conn.ping(deadline_after(2s)));

  batch b;
  b.add({"SET", "a", "1"});
  b.add({"DEBUG", "SLEEP", "5"});  // the server is busy here when it gets killed
  b.add({"GET", "a"});
  std::thread killer([&] {
    std::this_thread::sleep_for(200ms);
    srv.kill();
  });
  const auto dl = deadline_after(4s);
  const std::error_code ec = conn.execute(b, dl);
  killer.join();
  REQUIRE(ec == errc::connection_lost);
  REQUIRE(kvtier::clock::now() < dl);  // an error, not a timeout
  REQUIRE(b.completed() < 3);          // redis flushes the SET reply only after the sleep: 0 here
  REQUIRE_FALSE(conn.connected());

  // While the server is down: a fast error, never a hang.
  b.clear();
  b.add({"PING"});
  const auto dl2 = deadline_after(500ms);
  const std::error_code down = conn.execute(b, dl2);
  REQUIRE(down);
  REQUIRE((down == errc::connection_refused || down == errc::not_connected));
  require_returned_by(dl2);

  srv.restart();
  // The backoff after the failed connect is at most 20 ms here; the deadline covers it.
  b.clear();
  b.add({"SET", "b", "2"});
  b.add({"GET", "b"});
  REQUIRE_FALSE(conn.execute(b, deadline_after(2s)));
  REQUIRE(b.reply(1).str == "2");
  REQUIRE(conn.stats().connects == 2);
}

TEMPLATE_TEST_CASE("connection: server killed while large values stream into destinations", "[integration]",
                   asio_connection, uring_connection) {
  redis_server srv;
  constexpr std::size_t value_bytes = 12'400'000;
  const auto value = pattern(value_bytes, 5);
  std::span<const std::byte> part(value);
  TestType conn(options_for(srv.url()));
  batch b;
  for (int i = 0; i < 8; ++i)
    b.add_with_payload({"SET", "v" + std::to_string(i)},
                       std::span<const std::span<const std::byte>>(&part, 1));
  REQUIRE_FALSE(conn.execute(b, deadline_after(20s)));
  std::vector<std::vector<std::byte>> dst(8, std::vector<std::byte>(value_bytes));
  b.clear();
  for (int i = 0; i < 8; ++i) b.add_into({"GET", "v" + std::to_string(i)}, std::span<std::byte>(dst[i]));
  std::thread killer([&] {
    std::this_thread::sleep_for(10ms);
    srv.kill();
  });
  const auto dl = deadline_after(10s);
  const std::error_code ec = conn.execute(b, dl);
  killer.join();
  require_returned_by(dl);
  // Either the batch beat the kill, or it failed as a whole; never a hang or a partial hit.
  if (ec) {
    REQUIRE(ec == errc::connection_lost);
    REQUIRE(b.completed() < 8);
    REQUIRE_FALSE(conn.connected());
  }
  for (std::size_t i = 0; i < b.completed(); ++i) {
    REQUIRE(b.reply(i).into_destination);
    REQUIRE(dst[i] == value);
  }
}

TEMPLATE_TEST_CASE("connection: an idle connection the server dropped is re-established", "[integration]",
                   asio_connection, uring_connection) {
  redis_server srv;
  auto opt = options_for(srv.url());
  opt.health_check_idle = 1ms;
  TestType conn(opt);
  REQUIRE_FALSE(conn.ping(deadline_after(2s)));
  srv.restart();  // drops our connection while idle
  std::this_thread::sleep_for(5ms);
  batch b;
  b.add({"PING"});
  REQUIRE_FALSE(conn.execute(b, deadline_after(2s)));
  REQUIRE(b.reply(0).str == "PONG");
  REQUIRE(conn.stats().connects == 2);
  std::this_thread::sleep_for(5ms);
  REQUIRE_FALSE(conn.execute(b, deadline_after(2s)));  // idle > 1 ms again: a health PING first
  REQUIRE(conn.stats().health_checks >= 1);
}

TEMPLATE_TEST_CASE("connection: AUTH with an ACL user, HELLO 3, SELECT", "[integration]", asio_connection,
                   uring_connection) {
  redis_server srv(
      {.extra_args = {"--user", "alice", "on", ">secret", "~*", "&*", "+@all", "--user", "default", "off"},
       .harness_user = "alice",
       .harness_password = "secret"});
  const std::string hostport = "127.0.0.1:" + std::to_string(srv.port());
  {
    TestType conn(options_for("resp://alice:secret@" + hostport + "/3"));
    batch b;
    b.add({"SET", "k", "in-db-3"});
    b.add({"GET", "k"});
    REQUIRE_FALSE(conn.execute(b, deadline_after(2s)));
    REQUIRE(b.reply(1).str == "in-db-3");
    REQUIRE(srv.call({"GET", "k"}) == "(nil)");  // the harness client is in db 0
  }
  {
    auto opt = options_for("resp://alice:secret@" + hostport);
    opt.protocol = 3;
    opt.client_name = "kvtier-test";
    TestType conn(opt);
    batch b;
    b.add({"CLIENT", "GETNAME"});
    b.add({"HGETALL", "nohash"});  // RESP3: an empty map
    REQUIRE_FALSE(conn.execute(b, deadline_after(2s)));
    REQUIRE(b.reply(0).str == "kvtier-test");
    REQUIRE(b.reply(1).kind == type::map);
  }
  for (int protocol : {2, 3}) {
    auto opt = options_for("resp://alice:wrong@" + hostport);
    opt.protocol = protocol;
    TestType conn(opt);
    REQUIRE(conn.ping(deadline_after(2s)) == errc::auth_failed);
    REQUIRE_FALSE(conn.connected());
  }
  {
    TestType conn(options_for(srv.url()));  // no credentials: the default user is off
    REQUIRE(conn.ping(deadline_after(2s)));
  }
}

TEMPLATE_TEST_CASE("connection: nothing listening is refused at once, then backs off", "[integration]",
                   asio_connection, uring_connection) {
  const auto port = kvtier::test::detail::pick_free_port();
  auto opt = options_for("resp://127.0.0.1:" + std::to_string(port));
  opt.reconnect_backoff_min = 1000ms;
  TestType conn(opt);
  const auto dl = deadline_after(2s);
  REQUIRE(conn.ping(dl) == errc::connection_refused);
  REQUIRE(kvtier::clock::now() < dl);
  // The next attempt is 1 s away, beyond this 100 ms deadline: fail now, do not wait.
  const auto dl2 = deadline_after(100ms);
  // It fails with the last attempt's error, not a bare "not connected".
  REQUIRE(conn.ping(dl2) == errc::connection_refused);
  REQUIRE(conn.last_error().find(std::to_string(port)) != std::string::npos);
  require_returned_by(dl2);
  REQUIRE(conn.stats().connect_failures == 1);
}

TEMPLATE_TEST_CASE("connection: a host name resolves within the deadline; a bad one fails by it",
                   "[integration]", asio_connection, uring_connection) {
  redis_server srv;
  {
    TestType conn(options_for("resp://localhost:" + std::to_string(srv.port())));
    REQUIRE_FALSE(conn.ping(deadline_after(5s)));
  }
  TestType conn(options_for("resp://no-such-host.invalid:6379"));
  const auto dl = deadline_after(1s);
  const std::error_code ec = conn.ping(dl);
  // resolve_failed from a resolver that answers; timeout from one that does not.
  REQUIRE((ec == errc::resolve_failed || ec == errc::timeout));
  require_returned_by(dl);
  REQUIRE_FALSE(conn.connected());
}
