"""One rank's side of the kvtier.Connector lifecycle tests (threads and MPI processes).

Every rank runs the same calls in the same order; the step loops end on agreed values (an agreed
plan, an agreed load outcome), so every rank runs the same number of steps.

    res = run_rank(comm, store, cfg)   # a dict of what the rank saw
"""
import time

import torch

import kvtier

LAYERS, BLOCKS, BLOCK_SIZE, LATENT, CHUNK_TOKENS, PROMPT = 3, 32, 16, 64, 32, 128
MAX_STEPS = 3000  # with a 1 ms pause each: bounded in count and time


def layout():
    return kvtier.KvLayout.vllm_mla(LAYERS, num_blocks=BLOCKS, block_size=BLOCK_SIZE, elem_bytes=2, latent=LATENT)


def geometry(ownership, world):
    """The key namespace's ownership for a Connector's `ownership` at `world` ranks (its policy's
    geometry(): 'mod' -> 'mod:W', 'block:I' -> 'block:I:W', 'rendezvous[:S]' -> 'rendezvous:W:S')."""
    if ownership == "mod":
        return f"mod:{world}"
    if ownership.startswith("block:"):
        return f"block:{ownership[6:]}:{world}"
    seed = ownership[len("rendezvous:"):] if ownership.startswith("rendezvous:") else "0"
    return f"rendezvous:{world}:{seed}"


def namespace(world, ownership="mod"):
    return kvtier.KeyNamespace("conn-test", "mla-f16", chunk_tokens=CHUNK_TOKENS,
                               ownership=geometry(ownership, world))


def make_pages():
    return [torch.zeros(BLOCKS, BLOCK_SIZE, LATENT, dtype=torch.float16) for _ in range(LAYERS)]


def model_bytes(pos, layer):
    """The KV bytes of prompt position `pos`, layer `layer` (the same on every rank)."""
    g = torch.Generator().manual_seed(pos * 131 + layer)
    return torch.randint(0, 256, (LATENT * 2,), dtype=torch.uint8, generator=g)


def slots_of(blocks, n):
    return [blocks[p // BLOCK_SIZE] * BLOCK_SIZE + p % BLOCK_SIZE for p in range(n)]


def compute_into(pages, blocks, first, end):
    for p in range(first, end):
        b, t = blocks[p // BLOCK_SIZE], p % BLOCK_SIZE
        for layer in range(LAYERS):
            pages[layer][b, t].view(torch.uint8).copy_(model_bytes(p, layer))


def wrong_bytes(pages, blocks, first, end):
    wrong = 0
    for p in range(first, end):
        b, t = blocks[p // BLOCK_SIZE], p % BLOCK_SIZE
        for layer in range(LAYERS):
            wrong += int((pages[layer][b, t].view(torch.uint8) != model_bytes(p, layer)).sum())
    return wrong


def step_until(conn, done):
    """Steps until done() (an agreed value); returns the steps taken, 0 when it never was."""
    for i in range(MAX_STEPS):
        conn.step(2.0)
        if done():
            return i + 1
        time.sleep(0.001)  # let the fetch workers answer
    return 0


def agree_after_wait_local(conn, id, layers=LAYERS):
    """Every rank: wait_local (this rank's fetch is over), one step (agrees every chunk at once
    and moves them), the layer waits (landed here), one more step (every rank has landed them:
    the outcome is agreed). Two steps on every rank; True when the outcome was agreed by then."""
    conn.wait_local(id, 10.0)
    conn.step(2.0)
    for layer in range(layers):
        conn.wait_for_layer(layer, 5.0)
    conn.step(2.0)
    return conn.load_result(id) is not None


def compute_and_save_by_layer(conn, pages, blocks, id):
    """The forward of request `id` layer after layer, each layer's rows written just before
    save_layer reports it final (begin_save first): the save gathers each layer once reported."""
    conn.begin_save(id, slots_of(blocks, PROMPT), 0, PROMPT)
    for layer in range(LAYERS):
        for p in range(PROMPT):
            pages[layer][blocks[p // BLOCK_SIZE], p % BLOCK_SIZE].view(torch.uint8).copy_(model_bytes(p, layer))
        conn.save_layer(id, layer)


def run_rank(comm, store, data=None, tamper=None, ownership="mod", after_load=None, by_layer=False):
    """Cold request 1 computes and saves (by request, or with by_layer layer by layer); request 2
    (same prompt) loads it into other blocks."""
    world = comm.size
    pages = make_pages()
    view = kvtier.KvCacheView.per_layer(layout(), pages)
    chunker = kvtier.Chunker(namespace(world, ownership))
    tokens = list(range(1000, 1000 + PROMPT))
    res = {}
    conn = kvtier.Connector(chunker, store, comm, view, data=data, lookup_timeout=2.0,
                            load_timeout=(5.0, 0.0, 5.0), ownership=ownership)
    try:
        conn.check_deployment(5.0)
        cold = [0, 1, 2, 3, 4, 5, 6, 7]
        conn.begin_lookup(1, tokens)
        assert step_until(conn, lambda: conn.lookup(1) is not None)
        res["cold_cached"] = conn.lookup(1).cached_tokens
        if by_layer:
            compute_and_save_by_layer(conn, pages, cold, 1)
        else:
            compute_into(pages, cold, 0, PROMPT)
            conn.save(1, slots_of(cold, PROMPT), 0, PROMPT)
        saved = conn.finish(1)
        for _ in range(2000):  # the saver thread puts this rank's chunks
            if saved or 1 in conn.finished().saves:
                break
            time.sleep(0.005)
        res["events"] = [(e.kind, e.rank, len(e.keys)) for e in conn.drain_events()]
        keys = chunker.keys(tokens)  # the chunks this rank's own store now holds
        res["stored_chunks"] = [c for c, st in enumerate(store.exists(keys, 5.0)) if st == kvtier.Status.hit]
        if tamper:
            tamper()
        warm = [20, 9, 31, 12, 8, 17, 30, 25]
        conn.begin_lookup(2, torch.tensor(tokens))
        assert step_until(conn, lambda: conn.lookup(2) is not None)
        plan = conn.lookup(2)
        res["warm_plan"] = (plan.cached_tokens, plan.load_first_token, plan.load_end_token)
        if plan.tokens_to_load:
            conn.load(2, block_table=torch.tensor(warm, dtype=torch.int32))
            if after_load:
                after_load(conn, comm.rank)  # e.g. limit_load / cancel_load on one rank
            res["two_steps"] = agree_after_wait_local(conn, 2)
            assert step_until(conn, lambda: conn.load_result(2) is not None)
            out = conn.load_result(2)
            res["loaded"] = (out.load_first_token, out.loaded_end_token, out.requested_end_token)
            res["load_errors"] = conn.load_errors(2)
            res["wrong_loaded"] = wrong_bytes(pages, warm, 0, out.loaded_end_token)
            res["finished_loads"] = conn.finished().loads
        conn.finish(2)
        res["counters"] = conn.counters()
        res["prometheus"] = conn.prometheus(labels=f'rank="{comm.rank}"')
    finally:
        conn.close()
    return res
