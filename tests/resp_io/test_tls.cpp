// Integration tests of TLS on both transports (asio_tls_connection, uring_tls_connection)
// against redis-server --tls-port with a CA, a server certificate and a client certificate made
// by `openssl` in the test: values round-trip bit-exact through remote_store; a wrong CA, an
// expired certificate, a wrong name, a CA file that does not load and a plaintext server fail
// cleanly (errc::tls_failed, OpenSSL's reason in last_error()), by the deadline; a silent peer
// ends the handshake at the deadline; a mid-exchange stall ends the call at its deadline and a
// server closing mid-batch is a lost connection; a put's source rewritten while it is sent is
// never a mixed hit and a put cut mid-value leaves nothing readable as a hit, through put() and
// through put_pieces (put_safety.hpp); a 3-master cluster over TLS (resp+cluster+tls://,
// --tls-cluster yes) routes and follows MOVED to TLS ports.
#include <catch2/catch.hpp>

#include <chrono>
#include <set>
#include <string>
#include <type_traits>
#include <vector>

#include "kvtier/resp/asio_tls_connection.hpp"
#include "kvtier/store/cluster_store.hpp"
#include "kvtier/store/remote_store.hpp"
#include "resp_io/io_test_util.hpp"
#include "resp_io/put_safety.hpp"
#include "resp_io/store_test_util.hpp"
#include "support/redis_cluster.hpp"
#include "support/redis_server.hpp"
#include "support/scripted_tls_server.hpp"
#include "support/test_pki.hpp"
#if KVTIER_TEST_URING_TLS
#include "kvtier/resp/uring_tls_connection.hpp"
#endif

using namespace std::chrono_literals;
using kvtier::chunk_key;
using kvtier::chunk_status;
using kvtier::deadline_after;
using kvtier::errc;
using kvtier::resp::asio_connection;
using kvtier::resp::asio_tls_connection;
using kvtier::resp::batch;
using kvtier::test::pattern;
using kvtier::test::redis_server;
using kvtier::test::require_round_trip;

namespace {

// The plain connection of the same transport (it must refuse a TLS endpoint).
template <class TlsConn>
struct plain_of;
template <>
struct plain_of<asio_tls_connection> {
  using type = asio_connection;
  static constexpr const char* needs = "asio_tls_connection";
};
#if KVTIER_TEST_URING_TLS
using kvtier::resp::uring_connection;
using kvtier::resp::uring_tls_connection;
template <>
struct plain_of<uring_tls_connection> {
  using type = uring_connection;
  static constexpr const char* needs = "uring_tls_connection";
};
#define KVTIER_TLS_CONNECTIONS asio_tls_connection, uring_tls_connection
#else
#define KVTIER_TLS_CONNECTIONS asio_tls_connection
#endif

const kvtier::test::test_pki& pki() {
  static kvtier::test::test_pki p;
  return p;
}

// redis-server with a TLS port requiring client certificates signed by the test CA (its plain
// port serves the harness).
redis_server::options tls_server(const std::string& cert = "server") {
  return {.tls_args = pki().server_args(cert)};
}

// One 3-master cluster over TLS (no replicas) for the tests of both transports.
kvtier::test::redis_cluster& tls_cluster() {
  static kvtier::test::redis_cluster c({.masters = 3,
                                        .replicas_per_master = 0,
                                        .tls_args = pki().server_args("server", /*client_certs=*/false)});
  return c;
}

kvtier::resp::connection_options tls_options_for(const redis_server& srv, const std::string& ca = "ca.pem") {
  auto u = kvtier::resp::parse_url("rediss://127.0.0.1:" + std::to_string(srv.tls_port()));
  REQUIRE(u);
  REQUIRE(u.value.tls);
  kvtier::resp::connection_options o{.server = u.value};
  o.tls.ca_file = pki().path(ca);
  o.tls.cert_file = pki().path("client.pem");
  o.tls.key_file = pki().path("client.key");
  o.reconnect_backoff_min = 1ms;
  return o;
}

}  // namespace

