"""kvtier.Connector at W = 2 rank threads (kvtier.InprocWorld) over MemoryStores into torch pages:
the lifecycle byte for byte, with the moves inside step() and on a data communicator's mover
thread; and every bad input as a clear kvtier exception."""
import math
import threading
import time

import pytest
import torch

import kvtier
from connector_rig import (BLOCK_SIZE, BLOCKS, LATENT, LAYERS, PROMPT, agree_after_wait_local, compute_into, layout,
                           make_pages, namespace, run_rank, slots_of, step_until, wrong_bytes)


def run_world(w, separate_data, tamper_rank=None, ownership="mod", after_load=None, by_layer=False):
    world = kvtier.InprocWorld(w)
    data_world = kvtier.InprocWorld(w) if separate_data else None
    stores = [kvtier.MemoryStore(64 << 20) for _ in range(w)]
    results, errors = [None] * w, []

    def rank(r):
        try:
            tamper = None
            if r == tamper_rank:
                def tamper():  # drop this rank's stored chunks: every rank then loads less
                    stores[r].close()
            results[r] = run_rank(world.communicator(r), stores[r],
                                  data=data_world.communicator(r) if data_world else None, tamper=tamper,
                                  ownership=ownership, after_load=after_load, by_layer=by_layer)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append((r, repr(e)))

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(w)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads), "a rank thread hangs"
    assert not errors, errors
    return results


@pytest.mark.parametrize("separate_data", [False, True])
def test_lifecycle_two_threads_byte_for_byte(separate_data):
    res = run_world(2, separate_data)
    for r, x in enumerate(res):
        assert x["cold_cached"] == 0
        assert x["events"] == [("stored", r, 2)]  # 4 chunks, mod 2: two per rank
        assert x["warm_plan"] == (PROMPT, 0, PROMPT)
        assert x["loaded"] == (0, PROMPT, PROMPT)
        assert x["load_errors"] == []
        assert x["wrong_loaded"] == 0
        assert x["two_steps"]  # wait_local on every rank first: one step agrees the whole load
        assert x["finished_loads"] == [2]
        c = x["counters"]
        assert c["lookups"] == 2 and c["loads"] == 1 and c["tokens_loaded"] == PROMPT
        assert c["chunks_saved"] == 2 and c["save_failures"] == 0
        assert f'kvtier_connector_tokens_loaded_total{{rank="{r}"}} {PROMPT}' in x["prometheus"]


def test_save_by_layer_then_load_byte_for_byte():
    res = run_world(2, True, by_layer=True)  # begin_save + save_layer per layer of the forward
    for r, x in enumerate(res):
        assert x["events"] == [("stored", r, 2)]
        assert x["loaded"] == (0, PROMPT, PROMPT) and x["wrong_loaded"] == 0, x
        assert x["counters"]["save_failures"] == 0


def test_save_layer_errors_name_the_call():
    def body(conn, r):
        conn.begin_lookup(5, list(range(PROMPT)))
        assert step_until(conn, lambda: conn.lookup(5) is not None)
        with pytest.raises(kvtier.InvalidArgument, match="no save by layer begun"):
            conn.save_layer(5, 0)
        conn.begin_save(5, list(range(PROMPT)), 0, PROMPT)
        with pytest.raises(kvtier.InvalidArgument, match="still being reported"):
            conn.begin_save(5, list(range(PROMPT)), 0, PROMPT)
        conn.save_layer(5, 0)
        with pytest.raises(kvtier.InvalidArgument, match="reported already"):
            conn.save_layer(5, 0)
        with pytest.raises(kvtier.InvalidArgument, match="outside the cache's 3"):
            conn.save_layer(5, LAYERS)
        conn.finish(5)  # layers 1, 2 never reported: nothing stored, a save error
        for _ in range(2000):
            f = conn.finished()
            if f.save_errors:
                return [e.message for e in f.save_errors]
            time.sleep(0.005)
        return []
    out, errors = in_two_threads(body)
    assert not errors, errors
    for msgs in out:
        assert len(msgs) == 1 and "was reported saved" in msgs[0], msgs


