// kvtier/cuda/kv_copy.cuh: the GPU gather/scatter between a paged KV cache in device memory and
// a chunk's layer-major bytes (target kvtier::cuda; compile with nvcc). Same format, slots and
// layer ranges as the CPU version in kvtier/kv_copy.hpp, and bit-identical results.
//
// - All layers (of the range) in one kernel launch, on the caller's stream; when `done` is given,
//   the event is recorded on the stream after the kernel, so the caller can wait for it or make
//   another stream wait on it. Nothing here synchronizes.
// - The chunk side is device memory or pinned host memory mapped into the device
//   (pinned_arena with a kvtier/cuda/cuda_host_memory.hpp source; pass
//   kvtier::cuda::device_pointer(host)): the kernel then reads or writes host memory over PCIe
//   directly, with no staging copy.
// - Slots are checked on the host (the caller's host span, exactly as on the CPU), then copied to
//   `slots_device` (tokens int64s of device memory the caller owns) on the stream. The kernel
//   still skips any slot outside the cache, so a bad slot can never write outside it.
// - The cache's plane pointers travel in the kernel's parameters: at most max_planes
//   (layers * planes) of them.
//
//   cudaEvent_t ev;  cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
//   auto ec = kvtier::cuda::kv_scatter(device_cache, slots, slots_dev,
//   kvtier::cuda::device_pointer(slot.bytes().data()),
//                                      chunk_bytes, {}, stream, ev);
//   // ... later: cudaStreamWaitEvent(compute_stream, ev) before attention reads those blocks
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <system_error>

#include "kvtier/errc.hpp"
#include "kvtier/kv_copy.hpp"
#include "kvtier/kv_layout.hpp"

