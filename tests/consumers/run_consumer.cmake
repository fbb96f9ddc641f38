# cmake -DMODE=find_package|add_subdirectory -DSOURCE_DIR=<kvtier source>
#       -DBUILD_DIR=<kvtier build tree> -DWORK_DIR=<scratch> -DGENERATOR=<gen>
#       -DCXX=<compiler> -DBUILD_TYPE=<type> [-DPARTS=asio,uring,...] -P run_consumer.cmake
#
# Both consumers build with -Wall -Wextra -Werror (GCC, Clang), consumer_parts with the docs'
# designated initializers (parts/doc_initializers.cpp).
# Both modes also build consumer_parts, which links kvtier::<part> for every optional part
# in PARTS (the parts the tested build has) and uses it; find_package requests each part as a
# component, and a second configure checks that requesting a part that does not exist fails.
#
# find_package:     installs BUILD_DIR into WORK_DIR/prefix, then configures,
#                   builds and runs tests/consumers/find_package against it.
# add_subdirectory: configures, builds and runs tests/consumers/add_subdirectory
#                   with SOURCE_DIR as its kvtier subproject.
foreach(v MODE SOURCE_DIR BUILD_DIR WORK_DIR CXX)
  if(NOT ${v})
    message(FATAL_ERROR "run_consumer.cmake: pass -D${v}=...")
  endif()
endforeach()
if(NOT BUILD_TYPE)
  set(BUILD_TYPE Release)
endif()

function(run what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${what} failed (${rc}):\n${out}\n${err}")
  endif()
  set(last_output "${out}" PARENT_SCOPE)
endfunction()

file(REMOVE_RECURSE ${WORK_DIR})
file(MAKE_DIRECTORY ${WORK_DIR})
set(args -DCMAKE_CXX_COMPILER=${CXX} -DCMAKE_BUILD_TYPE=${BUILD_TYPE} -DKVTIER_PARTS=${PARTS})
if(GENERATOR)
  list(APPEND args -G ${GENERATOR})
endif()

if(MODE STREQUAL "find_package")
  # Install only the library where its install rules carry COMPONENT kvtier, so
  # the test does not need the tools and examples built; else install everything.
  set(component "")
  file(STRINGS ${BUILD_DIR}/cmake_install.cmake kvtier_component REGEX "CMAKE_INSTALL_COMPONENT STREQUAL \"kvtier\"")
  if(kvtier_component)
    set(component --component kvtier)
  endif()
  run("cmake --install" ${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${WORK_DIR}/prefix ${component})
  if(NOT EXISTS ${WORK_DIR}/prefix/include/kvtier/kvtier.hpp)
    message(FATAL_ERROR "install did not put kvtier/kvtier.hpp under ${WORK_DIR}/prefix/include")
  endif()
  # The fresh prefix comes first in the search, so the consumer finds this install.
  list(APPEND args -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix)
elseif(MODE STREQUAL "add_subdirectory")
  list(APPEND args -DKVTIER_SOURCE_DIR=${SOURCE_DIR})
else()
  message(FATAL_ERROR "MODE must be find_package or add_subdirectory")
endif()

run("configure" ${CMAKE_COMMAND} -S ${SOURCE_DIR}/tests/consumers/${MODE} -B ${WORK_DIR}/build ${args})
if(MODE STREQUAL "find_package")
  file(STRINGS ${WORK_DIR}/build/CMakeCache.txt found_dir REGEX "^kvtier_DIR:")
  if(NOT found_dir MATCHES "=${WORK_DIR}/prefix/")
    message(FATAL_ERROR "the consumer found another kvtier: ${found_dir}")
  endif()
endif()
run("build" ${CMAKE_COMMAND} --build ${WORK_DIR}/build)
find_program(consumer consumer PATHS ${WORK_DIR}/build ${WORK_DIR}/build/${BUILD_TYPE} NO_DEFAULT_PATH REQUIRED)
run("consumer" ${consumer})
message(STATUS "${last_output}")
if(NOT last_output MATCHES "consumer: kvtier:[0-9a-f]+:[0-9a-f]+")
  message(FATAL_ERROR "unexpected consumer output: ${last_output}")
endif()

# Every optional part: linked, used, one line each.
find_program(consumer_parts consumer_parts PATHS ${WORK_DIR}/build ${WORK_DIR}/build/${BUILD_TYPE} NO_DEFAULT_PATH REQUIRED)
run("consumer_parts" ${consumer_parts})
message(STATUS "${last_output}")
if(NOT last_output MATCHES "doc initializers: ")
  message(FATAL_ERROR "consumer_parts did not build the docs' designated initializers: ${last_output}")
endif()
string(REPLACE "," ";" parts "${PARTS}")
foreach(part IN LISTS parts)
  if(NOT last_output MATCHES "part ${part}: ok")
    message(FATAL_ERROR "consumer_parts did not use kvtier::${part}: ${last_output}")
  endif()
endforeach()

# A component that does not exist must fail find_package (check_required_components).
if(MODE STREQUAL "find_package")
  execute_process(COMMAND ${CMAKE_COMMAND} -S ${SOURCE_DIR}/tests/consumers/${MODE} -B ${WORK_DIR}/build-missing
                          ${args} -DKVTIER_EXTRA_COMPONENT=no_such_part
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(rc EQUAL 0 OR NOT "${out}${err}" MATCHES "no_such_part")
    message(FATAL_ERROR "find_package(kvtier COMPONENTS no_such_part) did not fail naming it (rc ${rc}):\n${out}\n${err}")
  endif()
endif()
