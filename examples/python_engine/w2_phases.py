"""Where the time of one W = 2 hit goes: a diagnostic for cost_model_check.py's W = 2 variance.

Runs as 2 MPI processes (one redis-server each) over a few of the check's W = 2 cases, and times
each hit's phases on both ranks: the lookup (begin_lookup + step() until agreed), this rank's
fetch (start_load to wait_local), the agreement of the load outcome (the step loop after it),
per layer the forward's all-gather and its wait_for_layer (the mover's broadcast and scatter of
that layer group), and the rest of the forward; with the main thread's run-queue wait (time it was
runnable but not running, /proc/thread-self/schedstat) and the process's CPU time beside. Between
configurations rank 0 computes a W = 1 recompute while rank 1 sleeps, as in the check's round,
and per round each case is hit twice, so the first hit of a case in a round can be told from the
second:

    mpiexec -n 2 --oversubscribe /usr/bin/python3 examples/python_engine/w2_phases.py [--rounds 8]

Print per case and phase the medians of first and second hits (ms), rank 0 and rank 1.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import random
import statistics
import sys
import time

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

import torch  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "python", "tests"))

import kvtier  # noqa: E402
from cost_model_check import BENCH, Case, align, fit_hits, idle_barrier  # noqa: E402
from mla_model import MlaModel  # noqa: E402
from redis_server import Server  # noqa: E402


def run_queue_wait_s() -> float:
    """This thread's time runnable but not running so far (schedstat's second field, ns)."""
    with open("/proc/thread-self/schedstat") as f:
        return int(f.read().split()[1]) / 1e9


class TimedComm:
    """mpi4py communicator proxy timing the forward's Allgatherv calls."""

    def __init__(self, comm, log):
        self._c, self._log = comm, log

    def Allgatherv(self, *a, **k):
        t = time.perf_counter()
        self._c.Allgatherv(*a, **k)
        self._log.append(time.perf_counter() - t)

    def __getattr__(self, name):
        return getattr(self._c, name)


ALIGN = [False]  # --align: cost_model_check.align before each timed hit


