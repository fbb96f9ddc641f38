# Core components: chunker, ownership, lookup (with its proof), deadlines, cost model, and
# the two packaging consumers.
kvtier_add_test(test_chunker SOURCES core/test_chunker.cpp LABELS unit)
kvtier_add_test(test_chunker_material SOURCES core/test_chunker_material.cpp LABELS unit)
if(TARGET kvtier::openssl AND TARGET test_chunker_material)
  target_link_libraries(test_chunker_material PRIVATE kvtier::openssl)
  target_compile_definitions(test_chunker_material PRIVATE KVTIER_TEST_HAS_OPENSSL=1)
endif()
kvtier_add_test(test_ownership SOURCES core/test_ownership.cpp LABELS unit)
kvtier_add_test(test_lookup SOURCES core/test_lookup.cpp LABELS unit)
kvtier_add_test(test_lookup_proof SOURCES core/test_lookup_proof.cpp LABELS property)
kvtier_add_test(test_deadline SOURCES core/test_deadline.cpp LABELS unit)
kvtier_add_test(test_cost_model SOURCES core/test_cost_model.cpp LABELS unit tsan)
kvtier_add_test(test_cost_model_split SOURCES core/test_cost_model_split.cpp LABELS property)

# Two processes must print the same keys, equal to the known answers.
if(NOT KVTIER_SANITIZE STREQUAL "thread")
  add_executable(kvtier_kat_keys core/kat_keys_main.cpp)
  target_link_libraries(kvtier_kat_keys PRIVATE kvtier::kvtier)
  target_include_directories(kvtier_kat_keys PRIVATE ${CMAKE_CURRENT_SOURCE_DIR})
  add_test(NAME test_chunker_two_processes
           COMMAND ${CMAKE_COMMAND} -DEXE=$<TARGET_FILE:kvtier_kat_keys>
                   -P ${CMAKE_CURRENT_SOURCE_DIR}/core/two_process_keys.cmake)
  set_tests_properties(test_chunker_two_processes PROPERTIES LABELS unit TIMEOUT 60)
endif()

# Packaging: find_package from an install of this build tree, and add_subdirectory
# of this source tree. Each configures and builds a tiny project (Release build only).
if(KVTIER_SANITIZE STREQUAL "" AND KVTIER_INSTALL)
  # Each consumer links every optional part this build has (kvtier::asio, ...).
  string(REPLACE ";" "," _kvtier_parts_csv "${KVTIER_EXPORTED_PARTS}")
  foreach(mode find_package add_subdirectory)
    add_test(NAME test_consumer_${mode}
             COMMAND ${CMAKE_COMMAND} -DMODE=${mode} -DSOURCE_DIR=${PROJECT_SOURCE_DIR}
                     -DBUILD_DIR=${PROJECT_BINARY_DIR} -DWORK_DIR=${CMAKE_CURRENT_BINARY_DIR}/consumer_${mode}
                     "-DGENERATOR=${CMAKE_GENERATOR}" -DCXX=${CMAKE_CXX_COMPILER} -DBUILD_TYPE=$<CONFIG>
                     "-DPARTS=${_kvtier_parts_csv}"
                     -P ${CMAKE_CURRENT_SOURCE_DIR}/consumers/run_consumer.cmake)
    set_tests_properties(test_consumer_${mode} PROPERTIES LABELS integration TIMEOUT 600)
  endforeach()
endif()

# Paged-KV layouts and the CPU gather/scatter (issue 10).
kvtier_add_test(test_kv_copy SOURCES core/test_kv_copy.cpp LABELS unit)
kvtier_add_test(test_kv_copy_property SOURCES core/test_kv_copy_property.cpp LABELS property)

# The README's property case counts, checked against the tests (tests/core/property_counts.cmake).
add_test(NAME test_property_counts COMMAND ${CMAKE_COMMAND} -DSOURCE_DIR=${PROJECT_SOURCE_DIR}
                                           -P ${CMAKE_CURRENT_SOURCE_DIR}/core/property_counts.cmake)
set_tests_properties(test_property_counts PROPERTIES LABELS unit TIMEOUT 60)
