# cmake -DSOURCE_DIR=<kvtier source> -DBINARY_DIR=<a Release build tree with kvtier_python built>
#       -DWORK_DIR=<scratch> -DCXX=<compiler> [-DGENERATOR=<gen>] [-DPYTHON=<python3>] -P readme_install.cmake
#
# The newcomer's install path, run as README.md writes it (test readme_install): the commands of
# the README's "## Install" section are read from the README itself, not copied here, so a README
# that drifts from what works fails this test.
#  1. The first ```sh block (the lean build: configure, then install) runs with `build` and
#     `/opt/kvtier` replaced by scratch directories; the install must hold the headers and the
#     package, and no Python files (the module was never built there).
#  2. tests/consumers/find_package is configured against that prefix, built and run.
#  3. The second ```sh block (the Python module) runs against BINARY_DIR, where the module is
#     already built (its build command is then a no-op), into a second prefix, and its import
#     line must print the version.
foreach(v SOURCE_DIR BINARY_DIR WORK_DIR CXX)
  if(NOT ${v})
    message(FATAL_ERROR "readme_install.cmake: pass -D${v}=...")
  endif()
endforeach()
file(REMOVE_RECURSE ${WORK_DIR})
file(MAKE_DIRECTORY ${WORK_DIR})

file(READ ${SOURCE_DIR}/README.md readme)
string(REPLACE ";" "<semicolon>" readme "${readme}")  # no CMake list splits inside a command
string(FIND "${readme}" "\n## Install\n" at)
if(at EQUAL -1)
  message(FATAL_ERROR "README.md has no '## Install' section")
endif()
string(SUBSTRING "${readme}" ${at} -1 install_section)
string(FIND "${install_section}" "\n## " next)  # the section ends at the next heading
string(SUBSTRING "${install_section}" 1 -1 rest)
string(FIND "${rest}" "\n## " next)
if(NOT next EQUAL -1)
  string(SUBSTRING "${rest}" 0 ${next} install_section)
endif()
string(REGEX MATCHALL "```sh\n[^`]*```" blocks "${install_section}")
list(LENGTH blocks n)
if(NOT n EQUAL 2)
  message(FATAL_ERROR "README.md's Install section has ${n} ```sh blocks, expected 2 (the library, the Python module)")
endif()

# Runs each command line of a block with sh, after the substitutions; fails naming the line.
function(run_block block build_dir prefix)
  string(REGEX REPLACE "^```sh\n" "" block "${block}")
  string(REGEX REPLACE "```$" "" block "${block}")
  string(REPLACE "-B build " "-B ${build_dir} " block "${block}")
  string(REPLACE "--build build " "--build ${build_dir} " block "${block}")
  string(REPLACE "--install build " "--install ${build_dir} " block "${block}")
  string(REPLACE "/opt/kvtier" "${prefix}" block "${block}")
  string(REPLACE "/usr/bin/python3" "${PYTHON}" block "${block}")
  string(REPLACE "\n" ";" lines "${block}")
  foreach(line IN LISTS lines)
    if(line STREQUAL "")
      continue()
    endif()
    string(REPLACE "<semicolon>" ";" line "${line}")
    message(STATUS "readme_install: ${line}")
    execute_process(COMMAND sh -c "${line}" WORKING_DIRECTORY ${SOURCE_DIR}
                    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
    if(NOT rc EQUAL 0)
      message(FATAL_ERROR "README.md's install command failed (${rc}): ${line}\n${out}\n${err}")
    endif()
    set(last_output "${out}" PARENT_SCOPE)
  endforeach()
endfunction()
if(NOT PYTHON)
  set(PYTHON /usr/bin/python3)
endif()

# 1. The library, lean.
list(GET blocks 0 lib_block)
run_block("${lib_block}" ${WORK_DIR}/lean ${WORK_DIR}/prefix)
foreach(f include/kvtier/kvtier.hpp include/kvtier/connector.hpp lib/cmake/kvtier/kvtierConfig.cmake)
  if(NOT EXISTS ${WORK_DIR}/prefix/${f})
    message(FATAL_ERROR "the README's install did not put ${f} under the prefix")
  endif()
endforeach()
file(GLOB_RECURSE stray_python ${WORK_DIR}/prefix/*.py)
if(stray_python)
  message(FATAL_ERROR "the lean install put Python files without the module: ${stray_python}")
endif()

# 2. A consumer finds it.
set(args -DCMAKE_CXX_COMPILER=${CXX} -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix)
if(GENERATOR)
  list(APPEND args -G ${GENERATOR})
endif()
foreach(step configure build)
  if(step STREQUAL configure)
    set(cmd ${CMAKE_COMMAND} -S ${SOURCE_DIR}/tests/consumers/find_package -B ${WORK_DIR}/consumer ${args})
  else()
    set(cmd ${CMAKE_COMMAND} --build ${WORK_DIR}/consumer --target consumer)
  endif()
  execute_process(COMMAND ${cmd} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "the find_package consumer's ${step} failed (${rc}):\n${out}\n${err}")
  endif()
endforeach()
find_program(consumer consumer PATHS ${WORK_DIR}/consumer ${WORK_DIR}/consumer/Release NO_DEFAULT_PATH REQUIRED)
execute_process(COMMAND ${consumer} RESULT_VARIABLE rc OUTPUT_VARIABLE out)
if(NOT rc EQUAL 0 OR NOT out MATCHES "consumer: kvtier:[0-9a-f]+:[0-9a-f]+")
  message(FATAL_ERROR "the consumer of the README's install failed (${rc}): ${out}")
endif()

# 3. The Python module.
list(GET blocks 1 py_block)
run_block("${py_block}" ${BINARY_DIR} ${WORK_DIR}/py-prefix)
if(NOT last_output MATCHES "^[0-9]+\\.[0-9]+\\.[0-9]+")
  message(FATAL_ERROR "the README's Python import line printed '${last_output}', not a version")
endif()
message(STATUS "readme_install: the library and the Python module install and import as the README says")
