#!/usr/bin/env bash
# kvtier's whole test suite, as CI runs it (.ci/run calls exactly this):
#   1. Release build: every header compiled on its own, every test label (python too:
#      pytest under /usr/bin/python3 on the built module); the `mpi`
#      tests (one process per rank under mpiexec) alone, after the others, so that
#      their ranks are not starved by parallel tests.
#   2. ASan+UBSan build: the unit and property tests (2,000 cases a property: the full
#      10,000 ran in Release; test_resp_properties alone took 110 s of CI's ASan at 10,000).
#   3. TSan build: the concurrent tests (label tsan).
#   4. clang libFuzzer build: the fuzz targets for a bounded time (label fuzz).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh
jobs=${KVTIER_JOBS:-$(nproc)}
root=${KVTIER_BUILD_ROOT:-build}
step() { printf '\n=== %s (%s)\n' "$1" "$(date +%T)"; }
# Every ctest run goes through run_ctest, which tallies its totals for the closing line.
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
passed=0
failed=0
run_ctest() {
  local log="$logs/ctest-$((passed + failed))-$RANDOM.log" rc=0
  ctest "$@" 2>&1 | tee "$log" || rc=$?
  local line total bad
  line=$(grep -E 'tests passed, [0-9]+ tests? failed out of [0-9]+' "$log" | tail -n 1 || true)
  if [ -n "$line" ]; then
    bad=$(sed -E 's/.* ([0-9]+) tests? failed out of ([0-9]+).*/\1/' <<<"$line")
    total=$(sed -E 's/.* failed out of ([0-9]+).*/\1/' <<<"$line")
    passed=$((passed + total - bad))
    failed=$((failed + bad))
  fi
  if [ "$rc" -ne 0 ]; then
    printf '\nkvtier: %d passed, %d failed\n' "$passed" "$failed"
    exit 1
  fi
}

step "release build"
cmake -S . -B "$root/release" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$root/release" -j"$jobs"
cmake --build "$root/release" --target all_verify_interface_header_sets -j"$jobs"
step "release tests"
run_ctest --test-dir "$root/release" --output-on-failure -j"$jobs" -LE mpi
if [ -n "$(ctest --test-dir "$root/release" -N -L mpi | grep 'Test *#')" ]; then
  step "release tests, ranks as processes (mpi)"
  run_ctest --test-dir "$root/release" --output-on-failure -L mpi
fi

step "asan+ubsan build"
cmake -S . -B "$root/asan" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVTIER_SANITIZE=address >/dev/null
cmake --build "$root/asan" -j"$jobs"
step "asan+ubsan tests (unit, property)"
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 KVTIER_PROPERTY_CASES=${KVTIER_ASAN_PROPERTY_CASES:-2000} \
  run_ctest --test-dir "$root/asan" --output-on-failure -j"$jobs" -L 'unit|property'

step "tsan build"
cmake -S . -B "$root/tsan" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVTIER_SANITIZE=thread >/dev/null
cmake --build "$root/tsan" -j"$jobs"
if [ -n "$(ctest --test-dir "$root/tsan" -N -L tsan | grep 'Test *#')" ]; then
  step "tsan tests"
  # Properties among them run fewer cases: TSan makes each case ~10x slower.
  TSAN_OPTIONS=halt_on_error=1 KVTIER_PROPERTY_CASES=${KVTIER_TSAN_PROPERTY_CASES:-300} run_ctest --test-dir "$root/tsan" --output-on-failure -j"$jobs" -L tsan
fi

step "fuzz build (clang, libFuzzer)"
cmake -S . -B "$root/fuzz" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER=clang++ \
  -DKVTIER_FUZZ=ON -DKVTIER_BUILD_BENCH=OFF -DKVTIER_BUILD_EXAMPLES=OFF -DKVTIER_BUILD_TOOLS=OFF >/dev/null
cmake --build "$root/fuzz" -j"$jobs"
if [ -n "$(ctest --test-dir "$root/fuzz" -N -L fuzz | grep 'Test *#')" ]; then
  step "fuzz tests"
  run_ctest --test-dir "$root/fuzz" --output-on-failure -L fuzz
fi
step "all suites passed"
printf 'kvtier: %d passed, %d failed\n' "$passed" "$failed"
