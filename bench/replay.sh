#!/usr/bin/env bash
# bench/replay.sh: replays generated streams through examples/pcp_prefill on the
# timing model (a modeled clock that advances by events: reproducible, seconds per
# run), side by side with the reference's published figures:
#   - the hit-heavy stream in the seven configurations, the single instance's
#     sensitivity rows, a variant primed with the first half of the stream, and
#     three repeats of two configurations;
#   - the long-prompt stream (64k-200k tokens) with recompute, full load and split
#     at 1 instance and at 8 partitioned ones, each beside the model's prediction;
#   - closed-loop saturated throughput, hit-heavy and mixed (about half cached);
#   - a short run on two real redis-server processes (W = 2, one server per rank);
# then draws the plots. The last line of stdout is one JSON object
# {"configs": {...}, "repeat": {...}} with each configuration's summary.
#
#   bench/replay.sh                         # binary from build/, results in out/replay/
#   PCP_PREFILL=build-x/examples/pcp_prefill/pcp_prefill OUT_DIR=/tmp/r bench/replay.sh
#
# Environment: PCP_PREFILL (binary), OUT_DIR, REQUESTS (450), SEED (1), CLIENTS (16, closed loop),
# SKIP_REAL=1 (no redis-server run).
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=support/pcp_prefill.sh
source "$here/bench/support/pcp_prefill.sh"
find_pcp_prefill replay.sh
out=${OUT_DIR:-$here/out/replay}
mkdir -p "$out"

trace="$out/hit-heavy.jsonl"
"$bin" gen-trace --kind hit-heavy --requests "$requests" --seed "$seed" --out "$trace"

# T0 is a calibration: the cost model's one-point fit makes the partitioned hit
# (16k tokens at 10.76 GB/s) take the reference's measured 0.40 s by construction.
t0_ms=$("$bin" fit-t0 --measured-s 0.40 --tokens 16384 --gbps 10.76)
# The single instance as the reference saw it under this load: it sustained
# 0.78-0.89 GB/s per 0.79 GB hit, T0 included. The model keeps T0 apart, so its
# instance rate is 0.79 GB / (hit time - T0), derived in the binary
# (--l2-sustained-gbps; `pcp_prefill instance-gbps` prints it).
rate() { "$bin" instance-gbps --sustained-gbps "$1" --t0-ms "$t0_ms"; }
mid=$(rate 0.835); low=$(rate 0.78); high=$(rate 0.89)
single=(--l2 embedded --l2-model-instances 1 --l2-model-t0-ms "$t0_ms")
parted=(--l2 embedded --l2-model-instances 8 --l2-model-gbps 1.345 --l2-model-t0-ms "$t0_ms")

names=()
run() {  # run NAME ARGS...: one replay; its output in $out/NAME.txt
  local name=$1
  shift
  echo "== $name: $*" >&2
  "$bin" --quiet --name "$name" --out "$out/$name.requests.jsonl" "$@" >"$out/$name.txt" 2>"$out/$name.err" ||
    { cat "$out/$name.err" >&2; exit 1; }
  tail -n 1 "$out/$name.txt" >&2
  names+=("$name=$out/$name.txt")
}

start=$(date +%s)
hh=(--trace "$trace")
run recompute "${hh[@]}" --mode recompute --l2 none
run l1 "${hh[@]}" --mode sync --l2 none --prime --keep-l1
run l2_single_sync "${hh[@]}" --mode sync --prime "${single[@]}" --l2-sustained-gbps 0.835
run l2_single_async "${hh[@]}" --mode async --prime "${single[@]}" --l2-sustained-gbps 0.835
run l2_partitioned_sync "${hh[@]}" --mode sync --prime "${parted[@]}"
run l2_partitioned_async "${hh[@]}" --mode async --prime "${parted[@]}"
run l2_partitioned_async_policy "${hh[@]}" --mode async --policy cost --prime "${parted[@]}"
# Sensitivity of single sync: both ends of the sustained range, the idle best
# (1.71 GB/s, the reference's Table 1 figure), and T0 not paid one request at a
# time (T0 = 0 at the midpoint rate), which measures the naive tier's share.
run l2_single_sync_low "${hh[@]}" --mode sync --prime "${single[@]}" --l2-sustained-gbps 0.78
run l2_single_sync_high "${hh[@]}" --mode sync --prime "${single[@]}" --l2-sustained-gbps 0.89
run l2_single_sync_idle "${hh[@]}" --mode sync --prime "${single[@]}" --l2-model-gbps 1.71
run l2_single_sync_no_serial_t0 "${hh[@]}" --mode sync --prime --l2 embedded --l2-model-instances 1 \
  --l2-model-t0-ms 0 --l2-model-gbps "$mid"
