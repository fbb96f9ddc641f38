// broadcast_group (kvtier/comm/broadcast_group.hpp): the one move primitive under chunk_broadcast
// and the connector's mover. Its three rules, each against a real in-process world or a
// communicator poisoned from the start: bytes of every owner land in one grouped collective; a
// refused group_start queues nothing and never calls group_end; the first error is reported.
#include <cstddef>
#include <mutex>
#include <span>
#include <string>
#include <system_error>
#include <vector>

#include <catch2/catch.hpp>

#include "comm/faulty.hpp"
#include "kvtier/comm/broadcast_group.hpp"
#include "kvtier/comm/inproc.hpp"
#include "kvtier/comm/recording.hpp"

using namespace kvtier;
using namespace std::chrono_literals;

TEST_CASE("broadcast_group: every owner's bytes land on every rank in one grouped collective", "[unit]") {
  constexpr rank_t W = 3;
  constexpr std::size_t n = 5, cb = 16;  // chunk c is owned by rank c % W and holds bytes c + 1
  comm::inproc_world world(W);
  std::mutex mu;
  std::vector<std::vector<std::byte>> got(W);
  std::vector<std::vector<comm::collective_call>> calls(W);
  std::vector<std::error_code> ecs(W);
  comm::run_ranks(world, [&](comm::inproc_communicator& c) {
    const rank_t me = c.rank();
    comm::recording<comm::inproc_communicator&> rec(c);
    std::vector<std::byte> buf(n * cb);  // in place, as the connector's staging blocks
    for (std::size_t k = 0; k < n; ++k)
      if (static_cast<rank_t>(k % W) == me)
        for (std::size_t i = 0; i < cb; ++i) buf[k * cb + i] = std::byte(k + 1);
    const std::error_code ec = comm::broadcast_group(rec, [&](auto&& broadcast) {
      for (std::size_t k = 0; k < n; ++k) {
        const auto owner = static_cast<rank_t>(k % W);
        const std::span<std::byte> s(buf.data() + k * cb, cb);
        broadcast(owner == me ? std::span<const std::byte>(s) : std::span<const std::byte>{}, s, owner);
      }
    }, deadline_after(20s));
    std::lock_guard lock(mu);
    ecs[me] = ec;
    got[me] = buf;
    calls[me] = rec.calls();
  });
  for (rank_t r = 0; r < W; ++r) {
    INFO("rank " << r);
    CHECK(!ecs[r]);
    for (std::size_t k = 0; k < n; ++k) CHECK(got[r][k * cb + cb - 1] == std::byte(k + 1));
    CHECK(comm::collective_count(calls[r]) == 1);
    CHECK(calls[r] == calls[0]);
  }
}

TEST_CASE("broadcast_group: a refused group_start queues nothing and never calls group_end", "[unit]") {
  comm::inproc_world world(1);
  test::poisoned<comm::inproc_communicator> c(world.communicator_for(0), "timeout in request 3");
  bool visited = false;
  std::vector<std::byte> buf(8);
  const std::error_code ec = comm::broadcast_group(c, [&](auto&& broadcast) {
    visited = true;
    broadcast(std::span<const std::byte>(buf), std::span<std::byte>(buf), 0);
  }, deadline_after(5s));
  CHECK(ec == errc::backend_error);
  CHECK_FALSE(visited);
  CHECK(c.misuses() == 0);
  CHECK(c.last_error() == "poisoned by an earlier failure: timeout in request 3");
}

TEST_CASE("broadcast_group: the first error is the one reported, and the group is still closed", "[unit]") {
  // A root outside the world fails when it is queued; the group is closed all the same (every
  // rank submits it), and the queueing error, not group_end's, is what the caller sees.
  comm::inproc_world world(1);
  comm::recording<comm::inproc_communicator> rec(world.communicator_for(0));
  std::vector<std::byte> buf(8);
  const std::error_code ec = comm::broadcast_group(rec, [&](auto&& broadcast) {
    broadcast(std::span<const std::byte>{}, std::span<std::byte>(buf), 5);
    broadcast(std::span<const std::byte>(buf), std::span<std::byte>(buf), 0);
  }, deadline_after(5s));
  CHECK(ec == errc::invalid_argument);
  REQUIRE_FALSE(rec.calls().empty());
  CHECK(rec.calls().back().op == comm::op_kind::group);
}
