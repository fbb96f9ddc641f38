#!/usr/bin/env bash
# kvtier's main job: the PCP8 prefill example replaying the hit-heavy stream on the
# embedded (in-process) L2 on a modeled clock (it advances by events, so a run is
# reproducible and takes seconds), in three configurations side by side: recompute
# only, one synchronous L2 instance (at the rate derived from what the reference's
# instance sustained under this load, 0.835 GB/s with T0 included), and the
# rank-partitioned L2 with asynchronous loading. Installs what it needs and builds only the example.
#
# Output: the timing model, one summary row per configuration, then the table of
# all three beside the reference's figures; the last line is the partitioned-async
# run's JSON summary. Per-request logs and the plot land in ${OUT_DIR:-out/main}.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh
build=${KVTIER_BUILD_ROOT:-build}/main
out=${OUT_DIR:-out/main}
mkdir -p "$out"

cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DKVTIER_BUILD_TESTS=OFF -DKVTIER_BUILD_BENCH=OFF \
  -DKVTIER_BUILD_TOOLS=OFF >/dev/null
cmake --build "$build" --target pcp_prefill -j"$(nproc)" >/dev/null
bin=$build/examples/pcp_prefill/pcp_prefill

"$bin" gen-trace --kind hit-heavy --out "$out/hit-heavy.jsonl"
t0_ms=$("$bin" fit-t0 --measured-s 0.40 --tokens 16384 --gbps 10.76)  # the reference's one-point fit
common=(--trace "$out/hit-heavy.jsonl" --l2-model-t0-ms "$t0_ms")

echo "== recompute only (no cache reads)"
"$bin" "${common[@]}" --name recompute --mode recompute --l2 none --out "$out/recompute.jsonl" | tee "$out/recompute.txt"
echo "== one L2 instance, synchronous loads (the naive tier), at 0.835 GB/s sustained per hit with T0 included"
"$bin" "${common[@]}" --name l2_single_sync --mode sync --prime --l2 embedded --l2-model-instances 1 \
  --l2-sustained-gbps 0.835 --out "$out/l2_single_sync.jsonl" --quiet | tee "$out/l2_single_sync.txt"
echo "== eight rank-partitioned L2 instances (10.76 GB/s in all), asynchronous loads"
"$bin" "${common[@]}" --name l2_partitioned_async --mode async --prime --l2 embedded --l2-model-instances 8 \
  --l2-model-gbps 1.345 --out "$out/l2_partitioned_async.jsonl" --quiet | tee "$out/l2_partitioned_async.txt"

echo "== side by side"
"$bin" table "recompute=$out/recompute.txt" "l2_single_sync=$out/l2_single_sync.txt" \
  "l2_partitioned_async=$out/l2_partitioned_async.txt"
if command -v gnuplot >/dev/null; then
  "$bin" plot "$out/replay.png" "recompute=$out/recompute.jsonl" "l2_single_sync=$out/l2_single_sync.jsonl" \
    "l2_partitioned_async=$out/l2_partitioned_async.jsonl" >/dev/null && echo "plot: $out/replay.png"
fi
tail -n 1 "$out/l2_partitioned_async.txt"
