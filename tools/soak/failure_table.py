#!/usr/bin/env python3
"""The failure-mode table (issue 27): W = 2 MPI processes of soak_engine, one redis-server per
rank, a stream with shared prefixes, one fault at a time on one rank's server. Per fault: the
engine's throughput during the fault over the recompute-only throughput of the same stream
(target >= 0.9), the time from the fault's end until hits on that rank's chunks return (target
<= 2 s, or the server's restart time), wrong bytes (0), rank disagreements (0), and what the
logs and the counters say. Writes table.md and table.json under --out.

    tools/soak/failure_table.py --engine build/release/tools/soak/soak_engine --out out/failure_table
    tools/soak/failure_table.py ... --faults blackhole,sigstop --loop readme
    tools/soak/failure_table.py ... --paired   # each fault's base: a recompute-only run right before it
"""
from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from soak_rig import FAULTS, Rig  # noqa: E402
from soak_run import analyze, run, tokens_per_s  # noqa: E402

NAMES = {"dead": "dead (10 s, then back empty)", "restart": "killed and restarted empty",
         "sigstop": "SIGSTOP for 5 s", "blackhole": "black hole (accepts, never answers)",
         "wrongpass": "wrong password (requirepass set)", "tls": "TLS mismatch (server TLS-only)",
         "corrupt": "corrupt values (SETRANGE on every value)", "evict": "evicting (maxmemory 1 MB, allkeys-lru)",
         "slow": "slowed tenfold (throttling proxy)"}


def hits_return_s(lines, fault, chunk_tokens: int, horizon: float):
    """Seconds from the fault's end until a request loads a chunk the faulted rank owns (chunk
    c belongs to rank c mod 2: at least rank + 1 chunks loaded); None if none by the horizon."""
    need = (fault["rank"] + 1) * chunk_tokens
    for x in sorted((x for x in lines if "i" in x and x["rank"] == 0), key=lambda x: x["ts"]):
        if fault["end"] < x["ts"] <= horizon and x["loaded"] >= need:
            return x["ts"] - fault["end"]
    return None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engine", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--faults", default=",".join(FAULTS))
    ap.add_argument("--rank", type=int, default=1, help="the rank whose server fails (1)")
    ap.add_argument("--warm-s", type=float, default=12)
    ap.add_argument("--fault-s", type=float, default=10)
    ap.add_argument("--after-s", type=float, default=12)
    ap.add_argument("--maxmemory", default="16mb")
    ap.add_argument("--loop", default="finished", choices=["finished", "readme", "lookahead"])
    ap.add_argument("--label", default="", help="names the code measured (e.g. main, main+s11-avail)")
    ap.add_argument("--paired", action="store_true",
                    help="a recompute-only run right before each fault's run is that row's base (a loaded "
                         "machine's load moves within minutes)")
    ap.add_argument("engine_args", nargs="*")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    T = 64
    common = ["--loop", a.loop, "--seed", "7", "--prefixes", "8", *a.engine_args]
    total = a.warm_s + a.fault_s + a.after_s
    log = lambda s: print(s, flush=True)
    load0 = os.getloadavg()[0]

    def recompute_only(tag: str) -> float:
        rig = Rig(os.path.join(a.out, tag), 2, a.maxmemory)
        try:
            rig.start()
            base = run(rig, a.engine, ["--mode", "recompute", *common], [], total, log=log)
        finally:
            rig.stop()
        return tokens_per_s(base["lines"], 0, 2.0, total)

    # recompute only, before and after the faults (the machine's load moves): their mean is the base
    first = recompute_only("recompute")
    log(f"table: recompute only: {first:.0f} prompt tokens/s")
    rows = []
    for kind in [k for k in a.faults.split(",") if k]:
        base_tps = recompute_only("recompute_" + kind) if a.paired else None
        if a.paired:
            log(f"table: recompute only, before {kind}: {base_tps:.0f} prompt tokens/s")
        rig = Rig(os.path.join(a.out, kind), 2, a.maxmemory)
        length = 5.0 if kind == "sigstop" else 0.0 if kind == "restart" else a.fault_s
        try:
            rig.start()
            res = run(rig, a.engine, common, [(kind, a.rank, a.warm_s, length)], total, log=log)
        finally:
            rig.stop()
        m = analyze(res, warmup_s=a.warm_s)
        with open(os.path.join(a.out, kind, "requests.jsonl"), "w") as fo:
            fo.writelines(json.dumps(x) + "\n" for x in res["lines"])
        f = res["faults"][0] if res["faults"] else {"start": a.warm_s, "end": a.warm_s, "rank": a.rank, "kind": kind}
        # restart has no length: its "during" is the fault-length window right after it
        during_end = f["end"] if f["end"] - f["start"] >= 1 else f["start"] + a.fault_s
        during = tokens_per_s(res["lines"], 0, f["start"], during_end)
        before = tokens_per_s(res["lines"], 0, 3.0, f["start"])
        back = hits_return_s(res["lines"], f, T, total + 5)
        faulted = [x for x in res["lines"] if x.get("rank") == a.rank]
        whys = []
        for x in faulted:
            w = x.get("why", "")
            if w and f["start"] <= x["ts"] <= during_end + 2 and w.split(":")[0:2] not in [y.split(":")[0:2] for y in whys]:
                whys.append(w)
        end = next((e for e in m["ends"] if e["rank"] == a.rank), {})
        rows.append({"kind": kind, "name": NAMES[kind], "during_tps": during, "before_tps": before,
                     "ratio": during / (base_tps or first), "base_tps": base_tps, "hits_back_s": back,
                     "wrong_bytes": m["wrong_bytes"], "disagreements": m["disagreements"], "hangs": m["hangs"],
                     "requests": m["requests"], "rc": m["rc"], "recoveries": m["recoveries"],
                     "recover_s": m["recover_s"], "logs": whys[:2],
                     "counters": {k: end.get(k) for k in ("loads_cut_short", "store_timeouts", "store_errors",
                                                          "store_corrupt", "save_failures", "agreement_failures",
                                                          "breaker_trips", "down_refusals", "lookups_skipped",
                                                          "saves_skipped")},
                     "corrupted": f.get("corrupted", 0)})
        r = rows[-1]
        log(f"table: {kind}: during {during:.0f} tok/s = {r['ratio']:.2f}x {'its' if a.paired else 'the first'} recompute (before {before:.0f}), hits back "
            f"{'never' if back is None else f'{back:.2f} s'}, wrong {r['wrong_bytes']}, disagreements "
            f"{r['disagreements']}, hangs {r['hangs']}, recoveries {r['recoveries']} {r['recover_s']}")
    last = recompute_only("recompute_after")
    recompute_tps = (first + last) / 2
    log(f"table: recompute only, after: {last:.0f} prompt tokens/s")
    for r in rows:
        r["ratio"] = r["during_tps"] / (r["base_tps"] or recompute_tps)
    load1 = os.getloadavg()[0]
    with open(os.path.join(a.out, "table.json"), "w") as fo:
        json.dump({"label": a.label, "loop": a.loop, "recompute_tps": recompute_tps, "recompute_first_last": [first, last], "load_average": [load0, load1],
                   "rows": rows}, fo, indent=1)
    md = render(rows, recompute_tps, a, load0, load1, (first, last))
    with open(os.path.join(a.out, "table.md"), "w") as fo:
        fo.write(md)
    print(md)
    return 0


