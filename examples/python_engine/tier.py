"""The engine's side of the bound connector: one request's kvtier.Connector lifecycle.

`kvtier.Connector` (python/src/bind_connector.cpp) does the tier's work in C++: the keys, the
ownership c mod W, EXISTS of the owned chunks and the MIN agreement (one all-reduce per step()),
the owned GETs on its fetch workers, the agreed load outcome, and the landing of every chunk into
every rank's pages layer by layer over the data communicator (its mover thread), which
wait_for_layer(l) waits for; save() PUTs the owned full chunks on its saver thread. This class
only turns that into the calls the engine makes once per request:

    tier = BoundTier(ctrl, data, store, chunker, cache)     # ctrl/data: kvtier communicators
    hit = tier.lookup(tokens, deadline)                     # begin_lookup + step() until agreed
    front = tier.load_front(split)                          # the plan's load_first_token
    tier.start_load(tokens, table, first=front, upto=min(hit, n - 1), deadline=deadline)
    agreed = tier.agreed_tokens()                           # step() until load_result(id)
    logits = cp_forward(model, comm, tokens[agreed:], agreed, cache, table, tier.wait_for_layer)
    tier.save(tokens, table, from_token=agreed, deadline=deadline)   # save + finish: returns at once
    ...                                                     # decode while the saver reads the pages
    tier.settle()                                           # steps (every rank) until no save runs

Every rank makes the same calls in the same order; the step() loops end on agreed values (an
agreed plan, an agreed load outcome), so every rank runs the same number of steps. A miss, a
corrupt value, a timeout or a dead server only shortens the agreed outcome (load_errors(id) names
the chunks), never raises here.
"""
from __future__ import annotations

import time

import torch

import kvtier

MAX_STEPS = 5000  # step() loops: bounded in count (and in time by the deadline of each step)
ALL_ONES = (1 << 64) - 1  # a step's words agree the min over ranks: of ALL_ONES - x, the max of x


