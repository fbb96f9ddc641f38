# Chunker throughput: the default XXH3-128 chain and the SHA-256 chain (kvtier::openssl),
# plain and with key material, against one pass of each hash over the prompt.
add_executable(bench_chunker core/bench_chunker.cpp)
target_link_libraries(bench_chunker PRIVATE kvtier::kvtier)
if(TARGET kvtier::openssl)
  target_link_libraries(bench_chunker PRIVATE kvtier::openssl)
  target_compile_definitions(bench_chunker PRIVATE KVTIER_BENCH_HAS_OPENSSL=1)
endif()
# Paged-KV gather/scatter of 12.4 MB chunks against memcpy of the same bytes (issue 10).
add_executable(bench_kv_copy core/bench_kv_copy.cpp)
target_link_libraries(bench_kv_copy PRIVATE kvtier::kvtier)