TEMPLATE_TEST_CASE("tls: 12.4 MB values round-trip bit-exact over rediss://", "[integration]",
                   KVTIER_TLS_CONNECTIONS) {
  redis_server srv(tls_server());
  kvtier::remote_store<TestType> store(
      kvtier::key_namespace{.model = "tls", .kv_format = "raw", .chunk_tokens = 256}, tls_options_for(srv));
  const std::vector<chunk_key> keys = {{1, 2}, {3, 4}, {5, 6}};
  std::vector<std::vector<std::byte>> src = {pattern(12'400'000, 1), pattern(12'400'000, 2), pattern(100, 3)};
  require_round_trip(store, keys, src);
  std::vector<chunk_status> st(keys.size());
  // The idle connections are reused (a waiting session ticket is not taken for junk): each
  // pooled connection connected once (the 12.4 MB batch is spread over the large ones).
  REQUIRE_FALSE(store.exists(keys, st, deadline_after(5s)));
  REQUIRE(store.pool().stats().connects <= store.pool().size());
  // Many small commands in one pipeline (gathered into few TLS records), replies in order.
  TestType conn(tls_options_for(srv));
  batch b;
  for (int i = 0; i < 2000; ++i) b.add({"ECHO", std::to_string(i)});
  REQUIRE_FALSE(conn.execute(b, deadline_after(10s)));
  REQUIRE(b.completed() == 2000);
  for (int i = 0; i < 2000; ++i) REQUIRE(b.reply(static_cast<std::size_t>(i)).str == std::to_string(i));
}

TEMPLATE_TEST_CASE(
    "tls: a put's source rewritten while it is sent is never a mixed hit; a put cut mid-value "
    "leaves nothing readable as a hit",
    "[integration]", KVTIER_TLS_CONNECTIONS) {
  redis_server srv(tls_server());
  kvtier::remote_store<TestType> store(kvtier::test::test_ns("tls-put"), tls_options_for(srv));
  kvtier::test::require_torn_source_never_a_mixed_hit(store, 0x28f);
  kvtier::test::require_cut_put_leaves_no_hit(store, srv, 0x290);
}

TEMPLATE_TEST_CASE(
    "tls: put_pieces, a source rewritten while it is sent from its pieces is never a mixed hit; "
    "cut mid-value it leaves nothing readable as a hit",
    "[integration]", KVTIER_TLS_CONNECTIONS) {
  redis_server srv(tls_server());
  kvtier::remote_store<TestType> store(kvtier::test::test_ns("tls-put-pieces"), tls_options_for(srv));
  kvtier::test::require_torn_source_never_a_mixed_hit(store, 0x2a6, kvtier::test::piecewise_put{});
  kvtier::test::require_cut_put_leaves_no_hit(store, srv, 0x2a7, kvtier::test::piecewise_put{});
}

TEMPLATE_TEST_CASE("tls: a wrong CA, a wrong name, an expired certificate, a plaintext server fail cleanly",
                   "[integration]", KVTIER_TLS_CONNECTIONS) {
  auto expect_tls_failure = [](kvtier::resp::connection_options o, const std::string& reason,
                               errc code = errc::tls_failed) {
    o.connect_timeout = 500ms;
    TestType conn(o);
    const auto dl = deadline_after(3s);
    const std::error_code ec = conn.ping(dl);
    INFO(conn.last_error());
    REQUIRE(ec == code);
    REQUIRE(kvtier::clock::now() < dl);
    REQUIRE(conn.last_error().find(reason) != std::string::npos);
  };
  redis_server good(tls_server());
  SECTION("server certificate signed by a CA the client does not trust") {
    expect_tls_failure(tls_options_for(good, "other-ca.pem"), "certificate verify failed");
  }
  SECTION("the name checked is not the certificate's") {
    auto o = tls_options_for(good);
    o.tls.server_name = "not-the-server.example";
    expect_tls_failure(o, "hostname mismatch");
  }
  SECTION("an expired server certificate") {
    redis_server expired(tls_server("expired"));
    expect_tls_failure(tls_options_for(expired), "certificate has expired");
  }
  SECTION("a CA file that does not load names the file") {
    auto o = tls_options_for(good);
    o.tls.ca_file = pki().path("no-such-ca.pem");
    expect_tls_failure(o, "CA file '" + o.tls.ca_file + "'");
  }
  SECTION("no client certificate: the server's refusal is reported") {
    auto o = tls_options_for(good);
    o.tls.cert_file.clear();
    o.tls.key_file.clear();
    o.connect_timeout = 500ms;
    TestType conn(o);
    const std::error_code ec = conn.ping(deadline_after(3s));
    INFO(conn.last_error());
    // TLS 1.3 sends the client's Finished before the server checks: the refusal may arrive as
    // the handshake's alert or as a lost connection on the first command.
    REQUIRE((ec == errc::tls_failed || ec == errc::connection_lost));
  }
  SECTION("a plaintext server on the port") {
    auto o = tls_options_for(good);
    o.server.port = good.port();  // the same server's plaintext port: it never answers a ClientHello
    expect_tls_failure(o, "is the server speaking TLS on this port?", errc::connection_refused);
    expect_tls_failure(o, "use resp:// for a plaintext port", errc::connection_refused);
  }
  SECTION("verification off talks to the server anyway (for tests only)") {
    auto o = tls_options_for(good, "other-ca.pem");
    o.tls.verify_peer = false;
    TestType conn(o);
    REQUIRE_FALSE(conn.ping(deadline_after(3s)));
  }
  SECTION("a plaintext URL against a TLS port: the hint names rediss://") {
    // The TLS port hangs up on a plaintext command without a byte; with HELLO 3 it is the
    // handshake that fails, without it the first command.
    for (const int protocol : {2, 3}) {
      auto u = kvtier::resp::parse_url("resp://127.0.0.1:" + std::to_string(good.tls_port()));
      REQUIRE(u);
      kvtier::resp::connection_options o{.server = u.value};
      o.protocol = protocol;
      typename plain_of<TestType>::type conn(o);
      REQUIRE(conn.ping(deadline_after(3s)) == errc::connection_lost);
      INFO(conn.last_error());
      CHECK(conn.last_error().find("is it a TLS port? use rediss://") != std::string::npos);
    }
  }
  SECTION("a TLS endpoint on the plain connection of the transport is refused with a reason") {
    typename plain_of<TestType>::type conn(tls_options_for(good));
    REQUIRE(conn.ping(deadline_after(3s)) == errc::invalid_argument);
    REQUIRE(conn.last_error().find(plain_of<TestType>::needs) != std::string::npos);
  }
}

