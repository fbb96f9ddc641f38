"""The soak's plot as a plain SVG (no matplotlib on the Debian machines): throughput per window
on top, each rank's resident memory below, the faults shaded and named on both.

    write_svg("out/soak.svg", metrics, samples)
"""
from __future__ import annotations

from xml.sax.saxutils import escape

COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd"]


def _panel(y0, h, x_of, series, y_label, faults, width, t_max):
    """series: [(label, color, [(t, v)])]."""
    vals = [v for _, _, pts in series for _, v in pts] or [0.0]
    lo, hi = min(0.0, min(vals)), max(vals) * 1.1 or 1.0
    y_of = lambda v: y0 + h - (v - lo) / (hi - lo) * h
    out = [f'<rect x="60" y="{y0}" width="{width - 80}" height="{h}" fill="none" stroke="#888"/>']
    for f in faults:
        x1, x2 = x_of(f["start"]), max(x_of(f["end"]), x_of(f["start"]) + 2)
        out.append(f'<rect x="{x1:.1f}" y="{y0}" width="{x2 - x1:.1f}" height="{h}" fill="#f4a582" opacity="0.45"/>')
        out.append(f'<text x="{x1:.1f}" y="{y0 + 12}" font-size="10" fill="#b2182b">'
                   f'{escape(f["kind"])} r{f["rank"]}</text>')
    for k in range(5):
        v = lo + (hi - lo) * k / 4
        out.append(f'<text x="55" y="{y_of(v) + 3:.1f}" font-size="10" text-anchor="end">{v:.3g}</text>')
    out.append(f'<text x="14" y="{y0 + h / 2}" font-size="11" transform="rotate(-90 14 {y0 + h / 2})" '
               f'text-anchor="middle">{escape(y_label)}</text>')
    for i, (label, color, pts) in enumerate(series):
        if pts:
            d = " ".join(f"{x_of(t):.1f},{y_of(v):.1f}" for t, v in pts)
            out.append(f'<polyline points="{d}" fill="none" stroke="{color}" stroke-width="1.5"/>')
        out.append(f'<text x="{width - 230 + 110 * i}" y="{y0 - 4}" font-size="11" fill="{color}">{escape(label)}</text>')
    return out


def write_svg(path: str, m: dict, samples: list[dict], title: str):
    width, t_max = 1000, max([w["start"] + 5 for w in m["windows"]] + [s["ts"] for s in samples] + [1])
    x_of = lambda t: 60 + t / t_max * (width - 80)
    thr = [("tokens/s (rank 0)", COLORS[0], [(w["start"] + 2.5, w["tokens_per_s"]) for w in m["windows"]])]
    ranks = sorted({s["rank"] for s in samples})
    mem = [(f"rank {r} RSS MiB", COLORS[(r + 1) % 4], [(s["ts"], s["rss_kb"] / 1024) for s in samples if s["rank"] == r])
           for r in ranks]
    body = [f'<text x="60" y="18" font-size="13">{escape(title)}</text>']
    body += _panel(40, 200, x_of, thr, "prompt tokens / s", m["faults"], width, t_max)
    body += _panel(290, 160, x_of, mem, "resident MiB", m["faults"], width, t_max)
    for k in range(11):
        t = t_max * k / 10
        body.append(f'<text x="{x_of(t):.1f}" y="470" font-size="10" text-anchor="middle">{t:.0f}</text>')
    body.append(f'<text x="{width / 2}" y="488" font-size="11" text-anchor="middle">seconds</text>')
    with open(path, "w") as f:
        f.write(f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="500" font-family="sans-serif">'
                f'<rect width="100%" height="100%" fill="white"/>{"".join(body)}</svg>\n')
