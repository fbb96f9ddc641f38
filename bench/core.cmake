# Chunker throughput: the default XXH3-128 chain against an OpenSSL SHA-256 chain
# (the baseline runs only where OpenSSL was found).
add_executable(bench_chunker core/bench_chunker.cpp)
target_link_libraries(bench_chunker PRIVATE kvtier::kvtier)
if(KVTIER_HAS_OPENSSL)
  target_link_libraries(bench_chunker PRIVATE OpenSSL::Crypto)
  target_compile_definitions(bench_chunker PRIVATE KVTIER_BENCH_HAS_OPENSSL=1)
endif()
