// gpu_check: the GPU-side checks of kvtier's collectives, for one NVIDIA GPU with CUDA + NCCL.
//   1. the load protocol end to end on a one-rank NCCL communicator: 16 chunks of
//      12.4 MB in device memory, 12 of them "loaded", every mode; bytes verified;
//   2. host-to-device copy bandwidth of 12.4 MB chunks (one MLA chunk of 256 tokens,
//      s = 48.4 KB/token) from pinned and from pageable host memory, in the same run
//      (the L1-to-GPU path): single chunks and 8-chunk batches (one rank's share of
//      a 16k-token prompt at W = 8);
//   3. an adopted communicator (the "engine's", on the engine's stream): a broadcast
//      queued behind 600 ms of the engine's work still gets its own 200 ms budget; a
//      timeout never aborts the engine's communicator (the engine then uses and
//      destroys it itself); the enqueue-only form's wait_event is bounded; and
//      broadcast_params::sources_ready (order_after) orders the moves after the
//      stream that fills the sources.
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
#include <thread>
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

// A host function on a stream: the stream stalls for `ms` (the engine's "prefill").
void CUDART_CB stall_stream(void* ms) {
  std::this_thread::sleep_for(std::chrono::milliseconds(*static_cast<int*>(ms)));
}

double ms_since(clock::time_point t0) { return duration<double, std::milli>(clock::now() - t0).count(); }

