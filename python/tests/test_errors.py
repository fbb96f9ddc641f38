"""Bad input gets a clear kvtier exception, never a crash; exceptions carry kvtier's message and code."""
import math

import numpy as np
import pytest
import torch

import kvtier

NS = kvtier.KeyNamespace("test-model", "fp8", chunk_tokens=4)
KEYS = [kvtier.ChunkKey(1, 2), kvtier.ChunkKey(3, 4)]


@pytest.fixture
def store():
    s = kvtier.MemoryStore(1 << 20)
    assert s.put(KEYS, bytearray(16), 1.0) == [kvtier.Status.stored] * 2
    yield s
    s.close()


def test_hierarchy():
    assert issubclass(kvtier.TimeoutError, kvtier.Error) and issubclass(kvtier.TimeoutError, TimeoutError)
    assert issubclass(kvtier.InvalidArgument, ValueError) and issubclass(kvtier.BadUrl, kvtier.InvalidArgument)
    assert issubclass(kvtier.ConnectionError, ConnectionError)
    for t in (kvtier.ClosedError, kvtier.CorruptValue, kvtier.ServerError, kvtier.ProtocolError):
        assert issubclass(t, kvtier.Error) and not issubclass(t, kvtier.TimeoutError)
    assert not issubclass(kvtier.InvalidArgument, kvtier.TimeoutError)


@pytest.mark.parametrize("bad", [-1, -0.001, math.nan, None, "1", True])
def test_bad_deadline(store, bad):
    with pytest.raises(kvtier.InvalidArgument) as e:
        store.get(KEYS, bytearray(16), bad)
    assert "deadline" in str(e.value)
    assert e.value.code == kvtier.Errc.invalid_argument and e.value.code_name == "invalid_argument"
    with pytest.raises(kvtier.InvalidArgument):
        kvtier.Deadline.after(bad)


def test_expired_deadline_is_a_timeout(store):
    dl = kvtier.deadline_after(0)
    assert dl.expired() and dl.remaining() == 0
    with pytest.raises(kvtier.TimeoutError) as e:
        store.get(KEYS, bytearray(16), dl)
    assert e.value.code == kvtier.Errc.timeout and "deadline exceeded" in str(e.value)
    assert e.value.status == [kvtier.Status.timeout] * 2
    assert store.get(KEYS, bytearray(16), math.inf) == [kvtier.Status.hit] * 2  # inf: no deadline


def test_none_everywhere(store):
    with pytest.raises(kvtier.InvalidArgument, match="keys is None"):
        store.get(None, bytearray(16), 1.0)
    with pytest.raises(kvtier.InvalidArgument, match="destination is None"):
        store.get(KEYS, None, 1.0)
    with pytest.raises(kvtier.InvalidArgument, match="destination 1 is None"):
        store.get(KEYS, [bytearray(8), None], 1.0)
    with pytest.raises(kvtier.InvalidArgument, match="source is None"):
        store.put(KEYS, None, 1.0)
    with pytest.raises(kvtier.InvalidArgument, match="tokens is None"):
        kvtier.Chunker(NS).keys(None)
    with pytest.raises(kvtier.InvalidArgument, match="keys\\[1\\] is NoneType"):
        store.exists([KEYS[0], None], 1.0)


def test_non_contiguous(store):
    t = torch.zeros(8, 2, dtype=torch.uint8).t()  # 2 x 8, strided
    assert not t.is_contiguous()
    with pytest.raises(kvtier.InvalidArgument, match="non-contiguous tensor"):
        store.get(KEYS, t, 1.0)
    with pytest.raises(kvtier.InvalidArgument, match="non-contiguous tensor"):
        store.put(KEYS, t, 1.0)
    a = np.zeros((8, 2), dtype=np.uint8).T
    with pytest.raises(kvtier.InvalidArgument, match="not C-contiguous"):
        store.get(KEYS, a, 1.0)
    with pytest.raises(kvtier.InvalidArgument, match="not contiguous"):
        kvtier.Chunker(NS).keys(np.arange(16, dtype=np.int64)[::2])
    with pytest.raises(kvtier.InvalidArgument, match="non-contiguous"):
        kvtier.Chunker(NS).keys(torch.arange(16)[::2])


def test_buffer_too_small(store):
    with pytest.raises(kvtier.InvalidArgument, match="too small for 2 values of 8 bytes"):
        store.get(KEYS, bytearray(15), 1.0, value_bytes=8)
    with pytest.raises(kvtier.InvalidArgument, match="not a multiple"):
        store.get(KEYS, bytearray(15), 1.0)
    with pytest.raises(kvtier.InvalidArgument, match="too small"):
        store.put(KEYS, torch.zeros(15, dtype=torch.uint8), 1.0, value_bytes=8)



