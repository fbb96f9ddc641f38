"""The cost model against this machine: predicted against measured hit and recompute wall-clock.

Runs as 2 MPI processes, each with its own redis-server (the 1-server configurations run on rank
0 alone, over MPI.COMM_SELF, while rank 1 waits without spinning; the 2-server ones on both ranks,
context-parallel, each rank loading the chunks it owns from its own server):

    mpiexec -n 2 --oversubscribe /usr/bin/python3 examples/python_engine/cost_model_check.py [--reps 11]

Every request goes through the bound kvtier.Connector (tier.BoundTier). Measured:
  s     bytes per token of the bench model's KV (all layers)
  B,T0  of the same servers through kvtier's store and the probe's fit (kvtier.fit_batches over a
        ladder of GET batches 16..1 of chunk-sized values), at every chunk size; reported beside
        the engine's load path (the probe's batched GETs pay none of the engine's per-chunk work)
  hit   per case the engine's prefill wall-clock, split into its load part (lookup, the wait for
        the agreed load outcome, the forward's waits for landing layers) and its compute part
  rec   the same prompt with the load declined (lookup, then everything computed)
The model, fitted on the FIT configurations only, for each W separately (2 processes running a
context-parallel prefill are another machine than 1); cost_fit.py holds the fits:
  recompute(n)   = n / R(n), the per-token cost 1/R(n) piecewise linear in n through the fit
                   lengths' recompute medians (constant below the shortest, which check_split
                   keeps at or below every held-out length, the last slope past the longest): a
                   layer's 128 latent rows (4 MiB) fit the L2 cache, more do not, so one R cannot
                   serve both ends
  after_hit(n)   = the forward of the last token after a whole hit (it attends over every row),
                   piecewise linear in n through the fit lengths' measured compute parts
  load(k, gb)    = T0 + k*c + gb/B over the fit configurations' loads of n/4, n/2 and n-1 tokens
                   (n/4 and n/2 where they hold a whole chunk, fit_hits)
                   at two chunk sizes (16 and 64 tokens), least squares of the relative error,
                   each term >= 0: c is the per-chunk cost (a GET, a checksum per layer group, the
                   scatter, the mover's per-chunk work) that one chunk size cannot tell from 1/B
  hit            = load(chunks of the hit, their GB) + after_hit(n)
  verdict        = kvtier.decide_load(PrefillNode(s, R_eff), LoadPath(T0, B_chunk), h): B_chunk
                   the path's bandwidth in whole chunks of that size (c folded into 1/B), R_eff the
                   rate at which h tokens cost what the hit saves, recompute(n) - after_hit(n)
The held-out configurations (other prompt lengths, 1 and 2 servers, another chunk size: 32) are
predicted and printed against their medians, with p25-p75. Noise handling: one discarded warm-up
round, then --reps rounds; in each round every case's hit and recompute run, each timed hit after
an untimed one of the same case (Case.warm, --warm case), the cases in an order shuffled per round
from a seed both ranks share (a drift of the machine's load then hits every case alike); the
set-up's objects frozen out of the garbage collector (gc.freeze), the collector off while timing;
at W = 2 each timed request starting at a barrier of both ranks (align: rank 0's timer must not
count rank 1's late arrival); 1 torch/OpenMP/BLAS thread per process; the load average
sampled each round; per recompute the process CPU time beside the wall-clock (how much of the wall
the process ran: the rest it waited for one of the 2 shared cores).

Hits shorter than the prompt (the fit's h = n/4, n/2) are loads capped below the hit: the whole
prompt is stored, and the connector's ranged load fetches only the first h tokens' chunks
(Engine.run(max_load=h) -> Connector.load(id, slots, first_token=0, end_token=h)); those runs write
nothing back (save=False).
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
    os.environ.setdefault(_v, "1")  # before torch loads: no thread pools beside the one measured

import torch  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "python", "tests"))  # redis_server.py, the tests' harness

import kvtier  # noqa: E402
from cost_fit import LoadPoint, check_split, fit_load_path, piecewise, spread  # noqa: E402
from engine import Engine  # noqa: E402
from mla_model import MlaConfig, MlaModel, PagedKvCache  # noqa: E402
from redis_server import Server  # noqa: E402
from tier import BoundTier  # noqa: E402

# d_model 16 and a 8192-wide latent: 64 KiB of KV per token for little compute, so B* = s*R is
# a few hundred MB/s here, inside what the servers deliver
BENCH = MlaConfig(vocab=256, d_model=16, n_layers=2, n_heads=1, nope_dim=8, rope_dim=8, v_dim=8,
                  kv_lora_rank=8184, d_ff=32, seed=3)
# (prompt tokens, servers = ranks, chunk tokens). The fit: two chunk sizes per W (16, 64), R(n)
# through each W's fit lengths, the shortest at or below the shortest held-out length (below it
# the model would only guess: a fixed per-request cost dominates on a quiet machine, preemption of
# long requests under load), a knot at 384 at W = 1 (the per-token cost is not linear between 256
# and 512: the latent rows leave the L2 there). Held out: chunk 32 (between the fit's), lengths
# the fit has not (64, 96 between 48 and 128; 320, 448 on each side of the 384 knot; 640 past
# W = 2's longest), both verdicts at W = 1.
FIT = [(48, 1, 16), (128, 1, 16), (256, 1, 64), (384, 1, 64), (512, 1, 16), (768, 1, 64),
       (128, 2, 16), (256, 2, 64), (512, 2, 64)]
HELD_OUT = [(64, 1, 16), (96, 1, 32), (192, 1, 32), (320, 1, 32), (448, 1, 64), (640, 1, 32),
            (192, 2, 32), (320, 2, 16), (384, 2, 32), (640, 2, 64)]


def fit_hits(n, chunk):
    """The capped hits of a fit configuration: n/4 and n/2 where they hold a whole chunk (a cap
    below one chunk loads nothing), then the whole prompt (None)."""
    return tuple(h for h in (n // 4, n // 2) if h >= chunk) + (None,)


def idle_barrier(comm):
    """A barrier that sleeps instead of spinning (an MPI barrier would take a core from the rank
    that measures)."""
    req = comm.Ibarrier()
    for _ in range(10 ** 6):
        if req.Test():
            return
        time.sleep(0.002)
    raise RuntimeError("idle_barrier: the other rank never arrived")


def align(comm):
    """Every rank of comm starts the next timed request together. A W = 2 request begins with a
    collective (the lookup's agreement), so without this rank 0's timer would also count how much
    later rank 1 arrived from whatever it did before (a full collection before each timed hit
    differed between the ranks by up to 100 ms; with the set-up frozen out of the collector the
    ranks arrive within a few ms). MPI_Barrier, not idle_barrier: a sleep right before the timed
    request hands the core, and its cache, to another process."""
    if comm.Get_size() > 1:
        comm.Barrier()


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
        ctrl, data = kvtier.MpiCommunicator(comm, 60.0), kvtier.MpiCommunicator(comm, 60.0)
        # generous deadlines: at load 25 on the 2 cores a rank was once descheduled for more than the
        # 2 s step deadline the tests use (the agreement timed out and poisoned the communicator)
        self.tier = BoundTier(ctrl, data, store, kvtier.Chunker(ns), self.cache, step_timeout_s=60.0,
                              lookup_timeout=30.0, load_timeout=(30.0, 0.0, 30.0))
        cp = comm if w > 1 else None
        self.load = Engine(model, cp, self.tier, policy=lambda h, nn: True)
        self.recompute = Engine(model, cp, self.tier, policy=lambda h, nn: False)
        self.tokens = torch.randint(0, cfg.vocab, (n,), generator=torch.Generator().manual_seed(seed))
        self.full, self.cap = hit_len is None, hit_len
        self.load.run(self.tokens, steps=1, keep_kv=False)  # cold: stores every full chunk (once per prompt)
        self.hits, self.loads, self.computes, self.recs, self.rec_cpu, self.agreed = [], [], [], [], [], set()

    def warm(self):
        """One untimed hit of this prompt (nothing written back). At W = 2 the first hit of a case
        in a round is slower, also after a warm-up hit of the turn's last case (the fit's n/4 hits
        loaded 1-2 chunks in 24-59 ms, the n/2 ones 10-25 ms for 2-4 chunks): a held-out
        configuration has one case per turn, a fit one three, so unwarmed the two were timed in
        different states."""
        self.load.run(self.tokens, steps=1, keep_kv=False, save=False, max_load=self.cap)

    def measure(self, keep=True):
        gc.collect()  # only what the rounds allocated: the set-up's objects are frozen (main)
        gc.disable()
        try:
            align(self.comm)
            r = self.load.run(self.tokens, steps=1, keep_kv=False, save=False, max_load=self.cap)
            if self.full:
                align(self.comm)
                c0 = time.process_time()
                rec = self.recompute.run(self.tokens, steps=1, keep_kv=False).timings["prefill_s"]
                cpu = time.process_time() - c0
        finally:
            gc.enable()
        if not keep:
            return
        t = r.timings
        load_s = t["lookup_s"] + t["load_wait_s"] + t["layer_wait_s"]
        self.hits.append(t["prefill_s"])
        self.loads.append(load_s)
        self.computes.append(t["prefill_s"] - load_s)
        self.agreed.add(r.agreed)
        if self.full:
            self.recs.append(rec)
            self.rec_cpu.append(cpu)

    def medians(self):
        if len(self.agreed) != 1:
            raise RuntimeError(f"case {self.key}: the loaded prefix varied: {self.agreed}")
        h = next(iter(self.agreed))
        m = dict(h=h, chunks=-(-h // self.chunk), hit_q=spread(self.hits), load=statistics.median(self.loads),
                 compute=statistics.median(self.computes))
        m["hit"] = m["hit_q"][1]
        if self.recs:
            m.update(rec_q=spread(self.recs), rec=statistics.median(self.recs),
                     rec_cpu_share=statistics.median(c / w for c, w in zip(self.rec_cpu, self.recs)))
        return m


def main():
    from mpi4py import MPI
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=11, help="measured rounds (after one warm-up round)")
    ap.add_argument("--probe-rounds", type=int, default=5)
    ap.add_argument("--seed", type=int, default=7, help="of the per-round case order")
    ap.add_argument("--warm", choices=("case", "turn", "none"), default="case",
                    help="an untimed hit before every timed one (case), before each configuration's turn "
                         "in a round (turn), or none (the method of the runs before either)")
    ap.add_argument("--json", help="write the JSON line here too (rank 0)")
    a = ap.parse_args()
    world, self_comm = MPI.COMM_WORLD, MPI.COMM_SELF
    if world.Get_size() != 2:
        raise SystemExit("run as 2 MPI processes: mpiexec -n 2 ... cost_model_check.py")
    check_split(FIT, HELD_OUT)
    rank = world.Get_rank()
    torch.set_num_threads(1)
    cfg, s = BENCH, BENCH.kv_bytes_per_token
    model = MlaModel(cfg)
    loads_seen = [os.getloadavg()[0]]
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
        # every case, stored cold first: the fit configurations at three hit lengths (one prompt),
        # the others at the whole prompt (every full chunk: the last token is computed)
        cases = []
        for n, w, chunk in configs:
            if w == 2:
                idle_barrier(world)  # rank 0's 1-server cases are set up (rank 1 did not spin meanwhile)
            elif rank != 0:
                continue
            ns, store = stores[(w, chunk)]
            comm = world if w == 2 else self_comm
            for h in (fit_hits(n, chunk) if (n, w, chunk) in FIT else (None,)):
                key = (n, w, chunk) if h is None else (n, w, chunk, h)
                cases.append(Case(key, model, comm, store, ns, h, seed=n * 31 + chunk * 7 + w))
        # the set-up's objects (the model, the cases, torch's own) live until the end: frozen out of
        # the collector, so the collection before each timed request walks only what the rounds
        # allocated (a full one took 85-165 ms per rank here, and differed between the ranks)
        gc.collect()
        gc.freeze()
        # rank 1 holds only the W = 2 cases; both ranks walk the configurations in the same order
        # (shuffled per round from the shared seed)
        order = random.Random(a.seed)
        for rnd in range(a.reps + 1):
            walk = list(configs)
            order.shuffle(walk)
            for n, w, chunk in walk:
                turn = [c for c in cases if c.key[:3] == (n, w, chunk)]
                if turn and a.warm == "turn":
                    turn[-1].warm()  # untimed: the first request of a turn pays a start-up cost at W = 2
                for c in turn:
                    if a.warm == "case":
                        c.warm()  # untimed: every timed hit follows one of the same case
                    c.measure(keep=rnd > 0)  # round 0: the warm-up, dropped
                if w == 1:
                    idle_barrier(world)
            loads_seen.append(os.getloadavg()[0])
        measured = {c.key: c.medians() for c in cases}
        for c in cases:
            c.tier.close()
        if rank != 0:
            return
        report(a, measured, probes, s, loads_seen)
    finally:
        server.stop()


def report(a, measured, probes, s, loads_seen):
    """The fit on FIT only, the predictions, the tables (text and markdown) and the JSON line."""
    fits = {w: [k for k in measured if k[:3] in FIT and k[1] == w] for w in (1, 2)}
    # compute: per token of a recompute (1/R(n)) and the last token's forward after a whole hit,
    # each piecewise linear in n through that W's fit lengths
    per_token = {w: piecewise([(k[0], measured[k]["rec"] / k[0]) for k in keys if "rec" in measured[k]])
                 for w, keys in fits.items()}
    last_row = {w: piecewise([(k[0], measured[k]["compute"]) for k in keys if "rec" in measured[k]])
                for w, keys in fits.items()}

    def recompute_s(w, n):
        return n * per_token[w](n)

    def after_hit_s(w, n, h):  # computing [h, n) after a hit of h (h = n - 1: the last token)
        return last_row[w](n) if h == n - 1 else recompute_s(w, n) - recompute_s(w, h)

    # load: T0 + k c + gb / B over the fit's loads (three per configuration, two chunk sizes)
    paths = {}
    for w, keys in fits.items():
        pts = [LoadPoint(measured[k]["chunks"], measured[k]["chunks"] * k[2] * s / 1e9, measured[k]["load"])
               for k in keys]
        paths[w] = fit_load_path(pts)
    for w, p in paths.items():
        print(f"fit W={w}: R(n) = " + ", ".join(f"{n}: {n / recompute_s(w, n):.0f}" for n in (48, 64, 128, 256, 384, 512, 768))
              + " tok/s; the last token after a hit of n-1: " + ", ".join(
                  f"{n}: {after_hit_s(w, n, n - 1) * 1e3:.1f}" for n in (64, 256, 768))
              + f" ms; load: T0 = {p.fixed_s * 1e3:.2f} ms, c = {p.per_chunk_s * 1e3:.2f} ms/chunk, "
              f"B = {p.bandwidth_gb_per_s:.3f} GB/s (terms {'+'.join(p.terms)}, rms {p.rms_relative * 100:.1f} %); "
              "B in whole chunks: " + ", ".join(
                  f"{c}: {p.bandwidth_for_chunk(c * s / 1e9):.3f}" for c in (16, 32, 64)) + " GB/s")
    rows, held = [], dict(n=0, both=0, hit=0, rec=0, verdict=0, seen=set())
    md = ["| n | W | chunk | h | hit pred | hit meas (p25–p75) | ratio | rec pred | rec meas (p25–p75) | ratio "
          "| rec CPU/wall | B* = s·R | verdict pred / meas |",
          "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for key in FIT + HELD_OUT:
        n, w, chunk = key
        m, p = measured[key], paths[w]
        h = m["h"]
        gb = m["chunks"] * chunk * s / 1e9
        rec_p = recompute_s(w, n)
        hit_p = p.seconds(m["chunks"], gb) + after_hit_s(w, n, h)
        saving = rec_p - after_hit_s(w, n, h)  # what the hit saves in compute
        r_eff = h / saving if saving > 0 else 1e-9
        b_chunk = p.bandwidth_for_chunk(chunk * s / 1e9)
        verdict_p = kvtier.decide_load(kvtier.PrefillNode(s, r_eff), kvtier.LoadPath(p.fixed_s, b_chunk), h).load
        verdict_m = m["hit"] < m["rec"]
        is_held = key not in FIT
        ok_hit, ok_rec = abs(hit_p / m["hit"] - 1) <= 0.25, abs(rec_p / m["rec"] - 1) <= 0.25
        if is_held:
            held["n"] += 1
            held["both"] += ok_hit and ok_rec
            held["hit"] += ok_hit
            held["rec"] += ok_rec
            held["verdict"] += verdict_p == verdict_m
            held["seen"].add(verdict_m)
        hq, rq = m["hit_q"], m["rec_q"]
        word = {True: "load", False: "recompute"}
        print(f"{n:>5} {w:>2} {chunk:>5} {h:>5} | hit {hit_p * 1e3:6.1f} / {m['hit'] * 1e3:6.1f} ms "
              f"({hq[0] * 1e3:.1f}-{hq[2] * 1e3:.1f}) {hit_p / m['hit']:5.2f}{'' if ok_hit else '*'} | rec "
              f"{rec_p * 1e3:6.1f} / {m['rec'] * 1e3:6.1f} ms ({rq[0] * 1e3:.1f}-{rq[2] * 1e3:.1f}) "
              f"{rec_p / m['rec']:5.2f}{'' if ok_rec else '*'} | cpu {m['rec_cpu_share']:.2f} | "
              f"{word[verdict_p]}/{word[verdict_m]}{'' if is_held else '  (fit)'}")
        bold = lambda ok, x: f"{x:.2f}" if ok else f"**{x:.2f}**"  # noqa: E731
        md.append(f"| {n} | {w} | {chunk} | {h} | {hit_p * 1e3:.1f} | {m['hit'] * 1e3:.1f} ({hq[0] * 1e3:.1f}–"
                  f"{hq[2] * 1e3:.1f}) | {bold(ok_hit, hit_p / m['hit'])} | {rec_p * 1e3:.1f} | {m['rec'] * 1e3:.1f} "
                  f"({rq[0] * 1e3:.1f}–{rq[2] * 1e3:.1f}) | {bold(ok_rec, rec_p / m['rec'])} | "
                  f"{m['rec_cpu_share']:.2f} | {s * r_eff / 1e9:.3f} | {word[verdict_p]} / "
                  f"{word[verdict_m] if verdict_p == verdict_m else '**' + word[verdict_m] + '**'}"
                  f"{'' if is_held else ' (fit)'} |")
        rows.append(dict(n=n, W=w, chunk=chunk, h=h, chunks=m["chunks"], B_chunk_gbps=b_chunk, hit_pred_s=hit_p,
                         hit_meas_s=m["hit"], hit_p25_p75=[hq[0], hq[2]], load_meas_s=m["load"],
                         compute_meas_s=m["compute"], rec_pred_s=rec_p, rec_meas_s=m["rec"],
                         rec_p25_p75=[rq[0], rq[2]], rec_cpu_share=m["rec_cpu_share"], b_star_gbps=s * r_eff / 1e9,
                         verdict_pred=verdict_p, verdict_meas=verdict_m, fit=not is_held))
    H = held["n"]
    ld = sorted(loads_seen)
    summary = (f"warm-up hits: {a.warm}; timed requests start at a barrier, set-up frozen out of the gc; "
               f"held-out: {held['both']}/{H} within +-25% on both (hit {held['hit']}/{H}, recompute "
               f"{held['rec']}/{H}); verdict right {held['verdict']}/{H}; measured verdicts among them: "
               f"{sorted('load' if v else 'recompute' for v in held['seen'])}; {a.reps} rounds after a warm-up; "
               f"load average (1 min) {ld[0]:.1f}..{ld[-1]:.1f}, median {statistics.median(ld):.1f} on "
               f"{os.cpu_count()} cores; probe B "
               + ", ".join(f"{w}x{c}: {probes[(w, c)].path.bandwidth_gb_per_s:.3f}" for w, c in sorted(probes))
               + " GB/s")
    print("\n" + "\n".join(md) + "\n")
    print(summary)
    line = json.dumps(dict(bench="python_engine_cost_model", s_bytes_per_token=s, reps=a.reps, warm=a.warm,
                           start="barrier", gc="set-up frozen",  # the method since run 12 (align, main)
                           R_per_n={str(w): {n: n / recompute_s(w, n) for n in (48, 64, 128, 256, 384, 512, 640, 768)}
                                    for w in (1, 2)},
                           load_path={str(w): dict(T0_s=p.fixed_s, per_chunk_s=p.per_chunk_s,
                                                   B_gbps=p.bandwidth_gb_per_s, terms=p.terms,
                                                   rms_relative=p.rms_relative) for w, p in paths.items()},
                           probes={f"{w}x{c}": dict(B_gbps=probes[(w, c)].path.bandwidth_gb_per_s,
                                                    T0_s=probes[(w, c)].path.fixed_cost_s) for w, c in probes},
                           rows=rows, cases={"/".join(map(str, k)): dict(h=m["h"], chunks=m["chunks"], hit_s=m["hit"],
                                                                    load_s=m["load"], compute_s=m["compute"])
                                             for k, m in measured.items()},  # the capped fit hits too
                           within_25=held["both"], within_25_hit=held["hit"], within_25_rec=held["rec"],
                           verdict_right=held["verdict"], held_out=H, loadavg=loads_seen))
    print(line)
    if a.json:
        with open(a.json, "w") as f:
            f.write(line + "\n")


if __name__ == "__main__":
    main()
