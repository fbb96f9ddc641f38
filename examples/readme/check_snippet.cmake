# cmake -DREADME=README.md -DSOURCE=readme.cpp [-DMUTATE=ON] -P check_snippet.cmake
#
# Fails unless the code block that follows the marker line
#   <!-- snippet: examples/readme/readme.cpp -->
# in README is byte-identical to the lines between "// README-BEGIN" and
# "// README-END" in SOURCE. MUTATE=ON changes one byte of the source region
# first, to show the check catches a one-byte drift.
# Strings only (no CMake lists), so ';' and brackets in C++ survive.
foreach(var README SOURCE)
  if(NOT EXISTS "${${var}}")
    message(FATAL_ERROR "check_snippet: ${var} '${${var}}' does not exist")
  endif()
endforeach()

# The text strictly between the line `begin` and the next line `end` of `text`.
function(between text begin end out what)
  string(FIND "${text}" "${begin}\n" b)
  if(b EQUAL -1)
    message(FATAL_ERROR "check_snippet: ${what} has no line '${begin}'")
  endif()
  string(LENGTH "${begin}\n" n)
  math(EXPR b "${b} + ${n}")
  string(SUBSTRING "${text}" ${b} -1 rest)
  string(FIND "${rest}" "\n${end}\n" e)
  if(e EQUAL -1)
    message(FATAL_ERROR "check_snippet: ${what} has no line '${end}' after '${begin}'")
  endif()
  math(EXPR e "${e} + 1")
  string(SUBSTRING "${rest}" 0 ${e} region)
  set(${out} "${region}" PARENT_SCOPE)
endfunction()

file(READ "${SOURCE}" source_text)
file(READ "${README}" readme_text)
between("${source_text}" "// README-BEGIN" "// README-END" code "${SOURCE}")
between("${readme_text}" "<!-- snippet: examples/readme/readme.cpp -->\n```cpp" "```" block "${README}")
if(MUTATE)
  set(before "${code}")
  string(REPLACE "#include <chrono>\n" "#include <chrono> \n" code "${code}")
  if(code STREQUAL before)
    message(FATAL_ERROR "check_snippet: MUTATE found no '#include <chrono>' line to change")
  endif()
endif()

if(NOT code STREQUAL block)
  # Name the first line that differs, so the fix is obvious.
  string(LENGTH "${code}" nc)
  string(LENGTH "${block}" nb)
  set(line 1)
  set(i 0)
  while(i LESS nc AND i LESS nb)
    string(SUBSTRING "${code}" ${i} 1 a)
    string(SUBSTRING "${block}" ${i} 1 b)
    if(NOT a STREQUAL b)
      break()
    endif()
    if(a STREQUAL "\n")
      math(EXPR line "${line} + 1")
    endif()
    math(EXPR i "${i} + 1")
  endwhile()
  message(FATAL_ERROR "check_snippet: README.md's code block differs from readme.cpp at line ${line}: "
                      "copy the lines between '// README-BEGIN' and '// README-END' of ${SOURCE} "
                      "into the ```cpp block after '<!-- snippet: examples/readme/readme.cpp -->' in ${README}")
endif()
string(LENGTH "${code}" nc)
message(STATUS "check_snippet: README.md's code block matches ${SOURCE} (${nc} bytes)")
