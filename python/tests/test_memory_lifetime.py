"""The memory a call writes or reads stays allocated for the whole call, even when another thread
swaps the caller's tensor onto other memory (tensor.set_) meanwhile: a store call keeps the
tensor's storage for its duration, and a KvCacheView keeps its pages' storages for as long as the
view (or a connector over it) lives.

Each case runs in a subprocess, so that a write into freed memory (a crash: SIGSEGV, or glibc's
"free(): corrupted unsorted chunks" abort) fails the test instead of killing pytest. The tensors
are larger than glibc's largest mmap threshold (32 MiB), so a storage freed too early is unmapped
at once and a late access faults every time instead of corrupting the heap quietly."""
import os
import pathlib
import subprocess
import sys
import textwrap

import kvtier

ENV = dict(os.environ, PYTHONPATH=str(pathlib.Path(kvtier.__file__).parent.parent), OMP_NUM_THREADS="1")


def run_script(body, timeout=30):
    p = subprocess.run([sys.executable, "-c", textwrap.dedent(body)], env=ENV, capture_output=True, text=True,
                       timeout=timeout)
    assert p.returncode == 0, f"exit {p.returncode}\nstdout:\n{p.stdout}\nstderr:\n{p.stderr[-3000:]}"
    return p.stdout


def test_a_get_keeps_the_destination_storage_while_another_thread_swaps_it():
    # A get of a 48 MiB value into a tensor while another thread calls dst.set_(...) on it: the
    # storage the get writes into must outlive the swap. Bounded: 16 rounds or 3 s.
    out = run_script("""
        import threading, time
        import torch, kvtier
        N = 48 << 20
        store = kvtier.MemoryStore(2 * N)
        key = [kvtier.ChunkKey(1, 1)]
        assert store.put(key, torch.full((N,), 7, dtype=torch.uint8), 10.0) == [kvtier.Status.stored]
        in_flight = rounds = 0
        end = time.monotonic() + 3.0
        while rounds < 16 and time.monotonic() < end:
            rounds += 1
            dst = torch.empty(N, dtype=torch.uint8)
            go, swapped_at = threading.Event(), []
            def swap():
                go.wait(5.0)
                time.sleep(0.002)  # into the copy, which runs without the GIL
                dst.set_(torch.empty(16, dtype=torch.uint8))  # the old storage is dropped here
                swapped_at.append(time.perf_counter())
            t = threading.Thread(target=swap)
            t.start()
            go.set()
            t0 = time.perf_counter()
            try:
                st = store.get(key, dst, 10.0)
            except kvtier.InvalidArgument:  # swapped before the get took the tensor: 16 bytes
                st = None
            t1 = time.perf_counter()
            t.join(10.0)
            if st == [kvtier.Status.hit] and swapped_at and t0 < swapped_at[0] < t1:
                in_flight += 1
        print("rounds", rounds, "in_flight", in_flight)
        """)
    rounds, in_flight = (int(x) for x in out.split()[1::2])
    assert in_flight >= 1, out  # the swap did land while a get ran (else the case proves nothing)


def test_a_kv_cache_view_keeps_its_pages_storage_after_set_():
    # A view over a 37.7 MiB page; the page tensor is then moved onto other memory (set_) and every
    # reference but the view's dropped. A save through a connector must read the bytes written
    # before (the view's memory), a load must land there, and a second connector's save of the
    # loaded blocks must read them back from the same memory.
    run_script("""
        import gc, time
        import torch, kvtier
        BLOCKS, BS, LATENT, T = 2048, 16, 576, 32
        lay = kvtier.KvLayout.vllm_mla(1, num_blocks=BLOCKS, block_size=BS, elem_bytes=2, latent=LATENT)
        page = torch.zeros(BLOCKS, BS, LATENT, dtype=torch.bfloat16)
        row = 2 * LATENT
        pattern = torch.randint(1, 256, (4 * BS * row,), dtype=torch.uint8, generator=torch.Generator().manual_seed(5))
        page[0:4].view(torch.uint8).reshape(-1).copy_(pattern)  # blocks 0..3: tokens 0..63
        view = kvtier.KvCacheView.per_layer(lay, [page])
        page.set_(torch.zeros(1, dtype=torch.bfloat16))  # the page tensor now holds other memory
        del page
        gc.collect()

        ns = kvtier.KeyNamespace("lifetime", "mla-bf16", chunk_tokens=T, ownership="mod:1")
        ch = kvtier.Chunker(ns)
        tokens = list(range(64))
        keys = ch.keys(tokens)
        s1, s2 = kvtier.MemoryStore(64 << 20), kvtier.MemoryStore(64 << 20)
        c1 = kvtier.Connector(ch, s1, kvtier.InprocWorld(1).communicator(0), view, lookup_timeout=5.0,
                              load_timeout=(10.0, 0.0, 10.0))
        c2 = kvtier.Connector(ch, s2, kvtier.InprocWorld(1).communicator(0), view, lookup_timeout=5.0)
        del view  # the connectors hold it
        gc.collect()

        def slots(blocks):
            return [blocks[p // BS] * BS + p % BS for p in range(64)]

        def stored(store):
            got = torch.zeros(2, T * row, dtype=torch.uint8)
            assert store.get(keys, got, 5.0) == [kvtier.Status.hit] * 2
            return got.reshape(-1)

        c1.save(1, slots([0, 1, 2, 3]), 0, 64, tokens=tokens)  # read from the view's memory
        c1.wait_for_save(1, 10.0)
        assert c1.errors(1) == [] and c1.finish(1)
        assert torch.equal(stored(s1), pattern), "the save did not read the bytes written before set_"

        c1.begin_lookup(2, tokens)
        for _ in range(2000):
            c1.step(2.0)
            if c1.lookup(2) is not None:
                break
            time.sleep(0.001)
        assert c1.lookup(2).tokens_to_load == 64
        c1.load(2, block_table=[100, 101, 102, 103])  # written into the view's memory
        c1.wait_local(2, 10.0)
        for _ in range(2000):
            c1.step(2.0)
            if c1.load_result(2) is not None:
                break
            time.sleep(0.001)
        assert c1.load_result(2).loaded_end_token == 64, c1.load_errors(2)
        c1.finish(2)

        c2.save(3, slots([100, 101, 102, 103]), 0, 64, tokens=tokens)  # the loaded blocks, read back
        c2.wait_for_save(3, 10.0)
        assert c2.errors(3) == [] and c2.finish(3)
        assert torch.equal(stored(s2), pattern), "the loaded bytes are not in the view's memory"
        c1.close()
        c2.close()
        print("ok")
        """)