# Primed with the first half of the stream only: prefix sharing decides the hits.
run l2_partitioned_async_primed_half "${hh[@]}" --mode async --prime-first $((requests / 2)) "${parted[@]}"

# Three runs of two configurations.
rep_sync=() rep_async=()
for k in 1 2 3; do
  "$bin" "${hh[@]}" --quiet --mode sync --prime "${single[@]}" --l2-sustained-gbps 0.835 >"$out/repeat_sync_$k.txt" 2>/dev/null
  "$bin" "${hh[@]}" --quiet --mode async --prime "${parted[@]}" >"$out/repeat_async_$k.txt" 2>/dev/null
  rep_sync+=("$out/repeat_sync_$k.txt")
  rep_async+=("$out/repeat_async_$k.txt")
done
join() { local IFS=,; echo "$*"; }

# The long-prompt stream, primed: every prompt is a hit of all its full chunks.
long="$out/long.jsonl"
"$bin" gen-trace --kind long --seed "$seed" --out "$long"
lg=(--trace "$long" --prime --l2-model-t0-ms "$t0_ms")
one=(--l2 embedded --l2-model-instances 1 --l2-model-gbps 1.71)
eight=(--l2 embedded --l2-model-instances 8 --l2-model-gbps 1.345)
run long_recompute --trace "$long" --mode recompute --l2 none
run long_load_1 "${lg[@]}" --mode async "${one[@]}"
run long_split_1 "${lg[@]}" --mode split --estimator-prior model "${one[@]}"
run long_load_8 "${lg[@]}" --mode async "${eight[@]}"
run long_split_8 "${lg[@]}" --mode split --estimator-prior model "${eight[@]}"

# Closed-loop saturated throughput: $clients clients, each sending its next request
# when its last completes; hit-heavy (primed) and mixed (shared half primed).
mixed="$out/mixed.jsonl"
"$bin" gen-trace --kind mixed --requests "$requests" --seed "$seed" --out "$mixed"
run throughput_recompute "${hh[@]}" --closed-loop "$clients" --mode recompute --l2 none
run throughput_partitioned_async "${hh[@]}" --closed-loop "$clients" --mode async --prime "${parted[@]}"
run mixed_throughput_recompute --trace "$mixed" --closed-loop "$clients" --mode recompute --l2 none
run mixed_throughput_partitioned_async --trace "$mixed" --closed-loop "$clients" --mode async --prime-shared \
  "${parted[@]}"
echo "replays took $(( $(date +%s) - start )) s" >&2

# Real sockets: two redis-server processes on free loopback ports, one per rank.
real_note="real-server variant skipped (SKIP_REAL=1)"
if [[ "${SKIP_REAL:-0}" != 1 ]]; then
  if ! command -v redis-server >/dev/null; then
    real_note="real-server variant skipped: redis-server not installed"
  else
    port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
    pids=()
    stop_servers() { for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; done; pids=(); }
    trap stop_servers EXIT
    # Two servers on consecutive free ports; a port free when checked can be taken before redis
    # binds it, so a start that does not answer PING is retried on other ports.
    base=
    for _ in $(seq 1 20); do
      p=$(( 20000 + RANDOM % 30000 ))
      port_free "$p" && port_free $((p + 1)) || continue
      for r in 0 1; do
        redis-server --port $((p + r)) --bind 127.0.0.1 --save '' --appendonly no --maxmemory 2gb \
          --maxmemory-policy allkeys-lru >"$out/redis-$r.log" 2>&1 &
        pids+=($!)
      done
      up=0
      for r in 0 1; do
        for _ in $(seq 1 100); do
          [ "$(redis-cli -p $((p + r)) ping 2>/dev/null)" = PONG ] && { up=$((up + 1)); break; }
          kill -0 "${pids[$r]}" 2>/dev/null || break
          sleep 0.05
        done
      done
      if [ "$up" -eq 2 ]; then base=$p; break; fi
      stop_servers
    done
    [[ -n "$base" ]] || { echo "replay.sh: could not start two redis-servers on free loopback ports" >&2; exit 1; }
    real=(--generate hit-heavy --requests 30 --rate 2 --seed "$seed" --world 2 --payload-scale 0.015625 --quiet)
    url="resp://127.0.0.1:{rank+$base}"
    echo "== real servers ($url), W = 2: recompute, sync and async over real sockets" >&2
    "$bin" "${real[@]}" --mode recompute --l2 none --name real_recompute --out "$out/real_recompute.requests.jsonl" >"$out/real_recompute.txt"
    "$bin" "${real[@]}" --mode sync --prime --l2 "$url" --name real_partitioned_sync \
      --out "$out/real_partitioned_sync.requests.jsonl" >"$out/real_partitioned_sync.txt" 2>"$out/real_partitioned_sync.err"
    "$bin" "${real[@]}" --mode async --prime --l2 "$url" --name real_partitioned_async \
      --out "$out/real_partitioned_async.requests.jsonl" >"$out/real_partitioned_async.txt" 2>"$out/real_partitioned_async.err"
    stop_servers
    trap - EXIT
    real_note="real servers (2 x redis-server on loopback, one per rank, W = 2, 30 requests at 2/s, 194 KB chunks; L2 I/O timed by the wall clock):"
  fi
