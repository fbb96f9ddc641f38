# The engine connector (issue 20): the lifecycle on threads, its properties and faults.
kvtier_add_test(test_connector SOURCES connector/test_connector.cpp LABELS unit tsan)
kvtier_add_test(test_connector_faults SOURCES connector/test_connector_faults.cpp LABELS unit tsan TIMEOUT 300)
# A tier slower than recomputing (issue 27): loads race recomputing, a slow store is skipped and probed.
kvtier_add_test(test_connector_slow_tier SOURCES connector/test_connector_slow_tier.cpp LABELS unit tsan TIMEOUT 300)
# Exceptions from a store's calls or the data communicator (issue 26): never the end of the process.
kvtier_add_test(test_connector_exceptions SOURCES connector/test_connector_exceptions.cpp LABELS unit tsan TIMEOUT 300)
# Loads that stream by layer group (connector_options::stream_groups).
kvtier_add_test(test_connector_stream SOURCES connector/test_connector_stream.cpp LABELS unit tsan TIMEOUT 300)
# The contract where a review found it broken (issue 26): final reach, slots, agreed settings.
kvtier_add_test(test_connector_contract SOURCES connector/test_connector_contract.cpp LABELS unit tsan)
# What a connector keeps between requests (issue 27's soak): idle staging blocks stay few.
kvtier_add_test(test_connector_memory SOURCES connector/test_connector_memory.cpp LABELS unit tsan)
kvtier_add_test(test_connector_property SOURCES connector/test_connector_property.cpp LABELS property TIMEOUT 600)
# Against real redis-server processes, one per rank; needs the Asio transport.
if(TARGET kvtier::asio)
  kvtier_add_test(test_connector_redis SOURCES connector/test_connector_redis.cpp LABELS integration
                  LIBS kvtier::asio TIMEOUT 120)
endif()
# Across MPI processes (label mpi), one redis-server per rank.
if(COMMAND kvtier_add_mpi_test AND TARGET kvtier::asio)
  kvtier_add_mpi_test(test_connector_mpi SOURCES connector/test_connector_mpi.cpp RANKS 2 TIMEOUT 120
                      LIBS kvtier::asio)
endif()
# The calls an engine with its own schedule needs (load range, prompt length, cap and cancel,
# its own estimator samples, extra agreed words, wait_for_save, wait_local).
kvtier_add_test(test_connector_api SOURCES connector/test_connector_api.cpp LABELS unit tsan)
# Issue 26: random engine call sequences against a reference model, with scripted adversaries
# (connector_model.hpp); 10,000 cases in Release, fewer under the sanitizers (KVTIER_PROPERTY_CASES).
kvtier_add_test(test_connector_model SOURCES connector/test_connector_model.cpp LABELS property tsan TIMEOUT 900)
# The same model with ranks that are MPI processes (label mpi; mpiexec -n 2 and -n 3): what MPI
# cannot survive is left out (gen_options::mpi); KVTIER_MPI_PROPERTY_CASES sets the cases.
if(COMMAND kvtier_add_mpi_test)
  kvtier_add_mpi_test(test_connector_model_mpi SOURCES connector/test_connector_model_mpi.cpp RANKS 2 3 TIMEOUT 300)
endif()
