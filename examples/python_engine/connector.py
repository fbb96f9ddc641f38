"""kvtier's connector lifecycle for the Python engine, composed from the bound parts.

This one class is what the bound connector (`kvtier.Connector`, the connector issue) replaces:
the engine calls only lookup / start_load / agreed_tokens / wait_for_layer / save / close.

Per rank r of W (mpi4py communicator, or none for one process):
  keys     = chunker.keys(tokens)                     one per full chunk of chunk_tokens tokens
  owned    = chunks c with c mod W == r               rank r talks only to its own server
  lookup   : EXISTS of the owned keys -> rank answer (start of the first missing owned chunk),
             all-reduce MIN = the longest prefix every rank can serve
  load     : GET of the owned chunks in [first, upto) into one staging tensor (zero copy, the GIL
             released by the bindings), rank answer after the load, all-reduce MIN = agreed
             prefix; then layer by layer: each owner broadcasts layer l of its chunks and every
             rank scatters it into its pages; wait_for_layer(l) returns once layer l has landed
  save     : gather the owned chunks' rows from the pages (layer-major value) and PUT them

A chunk's value is kvtier's canonical layer-major format (include/kvtier/kv_copy.hpp): layer 0
rows of the chunk's tokens, then layer 1, ... (one plane, one head), so with value format 2 and
group_bytes = one layer's bytes, each layer of each value has its own checksum.

Every failure (miss, corrupt value, timeout, dead server) only shortens a rank's answer; the MIN
makes every rank recompute from the same token. The collectives (one all-reduce per lookup, one
per load, one broadcast per layer and owner with chunks) depend only on agreed values and W.

    conn = PartsConnector(comm, store, chunker, cfg, cache)
    hit = conn.lookup(tokens, deadline)
    conn.start_load(tokens, table, first=0, upto=min(hit, n - 1), deadline=deadline)
    agreed = conn.agreed_tokens()                    # the forward starts from here
    logits = cp_forward(model, comm, tokens[agreed:], agreed, cache, table, conn.wait_for_layer)
    conn.save(tokens, table, from_token=agreed, deadline=deadline)
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import numpy as np
import torch

import kvtier


@dataclass
class ConnectorStats:
    lookups: int = 0
    chunks_loaded: int = 0      # chunks of this rank's own server that arrived verified
    chunks_failed: int = 0      # owned chunks asked for and not delivered (miss/corrupt/timeout/error)
    load_errors: list = field(default_factory=list)  # texts of failed calls and bad statuses
    chunks_saved: int = 0
    save_errors: list = field(default_factory=list)
    get_s: float = 0.0          # this rank's GET call, wall-clock
    land_s: float = 0.0         # broadcast + scatter of every layer


class PartsConnector:
    """See the module comment. `store` is this rank's kvtier store (e.g. kvtier.RemoteStore)."""

    def __init__(self, comm, store, chunker, cfg, cache, layer_wait_s: float = 30.0, before_get=None):
        self.comm = comm if comm is not None and comm.Get_size() > 1 else None
        self.rank = comm.Get_rank() if self.comm else 0
        self.world = comm.Get_size() if self.comm else 1
        # landing runs on its own thread: its collectives go over a duplicate communicator so they
        # never interleave with the forward's all-gathers on `comm`
        self._land_comm = self.comm.Dup() if self.comm else None
        self.store, self.chunker, self.cfg, self.cache = store, chunker, cfg, cache
        self.chunk_tokens = chunker.chunk_tokens
        self.layer_wait_s = layer_wait_s
        self.before_get = before_get  # test hook: runs right before this rank's GET
        self.stats = ConnectorStats()
        self._thread = None

    # ---- helpers ------------------------------------------------------------------------------

    def _min(self, comm, value: int) -> int:
        if comm is None:
            return value
        from mpi4py import MPI
        return comm.allreduce(value, op=MPI.MIN)

    def _owned(self, first_chunk: int, last_chunk: int) -> list[int]:
        return [c for c in range(first_chunk, last_chunk) if c % self.world == self.rank]

    def _answer(self, owned: list[int], ok: list[bool], end_tokens: int) -> int:
        """Start of the first owned chunk not ok, else end_tokens (the lookup's rank answer)."""
        for c, good in zip(owned, ok):
            if not good:
                return c * self.chunk_tokens
        return end_tokens

    def _staging(self, chunks: int) -> torch.Tensor:
        """(chunks, layers, chunk_tokens, latent) of one buffer kept across loads: a fresh one per
        load would page-fault its way in on every request."""
        cfg = self.cfg
        need = chunks * cfg.n_layers * self.chunk_tokens * cfg.latent_dim
        if getattr(self, "_stage_buf", None) is None or self._stage_buf.numel() < need:
            self._stage_buf = torch.zeros(need, dtype=cfg.dtype)
        return self._stage_buf[:need].view(chunks, cfg.n_layers, self.chunk_tokens, cfg.latent_dim)

    def keys(self, tokens: torch.Tensor) -> list:
        return self.chunker.keys(tokens.to(torch.int32).tolist())

    # ---- scheduler side -----------------------------------------------------------------------

    def lookup(self, tokens: torch.Tensor, deadline) -> int:
        """Longest prefix (tokens, whole chunks) every rank's server holds; the same on every rank."""
        self.stats.lookups += 1
        keys = self.keys(tokens)
        owned = self._owned(0, len(keys))
        ok = [False] * len(owned)
        try:
            st = self.store.exists([keys[c] for c in owned], deadline) if owned else []
            ok = [s == kvtier.Status.hit for s in st]
        except kvtier.Error as e:  # a dead server answers nothing: this rank has no hits
            self.stats.load_errors.append(f"exists: {e}")
        return self._min(self.comm, self._answer(owned, ok, len(keys) * self.chunk_tokens))

    def start_load(self, tokens: torch.Tensor, table: list[int], first: int, upto: int, deadline) -> None:
        """Loads tokens [first, upto) (first a chunk boundary; chunks overlapping upto are fetched
        whole, rows at or past upto are not written) on a thread; returns at once."""
        if first % self.chunk_tokens:
            raise ValueError(f"first ({first}) must be a multiple of chunk_tokens ({self.chunk_tokens})")
        self._agreed = None
        self._agreed_ready = threading.Event()
        self._layer_ready = [threading.Event() for _ in range(self.cfg.n_layers)]
        self._failure = None
        self._thread = threading.Thread(target=self._load, args=(tokens, table, first, upto, deadline),
                                        name=f"kvtier-load-r{self.rank}", daemon=True)
        self._thread.start()

    def _load(self, tokens, table, first, upto, deadline):
        try:
            self._load_body(tokens, table, first, upto, deadline)
        except BaseException as e:  # never leave the forward waiting: it sees the failure
            self._failure = e
            self._agreed_ready.set()
            for ev in self._layer_ready:
                ev.set()

    def _load_body(self, tokens, table, first, upto, deadline):
        cfg, C = self.cfg, self.chunk_tokens
        keys = self.keys(tokens)
        first_chunk, last_chunk = first // C, min(len(keys), -(-upto // C))
        owned = self._owned(first_chunk, last_chunk)
        staging = self._staging(len(owned))
        ok = [False] * len(owned)
        t0 = time.perf_counter()
        if self.before_get is not None:
            self.before_get()
        if owned:
            try:
                st = self.store.get([keys[c] for c in owned], staging, deadline)
                ok = [s == kvtier.Status.hit for s in st]
                bad = [(c, str(s)) for c, s in zip(owned, st) if s != kvtier.Status.hit]
                if bad:
                    self.stats.load_errors.append(f"get: chunks not delivered {bad}")
            except kvtier.Error as e:
                self.stats.load_errors.append(f"get: {type(e).__name__}: {e}")
        self.stats.get_s = time.perf_counter() - t0
        n_ok = ok.index(False) if False in ok else len(ok)
        self.stats.chunks_loaded += n_ok
        self.stats.chunks_failed += len(ok) - n_ok
        mine = self._answer(owned, ok, min(upto, last_chunk * C))
        agreed = max(first, min(upto, self._min(self._land_comm, mine)))
        self._agreed = agreed
        self._agreed_ready.set()
        t1 = time.perf_counter()
        self._land_layers(table, first_chunk, agreed, owned, staging)
        self.stats.land_s = time.perf_counter() - t1

    def _land_layers(self, table, first_chunk, agreed, owned, staging):
        """Layer by layer: each owner's chunks of [first_chunk, agreed) to every rank, into pages."""
        cfg, C = self.cfg, self.chunk_tokens
        end_chunk = -(-agreed // C)
        by_owner = [[c for c in range(first_chunk, end_chunk) if c % self.world == r] for r in range(self.world)]
        index = {c: i for i, c in enumerate(owned)}
        slots = self.cache.slots(table, 0, agreed)
        # per chunk: the slots of its rows below `agreed` (a chunk straddling it keeps its front)
        dst = {c: slots[c * C:min((c + 1) * C, agreed)] for cs in by_owner for c in cs}
        for l in range(cfg.n_layers):
            for r, chunks in enumerate(by_owner):
                if not chunks:
                    continue
                if self._land_comm is None:  # one process: straight from the staging rows (views)
                    rows = [staging[index[c], l] for c in chunks]
                else:
                    buf = (staging[[index[c] for c in chunks], l].contiguous() if r == self.rank  # (k, C, latent)
                           else torch.empty(len(chunks), C, cfg.latent_dim, dtype=cfg.dtype))
                    self._land_comm.Bcast(buf.numpy(), root=r)
                    rows = list(buf)
                for c, x in zip(chunks, rows):
                    self.cache.write(l, dst[c], x[:dst[c].numel()])
            self._layer_ready[l].set()

    # ---- worker side --------------------------------------------------------------------------

    def agreed_tokens(self) -> int:
        """Tokens [0, agreed) will be in the pages (the same on every rank); blocks until agreed."""
        if not self._agreed_ready.wait(self.layer_wait_s):
            raise TimeoutError(f"rank {self.rank}: no agreement on the loaded prefix in {self.layer_wait_s} s")
        if self._failure is not None:
            raise RuntimeError(f"rank {self.rank}: load failed") from self._failure
        return self._agreed

    def wait_for_layer(self, layer: int) -> None:
        """Returns once layer `layer` of every loading chunk is in the pages."""
        if not self._layer_ready[layer].wait(self.layer_wait_s):
            raise TimeoutError(f"rank {self.rank}: layer {layer} did not land in {self.layer_wait_s} s")
        if self._failure is not None:
            raise RuntimeError(f"rank {self.rank}: load failed") from self._failure

    def finish_load(self) -> None:
        if self._thread is not None:
            self._thread.join(self.layer_wait_s)
            self._thread = None

    def save(self, tokens: torch.Tensor, table: list[int], from_token: int, deadline) -> int:
        """PUTs this rank's owned full chunks at or after chunk boundary from_token; returns the
        number stored. A failed put is counted, never raised: the next lookup simply misses."""
        cfg, C = self.cfg, self.chunk_tokens
        keys = self.keys(tokens)
        owned = self._owned(from_token // C, len(keys))
        if not owned:
            return 0
        value = torch.empty(len(owned), cfg.n_layers, C, cfg.latent_dim, dtype=cfg.dtype)
        for i, c in enumerate(owned):
            slots = self.cache.slots(table, c * C, (c + 1) * C)
            for l in range(cfg.n_layers):
                value[i, l] = self.cache.read(l, slots)
        try:
            st = self.store.put([keys[c] for c in owned], value, deadline)
            stored = sum(s == kvtier.Status.stored for s in st)
        except kvtier.Error as e:
            self.stats.save_errors.append(f"put: {type(e).__name__}: {e}")
            stored = 0
        self.stats.chunks_saved += stored
        return stored

    def close(self) -> None:
        self.finish_load()
        if self._land_comm is not None:
            self._land_comm.Free()
            self._land_comm = None
