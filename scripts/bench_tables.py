#!/usr/bin/python3
"""Records benchmark runs and generates the tables of docs/benchmarks.md from them.

Every benchmark in bench/ prints one JSON object as its last line. `record` runs one, keeps that
line, adds where and when it ran (machine, date, 1-minute load) and appends it to
bench/results/<bench>.jsonl. Without a command, the script rewrites every table of
docs/benchmarks.md that sits between `<!-- table: <bench> -->` and `<!-- end table -->` from
those files; `--check` only compares (exit 1 and a diff when a table differs), which is what the
ctest `bench_tables` runs.

    python3 scripts/bench_tables.py record bench_chunker -- build/release/bench/bench_chunker --reps 5
    python3 scripts/bench_tables.py            # refresh the tables
    python3 scripts/bench_tables.py --check    # exit 1 when they differ from the results

Standard library only.
"""
import argparse
import datetime
import difflib
import json
import os
import platform
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TABLE = re.compile(r"(<!-- table: ([a-z0-9_]+) -->\n)(.*?)(<!-- end table -->)", re.S)


# ---------------------------------------------------------------- recording

def machine():
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return "%s, %d CPUs" % (model, os.cpu_count() or 1)


def bench_load(js):
    """The 1-minute load the benchmark reported itself, under any of the names benches use."""
    for name in ("loadavg_1m", "load_average"):
        if isinstance(js.get(name), (int, float)):
            return float(js[name])
    if isinstance(js.get("loadavg"), list) and js["loadavg"]:
        return float(js["loadavg"][0])
    return None


def record(args):
    if not args.command:
        sys.exit("bench_tables.py record: give the command after --")
    load_start = os.getloadavg()[0]
    proc = subprocess.run(args.command, stdout=subprocess.PIPE, text=True)
    sys.stdout.write(proc.stdout)
    lines = [l for l in proc.stdout.splitlines() if l.strip()]
    if proc.returncode != 0 or not lines:
        sys.exit("bench_tables.py record: %s exited %d; nothing recorded" % (args.command[0], proc.returncode))
    try:
        js = json.loads(lines[-1])
    except json.JSONDecodeError as e:
        sys.exit("bench_tables.py record: the last line is not JSON (%s): %s" % (e, lines[-1][:200]))
    load = bench_load(js)
    js["run"] = {
        "machine": machine(),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "loadavg_1m": round(load if load is not None else os.getloadavg()[0], 2),
        "loadavg_1m_start": round(load_start, 2),
        "command": " ".join(args.command),
    }
    if args.note:
        js["run"]["note"] = args.note
    path = os.path.join(args.results, args.bench + ".jsonl")
    os.makedirs(args.results, exist_ok=True)
    with open(path, "a") as f:
        f.write(json.dumps(js, separators=(",", ":")) + "\n")
    print("recorded in %s" % os.path.relpath(path, ROOT))


# ---------------------------------------------------------------- rendering

def f2(x):
    return "—" if x is None else "%.2f" % x


def f3(x):
    return "—" if x is None else "%.3f" % x


def ratio(x):
    return "—" if x is None else "%.2f×" % x


def run_label(js):
    r = js["run"]
    label = "%s, measured at load %.2f" % (r["date"][:10], r["loadavg_1m"])
    return label + (" (%s)" % r["note"] if r.get("note") else "")


def table(header, rows):
    out = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return out


