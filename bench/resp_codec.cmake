# RESP codec benchmarks: parser throughput into caller destinations against plain memcpy.
add_executable(bench_resp_parser ${CMAKE_CURRENT_LIST_DIR}/resp_codec/bench_parser.cpp)
target_link_libraries(bench_resp_parser PRIVATE kvtier::kvtier)
