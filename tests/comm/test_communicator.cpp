// The communicator concept's helpers: all_reduce deduces its element type, the
// deadline text of error messages never overflows, and agreed budgets turn into
// each rank's own deadline (comm/communicator.hpp, comm/recover.hpp).
#include <array>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "kvtier/comm/inproc.hpp"
#include "kvtier/comm/recover.hpp"

using namespace kvtier;
using namespace std::chrono_literals;

TEST_CASE("all_reduce over arrays, C arrays and vectors deduces its element type", "[unit]") {
  comm::inproc_world world(2);
  std::vector<std::uint64_t> got(4);
  comm::run_ranks(world, [&](comm::inproc_communicator& c) {
    std::array<std::uint64_t, 2> a{10 + c.rank(), 20 - c.rank()};
    std::uint32_t raw[2] = {static_cast<std::uint32_t>(5 * c.rank()), 7};
    std::vector<std::int64_t> v{-1 - static_cast<std::int64_t>(c.rank())};
    const std::vector<std::int64_t> in = v;
    // No explicit template arguments: in place or not.
    auto e1 = comm::all_reduce(c, a, a, comm::reduce_op::min, deadline_after(10s));
    auto e2 = comm::all_reduce(c, raw, raw, comm::reduce_op::sum, deadline_after(10s));
    auto e3 = comm::all_reduce(c, in, v, comm::reduce_op::max, deadline_after(10s));
    // The explicit form of earlier callers still compiles.
    std::uint64_t one[1] = {1};
    auto e4 = comm::all_reduce<comm::inproc_communicator, std::uint64_t>(c, one, one, comm::reduce_op::sum,
                                                                         deadline_after(10s));
    if (c.rank() == 0 && !e1 && !e2 && !e3 && !e4 && one[0] == 2)
      got = {a[0], a[1], raw[0], static_cast<std::uint64_t>(v[0])};
  });
  CHECK(got == std::vector<std::uint64_t>{10, 19, 5, static_cast<std::uint64_t>(std::int64_t{-1})});
}

TEST_CASE("deadline_text: no overflow for any deadline, deadline::min() included", "[unit]") {
  const auto start = clock::now();
  CHECK(comm::detail::deadline_text(start + 12500us, start) == "deadline 12.5 ms after the call began");
  CHECK(comm::detail::deadline_text(no_deadline, start) == "no deadline");
  CHECK(comm::detail::deadline_text(deadline::min(), start) ==
        "a deadline that had already passed when the call began");
  CHECK(comm::detail::deadline_text(start - 1ms, start) ==
        "a deadline that had already passed when the call began");
  // Far ends of the clock in both directions still give text.
  CHECK(comm::detail::deadline_text(deadline::max() - 1ns, deadline::min()).rfind("deadline ", 0) == 0);
  CHECK(comm::detail::deadline_text(deadline::min(), deadline::max() - 1ns).find("already passed") !=
        std::string::npos);
}

TEST_CASE("agree_budget: the smallest budget, as a deadline on each rank's own clock", "[unit]") {
  comm::inproc_world world(3);
  std::vector<comm::agreed_budget> out(3);
  comm::run_ranks(world, [&](comm::inproc_communicator& c) {
    const std::chrono::milliseconds mine[] = {800ms, 300ms, -5ms};
    out[c.rank()] = comm::agree_budget(c, c.rank() == 2 ? 2000ms : mine[c.rank()], deadline_after(10s));
  });
  for (const auto& b : out) {
    INFO(b.message);
    CHECK(!b.ec);
    CHECK(b.budget == std::chrono::duration_cast<clock::duration>(300ms));
  }
  const auto start = clock::now();
  CHECK(out[0].deadline_from(start) == start + 300ms);
  comm::agreed_budget forever{{}, {}, clock::duration::max()};
  CHECK(forever.deadline_from(start) == no_deadline);  // saturates, never wraps into the past
  comm::agreed_budget none{};
  CHECK(none.deadline_from(start) == start);
}
