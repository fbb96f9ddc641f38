// tests/comm/conformance.hpp: the failure contract of communicator.hpp, as one test
// source every backend instantiates (in-process: test_comm_conformance.cpp; MPI:
// test_comm_mpi.cpp under mpiexec; NCCL: test_nccl.cpp where GPUs exist).
//
// Each case is a function that every rank runs on its own fresh communicator
// (a harness makes the world: threads for in-process and NCCL, processes for MPI).
// Memory is a policy: host vectors, or device buffers for NCCL.
//
//   kvtier::test::conformance::sink s;
//   run_on_every_rank([&](auto& c) { conformance::stalled_rank<host_memory>(c, s); });
//   CHECK(s.empty());
#pragma once

#include <chrono>
#include <climits>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "kvtier/comm/communicator.hpp"

namespace kvtier::test::conformance {

using namespace std::chrono_literals;

/// How long a rank waits for a peer that never comes, and the slack allowed past it (the
/// same 1 s as support/deadline_check.hpp: 250 ms was overrun under ctest -j6 on 2 cores).
inline constexpr auto wait_budget = 300ms;
inline constexpr auto margin = 1000ms;

/// Failures of every rank (thread-safe; Catch2 assertions are not).
struct sink {
  std::mutex mu;
  std::vector<std::string> list;
  void add(rank_t r, int line, const std::string& what) {
    std::lock_guard lk(mu);
    list.push_back("rank " + std::to_string(r) + ", conformance.hpp:" + std::to_string(line) + ": " + what);
  }
  bool empty() {
    std::lock_guard lk(mu);
    return list.empty();
  }
  std::string text() {
    std::lock_guard lk(mu);
    std::string s;
    for (auto& l : list) s += l + "\n";
    return s;
  }
};

#define KVTIER_CONF_EXPECT(...)                                  \
  do {                                                           \
    if (!(__VA_ARGS__)) s.add(c.rank(), __LINE__, #__VA_ARGS__); \
  } while (0)

/// Host memory: the in-process and MPI backends.
struct host_memory {
  using buffer = std::vector<std::byte>;
  static buffer make(std::size_t n) { return buffer(n, std::byte{0}); }
  static std::span<std::byte> bytes(buffer& b) { return b; }
  static void write(buffer& b, std::span<const std::byte> from) {
    std::memcpy(b.data(), from.data(), from.size());
  }
  static std::vector<std::byte> read(buffer& b) { return b; }
};

inline deadline soon() { return deadline_after(10s); }
inline bool by(deadline dl) { return clock::now() <= dl + margin; }

inline std::vector<std::byte> filled(std::size_t n, unsigned seed) {
  std::vector<std::byte> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<std::byte>(seed * 16 + i);
  return v;
}

/// Broadcast (separate and in place), all_gather (separate and in place) and
/// all_reduce for every type and op move exactly the right bytes.
template <class Mem, comm::communicator C>
void collectives_move_the_right_bytes(C& c, sink& s) {
  const rank_t r = c.rank(), w = c.size();
  auto send = Mem::make(32), recv = Mem::make(32);
  Mem::write(send, filled(32, r));
  KVTIER_CONF_EXPECT(
      !c.broadcast(r == w - 1 ? std::span<const std::byte>(Mem::bytes(send)) : std::span<const std::byte>{},
                   Mem::bytes(recv), w - 1, soon()));
  KVTIER_CONF_EXPECT(Mem::read(recv) == filled(32, w - 1));
  KVTIER_CONF_EXPECT(!c.broadcast(Mem::bytes(send), Mem::bytes(send), 0, soon()));
  KVTIER_CONF_EXPECT(Mem::read(send) == filled(32, 0));

  auto mine = Mem::make(5), all = Mem::make(5 * w);
  Mem::write(mine, filled(5, r + 1));
  KVTIER_CONF_EXPECT(!c.all_gather(Mem::bytes(mine), Mem::bytes(all), soon()));
  auto got = Mem::read(all);
  for (rank_t j = 0; j < w; ++j)
    KVTIER_CONF_EXPECT(std::memcmp(got.data() + 5 * j, filled(5, j + 1).data(), 5) == 0);
  auto ip = Mem::make(5 * w);
  std::vector<std::byte> init(5 * w, std::byte{0});
  std::memcpy(init.data() + 5 * r, filled(5, r + 7).data(), 5);
  Mem::write(ip, init);
  KVTIER_CONF_EXPECT(
      !c.all_gather(std::span<const std::byte>(Mem::bytes(ip)).subspan(5 * r, 5), Mem::bytes(ip), soon()));
  got = Mem::read(ip);
  for (rank_t j = 0; j < w; ++j)
    KVTIER_CONF_EXPECT(std::memcmp(got.data() + 5 * j, filled(5, j + 7).data(), 5) == 0);

  std::int32_t a = -static_cast<std::int32_t>(r);
  KVTIER_CONF_EXPECT(!comm::all_reduce_value(c, a, comm::reduce_op::min, soon()));
  KVTIER_CONF_EXPECT(a == -static_cast<std::int32_t>(w - 1));
  std::uint32_t b = r;
  KVTIER_CONF_EXPECT(!comm::all_reduce_value(c, b, comm::reduce_op::max, soon()));
  KVTIER_CONF_EXPECT(b == w - 1);
  std::int64_t sm = -static_cast<std::int64_t>(r);
  KVTIER_CONF_EXPECT(!comm::all_reduce_value(c, sm, comm::reduce_op::sum, soon()));
  KVTIER_CONF_EXPECT(sm == -static_cast<std::int64_t>(w) * (w - 1) / 2);
  std::uint64_t v[3] = {r, 100u - r, 5}, m[3] = {};
  KVTIER_CONF_EXPECT(!comm::all_reduce<C, std::uint64_t>(c, v, m, comm::reduce_op::min, soon()));
  KVTIER_CONF_EXPECT(m[0] == 0 && m[1] == 100u - (w - 1) && m[2] == 5);
}

/// reduce_op::sum wraps modulo 2^bits for signed and unsigned types (no overflow UB).
template <class Mem, comm::communicator C>
void sum_wraps(C& c, sink& s) {
  const rank_t w = c.size();
  std::int32_t i = INT32_MAX;
  KVTIER_CONF_EXPECT(!comm::all_reduce_value(c, i, comm::reduce_op::sum, soon()));
  KVTIER_CONF_EXPECT(i == static_cast<std::int32_t>(static_cast<std::uint32_t>(INT32_MAX) * w));
  std::int64_t l = INT64_MIN;
  KVTIER_CONF_EXPECT(!comm::all_reduce_value(c, l, comm::reduce_op::sum, soon()));
  KVTIER_CONF_EXPECT(l == static_cast<std::int64_t>(static_cast<std::uint64_t>(INT64_MIN) * w));
  std::uint64_t u = UINT64_MAX;
  KVTIER_CONF_EXPECT(!comm::all_reduce_value(c, u, comm::reduce_op::sum, soon()));
  KVTIER_CONF_EXPECT(u == static_cast<std::uint64_t>(0) - w);
}

/// Operations between group_start and group_end run as one collective: every
/// owner's broadcast and an all_reduce, nested; an empty group issues nothing.
template <class Mem, comm::communicator C>
void groups_run_as_one_collective(C& c, sink& s) {
  const rank_t r = c.rank(), w = c.size();
  std::vector<typename Mem::buffer> bufs;
  for (rank_t o = 0; o < w; ++o) {
    bufs.push_back(Mem::make(8));
    if (o == r) Mem::write(bufs.back(), filled(8, 0x10 + o));
  }
  std::uint64_t x = 3 + r;
  KVTIER_CONF_EXPECT(!c.group_start());
  KVTIER_CONF_EXPECT(!c.group_start());
  for (rank_t o = 0; o < w; ++o)
    KVTIER_CONF_EXPECT(!c.broadcast(Mem::bytes(bufs[o]), Mem::bytes(bufs[o]), o, soon()));
  KVTIER_CONF_EXPECT(!comm::all_reduce_value(c, x, comm::reduce_op::max, soon()));
  KVTIER_CONF_EXPECT(!c.group_end(soon()));
  KVTIER_CONF_EXPECT(!c.group_end(soon()));
  for (rank_t o = 0; o < w; ++o) KVTIER_CONF_EXPECT(Mem::read(bufs[o]) == filled(8, 0x10 + o));
  KVTIER_CONF_EXPECT(x == 3 + w - 1);
  KVTIER_CONF_EXPECT(!c.group_start());
  KVTIER_CONF_EXPECT(!c.group_end(soon()));  // empty
  std::uint32_t y = 1;
  KVTIER_CONF_EXPECT(!comm::all_reduce_value(c, y, comm::reduce_op::sum, soon()));
  KVTIER_CONF_EXPECT(y == w);
}

/// Rank W-1 stalls past its peers' deadline (it is the broadcast's root, so no peer
/// can finish early). The peers return timeout by their deadline (+ margin), with
/// last_error() naming the call and its root (where rounds may fail apart, a peer told by
/// another peer that timed out first may give up sooner: backend_error, naming the call). Then:
/// - rounds fail together: the late rank's call fails at once, and the world works on;
/// - otherwise: every peer's later call fails at once (poisoned), and the late rank
///   fails by its own deadline at the latest, then at once.
template <class Mem, comm::communicator C>
void stalled_rank(C& c, sink& s) {
  const rank_t r = c.rank(), w = c.size();
  if (w < 2) return;
  const rank_t late = w - 1;
  auto b = Mem::make(64);
  Mem::write(b, filled(64, r));
  // Start together: without it, a peer whose thread or process starts late on a loaded machine
  // can begin its call after the late rank has come, and see no timeout at all.
  std::uint64_t start = 0;
  KVTIER_CONF_EXPECT(!comm::all_reduce_value(c, start, comm::reduce_op::sum, soon()));
  if (r != late) {
    const deadline dl = deadline_after(wait_budget);
    const auto ec = c.broadcast(Mem::bytes(b), Mem::bytes(b), late, dl);
    if constexpr (comm::rounds_fail_together<C>)
      KVTIER_CONF_EXPECT(ec == errc::timeout);
    else  // MPI: a peer's failure notice (mpi.hpp) may come first
      KVTIER_CONF_EXPECT(ec == errc::timeout || (w > 2 && ec == errc::backend_error));
    KVTIER_CONF_EXPECT(by(dl));
    const std::string msg = c.last_error(), root = "root=" + std::to_string(late);
    if (msg.find(root) == std::string::npos)
      s.add(r, __LINE__, "last_error does not name " + root + ": " + msg);
  } else {
    std::this_thread::sleep_for(wait_budget + margin + 100ms);  // past every peer's deadline
    const deadline dl = deadline_after(wait_budget);
    const auto t0 = clock::now();
    const auto ec = c.broadcast(Mem::bytes(b), Mem::bytes(b), late, dl);
    if constexpr (comm::rounds_fail_together<C>) {
      KVTIER_CONF_EXPECT(ec == errc::timeout);
      KVTIER_CONF_EXPECT(clock::now() - t0 <= margin);  // the round had failed already
    }
    // else: the peers' abandoned calls may still pair with this one; either outcome is allowed.
    KVTIER_CONF_EXPECT(by(dl));
  }
  std::uint64_t v = r;
  if constexpr (comm::rounds_fail_together<C>) {
    KVTIER_CONF_EXPECT(!comm::all_reduce_value(c, v, comm::reduce_op::max, soon()));
    KVTIER_CONF_EXPECT(v == w - 1);
  } else {
    const deadline dl = deadline_after(5 * wait_budget);
    const auto t0 = clock::now();
    KVTIER_CONF_EXPECT(comm::all_reduce_value(c, v, comm::reduce_op::max, dl));
    if (r != late) KVTIER_CONF_EXPECT(clock::now() - t0 <= margin);  // poisoned: fails at once
    KVTIER_CONF_EXPECT(by(dl));
    const auto t1 = clock::now();
    KVTIER_CONF_EXPECT(comm::all_reduce_value(c, v, comm::reduce_op::max, deadline_after(5 * wait_budget)));
    KVTIER_CONF_EXPECT(clock::now() - t1 <= margin);  // every rank is poisoned by now
  }
}

/// Rank W-1 passes a receive buffer of the wrong size: every rank returns an
/// error by its deadline (an all-gather: no rank can finish without every other).
template <class Mem, comm::communicator C>
void invalid_argument_on_one_rank(C& c, sink& s) {
  const rank_t r = c.rank(), w = c.size();
  auto mine = Mem::make(4), all = Mem::make(4 * w + 1);
  const deadline dl = deadline_after(wait_budget);
  auto recv = Mem::bytes(all).first(r == w - 1 ? 4 * w + 1 : 4 * w);
  const auto ec = c.all_gather(Mem::bytes(mine), recv, dl);
  KVTIER_CONF_EXPECT(static_cast<bool>(ec));
  if (r == w - 1) KVTIER_CONF_EXPECT(ec == errc::invalid_argument);
  if constexpr (comm::rounds_fail_together<C>) KVTIER_CONF_EXPECT(ec == errc::invalid_argument);
  KVTIER_CONF_EXPECT(by(dl));
  KVTIER_CONF_EXPECT(!std::string(c.last_error()).empty());
}

/// Every case with its name, for harnesses that loop over them.
template <class Mem, comm::communicator C>
struct suite {
  struct entry {
    const char* name;
    void (*run)(C&, sink&);
  };
  static constexpr entry cases[] = {
      {"collectives move the right bytes", &collectives_move_the_right_bytes<Mem, C>},
      {"sum wraps", &sum_wraps<Mem, C>},
      {"groups run as one collective", &groups_run_as_one_collective<Mem, C>},
      {"a stalled rank: peers time out by their deadline, later calls fail at once", &stalled_rank<Mem, C>},
      {"invalid argument on one rank: every rank fails by its deadline",
       &invalid_argument_on_one_rank<Mem, C>},
  };
};

#undef KVTIER_CONF_EXPECT

}  // namespace kvtier::test::conformance
