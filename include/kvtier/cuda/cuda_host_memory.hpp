// kvtier/cuda/cuda_host_memory.hpp: page-locked, device-mapped regions for pinned_arena
// (target kvtier::cuda; needs the CUDA runtime, not the CUDA compiler).
//
//   cuda_host_alloc_source():    cudaHostAlloc(Mapped | Portable); NUMA placement is the
//                                 calling thread's (no binding of its own);
//   cuda_host_register_source(): an mmap bound to the arena's NUMA node (mbind), then
//                                 cudaHostRegister(Mapped | Portable) of it.
// Either way the arena is one registration, and every slot has a device address
// (device_pointer()) for kernels that read pinned host memory directly (kvtier/cuda/kv_copy.cuh).
//
//   std::error_code ec;
//   std::string why;
//   auto arena = kvtier::pinned_arena::create({.slot_bytes = chunk, .slots = 64, .numa_node = 0}, ec, &why,
//                                             kvtier::cuda::cuda_host_register_source());
//   std::byte* dev = kvtier::cuda::device_pointer(slot.bytes().data());
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <string>
#include <system_error>

#include "kvtier/errc.hpp"
#include "kvtier/pinned_arena.hpp"

namespace kvtier::cuda {

namespace detail {
inline std::error_code cuda_fail(cudaError_t e, const char* what, std::string* why) {
  return kvtier::detail::region_fail(errc::backend_error, why,
                                     std::string(what) + ": " + cudaGetErrorString(e));
}
}  // namespace detail

/// Pinned, device-mapped host memory from cudaHostAlloc.
inline host_region_source cuda_host_alloc_source() noexcept {
  host_region_source s;
  s.name = "cudaHostAlloc (mapped, portable)";
  s.device_mapped = true;
  s.allocate = [](void*, std::size_t bytes, int numa_node, std::byte** out,
                  std::string* why) -> std::error_code {
    if (numa_node >= 0)
      return kvtier::detail::region_fail(
          errc::invalid_argument, why,
          "cudaHostAlloc cannot bind a NUMA node; use cuda_host_register_source()");
    void* p = nullptr;
    if (cudaError_t e = cudaHostAlloc(&p, bytes, cudaHostAllocMapped | cudaHostAllocPortable);
        e != cudaSuccess)
      return detail::cuda_fail(e, "cudaHostAlloc", why);
    *out = static_cast<std::byte*>(p);
    return {};
  };
  s.release = [](void*, std::byte* p, std::size_t) noexcept { cudaFreeHost(p); };
  return s;
}

/// A NUMA-bound mmap registered with cudaHostRegister (mapped, portable).
inline host_region_source cuda_host_register_source() noexcept {
  host_region_source s;
  s.name = "mmap + cudaHostRegister (mapped, portable)";
  s.device_mapped = true;
  s.allocate = [](void*, std::size_t bytes, int numa_node, std::byte** out,
                  std::string* why) -> std::error_code {
    if (auto ec = kvtier::detail::mmap_region(bytes, numa_node, out, why)) return ec;
    if (cudaError_t e = cudaHostRegister(*out, bytes, cudaHostRegisterMapped | cudaHostRegisterPortable);
        e != cudaSuccess) {
      kvtier::detail::munmap_region(*out, bytes);
      return detail::cuda_fail(e, "cudaHostRegister", why);
    }
    return {};
  };
  s.release = [](void*, std::byte* p, std::size_t bytes) noexcept {
    cudaHostUnregister(p);
    kvtier::detail::munmap_region(p, bytes);
  };
  return s;
}

/// The device address of mapped pinned host memory `p` (null if it is not mapped).
inline std::byte* device_pointer(std::byte* p) noexcept {
  void* d = nullptr;
  if (cudaHostGetDevicePointer(&d, p, 0) != cudaSuccess) {
    cudaGetLastError();  // clear it, so the caller's next error check is not about this
    return nullptr;
  }
  return static_cast<std::byte*>(d);
}

}  // namespace kvtier::cuda
