"""The Python engine: MlaModel + paged cache + context-parallel prefill + kvtier through a connector.

One request on every rank (the same tokens everywhere):
  lookup -> hit (min over ranks) -> policy: load or recompute -> start_load on a thread
  -> [split: compute the front [0, k) meanwhile] -> agreed prefix -> CP prefill of [agreed, n),
  layer l waiting only for layer l of the load -> save the owned chunks past the agreed prefix
  -> greedy decode.

    model = MlaModel(MlaConfig())
    eng = Engine(model, comm, tier)                   # tier: tier.BoundTier or None
    res = eng.run(tokens, steps=16)
    res.tokens, res.logits, res.agreed, res.timings
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from cp_prefill import cp_forward, greedy_decode
from mla_model import MlaModel, PagedKvCache

import kvtier


@dataclass
class RequestResult:
    tokens: list[int]            # the greedy continuation
    logits: torch.Tensor         # next-token logits after the prompt
    hit: int                     # lookup's agreed hit (tokens)
    agreed: int                  # tokens [0, agreed) not computed by the prefill (loaded, or the split's front)
    kv: list[torch.Tensor]       # per layer, the prompt's rows [0, n) as the pages held them
    front: int = 0               # a split's front [0, front): computed while the rest loaded
    timings: dict = field(default_factory=dict)


class Engine:
    def __init__(self, model: MlaModel, comm=None, connector=None, num_blocks: int = 256,
                 block_size: int = 16, policy=None, cache_seed: int = 1):
        self.model, self.cfg = model, model.cfg
        self.comm = comm if comm is not None and comm.Get_size() > 1 else None
        self.connector = connector
        self.cache = connector.cache if connector is not None else PagedKvCache(
            self.cfg, num_blocks, block_size, seed=cache_seed)
        # policy(hit_tokens, prompt_tokens) -> True to load; default: load every hit
        self.policy = policy or (lambda hit, n: hit > 0)

    def run(self, tokens: torch.Tensor, steps: int = 16, split: int = 0, deadline_s: float = 10.0,
            keep_kv: bool = True, save: bool = True, max_load: int | None = None) -> RequestResult:
        """One request. split > 0 (a chunk boundary below the hit) computes [0, split) while the
        tier loads [split, hit). save=False writes nothing back (a measurement that must find the
        same hit again). max_load caps the tokens taken from the tier below the hit (the tier
        loads only the whole chunks below it: the connector's ranged load)."""
        n = tokens.numel()
        t_start = time.perf_counter()
        table = self.cache.allocate(n + steps)
        try:
            conn, hit, agreed = self.connector, 0, 0
            dl = kvtier.Deadline.after(deadline_s)  # one deadline for the request's tier calls
            if conn is not None:
                hit = conn.lookup(tokens, dl)
            t_lookup = time.perf_counter()
            upto = min(hit, n - 1)  # the last prompt token is always computed: its logits are needed
            if max_load is not None:
                upto = min(upto, max_load)
            front = conn.load_front(split) if conn is not None else 0
            loading = conn is not None and upto > front and self.policy(upto, n)
            wait = None
            if loading:
                conn.start_load(tokens, table, first=front, upto=upto, deadline=dl)
                if front > 0:  # split: the front is computed while the back loads
                    cp_forward(self.model, self.comm, tokens[:front], 0, self.cache, table)
                agreed = conn.agreed_tokens()
                wait = conn.wait_for_layer
            t_agreed = time.perf_counter()
            logits = cp_forward(self.model, self.comm, tokens[agreed:], agreed, self.cache, table, wait)
            t_prefill = time.perf_counter()
            if loading:
                conn.finish_load()
            if conn is not None:  # write back what this request computed (full chunks only)
                # chunks below the hit are on every owner's server already; a chunk only partly
                # loaded (the last token recomputed) is not written again
                done = agreed if loading else hit
                conn.save(tokens, table, from_token=-(-done // conn.chunk_tokens) * conn.chunk_tokens if save else n,
                          deadline=kvtier.Deadline.after(deadline_s))
            t_saved = time.perf_counter()
            kv = [self.cache.read(l, self.cache.slots(table, 0, n)).clone() for l in range(self.cfg.n_layers)] \
                if keep_kv else []
            out = greedy_decode(self.model, self.comm, logits, n, self.cache, table, steps)
            if conn is not None:  # the saves ran during the decode; steps (on every rank) until they ended
                conn.settle()
            t_end = time.perf_counter()
        finally:
            self.cache.free(table)
        # layer_wait_s: the forward's time in wait_for_layer (layers still landing), part of the load
        layer_wait_s = getattr(conn, "layer_wait_total_s", 0.0) if loading else 0.0
        return RequestResult(out, logits, hit, agreed, kv, front if loading else 0, dict(
            lookup_s=t_lookup - t_start, load_wait_s=t_agreed - t_lookup, prefill_s=t_prefill - t_start,
            layer_wait_s=layer_wait_s,
            save_s=t_saved - t_prefill, decode_s=t_end - t_saved))