def size_label(b):
    if b >= 1000000 and b % 1048576:
        return "%.1f MB" % (b / 1e6)
    if b >= 1048576:
        return "%d MiB" % (b // 1048576)
    return "%d KiB" % (b // 1024)


def render_chunker(runs):
    rows = []
    for js in runs:
        chunks = js["tokens"] // js["chunk_tokens"]
        per_chunk = lambda k: None if js.get(k) is None else js[k] / chunks
        rows.append([run_label(js), js["tokens"], f3(per_chunk("xxh3_chain_us")), f3(per_chunk("sha256_chain_us")),
                     ratio(js.get("ratio_sha256_over_xxh3")),
                     "+%.1f %% / +%.1f %%" % ((js["material_overhead_xxh3"] - 1) * 100,
                                             (js.get("material_overhead_sha256", 1) - 1) * 100)])
    return table(["run", "prompt tokens", "XXH3-128 chain, µs CPU per 256-token chunk",
                  "baseline: SHA-256 chain, µs per chunk", "SHA-256 / XXH3", "key material, XXH3 / SHA-256"], rows)


def render_resp_parser(runs):
    rows = [[run_label(js), "%d × %s" % (js["batch"], size_label(js["value_bytes"])), f2(js["dest_gb_per_s"]),
             f2(js["string_gb_per_s"]), f2(js["memcpy_gb_per_s"]), ratio(js["ratio_dest_over_memcpy"]),
             ratio(js["ratio_string_over_memcpy"])] for js in runs]
    return table(["run", "replies", "into destinations, GB/s", "into reply strings, GB/s",
                  "baseline: memcpy, GB/s", "destinations / memcpy", "strings / memcpy"], rows)


def render_kv_copy(runs):
    rows = [[run_label(js), r["layout"], "%.1f" % (r["bytes"] / 1e6), f2(r["gather_gbs"]), f2(r["scatter_gbs"]),
             f2(r["memcpy_gbs"]), ratio(r["gather_vs_memcpy"]), ratio(r["scatter_vs_memcpy"])]
            for js in runs for r in js["rows"]]
    return table(["run", "layout", "MB per chunk", "gather GB/s", "scatter GB/s", "baseline: memcpy GB/s",
                  "gather / memcpy (paired)", "scatter / memcpy (paired)"], rows)


def render_fetch_queue(runs):
    rows = [[run_label(js), "%.1f / %.1f" % (js["req1_direct_us"], js["req1_queue_us"]),
             f2(js["queue_overhead_us_per_request"]), "%.1f / %.1f" % (js["req64_direct_us"], js["req64_queue_us"]),
             "%.0f" % js["queue_overhead_ns_per_chunk"], ratio(js["ratio_get_memcpy_64k"]),
             ratio(js["ratio_get_memcpy_12m"])] for js in runs]
    return table(["run", "1-chunk load µs: direct / queue", "queue overhead µs per request",
                  "64-chunk load µs: direct / queue", "overhead ns per chunk", "L1 get / memcpy, 64 KiB",
                  "L1 get / memcpy, 12.4 MB"], rows)


def render_chunk_broadcast(runs):
    rows = [[run_label(js), "%d × %s" % (r["chunks"], size_label(r["chunk_bytes"])), f2(r["memcpy_floor_ms"]),
             f2(r["per_chunk_ms"]), "%.2f (%s)" % (r["grouped_ms"], ratio(r["grouped_speedup"])),
             "%.2f (%s)" % (r["gathered_ms"], ratio(r["gathered_speedup"])), r["fastest"]]
            for js in runs for r in js["results"]]
    out = table(["run", "chunks", "memcpy floor ms", "baseline: per-chunk ms", "grouped ms (speed-up)",
                 "gathered ms (speed-up)", "fastest"], rows)
    rows = [[run_label(js), p["mode"], f2(p["one_shot_ms"]), f2(p["pipelined_ms"]), ratio(p["pipelined_speedup"])]
            for js in runs for p in js.get("pipelined", [])]
    return out + [""] + table(["run", "mode (64 × 256 KiB, fetch 4 ms per owned chunk)",
                               "baseline: fetch then broadcast, ms", "pipelined ms", "speed-up"], rows)


def render_l2_floor(runs):
    rows = []
    for js in runs:
        for r in js["rows"]:
            c, q = r["clients"], r["ratio_to_better_floor"]
            gb = lambda n: f2(c[n]["gbps"]) if n in c else "—"
            pair = lambda k: " / ".join(ratio(q[n][k]) if n in q else "—" for n in ("kvtier_asio", "kvtier_uring"))
            rows.append([run_label(js), r["op"].upper(), "%d × %s" % (r["batch"], size_label(r["value_bytes"])),
                         "%s / %s" % (gb("kvtier_asio"), gb("kvtier_uring")), gb("raw_pipelined"), gb("raw_per_rtt"),
                         gb("hiredis"), pair("gbps"), pair("cpu_per_gb"), pair("server_cpu_per_gb")])
    return table(["run", "op", "batch", "remote_store GB/s, Asio / io_uring", "raw pipelined GB/s",
                  "raw one per round trip (LMCache's pattern) GB/s", "hiredis GB/s",
                  "GB/s ÷ better floor", "client CPU/GB ÷ floor", "server CPU/GB ÷ floor"], rows)


def render_resp_get(runs):
    rows = []
    for js in runs:
        best = js.get("best_hiredis")
        for name, c in js["clients"].items():
            vs = js.get("vs_best_hiredis", {}).get(name)
            rows.append([run_label(js), "%d × %s" % (js["batch"], size_label(js["value_bytes"])), name,
                         f2(c.get("gbps")), f2(c.get("p50_ms")), f3(c.get("cpu_s_per_gb")),
                         f3(c.get("server_cpu_s_per_gb")),
                         "%s GB/s, %s CPU/GB vs %s" % (ratio(vs["gbps"]), ratio(vs.get("cpu_per_gb")), best)
                         if vs else ("baseline" if name == best else "")])
    out = table(["run", "batch", "client", "GB/s", "batch p50 ms", "client CPU-s/GB", "server CPU-s/GB",
                 "against the best hiredis"], rows)
    rows = []
    for js in runs:
        sc = js.get("scaling")
        if not sc:
            continue
        ns = sorted({int(k.split("to")[0]) for k in sc if k.endswith("_ratio")})
        rows.append([run_label(js), sc["client"], f2(sc["1to1_gbps"])] +
                    ["%s / %s" % (ratio(sc.get("%dto1_ratio" % n)), ratio(sc.get("%dto%d_ratio" % (n, n)))) for n in ns])
    if rows:
        out += [""] + table(["run", "client", "1 client → 1 instance, GB/s"] +
                            ["%d clients → 1 / → %d instances, ÷ 1 → 1" % (n, n) for n in ns], rows)
    return out


def render_connector(runs):
    rows = []
    for js in runs:
        for store in ("memory", "redis"):
            s = js.get(store)
            if not s or not s.get("connector_ms"):
                continue
            rows.append([run_label(js), store, f2(s["fetch_ms"]), f2(s["hand_ms"]), f2(s["connector_ms"]),
                         ratio(s["connector_ms"] / s["hand_ms"]) if s["hand_ms"] else "—",
                         f2(s.get("streamed_ms")) if store == "redis" else "—"])
    out = table(["run", "stores", "fetch alone ms", "baseline: composed by hand ms", "connector ms",
                 "connector / by hand", "connector, stream_groups ms"], rows)
    rows = []
    for js in runs:
        red = js.get("redis", {})
        if "first_layer_ms" not in red:
            continue
        for i, compute in enumerate(("0", "10 ms")):
            w0, s0 = red["first_layer_ms"]["whole"][i], red["first_layer_ms"]["streamed"][i]
            we, se = red["forward_end_ms"]["whole"][i], red["forward_end_ms"]["streamed"][i]
            rows.append([run_label(js), compute, "%.1f / %.1f (%s)" % (w0, s0, ratio(s0 / w0) if w0 else "—"),
                         "%.1f / %.1f (%s)" % (we, se, ratio(se / we) if we else "—")])
    out += [""] + table(["run", "compute per layer", "layer 0 ready ms: whole chunks / streamed",
                         "forward ends ms: whole chunks / streamed"], rows)
    rows = []
    for js in runs:
        for store in ("memory", "redis"):
            s = js.get(store, {})
            if s.get("save_ms") and s.get("plain_put_ms"):
                rows.append([run_label(js), store, f2(s["save_ms"]), f2(s["plain_put_ms"]),
                             ratio(s["save_ms"] / s["plain_put_ms"])])
    if rows:
        out += [""] + table(["run", "stores", "save of the prompt from the pages ms",
                             "baseline: plain put of the same bytes, gathered ms", "save / put"], rows)
    return out


def headline_get(js):
    """The largest batched GET of an l2_floor run against the one-per-round-trip floor, or None."""
    gets = [r for r in js["rows"] if r["op"] == "get" and "raw_per_rtt" in r["clients"]]
    if not gets:
        return None
    r = max(gets, key=lambda r: (r["batch"] > 1, r["value_bytes"]))
    c = r["clients"]
    ratios = [c[n]["gbps"] / c["raw_per_rtt"]["gbps"] for n in ("kvtier_asio", "kvtier_uring")]
    return r, c, ratios


def spread(values, what=""):
    """' (N runs: a–b)' over every recorded run, when there is more than one."""
    values = [v for v in values if v is not None]
    return "" if len(values) < 2 else " (%s%d runs: %s–%s)" % (what, len(values), ratio(min(values)), ratio(max(values)))


def render_headline(results):
    """The README's three figures: the latest run of each benchmark, and the range over every run."""
    rows = []
    runs = load_runs(results, "bench_l2_floor")
    got = [headline_get(js) for js in runs]
    if got[-1]:
        r, c, (asio, uring) = got[-1]
        rows.append(["[GET %d × %s, remote_store over Asio / io_uring](#bench_l2_floor)"
                     % (r["batch"], size_label(r["value_bytes"])),
                     "%s / %s GB/s" % (f2(c["kvtier_asio"]["gbps"]), f2(c["kvtier_uring"]["gbps"])),
                     "one GET per round trip (LMCache's pattern): %s GB/s" % f2(c["raw_per_rtt"]["gbps"]),
                     "%s / %s%s" % (ratio(asio), ratio(uring), spread([g[2][0] for g in got if g and
                                                                       g[0]["value_bytes"] == r["value_bytes"]], "Asio, ")),
                     run_label(runs[-1])])
    runs = [js for js in load_runs(results, "bench_chunker") if js.get("sha256_chain_us")]
    if runs:
        js = runs[-1]
        chunks = js["tokens"] // js["chunk_tokens"]
        rows.append(["[chunk keys of a %dk-token prompt, XXH3-128 chain](#bench_chunker)" % (js["tokens"] // 1000),
                     "%s µs per chunk" % f3(js["xxh3_chain_us"] / chunks),
                     "SHA-256 chain: %s µs per chunk" % f3(js["sha256_chain_us"] / chunks),
                     "%s faster%s" % (ratio(js["ratio_sha256_over_xxh3"]),
                                      spread([j["ratio_sha256_over_xxh3"] for j in runs])), run_label(js)])
    runs = load_runs(results, "bench_connector")
    for store in ("memory", "redis"):
        both = [j[store] for j in runs if j.get(store, {}).get("connector_ms") and j[store].get("hand_ms")]
        s = runs[-1].get(store, {})
        if s.get("connector_ms") and s.get("hand_ms"):
            rows.append(["[a load of 64 × 2 MiB at W = 2, %s stores, through the connector](#bench_connector)"
                         % ("in-process" if store == "memory" else "redis-server"),
                         "%s ms" % f2(s["connector_ms"]), "composed by hand: %s ms" % f2(s["hand_ms"]),
                         "%s the time%s" % (ratio(s["connector_ms"] / s["hand_ms"]),
                                            spread([b["connector_ms"] / b["hand_ms"] for b in both])),
                         run_label(runs[-1])])
    return table(["figure", "kvtier", "baseline, same run", "ratio (latest run; range over every run)", "latest run"],
                 rows)


RENDER = {
    "bench_chunker": render_chunker,
    "bench_resp_parser": render_resp_parser,
    "bench_kv_copy": render_kv_copy,
    "bench_fetch_queue": render_fetch_queue,
    "bench_chunk_broadcast": render_chunk_broadcast,
    "bench_l2_floor": render_l2_floor,
    "bench_resp_get": render_resp_get,
    "bench_connector": render_connector,
}


def load_runs(results, bench):
    path = os.path.join(results, bench + ".jsonl")
    if not os.path.exists(path):
        raise SystemExit("bench_tables.py: no results for table %s (%s)" % (bench, path))
    with open(path) as f:
        runs = [json.loads(l) for l in f if l.strip()]
    if not runs:
        raise SystemExit("bench_tables.py: %s is empty" % path)
    return runs


def generate(doc_text, results):
    def one(m):
        bench = m.group(2)
        if bench not in RENDER and bench != "headline":
            raise SystemExit("bench_tables.py: no renderer for table %s (known: %s)" % (bench, ", ".join(RENDER)))
        if bench == "headline":
            body = render_headline(results) + ["", "Generated by `scripts/bench_tables.py` from the latest line of "
                                               "each benchmark's `bench/results/<bench>.jsonl`."]
            return m.group(1) + "\n".join(body) + "\n" + m.group(4)
        runs = load_runs(results, bench)
        machines = sorted({js["run"]["machine"] for js in runs})
        body = RENDER[bench](runs) + ["", "Generated by `scripts/bench_tables.py` from `bench/results/%s.jsonl` "
                                      "(machine: %s)." % (bench, "; ".join(machines))]
        return m.group(1) + "\n".join(body) + "\n" + m.group(4)

    return TABLE.sub(one, doc_text)


def mutate(text):
    """One digit of the first generated table changed: what --mutate checks against (the check must fail)."""
    m = TABLE.search(text)
    if not m:
        raise SystemExit("bench_tables.py: no table to mutate")
    start = m.start(3) + m.group(3).index("\n| ") + 3  # the first data row
    at = start + re.search(r"\d", text[start:]).start()
    return text[:at] + str((int(text[at]) + 1) % 10) + text[at + 1:]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--doc", default=os.path.join(ROOT, "docs", "benchmarks.md"))
    ap.add_argument("--results", default=os.path.join(ROOT, "bench", "results"))
    ap.add_argument("--check", action="store_true", help="compare only: exit 1 when a table differs")
    ap.add_argument("--mutate", action="store_true", help="with --check: change one digit first (must fail)")
    sub = ap.add_subparsers(dest="cmd")
    rec = sub.add_parser("record", help="run a benchmark and append its JSON line to bench/results/<bench>.jsonl")
    rec.add_argument("bench", help="the table name, e.g. bench_chunker")
    rec.add_argument("--note", help="what else ran, e.g. 'other builds running'")
    argv = sys.argv[1:]
    command = argv[argv.index("--") + 1:] if "--" in argv else []  # the benchmark's own command line
    args = ap.parse_args(argv[:len(argv) - len(command) - (1 if "--" in argv else 0)])
    if args.cmd == "record":
        args.command = command
        return record(args)
    with open(args.doc) as f:
        text = f.read()
    if not TABLE.search(text):
        raise SystemExit("bench_tables.py: %s has no <!-- table: NAME --> ... <!-- end table --> region" % args.doc)
    fresh = generate(text, args.results)
    if args.check:
        current = mutate(text) if args.mutate else text
        if current == fresh:
            print("bench_tables.py: every table of %s matches the results" % os.path.relpath(args.doc, ROOT))
            return 0
        diff = list(difflib.unified_diff(current.splitlines(), fresh.splitlines(), "doc", "generated", lineterm="", n=0))
        for m in TABLE.finditer(current):
            if m.group(0) not in fresh:
                print("bench_tables.py: the table %s in %s differs from what bench/results gives"
                      % (m.group(2), os.path.relpath(args.doc, ROOT)))
        print("\n".join(diff[:40]))
        print("run python3 scripts/bench_tables.py to refresh the tables")
        return 1
    if fresh != text:
        with open(args.doc, "w") as f:
            f.write(fresh)
        print("bench_tables.py: tables rewritten in %s" % os.path.relpath(args.doc, ROOT))
    return 0


if __name__ == "__main__":
    sys.exit(main())
