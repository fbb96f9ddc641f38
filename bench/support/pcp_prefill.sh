# bench/support/pcp_prefill.sh: what the pcp_prefill benches (bench/replay.sh,
# bench/ttft_layers.sh) share, sourced after `here` (the repository root) is set: the binary
# into $bin (PCP_PREFILL, else the first build tree that has one; exits 2 when none), and the
# stream settings REQUESTS (450), SEED (1), CLIENTS (16) into $requests, $seed, $clients.
#
#   here=$(cd "$(dirname "$0")/.." && pwd)
#   source "$here/bench/support/pcp_prefill.sh"
#   find_pcp_prefill replay.sh        # the caller's name, for the error message
find_pcp_prefill() {
  bin=${PCP_PREFILL:-}
  if [[ -z "$bin" ]]; then
    for b in "$here"/build/examples/pcp_prefill/pcp_prefill "$here"/build*/*/examples/pcp_prefill/pcp_prefill \
      "$here"/build-*/examples/pcp_prefill/pcp_prefill; do
      [[ -x "$b" ]] && { bin=$b; break; }
    done
  fi
  [[ -n "$bin" && -x "$bin" ]] || {
    echo "$1: pcp_prefill not built (cmake --build build --target pcp_prefill), or set PCP_PREFILL" >&2
    exit 2
  }
  requests=${REQUESTS:-450}
  seed=${SEED:-1}
  clients=${CLIENTS:-16}
}
