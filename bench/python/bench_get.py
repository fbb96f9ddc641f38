#!/usr/bin/env python3
"""bench/python/bench_get.py: GET of 8 x 12.4 MB values from Python, kvtier's RemoteStore
against redis-py with hiredis (the client LMCache's Redis connector is built on), on the same
redis-server and the same stored values, in the same run.

kvtier reads each payload straight into a preallocated numpy buffer (checked by its XXH3-64)
with the GIL released; redis-py returns a new bytes object per value. Rounds are interleaved
(the order alternates), each client's figures are medians over the rounds: GB/s (payload bytes
/ wall time of the batch) and client CPU-s per GB (time.process_time over the batch: every
thread of this process, the server excluded). The last stdout line is one JSON object.

    PYTHONPATH=build/release/python /usr/bin/python3 bench/python/bench_get.py [--rounds 15]
"""
import argparse
import json
import os
import statistics
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python", "tests"))
from redis_server import Server  # noqa: E402  (the tests' redis-server harness)

import kvtier  # noqa: E402

try:
    import redis
    from redis.utils import HIREDIS_AVAILABLE
except ImportError:  # pragma: no cover
    sys.exit("bench_get: needs python3-redis and python3-hiredis (scripts/install_deps.sh)")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--values", type=int, default=8)
    ap.add_argument("--value-bytes", type=int, default=12_400_000)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--warmup", type=int, default=2)
    a = ap.parse_args()
    if not HIREDIS_AVAILABLE:
        sys.exit("bench_get: redis-py does not see hiredis; install python3-hiredis")

    srv = Server()
    try:
        ns = kvtier.KeyNamespace("bench-python", "fp8", chunk_tokens=256)
        keys = [kvtier.ChunkKey(0xBE, i) for i in range(a.values)]
        names = [ns.remote_key(k) for k in keys]
        src = np.random.default_rng(1).integers(0, 256, size=(a.values, a.value_bytes), dtype=np.uint8)
        store = kvtier.RemoteStore(srv.url, ns, connections=2, reserved_small=1)
        assert store.put(keys, src, 60.0) == [kvtier.Status.stored] * a.values
        dst = np.zeros_like(src)
        client = redis.Redis(host="127.0.0.1", port=srv.port)
        framed = client.strlen(names[0])  # payload + kvtier's value header: what redis-py reads

        def run_kvtier():
            st = store.get(keys, dst, 30.0)
            if st != [kvtier.Status.hit] * a.values:
                raise SystemExit("bench_get: kvtier get returned %s" % st)

        def run_redis_py():
            pipe = client.pipeline(transaction=False)
            for n in names:
                pipe.get(n)
            vals = pipe.execute()
            if any(v is None or len(v) != framed for v in vals):
                raise SystemExit("bench_get: redis-py returned a missing or short value")

        clients = {"kvtier": run_kvtier, "redis_py_hiredis": run_redis_py}
        bytes_per_batch = a.values * a.value_bytes
        samples = {n: {"gbps": [], "cpu_s_per_gb": []} for n in clients}
        for r in range(a.warmup + a.rounds):
            order = list(clients) if r % 2 == 0 else list(reversed(list(clients)))
            for n in order:
                c0, w0 = time.process_time(), time.perf_counter()
                clients[n]()
                wall, cpu = time.perf_counter() - w0, time.process_time() - c0
                if r >= a.warmup:
                    samples[n]["gbps"].append(bytes_per_batch / wall / 1e9)
                    samples[n]["cpu_s_per_gb"].append(cpu / (bytes_per_batch / 1e9))
        assert np.array_equal(dst, src), "kvtier delivered wrong bytes"

        med = {n: {k: statistics.median(v) for k, v in s.items()} for n, s in samples.items()}
        print("GET of %d x %.1f MB from Python, one redis-server on loopback, %d interleaved rounds (medians)"
              % (a.values, a.value_bytes / 1e6, a.rounds))
        print("%-18s %10s %14s" % ("client", "GB/s", "CPU-s/GB"))
        for n, m in med.items():
            print("%-18s %10.3f %14.4f" % (n, m["gbps"], m["cpu_s_per_gb"]))
        k, h = med["kvtier"], med["redis_py_hiredis"]
        gbps_ratio, cpu_ratio = k["gbps"] / h["gbps"], k["cpu_s_per_gb"] / h["cpu_s_per_gb"]
        met = gbps_ratio >= 1.3 and cpu_ratio <= 0.5
        print("kvtier / redis-py+hiredis: %.2fx GB/s, %.2fx CPU-s/GB (target >= 1.3x at <= 0.5x: %s)"
              % (gbps_ratio, cpu_ratio, "met" if met else "NOT met"))
        print("load average: %.2f %.2f %.2f" % os.getloadavg())
        print(json.dumps({
            "bench": "python_get", "values": a.values, "value_bytes": a.value_bytes, "rounds": a.rounds,
            "redis_py": redis.__version__, "hiredis": HIREDIS_AVAILABLE,
            "kvtier": {k2: round(v, 4) for k2, v in k.items()},
            "redis_py_hiredis": {k2: round(v, 4) for k2, v in h.items()},
            "ratios": {"gbps": round(gbps_ratio, 3), "cpu_s_per_gb": round(cpu_ratio, 3)},
            "target_met": met, "loadavg": [round(x, 2) for x in os.getloadavg()]}))
        store.close()
        client.close()
    finally:
        srv.stop()


if __name__ == "__main__":
    main()
