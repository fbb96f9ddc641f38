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
import kvtier  # noqa: E402  (PYTHONPATH: build/<tree>/python)
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
        # the forward of layer l waited for layer l of the load, once, in order (nothing loaded: no waits)
        assert r["layer_waits"] == (list(range(4)) if agreed > r["front"] else []), (name, r["layer_waits"])
    owned = lambda first, end: sum(1 for c in range(first // 16, end // 16) if c % world == rank)  # noqa: E731
    for name in ("whole", "exact", "partial", "split"):
        r = res[name]
        assert r["load_errors"] == [], (name, r["load_errors"])
        assert r["chunks_loaded"] == owned(*r["loaded"]) > 0, (name, r)
        assert r["counters"]["tokens_loaded"] == r["loaded"][1] - r["loaded"][0], (name, r["counters"])
        assert r["counters"]["loads_cut_short"] == 0, (name, r["counters"])
    assert res["split"]["front"] == 32 and res["split"]["loaded"] == [32, 96], res["split"]  # the cost model's split
    # what each request wrote back: this rank's own full chunks past what it took from the tier
    for name, first in dict(cold=0, whole=96, partial=64, corrupt=32).items():
        r = res[name]
        assert r["counters"]["chunks_saved"] == owned(first, 96) == sum(r["stored_events"]), (name, r)
        assert r["counters"]["save_failures"] == 0, (name, r["counters"])
    # the damaged value is chunk 2's, owned by rank 2 mod W: its checksum group fails there, and
    # the failed chunks (agreed on every rank) start at 2: every rank recomputes from token 32
    c = res["corrupt"]
    assert c["load_errors"][0] == 2 and c["loaded"] == [0, 32], c
    assert c["counters"]["loads_cut_short"] == 1 and c["counters"]["tokens_to_recompute"] == 64, c["counters"]
    if rank == 2 % world:
        assert res["store_stats"]["bad_checksum"] == 1, res["store_stats"]
    else:
        assert res["store_stats"]["bad_checksum"] == 0, res["store_stats"]
    # rank 0's server died before its GETs: chunk 0 fails, nothing is loaded anywhere, the failure
    # is counted (and rank 0's write-back fails, counted, not raised)
    k = res["killed"]
    assert k["load_errors"][0] == 0 and k["loaded"][1] == 0 and k["chunks_loaded"] == 0, k
    assert k["counters"]["loads_cut_short"] == 1 and k["counters"]["tokens_to_recompute"] == 96, k["counters"]
    if rank == 0:
        assert k["counters"]["save_failures"] == 1 and res["store_stats"]["errors"] > 0, (k, res["store_stats"])
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
    # each rank's own server served only the chunks it owns (c mod 2): half of the six
    assert res[0]["whole"]["chunks_loaded"] == 3 and res[1]["whole"]["chunks_loaded"] == 3
    for name in EXPECTED_AGREED:  # the failed chunks are agreed on every rank
        assert res[0][name]["load_errors"] == res[1][name]["load_errors"], name


def test_measurement_run_writes_nothing_back():
    """cost_model_check's runs: a prompt of which only a prefix was stored, run with
    save=False, finds the same hit every time (save=True would store the rest: the next hit grows);
    its time in the forward's layer waits is counted for the load part."""
    import scenarios
    from engine import Engine
    from mla_model import MlaConfig, MlaModel, PagedKvCache
    torch.set_num_threads(1)
    cfg = MlaConfig(n_layers=2, d_model=64, n_heads=2, kv_lora_rank=32, rope_dim=16, nope_dim=16, v_dim=16,
                    d_ff=128, vocab=128)
    model = MlaModel(cfg)
    ns = scenarios.namespace(cfg, 1)
    srv = Server()
    try:
        store = kvtier.RemoteStore(srv.url, ns)
        cache = PagedKvCache(cfg, 16, 16)
        tier = scenarios.make_tier(None, cfg, store, ns, cache)
        eng = Engine(model, None, tier)
        tokens = torch.randint(0, cfg.vocab, (80,), generator=torch.Generator().manual_seed(5))
        eng.run(tokens[:32], steps=1)  # stores chunks 0 and 1 only
        hits = []
        for _ in range(2):
            r = eng.run(tokens, steps=1, save=False)
            hits.append((r.hit, r.agreed, tier.counters()["chunks_saved"]))
            assert r.timings["layer_wait_s"] >= 0.0 and len(tier.layer_waits) == cfg.n_layers
        assert hits == [(32, 32, 2), (32, 32, 2)], hits
        assert eng.run(tokens, steps=1).hit == 32 and eng.run(tokens, steps=1).hit == 80  # save=True stores the rest
        # a load capped below the hit: the connector fetches only the chunks below the cap
        before = tier.counters()["tokens_loaded"]
        r = eng.run(tokens, steps=1, save=False, max_load=32)
        assert (r.hit, r.agreed, tier.counters()["tokens_loaded"] - before) == (80, 32, 32)
        assert tier.outcome.requested_end_token == 32
        tier.close()
        store.close()
    finally:
        srv.stop()


def test_piecewise_fit_of_the_cost_model_check():
    from cost_model_check import piecewise
    f = piecewise([(256, 2.0), (128, 1.0), (768, 4.0)])
    assert f(64) == 1.0 and f(192) == 1.5 and f(512) == 3.0 and f(1024) == 5.0