// The engine's own one-rank communicator (non-blocking, as kvtier recommends).
bool engine_comm(ncclComm_t& out) {
  ncclUniqueId id;
  if (ncclGetUniqueId(&id) != ncclSuccess) return false;
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclResult_t r = ncclCommInitRankConfig(&out, 1, id, 0, &config);
  if (r != ncclSuccess && r != ncclInProgress) return false;
  for (int i = 0; i < 200000; ++i) {
    ncclResult_t state = ncclInProgress;
    ncclCommGetAsyncError(out, &state);
    if (state == ncclSuccess) return true;
    if (state != ncclInProgress) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  return false;
}

// Section 3; prints one line per check and returns whether all passed.
bool adopted_checks(comm::device_buffer& src, comm::device_buffer& dst, comm::nccl_communicator& owned) {
  bool ok_all = true;
  auto report = [&](const char* what, bool ok, const std::string& detail) {
    std::printf("adopted: %-44s %s%s%s\n", what, ok ? "OK" : "FAILED", detail.empty() ? "" : ": ",
                detail.c_str());
    ok_all = ok_all && ok;
  };
  ncclComm_t ecomm = nullptr;
  cudaStream_t estream = nullptr;
  if (!engine_comm(ecomm) || !cuda_ok(cudaStreamCreateWithFlags(&estream, cudaStreamNonBlocking), "stream")) {
    report("engine communicator", false, "could not create it");
    return false;
  }
  const auto chunk = dst.bytes().first(chunk_bytes);
  const auto from = std::span<const std::byte>(src.bytes()).first(chunk_bytes);
  // (a) the budget starts when the operation starts.
  {
    comm::nccl_communicator c;
    if (auto ec =
            comm::nccl_communicator::adopt(c, ecomm, estream, {.max_queue_wait = std::chrono::seconds(5)})) {
      report("adopt", false, c.last_error());
      return false;
    }
    static int stall = 600;
    cudaLaunchHostFunc(estream, stall_stream, &stall);
    const auto t0 = clock::now();
    const auto ec = c.broadcast(from, chunk, 0, deadline_after(std::chrono::milliseconds(200)));
    report("200 ms broadcast behind 600 ms of engine work", !ec,
           std::to_string(ms_since(t0)) + " ms" + (ec ? ", " + c.last_error() : std::string()));
  }
  // (b) a timeout poisons, never aborts: the engine's communicator stays the engine's.
  {
    comm::nccl_communicator c;
    (void)comm::nccl_communicator::adopt(c, ecomm, estream,
                                         {.max_queue_wait = std::chrono::milliseconds(300)});
    static int stall = 2500;
    cudaLaunchHostFunc(estream, stall_stream, &stall);
    const auto t0 = clock::now();
    const auto ec = c.broadcast(from, chunk, 0, deadline_after(std::chrono::milliseconds(100)));
    const double waited = ms_since(t0);
    report("timeout past max_queue_wait is bounded", ec == errc::timeout && waited < 2000,
           std::to_string(waited) + " ms, " + c.last_error());
    report("the adopted communicator was not aborted",
           c.aborted() && c.native() == ecomm && c.first_error() == errc::timeout, c.last_error());
    std::uint64_t v = 1;
    report("later calls keep the first error",
           comm::all_reduce_value(c, v, comm::reduce_op::sum, deadline_after(std::chrono::seconds(1))) ==
                   errc::backend_error &&
               c.last_error().find("max_queue_wait") != std::string::npos,
           c.last_error());
  }
  cudaStreamSynchronize(estream);  // the engine waits for its own work (and the queued broadcast)
  {
    ncclResult_t state = ncclInternalError;
    ncclCommGetAsyncError(ecomm, &state);
    comm::device_buffer one(8);
    ncclResult_t r = ncclAllReduce(one.data(), one.data(), 1, ncclUint64, ncclSum, ecomm, estream);
    ncclResult_t s2 = ncclInProgress;
    for (int i = 0; i < 100000 && s2 == ncclInProgress; ++i) {
      ncclCommGetAsyncError(ecomm, &s2);
      if (s2 == ncclInProgress) std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    const bool synced = cudaStreamSynchronize(estream) == cudaSuccess;
    report("the engine still uses its communicator",
           state == ncclSuccess && (r == ncclSuccess || r == ncclInProgress) && s2 == ncclSuccess && synced,
           std::string(ncclGetErrorString(state)));
  }
  // (c) the enqueue-only form: wait_event is bounded.
  {
    comm::nccl_communicator c;
    (void)comm::nccl_communicator::adopt(c, ecomm, estream);
    static int stall = 1500;
    cudaLaunchHostFunc(estream, stall_stream, &stall);
    auto [eec, ev] = c.enqueue_broadcast(from, chunk, 0, deadline_after(std::chrono::seconds(5)));
    const auto t0 = clock::now();
    const auto wec = eec ? eec : c.wait_event(ev, deadline_after(std::chrono::milliseconds(100)));
    const double waited = ms_since(t0);
    report("wait_event returns by its deadline", !eec && wec == errc::timeout && waited < 1000,
           std::to_string(waited) + " ms, " + c.last_error());
    cudaStreamSynchronize(estream);
  }
  report("the engine destroys its communicator", ncclCommDestroy(ecomm) == ncclSuccess, "");
  cudaStreamDestroy(estream);
  // (d) sources_ready: the moves wait for the stream that fills the sources.
  {
    const modulo_ownership own(1);
    cudaStream_t filler;
    cudaEvent_t filled;
    cudaStreamCreateWithFlags(&filler, cudaStreamNonBlocking);
    cudaEventCreateWithFlags(&filled, cudaEventDisableTiming);
    cudaMemset(src.data(), 0x11, chunk_bytes);
    cudaMemset(dst.data(), 0, chunk_bytes);
    cudaDeviceSynchronize();
    static int stall = 300;
    cudaLaunchHostFunc(filler, stall_stream, &stall);  // the "scatter" is late
    cudaMemsetAsync(src.data(), 0x77, chunk_bytes, filler);
    cudaEventRecord(filled, filler);
    chunk_span_buffers bufs;
    bufs.sources.push_back(from);
    bufs.destinations.push_back(chunk);
    broadcast_params p{.n_chunks = 1, .chunk_tokens = 256, .chunk_bytes = chunk_bytes, .request_id = 2};
    p.sources_ready = [&](deadline) { return owned.order_after(filled); };
    const auto r = chunk_broadcast(owned, own, 256, bufs, p, deadline_after(std::chrono::seconds(10)));
    std::vector<std::byte> back(chunk_bytes);
    cudaMemcpy(back.data(), dst.data(), chunk_bytes, cudaMemcpyDeviceToHost);
    const bool bytes =
        std::all_of(back.begin(), back.end(), [](std::byte b) { return b == std::byte{0x77}; });
    report("sources_ready orders the moves after the filler", !r.ec && bytes, r.message);
    cudaEventDestroy(filled);
    cudaStreamDestroy(filler);
  }
  return ok_all;
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

  // ---- 3. the engine's communicator, adopted ----------------------------------------------
  const bool protocol_ok = all_ok;
  const bool adopted_ok = adopted_checks(src, dst, c);
  all_ok = all_ok && adopted_ok;

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
                "{\"bench\":\"gpu_check\",\"device\":\"%s\",\"nccl\":%d,\"protocol_ok\":%s,\"adopted_ok\":%s,"
                "\"protocol_ms\":{\"per_chunk\":%.3f,\"grouped\":%.3f,\"gathered\":%.3f},"
                "\"protocol_collectives\":{\"per_chunk\":%zu,\"grouped\":%zu,\"gathered\":%zu},"
                "\"h2d_chunk_gbps\":{\"pinned\":%.3f,\"pageable\":%.3f,\"ratio\":%.3f},"
                "\"h2d_batch8_gbps\":{\"pinned\":%.3f,\"pageable\":%.3f,\"ratio\":%.3f}}",
                prop.name, nccl_version, protocol_ok ? "true" : "false", adopted_ok ? "true" : "false",
                mode_ms[0], mode_ms[1], mode_ms[2], mode_collectives[0], mode_collectives[1],
                mode_collectives[2], p1, g1, p1 / g1, p8, g8, p8 / g8);
  std::printf("%s\n", json);
  return all_ok ? 0 : 1;
}
