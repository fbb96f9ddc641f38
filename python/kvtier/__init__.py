"""kvtier from Python: chunk keys, the cost model, server URLs and chunk stores.

The extension kvtier._kvtier is a thin binding over kvtier's C++ headers, built for
Debian's /usr/bin/python3. Stores take numpy arrays, bytearrays, memoryviews and
contiguous CPU torch tensors by pointer and release the GIL for the whole call.

    import kvtier
    ns = kvtier.KeyNamespace("my-model", "fp8", chunk_tokens=256)
    keys = kvtier.Chunker(ns).keys(list(range(1024)))          # 4 keys
    with kvtier.MemoryStore(1 << 30) as store:
        store.put(keys, bytearray(4 * 4096), 1.0)               # 4 values of 4096 bytes
"""
from ._kvtier import *  # noqa: F401,F403
from ._kvtier import __version__  # noqa: F401
