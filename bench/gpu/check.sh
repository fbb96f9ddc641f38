#!/usr/bin/env bash
# bench/gpu/check.sh: kvtier's GPU check, for a machine with one NVIDIA GPU and CUDA + NCCL
# under /usr/local/cuda. Builds the NCCL backend (target kvtier::nccl) and gpu_check, then
#   1. runs the chunk_broadcast load protocol end to end on a one-rank NCCL communicator
#      (16 chunks of 12.4 MB in device memory, every mode, bytes verified), and
#   2. measures host-to-device bandwidth for 12.4 MB chunks from pinned and from pageable
#      host memory in the same run;
#   2b. checks an adopted (engine-owned) NCCL communicator on the engine's stream: a 200 ms
#      broadcast queued behind 600 ms of engine work succeeds (its budget starts when it
#      starts); a timeout never aborts the engine's communicator (the engine then runs its
#      own all-reduce on it and destroys it); wait_event bounds the enqueue-only form; the
#      sources_ready hook (order_after) orders the moves after the stream filling the
#      sources ("adopted: ..." lines, "adopted_ok" in the JSON);
#   3. compiles bench/gpu/kv_copy_check.cu with nvcc and compares the paged-KV gather/scatter
#      kernels bit for bit with the CPU version over random layouts, then times them on 12.4 MB
#      chunks (vLLM MLA bf16/fp8, FlashAttention NHD/HND) against cudaMemcpyAsync of the same
#      bytes (from mapped pinned memory: target >= 0.8x of a pinned cudaMemcpyAsync).
# Prints the figures; the last line is gpu_check's JSON. Finishes well under 5 minutes.
#
#   bash bench/gpu/check.sh            # build dir: build-gpu (KVTIER_GPU_BUILD overrides)
# CI never runs this; exit status: 0 ok, 1 a check failed, 2 no CUDA device.
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${KVTIER_GPU_BUILD:-build-gpu}
reps=${KVTIER_GPU_REPS:-15}
cuda=${CUDA_HOME:-/usr/local/cuda}
t0=$(date +%s)

echo "== kvtier GPU check ($(date -u +%FT%TZ))"
if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
else
  echo "nvidia-smi not found"
fi

echo "== build"
log=$(mktemp)
bin=""
# The CMake route builds gpu_check against the kvtier::nccl target; the direct compile is
# the fallback for a bare machine (no xxHash or CMake): the collectives need neither.
if command -v cmake >/dev/null 2>&1 &&
   cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DKVTIER_BUILD_TESTS=OFF -DKVTIER_BUILD_EXAMPLES=OFF \
         -DKVTIER_BUILD_TOOLS=OFF -DKVTIER_INSTALL=OFF >"$log" 2>&1 &&
   grep -q "CUDA + NCCL: found" "$log" &&
   timeout 180 cmake --build "$build" --target gpu_check -j"$(nproc)" >>"$log" 2>&1; then
  bin=$(find "$build" -type f -name gpu_check -perm -u+x | head -n1)
  echo "built with CMake: $bin"
else
  echo "CMake build unavailable or failed (last lines below); compiling directly"
  tail -n 5 "$log" || true
  mkdir -p "$build"
  bin="$build/gpu_check"
  # find fails on a search root that does not exist (e.g. $cuda/lib); under set -e and
  # pipefail that would end the script here, so the lookups may fail and print nothing.
  ncclinc=$(dirname "$( (find "$cuda"/include "$cuda"/targets /usr/include -name nccl.h 2>/dev/null || true) | head -n1)")
  nccllib=$(dirname "$( (find "$cuda"/lib64 "$cuda"/lib "$cuda"/targets /usr/lib -name 'libnccl.so*' 2>/dev/null || true) | head -n1)")
  g++ -std=c++20 -O2 -Iinclude -I"$cuda/include" -I"$ncclinc" bench/gpu/gpu_check.cpp \
      -L"$cuda/lib64" -L"$nccllib" -Wl,-rpath,"$cuda/lib64" -Wl,-rpath,"$nccllib" -lnccl -lcudart -pthread -o "$bin"
  echo "built directly: $bin"
fi
rm -f "$log"
echo "build took $(( $(date +%s) - t0 )) s"

echo "== run"
set +e
timeout 240 "$bin" "$reps"
rc=$?
set -e

# 3. The paged-KV kernels (kvtier/cuda/kv_copy.cuh): bit for bit against the CPU version over
#    random layouts, then 12.4 MB chunks against cudaMemcpyAsync (pinned, pageable, D2D).
echo "== paged-KV gather/scatter kernels (kv_copy_check)"
kbin="$build/kv_copy_check"
arch=sm_90
if [ "$rc" -ne 2 ]; then arch=native; fi  # the lent GPU's own architecture
krc=0
if "$cuda/bin/nvcc" -std=c++20 -O2 -arch="$arch" -Iinclude -I. bench/gpu/kv_copy_check.cu -o "$kbin"; then
  set +e
  if [ "$rc" -eq 2 ]; then
    echo "no CUDA device: running only the checks that need none; the kernel comparison and timings need a GPU"
    timeout 120 "$kbin" validate
  else
    timeout 240 "$kbin" bench "$reps"
  fi
  krc=$?
  set -e
else
  echo "nvcc failed to compile bench/gpu/kv_copy_check.cu"
  krc=1
fi
echo "== done in $(( $(date +%s) - t0 )) s, gpu_check exit $rc, kv_copy_check exit $krc"
if [ "$rc" -eq 0 ] && [ "$krc" -ne 0 ]; then rc=1; fi
if [ "$rc" -eq 2 ] && [ "$krc" -ne 0 ]; then rc=1; fi
exit $rc
