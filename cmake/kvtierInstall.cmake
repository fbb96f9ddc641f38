# Install rules and the package config: find_package(kvtier CONFIG REQUIRED)
# gives kvtier::kvtier, plus kvtier::<part> (asio, tls, uring, uring_tls, openssl, ...) where
# those parts were built and their dependencies are found on the consumer side.
set(KVTIER_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/kvtier)

install(TARGETS kvtier EXPORT kvtier-targets FILE_SET HEADERS COMPONENT kvtier)
install(EXPORT kvtier-targets NAMESPACE kvtier:: DESTINATION ${KVTIER_CMAKE_DIR} COMPONENT kvtier)
foreach(part IN LISTS KVTIER_EXPORTED_PARTS)
  if(part STREQUAL "cuda")
    install(TARGETS kvtier_cuda EXPORT kvtier-cuda-targets FILE_SET HEADERS COMPONENT kvtier
            FILE_SET cuda_kernels COMPONENT kvtier)
  else()
    install(TARGETS kvtier_${part} EXPORT kvtier-${part}-targets FILE_SET HEADERS COMPONENT kvtier)
  endif()
  install(EXPORT kvtier-${part}-targets NAMESPACE kvtier:: DESTINATION ${KVTIER_CMAKE_DIR} COMPONENT kvtier)
endforeach()

configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/kvtierConfig.cmake.in
  ${PROJECT_BINARY_DIR}/kvtierConfig.cmake INSTALL_DESTINATION ${KVTIER_CMAKE_DIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/kvtierConfigVersion.cmake
  COMPATIBILITY SameMinorVersion ARCH_INDEPENDENT)
install(FILES ${PROJECT_BINARY_DIR}/kvtierConfig.cmake ${PROJECT_BINARY_DIR}/kvtierConfigVersion.cmake
  DESTINATION ${KVTIER_CMAKE_DIR} COMPONENT kvtier)
install(FILES LICENSE DESTINATION ${CMAKE_INSTALL_DATADIR}/doc/kvtier COMPONENT kvtier)
