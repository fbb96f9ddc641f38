#!/usr/bin/env bash
# Runs bench_collectives_mpi at W = 2, 4 and 8 (MPI shared memory vs in-process vs memcpy).
#   bench/comm/bench_mpi.sh [build/release] [reps]
# On a machine with fewer cores than W, and as root, OpenMPI needs the two flags below.
set -euo pipefail
build=${1:-build/release}
reps=${2:-7}
flags=(--oversubscribe)
[ "$(id -u)" -eq 0 ] && flags+=(--allow-run-as-root)
for w in 2 4 8; do
  mpiexec -n "$w" "${flags[@]}" "$build/bench/bench_collectives_mpi" "$reps"
done
