#!/usr/bin/env bash
# examples/pcp_prefill/compare_replays.sh: compares two bench/replay.sh output folders (say, before
# and after a change to the engine) configuration by configuration: the summary JSON (the last
# line of NAME.txt), the report lines that hold modeled figures, and every request's record
# (NAME.requests.jsonl). Lines that hold real (wall-clock) time are left out: "replayed in X s
# real" and the real CPU time of store calls. Exit status 0 when every configuration matches.
#
#   SKIP_REAL=1 PCP_PREFILL=old/pcp_prefill OUT_DIR=/tmp/a bench/replay.sh >/dev/null
#   SKIP_REAL=1 PCP_PREFILL=new/pcp_prefill OUT_DIR=/tmp/b bench/replay.sh >/dev/null
#   examples/pcp_prefill/compare_replays.sh /tmp/a /tmp/b
set -euo pipefail
[[ $# -eq 2 && -d "$1" && -d "$2" ]] || { echo "usage: compare_replays.sh BEFORE_DIR AFTER_DIR" >&2; exit 2; }
a=$1 b=$2
modeled() {  # the report without its real-time figures
  sed -e 's/replayed in [0-9.]* s real/replayed in - s real/' -e 's/, [0-9.]* s in store calls (real CPU)//' \
    -e 's/"max_step_io_wall_s": [0-9.e+-]*//' "$1"
}
same=0 differ=0 missing=0
for f in "$a"/*.txt; do
  name=$(basename "$f" .txt)
  if [[ ! -f "$b/$name.txt" ]]; then
    echo "missing   $name (not in $b)"; missing=$((missing + 1)); continue
  fi
  what=()
  [[ "$(tail -n 1 "$f")" == "$(tail -n 1 "$b/$name.txt")" ]] || what+=(summary)
  cmp -s <(modeled "$f") <(modeled "$b/$name.txt") || what+=(report)
  if [[ -f "$a/$name.requests.jsonl" ]]; then
    cmp -s "$a/$name.requests.jsonl" "$b/$name.requests.jsonl" || what+=(requests)
  fi
  if [[ ${#what[@]} -eq 0 ]]; then
    same=$((same + 1))
  else
    differ=$((differ + 1))
    echo "differs   $name: ${what[*]}"
    diff <(tail -n 1 "$f" | tr ',' '\n') <(tail -n 1 "$b/$name.txt" | tr ',' '\n') | sed 's/^/    /' || true
  fi
done
echo "$same identical, $differ different, $missing missing (of $(ls "$a"/*.txt | wc -l) in $a)"
[[ $differ -eq 0 && $missing -eq 0 ]]
