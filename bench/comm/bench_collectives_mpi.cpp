// bench_collectives_mpi: ranks as processes (MPI, shared memory) against ranks as
// threads (in-process), at the same W, with memcpy of the same bytes as the floor.
//
//   mpiexec -n W bench_collectives_mpi [reps=7]      # bench/comm/bench_mpi.sh runs W = 2, 4, 8
//
// Per repetition, interleaved: (1) the agreement, one all-reduce (min) of 4 u64 as
// chunk_broadcast issues it, in microseconds per call (mean of 200); (2) a whole
// chunk_broadcast (grouped mode, every chunk agreed: 16 chunks of 1 MiB owned
// round-robin), in ms per load (mean of 3), over MPI staged (the default), MPI
// direct (mpi_options::stage = false), and in-process (W threads in rank 0's process
// while the other processes wait); (3) memcpy of the 16 MiB every rank receives.
// Prints medians, the ratios to in-process and to memcpy, and one JSON line.
// Rank counts above the core count oversubscribe: every figure then includes
// scheduling, for both backends alike.
#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "../support/stats.hpp"
#include "kvtier/chunk_broadcast.hpp"
#include "kvtier/comm/inproc.hpp"
#include "kvtier/comm/mpi.hpp"

using namespace kvtier;
using std::chrono::duration;