def test_destination_of_another_size_than_the_stored_value(store):
    # The values are 8 bytes each. A destination of another size is the caller's error, named with
    # both sizes (InvalidArgument, not CorruptValue or a corrupt status that points at the store);
    # the batch's statuses ride on the exception.
    with pytest.raises(kvtier.InvalidArgument,
                       match="MemoryStore.get: key 1's stored value is 8 bytes, the destination gives 7") as e:
        store.get(KEYS, [bytearray(8), bytearray(7)], 1.0)
    assert e.value.code == kvtier.Errc.invalid_argument
    assert e.value.status == [kvtier.Status.hit, kvtier.Status.corrupt]
    with pytest.raises(kvtier.InvalidArgument,
                       match="key 0's stored value is 8 bytes, the destination gives 16 \\(1 more key like it\\)"):
        store.get(KEYS, bytearray(32), 1.0)  # one buffer cut in two: 16 bytes a key
    with pytest.raises(kvtier.InvalidArgument, match="key 0's stored value is 8 bytes, the destination gives 4"):
        store.get(KEYS, bytearray(8), 1.0, value_bytes=4)
    assert store.get(KEYS, bytearray(16), 1.0) == [kvtier.Status.hit] * 2  # the right size still hits


def test_wrong_dtype_and_types(store):
    ch = kvtier.Chunker(NS)
    with pytest.raises(kvtier.InvalidArgument, match="integer tensor, got dtype torch.float32"):
        ch.keys(torch.zeros(8))
    with pytest.raises(kvtier.InvalidArgument, match="must be integers"):
        ch.keys(np.zeros(8, dtype=np.float64))
    with pytest.raises(kvtier.InvalidArgument, match="token 2 is float"):
        ch.keys([1, 2, 3.0])
    with pytest.raises(kvtier.InvalidArgument, match="token 1 is -1"):
        ch.keys([1, -1])
    with pytest.raises(kvtier.InvalidArgument, match="token 0 is 4294967296"):
        ch.keys(np.array([2**32], dtype=np.int64))
    with pytest.raises(kvtier.InvalidArgument, match="expected a buffer"):
        store.get(KEYS, [1, 2], 1.0)
    with pytest.raises(kvtier.InvalidArgument, match="keys must be a list"):
        store.exists(KEYS[0], 1.0)
    with pytest.raises(kvtier.InvalidArgument, match="2 keys but 1 destinations"):
        store.get(KEYS, [bytearray(8)], 1.0)
    with pytest.raises(kvtier.InvalidArgument, match="value_bytes is -1"):
        store.get(KEYS, bytearray(16), 1.0, value_bytes=-1)


def test_a_store_value_of_another_dtype_than_bytes(store):
    # 16 bytes each time, so only the dtype is wrong: a float32, int64 or float64 buffer of the
    # right byte size is refused, naming its dtype and what is accepted (bytes or a KV page's
    # 8/16-bit floats); the same memory viewed as bytes is fine.
    for bad, name in ((torch.zeros(4), "dtype torch.float32"), (torch.zeros(2, dtype=torch.int64), "dtype torch.int64"),
                      (torch.zeros(16, dtype=torch.bool), "dtype torch.bool"),
                      (np.zeros(4, dtype=np.float32), "format 'f'"), (np.zeros(2), "format 'd'"),
                      (np.zeros(2, dtype=np.int64), "format '[lq]'"), (memoryview(bytearray(16)).cast("i"), "format 'i'")):
        with pytest.raises(kvtier.InvalidArgument, match=f"destination .*{name}.*a store value is bytes: pass uint8 or "
                                                         "int8 \\(or a KV page's float16, bfloat16 or float8\\)"):
            store.get(KEYS, bad, 1.0)
        with pytest.raises(kvtier.InvalidArgument, match=f"source .*{name}"):
            store.put(KEYS, bad, 1.0)
    with pytest.raises(kvtier.InvalidArgument, match="destination 1 .*format 'f'"):
        store.get(KEYS, [bytearray(8), np.zeros(2, dtype=np.float32)], 1.0)
    for good in (torch.zeros(16, dtype=torch.uint8), torch.zeros(16, dtype=torch.int8), torch.zeros(8, dtype=torch.float16),
                 torch.zeros(8, dtype=torch.bfloat16), torch.zeros(4).view(torch.uint8), np.zeros(16, dtype=np.int8),
                 np.zeros(8, dtype=np.float16), np.zeros(2).view(np.uint8), memoryview(bytearray(16))):
        assert store.get(KEYS, good, 1.0) == [kvtier.Status.hit] * 2, good
        assert store.put(KEYS, good, 1.0) == [kvtier.Status.stored] * 2, good


def test_read_only_and_grad(store):
    with pytest.raises(kvtier.InvalidArgument, match="read-only"):
        store.get(KEYS, b"\0" * 16, 1.0)
    ro = np.zeros(16, dtype=np.uint8)
    ro.flags.writeable = False
    with pytest.raises(kvtier.InvalidArgument, match="read-only"):
        store.get(KEYS, ro, 1.0)
    assert store.put(KEYS, ro, 1.0) == [kvtier.Status.stored] * 2  # a source may be read-only
    g = torch.zeros(8, dtype=torch.float16, requires_grad=True)
    with pytest.raises(kvtier.InvalidArgument, match="requires grad"):
        store.get(KEYS, g, 1.0)
    assert store.get(KEYS, g.detach(), 1.0) == [kvtier.Status.hit] * 2


