# Compiles bench/gpu/kv_copy_check.cu with nvcc (the CUDA kernels of kvtier::cuda, compile
# check) and runs its `validate` mode: argument checks, the kernel's body run on the host over
# its whole grid for random layouts (bit for bit against the CPU version) and the pinned arena's
# CUDA sources always; the kernel on the device where a GPU exists (it says so where none does).
# -D NVCC, SRC, INCLUDE, ROOT, OUT, ARCH
execute_process(COMMAND ${NVCC} -std=c++20 -O1 -arch=${ARCH} -I${INCLUDE} -I${ROOT} ${SRC} -o ${OUT}
                RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "nvcc failed to compile ${SRC} (exit ${rc})")
endif()
execute_process(COMMAND ${OUT} validate 100 RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "kv_copy_check validate failed (exit ${rc})")
endif()
