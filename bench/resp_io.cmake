# RESP I/O benchmarks: batched GETs of 12.4 MB values, kvtier's Asio and io_uring connections
# against hiredis (stock and tuned) in the same run. Baselines are linked only where present.
set(_kvtier_resp_get_libs "")
# kvtier's clients are kvtier-probe's (tools/probe/probe_io.hpp): the benchmark measures the
# same code path the probe reports for a deployment.
set(_kvtier_resp_get_asio ${PROJECT_SOURCE_DIR}/include/kvtier/resp/asio_connection.hpp)
set(_kvtier_resp_get_uring ${PROJECT_SOURCE_DIR}/include/kvtier/resp/uring_connection.hpp)
set(_kvtier_resp_get_defs "")
if(TARGET kvtier::asio AND EXISTS ${_kvtier_resp_get_asio})
  list(APPEND _kvtier_resp_get_libs kvtier::asio)
  list(APPEND _kvtier_resp_get_defs KVTIER_BENCH_HAS_ASIO=1)
endif()
if(TARGET kvtier::asio AND TARGET kvtier::uring AND EXISTS ${_kvtier_resp_get_asio} AND EXISTS ${_kvtier_resp_get_uring})
  list(APPEND _kvtier_resp_get_libs kvtier::uring)
  list(APPEND _kvtier_resp_get_defs KVTIER_BENCH_HAS_URING=1 KVTIER_PROBE_HAS_URING=1)
endif()
if(KVTIER_HAS_HIREDIS)
  list(APPEND _kvtier_resp_get_defs KVTIER_BENCH_HAS_HIREDIS=1)
endif()
if(_kvtier_resp_get_defs)
  add_executable(bench_resp_get ${CMAKE_CURRENT_LIST_DIR}/resp_io/bench_resp_get.cpp)
  target_include_directories(bench_resp_get PRIVATE ${CMAKE_CURRENT_LIST_DIR}/resp_io ${PROJECT_SOURCE_DIR}/tests
                           ${PROJECT_SOURCE_DIR}/tools/probe ${CMAKE_CURRENT_LIST_DIR})
  target_compile_definitions(bench_resp_get PRIVATE ${_kvtier_resp_get_defs})
  target_link_libraries(bench_resp_get PRIVATE kvtier::kvtier ${_kvtier_resp_get_libs})
  if(KVTIER_HAS_HIREDIS)
    target_include_directories(bench_resp_get SYSTEM PRIVATE ${KVTIER_HIREDIS_INCLUDE_DIR})
    target_link_libraries(bench_resp_get PRIVATE ${KVTIER_HIREDIS_LIBRARY})
  endif()
else()
  message(STATUS "kvtier: bench_resp_get skipped (needs kvtier::asio, kvtier::uring or hiredis)")
endif()

# The L2 at scale-out settings: one server (baseline), a 3-master cluster, TLS over Asio (needs
# kvtier::tls) and over io_uring (kvtier::uring_tls).
if(TARGET kvtier::tls AND TARGET kvtier::asio)
  add_executable(bench_l2_scaleout ${CMAKE_CURRENT_LIST_DIR}/resp_io/bench_l2_scaleout.cpp)
  target_include_directories(bench_l2_scaleout PRIVATE ${PROJECT_SOURCE_DIR}/tests ${CMAKE_CURRENT_LIST_DIR})
  target_link_libraries(bench_l2_scaleout PRIVATE kvtier::tls)
  if(TARGET kvtier::uring_tls)  # the TLS row over io_uring
    target_link_libraries(bench_l2_scaleout PRIVATE kvtier::uring_tls)
    target_compile_definitions(bench_l2_scaleout PRIVATE KVTIER_BENCH_URING_TLS=1)
  endif()
endif()

# kvtier's L2 path against the floors of the wire (raw pipelined, raw one-per-round-trip over
# kvtier's connections, hiredis): GET and SET, 256 KiB .. 64 MB, batches 1, 8, 16.
if(TARGET kvtier::asio)
  add_executable(bench_l2_floor ${CMAKE_CURRENT_LIST_DIR}/resp_io/bench_l2_floor.cpp)
  target_include_directories(bench_l2_floor PRIVATE ${CMAKE_CURRENT_LIST_DIR}/resp_io ${PROJECT_SOURCE_DIR}/tests
                             ${CMAKE_CURRENT_LIST_DIR})
  target_link_libraries(bench_l2_floor PRIVATE kvtier::asio)
  if(TARGET kvtier::uring)
    target_link_libraries(bench_l2_floor PRIVATE kvtier::uring)
    target_compile_definitions(bench_l2_floor PRIVATE KVTIER_BENCH_HAS_URING=1)
  endif()
  if(KVTIER_HAS_HIREDIS)
    target_compile_definitions(bench_l2_floor PRIVATE KVTIER_BENCH_HAS_HIREDIS=1)
    target_include_directories(bench_l2_floor SYSTEM PRIVATE ${KVTIER_HIREDIS_INCLUDE_DIR})
    target_link_libraries(bench_l2_floor PRIVATE ${KVTIER_HIREDIS_LIBRARY})
  endif()
endif()
