# Fetch queue overhead (per request, per chunk, pipelined) against direct store calls,
# and the L1 get path against plain memcpy of the same bytes.
add_executable(bench_fetch_queue ${CMAKE_CURRENT_LIST_DIR}/store/bench_fetch_queue.cpp)
target_link_libraries(bench_fetch_queue PRIVATE kvtier::kvtier)
