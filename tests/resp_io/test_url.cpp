// Unit tests of resp URL parsing and {rank} templates.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "kvtier/resp/url.hpp"

using kvtier::resp::endpoint;
using kvtier::resp::parse_url;

namespace {
// The message of a URL that must fail, checked to contain `needle`.
void require_bad(std::string_view url, std::string_view needle, std::optional<int> rank = std::nullopt) {
  auto r = parse_url(url, rank);
  INFO("url: " << url << " message: " << r.message);
  REQUIRE_FALSE(r);
  REQUIRE(r.ec == kvtier::errc::bad_url);
  REQUIRE(r.message.find(needle) != std::string::npos);
}
}  // namespace

TEST_CASE("url: TCP forms", "[unit]") {
  auto r = parse_url("resp://127.0.0.1:6380");
  REQUIRE(r);
  CHECK(r.value.kind == endpoint::transport::tcp);
  CHECK(r.value.host == "127.0.0.1");
  CHECK(r.value.port == 6380);
  CHECK(r.value.db == 0);
  CHECK(r.value.user.empty());
  CHECK(r.value.password.empty());

  r = parse_url("resp://alice:s3cr%40t@cache-1.local:7000/5");
  REQUIRE(r);
  CHECK(r.value.user == "alice");
  CHECK(r.value.password == "s3cr@t");
  CHECK(r.value.host == "cache-1.local");
  CHECK(r.value.port == 7000);
  CHECK(r.value.db == 5);
  CHECK(r.value.describe() == "cache-1.local:7000/5");  // no credentials in logs

  r = parse_url("resp://pw@host");
  REQUIRE(r);
  CHECK(r.value.user.empty());
  CHECK(r.value.password == "pw");
  CHECK(r.value.port == 6379);

  r = parse_url("resp://u:p@ss@host:1/");  // last '@' of the authority ends the userinfo
  REQUIRE(r);
  CHECK(r.value.password == "p@ss");
  CHECK(r.value.db == 0);

  r = parse_url("resp://[::1]:6379/2");
  REQUIRE(r);
  CHECK(r.value.host == "::1");
  CHECK(r.value.describe() == "[::1]:6379/2");
}

TEST_CASE("url: Unix socket forms", "[unit]") {
  auto r = parse_url("resp+unix:///run/redis/redis.sock");
  REQUIRE(r);
  CHECK(r.value.kind == endpoint::transport::unix_socket);
  CHECK(r.value.path == "/run/redis/redis.sock");
  r = parse_url("resp+unix://bob:pw@/tmp/r.sock?db=3");
  REQUIRE(r);
  CHECK(r.value.user == "bob");
  CHECK(r.value.password == "pw");
  CHECK(r.value.path == "/tmp/r.sock");
  CHECK(r.value.db == 3);
  CHECK(r.value.describe() == "unix:/tmp/r.sock/3");
}

TEST_CASE("url: rank templates", "[unit]") {
  auto r = parse_url("resp://127.0.0.1:{rank+6400}", 3);
  REQUIRE(r);
  CHECK(r.value.port == 6403);
  r = parse_url("resp://valkey-{rank}:6379/{rank}", 7);
  REQUIRE(r);
  CHECK(r.value.host == "valkey-7");
  CHECK(r.value.db == 7);
  r = parse_url("resp://h:63{rank}9", 8);
  REQUIRE(r);
  CHECK(r.value.port == 6389);
  r = parse_url("resp+unix:///tmp/redis-{rank}.sock", 2);
  REQUIRE(r);
  CHECK(r.value.path == "/tmp/redis-2.sock");
  r = parse_url("resp://h:{rank+0}/1", 0);  // rank 0 + 0 is port 0: invalid
  REQUIRE_FALSE(r);
}

TEST_CASE("url: errors name what is wrong", "[unit]") {
  require_bad("redis://h:1", "unsupported scheme 'redis'");
  require_bad("h:1", "missing scheme");
  require_bad("resp://:6379", "missing host");
  require_bad("resp://h:", "empty port");
  require_bad("resp://h:70000", "port '70000' is not a number in 1..65535");
  require_bad("resp://h:abc", "port 'abc'");
  require_bad("resp://h:1/x", "database 'x'");
  require_bad("resp://h:1/0?timeout=3", "query parameters");
  require_bad("resp://::1:6379", "IPv6 addresses need brackets");
  require_bad("resp://[::1:6379", "closing ']'");
  require_bad("resp://u:@h:1", "empty password");
  require_bad("resp://u:%zz@h:1", "percent escape");
  require_bad("resp+unix://relative.sock", "must be absolute");
  require_bad("resp+unix:///tmp/a.sock?x=1", "unsupported query");
  require_bad("resp://h-{rank}:1", "no rank was given");
  require_bad("resp://h:{rank+6400}", "no rank was given");
  require_bad("resp://h:{node}", "unknown placeholder {node}");
  require_bad("resp://h:{rank", "unclosed '{'");
  require_bad("resp://h-{rank+1}:6379", "only allowed as the port", 0);
  require_bad("resp+unix:///tmp/{rank+1}", "only allowed as the port", 0);
  require_bad("resp://h:{rank+x}", "N must be a number", 1);
  require_bad("resp://h:{rank+65535}", "outside 1..65535", 1);
  require_bad("resp://h:1", "negative", -1);
}