fi

plot="$out/replay.png"
"$bin" plot "$plot" "recompute=$out/recompute.requests.jsonl" "l2_single_sync=$out/l2_single_sync.requests.jsonl" \
  "l2_partitioned_async=$out/l2_partitioned_async.requests.jsonl" \
  "l2_partitioned_async_policy=$out/l2_partitioned_async_policy.requests.jsonl" >/dev/null || echo "replay.sh: plot failed" >&2
long_plot="$out/long.png"
"$bin" plot "$long_plot" "recompute=$out/long_recompute.requests.jsonl" "load_1=$out/long_load_1.requests.jsonl" \
  "split_1=$out/long_split_1.requests.jsonl" "load_8=$out/long_load_8.requests.jsonl" \
  "split_8=$out/long_split_8.requests.jsonl" >/dev/null || echo "replay.sh: long plot failed" >&2

ttft_of_200k() {  # the TTFT of the 200k-token prompt in a requests file
  grep '"prompt_tokens": 200000,' "$1" | sed 's/.*"ttft_s": \([0-9.e+-]*\).*/\1/' | head -n 1
}

echo
echo "hit-heavy replay: $requests requests on the timing model at the reference's figures"
echo "  T0 = $t0_ms ms: a CALIBRATION (the one-point fit makes the partitioned 16k hit take 0.40 s), not a prediction"
echo "  single instance: $mid GB/s (midpoint, 0.835 GB/s sustained per hit with T0 included, as the reference"
echo "  measured it under this load); sensitivity rows: $low GB/s (0.78 sustained), $high GB/s (0.89), and 1.71 GB/s"
echo "  (idle best, the reference's Table 1 figure); partitioned: 8 x 1.345 = 10.76 GB/s"
echo "  hit tok: an INPUT after priming with the whole trace (every full chunk stored), fixed by the chunking:"
echo "  the mean of floor((n-1)/256)*256/n over the prompts. The reference's 98.5% is lower for reasons the replay"
echo "  does not model; the generator and chunk size are not tuned to match it. l2_partitioned_async_primed_half"
echo "  is primed with the first half of the stream only, so prefix sharing decides its hits."
echo "  The sync engine looks up and loads one request at a time inside the step, each paying T0, as a naive tier"
echo "  does; l2_single_sync_no_serial_t0 removes that serial T0 to show its share of the gap."
sed -n '/^timing model/,/^  broadcast/p' "$out/l2_single_sync.txt"
echo
s=$(sed -n 's/.*"ttft_p99_s": \([0-9.e+-]*\).*/\1/p' "$out/l2_single_sync.txt" | tail -n 1)
n=$(sed -n 's/.*"ttft_p99_s": \([0-9.e+-]*\).*/\1/p' "$out/l2_single_sync_no_serial_t0.txt" | tail -n 1)
a=$(sed -n 's/.*"ttft_p99_s": \([0-9.e+-]*\).*/\1/p' "$out/l2_partitioned_async.txt" | tail -n 1)
awk -v s="$s" -v n="$n" -v a="$a" 'BEGIN { if (s > a) printf "share of the single-sync / partitioned-async p99 gap explained by serial T0: %.0f%% (p99 %.2f -> %.2f s without it)\n", 100 * (s - n) / (s - a), s, n }'
echo
echo "long stream, the 200k-token prompt (model: recompute 3.83 s, load 5.99 s at 1 instance, split 2.42 s):"
for r in long_recompute long_load_1 long_split_1 long_load_8 long_split_8; do
  printf '  %-16s %s s\n' "$r" "$(ttft_of_200k "$out/$r.requests.jsonl")"
done
echo
echo "$real_note"
if [[ -f "$out/real_partitioned_async.txt" && "${SKIP_REAL:-0}" != 1 ]]; then
  "$bin" table "real_recompute=$out/real_recompute.txt" "real_partitioned_sync=$out/real_partitioned_sync.txt" \
    "real_partitioned_async=$out/real_partitioned_async.txt" | sed -n '1,4p'
  tail -n 1 "$out/real_partitioned_async.err" || true
fi
echo
echo "plots: $plot (hit-heavy), $long_plot (long stream: split vs load vs recompute)   per-request logs: $out/*.requests.jsonl"
echo
"$bin" table "${names[@]}" "repeat:l2_single_sync=$(join "${rep_sync[@]}")" \
  "repeat:l2_partitioned_async=$(join "${rep_async[@]}")"
