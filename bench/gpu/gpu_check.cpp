// gpu_check: the GPU-side checks of kvtier's collectives, for one NVIDIA GPU with CUDA + NCCL.
//   1. the load protocol end to end on a one-rank NCCL communicator: 16 chunks of
//      12.4 MB in device memory, 12 of them "loaded", every mode; bytes verified;
//   2. host-to-device copy bandwidth of 12.4 MB chunks (one MLA chunk of 256 tokens,
//      s = 48.4 KB/token) from pinned and from pageable host memory, in the same run
//      (the L1-to-GPU path): single chunks and 8-chunk batches (one rank's share of
//      a 16k-token prompt at W = 8).
// Prints medians and ratios; the last line is one JSON object. Exit 0 = all checks passed,
// 1 = a check failed, 2 = no CUDA device.
//
//   gpu_check [reps=15]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "kvtier/chunk_broadcast.hpp"
#include "kvtier/comm/nccl.hpp"

#include "../support/stats.hpp"

using namespace kvtier;
using std::chrono::duration;

namespace {

constexpr std::size_t chunk_bytes = 12'400'000;

using kvtier_bench::median;

bool cuda_ok(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return true;
  std::fprintf(stderr, "gpu_check: %s: %s\n", what, cudaGetErrorString(e));
  return false;
}

// Seconds for `n` H2D copies of chunk_bytes from host memory `h` into `d`, one stream.
double h2d_seconds(const std::byte* h, std::byte* d, int n, cudaStream_t s) {
  const auto t0 = clock::now();
  for (int i = 0; i < n; ++i)
    if (!cuda_ok(
            cudaMemcpyAsync(d + i * chunk_bytes, h + i * chunk_bytes, chunk_bytes, cudaMemcpyHostToDevice, s),
            "cudaMemcpyAsync"))
      std::exit(1);
  if (!cuda_ok(cudaStreamSynchronize(s), "cudaStreamSynchronize")) std::exit(1);
  return duration<double>(clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::max(3, std::atoi(argv[1])) : 15;
  const int devices = comm::cuda_device_count();
  if (devices == 0) {
    std::printf("gpu_check: no CUDA device (cudaGetDeviceCount reports none); nothing measured\n");
    std::printf("{\"bench\":\"gpu_check\",\"skipped\":\"no CUDA device\"}\n");
    return 2;
  }
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  int nccl_version = 0;
  ncclGetVersion(&nccl_version);
  std::printf("device 0 of %d: %s, NCCL %d\n", devices, prop.name, nccl_version);
  bool all_ok = true;

  // ---- 1. the protocol on a one-rank NCCL communicator ---------------------------------
  ncclUniqueId id;
  comm::nccl_communicator c;
  if (comm::nccl_unique_id(id) ||
      comm::nccl_communicator::create(c, id, 0, 1, 0, deadline_after(std::chrono::seconds(60)))) {
    std::printf("gpu_check: NCCL communicator creation failed: %s\n", c.last_error().c_str());
    std::printf("{\"bench\":\"gpu_check\",\"error\":\"nccl init\"}\n");
    return 1;
  }
  const std::size_t N = 16, loaded_chunks = 12;
  const modulo_ownership own(1);
  comm::device_buffer src(N * chunk_bytes), dst(N * chunk_bytes),
      staging(gathered_staging_bytes(own, N, chunk_bytes));
  std::vector<std::byte> host(N * chunk_bytes), back(N * chunk_bytes);
  for (std::size_t i = 0; i < host.size(); ++i) host[i] = static_cast<std::byte>((i * 2654435761u) >> 13);
  if (!src || !dst || !staging ||
      !cuda_ok(cudaMemcpy(src.data(), host.data(), host.size(), cudaMemcpyHostToDevice), "upload"))
    return 1;
  chunk_span_buffers bufs;
  for (std::size_t k = 0; k < N; ++k) {
    bufs.sources.push_back(std::span<const std::byte>(src.bytes()).subspan(k * chunk_bytes, chunk_bytes));
    bufs.destinations.push_back(dst.bytes().subspan(k * chunk_bytes, chunk_bytes));
  }
  double mode_ms[3];
  std::size_t mode_collectives[3];
  const char* mode_names[3] = {"per_chunk", "grouped", "gathered"};
  for (int m = 0; m < 3; ++m) {
    const broadcast_params p{.n_chunks = N,
                             .chunk_tokens = 256,
                             .chunk_bytes = chunk_bytes,
                             .mode = static_cast<broadcast_mode>(m),
                             .staging = staging.bytes(),
                             .request_id = 1};
    cudaMemset(dst.data(), 0, dst.size());
    cudaDeviceSynchronize();
    std::vector<double> t;
    broadcast_result r;
    for (int i = 0; i < reps; ++i) {
      const auto t0 = clock::now();
      r = chunk_broadcast(c, own, loaded_chunks * 256, bufs, p, deadline_after(std::chrono::seconds(30)));
      t.push_back(duration<double, std::milli>(clock::now() - t0).count());
      if (r.ec) break;
    }
    bool ok = !r.ec && r.agreed_chunks == loaded_chunks;
    if (ok && cuda_ok(cudaMemcpy(back.data(), dst.data(), back.size(), cudaMemcpyDeviceToHost), "download"))
      ok = std::equal(host.begin(), host.begin() + loaded_chunks * chunk_bytes, back.begin()) &&
           std::all_of(back.begin() + loaded_chunks * chunk_bytes, back.end(),
                       [](std::byte b) { return b == std::byte{0}; });
    else
      ok = false;
    mode_ms[m] = median(t);
    mode_collectives[m] = r.collectives;
    std::printf(
        "protocol %-9s: %s, agreed %zu/%zu chunks, %zu collectives, %.3f ms per load (median of %zu)%s%s\n",
        mode_names[m], ok ? "bytes OK" : "FAILED", r.agreed_chunks, N, r.collectives, mode_ms[m], t.size(),
        r.ec ? ": " : "", r.ec ? r.message.c_str() : "");
    all_ok = all_ok && ok;
  }

  // ---- 2. H2D bandwidth, pinned vs pageable ----------------------------------------------
  const int batch = 8;
  comm::pinned_buffer pinned(batch * chunk_bytes);
  std::vector<std::byte> pageable(batch * chunk_bytes);
  comm::device_buffer dev(batch * chunk_bytes);
  if (!pinned || !dev) return 1;
  std::fill(pinned.data(), pinned.data() + pinned.size(), std::byte{0x5A});
  std::fill(pageable.begin(), pageable.end(), std::byte{0x5A});  // touched: pages are resident
  cudaStream_t s;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  (void)h2d_seconds(pinned.data(), dev.data(), batch, s);  // warm-up both paths
  (void)h2d_seconds(pageable.data(), dev.data(), batch, s);
  std::vector<double> pin1, page1, pin8, page8;
  for (int i = 0; i < reps; ++i) {  // interleaved so both see the same machine state
    pin1.push_back(chunk_bytes / h2d_seconds(pinned.data(), dev.data(), 1, s) / 1e9);
    page1.push_back(chunk_bytes / h2d_seconds(pageable.data(), dev.data(), 1, s) / 1e9);
    pin8.push_back(batch * chunk_bytes / h2d_seconds(pinned.data(), dev.data(), batch, s) / 1e9);
    page8.push_back(batch * chunk_bytes / h2d_seconds(pageable.data(), dev.data(), batch, s) / 1e9);
  }
  cudaStreamDestroy(s);
  const double p1 = median(pin1), g1 = median(page1), p8 = median(pin8), g8 = median(page8);
  std::printf(
      "H2D 12.4 MB chunk : pinned %6.2f GB/s, pageable %6.2f GB/s, pinned/pageable %.2fx (median of %d)\n",
      p1, g1, p1 / g1, reps);
  std::printf(
      "H2D 8 x 12.4 MB   : pinned %6.2f GB/s, pageable %6.2f GB/s, pinned/pageable %.2fx (median of %d)\n",
      p8, g8, p8 / g8, reps);
  std::printf("reference: B* = s*R = 48.4 KB/token * 52.2k tokens/s = 2.53 GB/s\n");

  char json[1024];
  std::snprintf(json, sizeof json,
                "{\"bench\":\"gpu_check\",\"device\":\"%s\",\"nccl\":%d,\"protocol_ok\":%s,"
                "\"protocol_ms\":{\"per_chunk\":%.3f,\"grouped\":%.3f,\"gathered\":%.3f},"
                "\"protocol_collectives\":{\"per_chunk\":%zu,\"grouped\":%zu,\"gathered\":%zu},"
                "\"h2d_chunk_gbps\":{\"pinned\":%.3f,\"pageable\":%.3f,\"ratio\":%.3f},"
                "\"h2d_batch8_gbps\":{\"pinned\":%.3f,\"pageable\":%.3f,\"ratio\":%.3f}}",
                prop.name, nccl_version, all_ok ? "true" : "false", mode_ms[0], mode_ms[1], mode_ms[2],
                mode_collectives[0], mode_collectives[1], mode_collectives[2], p1, g1, p1 / g1, p8, g8,
                p8 / g8);
  std::printf("%s\n", json);
  return all_ok ? 0 : 1;
}
