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
# Ranks as processes: MPI (shared memory) vs in-process at the same W, vs memcpy
# (run with bench/comm/bench_mpi.sh: W = 2, 4, 8).
if(TARGET kvtier::mpi)
  add_executable(bench_collectives_mpi ${CMAKE_CURRENT_LIST_DIR}/comm/bench_collectives_mpi.cpp)
  target_link_libraries(bench_collectives_mpi PRIVATE kvtier::mpi)
  # recover() after a poisoned communicator, with and without the peers' failure notice (issue 27).
  add_executable(bench_recover_mpi ${CMAKE_CURRENT_LIST_DIR}/comm/bench_recover_mpi.cpp)
  target_link_libraries(bench_recover_mpi PRIVATE kvtier::mpi)
endif()
