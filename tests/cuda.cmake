# kvtier::cuda (issue 10): the paged-KV kernels compiled by nvcc in the test command, and their
# validate run (bit-for-bit against the CPU version where a GPU exists). Release tree only.
if(KVTIER_HAS_CUDA AND CUDAToolkit_NVCC_EXECUTABLE AND EXISTS ${CUDAToolkit_NVCC_EXECUTABLE}
   AND KVTIER_SANITIZE STREQUAL "")
  add_test(NAME test_kv_copy_cuda
           COMMAND ${CMAKE_COMMAND} -DNVCC=${CUDAToolkit_NVCC_EXECUTABLE}
                   -DSRC=${PROJECT_SOURCE_DIR}/bench/gpu/kv_copy_check.cu -DINCLUDE=${PROJECT_SOURCE_DIR}/include
                   -DROOT=${PROJECT_SOURCE_DIR} -DOUT=${CMAKE_CURRENT_BINARY_DIR}/kv_copy_check -DARCH=sm_90
                   -P ${CMAKE_CURRENT_SOURCE_DIR}/cuda/nvcc_check.cmake)
  set_tests_properties(test_kv_copy_cuda PROPERTIES LABELS unit TIMEOUT 300)
endif()