namespace {

constexpr std::size_t N = 16, CB = 1 << 20;
constexpr int agree_iters = 200, loads = 3;

struct rank_bytes {
  std::vector<std::byte> src, dst, staging;
  chunk_span_buffers bufs;
  rank_bytes(const modulo_ownership& own, rank_t r)
      : src(N * CB), dst(N * CB), staging(gathered_staging_bytes(own, N, CB)) {
    for (std::size_t k = 0; k < N; ++k) {
      std::memset(src.data() + k * CB, static_cast<int>(k + 1), CB);
      bufs.sources.emplace_back(src.data() + k * CB, CB);
      bufs.destinations.emplace_back(dst.data() + k * CB, CB);
    }
    (void)r;
  }
  bool right() const {
    for (std::size_t k = 0; k < N; ++k)
      if (dst[k * CB] != static_cast<std::byte>(k + 1) ||
          dst[k * CB + CB - 1] != static_cast<std::byte>(k + 1))
        return false;
    return true;
  }
};

/// (agreement us, chunk_broadcast ms) on communicator c, timed on rank 0.
template <comm::communicator C>
std::pair<double, double> measure(C& c, rank_bytes& rb, const modulo_ownership& own) {
  const auto dl = deadline_after(std::chrono::seconds(120));
  std::uint64_t v[4] = {1, 2, 3, 4};
  std::uint32_t sync = 0;
  (void)comm::all_reduce_value(c, sync, comm::reduce_op::sum, dl);
  auto t0 = clock::now();
  for (int i = 0; i < agree_iters; ++i)
    if (comm::all_reduce(c, std::span<const std::uint64_t>(v), std::span<std::uint64_t>(v),
                         comm::reduce_op::min, dl))
      std::abort();
  const double agree_us = duration<double, std::micro>(clock::now() - t0).count() / agree_iters;
  broadcast_params p{.n_chunks = N,
                     .chunk_tokens = 256,
                     .chunk_bytes = CB,
                     .mode = broadcast_mode::grouped,
                     .staging = rb.staging,
                     .request_id = 1};
  (void)comm::all_reduce_value(c, sync, comm::reduce_op::sum, dl);
  t0 = clock::now();
  for (int l = 0; l < loads; ++l) {
    std::memset(rb.dst.data(), 0, rb.dst.size());
    p.request_id = l + 1;
    auto res = chunk_broadcast(c, own, N * 256, rb.bufs, p, dl);
    if (res.ec || res.agreed_chunks != N || !rb.right()) {
      std::fprintf(stderr, "bench_collectives_mpi: wrong result: %s\n", res.message.c_str());
      std::exit(1);
    }
  }
  (void)comm::all_reduce_value(c, sync, comm::reduce_op::sum, dl);
  return {agree_us, duration<double, std::milli>(clock::now() - t0).count() / loads};
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
  const int reps = argc > 1 ? std::atoi(argv[1]) : 7;
  comm::mpi_communicator staged, direct;
  if (comm::mpi_communicator::create(staged, MPI_COMM_WORLD, deadline_after(std::chrono::seconds(60))) ||
      comm::mpi_communicator::create(direct, MPI_COMM_WORLD, deadline_after(std::chrono::seconds(60)),
                                     {.stage = false})) {
    std::fprintf(stderr, "bench_collectives_mpi: %s %s\n", staged.last_error().c_str(),
                 direct.last_error().c_str());
    return 1;
  }
  const rank_t W = staged.size(), me = staged.rank();
  const modulo_ownership own(W);
  rank_bytes mine(own, me);
  std::vector<double> a_mpi, b_mpi, b_direct, a_in, b_in, cp;
  std::vector<std::byte> from(N * CB, std::byte{1}), to(N * CB);
  for (int rep = 0; rep < reps; ++rep) {
    auto [am, bm] = measure(staged, mine, own);
    auto [ad, bd] = measure(direct, mine, own);
    (void)ad;
    a_mpi.push_back(am), b_mpi.push_back(bm), b_direct.push_back(bd);
    if (me == 0) {
      comm::inproc_world world(W);
      std::vector<std::unique_ptr<rank_bytes>> rbs;
      for (rank_t r = 0; r < W; ++r) rbs.push_back(std::make_unique<rank_bytes>(own, r));
      double ai = 0, bi = 0;
      comm::run_ranks(world, [&](comm::inproc_communicator& c) {
        auto [a, b] = measure(c, *rbs[c.rank()], own);
        if (c.rank() == 0) ai = a, bi = b;
      });
      a_in.push_back(ai), b_in.push_back(bi);
      const auto t0 = clock::now();
      for (int l = 0; l < loads; ++l) {
        std::memcpy(to.data(), from.data(), to.size());
        from[static_cast<std::size_t>(l)] = to[static_cast<std::size_t>(l + 1)];  // keep the copies live
      }
      cp.push_back(duration<double, std::milli>(clock::now() - t0).count() / loads);
    }
    std::uint32_t sync = 0;  // the others wait here (polling with sleeps) while rank 0 runs threads
    (void)comm::all_reduce_value(staged, sync, comm::reduce_op::sum,
                                 deadline_after(std::chrono::seconds(600)));
  }
  if (me == 0) {
    using kvtier_bench::median;
    const double am = median(a_mpi), ai = median(a_in), bm = median(b_mpi), bd = median(b_direct),
                 bi = median(b_in), c = median(cp);
    const double mib = static_cast<double>(N * CB) / (1 << 20);
    std::printf("W=%u, %zu x %zu KiB chunks (grouped), median of %d reps\n", W, N, CB >> 10, reps);
    std::printf(
        "  agreement (all-reduce 4 x u64):  in-process %8.2f us   MPI %8.2f us   MPI/in-process %.2fx\n", ai,
        am, am / ai);
    std::printf(
        "  chunk_broadcast per load:        in-process %8.2f ms   MPI staged %8.2f ms   MPI direct %8.2f "
        "ms\n",
        bi, bm, bd);
    std::printf(
        "  per rank received:               in-process %8.2f GB/s MPI staged %8.2f GB/s MPI direct %8.2f "
        "GB/s\n",
        mib * 1.048576e-3 / (bi * 1e-3), mib * 1.048576e-3 / (bm * 1e-3), mib * 1.048576e-3 / (bd * 1e-3));
    std::printf(
        "  memcpy of the same %.0f MiB:      %8.2f ms   ratios: in-process %.2fx, MPI staged %.2fx, MPI "
        "direct %.2fx of memcpy\n",
        mib, c, bi / c, bm / c, bd / c);
    std::printf(
        "{\"bench\":\"collectives_mpi\",\"W\":%u,\"reps\":%d,\"agree_us\":{\"inproc\":%.3f,\"mpi\":%.3f},"
        "\"broadcast_ms\":{\"inproc\":%.3f,\"mpi_staged\":%.3f,\"mpi_direct\":%.3f,\"memcpy\":%.3f}}\n",
        W, reps, ai, am, bi, bm, bd, c);
  }
  staged = comm::mpi_communicator();
  direct = comm::mpi_communicator();
  MPI_Finalize();
  return 0;
}