def rendezvous_owner(chunk, world, seed):
    """kvtier::rendezvous_ownership::owner, written again (splitmix64 of seed ^ chunk << 16 ^ r)."""
    m = (1 << 64) - 1

    def mix(x):
        x = (x + 0x9E3779B97F4A7C15) & m
        x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & m
        x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & m
        return x ^ (x >> 31)
    weights = [mix(seed ^ ((chunk << 16) & m) ^ r) for r in range(world)]
    return weights.index(max(weights))


@pytest.mark.parametrize("ownership,owners", [
    ("mod", [0, 1, 0, 1]),
    ("block:2", [0, 0, 1, 1]),
    ("rendezvous:7", [rendezvous_owner(c, 2, 7) for c in range(4)]),
])
def test_ownership_policies_store_and_load_by_their_owners(ownership, owners):
    res = run_world(2, True, ownership=ownership)
    for r, x in enumerate(res):
        assert x["stored_chunks"] == [c for c in range(4) if owners[c] == r], (ownership, r)
        assert x["loaded"] == (0, PROMPT, PROMPT) and x["wrong_loaded"] == 0, x
        assert x["two_steps"]


def in_two_threads(body, options=lambda r: {}):
    """body(conn, r) on 2 rank threads, each with its own connector (options(r) its keywords);
    returns (what each body returned, [(rank, repr of what it raised)])."""
    world = kvtier.InprocWorld(2)
    out, errors = [None, None], []

    def rank(r):
        conn = kvtier.Connector(kvtier.Chunker(namespace(2, options(r).get("ownership", "mod"))),
                                kvtier.MemoryStore(1 << 20), world.communicator(r),
                                kvtier.KvCacheView.per_layer(layout(), make_pages()), **options(r))
        try:
            out[r] = body(conn, r)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append((r, repr(e)))
        finally:
            conn.close()

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads)
    return out, errors


def test_ranks_with_other_ownership_fail_check_deployment():
    out, errors = in_two_threads(lambda conn, r: conn.check_deployment(5.0),
                                 options=lambda r: dict(ownership="mod" if r == 0 else "block:2"))
    assert sorted(r for r, _ in errors) == [0, 1], (out, errors)
    assert all("InvalidArgument" in e and "ownership_geometry" in e for _, e in errors), errors


def test_limit_load_on_one_rank_caps_every_rank():
    res = run_world(2, True, after_load=lambda conn, r: conn.limit_load(2, 1) if r == 1 else None)
    for x in res:
        assert x["loaded"] == (0, 32, PROMPT) and x["wrong_loaded"] == 0, x
        assert x["load_errors"] == [1, 2, 3] and x["counters"]["loads_cut_short"] == 1


def test_cancel_load_on_one_rank_loads_nothing_anywhere():
    res = run_world(2, False, after_load=lambda conn, r: conn.cancel_load(2) if r == 0 else None)
    for x in res:
        assert x["loaded"] == (0, 0, PROMPT), x
        assert x["counters"]["tokens_to_recompute"] == PROMPT


def test_step_words_are_agreed_as_the_min():
    top = (1 << 64) - 1

    def body(conn, r):
        first = conn.step(2.0, words=[10 + r, top ^ (10 + r)])  # min of x, and max through ~x
        plain = conn.step(2.0)  # nothing waits: no words, no collective, None
        return first, plain
    out, errors = in_two_threads(body)
    assert not errors, errors
    assert out == [([10, top ^ 11], None)] * 2


def test_step_words_of_different_counts_fail_on_every_rank():
    out, errors = in_two_threads(lambda conn, r: conn.step(2.0, words=[1] * (r + 1)))
    assert sorted(r for r, _ in errors) == [0, 1], (out, errors)


def test_record_load_sample_and_prompt_tokens():
    conn, store = one_rank(wall_clock_samples=False)
    conn.record_load_sample(64 << 20, 0.03)
    for b, sec in ((0, 0.1), (1, 0.0), (1, -1.0), (1, math.inf), (1, math.nan)):
        with pytest.raises(kvtier.InvalidArgument, match="record_load_sample"):
            conn.record_load_sample(b, sec)
    conn.begin_lookup(1, list(range(64)), prompt_tokens=70)
    conn.begin_lookup(2, list(range(64)))
    assert step_until(conn, lambda: conn.lookup(1) is not None and conn.lookup(2) is not None)
    assert conn.lookup(1).prompt_tokens == 70 and conn.lookup(2).prompt_tokens == 64
    with pytest.raises(kvtier.InvalidArgument, match="prompt_tokens 63"):
        conn.begin_lookup(3, list(range(64)), prompt_tokens=63)
    for bad in (lambda: conn.limit_load(1, 1), lambda: conn.cancel_load(99)):
        with pytest.raises(kvtier.InvalidArgument, match="no load running"):
            bad()
    conn.close()
    store.close()