namespace kvtier::cuda {

/// Most (layer, plane) pointers one launch carries in its parameters.
inline constexpr std::size_t max_planes = 256;

namespace detail {

struct kv_kernel_args {
  std::byte* planes[max_planes];  // (layer, plane) bases of the layers in the range, in order
  const std::int64_t* slots;      // device copy of the slot mapping
  std::byte* chunk;               // layer-major bytes of the range
  std::uint64_t tokens;
  std::uint64_t num_slots, block_size;
  std::uint64_t block_stride, token_stride, head_stride;  // in units
  std::uint64_t head_units, heads;  // one head; heads per row (1 when the row is contiguous)
  std::uint64_t row_units;          // one token of one plane in the chunk (= heads * head_units)
};

// One thread per `Unit` of the chunk row; grid-stride over (token, unit) of one (layer, plane),
// blockIdx.y selects the (layer, plane). ToChunk = gather.
template <class Unit, bool ToChunk>
__global__ void kv_copy_kernel(kv_kernel_args a) {
  const std::uint64_t lp = blockIdx.y;
  Unit* const cache = reinterpret_cast<Unit*>(a.planes[lp]);
  Unit* const chunk = reinterpret_cast<Unit*>(a.chunk) + lp * a.tokens * a.row_units;
  const std::uint64_t work = a.tokens * a.row_units;
  for (std::uint64_t j = blockIdx.x * std::uint64_t{blockDim.x} + threadIdx.x; j < work;
       j += std::uint64_t{gridDim.x} * blockDim.x) {
    const std::uint64_t token = j / a.row_units, u = j - token * a.row_units;
    const std::int64_t slot = a.slots[token];
    if (slot < 0 || static_cast<std::uint64_t>(slot) >= a.num_slots) continue;  // skip (or out of range)
    const std::uint64_t s = static_cast<std::uint64_t>(slot);
    const std::uint64_t h = u / a.head_units, off = u - h * a.head_units;
    Unit* p = cache + (s / a.block_size) * a.block_stride + (s % a.block_size) * a.token_stride +
              h * a.head_stride + off;
    if constexpr (ToChunk)
      chunk[j] = *p;
    else
      *p = chunk[j];
  }
}

inline std::error_code invalid(kv_layout_error* why, kv_layout_error e) {
  if (why) *why = std::move(e);
  return make_error_code(errc::invalid_argument);
}

// The widest unit (16, 8, 4, 2 or 1 bytes) dividing every address and length the kernel uses.
inline unsigned copy_unit(const kv_cache_view& c, layer_range r, const void* chunk, bool heads_together) {
  const kv_layout& l = c.layout;
  std::uint64_t bits =
      l.block_stride | l.token_stride | reinterpret_cast<std::uintptr_t>(chunk) |
      (heads_together ? std::uint64_t{l.heads} * l.head_bytes : (l.head_bytes | l.head_stride));
  for (std::uint32_t layer = r.first; layer < r.end(l); ++layer)
    for (std::uint32_t p = 0; p < l.planes; ++p) bits |= reinterpret_cast<std::uintptr_t>(c.plane(layer, p));
  unsigned u = 16;
  while (u > 1 && (bits & (u - 1)) != 0) u /= 2;
  return u;
}

template <bool ToChunk>
std::error_code launch(const kv_cache_view& cache, std::span<const std::int64_t> slots,
                       std::int64_t* slots_device, std::byte* chunk, std::size_t chunk_bytes, layer_range r,
                       cudaStream_t stream, cudaEvent_t done, kv_layout_error* why) {
  if (auto ec = kvtier::detail::kv_copy_check(cache, slots, chunk_bytes, r, why)) return ec;
  const kv_layout& l = cache.layout;
  const std::uint64_t lps = std::uint64_t{r.end(l) - r.first} * l.planes;
  if (lps > max_planes)
    return invalid(why, {"layers", "a launch carries at most " + std::to_string(max_planes) +
                                       " (layer, plane) pointers; the range has " + std::to_string(lps)});
  if (!slots.empty() && (slots_device == nullptr || chunk == nullptr))
    return invalid(why, {slots_device == nullptr ? "slots_device" : "chunk", "a device pointer is null"});
  auto cuda_error = [&](cudaError_t e, const char* what) {
    if (why) *why = {"cuda", std::string(what) + ": " + cudaGetErrorString(e)};
    return make_error_code(errc::backend_error);
  };
  if (!slots.empty() && lps != 0) {
    if (cudaError_t e =
            cudaMemcpyAsync(slots_device, slots.data(), slots.size_bytes(), cudaMemcpyHostToDevice, stream);
        e != cudaSuccess)
      return cuda_error(e, "cudaMemcpyAsync of the slot mapping");
    const bool together = l.heads_contiguous();
    const unsigned unit = copy_unit(cache, r, chunk, together);
    kv_kernel_args a{};
    std::size_t k = 0;
    for (std::uint32_t layer = r.first; layer < r.end(l); ++layer)
      for (std::uint32_t p = 0; p < l.planes; ++p) a.planes[k++] = cache.plane(layer, p);
    a.slots = slots_device;
    a.chunk = chunk;
    a.tokens = slots.size();
    a.num_slots = l.num_slots();
    a.block_size = l.block_size;
    a.block_stride = l.block_stride / unit;
    a.token_stride = l.token_stride / unit;
    a.head_units = (together ? std::uint64_t{l.heads} * l.head_bytes : l.head_bytes) / unit;
    a.heads = together ? 1 : l.heads;
    a.head_stride = together ? 0 : l.head_stride / unit;
    a.row_units = a.heads * a.head_units;
    constexpr unsigned threads = 256;
    const std::uint64_t blocks = (a.tokens * a.row_units + threads - 1) / threads;
    const dim3 grid(static_cast<unsigned>(blocks < 1024 ? blocks : 1024), static_cast<unsigned>(lps));
    switch (unit) {
      case 16:
        kv_copy_kernel<uint4, ToChunk><<<grid, threads, 0, stream>>>(a);
        break;
      case 8:
        kv_copy_kernel<uint2, ToChunk><<<grid, threads, 0, stream>>>(a);
        break;
      case 4:
        kv_copy_kernel<unsigned, ToChunk><<<grid, threads, 0, stream>>>(a);
        break;
      case 2:
        kv_copy_kernel<unsigned short, ToChunk><<<grid, threads, 0, stream>>>(a);
        break;
      default:
        kv_copy_kernel<unsigned char, ToChunk><<<grid, threads, 0, stream>>>(a);
        break;
    }
    if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return cuda_error(e, "kv_copy kernel launch");
  }
  if (done != nullptr)
    if (cudaError_t e = cudaEventRecord(done, stream); e != cudaSuccess)
      return cuda_error(e, "cudaEventRecord");
  return {};
}

}  // namespace detail

/// GPU gather: layers r of the tokens at host `slots` from the device cache into `chunk`
/// (device or mapped pinned host memory, chunk_bytes long). Checked like kvtier::kv_gather,
/// then queued on `stream`; `done` (if not null) is recorded after the kernel.
inline std::error_code kv_gather(const kv_cache_view& device_cache, std::span<const std::int64_t> slots,
                                 std::int64_t* slots_device, std::byte* chunk, std::size_t chunk_bytes,
                                 layer_range r, cudaStream_t stream, cudaEvent_t done = nullptr,
                                 kv_layout_error* why = nullptr) {
  return detail::launch<true>(device_cache, slots, slots_device, chunk, chunk_bytes, r, stream, done, why);
}

/// GPU scatter: `chunk` (layers r) into the device cache at host `slots`; negative slots skipped.
inline std::error_code kv_scatter(const kv_cache_view& device_cache, std::span<const std::int64_t> slots,
                                  std::int64_t* slots_device, const std::byte* chunk, std::size_t chunk_bytes,
                                  layer_range r, cudaStream_t stream, cudaEvent_t done = nullptr,
                                  kv_layout_error* why = nullptr) {
  // The kernel only reads the chunk in this direction.
  return detail::launch<false>(device_cache, slots, slots_device, const_cast<std::byte*>(chunk), chunk_bytes,
                               r, stream, done, why);
}

}  // namespace kvtier::cuda
