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
// - Slots are checked on the host (the caller's host span, exactly as on the CPU: a scatter
//   refuses two tokens with one slot, whose threads would race on its bytes), then copied to
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

// Element j (a (token, unit) pair) of (layer, plane) lp: the kernel's whole body, also callable
// on the host (emulate_on_host) so its index arithmetic is testable without a GPU.
template <class Unit, bool ToChunk>
__host__ __device__ inline void kv_copy_element(const kv_kernel_args& a, std::uint64_t lp, std::uint64_t j) {
  const std::uint64_t token = j / a.row_units, u = j - token * a.row_units;
  const std::int64_t slot = a.slots[token];
  if (slot < 0 || static_cast<std::uint64_t>(slot) >= a.num_slots) return;  // skip (or out of range)
  const std::uint64_t s = static_cast<std::uint64_t>(slot);
  const std::uint64_t h = u / a.head_units, off = u - h * a.head_units;
  Unit* p = reinterpret_cast<Unit*>(a.planes[lp]) + (s / a.block_size) * a.block_stride +
            (s % a.block_size) * a.token_stride + h * a.head_stride + off;
  Unit* c = reinterpret_cast<Unit*>(a.chunk) + lp * a.tokens * a.row_units + j;
  if constexpr (ToChunk)
    *c = *p;
  else
    *p = *c;
}

// One thread per `Unit` of the chunk rows; grid-stride over (token, unit) of one (layer, plane),
// blockIdx.y selects the (layer, plane). ToChunk = gather.
template <class Unit, bool ToChunk>
__global__ void kv_copy_kernel(kv_kernel_args a) {
  const std::uint64_t work = a.tokens * a.row_units;
  for (std::uint64_t j = blockIdx.x * std::uint64_t{blockDim.x} + threadIdx.x; j < work;
       j += std::uint64_t{gridDim.x} * blockDim.x)
    kv_copy_element<Unit, ToChunk>(a, blockIdx.y, j);
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

/// A launch's arguments, copy unit and (layer, plane) count, after every check.
struct kv_launch {
  kv_kernel_args args{};
  unsigned unit = 1;
  std::uint64_t lps = 0;
};

// Checks everything (as the CPU path, plus the pointer-table size) and builds the arguments.
// A scatter (`writes_cache`) refuses two tokens with one slot: their threads would race.
inline std::error_code prepare(const kv_cache_view& cache, std::span<const std::int64_t> slots,
                               const std::int64_t* slots_device, std::byte* chunk, std::size_t chunk_bytes,
                               layer_range r, kv_launch& out, kv_layout_error* why, bool writes_cache) {
  if (auto ec = kvtier::detail::kv_copy_check(cache, slots, chunk_bytes, r, why, writes_cache)) return ec;
  const kv_layout& l = cache.layout;
  out.lps = std::uint64_t{r.end(l) - r.first} * l.planes;
  if (out.lps > max_planes)
    return invalid(why, {"layers", "a launch carries at most " + std::to_string(max_planes) +
                                       " (layer, plane) pointers; the range has " + std::to_string(out.lps)});
  if (!slots.empty() && (slots_device == nullptr || (chunk == nullptr && chunk_bytes != 0)))
    return invalid(why, {slots_device == nullptr ? "slots_device" : "chunk", "a device pointer is null"});
  const bool together = l.heads_contiguous();
  const unsigned unit = out.unit = copy_unit(cache, r, chunk, together);
  kv_kernel_args& a = out.args;
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
  return {};
}

// Calls f.template operator()<Unit>() with the unit type of `unit` bytes.
template <class F>
void with_unit(unsigned unit, F&& f) {
  switch (unit) {
    case 16:
      f.template operator()<uint4>();
      break;
    case 8:
      f.template operator()<uint2>();
      break;
    case 4:
      f.template operator()<unsigned>();
      break;
    case 2:
      f.template operator()<unsigned short>();
      break;
    default:
      f.template operator()<unsigned char>();
      break;
  }
}

template <bool ToChunk>
std::error_code launch(const kv_cache_view& cache, std::span<const std::int64_t> slots,
                       std::int64_t* slots_device, std::byte* chunk, std::size_t chunk_bytes, layer_range r,
                       cudaStream_t stream, cudaEvent_t done, kv_layout_error* why) {
  kv_launch k;
  if (auto ec = prepare(cache, slots, slots_device, chunk, chunk_bytes, r, k, why, /*writes_cache=*/!ToChunk))
    return ec;
  auto cuda_error = [&](cudaError_t e, const char* what) {
    if (why) *why = {"cuda", std::string(what) + ": " + cudaGetErrorString(e)};
    return make_error_code(errc::backend_error);
  };
  if (!slots.empty() && k.lps != 0) {
    if (cudaError_t e =
            cudaMemcpyAsync(slots_device, slots.data(), slots.size_bytes(), cudaMemcpyHostToDevice, stream);
        e != cudaSuccess)
      return cuda_error(e, "cudaMemcpyAsync of the slot mapping");
    constexpr unsigned threads = 256;
    const std::uint64_t blocks = (k.args.tokens * k.args.row_units + threads - 1) / threads;
    const dim3 grid(static_cast<unsigned>(blocks < 1024 ? blocks : 1024), static_cast<unsigned>(k.lps));
    with_unit(k.unit,
              [&]<class Unit>() { kv_copy_kernel<Unit, ToChunk><<<grid, threads, 0, stream>>>(k.args); });
    if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return cuda_error(e, "kv_copy kernel launch");
  }
  if (done != nullptr)
    if (cudaError_t e = cudaEventRecord(done, stream); e != cudaSuccess)
      return cuda_error(e, "cudaEventRecord");
  return {};
}

}  // namespace detail

/// Runs the kernel's body over its whole grid on the host, with host pointers (cache, `slots`,
/// chunk): the same checks, argument building, copy unit and per-element arithmetic as
/// kv_gather / kv_scatter below, one element at a time. For testing without a GPU; slow.
inline std::error_code emulate_on_host(bool gather, const kv_cache_view& host_cache,
                                       std::span<const std::int64_t> slots, std::byte* chunk,
                                       std::size_t chunk_bytes, layer_range r,
                                       kv_layout_error* why = nullptr) {
  detail::kv_launch k;
  if (auto ec = detail::prepare(host_cache, slots, slots.data(), chunk, chunk_bytes, r, k, why, !gather))
    return ec;
  const std::uint64_t work = k.args.tokens * k.args.row_units;
  detail::with_unit(k.unit, [&]<class Unit>() {
    for (std::uint64_t lp = 0; lp < k.lps; ++lp)
      for (std::uint64_t j = 0; j < work; ++j)
        gather ? detail::kv_copy_element<Unit, true>(k.args, lp, j)
               : detail::kv_copy_element<Unit, false>(k.args, lp, j);
  });
  return {};
}

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