def test_a_rank_without_its_chunks_shortens_every_rank_alike():
    # rank 1's store is closed before the warm lookup: it answers "nothing" for chunk 1 (its first),
    # so the agreed prefix is chunk 0 only, on both ranks.
    res = run_world(2, False, tamper_rank=1)
    for x in res:
        assert x["warm_plan"] == (32, 0, 32)
        assert x["loaded"] == (0, 32, 32)
        assert x["wrong_loaded"] == 0
        assert x["two_steps"]


def one_rank(**kw):
    comm = kvtier.InprocWorld(1).communicator(0)
    store = kvtier.MemoryStore(1 << 20)
    view = kvtier.KvCacheView.per_layer(layout(), make_pages())
    return kvtier.Connector(kvtier.Chunker(namespace(1)), store, comm, view, **kw), store


def test_pages_bad_inputs():
    lay = layout()
    with pytest.raises(kvtier.InvalidArgument, match="dtype torch.float32"):
        kvtier.KvCacheView.per_layer(lay, [torch.zeros(BLOCKS, BLOCK_SIZE, LATENT) for _ in range(LAYERS)])
    with pytest.raises(kvtier.InvalidArgument, match="needs"):
        kvtier.KvCacheView.per_layer(lay, [torch.zeros(BLOCKS - 1, BLOCK_SIZE, LATENT, dtype=torch.float16)] * LAYERS)
    with pytest.raises(kvtier.InvalidArgument, match="contiguous"):
        kvtier.KvCacheView.per_layer(lay, [torch.zeros(LATENT, BLOCK_SIZE, BLOCKS, dtype=torch.float16).transpose(0, 2)] * LAYERS)
    with pytest.raises(kvtier.InvalidArgument, match="2 pages given"):
        kvtier.KvCacheView.per_layer(lay, make_pages()[:2])
    with pytest.raises(kvtier.InvalidArgument, match="None"):
        kvtier.KvCacheView.per_layer(lay, [None] * LAYERS)
    with pytest.raises(kvtier.InvalidArgument, match="block_size"):
        kvtier.KvLayout(num_layers=1, num_blocks=1, block_size=0, planes=1, heads=1, head_bytes=2, elem_bytes=2,
                        block_stride=2, token_stride=2, head_stride=2)
    # raw bytes pages are fine, and the generic form equals the named one
    g = kvtier.KvLayout(num_layers=LAYERS, num_blocks=BLOCKS, block_size=BLOCK_SIZE, planes=1, heads=1,
                        head_bytes=2 * LATENT, elem_bytes=2, block_stride=BLOCK_SIZE * 2 * LATENT,
                        token_stride=2 * LATENT, head_stride=2 * LATENT)
    assert g.layer_extent == lay.layer_extent and g.bytes_per_token == lay.bytes_per_token
    v = kvtier.KvCacheView.per_layer(g, [bytearray(lay.layer_extent) for _ in range(LAYERS)])
    assert v.num_planes == LAYERS


