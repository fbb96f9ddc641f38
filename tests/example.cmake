# Tests of examples/pcp_prefill: trace format, generator, timing model and
# report (unit), and short end-to-end replays of the engine (integration).
kvtier_add_test(test_example_trace SOURCES example/test_trace.cpp LABELS unit)
kvtier_add_test(test_example_engine SOURCES example/test_engine.cpp LABELS integration TIMEOUT 600)
foreach(t test_example_trace test_example_engine)
  if(TARGET ${t})
    target_include_directories(${t} PRIVATE ${PROJECT_SOURCE_DIR}/examples/pcp_prefill)
  endif()
endforeach()