TEST_CASE("url: database range, raw '/' in a password and encoded hosts are named", "[unit]") {
  require_bad("resp://h:1/99999999999", "database '99999999999' is out of range 0..1073741824");
  require_bad("resp+unix:///tmp/a.sock?db=2147483648", "database '2147483648' is out of range");
  require_bad("resp://h:1/+1", "database '+1' is not a number >= 0");
  require_bad("resp://u:p/w@h:1", "'/' in the user or password must be percent-encoded as %2F");
  require_bad("resp://h%41:1", "host 'h%41' contains an invalid character");
  require_bad("resp://a]b:1", "host 'a]b' contains an invalid character");
  auto r = parse_url("resp://u:p%2Fw@h:1/1073741824");
  REQUIRE(r);
  CHECK(r.value.password == "p/w");
  CHECK(r.value.db == 1 << 30);
  r = parse_url("resp://[::1]:{rank+6400}/1", 2);
  REQUIRE(r);
  CHECK(r.value.host == "::1");
  CHECK(r.value.port == 6402);
}

TEST_CASE("url: rediss:// and resp+tls:// are TCP with TLS", "[unit]") {
  for (const char* u : {"rediss://:pw@cache.example:6380/2", "resp+tls://:pw@cache.example:6380/2"}) {
    INFO(u);
    const auto r = kvtier::resp::parse_url(u);
    REQUIRE(r);
    CHECK(r.value.tls);
    CHECK(r.value.host == "cache.example");
    CHECK(r.value.port == 6380);
    CHECK(r.value.db == 2);
    CHECK(r.value.password == "pw");
  }
  const auto t = kvtier::resp::parse_url("rediss://10.0.0.{rank}:{rank+6400}", 3);
  REQUIRE(t);
  CHECK(t.value.tls);
  CHECK(t.value.host == "10.0.0.3");
  CHECK(t.value.port == 6403);
  CHECK_FALSE(kvtier::resp::parse_url("resp://h:1").value.tls);
  const auto bad = kvtier::resp::parse_url("redis://h:1");
  CHECK(bad.ec == kvtier::errc::bad_url);
  CHECK(bad.message.find("rediss") != std::string::npos);           // the message lists what is accepted
  require_bad("rediss://h:{rank}", "{rank} as the whole port", 0);  // same rules as resp://
  CHECK(kvtier::resp::redact_url("rediss://u:s3cret@h:1") == "rediss://u:***@h:1");
}

TEST_CASE("url: the scheme is checked first, and {rank} as the whole port is refused", "[unit]") {
  require_bad("redis://h:{rank+6400}", "unsupported scheme 'redis'", 0);
  require_bad("redis://h:{rank+6400}", "unsupported scheme 'redis'");
  require_bad("h:{rank}", "missing scheme", 1);
  require_bad("resp://h:{rank}", "{rank} as the whole port", 0);
  require_bad("resp://h:{rank}/2", "write {rank+N}", 3);
  require_bad("resp://h:{rank}", "{rank} as the whole port");  // no rank given: the same answer
  auto r = parse_url("resp://h:63{rank}9", 1);                 // part of a port is fine
  REQUIRE(r);
  CHECK(r.value.port == 6319);
}

TEST_CASE("url: passwords are never printed", "[unit]") {
  using kvtier::resp::redact_url;
  CHECK(redact_url("resp://app:s3cret@h:6379/2") == "resp://app:***@h:6379/2");
  CHECK(redact_url("resp://s3cret@h:6379") == "resp://***@h:6379");
  CHECK(redact_url("resp://h:6379") == "resp://h:6379");
  CHECK(redact_url("resp://u:p/w@h:1") == "resp://u:***@h:1");  // a raw '/' in the password
  CHECK(redact_url("resp+unix://u:s3cret@/tmp/r.sock?db=1") == "resp+unix://u:***@/tmp/r.sock?db=1");
  CHECK(redact_url("redis://:s3cret@h:1") == "redis://:***@h:1");
  // parse_url's messages show the URL redacted.
  for (const char* bad : {"resp://u:s3cret@h:70000", "resp://u:s3cret@h:1/x", "resp://s3cret@h:{rank}",
                          "redis://u:s3cret@h:1", "resp://u:s3/cret@h:1"}) {
    const auto r = parse_url(bad, 0);
    INFO(r.message);
    REQUIRE_FALSE(r);
    CHECK(r.message.find("s3") == std::string::npos);
    CHECK(r.message.find("***") != std::string::npos);
  }
}

TEST_CASE("url: a password from a file or the environment", "[unit]") {
  using kvtier::resp::apply_password;
  const std::string file = "test_url_password_" + std::to_string(::getpid());
  { std::ofstream(file) << "from-file\nsecond line ignored\n"; }
  auto r = parse_url("resp://h:1");
  REQUIRE(r);
  CHECK(apply_password(r.value, {.file = file}).empty());
  CHECK(r.value.password == "from-file");
  // In the URL and in a file: refused, without echoing either.
  const std::string both = apply_password(r.value, {.file = file});
  CHECK(both.find("one place") != std::string::npos);
  CHECK(both.find("from-file") == std::string::npos);
  // A missing file is named.
  auto r2 = parse_url("resp://h:1");
  const std::string missing = apply_password(r2.value, {.file = file + ".missing"});
  CHECK(missing.find(file + ".missing") != std::string::npos);
  // The environment, only when the URL has no password and no file is named.
  ::setenv("KVTIER_TEST_URL_PASSWORD", "from-env", 1);
  auto r3 = parse_url("resp://h:1");
  CHECK(apply_password(r3.value, {.env = "KVTIER_TEST_URL_PASSWORD"}).empty());
  CHECK(r3.value.password == "from-env");
  auto r4 = parse_url("resp://in-url@h:1");
  CHECK(apply_password(r4.value, {.env = "KVTIER_TEST_URL_PASSWORD"}).empty());
  CHECK(r4.value.password == "in-url");
  ::unsetenv("KVTIER_TEST_URL_PASSWORD");
  std::remove(file.c_str());
}
