# Collectives: in-process chunk_broadcast, per-chunk (baseline) vs grouped vs gathered,
# one-shot vs pipelined over a simulated fetch,
# with a memcpy floor; and the GPU check program (run by bench/gpu/check.sh) where
# CUDA + NCCL were found.
add_executable(bench_chunk_broadcast ${CMAKE_CURRENT_LIST_DIR}/comm/bench_chunk_broadcast.cpp)
target_link_libraries(bench_chunk_broadcast PRIVATE kvtier::kvtier)
if(TARGET kvtier::nccl)
  add_executable(gpu_check ${CMAKE_CURRENT_LIST_DIR}/gpu/gpu_check.cpp)
  target_link_libraries(gpu_check PRIVATE kvtier::nccl)
endif()