class BoundTier:
    """See the module comment. `cache` is the engine's PagedKvCache; its pages are the connector's."""

    def __init__(self, ctrl, data, store, chunker, cache, layer_wait_s: float = 30.0, before_load=None,
                 step_timeout_s: float = 10.0, **connector_options):
        cfg = cache.cfg
        self.step_timeout_s = step_timeout_s  # each step()'s deadline: how long a rank waits for the others
        self.before_load = before_load  # test hook: runs right before the load starts (its GETs)
        self.cache, self.chunk_tokens, self.layer_wait_s = cache, chunker.chunk_tokens, layer_wait_s
        layout = kvtier.KvLayout.vllm_mla(cfg.n_layers, num_blocks=cache.num_blocks, block_size=cache.block_size,
                                          elem_bytes=cfg.elem_bytes, latent=cfg.latent_dim)
        self.view = kvtier.KvCacheView.per_layer(layout, cache.layers)
        self.ctrl, self.data = ctrl, data
        self.conn = kvtier.Connector(chunker, store, ctrl, self.view, data=data, **connector_options)
        self.conn.check_deployment(10.0)
        self.rank, self.world = ctrl.rank, ctrl.size
        self._next_id, self.id, self.plan, self.outcome = 0, None, None, None
        self._saving: set[int] = set()  # requests whose saves still read their pages (finished() frees)
        self._saving_anywhere = 0  # agreed at each step: the most such requests on any rank
        self.last_load_errors: list[int] = []
        self.last_events: list = []
        self.layer_waits: list[int] = []
        self.layer_wait_total_s = 0.0  # this request's time in the forward's wait_for_layer calls

    def _step_until(self, done, what: str):
        for _ in range(MAX_STEPS):
            words = self.conn.step(self.step_timeout_s, [ALL_ONES - len(self._saving)])
            self._saving_anywhere = ALL_ONES - words[0]
            self._saving.difference_update(self.conn.finished().saves)  # vLLM's get_finished
            if done():
                return
            time.sleep(0.001)  # let the fetch workers answer
        raise RuntimeError(f"rank {self.rank}: request {self.id}: {what} not agreed in {MAX_STEPS} steps")

    # ---- scheduler side -----------------------------------------------------------------------

    def lookup(self, tokens: torch.Tensor, deadline) -> int:
        """The agreed hit (tokens): the longest prefix every rank's server holds."""
        self._next_id += 1
        self.id, self.plan, self.outcome, self.last_load_errors = self._next_id, None, None, []
        self.layer_waits: list[int] = []
        self.layer_wait_total_s = 0.0
        self.conn.begin_lookup(self.id, tokens.to(torch.int32))
        self._step_until(lambda: self.conn.lookup(self.id) is not None, "the lookup")
        self.plan = self.conn.lookup(self.id)
        return self.plan.cached_tokens

    def load_front(self, split: int) -> int:
        """Tokens [0, front) the engine computes while the rest loads: the connector's plan says
        (policy 'split' chooses it from the cost model; 'always' loads from 0)."""
        return self.plan.load_first_token

    def start_load(self, tokens: torch.Tensor, table: list[int], first: int, upto: int, deadline) -> None:
        """Starts the load into the pages; returns at once. The plan's range [load_first_token,
        load_end_token), or, when `upto` ends whole chunks earlier, only the chunks covering
        [first, upto). Rows past `upto` that land are recomputed by the forward (it writes them
        after the wait)."""
        if first != self.plan.load_first_token:
            raise ValueError(f"first ({first}) must be the plan's load_first_token ({self.plan.load_first_token})")
        self._upto, self._first = upto, first
        if self.before_load is not None:
            self.before_load()
        C, plan_end = self.chunk_tokens, self.plan.load_end_token
        end = min(plan_end, -(-upto // C) * C)  # the whole chunks that cover [first, upto)
        slots = self.cache.slots(table, 0, tokens.numel())
        if first < end < plan_end:  # capped below the plan: fetch only those chunks (a ranged load)
            self.conn.load(self.id, slots, first_token=first, end_token=end)
        else:
            self.conn.load(self.id, slots)

    # ---- worker side --------------------------------------------------------------------------

    def agreed_tokens(self) -> int:
        """Tokens [0, agreed) will be in the pages (the same on every rank)."""
        try:  # this rank's fetch first: then the next step agrees the whole load, not a prefix
            self.conn.wait_local(self.id, self.layer_wait_s)
        except (kvtier.TimeoutError, kvtier.InvalidArgument):
            pass  # a fetch still running (or none started here): the steps below settle it alike
        self._step_until(lambda: self.conn.load_result(self.id) is not None, "the load outcome")
        self.outcome = self.conn.load_result(self.id)
        self.last_load_errors = self.conn.load_errors(self.id)
        return max(self._first, min(self._upto, self.outcome.loaded_end_token))

    def wait_for_layer(self, layer: int) -> None:
        """Returns once layer `layer` of every agreed chunk is in this rank's pages."""
        self.layer_waits.append(layer)  # what the forward asked for, in order (the tests check it)
        t = time.perf_counter()
        self.conn.wait_for_layer(layer, self.layer_wait_s)
        self.layer_wait_total_s += time.perf_counter() - t

    def finish_load(self) -> None:
        for layer in range(self.cache.cfg.n_layers):  # nothing lands in pages freed afterwards
            self.conn.wait_for_layer(layer, self.layer_wait_s)

    def save(self, tokens: torch.Tensor, table: list[int], from_token: int, deadline=None) -> None:
        """PUTs this rank's owned full chunks at or after from_token (the saver thread, by the
        connector's save_timeout) and finishes the request; returns at once. The pages stay until
        settle() says no rank's saves run any more: this rank never waits for its save alone (a
        peer's step would wait for it)."""
        n = tokens.numel()
        if from_token < n // self.chunk_tokens * self.chunk_tokens:
            self.conn.save(self.id, self.cache.slots(table, 0, n), from_token, n)
        if not self.conn.finish(self.id):  # the saves still read the pages: a later step frees them
            self._saving.add(self.id)

    def settle(self) -> None:
        """Steps, every rank together, until no rank has a save running (an agreed condition, so every
        rank takes the same steps); then every page this tier held for saves is free again."""
        self._step_until(lambda: self._saving_anywhere == 0, "the end of the saves")
        self.last_events = self.conn.drain_events()

    def counters(self) -> dict:
        return self.conn.counters()

    def close(self) -> None:
        self.conn.close()
