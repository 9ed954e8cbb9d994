"""Charts as inline SVG text, drawn in Python: a report that holds them renders offline, in any
browser, with no script and no network.

Four kinds cover the Day-0 report: :func:`stacked_bars` (memory per stage by category, the step
time by term), :func:`grouped_hbars` (busy vs exposed time per collective), :func:`scatter`
(the candidate cloud: step time against peak memory, the chosen plan marked) and :func:`line` (the
proxy run's loss per step). Each returns one
``<svg>`` element with a ``<title>`` and text labels, sized by ``viewBox`` so it scales with the page.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from html import escape

# colour-blind-safe (Okabe-Ito), in series order
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442", "#999999")
FONT = "font-family=\"sans-serif\" font-size=\"12\""


def _nice_max(v: float) -> float:
    """The smallest 1, 2, 2.5 or 5 x 10^k at or above ``v`` (axis end)."""
    if v <= 0 or not math.isfinite(v):
        return 1.0
    k = 10 ** math.floor(math.log10(v))
    return next(m * k for m in (1, 2, 2.5, 5, 10) if m * k >= v * (1 - 1e-12))


def _fmt(v: float) -> str:
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}"


def _open(width: int, height: int, title: str) -> list[str]:
    return [f'<svg viewBox="0 0 {width} {height}" width="100%" '
            f'style="max-width:{width}px" role="img" {FONT}>', f"<title>{escape(title)}</title>",
            f'<text x="{width / 2}" y="16" text-anchor="middle" font-weight="bold">{escape(title)}</text>']


def _legend(names: Sequence[str], x: float, y: float) -> list[str]:
    out, cx = [], x
    for i, n in enumerate(names):
        out.append(f'<rect x="{cx:.1f}" y="{y - 10}" width="10" height="10" fill="{PALETTE[i % len(PALETTE)]}"/>')
        out.append(f'<text x="{cx + 14:.1f}" y="{y}">{escape(n)}</text>')
        cx += 22 + 7 * len(n)
    return out


def _axis(x0: float, x1: float, y: float, top: float, vmax: float, unit: str) -> list[str]:
    """A value axis along x from x0 to x1 at height y, with grid lines up to ``top``."""
    out = [f'<line x1="{x0}" y1="{y}" x2="{x1}" y2="{y}" stroke="#333"/>']
    for i in range(5):
        v = vmax * i / 4
        x = x0 + (x1 - x0) * i / 4
        out.append(f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{y}" stroke="#ddd"/>')
        out.append(f'<text x="{x:.1f}" y="{y + 14}" text-anchor="middle">{_fmt(v)}</text>')
    out.append(f'<text x="{x1}" y="{y + 28}" text-anchor="end">{escape(unit)}</text>')
    return out


def stacked_bars(title: str, labels: Sequence[str], series: dict[str, Sequence[float]], unit: str,
                 marks: Sequence[tuple[float, str]] = ()) -> str:
    """One horizontal bar per label, stacked by series (in order); ``marks`` are vertical
    reference lines (value, label), e.g. device capacity and the memory target."""
    names = list(series)
    totals = [sum(series[n][i] for n in names) for i in range(len(labels))]
    vmax = _nice_max(max([*totals, *(v for v, _ in marks)], default=1.0))
    left, right, bar, gap = 110, 660, 18, 6
    top = 48
    height = top + len(labels) * (bar + gap) + 44
    out = _open(right + 20, height, title) + _legend(names, left, 36)
    scale = (right - left) / vmax
    y_axis = top + len(labels) * (bar + gap)
    out += _axis(left, right, y_axis, top - 4, vmax, unit)
    for i, label in enumerate(labels):
        y = top + i * (bar + gap)
        out.append(f'<text x="{left - 6}" y="{y + bar - 5}" text-anchor="end">{escape(label)}</text>')
        x = left
        for j, n in enumerate(names):
            w = series[n][i] * scale
            if w > 0:
                out.append(f'<rect x="{x:.2f}" y="{y}" width="{w:.2f}" height="{bar}" '
                           f'fill="{PALETTE[j % len(PALETTE)]}">'
                           f"<title>{escape(label)}, {escape(n)}: {_fmt(series[n][i])} {escape(unit)}</title></rect>")
            x += w
    for v, label in marks:
        x = left + v * scale
        out.append(f'<line x1="{x:.1f}" y1="{top - 4}" x2="{x:.1f}" y2="{y_axis}" stroke="#C00" stroke-dasharray="4 '
                   '3"/>')
        out.append(f'<text x="{x - 3:.1f}" y="{y_axis - 4}" text-anchor="end" fill="#C00">{escape(label)}</text>')
    return "\n".join(out + ["</svg>"])


def grouped_hbars(title: str, labels: Sequence[str], series: dict[str, Sequence[float]], unit: str) -> str:
    """One group of thin horizontal bars per label, one bar per series (e.g. busy and exposed)."""
    names = list(series)
    vmax = _nice_max(max((v for n in names for v in series[n]), default=1.0))
    left, right, bar = 200, 660, 8
    group = bar * len(names) + 8
    top = 48
    y_axis = top + len(labels) * group
    out = _open(right + 20, y_axis + 44, title) + _legend(names, left, 36)
    out += _axis(left, right, y_axis, top - 4, vmax, unit)
    scale = (right - left) / vmax
    for i, label in enumerate(labels):
        y = top + i * group
        out.append(f'<text x="{left - 6}" y="{y + group / 2 + 2}" text-anchor="end">{escape(label)}</text>')
        for j, n in enumerate(names):
            v = series[n][i]
            out.append(f'<rect x="{left}" y="{y + j * bar}" width="{max(v * scale, 0):.2f}" height="{bar - 1}" '
                       f'fill="{PALETTE[j % len(PALETTE)]}"><title>{escape(label)}, {escape(n)}: {_fmt(v)} '
                       f"{escape(unit)}</title></rect>")
    return "\n".join(out + ["</svg>"])


def scatter(title: str, points: Sequence[tuple[float, float]], chosen: int | None, xlabel: str, ylabel: str,
            xmarks: Sequence[tuple[float, str]] = ()) -> str:
    """Points (x, y); ``chosen`` (an index) drawn large and labelled; ``xmarks`` vertical lines."""
    left, right, top, bottom = 60, 660, 30, 330
    xs = [p[0] for p in points] + [v for v, _ in xmarks]
    ys = [p[1] for p in points]
    xmax, ymax = _nice_max(max(xs, default=1.0)), _nice_max(max(ys, default=1.0))
    sx, sy = (right - left) / xmax, (bottom - top) / ymax
    out = _open(right + 20, bottom + 44, title)
    out += _axis(left, right, bottom, top, xmax, xlabel)
    out.append(f'<line x1="{left}" y1="{top}" x2="{left}" y2="{bottom}" stroke="#333"/>')
    for i in range(5):
        y = bottom - (bottom - top) * i / 4
        out.append(f'<text x="{left - 4}" y="{y + 4:.1f}" text-anchor="end">{_fmt(ymax * i / 4)}</text>')
    out.append(f'<text x="{left}" y="{top - 6}" text-anchor="start">{escape(ylabel)}</text>')
    for x, y in points:
        out.append(f'<circle cx="{left + x * sx:.1f}" cy="{bottom - y * sy:.1f}" r="2.5" fill="{PALETTE[0]}" '
                   'fill-opacity="0.45"/>')
    for v, label in xmarks:
        x = left + v * sx
        out.append(f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{bottom}" stroke="#C00" stroke-dasharray="4 3"/>')
        out.append(f'<text x="{x - 3:.1f}" y="{top + 12}" text-anchor="end" fill="#C00">{escape(label)}</text>')
    if chosen is not None and 0 <= chosen < len(points):
        x, y = points[chosen]
        cx, cy = left + x * sx, bottom - y * sy
        out.append(f'<circle cx="{cx:.1f}" cy="{cy:.1f}" r="6" fill="{PALETTE[5]}" stroke="#000"/>')
        out.append(f'<text x="{cx + 9:.1f}" y="{cy + 4:.1f}" font-weight="bold">chosen</text>')
    return "\n".join(out + ["</svg>"])


def line(title: str, ys: Sequence[float], xlabel: str, ylabel: str, x0: int = 1) -> str:
    """One series against its index (``x0``, ``x0`` + 1, ...): a polyline with a dot per value; the
    value axis spans the data (a loss curve starts far from zero)."""
    left, right, top, bottom = 60, 660, 30, 330
    lo, hi = (min(ys), max(ys)) if ys else (0.0, 1.0)
    pad = (hi - lo) * 0.05 or abs(hi) * 0.05 or 1.0
    lo, hi = lo - pad, hi + pad
    n = max(len(ys) - 1, 1)
    pts = [(left + (right - left) * i / n, bottom - (bottom - top) * (y - lo) / (hi - lo)) for i, y in enumerate(ys)]
    out = _open(right + 20, bottom + 44, title)
    out.append(f'<line x1="{left}" y1="{bottom}" x2="{right}" y2="{bottom}" stroke="#333"/>')
    out.append(f'<line x1="{left}" y1="{top}" x2="{left}" y2="{bottom}" stroke="#333"/>')
    for i in range(5):
        y = bottom - (bottom - top) * i / 4
        out.append(f'<line x1="{left}" y1="{y:.1f}" x2="{right}" y2="{y:.1f}" stroke="#ddd"/>')
        out.append(f'<text x="{left - 4}" y="{y + 4:.1f}" text-anchor="end">{lo + (hi - lo) * i / 4:.3g}</text>')
    every = max(1, math.ceil(n / 4))
    ticks = sorted(set(range(0, n + 1, every)) | {n}) if len(ys) > 1 else [0]
    for i in ticks:
        x = left + (right - left) * i / n
        out.append(f'<text x="{x:.1f}" y="{bottom + 14}" text-anchor="middle">{x0 + i}</text>')
    out.append(f'<text x="{right}" y="{bottom + 28}" text-anchor="end">{escape(xlabel)}</text>')
    out.append(f'<text x="{left}" y="{top - 6}" text-anchor="start">{escape(ylabel)}</text>')
    out.append('<polyline fill="none" stroke="{}" stroke-width="2" points="{}"/>'.format(
        PALETTE[0], " ".join(f"{x:.1f},{y:.1f}" for x, y in pts)))
    for (x, y), v in zip(pts, ys):
        out.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3" fill="{PALETTE[0]}"><title>{_fmt(v)}</title></circle>')
    return "\n".join(out + ["</svg>"])
