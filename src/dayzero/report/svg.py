"""Charts as inline SVG text, drawn in Python: a report that holds them renders offline, in any
browser, with no script and no network.

Five kinds cover the Day-0 report: :func:`stacked_bars` (the step time of the best plans by term,
parameters by component), :func:`stacked_columns` (memory per pipeline stage by category),
:func:`grouped_hbars` (busy vs exposed time per collective), :func:`scatter` (the candidate cloud:
step time against peak memory, the best plans numbered) and :func:`line` (the proxy run's loss per
step). Each returns one ``<svg>`` element with a ``<title>`` and text labels, sized by ``viewBox`` so
it scales with the page. A legend lists only the series that have a nonzero value; a value axis
that need not start at zero (the cloud's) is chosen from the data by :func:`axis_for`: logarithmic
when the values span a factor of :data:`LOG_SPAN` or more, else a linear range around them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape

# colour-blind-safe (Okabe-Ito), in series order
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442", "#999999")
FONT = "font-family=\"sans-serif\" font-size=\"12\""
CHAR_W = 6.6  # width of one 12 px sans-serif character, near enough to lay out labels and legends
LOG_SPAN = 10.0  # values spanning this factor or more get a logarithmic axis (a linear one crushes the low end)


def _nice_max(v: float, mults: Sequence[float] = (1, 2, 2.5, 3, 4, 5, 6, 8, 10)) -> float:
    """The smallest m x 10^k (m in ``mults``) at or above ``v``: an axis end whose quarters are
    round numbers, close enough above ``v`` that the bars fill the plot."""
    if v <= 0 or not math.isfinite(v):
        return 1.0
    k = 10 ** math.floor(math.log10(v))
    return next(m * k for m in mults if m * k >= v * (1 - 1e-12))


def _fmt(v: float) -> str:
    """A tick or value label: whole numbers from 100 up (187.5 keeps its half below 1,000), three
    significant digits below."""
    if abs(v) >= 1000 or (abs(v) >= 100 and v == round(v)):
        return f"{v:,.0f}"
    return f"{v:.4g}" if abs(v) >= 100 else f"{v:.3g}"


def _open(width: int, height: int, title: str) -> list[str]:
    return [f'<svg viewBox="0 0 {width} {height}" width="100%" '
            f'style="max-width:{width}px" role="img" {FONT}>', f"<title>{escape(title)}</title>",
            f'<text x="{width / 2}" y="16" text-anchor="middle" font-weight="bold">{escape(title)}</text>']


def _legend(names: Sequence[str], x: float, y: float, right: float = 1e9,
            colours: Sequence[int] | None = None) -> list[str]:
    """A swatch and name per series, wrapped onto a new row of 16 px at ``right``; ``colours``
    are the palette indices (default: the series' positions)."""
    out, cx = [], x
    for i, n in enumerate(names):
        w = 22 + CHAR_W * len(n)
        if cx > x and cx + w - 8 > right:
            cx, y = x, y + 16
        c = PALETTE[(colours[i] if colours else i) % len(PALETTE)]
        out.append(f'<rect x="{cx:.1f}" y="{y - 10}" width="10" height="10" fill="{c}"/>')
        out.append(f'<text x="{cx + 14:.1f}" y="{y}">{escape(n)}</text>')
        cx += w
    return out


def legend_rows(names: Sequence[str], x: float, right: float) -> int:
    """How many rows :func:`_legend` takes for ``names`` between ``x`` and ``right``."""
    rows, cx = 1, x
    for n in names:
        w = 22 + CHAR_W * len(n)
        if cx > x and cx + w - 8 > right:
            rows, cx = rows + 1, x
        cx += w
    return rows


def present(series: dict[str, Sequence[float]]) -> dict[str, Sequence[float]]:
    """The series with at least one nonzero value: what a chart draws and its legend lists."""
    return {n: v for n, v in series.items() if any(x for x in v)}


@dataclass(frozen=True)
class Axis:
    """A value axis from ``lo`` to ``hi`` (logarithmic when ``log``) with labelled ``ticks``."""

    lo: float
    hi: float
    log: bool
    ticks: tuple[float, ...]

    def frac(self, v: float) -> float:
        """Where ``v`` lies along the axis, 0 at ``lo`` and 1 at ``hi`` (clamped)."""
        if self.log:
            f = (math.log10(max(v, self.lo)) - math.log10(self.lo)) / (math.log10(self.hi) - math.log10(self.lo))
        else:
            f = (v - self.lo) / (self.hi - self.lo)
        return min(max(f, 0.0), 1.0)


def _step(span: float) -> float:
    """A 1, 2, 2.5 or 5 x 10^k tick step that cuts ``span`` into about four."""
    return _nice_max(span / 4, (1, 2, 2.5, 5, 10))


def axis_for(values: Sequence[float], zero: bool = False) -> Axis:
    """The axis that separates ``values``: from zero when ``zero``; else logarithmic when they are
    positive and span a factor of :data:`LOG_SPAN` or more (ends at 1, 2 or 5 x 10^k, ticks at the
    decades, with 2 and 5 between when there are at most two), else linear over their range with
    5 % margins (ends and ticks on a 1, 2, 2.5, 5 step)."""
    vals = [v for v in values if math.isfinite(v)]
    lo, hi = (min(vals), max(vals)) if vals else (0.0, 1.0)
    if zero or not vals:
        top = _nice_max(hi)
        return Axis(0.0, top, False, tuple(top * i / 4 for i in range(5)))
    if lo > 0 and hi / lo >= LOG_SPAN:
        k0, k1 = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
        a = max(m * 10.0 ** k for k in range(k0, k1 + 1) for m in (1, 2, 5) if m * 10.0 ** k <= lo * (1 + 1e-12))
        b = min(m * 10.0 ** k for k in range(k0, k1 + 1) for m in (1, 2, 5) if m * 10.0 ** k >= hi * (1 - 1e-12))
        mults = (1, 2, 5) if math.log10(b / a) <= 2 else (1,)
        ticks = tuple(m * 10.0 ** k for k in range(k0, k1 + 1) for m in mults
                      if a * (1 - 1e-9) <= m * 10.0 ** k <= b * (1 + 1e-9))
        return Axis(a, b, True, ticks)
    pad = (hi - lo) * 0.05 or abs(hi) * 0.05 or 1.0
    step = _step(hi - lo + 2 * pad)
    a = math.floor((lo - pad) / step) * step
    if lo >= 0 > a:
        a = 0.0
    b = math.ceil((hi + pad) / step) * step
    n = round((b - a) / step)
    return Axis(a, b, False, tuple(a + step * i for i in range(n + 1)))


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


def wrap(text: str, chars: int) -> list[str]:
    """``text`` in lines of at most ``chars`` characters, broken between words (a longer word stands alone)."""
    lines: list[str] = []
    for word in text.split():
        if lines and len(lines[-1]) + 1 + len(word) <= chars:
            lines[-1] += " " + word
        else:
            lines.append(word)
    return lines or [""]


HALO = 'paint-order="stroke" stroke="#fff" stroke-width="3"'  # text stays legible over points and lines


def stacked_bars(title: str, labels: Sequence[str], series: dict[str, Sequence[float]], unit: str,
                 marks: Sequence[tuple[float, str]] = (), width: int = 680, subtitle: str = "") -> str:
    """One horizontal bar per label, stacked by series (in order, only those with a nonzero value),
    its total written at its end; ``marks`` are vertical reference lines (value, label), e.g. device
    capacity and the memory target. A label longer than the left margin's 15 characters (a layout)
    goes above its bar, wrapped to the chart's width, the bar then spanning the full width."""
    names = list(present(series))
    colours = [list(series).index(n) for n in names]
    totals = [sum(series[n][i] for n in names) for i in range(len(labels))]
    vmax = _nice_max(max([*totals, *(v for v, _ in marks)], default=1.0))
    above = any(len(lb) > 15 for lb in labels)
    left, right, bar, line_h = (12 if above else 110), width - 56, 18, 14
    heads = [wrap(lb, int((width - 8 - left) / CHAR_W)) if above else [lb] for lb in labels]
    rows = legend_rows(names, left, right)
    top = 48 + 16 * (rows - 1) + (16 if subtitle else 0)
    ys, y = [], top
    for h in heads:
        y += line_h * len(h) if above else 0
        ys.append(y)
        y += bar + 6
    y_axis = y
    out = _open(width, y_axis + 40, title)
    if subtitle:
        out.append(f'<text x="{width / 2}" y="32" text-anchor="middle" fill="#555">{escape(subtitle)}</text>')
    out += _legend(names, left, 36 + (16 if subtitle else 0), right, colours)
    scale = (right - left) / vmax
    out += _axis(left, right, y_axis, top - 4, vmax, unit)
    for i, label in enumerate(labels):
        y = ys[i]
        if above:
            for k, text in enumerate(heads[i]):
                out.append(f'<text x="{left}" y="{y - 4 - line_h * (len(heads[i]) - 1 - k)}" {HALO}>'
                           f"{escape(text)}</text>")
        else:
            out.append(f'<text x="{left - 6}" y="{y + bar - 5}" text-anchor="end">{escape(label)}</text>')
        x = left
        for n, c in zip(names, colours):
            w = series[n][i] * scale
            if w > 0:
                out.append(f'<rect x="{x:.2f}" y="{y}" width="{w:.2f}" height="{bar}" '
                           f'fill="{PALETTE[c % len(PALETTE)]}">'
                           f"<title>{escape(label)}, {escape(n)}: {_fmt(series[n][i])} {escape(unit)}</title></rect>")
            x += w
        out.append(f'<text x="{x + 4:.1f}" y="{y + bar - 5}">{_fmt(totals[i])}</text>')
    for v, label in marks:
        x = left + v * scale
        out.append(f'<line x1="{x:.1f}" y1="{top - 4}" x2="{x:.1f}" y2="{y_axis}" stroke="#C00" stroke-dasharray="4 '
                   '3"/>')
        out.append(f'<text x="{x - 3:.1f}" y="{y_axis - 4}" text-anchor="end" fill="#C00" {HALO}>'
                   f"{escape(label)}</text>")
    return "\n".join(out + ["</svg>"])


def stacked_columns(title: str, labels: Sequence[str], series: dict[str, Sequence[float]], unit: str,
                    marks: Sequence[tuple[float, str]] = (), width: int = 680, xlabel: str = "") -> str:
    """One vertical column per label (e.g. a pipeline stage), stacked by series (only those with a
    nonzero value); ``marks`` are horizontal reference lines (value, label). Columns narrow to fit
    any count; labels are written under every n-th column so they do not collide."""
    names = list(present(series))
    colours = [list(series).index(n) for n in names]
    totals = [sum(series[n][i] for n in names) for i in range(len(labels))]
    vmax = _nice_max(max([*totals, *(v for v, _ in marks)], default=1.0))
    left, right = 56, width - 12
    rows = legend_rows(names, left, right)
    top, plot = 52 + 16 * (rows - 1), 220
    bottom = top + plot
    out = _open(width, bottom + 44, title) + _legend(names, left, 36, right, colours)
    out.append(f'<line x1="{left}" y1="{bottom}" x2="{right}" y2="{bottom}" stroke="#333"/>')
    for i in range(5):
        y = bottom - plot * i / 4
        out.append(f'<line x1="{left}" y1="{y:.1f}" x2="{right}" y2="{y:.1f}" stroke="#ddd"/>')
        out.append(f'<text x="{left - 4}" y="{y + 4:.1f}" text-anchor="end">{_fmt(vmax * i / 4)}</text>')
    out.append(f'<text x="{left - 4}" y="{top - 8}" text-anchor="end">{escape(unit)}</text>')
    n = max(len(labels), 1)
    slot = (right - left) / n
    col = min(max(slot * 0.8, 1.0), 60.0)
    every = max(1, math.ceil(n * (CHAR_W * max((len(lb) for lb in labels), default=1) + 6) / (right - left)))
    scale = plot / vmax
    for i, label in enumerate(labels):
        x, y = left + i * slot + (slot - col) / 2, bottom
        for nm, c in zip(names, colours):
            h = series[nm][i] * scale
            if h > 0:
                out.append(f'<rect x="{x:.2f}" y="{y - h:.2f}" width="{col:.2f}" height="{h:.2f}" '
                           f'fill="{PALETTE[c % len(PALETTE)]}"><title>{escape(label)}, {escape(nm)}: '
                           f"{_fmt(series[nm][i])} {escape(unit)}</title></rect>")
            y -= h
        if i % every == 0:
            out.append(f'<text x="{x + col / 2:.1f}" y="{bottom + 14}" text-anchor="middle">{escape(label)}</text>')
    if xlabel:
        out.append(f'<text x="{right}" y="{bottom + 30}" text-anchor="end">{escape(xlabel)}</text>')
    for v, label in marks:
        y = bottom - v * scale
        out.append(f'<line x1="{left}" y1="{y:.1f}" x2="{right}" y2="{y:.1f}" stroke="#C00" stroke-dasharray="4 3"/>')
        out.append(f'<text x="{right - 2}" y="{y - 3:.1f}" text-anchor="end" fill="#C00" {HALO}>{escape(label)}</text>')
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


def _place(x: float, y: float, text: str, taken: list[tuple[float, float, float, float]],
           bounds: tuple[float, float, float, float]) -> tuple[float, float]:
    """Where to write ``text`` beside the point (x, y): the first offset (nearest first) whose box
    stays inside ``bounds`` (x0, y0, x1, y1) and overlaps no box in ``taken`` (else the first); the box
    chosen is added to ``taken``."""
    w, h = CHAR_W * len(text), 12
    x0, y0, x1, y1 = bounds
    tries = [(8, 4), (8, -8), (-8 - w, 4), (-8 - w, -8)]
    tries += [(dx, dy) for dy in (16, -20, 28, -32, 40, -44) for dx in (8, -8 - w, 20, -20 - w)]
    fits = [(x + dx, y + dy) for dx, dy in tries if x0 <= x + dx and x + dx + w <= x1 and y0 <= y + dy - h
            and y + dy <= y1]
    free = [(tx, ty) for tx, ty in fits
            if not any(tx < bx + bw and bx < tx + w and ty - h < by and by - bh < ty for bx, by, bw, bh in taken)]
    tx, ty = (free or fits or [(x + 8, y + 4)])[0]
    taken.append((tx, ty, w, h))
    return tx, ty


def scatter(title: str, points: Sequence[tuple[float, float]], chosen: Sequence[tuple[int, str]], xlabel: str,
            ylabel: str, xmarks: Sequence[tuple[float, str]] = (), width: int = 680, height: int = 374,
            ycap: float | None = None) -> str:
    """Points (x, y) on axes chosen from the data (:func:`axis_for`: a logarithmic one says so in
    its label); ``chosen`` are (index, label) pairs drawn large and labelled without overlap (e.g.
    the best plans, numbered as the bars that show their step time); ``xmarks`` vertical lines.
    With ``ycap`` the y axis ends there: points above it are drawn as open circles on the top edge
    and a line under the title counts them."""
    left, right, top, bottom = 60, width - 20, 44, height - 44
    above = [p for p in points if ycap is not None and p[1] > ycap]
    ax = axis_for([p[0] for p in points] + [v for v, _ in xmarks])
    ay = axis_for([p[1] for p in points if p not in above] + ([ycap] if above else []))

    def px(v: float) -> float:
        return left + (right - left) * ax.frac(v)

    def py(v: float) -> float:
        return bottom - (bottom - top) * ay.frac(v)

    out = _open(width, height, title)
    out.append(f'<line x1="{left}" y1="{bottom}" x2="{right}" y2="{bottom}" stroke="#333"/>')
    out.append(f'<line x1="{left}" y1="{top}" x2="{left}" y2="{bottom}" stroke="#333"/>')
    for v in ax.ticks:
        out.append(f'<line x1="{px(v):.1f}" y1="{top}" x2="{px(v):.1f}" y2="{bottom}" stroke="#ddd"/>')
        out.append(f'<text x="{px(v):.1f}" y="{bottom + 14}" text-anchor="middle">{_fmt(v)}</text>')
    for v in ay.ticks:
        out.append(f'<line x1="{left}" y1="{py(v):.1f}" x2="{right}" y2="{py(v):.1f}" stroke="#ddd"/>')
        out.append(f'<text x="{left - 4}" y="{py(v) + 4:.1f}" text-anchor="end">{_fmt(v)}</text>')
    out.append(f'<text x="{right}" y="{bottom + 30}" text-anchor="end">'
               f'{escape(xlabel + (" (log scale)" if ax.log else ""))}</text>')
    out.append(f'<text transform="translate(14 {top}) rotate(-90)" text-anchor="end">'
               f'{escape(ylabel + (" (log scale)" if ay.log else ""))}</text>')
    for x, y in points:
        if (x, y) in above:
            out.append(f'<circle cx="{px(x):.1f}" cy="{top}" r="2.5" fill="none" stroke="{PALETTE[0]}"/>')
        else:
            out.append(f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="2.5" fill="{PALETTE[0]}" '
                       'fill-opacity="0.45"/>')
    if above:
        out.append(f'<text x="{width / 2}" y="30" text-anchor="middle" fill="#555">{len(above)} slower, up to '
                   f'{_fmt(max(p[1] for p in above))} {escape(ylabel)}: open circles on the top edge</text>')
    for v, label in xmarks:
        x = px(v)
        out.append(f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{bottom}" stroke="#C00" stroke-dasharray="4 3"/>')
        out.append(f'<text x="{x - 3:.1f}" y="{top + 26}" text-anchor="end" fill="#C00" {HALO}>{escape(label)}</text>')
    marks = [(i, label) for i, label in chosen if 0 <= i < len(points)]
    # (x, baseline y, width, height) of what a label must not cover: the large dots, then the labels
    taken = [(px(points[i][0]) - 5, py(points[i][1]) + 5, 10.0, 10.0) for i, _ in marks]
    for i, label in marks:
        cx, cy = px(points[i][0]), py(points[i][1])
        out.append(f'<circle cx="{cx:.1f}" cy="{cy:.1f}" r="5" fill="{PALETTE[5]}" stroke="#000">'
                   f"<title>{escape(label)}: {_fmt(points[i][1])} {escape(ylabel)}, {_fmt(points[i][0])} "
                   f"{escape(xlabel)}</title></circle>")
    for i, label in marks:  # labels after every dot, so none is drawn under a later dot
        tx, ty = _place(px(points[i][0]), py(points[i][1]), label, taken, (left, top, right, bottom))
        out.append(f'<text x="{tx:.1f}" y="{ty:.1f}" font-weight="bold" {HALO}>{escape(label)}</text>')
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
