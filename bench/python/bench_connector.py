#!/usr/bin/env python3
"""bench/python/bench_connector.py: the bound connector (kvtier.Connector from Python) against
the C++ one (bench/connector/bench_connector.cpp, its "connector" column) on the same work:
one prompt of 64 chunks x 2 MiB (vLLM MLA pages: 8 layers x 512 latent bf16 x 256 tokens) on
W = 2 rank threads, each with its own MemoryStore holding the chunks it owns, a control and a
data communicator (InprocWorld), layers_per_group = 2; a load is begin_lookup .. step (+100 us
between steps, an engine's forward) .. load .. step until load_result, timed between two
barriers on rank 0, the first round dropped as warm-up, as the C++ program does.

Rounds interleave: one run of the C++ binary (`bench_connector 3`: a warm-up, then the median of 3
loads, each after the fetch-alone and by-hand loads of its round) then the median of 3 Python
loads; medians over the rounds, ratio printed. (With `bench_connector 1` the one measured load
follows a fresh process's warm-up and reads about twice the warm figure.) The last stdout line
is one JSON object.

    PYTHONPATH=build/release/python /usr/bin/python3 bench/python/bench_connector.py \
        [--rounds 7] [--cpp build/release/bench/bench_connector]
"""
import argparse
import json
import os
import statistics
import subprocess
import threading
import time

import torch

import kvtier

W, T, C, PAGE, LAYERS, LATENT = 2, 256, 64, 64, 8, 512
BLOCKS = C * T // PAGE + 8
PER_ROUND = 3  # loads per round on each side


def prompt():
    return [i * 7919 % 151552 for i in range(C * T)]


class Rank:
    def __init__(self, r, ctrl, data, barrier):
        self.r, self.barrier = r, barrier
        ns = kvtier.KeyNamespace("bench", "mla", chunk_tokens=T, ownership="mod:2")
        chunker = kvtier.Chunker(ns)
        lay = kvtier.KvLayout.vllm_mla(LAYERS, num_blocks=BLOCKS, block_size=PAGE, elem_bytes=2, latent=LATENT)
        self.pages = [torch.zeros(BLOCKS, PAGE, LATENT, dtype=torch.bfloat16) for _ in range(LAYERS)]
        view = kvtier.KvCacheView.per_layer(lay, self.pages)
        self.store = kvtier.MemoryStore(512 << 20)
        self.tokens = prompt()
        keys = chunker.keys(self.tokens)
        nbytes = lay.bytes_per_token * T
        for k in range(r, C, W):  # this rank's chunks in its store (value bytes as the C++ program's)
            v = ((torch.arange(nbytes, dtype=torch.int64) + k * 131) % 256).to(torch.uint8)
            self.store.put([keys[k]], [v], 10.0)
        self.slots = torch.arange(C * T, dtype=torch.int64)
        self.conn = kvtier.Connector(chunker, self.store, ctrl, view, data=data, layers_per_group=2,
                                     max_bytes_in_flight=2 * C * nbytes, load_timeout=(10.0, 0.02, 30.0))

    def load(self, rid):
        c = self.conn
        c.begin_lookup(rid, self.tokens)
        while c.lookup(rid) is None:
            c.step(30.0)
            time.sleep(100e-6)
        c.load(rid, self.slots)
        while c.load_result(rid) is None:
            c.step(30.0)
            time.sleep(100e-6)
        got = c.load_result(rid).loaded_end_token
        c.finish(rid)
        return got

    def timed(self, rid):
        self.barrier.wait(30)
        t0 = time.perf_counter()
        got = self.load(rid)
        self.barrier.wait(30)
        if got != C * T:
            raise RuntimeError(f"rank {self.r}: request {rid} loaded {got} tokens")
        return time.perf_counter() - t0


def python_round(ranks, rid):
    out = [None] * W

    def run(r):
        out[r] = ranks[r].timed(rid)

    threads = [threading.Thread(target=run, args=(r,)) for r in range(W)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    if any(x is None for x in out):
        raise RuntimeError("a rank thread failed")
    return out[0]


def cpp_round(binary):
    p = subprocess.run([binary, str(PER_ROUND)], capture_output=True, text=True, timeout=300, check=True)
    return json.loads(p.stdout.strip().splitlines()[-1])["memory"]["connector_ms"] / 1e3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--cpp", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                                 "build", "release", "bench", "bench_connector"))
    a = ap.parse_args()
    ctrl, data = kvtier.InprocWorld(W), kvtier.InprocWorld(W)
    barrier = threading.Barrier(W)
    ranks = [Rank(r, ctrl.communicator(r), data.communicator(r), barrier) for r in range(W)]
    python_round(ranks, 1)  # warm-up, dropped
    py, cpp = [], []
    for i in range(a.rounds):
        cpp.append(cpp_round(a.cpp))
        py.append(statistics.median(python_round(ranks, 2 + PER_ROUND * i + j) for j in range(PER_ROUND)))
    for r in ranks:
        r.conn.close()
        r.store.close()
    mp, mc = statistics.median(py), statistics.median(cpp)
    load = os.getloadavg()
    print("connector load of %d chunks x %.2f MiB, W = %d threads, memory stores, %d interleaved rounds (medians)"
          % (C, LAYERS * LATENT * 2 * T / 1048576, W, a.rounds))
    print("C++ kvtier::connector   %8.1f ms" % (mc * 1e3))
    print("kvtier.Connector (Py)   %8.1f ms" % (mp * 1e3))
    print("Python / C++: %.3fx (target <= 1.05x: %s); load average %.2f %.2f %.2f"
          % (mp / mc, "met" if mp / mc <= 1.05 else "missed", *load))
    print(json.dumps({"bench": "python_connector", "chunks": C, "ranks": W, "rounds": a.rounds,
                      "cpp_ms": round(mc * 1e3, 2), "python_ms": round(mp * 1e3, 2),
                      "ratio": round(mp / mc, 3), "python_samples_ms": [round(x * 1e3, 1) for x in py],
                      "cpp_samples_ms": [round(x * 1e3, 1) for x in cpp], "loadavg": [round(x, 2) for x in load]}))


if __name__ == "__main__":
    main()
