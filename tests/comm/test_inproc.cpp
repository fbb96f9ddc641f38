// In-process communicator: collectives, groups, mismatch detection, timeouts,
// recovery after errors, and the recording decorator. Short; also run under TSan.
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <limits>
#include <mutex>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "kvtier/comm/inproc.hpp"
#include "kvtier/comm/recording.hpp"

using namespace kvtier;
using namespace kvtier::comm;
using namespace std::chrono_literals;

namespace {

static_assert(communicator<inproc_communicator>);
static_assert(communicator<recording<inproc_communicator>>);
static_assert(communicator<recording<inproc_communicator&>>);

// Catch2 assertions are not thread-safe: rank threads record failures here and the
// test thread checks them.
struct failures {
  std::mutex mu;
  std::vector<std::string> list;
  void add(const char* expr, int line) {
    std::lock_guard lk(mu);
    list.push_back("line " + std::to_string(line) + ": " + expr);
  }
  std::string text() {
    std::string s;
    for (auto& l : list) s += l + "\n";
    return s;
  }
};
#define EXPECT_R(...)                                      \
  do {                                                     \
    if (!(__VA_ARGS__)) fails.add(#__VA_ARGS__, __LINE__); \
  } while (0)
#define CHECK_NO_FAILURES()    \
  do {                         \
    INFO(fails.text());        \
    CHECK(fails.list.empty()); \
  } while (0)

deadline soon() { return deadline_after(10s); }

std::span<const std::byte> cbytes(const std::vector<std::byte>& v) { return v; }

// Runs body(comm) on W threads and returns each rank's (error, last_error) of one call.
struct outcome {
  std::error_code ec;
  std::string msg;
};

template <class Body>
std::vector<outcome> each_rank(rank_t w, Body body) {
  inproc_world world(w);
  std::vector<outcome> out(w);
  run_ranks(world, [&](inproc_communicator& c) {
    out[c.rank()].ec = body(c);
    out[c.rank()].msg = c.last_error();
  });
  CHECK(world.pending_rounds() == 0u);
  return out;
}

}  // namespace

TEST_CASE("inproc: broadcast, all_gather and all_reduce move the right bytes", "[unit]") {
  failures fails;
  for (rank_t w : {1u, 3u, 8u}) {
    inproc_world world(w);
    run_ranks(world, [&](inproc_communicator& c) {
      const rank_t r = c.rank();
      // broadcast from the last rank, separate send buffer and in place
      std::vector<std::byte> send(32), recv(32, std::byte{0});
      for (std::size_t i = 0; i < send.size(); ++i) send[i] = static_cast<std::byte>(r * 16 + i);
      EXPECT_R(!c.broadcast(r == w - 1 ? cbytes(send) : std::span<const std::byte>{}, recv, w - 1, soon()));
      for (std::size_t i = 0; i < recv.size(); ++i)
        EXPECT_R(recv[i] == static_cast<std::byte>((w - 1) * 16 + i));
      std::vector<std::byte> inplace = send;
      EXPECT_R(!c.broadcast(inplace, inplace, 0, soon()));
      for (std::size_t i = 0; i < inplace.size(); ++i) EXPECT_R(inplace[i] == static_cast<std::byte>(i));

      // all_gather, out of place and in place
      std::vector<std::byte> mine(5, static_cast<std::byte>(r + 1)), all(5 * w);
      EXPECT_R(!c.all_gather(mine, all, soon()));
      for (rank_t j = 0; j < w; ++j)
        for (std::size_t i = 0; i < 5; ++i) EXPECT_R(all[j * 5 + i] == static_cast<std::byte>(j + 1));
      std::vector<std::byte> ip(5 * w, std::byte{0});
      std::fill_n(ip.begin() + r * 5, 5, static_cast<std::byte>(r + 7));
      EXPECT_R(!c.all_gather(std::span<const std::byte>(ip).subspan(r * 5, 5), ip, soon()));
      for (rank_t j = 0; j < w; ++j) EXPECT_R(ip[j * 5 + 4] == static_cast<std::byte>(j + 7));

      // all_reduce for every type and op
      std::int32_t a = -static_cast<std::int32_t>(r);
      EXPECT_R(!all_reduce_value(c, a, reduce_op::min, soon()));
      EXPECT_R(a == -static_cast<std::int32_t>(w - 1));
      std::uint32_t b = r;
      EXPECT_R(!all_reduce_value(c, b, reduce_op::max, soon()));
      EXPECT_R(b == w - 1);
      std::int64_t s = r;
      EXPECT_R(!all_reduce_value(c, s, reduce_op::sum, soon()));
      EXPECT_R(s == static_cast<std::int64_t>(w) * (w - 1) / 2);
      std::array<std::uint64_t, 3> v{r, 100u - r, 5};
      std::array<std::uint64_t, 3> m{};
      EXPECT_R(!all_reduce<inproc_communicator, std::uint64_t>(c, v, m, reduce_op::min, soon()));
      EXPECT_R(m == std::array<std::uint64_t, 3>{0, 100u - (w - 1), 5});
    });
    CHECK(world.pending_rounds() == 0u);
  }
  CHECK_NO_FAILURES();
}

TEST_CASE("inproc: a group runs its operations as one collective", "[unit]") {
  inproc_world world(4);
  failures fails;
  run_ranks(world, [&](inproc_communicator& c0) {
    recording c(std::move(c0));
    const rank_t r = c.rank();
    std::vector<std::vector<std::byte>> bufs(4, std::vector<std::byte>(8));
    for (rank_t o = 0; o < 4; ++o)
      if (o == r) std::fill(bufs[o].begin(), bufs[o].end(), static_cast<std::byte>(0x10 + o));
    EXPECT_R(!c.group_start());
    EXPECT_R(!c.group_start());  // nesting: only the outermost end executes
    for (rank_t o = 0; o < 4; ++o) EXPECT_R(!c.broadcast(bufs[o], bufs[o], o, soon()));
    EXPECT_R(!c.group_end(soon()));
    EXPECT_R(!c.group_end(soon()));
    for (rank_t o = 0; o < 4; ++o) EXPECT_R(bufs[o][7] == static_cast<std::byte>(0x10 + o));
    EXPECT_R(collective_count(c.calls()) == 1u);
    EXPECT_R(c.calls().size() == 5u);
    EXPECT_R(c.calls().back().op == op_kind::group);
    EXPECT_R(c.calls().back().bytes == 4u);
    EXPECT_R(c.inner().sequence() == 1u);
  });
  CHECK_NO_FAILURES();
}

TEST_CASE("inproc: different roots are reported on every rank, naming both calls", "[unit]") {
  auto out = each_rank(3, [](inproc_communicator& c) {
    std::vector<std::byte> buf(16);
    const rank_t root = c.rank() == 2 ? 1 : 0;
    return c.broadcast(buf, buf, root, soon());
  });
  for (const auto& o : out) {
    CHECK(o.ec == errc::collective_mismatch);
    CHECK(o.msg.find("broadcast(root=0, bytes=16)") != std::string::npos);
    CHECK(o.msg.find("broadcast(root=1, bytes=16)") != std::string::npos);
    CHECK(o.msg.find("rank 2") != std::string::npos);
  }
}

TEST_CASE("inproc: different operations, sizes, types and reduce-ops are mismatches", "[unit]") {
  SECTION("broadcast vs all_gather") {
    auto out = each_rank(2, [](inproc_communicator& c) {
      std::vector<std::byte> a(8), all(16);
      return c.rank() == 0 ? c.broadcast(a, a, 0, soon()) : c.all_gather(a, all, soon());
    });
    for (const auto& o : out) {
      CHECK(o.ec == errc::collective_mismatch);
      CHECK(o.msg.find("broadcast") != std::string::npos);
      CHECK(o.msg.find("all_gather") != std::string::npos);
    }
  }
  SECTION("sizes") {
    auto out = each_rank(4, [](inproc_communicator& c) {
      std::vector<std::byte> a(c.rank() == 3 ? 9 : 8);
      return c.broadcast(a, a, 0, soon());
    });
    for (const auto& o : out) {
      CHECK(o.ec == errc::collective_mismatch);
      CHECK(o.msg.find("bytes=9") != std::string::npos);
    }
  }
  SECTION("types") {
    auto out = each_rank(2, [](inproc_communicator& c) {
      if (c.rank() == 0) {
        std::uint64_t v = 1;
        return all_reduce_value(c, v, reduce_op::min, soon());
      }
      std::int64_t v = 1;
      return all_reduce_value(c, v, reduce_op::min, soon());
    });
    for (const auto& o : out) {
      CHECK(o.ec == errc::collective_mismatch);
      CHECK(o.msg.find("u64 x1, min") != std::string::npos);
      CHECK(o.msg.find("i64 x1, min") != std::string::npos);
    }
  }
  SECTION("reduce ops") {
    auto out = each_rank(2, [](inproc_communicator& c) {
      std::uint32_t v = 1;
      return all_reduce_value(c, v, c.rank() == 0 ? reduce_op::min : reduce_op::max, soon());
    });
    for (const auto& o : out) CHECK(o.ec == errc::collective_mismatch);
  }
  SECTION("group contents and group vs single call") {
    auto out = each_rank(3, [](inproc_communicator& c) {
      std::vector<std::byte> a(4), b(4);
      if (c.rank() == 2) return c.broadcast(a, a, 0, soon());
      (void)c.group_start();
      (void)c.broadcast(a, a, 0, soon());
      (void)c.broadcast(b, b, c.rank() == 0 ? 1 : 0, soon());
      return c.group_end(soon());
    });
    for (const auto& o : out) CHECK(o.ec == errc::collective_mismatch);
  }
}

TEST_CASE("inproc: the world stays usable after a mismatch", "[unit]") {
  inproc_world world(4);
  std::vector<std::error_code> first(4), second(4);
  std::vector<std::uint64_t> value(4);
  run_ranks(world, [&](inproc_communicator& c) {
    std::vector<std::byte> a(8);
    first[c.rank()] = c.broadcast(a, a, c.rank() % 2, soon());
    std::uint64_t v = 10 + c.rank();
    second[c.rank()] = all_reduce_value(c, v, reduce_op::min, soon());
    value[c.rank()] = v;
  });
  for (rank_t r = 0; r < 4; ++r) {
    CHECK(first[r] == errc::collective_mismatch);
    CHECK(!second[r]);
    CHECK(value[r] == 10u);
  }
  CHECK(world.pending_rounds() == 0u);
}

TEST_CASE("inproc: an invalid argument on one rank fails the round on every rank", "[unit]") {
  auto out = each_rank(3, [](inproc_communicator& c) {
    std::vector<std::byte> send(c.rank() == 0 ? 3 : 4), recv(4);
    return c.broadcast(send, recv, 0, soon());  // root's send size differs from its recv size
  });
  for (const auto& o : out) {
    CHECK(o.ec == errc::invalid_argument);
    CHECK(o.msg.find("rank 0") != std::string::npos);
  }
}

// Demonstration (issue 13): the sum of signed integers was `a + b` in T, so
// INT_MAX + INT_MAX was undefined behaviour (UBSan: signed-integer-overflow).
// Now sum wraps modulo 2^bits, the same bits MPI and NCCL produce in practice.
TEST_CASE("inproc: sum wraps modulo 2^bits for signed and unsigned integers (no UB)", "[unit]") {
  constexpr auto i32max = std::numeric_limits<std::int32_t>::max();
  constexpr auto i64min = std::numeric_limits<std::int64_t>::min();
  auto out = each_rank(2, [&](inproc_communicator& c) -> std::error_code {
    std::int32_t a = i32max;
    if (auto ec = all_reduce_value(c, a, reduce_op::sum, soon())) return ec;
    if (a != -2) return errc::backend_error;  // 2 * (2^31 - 1) mod 2^32 == -2
    std::int64_t b = i64min;
    if (auto ec = all_reduce_value(c, b, reduce_op::sum, soon())) return ec;
    if (b != 0) return errc::backend_error;  // 2 * -2^63 mod 2^64 == 0
    std::uint32_t u = 0xffffffffu;
    if (auto ec = all_reduce_value(c, u, reduce_op::sum, soon())) return ec;
    if (u != 0xfffffffeu) return errc::backend_error;
    return {};
  });
  for (const auto& o : out) CHECK(!o.ec);
}

TEST_CASE("inproc: all_reduce takes byte spans; sizes that are not whole elements are refused", "[unit]") {
  auto out = each_rank(2, [](inproc_communicator& c) -> std::error_code {
    std::uint64_t v[2] = {c.rank() + 1u, 7};
    const auto bytes = std::as_writable_bytes(std::span<std::uint64_t>(v));
    if (auto ec = c.all_reduce(bytes, bytes, dtype::u64, reduce_op::max, soon())) return ec;
    if (v[0] != 2 || v[1] != 7) return errc::backend_error;
    return c.all_reduce(bytes.first(12), bytes.first(12), dtype::u64, reduce_op::max, soon());
  });
  for (const auto& o : out) {
    CHECK(o.ec == errc::invalid_argument);
    CHECK(o.msg.find("whole number") != std::string::npos);
  }
}

TEST_CASE("inproc: a missing rank makes the others time out by their deadline, then it catches up",
          "[unit]") {
  inproc_world world(3);
  std::vector<std::error_code> first(3), second(3);
  std::vector<std::string> msg(3);
  std::vector<std::chrono::steady_clock::duration> late(3);
  std::atomic<int> gave_up{0};
  run_ranks(world, [&](inproc_communicator& c) {
    const rank_t r = c.rank();
    std::vector<std::byte> a(8);
    if (r == 1)  // arrives only after the others gave up: gets the same error at once
      for (int i = 0; i < 5000 && gave_up.load() < 2; ++i) std::this_thread::sleep_for(1ms);
    const auto dl = deadline_after(100ms);
    first[r] = c.broadcast(a, a, 0, dl);
    late[r] = clock::now() - dl;
    msg[r] = c.last_error();
    ++gave_up;
    std::uint64_t v = r;
    second[r] = all_reduce_value(c, v, reduce_op::sum, soon());
  });
  for (rank_t r = 0; r < 3; ++r) {
    CHECK(first[r] == errc::timeout);
    CHECK(msg[r].find("missing {1}") != std::string::npos);
    CHECK(late[r] < std::chrono::seconds(2));  // returned by its deadline (plus a generous margin)
    CHECK(!second[r]);
  }
  CHECK(world.pending_rounds() == 0u);
}

TEST_CASE("inproc: an already-passed deadline fails fast unless the round is complete", "[unit]") {
  inproc_world world(1);
  auto c = world.communicator_for(0);
  std::uint64_t v = 7;
  // A world of one is always complete: the call succeeds even with a past deadline.
  CHECK(!all_reduce_value(c, v, reduce_op::max, clock::now() - 1s));
  CHECK(v == 7u);
  inproc_world two(2);
  auto c0 = two.communicator_for(0);
  CHECK(all_reduce_value(c0, v, reduce_op::max, clock::now() - 1s) == errc::timeout);
}

TEST_CASE("recording: sequences of ranks that issue the same calls are equal", "[unit]") {
  inproc_world world(2);
  std::vector<std::vector<collective_call>> seq(2);
  failures fails;
  run_ranks(world, [&](inproc_communicator& c0) {
    recording c(std::move(c0));
    std::vector<std::byte> a(12), all(24);
    std::uint32_t v = 3;
    EXPECT_R(!all_reduce_value(c, v, reduce_op::sum, soon()));
    EXPECT_R(!c.broadcast(a, a, 1, soon()));
    EXPECT_R(!c.all_gather(std::span<const std::byte>(a), all, soon()));
    EXPECT_R(!c.local_copy(a, std::span<const std::byte>(all).first(12), soon()));  // not recorded
    seq[c.rank()] = c.calls();
  });
  CHECK_NO_FAILURES();
  REQUIRE(seq[0] == seq[1]);
  REQUIRE(seq[0].size() == 3u);
  CHECK(to_string(seq[0][0]) == "all_reduce(u32 x1, sum)");
  CHECK(to_string(seq[0][1]) == "broadcast(root=1, bytes=12)");
  CHECK(to_string(seq[0][2]) == "all_gather(bytes per rank=12)");
}

TEST_CASE("recording: wrapping by reference records while the inner communicator advances", "[unit]") {
  inproc_world world(1);
  auto c = world.communicator_for(0);
  recording<inproc_communicator&> rec(c);
  std::int32_t v = 5;
  CHECK(!all_reduce_value(rec, v, reduce_op::max, soon()));
  CHECK(rec.calls().size() == 1u);
  CHECK(c.sequence() == 1u);
  CHECK(&rec.inner() == &c);
}
