// How long recover() takes after a poisoned MPI communicator (issue 27), the failure the issue
// measured: the last rank is late to a step (blocked `--late-ms`, as a rank waiting on a save),
// its peers' step times out (`--step-ms`) and they call recover(); the late rank wakes, goes on
// stepping, and recovers once its own step fails. Measured per round, on one host's steady_clock
// (the same in every process there):
//   recovered_after_wake = (the last rank's return from recover()) - (the late rank's wake):
//                          what the world pays beyond the late rank's own stall;
//   early_recover        = an early rank's time inside recover() (the stall's remainder and that).
// Baseline in the same run: mpi_options::notify_peers off (the late rank's first step pairs with
// the peers' abandoned call and succeeds; its next step fails only at its deadline).
//
//   mpiexec -n 2 build/release/bench/bench_recover_mpi [--rounds 7] [--late-ms 1500] [--step-ms 1000]
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "kvtier/comm/mpi.hpp"
#include "kvtier/comm/recover.hpp"

using namespace std::chrono_literals;

namespace comm = kvtier::comm;

namespace {

std::uint64_t now_ns() {
  return static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(kvtier::clock::now().time_since_epoch()).count());
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct figures {
  std::vector<double> after_wake_ms, early_recover_ms;
  int failures = 0;
};

figures run(bool notify, int rounds, std::chrono::milliseconds late, std::chrono::milliseconds step) {
  const comm::mpi_options opt{.notify_peers = notify};
  comm::mpi_communicator c;
  if (auto ec = comm::mpi_communicator::create(c, MPI_COMM_WORLD, kvtier::deadline_after(30s), opt)) {
    std::fprintf(stderr, "create: %s\n", c.last_error().c_str());
    std::exit(2);
  }
  const int me = static_cast<int>(c.rank()), w = static_cast<int>(c.size());
  const bool is_late = me == w - 1;
  figures f;
  std::uint64_t request = 0;
  for (int round = 0; round < rounds; ++round) {
    std::uint64_t v = 1;  // every rank together
    if (comm::all_reduce_value(c, v, comm::reduce_op::sum, kvtier::deadline_after(30s))) ++f.failures;
    std::uint64_t wake = 0;
    if (is_late) {
      std::this_thread::sleep_for(late);  // blocked on something else (a save, say)
      wake = now_ns();
    }
    // Step until a step fails (bounded): the early ranks' first one times out.
    std::error_code ec;
    for (int s = 0; s < 4 && !ec; ++s) {
      std::uint64_t x = request + s;
      ec = comm::all_reduce_value(c, x, comm::reduce_op::max, kvtier::deadline_after(step));
    }
    const std::uint64_t t0 = now_ns();
    const auto rec = comm::recover(
        c,
        [&](comm::mpi_communicator& fresh, kvtier::deadline d) {
          return comm::mpi_communicator::create(fresh, MPI_COMM_WORLD, d, opt);
        },
        request + 1, 1s, kvtier::deadline_after(30s));
    const std::uint64_t t1 = now_ns();
    if (rec.ec) {
      std::fprintf(stderr, "rank %d: %s\n", me, rec.message.c_str());
      std::exit(3);
    }
    request = rec.request;
    // The latest return from recover() and the late rank's wake, over the ranks.
    std::uint64_t agreed[2] = {t1, wake};
    if (comm::all_reduce(c, std::span<const std::uint64_t>(agreed), std::span<std::uint64_t>(agreed),
                         comm::reduce_op::max, kvtier::deadline_after(30s)))
      ++f.failures;
    f.after_wake_ms.push_back(static_cast<double>(agreed[0] - agreed[1]) * 1e-6);
    if (!is_late) f.early_recover_ms.push_back(static_cast<double>(t1 - t0) * 1e-6);
  }
  return f;
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
  int rounds = 7;
  long late_ms = 1500, step_ms = 1000;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--rounds")) rounds = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--late-ms")) late_ms = std::atol(argv[i + 1]);
    if (!std::strcmp(argv[i], "--step-ms")) step_ms = std::atol(argv[i + 1]);
  }
  int me = 0, w = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &me);
  MPI_Comm_size(MPI_COMM_WORLD, &w);
  const auto base =
      run(false, rounds, std::chrono::milliseconds(late_ms), std::chrono::milliseconds(step_ms));
  const auto with = run(true, rounds, std::chrono::milliseconds(late_ms), std::chrono::milliseconds(step_ms));
  if (me == 0) {
    double load[3] = {};
    if (FILE* f = std::fopen("/proc/loadavg", "r")) {
      if (std::fscanf(f, "%lf %lf %lf", &load[0], &load[1], &load[2]) != 3) load[0] = -1;
      std::fclose(f);
    }
    std::printf("W=%d, rounds=%d, late rank stalls %ld ms, step deadline %ld ms, 1-min load %.2f\n", w,
                rounds, late_ms, step_ms, load[0]);
    std::printf("%-28s %14s %16s %8s\n", "mode", "median after", "median early", "failed");
    std::printf("%-28s %14s %16s %8s\n", "", "wake (ms)", "recover() (ms)", "rounds");
    std::printf("%-28s %14.1f %16.1f %8d\n", "baseline (notify_peers off)", median(base.after_wake_ms),
                median(base.early_recover_ms), base.failures);
    std::printf("%-28s %14.1f %16.1f %8d\n", "notify_peers on", median(with.after_wake_ms),
                median(with.early_recover_ms), with.failures);
    std::printf("ratio (baseline / on), after wake: %.1f\n",
                median(base.after_wake_ms) / std::max(median(with.after_wake_ms), 1e-3));
  }
  MPI_Finalize();
  return 0;
}
