// Unit tests of the deadline-bounded name resolution of the io_uring transport
// (kvtier/resp/detail/conn_socket.hpp): literals skip the resolver, a slow resolver cannot
// hold the caller past its deadline, and its late answer lands in state it owns.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <memory>
#include <thread>

#include "kvtier/resp/detail/conn_socket.hpp"
#include "resp_io/io_test_util.hpp"

using namespace std::chrono_literals;
using kvtier::deadline_after;
using kvtier::errc;
using kvtier::resp::detail::conn_addresses;
using kvtier::resp::detail::conn_resolve;
using kvtier::test::require_returned_by;

namespace {
// A lookup that must not run: counts its calls.
struct counting_lookup {
  std::shared_ptr<std::atomic<int>> calls = std::make_shared<std::atomic<int>>(0);
  bool operator()(const std::string&, std::uint16_t, conn_addresses&) const {
    ++*calls;
    return false;
  }
};
}  // namespace

TEST_CASE("conn_resolve: IPv4 and IPv6 literals never reach the resolver", "[unit]") {
  counting_lookup lookup;
  conn_addresses addrs;
  REQUIRE_FALSE(conn_resolve("127.0.0.1", 6379, deadline_after(1s), addrs, lookup));
  REQUIRE(addrs.size() == 1);
  REQUIRE(addrs[0].addr.ss_family == AF_INET);
  REQUIRE(ntohs(reinterpret_cast<const sockaddr_in*>(&addrs[0].addr)->sin_port) == 6379);
  REQUIRE_FALSE(conn_resolve("::1", 7000, deadline_after(1s), addrs, lookup));
  REQUIRE(addrs.size() == 1);
  REQUIRE(addrs[0].addr.ss_family == AF_INET6);
  REQUIRE(ntohs(reinterpret_cast<const sockaddr_in6*>(&addrs[0].addr)->sin6_port) == 7000);
  // Even an expired deadline: a literal needs no waiting.
  REQUIRE_FALSE(conn_resolve("10.1.2.3", 1, kvtier::clock::now() - 1s, addrs, lookup));
  REQUIRE(*lookup.calls == 0);
  // A name does go to the resolver, whose "no" is resolve_failed.
  REQUIRE(conn_resolve("localhost", 6379, deadline_after(1s), addrs, lookup) == errc::resolve_failed);
  REQUIRE(*lookup.calls == 1);
  REQUIRE(addrs.empty());
}

TEST_CASE("conn_resolve: a resolver that hangs times out at the deadline", "[unit]") {
  struct gate {
    std::atomic<bool> release{false};
    std::atomic<bool> finished{false};
  };
  auto g = std::make_shared<gate>();
  auto hanging = [g](const std::string&, std::uint16_t port, conn_addresses& out) {
    // Bounded: released by the test below, or gives up after 10 s.
    for (int i = 0; i < 1000 && !g->release; ++i) std::this_thread::sleep_for(10ms);
    kvtier::resp::detail::conn_getaddrinfo("127.0.0.1", port, true, out);
    g->finished = true;
    return true;
  };
  conn_addresses addrs;
  const auto dl = deadline_after(200ms);
  REQUIRE(conn_resolve("slow.example", 6379, dl, addrs, hanging) == errc::timeout);
  require_returned_by(dl);
  REQUIRE(addrs.empty());
  // The late answer goes to the helper's own state, not to `addrs` (which could be gone).
  g->release = true;
  for (int i = 0; i < 1000 && !g->finished; ++i) std::this_thread::sleep_for(10ms);
  REQUIRE(g->finished);
  std::this_thread::sleep_for(50ms);  // let the helper store its result
  REQUIRE(addrs.empty());
}

// no_deadline means "no limit" here as in every other component: the wait uses no
// timeout (never wait_until(time_point::max()), which overflows on some libraries).
TEST_CASE("conn_resolve: no_deadline waits for a slow resolver instead of timing out", "[unit]") {
  auto slow = [](const std::string&, std::uint16_t port, conn_addresses& out) {
    std::this_thread::sleep_for(20ms);
    return kvtier::resp::detail::conn_getaddrinfo("127.0.0.1", port, true, out);
  };
  conn_addresses addrs;
  REQUIRE_FALSE(conn_resolve("slow.example", 6379, kvtier::no_deadline, addrs, slow));
  REQUIRE(addrs.size() == 1);
}

TEST_CASE("conn_resolve: the real resolver with a name under .invalid fails by the deadline", "[unit]") {
  conn_addresses addrs;
  const auto dl = deadline_after(1s);
  const std::error_code ec = conn_resolve("no-such-host.invalid", 6379, dl, addrs);
  // resolve_failed from a resolver that answers; timeout from one that does not.
  REQUIRE((ec == errc::resolve_failed || ec == errc::timeout));
  require_returned_by(dl);
  REQUIRE(addrs.empty());
}
