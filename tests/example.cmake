# Tests of examples/pcp_prefill: trace format, generator, timing model and
# report (unit), and short end-to-end replays of the engine (integration), on
# the embedded modeled store and on two real redis-server processes.
kvtier_add_test(test_example_trace SOURCES example/test_trace.cpp LABELS unit)
kvtier_add_test(test_example_engine SOURCES example/test_engine.cpp LABELS integration tsan TIMEOUT 600)
set(KVTIER_EXAMPLE_TESTS test_example_trace test_example_engine)
if(TARGET kvtier::asio AND EXISTS /usr/bin/redis-server)
  kvtier_add_test(test_example_engine_resp SOURCES example/test_engine_resp.cpp LABELS integration
                  LIBS kvtier::asio TIMEOUT 300)
  list(APPEND KVTIER_EXAMPLE_TESTS test_example_engine_resp)
endif()
foreach(t IN LISTS KVTIER_EXAMPLE_TESTS)
  if(TARGET ${t})
    target_include_directories(${t} PRIVATE ${PROJECT_SOURCE_DIR}/examples/pcp_prefill)
  endif()
endforeach()
