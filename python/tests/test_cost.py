"""The cost model and the probe's fit from Python, against values worked by hand."""
import math

import pytest

import kvtier

NODE = kvtier.PrefillNode(kv_bytes_per_token=48.4e3, prefill_tokens_per_s=52.2e3)


def test_break_even_and_times():
    assert kvtier.break_even_bandwidth_gb_per_s(NODE) == pytest.approx(48.4e3 * 52.2e3 / 1e9)
    path = kvtier.LoadPath(fixed_cost_s=0.002, bandwidth_gb_per_s=5.0)
    assert kvtier.recompute_time_s(NODE, 52.2e3) == pytest.approx(1.0)
    assert kvtier.load_time_s(path, 1.0) == pytest.approx(0.202)
    assert kvtier.predicted_hit_time_s(NODE, path, 10000) == pytest.approx(0.002 + 10000 * 48.4e3 / 5e9)
    # T0 / (1/R - s/B): the shortest hit that loads faster than it recomputes.
    n = kvtier.min_profitable_tokens(NODE, path)
    assert n == pytest.approx(0.002 / (1 / 52.2e3 - 48.4e3 / 5e9))
    assert math.isinf(kvtier.min_profitable_tokens(NODE, kvtier.LoadPath(0.002, 2.0)))  # B < B*


def test_both_verdicts():
    fast, slow = kvtier.LoadPath(0.002, 5.0), kvtier.LoadPath(0.002, 1.0)
    d = kvtier.decide_load(NODE, fast, 16384)
    assert d.load and d.predicted_load_s < d.recompute_s
    assert not kvtier.decide_load(NODE, slow, 16384).load
    assert not kvtier.decide_load(NODE, fast, 10).load  # T0 dominates a short hit
    plan = kvtier.split_point(NODE, slow, 16384, 20000, granularity=256)
    assert 0 < plan.k_tokens < 16384 and plan.k_tokens % 256 == 0
    assert plan.predicted_s <= min(plan.full_load_s, plan.recompute_s)


def test_fits():
    t0, b = 0.003, 2.5
    samples = [(gb, t0 + gb / b) for gb in (0.05, 0.1, 0.2, 0.4)]
    p = kvtier.fit_load_path(samples)
    assert p.fixed_cost_s == pytest.approx(t0) and p.bandwidth_gb_per_s == pytest.approx(b)
    assert kvtier.fit_load_path([(0.1, 0.2), (0.1, 0.2)]) is None  # one size: no slope
    r = kvtier.fit_batches([kvtier.BatchSample(n, n * 0.0124, t0 + n * 0.0124 / b) for n in (8, 4, 2, 1)])
    assert r.path.fixed_cost_s == pytest.approx(t0) and r.path.bandwidth_gb_per_s == pytest.approx(b)
    assert not r.clamped and r.samples == 4 and [c.batch for c in r.sizes] == [8, 4, 2, 1]
    # A negative fitted T0 is clamped to 0 and B refitted through the origin (the probe's rule).
    c = kvtier.fit_batches([(8, 0.1, 0.040), (4, 0.05, 0.019), (2, 0.025, 0.009)])
    assert c.clamped and c.path.fixed_cost_s == 0 and c.fitted_t0_s < 0
    assert kvtier.fit_fixed_cost_s(0.05, 0.1, 2.5) == pytest.approx(0.01)


def test_estimator():
    est = kvtier.LoadEstimator(kvtier.LoadPath(0.0, 1.0), half_life_samples=64)
    for gb in (0.05, 0.1, 0.2, 0.4) * 3:
        assert est.record(gb, 0.003 + gb / 2.5)
    assert not est.record(-1, 1)
    e = est.estimate()
    assert est.samples == 12 and e.bandwidth_gb_per_s == pytest.approx(2.5, rel=1e-6)
    assert est.decide(NODE, 16384).load == kvtier.decide_load(NODE, e, 16384).load
