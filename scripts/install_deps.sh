#!/usr/bin/env bash
# Installs the Debian 12 packages kvtier's build, tests, benchmarks and examples
# use (the Python module and its tests: Debian's own /usr/bin/python3 with its pybind11,
# numpy, pytest, torch, mpi4py, and redis-py + hiredis for bench/python/).
# Idempotent: packages already present are not fetched again.
set -euo pipefail
packages=(build-essential cmake pkg-config clang libclang-rt-14-dev
          libboost-dev liburing-dev libxxhash-dev catch2 librapidcheck-dev
          redis-server redis-tools openssl libhiredis-dev libssl-dev gnuplot-nox
          libopenmpi-dev openmpi-bin
          pybind11-dev python3-dev python3-numpy python3-pytest python3-torch python3-mpi4py
          python3-redis python3-hiredis
          libopenblas0-openmp)  # without it Debian's torch runs on the reference BLAS, ~30x slower
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO=sudo
  echo "kvtier: installing ${missing[*]}" >&2
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
# redis-server from the package starts a system instance; the tests start their own
# on free loopback ports and need none running.
