# docs/benchmarks.md's tables are generated from bench/results/*.jsonl by scripts/bench_tables.py:
# bench_tables fails when a table differs from what the recorded runs give (rerun the script to
# refresh them). Python 3 standard library only; about 0.1 s. Not in sanitizer trees (no C++).
if(NOT KVTIER_SANITIZE)
  find_program(KVTIER_PYTHON3_FOR_DOCS NAMES python3 PATHS /usr/bin NO_DEFAULT_PATH)
  if(NOT KVTIER_PYTHON3_FOR_DOCS)
    find_program(KVTIER_PYTHON3_FOR_DOCS NAMES python3)
  endif()
  if(KVTIER_PYTHON3_FOR_DOCS)
    set(_bench_tables ${KVTIER_PYTHON3_FOR_DOCS} ${PROJECT_SOURCE_DIR}/scripts/bench_tables.py --check)
    add_test(NAME bench_tables COMMAND ${_bench_tables})
    # The check must be able to fail: the same check on the page with one digit of a table changed.
    add_test(NAME bench_tables_detects_drift COMMAND ${_bench_tables} --mutate)
    set_tests_properties(bench_tables PROPERTIES LABELS unit TIMEOUT 30)
    set_tests_properties(bench_tables_detects_drift PROPERTIES LABELS unit TIMEOUT 30
                         PASS_REGULAR_EXPRESSION "the table headline in docs/benchmarks.md differs from what bench/results gives")
  else()
    message(STATUS "kvtier: bench_tables test skipped (no python3)")
  endif()
endif()
