// Integration tests of TLS (asio_tls_connection) against redis-server --tls-port with a CA, a
// server certificate and a client certificate made by `openssl` in the test: values round-trip
// through remote_store; a wrong CA, an expired certificate, a wrong name and a plaintext server
// fail cleanly (errc::tls_failed, OpenSSL's reason in last_error()), by the deadline.
#include <catch2/catch.hpp>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "kvtier/resp/asio_tls_connection.hpp"
#include "kvtier/store/remote_store.hpp"
#include "resp_io/io_test_util.hpp"
#include "support/redis_server.hpp"

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

namespace {

// A CA and certificates made with the openssl command line in a temp dir (removed at exit).
struct test_pki {
  std::string dir;
  test_pki() {
    char tmpl[] = "/tmp/kvtier-tls-XXXXXX";
    REQUIRE(::mkdtemp(tmpl) != nullptr);
    dir = tmpl;
    const std::string d = dir + "/";
    // One CA that signs the server's and the client's certificates; another CA nobody trusts;
    // an expired server certificate (-days 0: notAfter == notBefore, expired a second later).
    run("openssl req -x509 -newkey rsa:2048 -nodes -keyout " + d + "ca.key -out " + d +
        "ca.pem -days 2 -subj /CN=kvtier-test-ca");
    run("openssl req -x509 -newkey rsa:2048 -nodes -keyout " + d + "other-ca.key -out " + d +
        "other-ca.pem -days 2 -subj /CN=kvtier-other-ca");
    printf_file(d + "san.ext", "subjectAltName=IP:127.0.0.1,DNS:localhost\n");
    sign("server", "127.0.0.1", "-days 2");
    sign("client", "kvtier-client", "-days 2");
    sign("expired", "127.0.0.1", "-days 0");
  }
  ~test_pki() {
    std::error_code ignore;
    std::filesystem::remove_all(dir, ignore);
  }
  std::string path(const std::string& name) const { return dir + "/" + name; }

 private:
  static void run(const std::string& cmd) {
    const int rc = std::system((cmd + " >/dev/null 2>&1").c_str());
    INFO(cmd);
    REQUIRE(rc == 0);
  }
  static void printf_file(const std::string& path, const std::string& text) {
    FILE* f = std::fopen(path.c_str(), "w");
    REQUIRE(f != nullptr);
    std::fputs(text.c_str(), f);
    std::fclose(f);
  }
  void sign(const std::string& name, const std::string& cn, const std::string& days) {
    const std::string d = dir + "/";
    run("openssl req -newkey rsa:2048 -nodes -keyout " + d + name + ".key -out " + d + name +
        ".csr -subj /CN=" + cn);
    run("openssl x509 -req -in " + d + name + ".csr -CA " + d + "ca.pem -CAkey " + d +
        "ca.key -CAcreateserial -out " + d + name + ".pem " + days + " -extfile " + d + "san.ext");
  }
};

const test_pki& pki() {
  static test_pki p;
  return p;
}

// redis-server with a TLS port requiring client certificates signed by the test CA (its plain
// port serves the harness).
redis_server::options tls_server(const std::string& cert = "server") {
  const auto& p = pki();
  return {.tls_args = {"--tls-cert-file", p.path(cert + ".pem"), "--tls-key-file", p.path(cert + ".key"),
                       "--tls-ca-cert-file", p.path("ca.pem")}};
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

TEST_CASE("tls: 12.4 MB values round-trip bit-exact over rediss://", "[integration]") {
  redis_server srv(tls_server());
  kvtier::remote_store<asio_tls_connection> store(
      kvtier::key_namespace{.model = "tls", .kv_format = "raw", .chunk_tokens = 256}, tls_options_for(srv));
  const std::vector<chunk_key> keys = {{1, 2}, {3, 4}};
  std::vector<std::vector<std::byte>> src = {pattern(12'400'000, 1), pattern(12'400'000, 2)};
  std::vector<std::span<const std::byte>> s(src.begin(), src.end());
  std::vector<chunk_status> st(keys.size());
  REQUIRE_FALSE(store.put(keys, s, st, deadline_after(20s)));
  for (auto x : st) REQUIRE(x == chunk_status::stored);
  std::vector<std::vector<std::byte>> dst(keys.size(), std::vector<std::byte>(12'400'000));
  std::vector<std::span<std::byte>> d(dst.begin(), dst.end());
  REQUIRE_FALSE(store.get(keys, d, st, deadline_after(20s)));
  for (std::size_t i = 0; i < keys.size(); ++i) {
    REQUIRE(st[i] == chunk_status::hit);
    REQUIRE(dst[i] == src[i]);
  }
  // The idle connection is reused (a waiting session ticket is not taken for junk).
  REQUIRE_FALSE(store.exists(keys, st, deadline_after(5s)));
  REQUIRE(store.pool().stats().connects <= 2);
}

TEST_CASE("tls: a wrong CA, a wrong name, an expired certificate, a plaintext server fail cleanly",
          "[integration]") {
  auto expect_tls_failure = [](kvtier::resp::connection_options o, const std::string& reason,
                               errc code = errc::tls_failed) {
    o.connect_timeout = 500ms;
    asio_tls_connection conn(o);
    const auto dl = deadline_after(3s);
    const std::error_code ec = conn.ping(dl);
    INFO(conn.last_error());
    REQUIRE(ec == code);
    REQUIRE(kvtier::clock::now() < dl);
    INFO(conn.last_error());
    REQUIRE(conn.last_error().find(reason) != std::string::npos);
  };
  redis_server good(tls_server());
  SECTION("server certificate signed by a CA the client does not trust") {
    expect_tls_failure(tls_options_for(good, "other-ca.pem"), "certificate verify failed");
  }
  SECTION("the name checked is not the certificate's") {
    auto o = tls_options_for(good);
    o.tls.server_name = "not-the-server.example";
    expect_tls_failure(o, "certificate verify failed");
  }
  SECTION("an expired server certificate") {
    redis_server expired(tls_server("expired"));
    expect_tls_failure(tls_options_for(expired), "expired");
  }
  SECTION("a plaintext server on the port") {
    auto o = tls_options_for(good);
    o.server.port = good.port();  // the same server's plaintext port: it never answers a ClientHello
    expect_tls_failure(o, "is the server speaking TLS on this port?", errc::connection_refused);
  }
  SECTION("verification off talks to the server anyway (for tests only)") {
    auto o = tls_options_for(good, "other-ca.pem");
    o.tls.verify_peer = false;
    asio_tls_connection conn(o);
    REQUIRE_FALSE(conn.ping(deadline_after(3s)));
  }
  SECTION("a TLS endpoint on the plain Asio connection is refused with a reason") {
    asio_connection conn(tls_options_for(good));
    REQUIRE(conn.ping(deadline_after(3s)) == errc::invalid_argument);
    REQUIRE(conn.last_error().find("asio_tls_connection") != std::string::npos);
  }
}

TEST_CASE("tls: a handshake that never answers ends at the deadline", "[integration]") {
  kvtier::test::black_hole_server hole;
  auto u = kvtier::resp::parse_url("resp+tls://127.0.0.1:" + std::to_string(hole.port()));
  REQUIRE(u);
  asio_tls_connection conn(kvtier::resp::connection_options{.server = u.value});
  const auto dl = deadline_after(300ms);
  REQUIRE(conn.ping(dl) == errc::timeout);
  REQUIRE(kvtier::clock::now() < dl + 250ms);
}
