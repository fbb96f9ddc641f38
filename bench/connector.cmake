# The connector's load path against the hand-composed path and the fetch alone (issue 20).
add_executable(bench_connector ${CMAKE_CURRENT_LIST_DIR}/connector/bench_connector.cpp)
target_include_directories(bench_connector PRIVATE ${CMAKE_CURRENT_LIST_DIR})
target_link_libraries(bench_connector PRIVATE kvtier::kvtier)
if(TARGET kvtier::asio)  # one redis-server per rank, started by the benchmark
  target_include_directories(bench_connector PRIVATE ${PROJECT_SOURCE_DIR}/tests)
  target_link_libraries(bench_connector PRIVATE kvtier::asio)
  target_compile_definitions(bench_connector PRIVATE KVTIER_BENCH_HAS_REDIS=1)
endif()

# The layer-group storage choice (issue 20): GETRANGE per group of one value per chunk against
# one key per group and against one GET per chunk, on a redis-server the benchmark starts.
if(TARGET kvtier::asio)
  add_executable(bench_layer_groups ${CMAKE_CURRENT_LIST_DIR}/connector/bench_layer_groups.cpp)
  target_include_directories(bench_layer_groups PRIVATE ${CMAKE_CURRENT_LIST_DIR} ${PROJECT_SOURCE_DIR}/tests)
  target_link_libraries(bench_layer_groups PRIVATE kvtier::asio)
endif()

# The load path end to end across MPI processes, one redis-server per rank:
#   mpiexec -n 2 --oversubscribe build/release/bench/bench_connector_mpi [reps]
if(TARGET kvtier::mpi AND TARGET kvtier::asio)
  add_executable(bench_connector_mpi ${CMAKE_CURRENT_LIST_DIR}/connector/bench_connector_mpi.cpp)
  target_include_directories(bench_connector_mpi PRIVATE ${CMAKE_CURRENT_LIST_DIR} ${PROJECT_SOURCE_DIR}/tests)
  target_link_libraries(bench_connector_mpi PRIVATE kvtier::mpi kvtier::asio)
endif()