TEMPLATE_TEST_CASE("tls: a reply nobody asked for closes the connection, never answers the next batch",
                   "[integration]", KVTIER_TLS_CONNECTIONS) {
  // As on a plain connection: bytes after a batch's last reply make the stream untrustworthy.
  // Over TLS they may sit in a record not decrypted yet (after the last reply, or arriving while
  // idle), where a peek at the socket cannot tell them from a session ticket (issue 18, bug 4).
  auto bulk = [](const std::string& s) { return "$" + std::to_string(s.size()) + "\r\n" + s + "\r\n"; };
  auto script = [&](const std::vector<std::string>& cmd) {
    const std::string& arg = cmd.size() > 1 ? cmd[1] : cmd[0];
    std::vector<std::string> records{bulk(arg)};
    if (arg.rfind("stray", 0) == 0) records.push_back(bulk("unasked"));  // a record of its own
    if (arg.rfind("ticket", 0) == 0) records.push_back(kvtier::test::scripted_tls_server::send_ticket_record);
    return records;
  };
  auto options_for = [](std::uint16_t port) {
    auto u = kvtier::resp::parse_url("rediss://127.0.0.1:" + std::to_string(port));
    REQUIRE(u);
    kvtier::resp::connection_options o{.server = u.value};
    o.tls.ca_file = pki().path("ca.pem");
    o.reconnect_backoff_min = 1ms;
    return o;
  };
  auto echo = [](TestType& conn, const std::string& arg) {
    batch b;
    b.add({"ECHO", arg});
    REQUIRE_FALSE(conn.execute(b, deadline_after(5s)));
    REQUIRE(b.completed() == 1);
    return b.reply(0).str;
  };
  const bool idle = GENERATE(false, true);
  {
    // idle: the extra record is held until the batch returned, so it arrives between batches.
    INFO((idle ? "the extra record arrives while the connection is idle"
               : "the extra record follows the last reply at once"));
    kvtier::test::scripted_tls_server srv(pki(), script, /*hold_rest=*/idle);
    TestType conn(options_for(srv.port()));
    SECTION("application data: the connection closes and the next batch gets its own reply") {
      REQUIRE(echo(conn, "stray-1") == "stray-1");
      if (idle) srv.release();
      REQUIRE(srv.wait_records(2));
      CHECK(echo(conn, "second") == "second");
      CHECK(echo(conn, "third") == "third");
      CHECK(conn.stats().connects == 2);
      CHECK(srv.connections() == 2);
    }
    SECTION("a session ticket is not data: the connection is kept") {
      REQUIRE(echo(conn, "ticket-1") == "ticket-1");
      if (idle) srv.release();
      REQUIRE(srv.wait_records(2));
      CHECK(echo(conn, "second") == "second");
      CHECK(echo(conn, "third") == "third");
      CHECK(conn.stats().connects == 1);
      CHECK(srv.connections() == 1);
    }
  }
}

TEMPLATE_TEST_CASE("tls: a handshake that never answers ends at the deadline", "[integration]",
                   KVTIER_TLS_CONNECTIONS) {
  kvtier::test::black_hole_server hole;
  auto u = kvtier::resp::parse_url("resp+tls://127.0.0.1:" + std::to_string(hole.port()));
  REQUIRE(u);
  TestType conn(kvtier::resp::connection_options{.server = u.value});
  const auto dl = deadline_after(300ms);
  REQUIRE(conn.ping(dl) == errc::timeout);
  kvtier::test::require_returned_by(dl);
  REQUIRE(conn.last_error().find("no answer by the deadline") != std::string::npos);
}