def test_connector_bad_inputs():
    conn, store = one_rank()
    with pytest.raises(kvtier.InvalidArgument, match="deadline"):
        conn.step(-1.0)
    with pytest.raises(kvtier.InvalidArgument):
        conn.step(None)
    with pytest.raises(kvtier.InvalidArgument, match="outside"):
        conn.wait_for_layer(LAYERS, 1.0)
    conn.begin_lookup(1, list(range(64)))
    with pytest.raises(kvtier.InvalidArgument, match="already known"):
        conn.begin_lookup(1, list(range(64)))
    with pytest.raises(kvtier.InvalidArgument, match="no agreed plan"):
        conn.load(1, list(range(64)))
    assert step_until(conn, lambda: conn.lookup(1) is not None)
    with pytest.raises(kvtier.InvalidArgument, match="loads nothing"):
        conn.load(1, list(range(64)))
    with pytest.raises(kvtier.InvalidArgument, match=r"slots\[3\] = -1"):
        conn.save(1, [0, 1, 2, -1], 0, 4)
    with pytest.raises(kvtier.InvalidArgument, match="end_token"):
        conn.save(1, [0, 1, 2], 0, 4)
    with pytest.raises(kvtier.InvalidArgument, match="float"):
        conn.save(1, [0.5], 0, 1)
    with pytest.raises(kvtier.InvalidArgument, match="one of them"):
        conn.load(1)
    assert conn.finish(1) is True
    conn.close()
    conn.close()  # idempotent
    assert conn.closed
    for call in (lambda: conn.step(0.1), lambda: conn.lookup(1), lambda: conn.begin_lookup(2, [1]),
                 lambda: conn.counters(), lambda: conn.wait_for_layer(0, 0.1)):
        with pytest.raises(kvtier.ClosedError, match="closed"):
            call()
    store.close()


def test_a_bad_load_still_takes_part():
    # A slot outside the cache: this rank loads nothing and the load is agreed as such.
    conn, store = one_rank()
    slots = list(range(64))
    conn.begin_lookup(1, list(range(64)))
    assert step_until(conn, lambda: conn.lookup(1) is not None)
    conn.save(1, slots, 0, 64)
    assert conn.finish(1) is False or True
    for _ in range(2000):
        if conn.counters()["chunks_saved"] == 2:
            break
        threading.Event().wait(0.005)
    conn.begin_lookup(2, list(range(64)))
    assert step_until(conn, lambda: conn.lookup(2) is not None)
    assert conn.lookup(2).tokens_to_load == 64
    with pytest.raises(kvtier.InvalidArgument, match="outside"):
        conn.load(2, slots[:-1] + [BLOCKS * BLOCK_SIZE])
    assert step_until(conn, lambda: conn.load_result(2) is not None)
    assert conn.load_result(2).loaded_end_token == 0
    assert conn.load_errors(2) == [0, 1]
    assert conn.counters()["local_load_failures"] == 1
    # Every lifecycle count of the C++ connector_counters is in the dict (the slow tier's too).
    assert {"lookups_skipped", "saves_skipped", "quarantined_blocks"} <= conn.counters().keys()
    conn.close()
    store.close()


def saved_then_planned(conn, tokens, cold, pages):
    """Request 1 computes `tokens` into blocks `cold` and saves them; request 2 looks the same up."""
    conn.begin_lookup(1, tokens)
    assert step_until(conn, lambda: conn.lookup(1) is not None)
    compute_into(pages, cold, 0, len(tokens))
    conn.save(1, slots_of(cold, len(tokens)), 0, len(tokens))
    conn.finish(1)
    for _ in range(2000):
        if conn.counters()["chunks_saved"] == len(tokens) // 32:
            break
        threading.Event().wait(0.005)
    conn.begin_lookup(2, tokens)
    assert step_until(conn, lambda: conn.lookup(2) is not None)
    return conn.lookup(2)


