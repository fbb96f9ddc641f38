# Included by both consumer projects once kvtier is available (find_package or
# add_subdirectory). KVTIER_PARTS lists the optional parts the tested build has; the
# executable consumer_parts links each as kvtier::<part> and uses it, so a missing or
# misnamed target fails the configure, and a part that does not link fails the build.
set(KVTIER_PARTS "" CACHE STRING "optional kvtier parts to link (uring_tls, openssl, tls, asio, uring, nccl, cuda, mpi)")
string(REPLACE "," ";" _kvtier_parts "${KVTIER_PARTS}")
add_executable(consumer_parts ${CMAKE_CURRENT_LIST_DIR}/main.cpp ${CMAKE_CURRENT_LIST_DIR}/doc_initializers.cpp)
foreach(part IN LISTS _kvtier_parts)
  if(NOT TARGET kvtier::${part})
    message(FATAL_ERROR "kvtier::${part} is not a target (the build has this part)")
  endif()
  string(TOUPPER ${part} upper)
  target_sources(consumer_parts PRIVATE ${CMAKE_CURRENT_LIST_DIR}/${part}.cpp)
  target_link_libraries(consumer_parts PRIVATE kvtier::${part})
  target_compile_definitions(consumer_parts PRIVATE KVTIER_CONSUMER_HAS_${upper}=1)
endforeach()

# A consumer's code builds warning-free: the docs' designated initializers (doc_initializers.cpp)
# must not warn under -Wextra, and in add_subdirectory mode kvtier's own headers are compiled as
# the consumer's (an installed package's headers are system headers, whose warnings GCC hides).
if(CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
  foreach(t consumer consumer_parts)
    target_compile_options(${t} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Werror>)
  endforeach()
endif()
