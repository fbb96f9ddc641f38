# Tests of examples/pcp_prefill: trace format, generator, timing model and
# report (unit), and short end-to-end replays of the engine (integration), on
# the embedded modeled store and on two real redis-server processes.
kvtier_add_test(test_example_trace SOURCES example/test_trace.cpp LABELS unit)
kvtier_add_test(test_example_engine SOURCES example/test_engine.cpp LABELS integration tsan TIMEOUT 600)
# Layer-by-layer loading against whole chunks (--load-granularity): same outcomes, never slower.
kvtier_add_test(test_example_engine_layers SOURCES example/test_engine_layers.cpp LABELS integration tsan
                TIMEOUT 600)
set(KVTIER_EXAMPLE_TESTS test_example_trace test_example_engine test_example_engine_layers)
if(TARGET kvtier::asio AND EXISTS /usr/bin/redis-server)
  kvtier_add_test(test_example_engine_resp SOURCES example/test_engine_resp.cpp LABELS integration
                  LIBS kvtier::asio TIMEOUT 300)
  list(APPEND KVTIER_EXAMPLE_TESTS test_example_engine_resp)
  if(TARGET test_example_engine_resp AND TARGET kvtier::tls)  # resp_l2 over TLS as well
    target_link_libraries(test_example_engine_resp PRIVATE kvtier::tls)
    target_compile_definitions(test_example_engine_resp PRIVATE PCP_HAVE_TLS=1)
  endif()
endif()
foreach(t IN LISTS KVTIER_EXAMPLE_TESTS)
  if(TARGET ${t})
    target_include_directories(${t} PRIVATE ${PROJECT_SOURCE_DIR}/examples/pcp_prefill)
  endif()
endforeach()
# pcp_prefill as 4 MPI processes beside its thread form, against 4 real redis-servers and the
# embedded model L2 (label mpi: run alone after the others). The test runs the example binary.
if(KVTIER_BUILD_EXAMPLES AND TARGET kvtier::mpi AND TARGET kvtier::asio AND EXISTS /usr/bin/redis-server
   AND KVTIER_SANITIZE STREQUAL "")
  kvtier_add_test(test_example_pcp_prefill_mpi SOURCES example/test_pcp_prefill_mpi.cpp LABELS mpi TIMEOUT 240)
  target_include_directories(test_example_pcp_prefill_mpi PRIVATE ${PROJECT_SOURCE_DIR}/examples/pcp_prefill)
  target_compile_definitions(test_example_pcp_prefill_mpi PRIVATE PCP_PREFILL_BIN="$<TARGET_FILE:pcp_prefill>"
                                                                  MPIEXEC_BIN="${MPIEXEC_EXECUTABLE}")
  add_dependencies(test_example_pcp_prefill_mpi pcp_prefill)
  set_tests_properties(test_example_pcp_prefill_mpi PROPERTIES PROCESSORS 4)
endif()
# The quickstart against 4 real redis-servers: threads, then (with MPI) 4 processes on the same values.
if(KVTIER_BUILD_EXAMPLES AND TARGET kvtier::asio AND EXISTS /usr/bin/redis-server AND KVTIER_SANITIZE STREQUAL "")
  if(TARGET kvtier::mpi)
    kvtier_add_test(test_quickstart_resp SOURCES example/test_quickstart_resp.cpp LABELS mpi integration TIMEOUT 240)
    target_compile_definitions(test_quickstart_resp PRIVATE MPIEXEC_BIN="${MPIEXEC_EXECUTABLE}")
    set_tests_properties(test_quickstart_resp PROPERTIES PROCESSORS 4)
  else()
    kvtier_add_test(test_quickstart_resp SOURCES example/test_quickstart_resp.cpp LABELS integration TIMEOUT 240)
  endif()
  target_compile_definitions(test_quickstart_resp PRIVATE QUICKSTART_BIN="$<TARGET_FILE:quickstart>")
  add_dependencies(test_quickstart_resp quickstart)
endif()
