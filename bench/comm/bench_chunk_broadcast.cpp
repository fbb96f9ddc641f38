// bench_chunk_broadcast: the load protocol on the in-process backend, per-chunk
// (the reference's protocol, the baseline) against the grouped and gathered modes,
// plus the physical floor: the same bytes copied by the same threads with plain
// memcpy and one barrier. W = 8 ranks as 8 threads of one process, on however many
// cores the machine has (printed: on 2 cores the ranks time-share, so a mode that
// needs fewer synchronisations gains more than it would with a core per rank).
// Chunks of 4 KiB and 256 KiB (64 chunks: a 16k-token prompt at 256 tokens per
// chunk) and the real chunk size, 12.4 MB (16 chunks, to bound memory: about
// 16 x 12.4 MB x (1 + 8 + staging) = 2-3 GB). Every repetition runs every mode, in
// a rotating order (interleaved, so drift hits all alike); medians.
//
//   bench_chunk_broadcast [reps=7] [loads_per_rep=3]
// Last line: one JSON object.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "kvtier/chunk_broadcast.hpp"
#include "kvtier/comm/inproc.hpp"

#include "../support/machine.hpp"
#include "../support/stats.hpp"

using namespace kvtier;
using std::chrono::duration;

namespace {

using kvtier_bench::median;

// The bytes of one benchmark world: the pristine chunks, each rank's source
// (shared, or one per rank when a fetch fills it), destinations and staging.
struct world_bytes {
  world_bytes(const modulo_ownership& own, std::size_t n, std::size_t cb, bool per_rank_src)
      : n(n),
        cb(cb),
        pristine(n * cb),
        dst(own.world_size(), std::vector<std::byte>(n * cb)),
        staging(own.world_size(), std::vector<std::byte>(gathered_staging_bytes(own, n, cb))) {
    for (std::size_t i = 0; i < pristine.size(); ++i) pristine[i] = static_cast<std::byte>(i * 31 + 1);
    if (per_rank_src) src.assign(own.world_size(), std::vector<std::byte>(n * cb));
  }
  chunk_span_buffers buffers(rank_t r) {
    chunk_span_buffers b;
    const std::vector<std::byte>& s = src.empty() ? pristine : src[r];
    for (std::size_t k = 0; k < n; ++k) {
      b.sources.push_back(std::span<const std::byte>(s).subspan(k * cb, cb));
      b.destinations.push_back(std::span<std::byte>(dst[r]).subspan(k * cb, cb));
    }
    return b;
  }
  std::size_t n, cb;
  std::vector<std::byte> pristine;
  std::vector<std::vector<std::byte>> src, dst, staging;
};

// mode < 0: memcpy floor. Returns ms per load, measured on rank 0 between barriers.
// `wb` is reused across calls (allocating gigabytes per call would dominate); its
// destinations are cleared first, so every call's result is checked on its own.
double one_rep(const modulo_ownership& own, world_bytes& wb, int mode, int loads) {
  const rank_t W = own.world_size();
  const std::size_t N = wb.n, CB = wb.cb;
  for (auto& d : wb.dst) std::memset(d.data(), 0, d.size());
  auto& staging = wb.staging;
  comm::inproc_world world(W);
  double ms = 0;
  bool ok = true;
  comm::run_ranks(world, [&](comm::inproc_communicator& c) {
    const rank_t r = c.rank();
    chunk_span_buffers b = wb.buffers(r);
    broadcast_params p{.n_chunks = N,
                       .chunk_tokens = 256,
                       .chunk_bytes = CB,
                       .mode = static_cast<broadcast_mode>(std::max(mode, 0)),
                       .staging = staging[r],
                       .request_id = 1};
    const auto dl = deadline_after(std::chrono::seconds(60));
    std::uint32_t token = 0;
    (void)comm::all_reduce_value(c, token, comm::reduce_op::sum, dl);  // start together
    const auto t0 = clock::now();
    for (int l = 0; l < loads; ++l) {
      if (mode < 0) {
        // Floor: every rank copies every chunk into its destination (what the protocol moves
        // here, the owner's copy from its separate source buffer included), then one barrier.
        for (std::size_t k = 0; k < N; ++k) std::memcpy(b.destinations[k].data(), b.sources[k].data(), CB);
        (void)comm::all_reduce_value(c, token, comm::reduce_op::sum, dl);
      } else {
        p.request_id = static_cast<std::uint64_t>(l) + 1;
        auto res = chunk_broadcast(c, own, N * 256, b, p, dl);
        if (res.ec || res.agreed_chunks != N) ok = false;
      }
    }
    (void)comm::all_reduce_value(c, token, comm::reduce_op::sum, dl);
    if (r == 0) ms = duration<double, std::milli>(clock::now() - t0).count() / loads;
  });
  if (!ok || wb.dst[W - 1] != wb.pristine) {
    std::fprintf(stderr, "bench_chunk_broadcast: wrong result\n");
    std::exit(1);
  }
  return ms;
}

// One load with a simulated fetch: each rank's fetcher thread produces its owned
// chunks one by one (fetch_us of waiting, as for a network read, then the bytes),
// and the ranks either wait for their whole fetch and run chunk_broadcast once
// (one-shot) or step a pipelined_broadcast while the fetch runs. ms from start to
// every rank holding every chunk, on rank 0.
double fetch_rep(rank_t W, std::size_t N, std::size_t CB, broadcast_mode mode, bool pipelined, int fetch_us) {
  const modulo_ownership own(W);
  world_bytes wb(own, N, CB, true);
  auto& staging = wb.staging;
  comm::inproc_world world(W);
  double ms = 0;
  bool ok = true;
  comm::run_ranks(world, [&](comm::inproc_communicator& c) {
    const rank_t r = c.rank();
    chunk_span_buffers b = wb.buffers(r);
    const broadcast_params p{.n_chunks = N,
                             .chunk_tokens = 256,
                             .chunk_bytes = CB,
                             .mode = mode,
                             .staging = staging[r],
                             .request_id = 1};
    const auto dl = deadline_after(std::chrono::seconds(60));
    const auto mine = owned_chunks(own, r, N);
    std::atomic<std::size_t> loaded{0};
    std::uint32_t token = 0;
    (void)comm::all_reduce_value(c, token, comm::reduce_op::sum, dl);
    const auto t0 = clock::now();
    std::thread fetcher([&] {
      for (std::size_t j = 0; j < mine.size(); ++j) {
        std::this_thread::sleep_for(std::chrono::microseconds(fetch_us));
        std::memcpy(wb.src[r].data() + mine[j] * CB, wb.pristine.data() + mine[j] * CB, CB);
        loaded.store(j + 1, std::memory_order_release);
      }
    });
    broadcast_result res;
    if (!pipelined) {
      fetcher.join();
      res = chunk_broadcast(c, own, rank_answer_loaded(own, r, N, 256, loaded.load()), b, p, dl);
    } else {
      pipelined_broadcast pb(c, own, b, p);
      std::size_t reported = 0;
      while (!pb.done()) {
        // Step when this rank has something new (or is finished); the step's all-reduce paces the rest.
        for (int i = 0;
             i < 100000 && loaded.load(std::memory_order_acquire) == reported && reported < mine.size(); ++i)
          std::this_thread::sleep_for(std::chrono::microseconds(50));
        reported = loaded.load(std::memory_order_acquire);
        pb.step(rank_answer_loaded(own, r, N, 256, reported), reported == mine.size(), dl);
      }
      res = pb.result();
      fetcher.join();
    }
    if (res.ec || res.agreed_chunks != N) ok = false;
    (void)comm::all_reduce_value(c, token, comm::reduce_op::sum, dl);
    if (r == 0) ms = duration<double, std::milli>(clock::now() - t0).count();
  });
  if (!ok || wb.dst[W - 1] != wb.pristine) {
    std::fprintf(stderr, "bench_chunk_broadcast: wrong result (fetch)\n");
    std::exit(1);
  }
  return ms;
}

}  // namespace

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::atoi(argv[1]) : 7;
  const int loads = argc > 2 ? std::atoi(argv[2]) : 3;
  const rank_t W = 8;
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  const char* names[] = {"per_chunk", "grouped", "gathered"};
  std::string json =
      "{\"bench\":\"chunk_broadcast_inproc\",\"W\":8,\"rank_threads\":8,\"cores\":" + std::to_string(cores) +
      ",\"reps\":" + std::to_string(reps) + ",\"results\":[";
  std::printf(
      "in-process chunk_broadcast, W=%u as %u rank threads on %u core(s), median of %d interleaved reps "
      "x %d loads (ms per load)\n",
      W, W, cores, reps, loads);
  bool first = true;
  const modulo_ownership own(W);
  // (chunk bytes, chunks): 12.4 MB is the real chunk (256 tokens x 48.4 KB); 16 of them bound memory.
  for (auto [cb, N] : {std::pair<std::size_t, std::size_t>{4096, 64}, {256 * 1024, 64}, {12'390'400, 16}}) {
    world_bytes wb(own, N, cb, false);
    const int n_loads = cb > (1u << 20) ? 1 : loads;
    std::vector<double> v[4];
    for (int i = 0; i < reps; ++i)
      for (int j = 0; j < 4; ++j) {  // rotating order: floor, per_chunk, grouped, gathered
        const int m = (i + j) % 4 - 1;
        v[m + 1].push_back(one_rep(own, wb, m, n_loads));
      }
    double med[4];
    for (int m = 0; m < 4; ++m) med[m] = median(v[m]);
    const int best = static_cast<int>(std::min_element(med + 1, med + 4) - (med + 1));
    std::printf(
        "chunk %8zu B x %2zu: memcpy floor %9.3f | per_chunk %9.3f | grouped %9.3f (%.2fx) | gathered %9.3f "
        "(%.2fx) | fastest: %s\n",
        cb, N, med[0], med[1], med[2], med[1] / med[2], med[3], med[1] / med[3], names[best]);
    char buf[512];
    std::snprintf(buf, sizeof buf,
                  "%s{\"chunk_bytes\":%zu,\"chunks\":%zu,\"loads_per_rep\":%d,\"memcpy_floor_ms\":%.4f,"
                  "\"%s_ms\":%.4f,\"%s_ms\":%.4f,\"%s_ms\":%.4f,\"grouped_speedup\":%.3f,"
                  "\"gathered_speedup\":%.3f,\"fastest\":\"%s\"}",
                  first ? "" : ",", cb, N, n_loads, med[0], names[0], med[1], names[1], med[2], names[2],
                  med[3], med[1] / med[2], med[1] / med[3], names[best]);
    json += buf;
    first = false;
  }
  json += "]";
  const std::size_t N = 64;
  // Pipelining: the broadcast overlapped with a simulated fetch (fetch_us per owned chunk).
  const std::size_t cb = 256 * 1024;
  const int fetch_us = 4000;
  json += ",\"pipelined\":[";
  first = true;
  for (auto mode : {broadcast_mode::per_chunk, broadcast_mode::grouped, broadcast_mode::gathered}) {
    std::vector<double> one, pipe;
    for (int i = 0; i < reps; ++i) {  // interleaved
      one.push_back(fetch_rep(W, N, cb, mode, false, fetch_us));
      pipe.push_back(fetch_rep(W, N, cb, mode, true, fetch_us));
    }
    const double a = median(one), b = median(pipe);
    const std::string name(to_string(mode));  // a string_view: printf's %s needs the terminator
    std::printf(
        "fetch %d us/chunk (%zu chunks/rank) + %s, chunk %zu B: one-shot %8.3f ms | pipelined %8.3f ms "
        "(%.2fx)\n",
        fetch_us, N / W, name.c_str(), cb, a, b, a / b);
    char buf[256];
    std::snprintf(buf, sizeof buf,
                  "%s{\"mode\":\"%s\",\"chunk_bytes\":%zu,\"fetch_us_per_chunk\":%d,\"one_shot_ms\":%.4f,"
                  "\"pipelined_ms\":%.4f,\"pipelined_speedup\":%.3f}",
                  first ? "" : ",", name.c_str(), cb, fetch_us, a, b, a / b);
    json += buf;
    first = false;
  }
  std::printf("%s],\"loadavg_1m\":%.2f}\n", json.c_str(), kvtier_bench::load_average());
}
