# Collectives: communicator backends, recording decorator, chunk_broadcast protocol.
kvtier_add_test(test_comm_inproc SOURCES comm/test_inproc.cpp LABELS unit tsan)
kvtier_add_test(test_comm_checked SOURCES comm/test_checked.cpp LABELS unit tsan)
kvtier_add_test(test_chunk_broadcast SOURCES comm/test_chunk_broadcast.cpp LABELS unit tsan)
kvtier_add_test(test_chunk_broadcast_property SOURCES comm/test_chunk_broadcast_property.cpp LABELS property)
# NCCL backend: compiles and links whenever CUDA + NCCL were found; GPU cases skip without a GPU.
if(TARGET kvtier::nccl)
  kvtier_add_test(test_comm_nccl SOURCES comm/test_nccl.cpp LABELS unit LIBS kvtier::nccl)
endif()
