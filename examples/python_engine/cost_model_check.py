"""The cost model against this machine: predicted against measured hit and recompute wall-clock.

Measures, for the bench model (wide latent, so that B* = s*R lands among the store bandwidths):
  s   bytes per token of its KV (all layers)
  R   its prefill tokens/s here (torch threads 1, and 2 for comparison), median of 5
  B,T0 of the same redis-servers through kvtier's store and the probe's fit (kvtier.fit_batches
      over a ladder of batch sizes 16..1 of chunk-sized values), for 1 server and for 2 servers
      (RendezvousStore: the batch split over both, in parallel), at each chunk size
Then fits on ONE configuration (prompt n0, 1 server, chunk C0): R from its recompute time, and the
engine's fixed cost per hit T0e = its measured hit time - h*s/B_probe - (n0-h)/R (lookup, the load
thread, the scatter's fixed part, Python). For every other configuration it predicts
  hit       = T0e + h*s/B_probe(servers, C) + (n - h)/R
  recompute = n / R
  verdict   = kvtier.decide_load(PrefillNode(s, R), LoadPath(T0e, B_probe), h)
and prints them against the measured medians of 5 (every case's hit and recompute runs taken
round-robin, so the machine's load drifts hit all cases alike), as ratios.

    PYTHONPATH=build/release/python /usr/bin/python3 examples/python_engine/cost_model_check.py
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
from connector import PartsConnector  # noqa: E402
from engine import Engine  # noqa: E402
from mla_model import MlaConfig, MlaModel, PagedKvCache  # noqa: E402
from redis_server import Server  # noqa: E402

# d_model 16 and a 8192-wide latent: 64 KiB of KV per token for little compute, so B* = s*R is
# a few hundred MB/s here, inside what the servers deliver (see the module comment)
BENCH = MlaConfig(vocab=256, d_model=16, n_layers=2, n_heads=1, nope_dim=8, rope_dim=8, v_dim=8,
                  kv_lora_rank=8184, d_ff=32, seed=3)
FIT = (256, 1, 64)  # (prompt tokens, servers, chunk tokens)
HELD_OUT = [(128, 1, 64), (512, 1, 64), (256, 2, 64), (512, 2, 64), (256, 1, 16), (512, 2, 16),
            (64, 1, 16), (128, 2, 16)]


def median_time(fn, reps):
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts), ts


def prefill_rate(model, n, reps, threads):
    torch.set_num_threads(threads)
    toks = torch.randint(0, model.cfg.vocab, (n,), generator=torch.Generator().manual_seed(1))
    cache = PagedKvCache(model.cfg, -(-n // 16), 16)
    table = cache.allocate(n)
    model.prefill(toks, cache, table)  # warm-up
    med, ts = median_time(lambda: model.prefill(toks, cache, table), reps)
    torch.set_num_threads(1)
    return n / med, ts


def probe(store, value_bytes, rounds, batch=16):
    """kvtier-probe's measurement through the bound store: GET ladders, then its fit."""
    keys = [kvtier.ChunkKey(0x9e3779b9, value_bytes * 64 + i) for i in range(batch)]
    src = torch.randint(0, 256, (batch, value_bytes), dtype=torch.uint8)
    st = store.put(keys, src, 30.0)
    if any(s != kvtier.Status.stored for s in st):
        raise RuntimeError(f"probe put: {st}")
    dst = torch.empty_like(src)
    samples, sizes = [], [batch >> i for i in range(5)]
    for _ in range(rounds):
        for k in sizes:
            t = time.perf_counter()
            st = store.get(keys[:k], dst[:k], 30.0)
            samples.append((k, k * value_bytes / 1e9, time.perf_counter() - t))
            if any(s != kvtier.Status.hit for s in st):
                raise RuntimeError(f"probe get: {st}")
    if not torch.equal(src, dst):
        raise RuntimeError("probe: bytes read back differ")
    return kvtier.fit_batches(samples)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--probe-rounds", type=int, default=5)
    a = ap.parse_args()
    torch.set_num_threads(1)
    cfg, s = BENCH, BENCH.kv_bytes_per_token
    model = MlaModel(cfg)
    load0 = os.getloadavg()
    R1, r1_ts = prefill_rate(model, FIT[0], a.reps, 1)
    R2, r2_ts = prefill_rate(model, FIT[0], a.reps, 2)
    print(f"model: layers {cfg.n_layers}, d_model {cfg.d_model}, latent {cfg.latent_dim} fp32: s = {s} B/token")
    print(f"R at n={FIT[0]}: threads 1 {R1:.0f} tok/s (B* = s*R = {s * R1 / 1e9:.3f} GB/s), "
          f"threads 2 {R2:.0f} tok/s (ratio {R2 / R1:.2f}); samples 1: "
          f"{[round(t * 1e3, 1) for t in r1_ts]} ms, 2: {[round(t * 1e3, 1) for t in r2_ts]} ms")
    servers = [Server(), Server()]
    try:
        stores, probes = {}, {}
        for chunk in sorted({c for _, _, c in [FIT] + HELD_OUT}):
            ns = kvtier.KeyNamespace(model="py-mla-bench", kv_format=f"fp32-latent{cfg.latent_dim}",
                                     chunk_tokens=chunk)
            group = chunk * cfg.latent_dim * cfg.elem_bytes
            remote = [kvtier.RemoteStore(x.url, ns, value_format=2, group_bytes=group) for x in servers]
            stores[(1, chunk)] = (ns, remote[0])
            stores[(2, chunk)] = (ns, kvtier.RendezvousStore(remote))
            for k in (1, 2):
                f = probe(stores[(k, chunk)][1], chunk * s, a.probe_rounds)
                probes[(k, chunk)] = f
                print(f"probe {k} server(s), values {chunk * s / 1e6:.2f} MB: B = {f.path.bandwidth_gb_per_s:.3f} GB/s "
                      f"(95% {f.b_interval_gbps[0]:.3f}..{f.b_interval_gbps[1]:.3f}), T0 = {f.path.fixed_cost_s * 1e3:.2f} ms"
                      f"{' (clamped at 0)' if f.clamped else ''}, rms residual {f.rms_residual_s * 1e3:.2f} ms")
        fit_n = FIT[0]
        fit_loads = (fit_n // 4, fit_n // 2, fit_n - 1)  # hit lengths the fit sees (all on FIT)
        runs = []  # (key, engines, tokens, cap): every measured case, set up and stored cold first
        for n, k, chunk in [FIT] + HELD_OUT:
            ns, store = stores[(k, chunk)]
            cache = PagedKvCache(cfg, -(-(n + 1) // 16) + 1, 16)
            conn = PartsConnector(None, store, kvtier.Chunker(ns), cfg, cache)
            toks = torch.randint(0, cfg.vocab, (n,), generator=torch.Generator().manual_seed(n * 31 + chunk))
            load = Engine(model, None, conn, policy=lambda h, nn: True)
            recompute = Engine(model, None, conn, policy=lambda h, nn: False)
            load.run(toks, steps=1, keep_kv=False)  # cold: stores the chunks
            for cap in fit_loads if (n, k, chunk) == FIT else (None,):
                key = (n, k, chunk) if cap is None or cap == fit_n - 1 else (n, k, chunk, cap)
                runs.append((key, load, recompute, conn, toks, cap))
        samples = {key: ([], [], set()) for key, *_ in runs}
        for _ in range(a.reps):  # round-robin over every case, hit then recompute: drifts of the
            for key, load, recompute, _, toks, cap in runs:  # machine's load hit all cases alike
                r = load.run(toks, steps=1, keep_kv=False, max_load=cap)
                samples[key][0].append(r.timings["prefill_s"])
                samples[key][2].add(r.agreed)
                samples[key][1].append(recompute.run(toks, steps=1, keep_kv=False).timings["prefill_s"])
        measured = {}
        for key, (hits, recs, hs) in samples.items():
            if len(hs) != 1:
                raise RuntimeError(f"config {key}: loaded prefix varied: {hs}")
            measured[key] = dict(h=hs.pop(), hit=statistics.median(hits), rec=statistics.median(recs),
                                 hit_spread=max(hits) / min(hits), rec_spread=max(recs) / min(recs))
        for conn in {id(r[3]): r[3] for r in runs}.values():
            conn.close()
        # fit on one configuration: R from its recompute runs, the engine's load path (T0e, Be)
        # from its hits of three lengths; the engine's own per-byte cost (scatter, staging) is what
        # Be adds to the probe's 1/B, and is carried to the other configurations as such
        fm, fp = measured[FIT], probes[(FIT[1], FIT[2])].path
        fit_recs = [measured[key]["rec"] for key in measured if key[:3] == FIT]
        R = fit_n / statistics.median(fit_recs)
        pts = [(-(-measured[key]["h"] // FIT[2]), measured[key]["h"] * s / 1e9,
                measured[key]["hit"] - (fit_n - measured[key]["h"]) / R) for key in measured if key[:3] == FIT]
        engine_fit = kvtier.fit_batches(pts)  # the probe's fit: T0 >= 0 (clamped, refitted through 0)
        if engine_fit is None:
            raise RuntimeError(f"no load path fits the fit configuration's hits {pts}")
        T0e, Be = engine_fit.path.fixed_cost_s, engine_fit.path.bandwidth_gb_per_s
        extra_s_per_gb = 1 / Be - 1 / fp.bandwidth_gb_per_s
        node = kvtier.PrefillNode(s, R)
        print(f"\nfit on n={fit_n}, {FIT[1]} server, chunk {FIT[2]} (hits of {[round(g * 1e9 / s) for _, g, _ in pts]} tokens): "
              f"R = {R:.0f} tok/s, engine T0e = {T0e * 1e3:.2f} ms{' (clamped at 0)' if engine_fit.clamped else ''}, engine B = {Be:.3f} GB/s "
              f"(probe {fp.bandwidth_gb_per_s:.3f}: the engine adds {extra_s_per_gb * 1e3:.2f} ms/GB), "
              f"B* = {kvtier.break_even_bandwidth_gb_per_s(node):.3f} GB/s")
        print(f"{'n':>5} {'srv':>3} {'chunk':>5} {'h':>5} {'B GB/s':>7} | {'hit pred':>8} {'meas':>7} {'ratio':>5} | "
              f"{'rec pred':>8} {'meas':>7} {'ratio':>5} | verdict pred/meas")
        rows, agree, within = [], 0, 0
        for cfg_key in [FIT] + HELD_OUT:
            n, k, chunk = cfg_key
            m, path = measured[cfg_key], probes[(k, chunk)].path
            B = 1 / (1 / path.bandwidth_gb_per_s + extra_s_per_gb)  # the servers' B, then the engine's cost
            hit_p = T0e + m["h"] * s / (B * 1e9) + (n - m["h"]) / R
            rec_p = n / R
            verdict_p = kvtier.decide_load(node, kvtier.LoadPath(T0e, B), m["h"]).load
            verdict_m = m["hit"] < m["rec"]
            held = cfg_key != FIT
            if held:
                agree += verdict_p == verdict_m
                within += abs(hit_p / m["hit"] - 1) <= 0.25 and abs(rec_p / m["rec"] - 1) <= 0.25
            print(f"{n:>5} {k:>3} {chunk:>5} {m['h']:>5} {B:>7.3f} | {hit_p * 1e3:>6.1f}ms {m['hit'] * 1e3:>5.1f}ms "
                  f"{hit_p / m['hit']:>5.2f} | {rec_p * 1e3:>6.1f}ms {m['rec'] * 1e3:>5.1f}ms {rec_p / m['rec']:>5.2f} | "
                  f"{'load' if verdict_p else 'recompute':>9}/{'load' if verdict_m else 'recompute':<9}"
                  f"{'' if held else '  (fit)'}  spread {m['hit_spread']:.2f}/{m['rec_spread']:.2f}")
            rows.append(dict(n=n, servers=k, chunk=chunk, h=m["h"], B_gbps=B, hit_pred_s=hit_p, hit_meas_s=m["hit"],
                             rec_pred_s=rec_p, rec_meas_s=m["rec"], verdict_pred=verdict_p, verdict_meas=verdict_m,
                             fit=not held))
        load1 = os.getloadavg()
        print(f"\nheld-out: {within}/{len(HELD_OUT)} within +-25% (hit and recompute), verdict agrees "
              f"{agree}/{len(HELD_OUT)}; load average {load0[0]:.1f} -> {load1[0]:.1f} on {os.cpu_count()} cores")
        print(json.dumps(dict(bench="python_engine_cost_model", s_bytes_per_token=s, R1=R1, R2=R2, R_fit=R,
                              T0e_s=T0e, Be_gbps=Be, rows=rows, within_25=within, verdict_agree=agree, held_out=len(HELD_OUT),
                              loadavg=[load0[0], load1[0]])))
    finally:
        for x in servers:
            x.stop()


if __name__ == "__main__":
    main()
