"""The cost model against this machine: predicted against measured hit and recompute wall-clock.

Runs as 2 MPI processes, each with its own redis-server (the 1-server configurations run on rank
0 alone, over MPI.COMM_SELF, while rank 1 waits without spinning; the 2-server ones on both ranks,
context-parallel, each rank loading the chunks it owns from its own server):

    mpiexec -n 2 --oversubscribe /usr/bin/python3 examples/python_engine/cost_model_check.py

Every request goes through the bound kvtier.Connector (tier.BoundTier). Measured:
  s     bytes per token of the bench model's KV (all layers)
  B,T0  of the same servers through kvtier's store and the probe's fit (kvtier.fit_batches over a
        ladder of GET batches 16..1 of chunk-sized values); at W = 2 both ranks GET from their own
        server at once and a batch takes the slower rank's time
  hit   per case the engine's prefill wall-clock, split into its load part (lookup, the wait for
        the agreed load outcome, the forward's waits for landing layers) and its compute part
  rec   the same prompt with the load declined (lookup, then everything computed)
The model, fitted on the FIT configurations only (for each W separately: 2 processes running a
context-parallel prefill are another machine than 1):
  recompute(n)      = n / R(n), the per-token cost 1/R(n) piecewise linear in n through the fit
                      lengths' recompute medians (constant below the shortest, the last slope on
                      past the longest): here a 768-token prefill costs 3-4x per token what a
                      128-token one does (a layer's 128 latent rows, 4 MiB, fit the L2 cache; more
                      do not), so one R cannot serve both ends
  after_hit(n)      = the forward of the last token after a whole hit (it attends over every row),
                      piecewise linear in n through the fit lengths' measured compute parts
  load(h)           = T0e + h*s/B: the engine's load path (kvtier.fit_batches over the fit
                      configurations' hits of n/4, n/2 and n-1 tokens), B carried to another chunk
                      size as B_probe(W, chunk) * (engine B / B_probe(W, fit chunk))
  hit               = load(h) + after_hit(n)
  verdict           = kvtier.decide_load(PrefillNode(s, R_eff), LoadPath(T0e, B), h), R_eff the
                      rate at which h tokens cost what the hit saves, recompute(n) - after_hit(n)
The held-out configurations (other prompt lengths, 1 and 2 servers, another chunk size) are
predicted and printed against their medians of 5, as ratios. Every case's hit and recompute runs
are taken round-robin, so drifts of the machine's load hit all cases alike.

Hits shorter than the prompt (the fit's h = n/4, n/2) are loads capped below the hit: the whole
prompt is stored, and the connector's ranged load fetches only the first h tokens' chunks
(Engine.run(max_load=h) -> Connector.load(id, slots, first_token=0, end_token=h)); those runs write
nothing back (save=False).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "python", "tests"))  # redis_server.py, the tests' harness

import kvtier  # noqa: E402
from engine import Engine  # noqa: E402
from mla_model import MlaConfig, MlaModel, PagedKvCache  # noqa: E402
from redis_server import Server  # noqa: E402
from tier import BoundTier  # noqa: E402

# d_model 16 and a 8192-wide latent: 64 KiB of KV per token for little compute, so B* = s*R is
# a few hundred MB/s here, inside what the servers deliver
BENCH = MlaConfig(vocab=256, d_model=16, n_layers=2, n_heads=1, nope_dim=8, rope_dim=8, v_dim=8,
                  kv_lora_rank=8184, d_ff=32, seed=3)
# (prompt tokens, servers = ranks, chunk tokens); R(n) is fitted through each W's fit lengths
FIT = [(128, 1, 64), (256, 1, 64), (768, 1, 64), (128, 2, 64), (512, 2, 64)]
HELD_OUT = [(64, 1, 16), (384, 1, 64), (512, 1, 64), (256, 1, 16), (128, 1, 16), (256, 2, 64),
            (384, 2, 64), (256, 2, 16)]


def idle_barrier(comm):
    """A barrier that sleeps instead of spinning (an MPI barrier would take a core from the rank
    that measures)."""
    req = comm.Ibarrier()
    for _ in range(10 ** 6):
        if req.Test():
            return
        time.sleep(0.002)
    raise RuntimeError("idle_barrier: the other rank never arrived")


def probe(store, comm, value_bytes, rounds, batch=16):
    """kvtier-probe's measurement through the bound store, on every rank of comm at once: GET
    ladders, a batch's time the slowest rank's, then the probe's fit over the bytes of all ranks."""
    from mpi4py import MPI
    w = comm.Get_size()
    keys = [kvtier.ChunkKey(0x9e3779b9, value_bytes * 64 + i) for i in range(batch)]
    src = torch.randint(0, 256, (batch, value_bytes), dtype=torch.uint8)
    st = store.put(keys, src, 30.0)
    if any(s != kvtier.Status.stored for s in st):
        raise RuntimeError(f"probe put: {st}")
    dst = torch.empty_like(src)
    samples = []
    for _ in range(rounds):
        for k in [batch >> i for i in range(5)]:
            comm.Barrier()
            t = time.perf_counter()
            st = store.get(keys[:k], dst[:k], 30.0)
            dt = comm.allreduce(time.perf_counter() - t, op=MPI.MAX)
            samples.append((k, w * k * value_bytes / 1e9, dt))
            if any(s != kvtier.Status.hit for s in st):
                raise RuntimeError(f"probe get: {st}")
    if not torch.equal(src, dst):
        raise RuntimeError("probe: bytes read back differ")
    return kvtier.fit_batches(samples)


