// kvtier::cuda: the pinned-arena CUDA sources, and a call into the CUDA runtime (works
// without a GPU: the version query needs no device).
#include <kvtier/cuda/cuda_host_memory.hpp>

#include <string>

std::string use_cuda() {
  const kvtier::host_region_source s = kvtier::cuda::cuda_host_alloc_source();
  int version = 0;
  return s.device_mapped && cudaRuntimeGetVersion(&version) == cudaSuccess
             ? "ok (CUDA runtime " + std::to_string(version) + ")"
             : "cudaRuntimeGetVersion failed";
}
