#!/usr/bin/env bash
# bench/ttft_layers.sh: layer-by-layer loading against whole-chunk loading in
# examples/pcp_prefill (--load-granularity), on streams where the suffix to compute is large,
# at the main job's partitioned tier (8 x 1.345 GB/s, T0 fitted as bench/replay.sh does):
#   - primed-half: the hit-heavy stream, primed with its first half (prefix sharing decides
#     the second half's hits: often only the system prompt);
#   - mixed: questions about half of each prompt, the shared halves primed; open loop at the
#     trace's rate, the same with 12 layers instead of 3, and closed loop (16 clients, saturated).
# Each in three modes, one after the other on the same stream: chunk (the baseline: compute
# after the whole load), layer (layer l once layer group l of every loaded chunk is in the
# pages; whole-chunk fetches, what remote_store does: only the moves overlap compute) and
# layer-streamed (group-major ranged reads, modeled here on the embedded tier: the fetch overlaps
# compute too; pcp_prefill runs it for real with --l2 redis://). Each row
# has the replay's TTFT p50 and p99 beside the closed-form prediction of the timing model
# (timing_model::predicted_ttft_s: each request alone) and the ratio to chunk. Modeled clock:
# the figures are reproducible and do not depend on the machine's load (printed anyway). A
# few seconds per replay, well under a minute in all. The last line is one JSON object.
#
#   bench/ttft_layers.sh                            # binary from build*/, results in out/ttft_layers/
#   PCP_PREFILL=build/release/examples/pcp_prefill/pcp_prefill OUT_DIR=/tmp/t bench/ttft_layers.sh
#
# Environment: PCP_PREFILL (binary), OUT_DIR, REQUESTS (450), SEED (1), CLIENTS (16).
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=support/pcp_prefill.sh
source "$here/bench/support/pcp_prefill.sh"
find_pcp_prefill ttft_layers.sh
out=${OUT_DIR:-$here/out/ttft_layers}
mkdir -p "$out"
load_before=$(cut -d' ' -f1-3 /proc/loadavg)

hh="$out/hit-heavy.jsonl" mixed="$out/mixed.jsonl"
"$bin" gen-trace --kind hit-heavy --requests "$requests" --seed "$seed" --out "$hh"
"$bin" gen-trace --kind mixed --requests "$requests" --seed "$seed" --out "$mixed"
t0_ms=$("$bin" fit-t0 --measured-s 0.40 --tokens 16384 --gbps 10.76)
parted=(--l2 embedded --l2-model-instances 8 --l2-model-gbps 1.345 --l2-model-t0-ms "$t0_ms" --mode async)

streams=(primed_half mixed mixed_12_layers mixed_closed_loop)
declare -A args=(
  [primed_half]="--trace $hh --prime-first $((requests / 2))"
  [mixed]="--trace $mixed --prime-shared"
  [mixed_12_layers]="--trace $mixed --prime-shared --kv-layers 12"
  [mixed_closed_loop]="--trace $mixed --prime-shared --closed-loop $clients"
)
modes=(chunk layer layer-streamed)
field() { sed -n "s/.*\"$2\": \([0-9.e+-]*\).*/\1/p" <<<"$1"; }

start=$(date +%s)
declare -A p50 p99 e50 e99 errs
for s in "${streams[@]}"; do
  for m in "${modes[@]}"; do
    name="${s}_$m"
    # shellcheck disable=SC2086  # the stream's arguments are words
    "$bin" --quiet --name "$name" --out "$out/$name.requests.jsonl" ${args[$s]} "${parted[@]}" \
      --load-granularity "$m" >"$out/$name.txt" 2>"$out/$name.err" || { cat "$out/$name.err" >&2; exit 1; }
    line=$(sed -n 's/^ttft_model //p' "$out/$name.txt")
    [[ -n "$line" ]] || { echo "ttft_layers.sh: no ttft_model line in $out/$name.txt" >&2; exit 1; }
    p50[$name]=$(field "$line" ttft_p50_s) p99[$name]=$(field "$line" ttft_p99_s)
    e50[$name]=$(field "$line" predicted_p50_s) e99[$name]=$(field "$line" predicted_p99_s)
    errs[$name]=$(field "$(tail -n 1 "$out/$name.txt")" errors)
  done
done
took=$(($(date +%s) - start))

echo "TTFT by load granularity: pcp_prefill on the timing model, W = 8, partitioned L2 (8 x 1.345 GB/s,"
echo "T0 = $t0_ms ms fitted), R = 52.2k tokens/s, 3 layers unless said (the paged cache's --kv-layers,"
echo "one layer group each). predicted: the closed form for each request alone (no queue), percentiles"
echo "over the requests. layer-streamed is modeled here (the embedded tier; it runs for real on a resp:// L2)."
echo "ratio: to chunk on the same stream, measured (predicted). Modeled seconds; $requests requests per stream."
printf '%-18s %-15s %9s %9s %9s %9s %17s %17s %6s\n' stream mode "p50 s" "pred p50" "p99 s" "pred p99" \
  "p50 / chunk" "p99 / chunk" errors
json_rows=()
for s in "${streams[@]}"; do
  base="${s}_chunk"
  for m in "${modes[@]}"; do
    name="${s}_$m"
    r50=$(awk -v a="${p50[$name]}" -v b="${p50[$base]}" 'BEGIN { printf "%.3f", a / b }')
    r99=$(awk -v a="${p99[$name]}" -v b="${p99[$base]}" 'BEGIN { printf "%.3f", a / b }')
    q50=$(awk -v a="${e50[$name]}" -v b="${e50[$base]}" 'BEGIN { printf "%.3f", a / b }')
    q99=$(awk -v a="${e99[$name]}" -v b="${e99[$base]}" 'BEGIN { printf "%.3f", a / b }')
    printf '%-18s %-15s %9.3f %9.3f %9.3f %9.3f %8sx (%5sx) %8sx (%5sx) %6s\n' "$s" "$m" "${p50[$name]}" \
      "${e50[$name]}" "${p99[$name]}" "${e99[$name]}" "$r50" "$q50" "$r99" "$q99" "${errs[$name]}"
    json_rows+=("{\"stream\": \"$s\", \"mode\": \"$m\", \"ttft_p50_s\": ${p50[$name]}, \"predicted_p50_s\": ${e50[$name]}, \"ttft_p99_s\": ${p99[$name]}, \"predicted_p99_s\": ${e99[$name]}, \"p50_ratio_to_chunk\": $r50, \"p99_ratio_to_chunk\": $r99, \"errors\": ${errs[$name]}}")
  done
done
load_after=$(cut -d' ' -f1-3 /proc/loadavg)
echo "replays took $took s real; load average before $load_before, after $load_after (modeled figures do not depend on it)"
echo "per-request logs: $out/*.requests.jsonl"
rows=$(IFS=,; echo "${json_rows[*]}")
echo "{\"bench\": \"ttft_layers\", \"t0_ms\": $t0_ms, \"requests\": $requests, \"rows\": [$rows]}"