TEMPLATE_TEST_CASE("tls: a server that stops answering mid-exchange ends the call at its deadline",
                   "[integration]", KVTIER_TLS_CONNECTIONS) {
  redis_server srv(tls_server());
  TestType conn(tls_options_for(srv));
  REQUIRE_FALSE(conn.ping(deadline_after(3s)));
  batch b;
  b.add({"BLPOP", "kvtier-tls-nothing", "2"});  // the server answers nothing for 2 s
  const auto dl = deadline_after(300ms);
  REQUIRE(conn.execute(b, dl) == errc::timeout);
  kvtier::test::require_returned_by(dl);
  // The connection was closed and comes back.
  REQUIRE_FALSE(conn.ping(deadline_after(5s)));
  // The server closes mid-batch (QUIT answers, then the stream ends before PING's reply): the
  // call fails as a lost connection with the reply it got, and the next one reconnects.
  b.clear();
  b.add({"QUIT"});
  b.add({"PING"});
  REQUIRE(conn.execute(b, deadline_after(5s)) == errc::connection_lost);
  REQUIRE(b.completed() == 1);
  REQUIRE(b.reply(0).str == "OK");
  REQUIRE_FALSE(conn.ping(deadline_after(5s)));
}

TEMPLATE_TEST_CASE("tls: a 3-master cluster over TLS: values bit-exact over every master, MOVED to TLS ports",
                   "[integration]", KVTIER_TLS_CONNECTIONS) {
  kvtier::test::redis_cluster& cluster = tls_cluster();
  auto u = kvtier::resp::parse_cluster_url(cluster.tls_url());
  REQUIRE(u);
  kvtier::cluster_options o = kvtier::cluster_options_for(u, 0);
  o.connection.tls.ca_file = pki().path("ca.pem");
  o.connection.reconnect_backoff_min = 1ms;
  const kvtier::key_namespace ns{.model = "tls-cluster", .kv_format = "raw", .chunk_tokens = 256};
  kvtier::cluster_store<TestType> store(ns, o);

  // 12.4 MB values on keys that land on every master (the plain ports never see a client).
  std::vector<chunk_key> keys;
  for (std::uint64_t i = 1; keys.size() < 6 && i < 1000; ++i) keys.push_back(chunk_key{0x7157, i});
  std::vector<std::vector<std::byte>> src;
  for (std::size_t i = 0; i < keys.size(); ++i)
    src.push_back(pattern(i < 3 ? 12'400'000 : 1000, static_cast<unsigned>(i) + 10));
  require_round_trip(store, keys, src);
  const std::vector<std::span<const std::byte>> s(src.begin(), src.end());
  // The map names TLS ports, and the keys live on more than one master.
  std::set<std::uint16_t> masters;
  for (const auto& k : keys) {
    const auto n = store.node_of(k);
    REQUIRE(n);
    masters.insert(n->port);
  }
  REQUIRE(masters.size() >= 2);
  for (std::size_t i = 0; i < cluster.size(); ++i) {
    if (masters.count(cluster.node(i).port())) FAIL("a plain port in the TLS slot map");
  }

  // Move an empty slot to another master behind the store's back: MOVED names a TLS port, the
  // store follows it over TLS.
  const std::string tag =
      std::string("tls-moved-") + (std::is_same_v<TestType, asio_tls_connection> ? "a" : "u");
  kvtier::cluster_options po = o;
  po.hash_tag = tag;
  kvtier::cluster_store<TestType> pinned(ns, po);
  const std::vector<chunk_key> one = {chunk_key{0x7158, 1}};
  std::vector<std::span<const std::byte>> small = {s[3]};
  std::vector<chunk_status> st1(1);
  REQUIRE_FALSE(pinned.refresh(deadline_after(5s)));
  const unsigned slot = kvtier::resp::hash_slot(pinned.key_text(one[0]));
  const std::size_t from = cluster.master_of_slot(slot);
  REQUIRE(from < cluster.size());
  const std::size_t to = (from + 1) % cluster.size();
  REQUIRE(cluster.move_empty_slot(slot, to));
  REQUIRE_FALSE(pinned.put(one, small, st1, deadline_after(10s)));
  REQUIRE(st1[0] == chunk_status::stored);
  REQUIRE(pinned.stats().redirects >= 1);
  REQUIRE(pinned.node_of(one[0])->port == cluster.node(to).tls_port());
  std::vector<std::byte> back(1000);
  std::vector<std::span<std::byte>> bd = {back};
  REQUIRE_FALSE(pinned.get(one, bd, st1, deadline_after(10s)));
  REQUIRE(st1[0] == chunk_status::hit);
  REQUIRE(back == src[3]);
}
