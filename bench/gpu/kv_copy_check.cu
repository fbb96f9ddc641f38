// kv_copy_check: the CUDA paged-KV gather/scatter (kvtier/cuda/kv_copy.cuh) against the CPU
// version, and its speed against cudaMemcpyAsync of the same bytes.
//
//   kv_copy_check validate [cases=200]   argument checks, the kernel's body emulated on the host
//                                        over its whole grid for `cases` random layouts (bit for bit
//                                        against the CPU version), the pinned arena's CUDA sources (all
//                                        without a GPU), then, where a GPU exists, `cases` random layouts
//                                        (every named layout, view kind, skipped slots, layer
//                                        ranges; device and mapped-pinned chunks) compared bit for
//                                        bit with kvtier::kv_gather / kv_scatter
//   kv_copy_check bench [reps=15]        12.4 MB chunks in vLLM MLA (bf16, fp8) and FlashAttention
//                                        NHD/HND: kernel gather/scatter (device chunk and mapped
//                                        pinned chunk) against cudaMemcpyAsync of the same bytes
//                                        (pinned H2D, pageable H2D, D2D); medians and ratios
// Exit: 0 ok (also: no GPU, after the checks that need none), 1 a check failed. The last line
// of bench is one JSON object. Built by the test command (nvcc, compile + validate) and by
// bench/gpu/check.sh.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "kvtier/cuda/cuda_host_memory.hpp"
#include "kvtier/cuda/kv_copy.cuh"
#include "kvtier/kv_copy.hpp"
#include "kvtier/pinned_arena.hpp"

#include "../../tests/support/kv_fixture.hpp"

using namespace kvtier;
using namespace kvtier::test;

