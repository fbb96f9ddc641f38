# Chunker throughput: the default XXH3-128 chain against an OpenSSL SHA-256 chain
# (the baseline runs only where OpenSSL was found).
add_executable(bench_chunker core/bench_chunker.cpp)
target_link_libraries(bench_chunker PRIVATE kvtier::kvtier)
if(KVTIER_HAS_OPENSSL)
  target_link_libraries(bench_chunker PRIVATE OpenSSL::Crypto)
  target_compile_definitions(bench_chunker PRIVATE KVTIER_BENCH_HAS_OPENSSL=1)
endif()
# Paged-KV gather/scatter of 12.4 MB chunks against memcpy of the same bytes (issue 10).
add_executable(bench_kv_copy core/bench_kv_copy.cpp)
target_link_libraries(bench_kv_copy PRIVATE kvtier::kvtier)
