// bench_fetch_queue: what the fetch queue and the L1 store cost, each against a
// baseline measured in the same run.
//
//  1. Queue overhead per request: submit -> completion (wait) of 1-chunk loads
//     through fetch_queue<memory_store>, against the same memory_store::get
//     called directly. Overhead = difference per request.
//  2. Queue overhead per chunk: the same with 64-chunk requests; the marginal
//     cost of one more chunk = (overhead at 64 - overhead at 1) / 63.
//  3. Pipelined: 64 requests in flight, then all waited; per request.
//  4. L1 get path against plain memcpy of the same bytes (64 KiB and 12.4 MB
//     chunks): ratio get / memcpy.
// Every figure is the median of several repetitions, baseline and candidate
// interleaved. Last line: one JSON object.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "kvtier/fetch_queue.hpp"
#include "kvtier/store/memory_store.hpp"

#include "../support/machine.hpp"
#include "../support/stats.hpp"

using namespace kvtier;
using namespace std::chrono_literals;

namespace {

constexpr int reps = 9;

using kvtier_bench::median;

// Medians of `reps` runs of each function, run round-robin (f0, f1, ..., f0, f1,
// ...) so that drift on a shared machine hits all of them alike.
std::vector<double> time_many(const std::vector<std::function<void()>>& fs) {
  std::vector<std::vector<double>> t(fs.size());
  for (int r = 0; r < reps; ++r)
    for (std::size_t i = 0; i < fs.size(); ++i) {
      const auto t0 = clock::now();
      fs[i]();
      t[i].push_back(std::chrono::duration<double>(clock::now() - t0).count());
    }
  std::vector<double> out;
  for (auto& v : t) out.push_back(median(v));
  return out;
}
std::pair<double, double> time_pair(const std::function<void()>& a, const std::function<void()>& b) {
  const auto m = time_many({a, b});
  return {m[0], m[1]};
}

struct fixture {
  std::size_t chunk_bytes, chunks;
  memory_store store;
  std::vector<chunk_key> keys;
  std::vector<std::byte> dst_mem, src_mem;
  std::vector<std::span<std::byte>> dst;
  fixture(std::size_t bytes, std::size_t n)
      : chunk_bytes(bytes), chunks(n), store(bytes * n + 1), dst_mem(bytes * n), src_mem(bytes * n) {
    for (std::size_t i = 0; i < bytes * n; ++i) src_mem[i] = static_cast<std::byte>(i * 31);
    std::vector<std::span<const std::byte>> src;
    for (std::size_t c = 0; c < n; ++c) {
      keys.push_back(chunk_key{0xbe, c});
      src.emplace_back(src_mem.data() + c * bytes, bytes);
      dst.emplace_back(dst_mem.data() + c * bytes, bytes);
    }
    std::vector<chunk_status> st(n);
    store.put(keys, src, st, deadline_after(10s));
    for (auto s : st)
      if (s != chunk_status::stored) std::fprintf(stderr, "setup: put failed\n");
  }
  void direct_get(std::size_t n) {
    std::vector<chunk_status> st(n);
    store.get(std::span(keys).first(n), std::span(dst).first(n), st, deadline_after(10s));
  }
};

}  // namespace