def instrument(case):
    """Wraps the case's tier and engine so one hit records its phases in case.phase."""
    tier, eng = case.tier, case.load
    gathers, waits = [], []
    eng.comm = TimedComm(eng.comm, gathers)
    ph = {}
    orig_lookup, orig_start, orig_wait = tier.lookup, tier.start_load, tier.wait_for_layer
    conn = tier.conn

    def lookup(tokens, dl):
        t = time.perf_counter()
        h = orig_lookup(tokens, dl)
        ph["lookup"] = time.perf_counter() - t
        return h

    def start_load(*a, **k):
        ph["t_start"] = time.perf_counter()
        orig_start(*a, **k)

    def agreed_tokens():
        t = time.perf_counter()
        try:
            conn.wait_local(tier.id, tier.layer_wait_s)
        except (kvtier.TimeoutError, kvtier.InvalidArgument):
            pass
        t1 = time.perf_counter()
        ph["fetch"] = t1 - ph["t_start"]
        steps, in_step = 0, 0.0
        while conn.load_result(tier.id) is None and steps < 5000:  # tier._step_until, counted
            ts = time.perf_counter()
            conn.step(tier.step_timeout_s)
            in_step += time.perf_counter() - ts
            steps += 1
            if conn.load_result(tier.id) is None:
                time.sleep(0.001)
        ph["agree"], ph["steps"], ph["in_step"] = time.perf_counter() - t1, steps, in_step
        tier.outcome = conn.load_result(tier.id)
        tier.last_load_errors = conn.load_errors(tier.id)
        return max(tier._first, min(tier._upto, tier.outcome.loaded_end_token))

    def wait_for_layer(layer):
        t = time.perf_counter()
        orig_wait(layer)
        waits.append(time.perf_counter() - t)

    tier.lookup, tier.start_load, tier.agreed_tokens, tier.wait_for_layer = lookup, start_load, agreed_tokens, \
        wait_for_layer

    def hit():
        gathers.clear()
        waits.clear()
        ph.clear()
        t_enter = time.perf_counter()  # CLOCK_MONOTONIC: comparable between the two ranks
        gc.collect()
        t_gc = time.perf_counter()
        gc.disable()
        try:
            if ALIGN[0]:
                align(case.comm)
            t_start = time.perf_counter()
            q0, c0 = run_queue_wait_s(), time.process_time()
            r = eng.run(case.tokens, steps=1, keep_kv=False, save=False, max_load=case.cap)
            q1, c1 = run_queue_wait_s(), time.process_time()
        finally:
            gc.enable()
        t = r.timings
        out = dict(total=t["prefill_s"], lookup=ph["lookup"], fetch=ph["fetch"], agree=ph["agree"],
                   steps=ph["steps"], in_step=ph["in_step"],
                   gather=sum(gathers), gather0=gathers[0], wait=sum(waits), wait0=waits[0] if waits else 0.0,
                   runq=q1 - q0, cpu=c1 - c0, gc=t_gc - t_enter, t_enter=t_enter, t_gc=t_gc,
                   t_start=t_start)
        out["rest"] = out["total"] - out["lookup"] - out["fetch"] - out["agree"] - out["gather"] - out["wait"]
        return out

    def recompute():
        """The check's recompute after a hit: the same prompt, the load declined."""
        gc.disable()
        try:
            if ALIGN[0]:
                align(case.comm)
            q0, c0, t0 = run_queue_wait_s(), time.process_time(), time.perf_counter()
            case.recompute.run(case.tokens, steps=1, keep_kv=False)
            t1 = time.perf_counter()
            return dict(total=t1 - t0, runq=run_queue_wait_s() - q0, cpu=time.process_time() - c0)
        finally:
            gc.enable()

    case.timed_hit, case.timed_recompute = hit, recompute