def test_closed_store():
    s = kvtier.MemoryStore(1 << 20)
    s.close()
    s.close()  # idempotent
    assert s.closed
    for call in (lambda: s.exists(KEYS, 1.0), lambda: s.get(KEYS, bytearray(16), 1.0),
                 lambda: s.put(KEYS, bytearray(16), 1.0), lambda: s.stats(), lambda: s.contains(KEYS[0])):
        with pytest.raises(kvtier.ClosedError, match="closed") as e:
            call()
        assert e.value.code == kvtier.Errc.shutdown
    with pytest.raises(kvtier.ClosedError):
        kvtier.TieredStore(s, kvtier.MemoryStore(10))


def test_closed_tier_inside_a_tiered_store():
    l1, l2 = kvtier.MemoryStore(1 << 20), kvtier.MemoryStore(1 << 20)
    tiers = kvtier.TieredStore(l1, l2)
    assert tiers.put(KEYS, bytearray(16), 1.0) == [kvtier.Status.stored] * 2
    l1.clear()
    l2.close()  # the tiered store keeps it alive but closed: its calls fail, nothing crashes
    with pytest.raises(kvtier.ClosedError) as e:
        tiers.get(KEYS, bytearray(16), 1.0)
    assert e.value.status is not None and len(e.value.status) == 2


def test_bad_constructor_arguments():
    with pytest.raises(kvtier.InvalidArgument, match="chunk_tokens must be > 0"):
        kvtier.KeyNamespace("m", "f", chunk_tokens=0)
    with pytest.raises(kvtier.InvalidArgument, match="tail must be"):
        kvtier.Chunker(NS, tail="keep")
    with pytest.raises(kvtier.InvalidArgument, match="hash must be"):
        kvtier.Chunker(NS, hash="md5")
    with pytest.raises(kvtier.InvalidArgument, match="at least one instance"):
        kvtier.RendezvousStore([])
    with pytest.raises(kvtier.InvalidArgument, match="must be a kvtier.Store"):
        kvtier.RendezvousStore([None])
    with pytest.raises(kvtier.InvalidArgument, match="writes must be"):
        kvtier.TieredStore(kvtier.MemoryStore(1), kvtier.MemoryStore(1), writes="never")
    with pytest.raises(kvtier.BadUrl, match="\\*\\*\\*") as e:
        kvtier.RemoteStore("resp://user:s3cret@host:notaport", NS)
    assert "s3cret" not in str(e.value) and e.value.code == kvtier.Errc.bad_url
    with pytest.raises(kvtier.InvalidArgument, match="value_format must be 1 or 2"):
        kvtier.RemoteStore("resp://127.0.0.1:1", NS, value_format=3)
    with pytest.raises(kvtier.InvalidArgument, match="media item") as e:  # a C++ std::invalid_argument
        kvtier.Chunker(NS).keys([1, 2, 3, 4], media=[kvtier.MediaItem(2, 5, kvtier.ChunkKey(1, 1))])
    assert e.value.code == kvtier.Errc.invalid_argument and e.value.status is None
    with pytest.raises(kvtier.InvalidArgument):
        kvtier.PrefillNode(0, 1)
    with pytest.raises(kvtier.InvalidArgument, match="a sample must be"):
        kvtier.fit_batches([(1, 2)])


def test_connector_refuses_a_namespace_of_another_ownership():
    # The namespace folds in the ownership geometry (KeyNamespace's default is 'mod:1'); a connector
    # whose policy places chunks otherwise (another world size, block or rendezvous) refuses it,
    # naming both, instead of sharing keys with deployments of that other geometry.
    lay = kvtier.KvLayout.vllm_mla(1, num_blocks=8, block_size=16, elem_bytes=2, latent=64)
    view = kvtier.KvCacheView.per_layer(lay, [torch.zeros(8, 16, 64, dtype=torch.float16)])
    store = kvtier.MemoryStore(1 << 20)
    comm = kvtier.InprocWorld(2).communicator(0)

    def ns(ownership="mod:1"):
        return kvtier.KeyNamespace("test-model", "fp8", chunk_tokens=16, ownership=ownership)

    with pytest.raises(kvtier.InvalidArgument, match="key namespace's ownership 'mod:1' differs from the ownership "
                                                     "policy's geometry 'mod:2' \\(world size 2\\)") as e:
        kvtier.Connector(kvtier.Chunker(ns()), store, comm, view)  # the default namespace at W = 2
    assert e.value.code == kvtier.Errc.invalid_argument
    for own, geometry in (("mod", "mod:2"), ("block:4", "block:4:2"), ("rendezvous", "rendezvous:2:0"),
                          ("rendezvous:9", "rendezvous:2:9")):
        if own != "mod":
            with pytest.raises(kvtier.InvalidArgument, match=f"'mod:2' differs from .* '{geometry}'"):
                kvtier.Connector(kvtier.Chunker(ns("mod:2")), store, comm, view, ownership=own)
        kvtier.Connector(kvtier.Chunker(ns(geometry)), store, comm, view, ownership=own).close()
    kvtier.Connector(kvtier.Chunker(ns()), store, kvtier.InprocWorld(1).communicator(0), view).close()  # W = 1