int main() {
  // ---- 1 + 2: sequential submit -> completion, against direct calls --------------
  double d1, q1, d64, q64;
  {
    fixture f(64, 64);
    fetch_queue q(f.store, {.workers = 1});
    const auto layout1 = chunk_layout::contiguous(0, 1, 16), layout64 = chunk_layout::contiguous(0, 64, 16);
    constexpr int n1 = 20000, n64 = 5000;
    auto direct = [&](std::size_t chunks, int requests) {
      return [&f, chunks, requests] {
        for (int i = 0; i < requests; ++i) f.direct_get(chunks);
      };
    };
    auto queued = [&](std::size_t chunks, int requests, const chunk_layout& layout) {
      return [&q, &f, &layout, chunks, requests] {
        for (int i = 0; i < requests; ++i) {
          auto h = q.submit(static_cast<request_id>(i), std::span(f.keys).first(chunks),
                            std::span(f.dst).first(chunks), layout, deadline_after(10s));
          q.wait(h, deadline_after(10s));
        }
      };
    };
    const auto m =
        time_many({direct(1, n1), queued(1, n1, layout1), direct(64, n64), queued(64, n64, layout64)});
    d1 = m[0] / n1, q1 = m[1] / n1, d64 = m[2] / n64, q64 = m[3] / n64;
  }
  const double overhead_req_us = (q1 - d1) * 1e6;
  // Per chunk: what a 64-chunk request costs over a 1-chunk one, per extra chunk.
  const double overhead_chunk_ns = ((q64 - d64) - (q1 - d1)) / 63 * 1e9;
  std::printf(
      "1-chunk request   : direct get %8.2f us, via queue %8.2f us  -> queue overhead %.2f us/request "
      "(x%.1f)\n",
      d1 * 1e6, q1 * 1e6, overhead_req_us, q1 / d1);
  std::printf(
      "64-chunk request  : direct get %8.2f us, via queue %8.2f us  -> marginal overhead %.1f ns/chunk "
      "(x%.2f)\n",
      d64 * 1e6, q64 * 1e6, overhead_chunk_ns, q64 / d64);

  // ---- 3: pipelined, 64 requests in flight --------------------------------------------
  double pipe_direct, pipe_queue;
  {
    fixture f(64, 1);
    fetch_queue q(f.store, {.workers = 2, .max_requests = 64});
    const auto layout = chunk_layout::contiguous(0, 1, 16);
    constexpr int batches = 300, depth = 64;
    // Each request has its own destination so that two workers never share one.
    std::vector<std::vector<std::byte>> dmem(depth, std::vector<std::byte>(64));
    std::vector<std::span<std::byte>> d(dmem.begin(), dmem.end());
    std::vector<fetch_handle> hs(depth);
    auto [pd, pq] = time_pair(
        [&] {
          for (int i = 0; i < batches * depth; ++i) f.direct_get(1);
        },
        [&] {
          for (int b = 0; b < batches; ++b) {
            for (int i = 0; i < depth; ++i)
              hs[i] = q.submit(static_cast<request_id>(i), f.keys, std::span(d).subspan(i, 1), layout,
                               deadline_after(10s));
            for (auto& h : hs) q.wait(h, deadline_after(10s));
          }
        });
    pipe_direct = pd / (batches * depth);
    pipe_queue = pq / (batches * depth);
  }
  std::printf("pipelined (64 in flight, 2 workers): direct %.2f us, via queue %.2f us per request\n",
              pipe_direct * 1e6, pipe_queue * 1e6);

  // ---- 4: L1 get vs memcpy of the same bytes ---------------------------------------------
  auto get_vs_memcpy = [](std::size_t chunk_bytes, std::size_t n, double& get_gbs, double& cpy_gbs) {
    fixture f(chunk_bytes, n);
    const double bytes = static_cast<double>(chunk_bytes * n);
    f.direct_get(n);                            // warm the destination pages
    std::vector<std::byte> cpy_src(f.src_mem);  // a separate source, as the store's values are
    auto [g, c] = time_pair([&] { f.direct_get(n); },
                            [&] {
                              for (std::size_t k = 0; k < n; ++k)
                                std::memcpy(f.dst_mem.data() + k * chunk_bytes,
                                            cpy_src.data() + k * chunk_bytes, chunk_bytes);
                            });
    if (std::memcmp(f.dst_mem.data(), cpy_src.data(), f.dst_mem.size()) != 0)
      std::fprintf(stderr, "mismatch\n");
    get_gbs = bytes / g / 1e9;
    cpy_gbs = bytes / c / 1e9;
  };
  double g64k, c64k, g12m, c12m;
  get_vs_memcpy(64 << 10, 256, g64k, c64k);  // 16 MiB in 64 KiB chunks
  get_vs_memcpy(12'400'000, 8, g12m, c12m);  // 99 MB in 12.4 MB chunks (one rank's batch)
  std::printf("L1 get 64 KiB chunks : %.2f GB/s, memcpy %.2f GB/s -> get/memcpy %.3f\n", g64k, c64k,
              g64k / c64k);
  std::printf("L1 get 12.4 MB chunks: %.2f GB/s, memcpy %.2f GB/s -> get/memcpy %.3f\n", g12m, c12m,
              g12m / c12m);

  std::printf(
      "{\"bench\":\"fetch_queue\",\"reps\":%d,"
      "\"req1_direct_us\":%.3f,\"req1_queue_us\":%.3f,\"queue_overhead_us_per_request\":%.3f,"
      "\"req64_direct_us\":%.3f,\"req64_queue_us\":%.3f,\"queue_overhead_ns_per_chunk\":%.1f,"
      "\"pipelined_direct_us\":%.3f,\"pipelined_queue_us\":%.3f,"
      "\"l1_get_64k_gbs\":%.3f,\"memcpy_64k_gbs\":%.3f,\"ratio_get_memcpy_64k\":%.3f,"
      "\"l1_get_12m_gbs\":%.3f,\"memcpy_12m_gbs\":%.3f,\"ratio_get_memcpy_12m\":%.3f,\"loadavg_1m\":%.2f}\n",
      reps, d1 * 1e6, q1 * 1e6, overhead_req_us, d64 * 1e6, q64 * 1e6, overhead_chunk_ns, pipe_direct * 1e6,
      pipe_queue * 1e6, g64k, c64k, g64k / c64k, g12m, c12m, g12m / c12m, kvtier_bench::load_average());
}
