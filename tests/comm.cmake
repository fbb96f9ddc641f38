# Collectives: communicator backends, recording decorator, chunk_broadcast protocol.
kvtier_add_test(test_comm_inproc SOURCES comm/test_inproc.cpp LABELS unit tsan)
kvtier_add_test(test_comm_checked SOURCES comm/test_checked.cpp LABELS unit tsan)
kvtier_add_test(test_chunk_broadcast SOURCES comm/test_chunk_broadcast.cpp LABELS unit tsan)
kvtier_add_test(test_broadcast_group SOURCES comm/test_broadcast_group.cpp LABELS unit tsan)
kvtier_add_test(test_chunk_broadcast_property SOURCES comm/test_chunk_broadcast_property.cpp LABELS property)
# NCCL backend: compiles and links whenever CUDA + NCCL were found; GPU cases skip without a GPU.
if(TARGET kvtier::nccl)
  kvtier_add_test(test_comm_nccl SOURCES comm/test_nccl.cpp LABELS unit LIBS kvtier::nccl)
endif()
kvtier_add_test(test_communicator SOURCES comm/test_communicator.cpp LABELS unit)
kvtier_add_test(test_nccl_policy SOURCES comm/test_nccl_policy.cpp LABELS unit)
kvtier_add_test(test_deployment_check SOURCES comm/test_deployment_check.cpp LABELS unit)
kvtier_add_test(test_comm_conformance SOURCES comm/test_comm_conformance.cpp LABELS unit tsan)
# MPI backend, one process per rank (label mpi). The oversubscribe and run-as-root
# flags let 4 ranks run on a 2-core CI machine as root; users run plain `mpiexec -n W`.
if(TARGET kvtier::mpi AND KVTIER_SANITIZE STREQUAL "")
  function(kvtier_add_mpi_test name)
    cmake_parse_arguments(T "" "RANKS;TIMEOUT" "SOURCES;LIBS" ${ARGN})
    add_executable(${name} ${T_SOURCES})
    target_link_libraries(${name} PRIVATE Catch2::Catch2 rapidcheck kvtier::mpi ${T_LIBS})
    target_include_directories(${name} PRIVATE ${CMAKE_CURRENT_SOURCE_DIR})
    add_test(NAME ${name} COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${T_RANKS} --oversubscribe
                                  --allow-run-as-root ${MPIEXEC_PREFLAGS} $<TARGET_FILE:${name}> ${MPIEXEC_POSTFLAGS})
    set_tests_properties(${name} PROPERTIES LABELS mpi TIMEOUT ${T_TIMEOUT} PROCESSORS ${T_RANKS})
  endfunction()
  kvtier_add_mpi_test(test_comm_mpi SOURCES comm/test_comm_mpi.cpp RANKS 4 TIMEOUT 240)
  kvtier_add_mpi_test(test_comm_mpi_recovery SOURCES comm/test_comm_mpi_recovery.cpp RANKS 3 TIMEOUT 120)
endif()
# Bootstrap over a real redis-server (the RESP adapter; the MPI one is in test_comm_mpi).
if(TARGET kvtier::asio)
  kvtier_add_test(test_bootstrap_resp SOURCES comm/test_bootstrap_resp.cpp LABELS integration LIBS kvtier::asio TIMEOUT 60)
endif()
