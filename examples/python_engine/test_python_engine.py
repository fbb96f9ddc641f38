"""The Python engine against real redis-servers: W = 1 in this process, W = 2 under mpiexec.

Run: /usr/bin/python3 -m pytest -q examples/python_engine (PYTHONPATH = build/<tree>/python).
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

import pytest
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "python", "tests"))

from redis_server import Server  # noqa: E402  (the bindings' tests' harness: free port, stop by PID)

# what each scenario must have taken from the tier (scenarios.py's docstring says why)
EXPECTED_AGREED = dict(cold=0, whole=96, exact=95, partial=64, split=96, corrupt=32, killed=0)
EXPECTED_HIT = dict(cold=0, whole=96, exact=96, partial=64, split=96, corrupt=96, killed=96)


def check_rank(res, rank, world):
    for name, agreed in EXPECTED_AGREED.items():
        r = res[name]
        assert r["hit"] == EXPECTED_HIT[name], (name, r)
        assert r["agreed"] == agreed, (name, r)
        assert r["same_tokens"], (name, r["tokens"], r["ref_tokens"])
        assert len(r["tokens"]) == 16
        assert r["logits_close"], (name, r["logits_max_abs_diff"])
        assert r["kv_bit_identical"], name
    for name in ("whole", "exact", "partial", "split"):
        assert res[name]["load_errors"] == [], (name, res[name]["load_errors"])
        assert res[name]["chunks_loaded"] > 0, name
    # the damaged value is chunk 2's, owned by rank 2 mod W: its checksum group fails there
    if rank == 2 % world:
        assert any("corrupt" in e for e in res["corrupt"]["load_errors"]), res["corrupt"]
        assert res["store_stats"]["bad_checksum"] == 1, res["store_stats"]
    if rank == 0:  # its server died before its GET: the failure is reported, not hidden
        assert any("ConnectionError" in e for e in res["killed"]["load_errors"]), res["killed"]
        assert res["killed"]["chunks_loaded"] == 0
    for n, c in res["cp"].items():
        assert c["close"], (n, c)


def test_engine_one_process():
    import scenarios
    srv = Server()
    try:
        res = scenarios.run(None, [srv.url], [srv.pid])
    finally:
        srv.stop()
    check_rank(res, 0, 1)


@pytest.mark.skipif(shutil.which("mpiexec") is None, reason="no mpiexec (openmpi-bin)")
def test_engine_two_processes_context_parallel():
    out = tempfile.mkdtemp(prefix="kvtier-py-engine-")
    a, b = Server(), Server()
    try:
        cmd = ["mpiexec", "-n", "2", "--oversubscribe", "--allow-run-as-root", sys.executable,
               os.path.join(HERE, "scenarios.py"), "--urls", f"{a.url},{b.url}",
               "--pids", f"{a.pid},{b.pid}", "--out", os.path.join(out, "r.json")]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=150,
                           env=dict(os.environ, OMP_NUM_THREADS="1"))
        assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    finally:
        a.stop()
        b.stop()
    res = [json.load(open(os.path.join(out, f"r.json.{r}"))) for r in (0, 1)]
    shutil.rmtree(out)
    for rank in (0, 1):
        check_rank(res[rank], rank, 2)
    for name in EXPECTED_AGREED:  # the ranks agree on every step
        assert res[0][name]["tokens"] == res[1][name]["tokens"], name
        assert res[0][name]["agreed"] == res[1][name]["agreed"], name
    # each rank loaded only the chunks it owns (c mod 2): half of the six
    assert res[0]["whole"]["chunks_loaded"] == 3 and res[1]["whole"]["chunks_loaded"] == 3
