"""In-process stores from Python: round trips through every buffer kind, zero copy into the
caller's tensor, tiered and rendezvous composition."""
import numpy as np
import pytest
import torch

import kvtier

H, S = kvtier.Status.hit, kvtier.Status.stored
KEYS = [kvtier.ChunkKey(7, i) for i in range(4)]
VB = 4096


def payload(n=len(KEYS), seed=1):
    return np.random.default_rng(seed).integers(0, 256, size=(n, VB), dtype=np.uint8)


@pytest.mark.parametrize("kind", ["numpy", "bytearray", "memoryview", "torch", "torch_bf16", "list"])
def test_round_trip_every_buffer_kind(kind):
    src = payload()
    s = kvtier.MemoryStore(1 << 20)
    if kind == "numpy":
        put_src, dst = src, np.zeros_like(src)
    elif kind == "bytearray":
        put_src, dst = bytearray(src.tobytes()), bytearray(src.nbytes)
    elif kind == "memoryview":
        put_src, dst = memoryview(src.tobytes()), memoryview(bytearray(src.nbytes))
    elif kind == "torch":
        put_src, dst = torch.from_numpy(src.copy()), torch.zeros(len(KEYS), VB, dtype=torch.uint8)
    elif kind == "torch_bf16":  # no buffer protocol for bf16: taken by data_ptr()
        put_src = torch.from_numpy(src.copy()).view(torch.bfloat16)
        dst = torch.zeros(len(KEYS), VB // 2, dtype=torch.bfloat16)
    else:
        put_src, dst = [bytes(r) for r in src], [bytearray(VB) for _ in KEYS]
    assert s.put(KEYS, put_src, 1.0) == [S] * 4
    assert s.exists(KEYS + [kvtier.ChunkKey(0, 0)], 1.0) == [H] * 4 + [kvtier.Status.miss]
    assert s.get(KEYS, dst, 1.0) == [H] * 4
    got = b"".join(bytes(d) for d in dst) if kind == "list" else (
        dst.view(torch.uint8).numpy().tobytes() if kind.startswith("torch") else bytes(dst))
    assert got == src.tobytes()


def test_get_writes_the_tensors_own_memory():
    src = payload()
    s = kvtier.MemoryStore(1 << 20)
    s.put(KEYS, src, 1.0)
    # A page of a bigger cache: rows 2..5 of a 8-row tensor, viewed through numpy beforehand.
    cache = torch.zeros(8, VB, dtype=torch.uint8)
    page = cache[2:6]
    before = page.data_ptr()
    alias = cache.numpy()  # shares cache's memory: sees what get writes, if get writes there
    assert s.get(KEYS, page, 1.0, value_bytes=VB) == [H] * 4
    assert page.data_ptr() == before
    assert np.array_equal(alias[2:6], src)
    assert not alias[:2].any() and not alias[6:].any()  # nothing written outside the page
    # put reads the caller's memory: a slice with a storage offset stores its own bytes.
    t = torch.from_numpy(src.copy())
    s2 = kvtier.MemoryStore(1 << 20)
    s2.put(KEYS[:2], t[2:], 1.0)
    out = np.zeros((2, VB), dtype=np.uint8)
    s2.get(KEYS[:2], out, 1.0)
    assert np.array_equal(out, src[2:])


def test_tiered_promotes_and_counts():
    l1, l2 = kvtier.MemoryStore(1 << 20), kvtier.MemoryStore(1 << 20)
    tiers = kvtier.TieredStore(l1, l2, writes="l2_only")
    src = payload()
    assert tiers.put(KEYS, src, 1.0) == [S] * 4
    assert l1.entry_count == 0 and l2.entry_count == 4
    dst = np.zeros_like(src)
    assert tiers.get(KEYS, dst, 1.0) == [H] * 4 and np.array_equal(dst, src)
    assert l1.entry_count == 4  # promoted
    dst[:] = 0
    assert tiers.get(KEYS, dst, 1.0) == [H] * 4 and np.array_equal(dst, src)
    st = tiers.stats()
    assert st["l2_hits"] == 4 and st["l1_hits"] == 4 and st["promoted"] == 4


def test_rendezvous_spreads_and_returns_in_order():
    parts = [kvtier.MemoryStore(1 << 22) for _ in range(3)]
    r = kvtier.RendezvousStore(parts, seed=5, names=["a", "b", "c"])
    keys = [kvtier.ChunkKey(9, i) for i in range(24)]
    src = payload(len(keys))
    assert r.put(keys, src, 1.0) == [S] * len(keys)
    counts = [p.entry_count for p in parts]
    assert sum(counts) == 24 and all(c > 0 for c in counts)
    for k in keys:
        assert parts[r.instance_of(k)].contains(k)
    dst = np.zeros_like(src)
    assert r.get(keys, dst, 1.0) == [H] * 24 and np.array_equal(dst, src)
    assert r.size == 3 and r.names == ["a", "b", "c"]


def test_rendezvous_names_keep_a_key_on_its_instance():
    # Keys follow the instances' names, not their positions: reordered, each key is on the same
    # named instance; with "b" gone, only b's keys move.
    a, b, c = (kvtier.MemoryStore(1 << 20) for _ in range(3))
    keys = [kvtier.ChunkKey(3, i) for i in range(64)]
    abc = kvtier.RendezvousStore([a, b, c], names=["a", "b", "c"])
    cba = kvtier.RendezvousStore([c, b, a], names=["c", "b", "a"])
    ac = kvtier.RendezvousStore([a, c], names=["a", "c"])
    owner = {k: abc.names[abc.instance_of(k)] for k in keys}
    assert {cba.names[cba.instance_of(k)] for k in keys if owner[k] == "b"} == {"b"}
    assert all(cba.names[cba.instance_of(k)] == owner[k] for k in keys)
    assert all(ac.names[ac.instance_of(k)] == owner[k] for k in keys if owner[k] != "b")
    assert len(set(owner.values())) == 3
    with pytest.raises(kvtier.InvalidArgument, match="no server identity: pass names"):
        kvtier.RendezvousStore([a, b])
    with pytest.raises(kvtier.InvalidArgument, match="two instances named 'a'"):
        kvtier.RendezvousStore([a, b], names=["a", "a"])
    with pytest.raises(kvtier.InvalidArgument, match="1 names for 2 instances"):
        kvtier.RendezvousStore([a, b], names=["a"])
    assert a.identity == "" and abc.identity == ""


def test_context_manager_closes():
    with kvtier.MemoryStore(1 << 20) as s:
        s.put(KEYS[:1], b"x", 1.0)
    assert s.closed and "closed" in repr(s)
