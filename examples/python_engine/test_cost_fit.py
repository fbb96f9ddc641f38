"""pytest, ctest python_engine_cost_fit (label python): cost_fit.py, the fits cost_model_check.py
predicts from, on synthetic loads whose terms are known (no servers, no timing)."""
import math
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from cost_fit import LoadPoint, check_split, fit_load_path, piecewise, spread  # noqa: E402

S = 65536  # bytes per token, the bench model's


def loads(t0, per_chunk, b, chunk_sizes=(16, 64), counts=(1, 2, 4, 8), wobble=0.0):
    """Loads of whole chunks costing t0 + k * per_chunk + gb / b, each off by +-wobble (relative)."""
    out, sign = [], 1.0
    for chunk in chunk_sizes:
        for k in counts:
            gb = k * chunk * S / 1e9
            out.append(LoadPoint(k, gb, (t0 + k * per_chunk + gb / b) * (1 + sign * wobble)))
            sign = -sign
    return out


def test_fit_separates_fixed_per_chunk_and_per_byte_costs():
    p = fit_load_path(loads(0.004, 0.0015, 0.8))
    assert p.terms == ("T0", "c", "1/B")
    assert p.fixed_s == pytest.approx(0.004, rel=1e-6)
    assert p.per_chunk_s == pytest.approx(0.0015, rel=1e-6)
    assert p.bandwidth_gb_per_s == pytest.approx(0.8, rel=1e-6)
    assert p.rms_relative < 1e-9
    # held out: a chunk size the fit did not see (32) is predicted from the three terms
    gb = 6 * 32 * S / 1e9
    assert p.seconds(6, gb) == pytest.approx(0.004 + 6 * 0.0015 + gb / 0.8, rel=1e-6)


def test_fit_with_noise_stays_near_the_terms():
    p = fit_load_path(loads(0.004, 0.0015, 0.8, wobble=0.02))
    assert p.per_chunk_s == pytest.approx(0.0015, rel=0.25)
    assert p.bandwidth_gb_per_s == pytest.approx(0.8, rel=0.1)
    assert p.rms_relative < 0.03


def test_a_negative_term_is_dropped_not_kept():
    # loads that get cheaper per chunk: the unconstrained c would be < 0; the fit keeps c = 0
    pts = [LoadPoint(k, k * chunk * S / 1e9, 0.002 + k * chunk * S / 1e9 / 1.0 - 0.0004 * k)
           for chunk in (16, 64) for k in (2, 4, 8)]
    p = fit_load_path(pts)
    assert p.per_chunk_s == 0.0 and "c" not in p.terms
    assert p.fixed_s >= 0 and p.bandwidth_gb_per_s > 0


def test_one_chunk_size_cannot_separate_per_chunk_from_per_byte():
    with pytest.raises(ValueError, match="one chunk size"):
        fit_load_path(loads(0.004, 0.0015, 0.8, chunk_sizes=(64,)))
    with pytest.raises(ValueError, match="needs >= 4"):
        fit_load_path(loads(0.004, 0.0015, 0.8, counts=(1,)))
    with pytest.raises(ValueError, match="must be > 0"):
        fit_load_path([LoadPoint(0, 0.0, 0.01)] * 4)


def test_bandwidth_for_chunk_folds_the_per_chunk_cost_into_b():
    p = fit_load_path(loads(0.004, 0.0015, 0.8))
    for chunk in (16, 32, 64):
        gb = chunk * S / 1e9
        b = p.bandwidth_for_chunk(gb)
        # T0 + gb_total / B_chunk is the path's own time for whole chunks of that size
        assert p.fixed_s + 5 * gb / b == pytest.approx(p.seconds(5, 5 * gb), rel=1e-9)
    assert p.bandwidth_for_chunk(16 * S / 1e9) < p.bandwidth_for_chunk(64 * S / 1e9) < 0.8


def test_piecewise():
    f = piecewise([(256, 2.0), (128, 1.0), (512, 3.0)])
    assert f(64) == 1.0 and f(128) == 1.0 and f(192) == 1.5 and f(384) == 2.5
    assert f(768) == 4.0  # the last slope continued
    assert piecewise([(100, 7.0)])(900) == 7.0
    with pytest.raises(ValueError):
        piecewise([(1, 1.0), (1, 2.0)])


def test_check_split_refuses_a_held_out_set_that_is_not_held_out():
    fit = [(48, 1, 16), (128, 1, 16), (768, 1, 64), (128, 2, 16), (512, 2, 64)]
    check_split(fit, [(64, 1, 32), (384, 2, 32)])
    with pytest.raises(ValueError, match="held-out configurations in the fit"):
        check_split(fit, [(128, 1, 16), (384, 2, 32)])
    with pytest.raises(ValueError, match="one chunk size"):
        check_split([(48, 1, 64), (768, 1, 64), (128, 2, 16), (512, 2, 64)], [(64, 1, 32), (384, 2, 32)])
    with pytest.raises(ValueError, match="are fit lengths"):
        check_split(fit, [(128, 1, 32), (384, 2, 32)])  # 128's recompute is fitted at W = 1
    with pytest.raises(ValueError, match="below the fit's shortest"):
        check_split(fit, [(32, 1, 32), (384, 2, 32)])
    with pytest.raises(ValueError, match="below the fit's shortest"):
        check_split(fit, [(64, 1, 32), (96, 2, 32)])  # W = 2's shortest fit length is 128
    with pytest.raises(ValueError, match="no fit at W = 2"):
        check_split([(48, 1, 16), (768, 1, 64)], [(64, 1, 32), (384, 2, 32)])
    with pytest.raises(ValueError, match="chunk size"):
        check_split(fit, [(64, 1, 16), (384, 2, 64)])
    with pytest.raises(ValueError, match="1 and 2 servers"):
        check_split(fit, [(64, 1, 32), (384, 1, 32)])


def test_cost_model_check_configurations_are_held_out():
    import cost_model_check as c  # the script's own split (importing it runs nothing)
    check_split(c.FIT, c.HELD_OUT)


def test_fit_hits_each_hold_a_whole_chunk():
    import cost_model_check as c
    assert c.fit_hits(48, 16) == (24, None)  # 12 tokens would load no chunk of 16
    assert c.fit_hits(128, 16) == (32, 64, None)
    for n, _, chunk in c.FIT:
        assert all(h is None or h >= chunk for h in c.fit_hits(n, chunk))


def test_spread():
    assert spread([5.0]) == (5.0, 5.0, 5.0)
    lo, med, hi = spread([1.0, 2.0, 3.0, 4.0, 100.0])
    assert (lo, med, hi) == (2.0, 3.0, 4.0)
    assert not math.isnan(lo)
