// Integration test of the test harness itself: real redis-server start/kill/restart
// and the black-hole server.
#include <catch2/catch.hpp>

#include "support/redis_server.hpp"

using kvtier::test::black_hole_server;
using kvtier::test::redis_server;

TEST_CASE("redis_server: starts, answers, kills and restarts on the same port", "[integration]") {
  redis_server srv;
  REQUIRE(srv.running());
  REQUIRE(srv.pid() > 0);
  REQUIRE(srv.call({"PING"}) == "PONG");
  REQUIRE(srv.call({"SET", "k", std::string_view("a\0b", 3)}) == "OK");
  REQUIRE(srv.call({"GET", "k"}) == std::string("a\0b", 3));
  REQUIRE(srv.call({"GET", "missing"}) == "(nil)");
  const auto port = srv.port();
  const auto pid = srv.pid();
  srv.kill();
  REQUIRE_FALSE(srv.running());
  REQUIRE(::kill(pid, 0) != 0);  // reaped, gone
  REQUIRE_THROWS(srv.call({"PING"}));
  srv.restart();
  REQUIRE(srv.port() == port);
  REQUIRE(srv.call({"GET", "k"}) == "(nil)");  // no persistence
}

TEST_CASE("redis_server: ACL user, requirepass and unix socket", "[integration]") {
  redis_server srv(
      {.extra_args = {"--user", "alice", "on", ">secret", "~*", "&*", "+@all", "--user", "default", "off"},
       .unix_socket = true,
       .harness_user = "alice",
       .harness_password = "secret"});
  REQUIRE(srv.call({"PING"}) == "PONG");
  REQUIRE(srv.unix_url().rfind("resp+unix:///", 0) == 0);
}

TEST_CASE("black_hole_server: accepts and never answers", "[integration]") {
  black_hole_server hole;
  int fd = kvtier::test::detail::connect_loopback(hole.port(), std::chrono::milliseconds(200));
  REQUIRE(fd >= 0);
  kvtier::test::detail::send_all(fd, kvtier::test::detail::encode_command({"PING"}));
  char c;
  REQUIRE(::recv(fd, &c, 1, 0) < 0);  // times out after 200 ms
  ::close(fd);
}