def render(rows, recompute_tps, a, load0, load1, first_last) -> str:
    out = [f"Code: {a.label or 'this checkout'}; loop: {a.loop}; fault on rank {a.rank}'s server; recompute only: "
           f"{recompute_tps:.0f} prompt tokens/s (mean of {first_last[0]:.0f} before and {first_last[1]:.0f} after the faults"
           f"{'; each row divided by its own recompute-only run just before it' if a.paired else ''}); load average {load0:.1f} at the start, {load1:.1f} at the end.", "",
           "| fault | during / recompute | tier before the fault | hits back after its end | wrong bytes | "
           "disagreements | hangs | recover() | what the logs and counters say (faulted rank) |",
           "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        back = "never (in the run)" if r["hits_back_s"] is None else f"{r['hits_back_s']:.2f} s"
        c = ", ".join(f"{k} {v}" for k, v in r["counters"].items() if v)
        logs = "; ".join(x[:110].replace("|", "/") for x in r["logs"]) or "(no error words)"
        rec = f"{r['recoveries']}× {sum(r['recover_s']):.1f} s" if r["recoveries"] else "0"
        base = r.get("base_tps") or recompute_tps
        paired = f"; recompute {base:.0f}" if r.get("base_tps") else ""
        out.append(f"| {r['name']} | **{r['ratio']:.2f}** ({r['during_tps']:.0f} tok/s{paired}) | "
                   f"{r['before_tps'] / base:.2f}× | {back} | {r['wrong_bytes']} | {r['disagreements']} | "
                   f"{r['hangs']} | {rec} | {logs}. {c} |")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    sys.exit(main())
