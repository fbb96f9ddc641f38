"""Context-parallel prefill of MlaModel over W MPI processes (mpi4py), and greedy decoding.

Each rank computes a contiguous share of the span's positions. Per layer the ranks all-gather the
new latent rows (MPI Allgatherv over agreed counts), so every rank writes the whole span's rows
into its pages and causal attention of its queries sees every earlier token; after prefill every
rank holds the whole prompt's KV. The shares, counts and the root of the logits broadcast come
only from (first, last, W), values every rank agrees on, so every rank issues the same
collectives in the same order.

    from mpi4py import MPI
    logits = cp_forward(model, MPI.COMM_WORLD, tokens, 0, cache, table)   # same on every rank
    out = greedy_decode(model, MPI.COMM_WORLD, logits, len(tokens), cache, table, steps=16)
"""
from __future__ import annotations

import numpy as np
import torch

from mla_model import MlaModel, PagedKvCache, _rms_norm


def shares(first: int, last: int, world: int) -> list[tuple[int, int]]:
    """Contiguous, near-equal [a, b) of positions [first, last) for each of `world` ranks."""
    n = last - first
    base, extra = divmod(n, world)
    out, a = [], first
    for r in range(world):
        b = a + base + (1 if r < extra else 0)
        out.append((a, b))
        a = b
    return out


def _mpi_float(dtype: torch.dtype):
    from mpi4py import MPI
    return {torch.float32: MPI.FLOAT, torch.float64: MPI.DOUBLE}[dtype]


@torch.no_grad()
def cp_forward(model: MlaModel, comm, tokens: torch.Tensor, first: int, cache: PagedKvCache,
               table: list[int], wait_for_layer=None) -> torch.Tensor:
    """Positions [first, first + len(tokens)) over comm's ranks (comm None: one process).

    `tokens` are the span's ids, the same on every rank. The cache must hold [0, first) (or
    wait_for_layer(l) makes layer l's rows land before they are read). Returns the logits of
    the span's last position on every rank.
    """
    if comm is None or comm.Get_size() == 1:
        return model.forward_span(tokens, first, cache, table, wait_for_layer)
    cfg, rank, world = model.cfg, comm.Get_rank(), comm.Get_size()
    last = first + tokens.numel()
    parts = shares(first, last, world)
    a, b = parts[rank]
    counts = np.array([(q - p) * cfg.latent_dim for p, q in parts])
    displs = np.concatenate([[0], np.cumsum(counts)[:-1]])
    mpi_t = _mpi_float(cfg.dtype)
    pos = torch.arange(a, b)
    x = model.embed[tokens[a - first:b - first]]
    span_slots = cache.slots(table, first, last)
    mine_slots = cache.slots(table, 0, b)  # my queries see positions [0, b)
    gathered = torch.empty(last - first, cfg.latent_dim, dtype=cfg.dtype)
    for l in range(cfg.n_layers):
        hn = _rms_norm(x, model.layers[l]["attn_norm"])
        rows = model.latents(l, hn, pos).contiguous()
        comm.Allgatherv(rows.numpy(), [gathered.numpy(), counts, displs, mpi_t])
        cache.write(l, span_slots, gathered)
        if wait_for_layer is not None and first > 0:
            wait_for_layer(l)
        if b > a:
            x = x + model.attend(l, hn, pos, cache.read(l, mine_slots))
            x = x + model.mlp(l, x)
    # the rank holding the last position owns the logits; the shares say which one it is
    root = max(r for r, (p, q) in enumerate(parts) if q > p)
    logits = model.logits(x[-1]) if rank == root else torch.empty(cfg.vocab, dtype=cfg.dtype)
    comm.Bcast(logits.numpy(), root=root)
    return logits


@torch.no_grad()
def greedy_decode(model: MlaModel, comm, logits: torch.Tensor, prompt_len: int, cache: PagedKvCache,
                  table: list[int], steps: int = 16) -> list[int]:
    """`steps` greedy tokens after the prompt; every rank runs the same one-token forward.

    Rank 0's choice is broadcast each step, so the ranks cannot drift apart.
    """
    out = []
    for i in range(steps):
        tok = torch.tensor([int(torch.argmax(logits))])
        if comm is not None and comm.Get_size() > 1:
            tok = torch.tensor([comm.bcast(int(tok), root=0)])
        out.append(int(tok))
        if i + 1 < steps:
            logits = model.forward_span(tok, prompt_len + i, cache, table)
    return out