class Case:
    """One configuration (n, W, chunk) at one hit length: its prompt, stored cold, and two engines."""

    def __init__(self, key, model, comm, store, ns, hit_len, seed):
        n, w, chunk = key[:3]
        self.key, self.n, self.w, self.chunk, self.comm = key, n, w, chunk, comm
        cfg = model.cfg
        self.cache = PagedKvCache(cfg, -(-(n + 1) // 16) + 1, 16)
        ctrl, data = kvtier.MpiCommunicator(comm, 10.0), kvtier.MpiCommunicator(comm, 10.0)
        self.tier = BoundTier(ctrl, data, store, kvtier.Chunker(ns), self.cache, lookup_timeout=2.0,
                              load_timeout=(10.0, 0.0, 10.0))
        cp = comm if w > 1 else None
        self.load = Engine(model, cp, self.tier, policy=lambda h, nn: True)
        self.recompute = Engine(model, cp, self.tier, policy=lambda h, nn: False)
        self.tokens = torch.randint(0, cfg.vocab, (n,), generator=torch.Generator().manual_seed(seed))
        self.full, self.cap = hit_len is None, hit_len
        self.load.run(self.tokens, steps=1, keep_kv=False)  # cold: stores every full chunk
        self.hits, self.loads, self.computes, self.recs, self.agreed = [], [], [], [], set()

    def measure(self):
        r = self.load.run(self.tokens, steps=1, keep_kv=False, save=False, max_load=self.cap)
        t = r.timings
        load_s = t["lookup_s"] + t["load_wait_s"] + t["layer_wait_s"]
        self.hits.append(t["prefill_s"])
        self.loads.append(load_s)
        self.computes.append(t["prefill_s"] - load_s)
        self.agreed.add(r.agreed)
        if self.full:
            self.recs.append(self.recompute.run(self.tokens, steps=1, keep_kv=False).timings["prefill_s"])

    def medians(self):
        if len(self.agreed) != 1:
            raise RuntimeError(f"case {self.key}: the loaded prefix varied: {self.agreed}")
        m = dict(h=next(iter(self.agreed)), hit=statistics.median(self.hits), load=statistics.median(self.loads),
                 compute=statistics.median(self.computes), hit_spread=max(self.hits) / min(self.hits))
        if self.recs:
            m.update(rec=statistics.median(self.recs), rec_spread=max(self.recs) / min(self.recs))
        return m


def piecewise(points):
    """The piecewise-linear function through points [(x, y)]: constant below the first x, the last
    segment's slope continued past the last x.

        piecewise([(128, 1.0), (256, 2.0)])(192) == 1.5"""
    pts = sorted(points)

    def f(x):
        if x <= pts[0][0]:
            return pts[0][1]
        for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
            if x <= x1:
                return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
        (x0, y0), (x1, y1) = pts[-2], pts[-1]
        return y1 + (y1 - y0) * (x - x1) / (x1 - x0)
    return f


def main():
    from mpi4py import MPI
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--probe-rounds", type=int, default=5)
    ap.add_argument("--json", help="write the JSON line here too (rank 0)")
    a = ap.parse_args()
    world, self_comm = MPI.COMM_WORLD, MPI.COMM_SELF
    if world.Get_size() != 2:
        raise SystemExit("run as 2 MPI processes: mpiexec -n 2 ... cost_model_check.py")
    rank = world.Get_rank()
    torch.set_num_threads(1)
    cfg, s = BENCH, BENCH.kv_bytes_per_token
    model = MlaModel(cfg)
    load0 = os.getloadavg()
    say = print if rank == 0 else (lambda *x, **k: None)
    say(f"model: layers {cfg.n_layers}, d_model {cfg.d_model}, latent {cfg.latent_dim} fp32: s = {s} B/token")
    server = Server()  # this rank's own redis-server
    try:
        configs = FIT + HELD_OUT
        stores, probes = {}, {}
        for w in (1, 2):
            for chunk in sorted({c for _, ww, c in configs if ww == w}):
                ns = kvtier.KeyNamespace(model="py-mla-bench", kv_format=f"fp32-latent{cfg.latent_dim}",
                                         chunk_tokens=chunk, ownership=f"mod:{w}")
                group = chunk * cfg.latent_dim * cfg.elem_bytes  # one layer of a chunk: one checksum
                stores[(w, chunk)] = (ns, kvtier.RemoteStore(server.url, ns, rank=rank if w > 1 else 0,
                                                             value_format=2, group_bytes=group))
                if w == 2 or rank == 0:
                    f = probe(stores[(w, chunk)][1], world if w == 2 else self_comm, chunk * s, a.probe_rounds)
                    probes[(w, chunk)] = f
                    say(f"probe {w} server(s), values {chunk * s / 1e6:.2f} MB: B = {f.path.bandwidth_gb_per_s:.3f} GB/s "
                        f"(95% {f.b_interval_gbps[0]:.3f}..{f.b_interval_gbps[1]:.3f}), T0 = "
                        f"{f.path.fixed_cost_s * 1e3:.2f} ms{' (clamped at 0)' if f.clamped else ''}, "
                        f"rms residual {f.rms_residual_s * 1e3:.2f} ms")
                if w == 1:
                    idle_barrier(world)
        # every case, stored cold first: the fit configurations at three hit lengths, the others at
        # the whole prompt (every full chunk: the last token is computed)
        cases = []
        for n, w, chunk in configs:
            if w == 2:
                idle_barrier(world)  # rank 0's 1-server cases are set up (rank 1 did not spin meanwhile)
            elif rank != 0:
                continue
            ns, store = stores[(w, chunk)]
            comm = world if w == 2 else self_comm
            for h in ((n // 4, n // 2, None) if (n, w, chunk) in FIT else (None,)):
                key = (n, w, chunk) if h is None else (n, w, chunk, h)
                cases.append(Case(key, model, comm, store, ns, h, seed=n * 31 + chunk * 7 + w + (h or 0)))
        # rank 1 holds only the W = 2 cases; both ranks walk the configurations in the same order
        for _ in range(a.reps):
            for n, w, chunk in configs:
                mine = [c for c in cases if c.key[:3] == (n, w, chunk)]
                for c in mine:
                    c.measure()
                if w == 1:
                    idle_barrier(world)
        measured = {c.key: c.medians() for c in cases}
        for c in cases:
            c.tier.close()
        if rank != 0:
            return
        # ---- the fit, on FIT only -----------------------------------------------------------
        fit1 = [k for k in measured if k[:3] in FIT and k[1] == 1]
        fit2 = [k for k in measured if k[:3] in FIT and k[1] == 2]

        # compute: per token of a recompute (1/R(n)) and the last token's forward after a whole hit
        # (it attends over every row), each piecewise linear in n through the fit lengths of that W
        # (W = 2, context-parallel over 2 processes, is another machine: its own fit)
        per_token = {w: piecewise([(k[0], measured[k]["rec"] / k[0]) for k in keys if "rec" in measured[k]])
                     for w, keys in ((1, fit1), (2, fit2))}
        last_row = {w: piecewise([(k[0], measured[k]["compute"]) for k in keys if "rec" in measured[k]])
                    for w, keys in ((1, fit1), (2, fit2))}

        def recompute_s(w, n):
            return n * per_token[w](n)

        def after_hit_s(w, n, h):  # computing [h, n) after a hit of h (here h = n - 1: the last token)
            return last_row[w](n) if h == n - 1 else recompute_s(w, n) - recompute_s(w, h)

        # load: the engine's load path from the fit configurations' hits (three lengths each), and
        # its B relative to the probe's at the fit's chunk size, carried to the other chunk sizes
        engine_path = {}
        for w, keys in ((1, fit1), (2, fit2)):
            chunk = keys[0][2]  # one chunk size among each W's fit configurations
            pts = [(-(-measured[k]["h"] // chunk), measured[k]["h"] * s / 1e9, measured[k]["load"]) for k in keys]
            f = kvtier.fit_batches(pts)
            if f is None:
                raise RuntimeError(f"no load path fits the W = {w} fit configuration's loads {pts}")
            rel = f.path.bandwidth_gb_per_s / probes[(w, chunk)].path.bandwidth_gb_per_s
            engine_path[w] = (f.path.fixed_cost_s, f.path.bandwidth_gb_per_s, rel, f.clamped)
        for w in (1, 2):
            T0e, Be, rel, clamped = engine_path[w]
            say(f"fit W={w}: R(n) = " + ", ".join(f"{n}: {n / recompute_s(w, n):.0f}" for n in (64, 128, 256, 512, 768))
                + " tok/s; the last token after a hit of n-1: " + ", ".join(
                    f"{n}: {after_hit_s(w, n, n - 1) * 1e3:.1f}" for n in (64, 256, 768))
                + f" ms; load T0e = {T0e * 1e3:.2f} ms{' (clamped at 0)' if clamped else ''}, engine B = "
                f"{Be:.3f} GB/s ({rel:.2f}x the probe's)")
        say(f"{'n':>5} {'W':>2} {'chunk':>5} {'h':>5} {'B GB/s':>7} | {'hit pred':>8} {'meas':>8} {'ratio':>5} | "
            f"{'rec pred':>8} {'meas':>8} {'ratio':>5} | verdict pred/meas")
        rows, agree, within, within_hit, within_rec = [], 0, 0, 0, 0
        verdicts_seen = set()
        for key in FIT + HELD_OUT:
            n, w, chunk = key
            m = measured[key]
            T0e, _, rel, _ = engine_path[w]
            B = probes[(w, chunk)].path.bandwidth_gb_per_s * rel
            h = m["h"]
            rec_p = recompute_s(w, n)
            hit_p = T0e + h * s / (B * 1e9) + after_hit_s(w, n, h)
            saving = rec_p - after_hit_s(w, n, h)  # what the hit saves in compute
            node = kvtier.PrefillNode(s, h / saving if saving > 0 else 1e-9)
            verdict_p = kvtier.decide_load(node, kvtier.LoadPath(T0e, B), h).load
            verdict_m = m["hit"] < m["rec"]
            held = key not in FIT
            ok_hit, ok_rec = abs(hit_p / m["hit"] - 1) <= 0.25, abs(rec_p / m["rec"] - 1) <= 0.25
            if held:
                agree += verdict_p == verdict_m
                within += ok_hit and ok_rec
                within_hit += ok_hit
                within_rec += ok_rec
                verdicts_seen.add(verdict_m)
            say(f"{n:>5} {w:>2} {chunk:>5} {h:>5} {B:>7.3f} | {hit_p * 1e3:>6.1f}ms {m['hit'] * 1e3:>6.1f}ms "
                f"{hit_p / m['hit']:>5.2f} | {rec_p * 1e3:>6.1f}ms {m['rec'] * 1e3:>6.1f}ms {rec_p / m['rec']:>5.2f} | "
                f"{'load' if verdict_p else 'recompute':>9}/{'load' if verdict_m else 'recompute':<9}"
                f"{'' if held else '  (fit)'}  spread {m['hit_spread']:.2f}/{m['rec_spread']:.2f}")
            rows.append(dict(n=n, W=w, chunk=chunk, h=h, B_gbps=B, hit_pred_s=hit_p, hit_meas_s=m["hit"],
                             load_meas_s=m["load"], compute_meas_s=m["compute"], rec_pred_s=rec_p,
                             rec_meas_s=m["rec"], verdict_pred=verdict_p, verdict_meas=verdict_m, fit=not held))
        load1 = os.getloadavg()
        H = len(HELD_OUT)
        say(f"\nheld-out: {within}/{H} within +-25% on both (hit {within_hit}/{H}, recompute {within_rec}/{H}); "
            f"verdict agrees {agree}/{H}; measured verdicts among them: "
            f"{sorted('load' if v else 'recompute' for v in verdicts_seen)}; "
            f"load average {load0[0]:.1f} -> {load1[0]:.1f} on {os.cpu_count()} cores")
        line = json.dumps(dict(bench="python_engine_cost_model", s_bytes_per_token=s,
                               R_per_n={str(w): {n: n / recompute_s(w, n) for n in (64, 128, 256, 384, 512, 768)}
                                        for w in (1, 2)},
                               engine_path={str(w): engine_path[w][:3] for w in engine_path},
                               probes={f"{w}x{c}": probes[(w, c)].path.bandwidth_gb_per_s for w, c in probes},
                               rows=rows, within_25=within, within_25_hit=within_hit, within_25_rec=within_rec,
                               verdict_agree=agree, held_out=H, loadavg=[load0[0], load1[0]]))
        print(line)
        if a.json:
            with open(a.json, "w") as f:
                f.write(line + "\n")
    finally:
        server.stop()


if __name__ == "__main__":
    main()