namespace {

int failures = 0;

#define EXPECT(cond)                                                                   \
  do {                                                                                 \
    if (!(cond)) {                                                                     \
      std::fprintf(stderr, "kv_copy_check: FAILED at line %d: %s\n", __LINE__, #cond); \
      ++failures;                                                                      \
    }                                                                                  \
  } while (0)

void cuda_must(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return;
  std::fprintf(stderr, "kv_copy_check: %s: %s\n", what, cudaGetErrorString(e));
  std::exit(1);
}

// A device copy of an owned host cache: same buffers, same offsets.
struct device_cache {
  std::vector<std::byte*> buffers;
  kv_cache_view view;
  device_cache(const owned_cache& host) {
    view = host.view;
    std::vector<std::byte*> base;
    for (const auto& b : host.buffers) {
      void* d = nullptr;
      cuda_must(cudaMalloc(&d, std::max<std::size_t>(b.size(), 1)), "cudaMalloc");
      cuda_must(cudaMemcpy(d, b.data(), b.size(), cudaMemcpyHostToDevice), "cudaMemcpy");
      buffers.push_back(static_cast<std::byte*>(d));
    }
    for (auto& p : view.planes)  // rebase every pointer into its buffer's device copy
      for (std::size_t i = 0; i < host.buffers.size(); ++i) {
        const std::byte* h = host.buffers[i].data();
        if (p >= h && p < h + host.buffers[i].size()) {
          p = buffers[i] + (p - h);
          break;
        }
      }
  }
  ~device_cache() {
    for (auto* b : buffers) cudaFree(b);
  }
  std::vector<std::byte> snapshot(const owned_cache& host) const {
    std::vector<std::byte> all;
    for (std::size_t i = 0; i < buffers.size(); ++i) {
      std::vector<std::byte> b(host.buffers[i].size());
      cuda_must(cudaMemcpy(b.data(), buffers[i], b.size(), cudaMemcpyDeviceToHost), "cudaMemcpy back");
      all.insert(all.end(), b.begin(), b.end());
    }
    return all;
  }
};

// Checks that need no device: every refusal happens before any CUDA call.
void argument_checks() {
  auto host = make_cache(kv_layout::vllm_mla(2, 4, 8, 2, 16), view_kind::per_layer, 1);
  std::vector<std::int64_t> slots{0, 1, 2};
  std::vector<std::byte> chunk(host.view.layout.bytes_per_token() * slots.size());
  std::int64_t fake_slots_dev[3];
  kv_layout_error why;
  auto bad = host.view;
  bad.layout.token_stride = 1;  // tokens would overlap
  EXPECT(cuda::kv_gather(bad, slots, fake_slots_dev, chunk.data(), chunk.size(), {}, nullptr, nullptr,
                         &why) == errc::invalid_argument);
  EXPECT(why.field == "token_stride");
  slots[1] = 32;
  EXPECT(cuda::kv_scatter(host.view, slots, fake_slots_dev, chunk.data(), chunk.size(), {}, nullptr, nullptr,
                          &why) == errc::invalid_argument);
  EXPECT(why.field == "slots");
  slots[1] = 2;  // two tokens into slot 2: their threads would race
  const auto before = host.snapshot();
  EXPECT(cuda::kv_scatter(host.view, slots, fake_slots_dev, chunk.data(), chunk.size(), {}, nullptr, nullptr,
                          &why) == errc::invalid_argument);
  EXPECT(why.field == "slots" && why.message.find("slots[1] and slots[2] are both 2") != std::string::npos);
  EXPECT(cuda::emulate_on_host(false, host.view, slots, chunk.data(), chunk.size(), {}, &why) ==
         errc::invalid_argument);
  EXPECT(host.snapshot() == before);
  // A gather may read one slot twice (as on the CPU).
  EXPECT(!cuda::emulate_on_host(true, host.view, slots, chunk.data(), chunk.size(), {}, &why));
  slots[1] = 1;
  EXPECT(cuda::kv_gather(host.view, slots, nullptr, chunk.data(), chunk.size(), {}, nullptr, nullptr, &why) ==
         errc::invalid_argument);
  EXPECT(why.field == "slots_device");
  auto many = make_cache(kv_layout::vllm_flash_attn(129, 1, 1, 1, 1, 1), view_kind::one_base, 2);
  std::vector<std::int64_t> one{0};
  std::vector<std::byte> c2(many.view.layout.bytes_per_token());
  EXPECT(cuda::kv_gather(many.view, one, fake_slots_dev, c2.data(), c2.size(), {}, nullptr, nullptr, &why) ==
         errc::invalid_argument);
  EXPECT(why.field == "layers");
  std::printf("argument checks: %s\n", failures == 0 ? "ok" : "FAILED");
}

void arena_checks(bool have_device) {
  std::error_code ec;
  std::string why;
  auto a =
      pinned_arena::create({.slot_bytes = 1 << 20, .slots = 4}, ec, &why, cuda::cuda_host_alloc_source());
  if (!have_device) {
    EXPECT(!a && ec == errc::backend_error && why.find("cudaHostAlloc") != std::string::npos);
    std::printf("pinned arena without a device: refused (%s)\n", why.c_str());
    return;
  }
  EXPECT(a && a->device_mapped());
  if (a) {
    auto s = a->try_acquire(ec);
    EXPECT(s && cuda::device_pointer(s.bytes().data()) != nullptr);
  }
  auto r = pinned_arena::create({.slot_bytes = 1 << 20, .slots = 4, .numa_node = 0}, ec, &why,
                                cuda::cuda_host_register_source());
  EXPECT(r || why.find("mbind") != std::string::npos);  // a container may forbid mbind
  std::printf("pinned arena (cudaHostAlloc, cudaHostRegister): %s\n", failures == 0 ? "ok" : "FAILED");
}

// A random small case: every named layout, view kind, skipped slots and a layer range.
struct random_case {
  kv_layout lay;
  view_kind kind;
  std::vector<std::int64_t> slots;
  layer_range r;
  std::size_t bytes;
};

random_case make_case(std::uint64_t seed) {
  layout_params p;
  p.kind = static_cast<int>(splitmix64(seed) % layout_kinds);
  p.layers = 1 + splitmix64(seed) % 6;
  p.blocks = 1 + splitmix64(seed) % 9;
  p.block_size = 1 + splitmix64(seed) % 20;
  p.heads = 1 + splitmix64(seed) % 4;
  p.head_size = 1 + splitmix64(seed) % 80;
  p.elem = std::uint32_t{1} << (splitmix64(seed) % 3);
  random_case k;
  k.lay = make_layout(p);
  k.kind = static_cast<view_kind>(splitmix64(seed) % 3);
  k.slots = random_slots(k.lay, splitmix64(seed) % (k.lay.num_slots() + 1), seed, splitmix64(seed) % 3 * 3);
  const std::uint32_t a = splitmix64(seed) % (k.lay.num_layers + 1);
  k.r = {a, a + static_cast<std::uint32_t>(splitmix64(seed) % (k.lay.num_layers - a + 1))};
  k.bytes = std::size_t{k.r.end(k.lay) - k.r.first} * k.slots.size() * k.lay.layer_bytes_per_token();
  return k;
}

// The kernel's body run on the host over its whole grid (no GPU needed), against the CPU version.
void emulate_case(std::uint64_t seed) {
  const random_case k = make_case(seed);
  owned_cache host = make_cache(k.lay, k.kind, seed);
  std::vector<std::byte> want(k.bytes), got(k.bytes);
  fill_bytes(want, seed + 1);
  got = want;
  EXPECT(!kv_gather(host.view, k.slots, want, k.r));
  EXPECT(!cuda::emulate_on_host(true, host.view, k.slots, got.data(), got.size(), k.r));
  EXPECT(got == want);
  owned_cache other = make_cache(k.lay, k.kind, ~seed);
  fill_bytes(got, seed + 2);
  EXPECT(!kv_scatter(host.view, k.slots, got, k.r));
  EXPECT(!cuda::emulate_on_host(false, other.view, k.slots, got.data(), got.size(), k.r));
  owned_cache base = make_cache(k.lay, k.kind, ~seed);  // other's bytes before the scatter
  EXPECT(!kv_scatter(base.view, k.slots, got, k.r));
  EXPECT(other.snapshot() == base.snapshot());
}

// One random case on the device, compared with the CPU version over whole buffers.
void compare_case(std::uint64_t seed, std::byte* mapped_chunk, std::size_t mapped_bytes, cudaStream_t s,
                  std::int64_t* slots_dev, std::size_t slots_cap) {
  const random_case k = make_case(seed);
  const kv_layout& lay = k.lay;
  const auto kind = k.kind;
  const auto& slots = k.slots;
  const layer_range r = k.r;
  const std::size_t bytes = k.bytes;
  if (slots.size() > slots_cap || bytes > mapped_bytes) return;

  owned_cache host = make_cache(lay, kind, seed);
  device_cache dev(host);
  // gather: CPU into a pre-filled chunk; GPU into a device chunk and into mapped pinned memory
  std::vector<std::byte> init(bytes);
  fill_bytes(init, seed + 1);
  std::vector<std::byte> want = init;
  EXPECT(!kv_gather(host.view, slots, want, r));
  void* dchunk = nullptr;
  cuda_must(cudaMalloc(&dchunk, std::max<std::size_t>(bytes, 1)), "cudaMalloc chunk");
  cuda_must(cudaMemcpy(dchunk, init.data(), bytes, cudaMemcpyHostToDevice), "cudaMemcpy chunk");
  std::memcpy(mapped_chunk, init.data(), bytes);
  EXPECT(!cuda::kv_gather(dev.view, slots, slots_dev, static_cast<std::byte*>(dchunk), bytes, r, s));
  EXPECT(!cuda::kv_gather(dev.view, slots, slots_dev, cuda::device_pointer(mapped_chunk), bytes, r, s));
  cuda_must(cudaStreamSynchronize(s), "sync gather");
  std::vector<std::byte> got(bytes);
  cuda_must(cudaMemcpy(got.data(), dchunk, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy back");
  EXPECT(got == want);
  EXPECT(std::equal(want.begin(), want.end(), mapped_chunk));
  // scatter of another chunk from mapped pinned memory: whole caches equal
  fill_bytes(std::span<std::byte>(mapped_chunk, bytes), seed + 2);
  const std::vector<std::byte> src(mapped_chunk, mapped_chunk + bytes);
  EXPECT(!kv_scatter(host.view, slots, src, r));
  EXPECT(!cuda::kv_scatter(dev.view, slots, slots_dev, cuda::device_pointer(mapped_chunk), bytes, r, s));
  cuda_must(cudaStreamSynchronize(s), "sync scatter");
  EXPECT(dev.snapshot(host) == host.snapshot());
  cudaFree(dchunk);
}

int validate(int cases) {
  argument_checks();
  for (int i = 0; i < cases && failures == 0; ++i) emulate_case(0xe0000u + i);
  std::printf("kernel body emulated on the host vs CPU over %d random layouts: %s\n", cases,
              failures == 0 ? "bit-identical" : "MISMATCH");
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess) devices = 0;
  cudaGetLastError();
  arena_checks(devices > 0);
  if (devices == 0) {
    std::printf("kv_copy_check: no CUDA device; the kernel comparison needs one (bench/gpu/check.sh)\n");
    return failures == 0 ? 0 : 1;
  }
  cudaStream_t s;
  cuda_must(cudaStreamCreate(&s), "cudaStreamCreate");
  constexpr std::size_t cap = 64 << 20, slot_cap = 1 << 16;
  void* mapped = nullptr;
  cuda_must(cudaHostAlloc(&mapped, cap, cudaHostAllocMapped), "cudaHostAlloc");
  void* slots_dev = nullptr;
  cuda_must(cudaMalloc(&slots_dev, slot_cap * sizeof(std::int64_t)), "cudaMalloc slots");
  for (int i = 0; i < cases && failures == 0; ++i)
    compare_case(0x5eed0000u + i, static_cast<std::byte*>(mapped), cap, s,
                 static_cast<std::int64_t*>(slots_dev), slot_cap);
  std::printf("kernel vs CPU over %d random layouts: %s\n", cases,
              failures == 0 ? "bit-identical" : "MISMATCH");
  cudaFree(slots_dev);
  cudaFreeHost(mapped);
  cudaStreamDestroy(s);
  return failures == 0 ? 0 : 1;
}

// ---- bench -------------------------------------------------------------------------------------

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

template <class F>
double time_ms(cudaStream_t s, int reps, F&& f) {
  cudaEvent_t a, b;
  cuda_must(cudaEventCreate(&a), "cudaEventCreate");
  cuda_must(cudaEventCreate(&b), "cudaEventCreate");
  f();  // warm-up
  std::vector<double> ms;
  for (int i = 0; i < reps; ++i) {
    cuda_must(cudaEventRecord(a, s), "record");
    f();
    cuda_must(cudaEventRecord(b, s), "record");
    cuda_must(cudaEventSynchronize(b), "sync");
    float t = 0;
    cuda_must(cudaEventElapsedTime(&t, a, b), "elapsed");
    ms.push_back(t);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return median(ms);
}

int bench(int reps) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("kv_copy_check bench: no CUDA device; nothing measured\n");
    std::printf("{\"bench\":\"kv_copy_gpu\",\"skipped\":\"no CUDA device\"}\n");
    return 0;
  }
  cudaStream_t s;
  cuda_must(cudaStreamCreate(&s), "cudaStreamCreate");
  constexpr std::size_t tokens = 256;
  struct row {
    const char* name;
    kv_layout lay;
  };
  // Layer counts chosen so one 256-token chunk is about 12.4 MB.
  const row rows[] = {{"vllm_mla_bf16", kv_layout::vllm_mla(42, 512, 64)},
                      {"vllm_mla_fp8", kv_layout::vllm_mla_fp8(74, 512, 64)},
                      {"flash_attn_nhd", kv_layout::vllm_flash_attn(12, 512, 16, 8, 128)},
                      {"flash_attn_hnd", kv_layout::vllm_flash_attn(12, 512, 16, 8, 128, 2, kv_order::hnd)}};
  std::string json = "{\"bench\":\"kv_copy_gpu\",\"reps\":" + std::to_string(reps) + ",\"rows\":[";
  std::printf("%-16s %9s %12s %12s %12s %12s %12s %12s %8s\n", "layout", "MB", "gather_d2d", "scatter_d2d",
              "scatter_pin", "memcpy_pinH2D", "memcpy_pageH2D", "memcpy_D2D", "pin_ratio");
  for (const row& rw : rows) {
    const kv_layout& lay = rw.lay;
    owned_cache host = make_cache(lay, view_kind::per_layer, 3);
    device_cache dev(host);
    // a chunk's tokens: 4 whole blocks in shuffled block order
    const auto slots = random_slots(lay, tokens, 11, 0);
    const std::size_t bytes = lay.bytes_per_token() * tokens;
    void *dchunk = nullptr, *dchunk2 = nullptr, *pinned = nullptr, *slots_dev = nullptr;
    cuda_must(cudaMalloc(&dchunk, bytes), "cudaMalloc");
    cuda_must(cudaMalloc(&dchunk2, bytes), "cudaMalloc");
    cuda_must(cudaMalloc(&slots_dev, tokens * sizeof(std::int64_t)), "cudaMalloc");
    cuda_must(cudaHostAlloc(&pinned, bytes, cudaHostAllocMapped), "cudaHostAlloc");
    std::vector<std::byte> pageable(bytes);
    fill_bytes(pageable, 5);
    std::memcpy(pinned, pageable.data(), bytes);
    auto* sd = static_cast<std::int64_t*>(slots_dev);
    auto* pin_dev = cuda::device_pointer(static_cast<std::byte*>(pinned));
    const double g = time_ms(s, reps, [&] {
      cuda::kv_gather(dev.view, slots, sd, static_cast<std::byte*>(dchunk), bytes, {}, s);
    });
    const double sc = time_ms(s, reps, [&] {
      cuda::kv_scatter(dev.view, slots, sd, static_cast<std::byte*>(dchunk), bytes, {}, s);
    });
    const double sp = time_ms(s, reps, [&] { cuda::kv_scatter(dev.view, slots, sd, pin_dev, bytes, {}, s); });
    const double mp =
        time_ms(s, reps, [&] { cudaMemcpyAsync(dchunk, pinned, bytes, cudaMemcpyHostToDevice, s); });
    const double mg =
        time_ms(s, reps, [&] { cudaMemcpyAsync(dchunk, pageable.data(), bytes, cudaMemcpyHostToDevice, s); });
    const double md =
        time_ms(s, reps, [&] { cudaMemcpyAsync(dchunk2, dchunk, bytes, cudaMemcpyDeviceToDevice, s); });
    // correctness of the timed path too: gather back what was scattered from pinned memory
    cuda::kv_gather(dev.view, slots, sd, static_cast<std::byte*>(dchunk2), bytes, {}, s);
    cuda_must(cudaStreamSynchronize(s), "sync");
    std::vector<std::byte> back(bytes);
    cuda_must(cudaMemcpy(back.data(), dchunk2, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy");
    EXPECT(back == pageable);
    auto gbs = [&](double ms) { return bytes / (ms * 1e6); };
    std::printf("%-16s %9.2f %9.1f GB/s %9.1f GB/s %9.1f GB/s %9.1f GB/s %9.1f GB/s %9.1f GB/s %8.2f\n",
                rw.name, bytes / 1e6, gbs(g), gbs(sc), gbs(sp), gbs(mp), gbs(mg), gbs(md), mp / sp);
    char buf[512];
    std::snprintf(
        buf, sizeof buf,
        "%s{\"layout\":\"%s\",\"bytes\":%zu,\"gather_d2d_gbs\":%.2f,\"scatter_d2d_gbs\":%.2f,"
        "\"scatter_pinned_gbs\":%.2f,\"memcpy_pinned_h2d_gbs\":%.2f,\"memcpy_pageable_h2d_gbs\":%.2f,"
        "\"memcpy_d2d_gbs\":%.2f,\"scatter_pinned_vs_memcpy\":%.3f}",
        &rw == rows ? "" : ",", rw.name, bytes, gbs(g), gbs(sc), gbs(sp), gbs(mp), gbs(mg), gbs(md), mp / sp);
    json += buf;
    cudaFree(dchunk);
    cudaFree(dchunk2);
    cudaFree(slots_dev);
    cudaFreeHost(pinned);
  }
  cudaStreamDestroy(s);
  std::printf(
      "pin_ratio = kernel scatter from mapped pinned memory / cudaMemcpyAsync pinned H2D (target >= 0.8)\n");
  std::printf("%s],\"ok\":%s}\n", json.c_str(), failures == 0 ? "true" : "false");
  return failures == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "validate";
  const int n = argc > 2 ? std::max(1, std::atoi(argv[2])) : 0;
  if (mode == "validate") return validate(n ? n : 200);
  if (mode == "bench") return bench(n ? n : 15) | validate(50);
  std::fprintf(stderr, "usage: kv_copy_check validate|bench [n]\n");
  return 1;
}
