#!/usr/bin/env bash
# Integration tests of kvtier-probe against real redis-server processes on free loopback ports.
#   probe_test.sh PROBE MODE
# MODE: one_server | two_servers | two_servers_uring | cluster | tls | auth | dead_port | black_hole |
#       stalled_server | wrong_server | bad_flags | interrupt
# Servers (and helper listeners) are started here and stopped by PID on exit. Exit 77: skipped.
set -uo pipefail
probe=$1
mode=$2
work=$(mktemp -d /tmp/kvtier-probe-test-XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -CONT "$p" 2>/dev/null; kill "$p" 2>/dev/null; done  # CONT: stalled_server
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null; done
  rm -rf "$work"
}
trap cleanup EXIT
fail() {
  echo "FAIL ($mode): $*" >&2
  [ -f "$work/out" ] && { echo "--- stdout"; cat "$work/out"; } >&2
  [ -f "$work/err" ] && { echo "--- stderr"; cat "$work/err"; } >&2
  exit 1
}
need() { command -v "$1" >/dev/null || { echo "SKIP: $1 not found" >&2; exit 77; }; }

# start_redis PORT: starts redis-server on 127.0.0.1:PORT; 0 once it answers PING.
# Extra server arguments in REDIS_ARGS; redis-cli authenticates with REDISCLI_AUTH.
REDIS_ARGS=()
start_redis() {
  local port=$1 dir="$work/redis-$1"
  mkdir -p "$dir"
  redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir "$dir" \
    --daemonize no --logfile "$dir/log" "${REDIS_ARGS[@]}" &
  local pid=$!
  for _ in $(seq 100); do
    if ! kill -0 "$pid" 2>/dev/null; then  # a port taken: keep why, for fail's message
      wait "$pid" 2>/dev/null; cp "$dir/log" "$work/last_start_failure.log" 2>/dev/null; return 1
    fi
    [ "$(redis-cli -p "$port" ping 2>/dev/null)" = PONG ] && { pids+=("$pid"); return 0; }
    sleep 0.05
  done
  kill "$pid"; wait "$pid" 2>/dev/null
  return 1
}
# start_servers N: N servers on consecutive ports BASE..BASE+N-1; sets BASE. With TLS_ARGS set,
# each server also listens for TLS on TPORT, picked afresh on every attempt (a port free when it was
# picked can be taken before redis binds it, by a concurrent test or an outgoing connection).
TLS_ARGS=()
start_servers() {
  local n=$1 attempt i
  for attempt in $(seq 20); do
    BASE=$(( 20000 + RANDOM % 30000 ))
    if [ "${#TLS_ARGS[@]}" -gt 0 ]; then
      TPORT=$(dead_port) || continue
      [ "$TPORT" -ge "$BASE" ] && [ "$TPORT" -lt $((BASE + n)) ] && continue
      REDIS_ARGS=(--tls-port "$TPORT" "${TLS_ARGS[@]}")
    fi
    local started=()
    for ((i = 0; i < n; i++)); do
      start_redis $((BASE + i)) || break
      started+=($((BASE + i)))
    done
    [ "${#started[@]}" -eq "$n" ] && return 0
    for ((i = ${#pids[@]} - ${#started[@]}; i < ${#pids[@]}; i++)); do kill "${pids[$i]}"; wait "${pids[$i]}" 2>/dev/null; done
    pids=("${pids[@]:0:${#pids[@]}-${#started[@]}}")
  done
  [ -f "$work/last_start_failure.log" ] && { echo "--- last redis-server log"; tail -n 5 "$work/last_start_failure.log"; } >&2
  fail "could not start $n redis-server(s) on consecutive free ports"
}
# A port where nothing listens (checked just before use).
dead_port() {
  local p
  for _ in $(seq 50); do
    p=$(( 20000 + RANDOM % 30000 ))
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then echo "$p"; return 0; fi
  done
  return 1
}
# listener REPLY: a perl TCP listener that accepts and answers every request with REPLY (or, if
# REPLY is empty, never answers); sets LPORT. (Not in $(...): the PID must stay in this shell.)
listener() {
  perl -MIO::Socket::INET -e '
    my $s = IO::Socket::INET->new(LocalAddr => "127.0.0.1", LocalPort => 0, Listen => 16, ReuseAddr => 1) or die;
    $| = 1; print $s->sockport, "\n"; my @keep;
    while (my $c = $s->accept) { push @keep, $c; if (length $ARGV[0]) { my $b; sysread($c, $b, 65536); syswrite($c, $ARGV[0]); } }
  ' "$1" > "$work/listener.port" 2>/dev/null &
  pids+=($!)
  for _ in $(seq 100); do [ -s "$work/listener.port" ] && break; sleep 0.05; done
  LPORT=$(cat "$work/listener.port")
}
run_probe() { "$probe" "$@" >"$work/out" 2>"$work/err"; }
now_ms() { echo $(( $(date +%s%N) / 1000000 )); }
last_json() { tail -n 1 "$work/out"; }

case "$mode" in
  one_server|two_servers|two_servers_uring)
    need redis-server; need redis-cli
    n=1; [ "$mode" != one_server ] && n=2
    extra=()
    if [ "$mode" = two_servers_uring ]; then
      extra=(--transport uring)
      "$probe" --transport uring --url resp://x:1 --instances 1 --chunk-bytes 1 --batch 1 --rounds 1 \
        --timeout-ms 1 2>&1 | grep -q "not available" && { echo "SKIP: built without io_uring" >&2; exit 77; }
    fi
    start_servers "$n"
    for ((i = 0; i < n; i++)); do redis-cli -p $((BASE + i)) set "other:key" keep >/dev/null; done
    # On a loaded machine the batch latencies can come out with no positive slope, and the probe
    # then rightly reports "fit":null; that is noise, not the fit under test: up to 3 runs.
    for attempt in 1 2 3; do
      run_probe --url "resp://127.0.0.1:{rank+$BASE}" --instances "$n" --chunk-bytes 1000000 --batch 4 \
        --rounds 6 --timeout-ms 10000 --bytes-per-token 48400 --prefill-tokens-per-s 52200 --json "${extra[@]}" \
        || fail "exit status $? (expected 0)"
      grep -qF '"fit":null' <<<"$(last_json)" || break
      echo "note: run $attempt: no positive slope (fit null) on this machine's noise; again" >&2
    done
    json=$(last_json)
    case "$json" in \{*\}) ;; *) fail "last stdout line is not a JSON object: $json" ;; esac
    for field in '"aggregate_gbps":' '"per_instance":' '"fit":' '"b_star_gbps":2.526' \
                 '"min_profitable_tokens":' '"instances_needed":' '"batch_sizes":[4,2,1]' \
                 '"t0_interval_s":[' '"b_interval_gbps":[' '"rms_residual_ms":' '"per_size":[' \
                 '"min_profitable_tokens_interval":['; do
      grep -qF -- "$field" <<<"$json" || fail "JSON lacks $field"
    done
    # T0 is never negative (a negative least-squares T0 is clamped and reported as t0_fitted_s).
    grep -q -- '"t0_s":-' <<<"$json" && fail "negative T0 reported: $json"
    grep -q "fit vs median measured: batch 4 .* batch 2 .* batch 1 " "$work/out" \
      || fail "no per-size check of the fit in the output"
    [ "$(grep -o '"rank":' <<<"$json" | wc -l)" -eq "$n" ] || fail "JSON has not $n per-instance entries"
    grep -q "instance $((n - 1)) (127.0.0.1:$((BASE + n - 1)))" "$work/out" || fail "no line for instance $((n - 1))"
    for ((i = 0; i < n; i++)); do
      [ "$(redis-cli -p $((BASE + i)) dbsize)" = 1 ] || fail "instance $i: probe keys left behind (dbsize != 1)"
      [ "$(redis-cli -p $((BASE + i)) get other:key)" = keep ] || fail "instance $i: a foreign key was touched"
    done
    ;;
  tls)
    # rediss:// through both transports (a test CA made here); a CA that did not sign fails.
    need redis-server; need redis-cli; need openssl
    d="$work/pki"; mkdir -p "$d"
    openssl req -x509 -newkey rsa:2048 -nodes -keyout "$d/ca.key" -out "$d/ca.pem" -days 2 -subj /CN=ca \
      >/dev/null 2>&1 || fail "openssl (CA)"
    openssl req -x509 -newkey rsa:2048 -nodes -keyout "$d/other.key" -out "$d/other.pem" -days 2 -subj /CN=other \
      >/dev/null 2>&1 || fail "openssl (other CA)"
    echo "subjectAltName=IP:127.0.0.1" >"$d/san.ext"
    openssl req -newkey rsa:2048 -nodes -keyout "$d/srv.key" -out "$d/srv.csr" -subj /CN=127.0.0.1 >/dev/null 2>&1 &&
      openssl x509 -req -in "$d/srv.csr" -CA "$d/ca.pem" -CAkey "$d/ca.key" -CAcreateserial -out "$d/srv.pem" \
        -days 2 -extfile "$d/san.ext" >/dev/null 2>&1 || fail "openssl (server certificate)"
    TLS_ARGS=(--tls-cert-file "$d/srv.pem" --tls-key-file "$d/srv.key" --tls-ca-cert-file "$d/ca.pem"
              --tls-auth-clients no)
    start_servers 1
    tport=$TPORT
    transports=(asio)
    "$probe" --transport uring --url resp://x:1 --instances 1 --chunk-bytes 1 --batch 1 --rounds 1 \
      --timeout-ms 1 2>&1 | grep -q "not available" || transports+=(uring)
    for t in "${transports[@]}"; do
      run_probe --url "rediss://127.0.0.1:$tport" --tls-ca "$d/ca.pem" --transport "$t" --instances 1 \
        --chunk-bytes 1000000 --batch 4 --rounds 4 --timeout-ms 10000 --json || fail "$t: exit status $? (expected 0)"
      grep -qF '"aggregate_gbps":' <<<"$(last_json)" || fail "$t: JSON lacks aggregate_gbps"
      run_probe --url "rediss://127.0.0.1:$tport" --tls-ca "$d/other.pem" --transport "$t" --instances 1 \
        --chunk-bytes 1000 --batch 1 --rounds 1 --timeout-ms 3000 && fail "$t: a CA that did not sign succeeded"
      grep -q "certificate verify failed" "$work/err" "$work/out" || fail "$t: no OpenSSL reason for the wrong CA"
    done
    [ "${#transports[@]}" -eq 2 ] || echo "note: built without io_uring; TLS checked on asio only" >&2
    ;;
  cluster)
    need redis-server; need redis-cli
    REDIS_ARGS=(--cluster-enabled yes --cluster-config-file nodes.conf --cluster-node-timeout 2000)
    start_servers 3
    redis-cli --cluster create "127.0.0.1:$BASE" "127.0.0.1:$((BASE + 1))" "127.0.0.1:$((BASE + 2))" \
      --cluster-replicas 0 --cluster-yes >"$work/create" 2>&1 || fail "redis-cli --cluster create failed"
    for _ in $(seq 200); do
      ok=0
      for ((i = 0; i < 3; i++)); do
        redis-cli -p $((BASE + i)) cluster info | grep -q cluster_state:ok && ok=$((ok + 1))
      done
      [ "$ok" -eq 3 ] && break
      sleep 0.05
    done
    [ "$ok" -eq 3 ] || fail "cluster not ok"
    run_probe --url "resp+cluster://127.0.0.1:$BASE" --chunk-bytes 200000 --batch 4 --rounds 4 \
      --timeout-ms 10000 --bytes-per-token 48400 --prefill-tokens-per-s 52200 --json || fail "exit status $?"
    grep -q "cluster: all 16384 slots served by 3 masters" "$work/out" || fail "no slot coverage line"
    for ((i = 0; i < 3; i++)); do
      grep -q "master $i (127.0.0.1:" "$work/out" || fail "no line for master $i"
      [ "$(redis-cli -p $((BASE + i)) dbsize)" = 0 ] || fail "master $i: probe keys left behind"
    done
    grep -q '"cluster":{"slots_served":16384,"masters":3}' <<<"$(last_json)" || fail "JSON lacks the cluster object"
    grep -q "masters needed for B > B\*" "$work/out" || fail "no masters-needed line"
    # A slot without a master (as the seed sees it): named, exit 1, nothing written.
    redis-cli -p "$BASE" cluster delslots 0 >/dev/null
    run_probe --url "resp+cluster://127.0.0.1:$BASE" --chunk-bytes 1000 --batch 2 \
      --rounds 1 --timeout-ms 5000
    st=$?
    [ "$st" -eq 1 ] || fail "a slot without a master: exit status $st (expected 1)"
    grep -q "serves 16383 of 16384 slots (slot 0 " "$work/err" || fail "the unserved slot is not named"
    ;;
  auth)
    need redis-server; need redis-cli
    REDIS_ARGS=(--requirepass 'pw:with@odd')
    export REDISCLI_AUTH='pw:with@odd'
    start_servers 1
    run_probe --url "resp://127.0.0.1:$BASE" --instances 1 --chunk-bytes 1000 --batch 2 --rounds 1 --timeout-ms 5000
    st=$?
    [ "$st" -eq 1 ] || fail "without a password: exit status $st (expected 1)"
    grep -q "instance 0 (127.0.0.1:$BASE).*NOAUTH" "$work/err" || fail "message does not pass on NOAUTH"
    # user:password in the URL, percent-encoded (':' and '@' inside the password)
    run_probe --url "resp://default:pw%3Awith%40odd@127.0.0.1:$BASE/2" --instances 1 --chunk-bytes 1000 \
      --batch 2 --rounds 2 --timeout-ms 5000 || fail "with the password: exit status $?"
    [ "$(redis-cli -p "$BASE" -n 2 dbsize)" = 0 ] || fail "probe keys left behind in db 2"
    # The password is never printed: not in the JSON's url, not in any line.
    run_probe --url "resp://default:pw%3Awith%40odd@127.0.0.1:$BASE/2" --instances 1 --chunk-bytes 1000 \
      --batch 2 --rounds 2 --timeout-ms 5000 --json || fail "with the password and --json: exit status $?"
    grep -q -e 'pw%3Awith' -e 'pw:with' "$work/out" "$work/err" && fail "the password was printed"
    grep -q '"url":"resp://default:\*\*\*@127.0.0.1' "$work/out" || fail "the JSON's url is not redacted"
    run_probe --url "resp://u:topsecret@127.0.0.1:99999" --instances 1 --chunk-bytes 1000 --batch 2 \
      --rounds 1 --timeout-ms 5000
    [ $? -eq 2 ] || fail "bad port with a password: exit status (expected 2)"
    grep -q topsecret "$work/err" && fail "a bad URL's message shows its password"
    # The password from KVTIER_PASSWORD or from --password-file, so it is not in argv.
    env KVTIER_PASSWORD='pw:with@odd' "$probe" --url "resp://127.0.0.1:$BASE" --instances 1 --chunk-bytes 1000 \
      --batch 2 --rounds 2 --timeout-ms 5000 >"$work/out" 2>"$work/err" || fail "KVTIER_PASSWORD: exit status $?"
    printf 'pw:with@odd\n' >"$work/pw"
    run_probe --url "resp://127.0.0.1:$BASE" --password-file "$work/pw" --instances 1 --chunk-bytes 1000 \
      --batch 2 --rounds 2 --timeout-ms 5000 || fail "--password-file: exit status $?"
    run_probe --url "resp://127.0.0.1:$BASE" --password-file "$work/nonexistent" --instances 1 \
      --chunk-bytes 1000 --batch 2 --rounds 2 --timeout-ms 5000
    [ $? -eq 2 ] && grep -q "cannot read a password from '$work/nonexistent'" "$work/err" \
      || fail "a missing --password-file is not named"
    ;;
  dead_port)
    port=$(dead_port) || fail "no free port found"
    run_probe --url "resp://127.0.0.1:$port" --instances 1 --chunk-bytes 1000 --batch 2 --rounds 1 \
      --timeout-ms 2000 --json
    st=$?
    [ "$st" -eq 1 ] || fail "exit status $st (expected 1)"
    grep -q "instance 0 (127.0.0.1:$port)" "$work/err" || fail "message does not name the instance"
    grep -qi "refused\|connect" "$work/err" || fail "message does not say the connect failed"
    case "$(last_json)" in \{\"tool\":\"kvtier-probe\",\"ok\":false*instance\ 0*\}) ;;
      *) fail "with --json the last stdout line is not the error object: $(last_json)" ;; esac
    ;;
  black_hole)
    need perl
    listener ""
    port=$LPORT
    start=$(now_ms)
    run_probe --url "resp://127.0.0.1:$port" --instances 1 --chunk-bytes 1000 --batch 2 --rounds 1 \
      --timeout-ms 1000
    st=$?
    elapsed=$(( $(now_ms) - start ))
    [ "$st" -eq 1 ] || fail "exit status $st (expected 1)"
    grep -q "instance 0 (127.0.0.1:$port)" "$work/err" || fail "message does not name the instance"
    grep -qi "deadline\|timed out\|timeout" "$work/err" || fail "message does not say it timed out"
    # Hang detection only (not a timing assertion): the 1 s deadline plus a generous margin.
    [ "$elapsed" -lt 3000 ] || fail "took ${elapsed} ms with --timeout-ms 1000 (limit 3000)"
    ;;
  stalled_server)
    # Instance 1 stops answering mid-run (SIGSTOP: its kernel still accepts connections, so the
    # cleanup's reconnect hangs too). The whole failure path, the failing GET plus the cleanup,
    # must end by one deadline: T plus the short grace, not 2 T. Hang check with a margin of
    # 2.5 s, which a second full T (4 s) would exceed.
    need redis-server; need redis-cli
    start_servers 2
    "$probe" --url "resp://127.0.0.1:{rank+$BASE}" --instances 2 --chunk-bytes 100000 --batch 4 \
      --rounds 1000000 --timeout-ms 4000 >"$work/out" 2>"$work/err" &
    ppid_=$!
    for _ in $(seq 200); do
      [ "$(redis-cli -p "$BASE" dbsize)" -gt 0 ] && [ "$(redis-cli -p $((BASE + 1)) dbsize)" -gt 0 ] && break
      sleep 0.05
    done
    sleep 0.3
    kill -STOP "${pids[1]}"
    start=$(now_ms)
    wait "$ppid_"
    st=$?
    elapsed=$(( $(now_ms) - start ))
    kill -CONT "${pids[1]}"
    [ "$st" -eq 1 ] || fail "exit status $st (expected 1)"
    grep -q "instance 1 (127.0.0.1:$((BASE + 1)))" "$work/err" || fail "message does not name instance 1"
    grep -qi "deadline\|timed out\|timeout" "$work/err" || fail "message does not say it timed out"
    [ "$elapsed" -lt 6500 ] || fail "took ${elapsed} ms after the stall with --timeout-ms 4000 (limit 6500)"
    [ "$(redis-cli -p "$BASE" dbsize)" = 0 ] || fail "the healthy instance's probe keys were left behind"
    ;;
  wrong_server)
    need perl
    listener $'HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n'
    port=$LPORT
    run_probe --url "resp://127.0.0.1:$port" --instances 1 --chunk-bytes 1000 --batch 2 --rounds 1 \
      --timeout-ms 2000
    st=$?
    [ "$st" -eq 1 ] || fail "exit status $st (expected 1)"
    grep -q "instance 0 (127.0.0.1:$port)" "$work/err" || fail "message does not name the instance"
    ;;
  bad_flags)
    check() {  # check EXPECTED_TEXT ARGS...: exit 2 and a message containing EXPECTED_TEXT
      local want=$1; shift
      run_probe "$@"; local st=$?
      [ "$st" -eq 2 ] || fail "'$*': exit status $st (expected 2)"
      grep -q -- "$want" "$work/err" || fail "'$*': message lacks '$want'"
    }
    ok=(--url resp://127.0.0.1:1 --instances 1 --chunk-bytes 10 --batch 1 --rounds 1 --timeout-ms 100)
    check "unknown flag '--bogus'" "${ok[@]}" --bogus
    check "--instances needs a whole number" --url resp://127.0.0.1:1 --instances abc --chunk-bytes 10 \
      --batch 1 --rounds 1 --timeout-ms 100
    check "missing required flag(s): --url" --instances 1 --chunk-bytes 10 --batch 1 --rounds 1 --timeout-ms 100
    check "go together" "${ok[@]}" --bytes-per-token 48400
    check "--transport must be asio or uring" "${ok[@]}" --transport tcp
    check "bad server URL" --url "http://x" --instances 1 --chunk-bytes 10 --batch 1 --rounds 1 --timeout-ms 100
    check "--timeout-ms needs a value" "${ok[@]}" --timeout-ms
    ;;
  interrupt)
    need redis-server; need redis-cli
    start_servers 1
    "$probe" --url "resp://127.0.0.1:$BASE" --instances 1 --chunk-bytes 100000 --batch 4 --rounds 1000000 \
      --timeout-ms 10000 >"$work/out" 2>"$work/err" &
    ppid_=$!
    for _ in $(seq 200); do [ "$(redis-cli -p "$BASE" dbsize)" -gt 0 ] && break; sleep 0.05; done
    sleep 0.3
    kill -INT "$ppid_"
    wait "$ppid_"
    st=$?
    [ "$st" -eq 130 ] || fail "exit status $st after SIGINT (expected 130)"
    [ "$(redis-cli -p "$BASE" dbsize)" = 0 ] || fail "probe keys left behind after SIGINT"
    ;;
  *)
    echo "unknown mode $mode" >&2
    exit 2
    ;;
esac
echo "PASS ($mode)"
