"""The engine's correctness scenarios against real redis-servers (one per rank), W = 1 or W = 2.

Run in-process (W = 1) by the tests, or as W MPI processes:

    mpiexec -n 2 --oversubscribe --allow-run-as-root /usr/bin/python3 scenarios.py \
        --urls resp://127.0.0.1:P0,resp://127.0.0.1:P1 --pids PID0,PID1 --out result.json

Scenarios (prompt A: 100 tokens = 6 full chunks of 16 and a 4-token tail):
  cold      A on empty servers: everything computed, the owned chunks stored
  whole     A again: every full chunk loaded, the tail computed
  exact     A's first 96 tokens (every token keyed): 95 loaded, the last one computed
  partial   A's first 64 tokens + 40 others: 64 loaded
  split     A through a connector with policy 'split' (a prior load path that makes the cost
            model's split point 32): [0, 32) computed while [32, 96) loads
  corrupt   one byte of chunk 2's value overwritten on its owner's server: chunk 2 fails its
            layer group's checksum, [32, 100) recomputed (and chunk 2 stored again)
  killed    rank 0's server SIGKILLed right before the load (its GETs): everything recomputed
Each is compared with a reference computed in this process without kvtier (W = 1 forward of
the same prompt): next-token logits to fp32 tolerance, the same 16 greedy tokens, and the
loaded rows [0, agreed) of every layer bit-identical to the cold run's pages.

Everything goes through the bound kvtier.Connector (tier.BoundTier); each rank's figures come
from it: load_result (agreed), load_errors (the failed chunk indices, agreed on every rank),
counters (tokens_loaded, loads_cut_short, chunks_saved, save_failures), the stored events, and
the store's own stats (bad_checksum).
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "python", "tests"))  # redis_server.py, the tests' harness

import kvtier  # noqa: E402
from cp_prefill import cp_forward, greedy_decode  # noqa: E402
from engine import Engine  # noqa: E402
from mla_model import MlaConfig, MlaModel, PagedKvCache  # noqa: E402
from tier import BoundTier  # noqa: E402

CHUNK = 16
STEPS = 16


def namespace(cfg: MlaConfig, world: int) -> kvtier.KeyNamespace:
    return kvtier.KeyNamespace(model=f"py-mla-L{cfg.n_layers}-d{cfg.d_model}-seed{cfg.seed}",
                               kv_format=f"fp32-latent{cfg.latent_dim}", chunk_tokens=CHUNK,
                               ownership=f"mod:{world}")


SPLIT_PRIOR_GBPS = 0.003  # with T0 = 0 and R below: the cost model splits a 96-token hit at 32


def communicators(comm):
    """(control, data) kvtier communicators: the data one has its own mover thread, so layers land
    while the forward runs (and its collectives never meet the forward's all-gathers)."""
    if comm is None:
        return kvtier.InprocWorld(1).communicator(0), kvtier.InprocWorld(1).communicator(0)
    return kvtier.MpiCommunicator(comm, 10.0), kvtier.MpiCommunicator(comm, 10.0)


def make_tier(comm, cfg, store, ns, cache, policy="always", before_load=None):
    ctrl, data = communicators(comm)
    opts = dict(lookup_timeout=2.0, load_timeout=(5.0, 0.0, 5.0), policy=policy)
    if policy == "split":
        # The node's figures are made up to put the split point at 32, so the loads' wall time
        # stays out of the estimator (the split stays at 32 on a loaded machine) and no load races
        # the made-up recompute time (64 ms for the 64 loaded tokens: a loaded CI machine loses it).
        opts.update(node=kvtier.PrefillNode(cfg.kv_bytes_per_token, 1000.0),
                    prior=kvtier.LoadPath(0.0, SPLIT_PRIOR_GBPS), wall_clock_samples=False)
    return BoundTier(ctrl, data, store, kvtier.Chunker(ns), cache, before_load=before_load, **opts)


def reference(model, tokens):
    cache = PagedKvCache(model.cfg, -(-(tokens.numel() + STEPS) // CHUNK), CHUNK, seed=99)
    table = cache.allocate(tokens.numel() + STEPS)
    logits = model.prefill(tokens, cache, table)
    return logits, greedy_decode(model, None, logits, tokens.numel(), cache, table, STEPS)


def run(comm, urls, pids, cfg=None):
    torch.set_num_threads(1)
    rank = comm.Get_rank() if comm else 0
    world = comm.Get_size() if comm else 1
    cfg = cfg or MlaConfig()
    model = MlaModel(cfg)
    g = torch.Generator().manual_seed(7)
    A = torch.randint(0, cfg.vocab, (100,), generator=g)
    other = torch.randint(0, cfg.vocab, (40,), generator=g)
    prompts = dict(cold=A, whole=A, exact=A[:96], partial=torch.cat([A[:64], other]), split=A, corrupt=A,
                   killed=A)
    kill_armed = {"on": False}

    def before_load():
        if kill_armed["on"] and rank == 0:
            os.kill(pids[0], signal.SIGKILL)  # this rank's server dies as the load begins
            kill_armed["on"] = False

    ns = namespace(cfg, world)
    group = CHUNK * cfg.latent_dim * cfg.elem_bytes  # one layer of a chunk: one checksum each
    store = kvtier.RemoteStore(urls[rank], ns, rank=rank, value_format=2, group_bytes=group, connect_timeout=2.0)
    cache = PagedKvCache(cfg, 64, CHUNK, seed=11 + rank)
    tier = make_tier(comm, cfg, store, ns, cache, before_load=before_load)
    split_tier = None
    out, cold_kv = {}, None
    for name, tokens in prompts.items():
        if name == "corrupt" and rank == 2 % world:  # chunk 2's owner damages its own value
            key = kvtier.Chunker(ns).keys(A.to(torch.int32))[2]
            _flip_on_server(urls[rank], ns.remote_key(key).encode())
        if comm:
            comm.Barrier()  # the damage is done before any rank looks up
        kill_armed["on"] = name == "killed"
        if name == "split":  # every rank builds it here: the same collectives in the same order
            split_tier = make_tier(comm, cfg, store, ns, cache, policy="split")
        t = split_tier if name == "split" else tier
        before = t.counters()
        res = Engine(model, comm, t).run(tokens, steps=STEPS)
        after = t.counters()
        if name == "cold":
            cold_kv = res.kv
        ref_logits, ref_tokens = reference(model, tokens)
        lo = res.front  # a split's front was computed, not loaded
        bit_identical = all(torch.equal(res.kv[l][lo:res.agreed], cold_kv[l][lo:res.agreed])
                            for l in range(cfg.n_layers))
        o = t.outcome
        first, loaded_end = (o.load_first_token, o.loaded_end_token) if o is not None else (0, 0)
        stored = [len(e.keys) for e in t.last_events if e.kind == "stored" and e.rank == rank]
        out[name] = dict(
            hit=res.hit, agreed=res.agreed, front=res.front, tokens=res.tokens, ref_tokens=ref_tokens,
            same_tokens=res.tokens == ref_tokens,
            logits_max_abs_diff=float((res.logits - ref_logits).abs().max()),
            logits_close=bool(torch.allclose(res.logits, ref_logits, rtol=1e-4, atol=1e-4)),
            kv_bit_identical=bool(bit_identical),
            loaded=[first, loaded_end],
            # the chunks of this rank's own server in the agreed outcome (ownership c mod W)
            chunks_loaded=sum(1 for c in range(first // CHUNK, loaded_end // CHUNK) if c % world == rank),
            load_errors=t.last_load_errors,
            counters={k: after[k] - before[k] for k in after},
            stored_events=stored,
            layer_waits=list(t.layer_waits),
            timings=res.timings)
        if name == "split":
            split_tier.close()
    # CP prefill alone against one process, at lengths that leave a rank without tokens (1) or
    # give the ranks unequal shares (37)
    out["cp"] = {}
    for n in (1, 37, 150):
        toks = torch.randint(0, cfg.vocab, (n,), generator=g)
        c2 = PagedKvCache(cfg, 16, CHUNK, seed=5 + rank)
        lg = cp_forward(model, comm, toks, 0, c2, c2.allocate(n))
        ref_logits, _ = reference(model, toks)
        out["cp"][n] = dict(max_abs_diff=float((lg - ref_logits).abs().max()),
                            close=bool(torch.allclose(lg, ref_logits, rtol=1e-4, atol=1e-4)))
    out["store_stats"] = store.stats()
    tier.close()
    store.close()
    return out


def _flip_on_server(url, key: bytes):
    """Overwrites one stored byte of `key` with another value (SETRANGE), as silent corruption would."""
    from redis_server import Server
    srv = Server.__new__(Server)  # attach to the running server: only its port is needed
    srv.port = int(url.rsplit(":", 1)[1])
    offset = srv.call("STRLEN", key) - 10  # inside the last layer group's payload
    old = srv.call("GETRANGE", key, offset, offset)
    srv.call("SETRANGE", key, offset, bytes([old[0] ^ 0x5A]))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--urls", required=True)
    ap.add_argument("--pids", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    res = run(comm, a.urls.split(","), [int(p) for p in a.pids.split(",")])
    with open(f"{a.out}.{comm.Get_rank()}", "w") as f:
        json.dump(res, f, default=str)


if __name__ == "__main__":
    main()
