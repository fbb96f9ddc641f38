# cmake -DFUZZER=<exe> -DCORPUS=<committed seeds> -DWORK=<build-tree folder> -DSECONDS=<n> -P run_fuzzer.cmake
# Runs a libFuzzer target for a bounded time on a fresh copy of its seed corpus.
file(REMOVE_RECURSE ${WORK})
file(MAKE_DIRECTORY ${WORK}/corpus ${WORK}/artifacts)
file(GLOB seeds ${CORPUS}/*)
file(COPY ${seeds} DESTINATION ${WORK}/corpus)
execute_process(
  COMMAND ${FUZZER} ${WORK}/corpus -max_total_time=${SECONDS} -timeout=5 -rss_limit_mb=2048
          -max_len=65536 -print_final_stats=1 -artifact_prefix=${WORK}/artifacts/
  WORKING_DIRECTORY ${WORK}
  RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "fuzzer ${FUZZER} failed (exit ${rc}); reproducer in ${WORK}/artifacts/")
endif()
