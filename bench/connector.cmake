# The connector's load path against the hand-composed path and the fetch alone (issue 20).
add_executable(bench_connector ${CMAKE_CURRENT_LIST_DIR}/connector/bench_connector.cpp)
target_include_directories(bench_connector PRIVATE ${CMAKE_CURRENT_LIST_DIR})
target_link_libraries(bench_connector PRIVATE kvtier::kvtier)
if(TARGET kvtier::asio)  # one redis-server per rank, started by the benchmark
  target_include_directories(bench_connector PRIVATE ${PROJECT_SOURCE_DIR}/tests)
  target_link_libraries(bench_connector PRIVATE kvtier::asio)
  target_compile_definitions(bench_connector PRIVATE KVTIER_BENCH_HAS_REDIS=1)
endif()
