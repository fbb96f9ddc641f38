"""The fits of cost_model_check.py, pure functions (no MPI, no servers), so that a test can check them.

    per_token = piecewise([(128, 1e-4), (256, 2e-4)])        # seconds per token against n
    path = fit_load_path([LoadPoint(chunks=2, gb=0.002, seconds=0.011), ...])
    path.seconds(chunks=4, gb=0.004)                          # T0 + 4 c + 0.004 / B
    path.bandwidth_for_chunk(chunk_gb=0.001)                  # B of whole chunks of that size
    check_split(FIT, HELD_OUT)                                # raises if the held-out set is not held out

A load of k chunks, gb GB in all, costs T0 + k*c + gb/B: T0 per load (the lookup's and the
outcome's agreement steps), c per chunk (a GET, a checksum per layer group, a scatter into the
pages, the mover's per-chunk work), 1/B per byte. Loads of one chunk size alone cannot separate c
from 1/B (gb = k * chunk bytes): the fit needs loads of two chunk sizes.
"""
from __future__ import annotations

import itertools
import statistics
from dataclasses import dataclass

import numpy as np


def piecewise(points):
    """The piecewise-linear function through points [(x, y)]: constant below the first x, the last
    segment's slope continued past the last x.

        piecewise([(128, 1.0), (256, 2.0)])(192) == 1.5"""
    pts = sorted(points)
    if not pts:
        raise ValueError("piecewise: no points")
    if len({x for x, _ in pts}) != len(pts):
        raise ValueError(f"piecewise: two points share an x: {pts}")

    def f(x):
        if x <= pts[0][0] or len(pts) == 1:
            return pts[0][1]
        for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
            if x <= x1:
                return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
        (x0, y0), (x1, y1) = pts[-2], pts[-1]
        return y1 + (y1 - y0) * (x - x1) / (x1 - x0)
    return f


@dataclass(frozen=True)
class LoadPoint:
    chunks: int      # chunks loaded (over all ranks)
    gb: float        # their bytes, decimal GB
    seconds: float   # the measured load part (median)


@dataclass(frozen=True)
class LoadPath:
    """T0 + chunks * per_chunk_s + gb / bandwidth_gb_per_s; terms the fit found negative are 0."""
    fixed_s: float
    per_chunk_s: float
    bandwidth_gb_per_s: float  # inf when the per-byte term is 0
    rms_relative: float        # the fit's rms of predicted / measured - 1 over its points
    terms: tuple[str, ...]     # the terms the fit kept ("T0", "c", "1/B")

    def seconds(self, chunks: int, gb: float) -> float:
        per_byte = 0.0 if self.bandwidth_gb_per_s == float("inf") else gb / self.bandwidth_gb_per_s
        return self.fixed_s + chunks * self.per_chunk_s + per_byte

    def bandwidth_for_chunk(self, chunk_gb: float) -> float:
        """The B (GB/s) of loads in whole chunks of chunk_gb: the per-chunk cost folded into the
        per-byte one, so that T0 + gb / B is this path's time (the cost model's form)."""
        per_byte = 0.0 if self.bandwidth_gb_per_s == float("inf") else 1.0 / self.bandwidth_gb_per_s
        return 1.0 / (per_byte + self.per_chunk_s / chunk_gb)


def fit_load_path(points: list[LoadPoint]) -> LoadPath:
    """Least squares of relative error (the target is relative: ±25 %) over T0, c, 1/B, each >= 0:
    every subset of the three terms is fitted and the best one whose coefficients are all >= 0 kept.
    Raises ValueError when the points cannot separate the three terms (fewer than 4 points, or one
    bytes-per-chunk only)."""
    if len(points) < 4:
        raise ValueError(f"fit_load_path: {len(points)} points; needs >= 4 (two chunk sizes, two loads each)")
    if any(p.chunks <= 0 or p.gb <= 0 or p.seconds <= 0 for p in points):
        raise ValueError(f"fit_load_path: chunks, gb and seconds must be > 0: {points}")
    sizes = {round(p.gb / p.chunks, 12) for p in points}
    if len(sizes) < 2:
        raise ValueError(f"fit_load_path: one chunk size ({sizes}) cannot separate the per-chunk cost "
                         "from the per-byte one; fit loads of two chunk sizes")
    y = np.array([p.seconds for p in points])
    cols = {"T0": np.ones(len(points)), "c": np.array([float(p.chunks) for p in points]),
            "1/B": np.array([p.gb for p in points])}
    best = None
    for r in (3, 2, 1):
        for names in itertools.combinations(cols, r):
            a = np.stack([cols[k] / y for k in names], axis=1)  # rows divided by y: relative error
            coef, *_ = np.linalg.lstsq(a, np.ones(len(points)), rcond=None)
            if np.any(coef < 0):
                continue
            rms = float(np.sqrt(np.mean((a @ coef - 1.0) ** 2)))
            if best is None or rms < best[0] - 1e-12:
                best = (rms, dict(zip(names, coef)), names)
    if best is None:
        raise ValueError(f"fit_load_path: no non-negative fit of {points}")
    rms, c, names = best
    c = {k: float(v) for k, v in c.items()}
    inv_b = c.get("1/B", 0.0)
    return LoadPath(c.get("T0", 0.0), c.get("c", 0.0), 1.0 / inv_b if inv_b > 0 else float("inf"), rms, tuple(names))


def check_split(fit, held_out):
    """Raises ValueError unless the held-out configurations (n, W, chunk) are held out: none of them
    in the fit, the fit has two chunk sizes per W (see fit_load_path), at each W no held-out prompt
    length is a fit length (its recompute would be fitted) and none lies below the fit's shortest
    (where R(n) would only be guessed), and the held-out set has a chunk size that the fit does not,
    and both W = 1 and W = 2.

        check_split([(48, 1, 16), (256, 1, 64), (128, 2, 16), (512, 2, 64)], [(96, 1, 32), (384, 2, 32)])"""
    fit, held_out = set(fit), list(held_out)
    both = fit.intersection(held_out)
    if both:
        raise ValueError(f"held-out configurations in the fit: {sorted(both)}")
    for w in {c[1] for c in fit}:
        if len({c[2] for c in fit if c[1] == w}) < 2:
            raise ValueError(f"the W = {w} fit has one chunk size; the per-chunk cost needs two")
    for w in sorted({c[1] for c in held_out}):
        fit_lengths = {c[0] for c in fit if c[1] == w}
        lengths = {c[0] for c in held_out if c[1] == w}
        if not fit_lengths:
            raise ValueError(f"held-out configurations at W = {w} and no fit at W = {w}")
        if min(lengths) < min(fit_lengths):
            raise ValueError(f"held-out prompt length {min(lengths)} at W = {w} is below the fit's shortest, "
                             f"{min(fit_lengths)}: R(n) there would be extrapolated, not fitted")
        if lengths & fit_lengths:
            raise ValueError(f"held-out prompt lengths {sorted(lengths & fit_lengths)} at W = {w} are fit "
                             "lengths: their recompute would be fitted")
    if not {c[2] for c in held_out} - {c[2] for c in fit}:
        raise ValueError("no held-out chunk size outside the fit's")
    if {c[1] for c in held_out} != {1, 2}:
        raise ValueError("the held-out set needs 1 and 2 servers")


def spread(samples):
    """(p25, median, p75) of samples (inclusive quartiles; one sample: itself three times)."""
    xs = sorted(samples)
    if len(xs) == 1:
        return xs[0], xs[0], xs[0]
    q = statistics.quantiles(xs, n=4, method="inclusive")
    return q[0], q[1], q[2]
