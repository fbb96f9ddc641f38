"""The chunker from Python: the same keys from a list, numpy and torch; key material changes them."""
import pickle

import numpy as np
import pytest
import torch

import kvtier

NS = kvtier.KeyNamespace("test-model", "fp8", chunk_tokens=4, ownership="mod:2")
TOKENS = [(i * 7919) % 151552 for i in range(18)]  # 4 full chunks and a tail of 2


def test_same_keys_from_every_container():
    ch = kvtier.Chunker(NS)
    ref = ch.keys(TOKENS)
    assert len(ref) == 4 == ch.key_count(len(TOKENS))
    for t in (tuple(TOKENS), np.array(TOKENS, dtype=np.uint32), np.array(TOKENS, dtype=np.int64),
              np.array(TOKENS, dtype=np.int32), torch.tensor(TOKENS), torch.tensor(TOKENS, dtype=torch.int32)):
        assert ch.keys(t) == ref
    assert len(set(ref)) == 4


def test_prefix_chaining_and_extend():
    ch = kvtier.Chunker(NS)
    full = ch.keys(TOKENS)
    assert ch.keys(TOKENS[:8]) == full[:2]  # a shared prefix shares keys
    other = list(TOKENS)
    other[1] += 1
    assert all(a != b for a, b in zip(ch.keys(other), full))  # one token changes every later key
    assert ch.extend(full[1], TOKENS[8:]) == full[2:]


def test_tail_policy_and_hashes():
    partial = kvtier.Chunker(NS, tail="hash_partial")
    keys = partial.keys(TOKENS)
    assert len(keys) == 5 and keys[:4] == kvtier.Chunker(NS).keys(TOKENS)
    sha = kvtier.Chunker(NS, hash="sha256-128")
    assert sha.hash == "sha256-128" and sha.keys(TOKENS)[0] != keys[0]


def test_key_material():
    ch = kvtier.Chunker(NS)
    base = ch.keys(TOKENS)
    a = ch.keys(TOKENS, adapter="lora-7")
    s = ch.keys(TOKENS, tenant_salt="acme")
    assert len({base[0], a[0], s[0]}) == 3
    assert ch.keys(TOKENS, adapter="lora-7") == a
    assert ch.root(adapter="lora-7") != ch.root() == NS.root()
    # A media item over tokens 9..11 changes chunk 2 and later, never the chunks before it.
    img = kvtier.MediaItem(offset=9, length=3, content_hash=kvtier.content_hash(b"image bytes"))
    m = ch.keys(TOKENS, media=[img])
    assert m[:2] == base[:2] and m[2] != base[2] and m[3] != base[3]
    img2 = kvtier.MediaItem(offset=9, length=3, content_hash=kvtier.content_hash(b"other image"))
    assert ch.keys(TOKENS, media=[img2])[2] != m[2]


def test_chunk_key_value_semantics():
    k = kvtier.Chunker(NS).keys(TOKENS)[0]
    assert kvtier.ChunkKey.from_hex(k.hex()) == k and len(k.hex()) == 32
    assert pickle.loads(pickle.dumps(k)) == k
    assert {k: 1}[kvtier.ChunkKey(k.hi, k.lo)] == 1
    assert NS.remote_key(k) == NS.remote_key_prefix() + k.hex() == kvtier.Chunker(NS).remote_key(k)
    assert NS.remote_key_prefix() == "kvtier:" + NS.text() + ":"
    with pytest.raises(kvtier.InvalidArgument):
        kvtier.ChunkKey.from_hex("xyz")