def main():
    from mpi4py import MPI
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--configs", default="192,2,32;128,2,16;320,2,16")
    ap.add_argument("--json")
    ap.add_argument("--align", action="store_true", help="barrier between gc.collect() and the timed hit")
    ap.add_argument("--freeze", action="store_true", help="gc.freeze() after the set-up")
    a = ap.parse_args()
    world, self_comm = MPI.COMM_WORLD, MPI.COMM_SELF
    rank = world.Get_rank()
    torch.set_num_threads(1)
    cfg, s = BENCH, BENCH.kv_bytes_per_token
    model = MlaModel(cfg)
    with open("/proc/self/status") as f:
        allowed = [ln.split()[1] for ln in f if ln.startswith("Cpus_allowed_list")][0]
    print(f"rank {rank}: cpus allowed {allowed}; OMPI_MCA_mpi_yield_when_idle="
          f"{os.environ.get('OMPI_MCA_mpi_yield_when_idle')}", flush=True)
    server = Server()
    try:
        configs = [tuple(int(x) for x in c.split(",")) for c in a.configs.split(";")]
        cases = []
        for n, w, chunk in configs:
            ns = kvtier.KeyNamespace(model="py-mla-diag", kv_format=f"fp32-latent{cfg.latent_dim}",
                                     chunk_tokens=chunk, ownership=f"mod:{w}")
            store = kvtier.RemoteStore(server.url, ns, rank=rank, value_format=2,
                                       group_bytes=chunk * cfg.latent_dim * cfg.elem_bytes)
            for h in fit_hits(n, chunk):
                key = (n, w, chunk) if h is None else (n, w, chunk, h)
                c = Case(key, model, world, store, ns, h, seed=n * 31 + chunk * 7 + w)
                instrument(c)
                cases.append(c)
        # rank 0's W = 1 work between configurations (rank 1 sleeps), as in the check's rounds
        one = None
        if rank == 0:
            ns1 = kvtier.KeyNamespace(model="py-mla-diag", kv_format="w1", chunk_tokens=64, ownership="mod:1")
            st1 = kvtier.RemoteStore(server.url, ns1, rank=0, value_format=2, group_bytes=64 * cfg.latent_dim * 4)
            one = Case((256, 1, 64), model, self_comm, st1, ns1, None, seed=5)
        idle_barrier(world)
        ALIGN[0] = a.align
        if a.freeze:
            gc.collect()
            gc.freeze()
        order = random.Random(11)
        rec = {c.key: {"first": [], "second": []} for c in cases}
        for rnd in range(a.rounds + 1):
            walk = list(configs)
            order.shuffle(walk)
            for cfg_key in walk:
                if rank == 0:
                    one.recompute.run(one.tokens, steps=1, keep_kv=False)
                idle_barrier(world)
                for c in [c for c in cases if c.key[:3] == cfg_key]:
                    f = c.timed_hit()
                    sec = c.timed_hit()
                    r = c.timed_recompute() if c.full else None
                    if rnd > 0:
                        rec[c.key]["first"].append(f)
                        rec[c.key]["second"].append(sec)
                        if r is not None:
                            rec[c.key].setdefault("recompute", []).append(r)
        for c in cases:
            c.tier.close()
        if one is not None:
            one.tier.close()
        allrec = world.gather(rec, root=0)
        if rank != 0:
            return
        print("rank 1's clock minus rank 0's (CLOCK_MONOTONIC, one machine), ms, per round: at entry, "
              "after gc.collect(), at the timed hit's start")
        for key in rec:
            for which in ("first", "second"):
                a0, a1 = allrec[0][key][which], allrec[1][key][which]
                skew = {t: " ".join(f"{(y[t] - x[t]) * 1e3:.1f}" for x, y in zip(a0, a1))
                        for t in ("t_enter", "t_gc", "t_start")}
                name = "/".join(map(str, key))
                print(f"{name:>16} {which:>6} {skew['t_enter']} | {skew['t_gc']} | {skew['t_start']}")
        phases = ["gc", "total", "lookup", "fetch", "agree", "steps", "in_step", "gather", "gather0", "wait", "wait0",
                  "rest", "runq", "cpu"]
        print(f"align {a.align}, freeze {a.freeze}; {a.rounds} rounds; load average {os.getloadavg()[0]:.1f}; "
              "medians in ms (rank 0 | rank 1)")
        print(f"{'case':>16} {'hit':>6} " + " ".join(f"{p:>13}" for p in phases))
        summary = {}
        for key in rec:
            for which in ("first", "second"):
                cells = []
                for p in phases:
                    v = [statistics.median(x[p] for x in allrec[r][key][which]) * (1 if p == "steps" else 1e3)
                         for r in (0, 1)]
                    cells.append(f"{v[0]:6.1f}|{v[1]:6.1f}")
                    summary.setdefault("/".join(map(str, key)), {}).setdefault(which, {})[p] = v
                tot = [x["total"] for x in allrec[0][key][which]]
                q = statistics.quantiles(tot, n=4)
                print(f"{'/'.join(map(str, key)):>16} {which:>6} " + " ".join(f"{c:>13}" for c in cells)
                      + f"  p25-p75 {q[0] * 1e3:.1f}-{q[2] * 1e3:.1f}")
        print("recompute after the second hit (rank 0 | rank 1): total, run-queue wait, CPU (ms)")
        for key in rec:
            if "recompute" in rec[key]:
                cells = [" | ".join(f"{statistics.median(x[p] for x in allrec[r][key]['recompute']) * 1e3:.1f}"
                                    for r in (0, 1)) for p in ("total", "runq", "cpu")]
                print(f"{'/'.join(map(str, key)):>16} " + "   ".join(cells))
        if a.json:
            with open(a.json, "w") as f:
                json.dump(dict(loadavg=os.getloadavg()[0], summary=summary), f)
    finally:
        server.stop()


if __name__ == "__main__":
    main()