def test_a_ranged_load_moves_only_its_chunks():
    pages = make_pages()
    conn = kvtier.Connector(kvtier.Chunker(namespace(1)), kvtier.MemoryStore(1 << 20),
                            kvtier.InprocWorld(1).communicator(0), kvtier.KvCacheView.per_layer(layout(), pages))
    tokens = list(range(500, 500 + PROMPT))
    plan = saved_then_planned(conn, tokens, [0, 1, 2, 3, 4, 5, 6, 7], pages)
    assert (plan.load_first_token, plan.load_end_token) == (0, PROMPT)
    warm = [20, 9, 31, 12, 8, 17, 30, 25]
    for bad, why in (((16, 96), "not whole chunks"), ((32, 32), "not whole chunks"), ((0, PROMPT + 32), "inside the plan")):
        with pytest.raises(kvtier.InvalidArgument, match=why):
            conn.load(2, slots_of(warm, PROMPT), first_token=bad[0], end_token=bad[1])
    with pytest.raises(kvtier.InvalidArgument, match="together"):
        conn.load(2, slots_of(warm, PROMPT), first_token=32)
    conn.load(2, block_table=warm, first_token=32, end_token=96)  # chunks 1 and 2: the engine holds the rest
    assert agree_after_wait_local(conn, 2)
    out = conn.load_result(2)
    assert (out.load_first_token, out.loaded_end_token, out.requested_end_token) == (32, 96, 96)
    assert conn.counters()["tokens_loaded"] == 64
    assert wrong_bytes(pages, warm, 32, 96) == 0
    for layer in range(LAYERS):  # nothing outside the range was written: those rows are still zero
        for p in list(range(0, 32)) + list(range(96, PROMPT)):
            assert not pages[layer][warm[p // BLOCK_SIZE], p % BLOCK_SIZE].any(), (layer, p)
    conn.close()


def test_wait_local_bad_inputs():
    conn, store = one_rank()
    with pytest.raises(kvtier.InvalidArgument, match="no load started"):
        conn.wait_local(99, 1.0)  # an unknown request
    conn.begin_lookup(1, list(range(64)))
    assert step_until(conn, lambda: conn.lookup(1) is not None)
    with pytest.raises(kvtier.InvalidArgument, match="no load started"):
        conn.wait_local(1, 1.0)  # looked up, never loaded
    with pytest.raises(kvtier.InvalidArgument):
        conn.wait_local(1, -1.0)
    with pytest.raises(TypeError):
        conn.wait_local(None, 1.0)
    conn.close()
    with pytest.raises(kvtier.ClosedError):
        conn.wait_local(1, 1.0)
    store.close()


def test_wait_local_times_out_on_a_paused_server_then_returns(redis_server):
    # The fetch of a load waits on a SIGSTOPped server: wait_local's deadline passes first
    # (kvtier.TimeoutError, nothing agreed); once the server runs again the fetch ends, wait_local
    # returns, and one step agrees the whole load (a second one its landing).
    ns = namespace(1)
    store = kvtier.RemoteStore(redis_server.url, ns)
    comm = kvtier.InprocWorld(1).communicator(0)
    pages = make_pages()
    conn = kvtier.Connector(kvtier.Chunker(ns), store, comm, kvtier.KvCacheView.per_layer(layout(), pages),
                            lookup_timeout=5.0, load_timeout=(20.0, 0.0, 20.0))
    slots = list(range(64))
    assert saved_then_planned(conn, list(range(64)), [0, 1, 2, 3], pages).tokens_to_load == 64
    redis_server.pause()
    try:
        conn.load(2, [s + 64 for s in slots])
        with pytest.raises(kvtier.TimeoutError, match="did not end before the deadline"):
            conn.wait_local(2, 0.2)
        assert conn.load_result(2) is None
    finally:
        redis_server.resume()
    assert agree_after_wait_local(conn, 2)
    assert conn.load_result(2).loaded_end_token == 64
    conn.close()
    store.close()


def test_wait_for_save_waits_for_a_paused_server(redis_server):
    # A save whose put waits on a SIGSTOPped server: wait_for_save's deadline passes first
    # (kvtier.TimeoutError, nothing saved yet); resumed, the put ends and wait_for_save returns.
    ns = namespace(1)
    store = kvtier.RemoteStore(redis_server.url, ns)
    pages = make_pages()
    conn = kvtier.Connector(kvtier.Chunker(ns), store, kvtier.InprocWorld(1).communicator(0),
                            kvtier.KvCacheView.per_layer(layout(), pages), lookup_timeout=5.0, save_timeout=20.0)
    with pytest.raises(kvtier.InvalidArgument, match="neither known nor finishing"):
        conn.wait_for_save(99, 1.0)
    conn.begin_lookup(1, list(range(64)))
    assert step_until(conn, lambda: conn.lookup(1) is not None)
    assert store.exists(kvtier.Chunker(ns).keys(list(range(64))), 5.0) == [kvtier.Status.miss] * 2  # connected
    redis_server.pause()
    try:
        conn.save(1, list(range(64)), 0, 64)
        with pytest.raises(kvtier.TimeoutError, match="did not end before the deadline"):
            conn.wait_for_save(1, 0.2)
        assert conn.counters()["chunks_saved"] == 0
    finally:
        redis_server.resume()
    conn.wait_for_save(1, 20.0)
    assert conn.counters()["chunks_saved"] == 2
    conn.finish(1)
    conn.close()
    store.close()


def test_connector_constructor_bad_inputs():
    comm = kvtier.InprocWorld(2).communicator(0)
    store = kvtier.MemoryStore(1 << 20)
    view = kvtier.KvCacheView.per_layer(layout(), make_pages())
    ch = kvtier.Chunker(namespace(2))
    with pytest.raises(kvtier.InvalidArgument, match="kvtier.Store"):
        kvtier.Connector(ch, None, comm, view)
    with pytest.raises(kvtier.InvalidArgument, match="KvCacheView"):
        kvtier.Connector(ch, store, comm, make_pages())
    with pytest.raises(kvtier.InvalidArgument, match="comm"):
        kvtier.Connector(ch, store, object(), view)
    with pytest.raises(kvtier.InvalidArgument, match="policy"):
        kvtier.Connector(ch, store, comm, view, policy="sometimes")
    with pytest.raises(kvtier.InvalidArgument, match="node figures"):
        kvtier.Connector(ch, store, comm, view, policy="cost")
    with pytest.raises(kvtier.InvalidArgument, match="lookup_timeout"):
        kvtier.Connector(ch, store, comm, view, lookup_timeout=-1)
    with pytest.raises(kvtier.InvalidArgument, match="lookup_timeout"):
        kvtier.Connector(ch, store, comm, view, lookup_timeout=math.nan)
    for bad, why in (("hash", "ownership must be"), ("block:0", "block must be > 0"), ("block:x", "decimal"),
                     ("rendezvous:-1", "decimal"), ("block:", "decimal")):
        with pytest.raises(kvtier.InvalidArgument, match=why):
            kvtier.Connector(ch, store, comm, view, ownership=bad)
    store.close()
    with pytest.raises(kvtier.ClosedError):
        kvtier.Connector(ch, store, comm, view)


def test_a_failed_save_says_why_and_a_request_never_looked_up_can_save():
    # A save into a store with nothing listening: this rank's reason, naming the chunk, in
    # errors() after wait_for_save and in finished().save_errors after finish(). And save(...,
    # tokens=) of a request never looked up is keyed as a lookup keys it.
    ns, tokens = namespace(1), list(range(64))
    comm = kvtier.InprocWorld(1).communicator(0)
    dead = kvtier.RemoteStore("resp://127.0.0.1:1", ns)
    conn = kvtier.Connector(kvtier.Chunker(ns), dead, comm, kvtier.KvCacheView.per_layer(layout(), make_pages()),
                            lookup_timeout=20.0, save_timeout=5.0)
    conn.save(1, list(range(64)), 0, 64, tokens=tokens)
    with pytest.raises(kvtier.InvalidArgument, match="already known"):
        conn.save(1, list(range(64)), 0, 64, tokens=tokens)
    conn.wait_for_save(1, 30.0)
    [e] = conn.errors(1)
    assert (e.id, e.stage, e.chunk) == (1, "save", 0)
    assert e.message.startswith("rank 0: save of chunk 0: ")
    # The store's code, as kvtier.Error carries it (nothing listens on port 1: refused).
    assert (e.code, e.code_name) == (kvtier.Errc.connection_refused, "connection_refused")
    assert conn.finish(1)
    assert [x.message for x in conn.finished().save_errors] == [e.message]
    conn.close()
    dead.close()

    mem = kvtier.MemoryStore(64 << 20)
    conn = kvtier.Connector(kvtier.Chunker(ns), mem, comm, kvtier.KvCacheView.per_layer(layout(), make_pages()),
                            lookup_timeout=20.0, save_timeout=30.0)
    conn.save(2, list(range(64)), 0, 64, tokens=tokens)
    conn.wait_for_save(2, 30.0)
    assert conn.errors(2) == [] and conn.finish(2)
    conn.begin_lookup(3, tokens)
    assert step_until(conn, lambda: conn.lookup(3) is not None)
    assert conn.lookup(3).cached_tokens == 64
    conn.finish(3)
    conn.close()
