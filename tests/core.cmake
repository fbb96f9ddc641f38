# Core components: chunker, ownership, lookup (with its proof), cost model, and
# the two packaging consumers.
kvtier_add_test(test_chunker SOURCES core/test_chunker.cpp LABELS unit)
kvtier_add_test(test_ownership SOURCES core/test_ownership.cpp LABELS unit)
kvtier_add_test(test_lookup SOURCES core/test_lookup.cpp LABELS unit)
kvtier_add_test(test_lookup_proof SOURCES core/test_lookup_proof.cpp LABELS property)
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
  foreach(mode find_package add_subdirectory)
    add_test(NAME test_consumer_${mode}
             COMMAND ${CMAKE_COMMAND} -DMODE=${mode} -DSOURCE_DIR=${PROJECT_SOURCE_DIR}
                     -DBUILD_DIR=${PROJECT_BINARY_DIR} -DWORK_DIR=${CMAKE_CURRENT_BINARY_DIR}/consumer_${mode}
                     "-DGENERATOR=${CMAKE_GENERATOR}" -DCXX=${CMAKE_CXX_COMPILER} -DBUILD_TYPE=$<CONFIG>
                     -P ${CMAKE_CURRENT_SOURCE_DIR}/consumers/run_consumer.cmake)
    set_tests_properties(test_consumer_${mode} PROPERTIES LABELS integration TIMEOUT 600)
  endforeach()
endif()
