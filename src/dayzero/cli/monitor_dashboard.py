"""The terminal dashboard of ``dayzero monitor``: one rich frame of a :class:`~dayzero.monitor.view.View`
(loss curve and tokens/s as sparklines, a per-rank table of step, communication and busy time and
memory, the active alerts)."""

from __future__ import annotations

import math
from typing import Sequence

from rich.console import Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from dayzero.monitor.view import View

BLOCKS = "▁▂▃▄▅▆▇█"


def sparkline(values: Sequence[float | None], width: int = 60) -> str:
    """``values`` as block characters, the last ``width`` bucketed to one character each (mean of a
    bucket); a missing or non-finite value is ``×``."""
    vals = list(values)
    if not vals:
        return ""
    if len(vals) > width:  # bucket means, so the curve's shape survives the width
        n = len(vals)
        buckets = [vals[i * n // width:(i + 1) * n // width] for i in range(width)]
        vals = [None if any(v is None or not math.isfinite(v) for v in b) else sum(b) / len(b) for b in buckets]
    finite = [v for v in vals if v is not None and math.isfinite(v)]
    if not finite:
        return "×" * len(vals)
    lo, hi = min(finite), max(finite)
    span = hi - lo
    out = []
    for v in vals:
        if v is None or not math.isfinite(v):
            out.append("×")
        else:
            out.append(BLOCKS[int((v - lo) / span * (len(BLOCKS) - 1)) if span > 0 else len(BLOCKS) // 2])
    return "".join(out)


def _bytes(x: float | None) -> str:
    if x is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(x) < 1024 or unit == "TiB":
            return f"{x:.1f} {unit}" if unit != "B" else f"{x:.0f} B"
        x /= 1024
    return "-"


def _num(x: float | None, fmt: str = ".3g") -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, fmt)


def frame(view: View, width: int = 60):
    """One frame of the dashboard, as a rich renderable."""
    state = "finished" if view.finished else "running"
    loss = view.losses[-1][1] if view.losses else None
    head = Text.assemble((f"{view.job or 'run'}", "bold"), f"  step {view.step}  ({state})  loss ",
                         (_num(loss, ".4f"), "bold"), "  tokens/s ",
                         (_num(view.tokens_per_s[-1] if view.tokens_per_s else None, ",.0f"), "bold"),
                         f"   source {view.source}")
    curves = Table.grid(padding=(0, 1))
    curves.add_column(justify="right", style="dim")
    curves.add_column()
    losses = [v for _, v in view.losses]
    finite = [v for v in losses if v is not None and math.isfinite(v)]
    rng = f"  {min(finite):.4g} .. {max(finite):.4g}" if finite else ""
    curves.add_row("loss", sparkline(losses, width) + rng)
    tps = list(view.tokens_per_s)
    curves.add_row("tokens/s", sparkline(tps, width) + (f"  {min(tps):,.0f} .. {max(tps):,.0f}" if tps else ""))

    from dayzero.cli.render import FitTable  # fits the console: headers wrap, nothing is cut

    ranks = FitTable(title="ranks (newest step)" + ("" if view.per_rank else ": max over ranks, from the step "
                                                                           "records"), compact=True)
    for c in ("rank", "step s", "comm s", "busy s", "tokens/s", "peak mem", "of capacity", "temp C", "power W"):
        ranks.add_column(c, num=True)
    busiest = max((r.busy_s for r in view.ranks), default=None)
    for r in view.ranks:
        cap = f"{r.mem_peak_bytes / r.mem_capacity_bytes:.0%}" if r.mem_capacity_bytes else "-"
        style = "bold yellow" if view.per_rank and len(view.ranks) > 1 and r.busy_s == busiest else None
        ranks.add_row(str(r.rank) if view.per_rank else "all", _num(r.step_s), _num(r.comm_s), _num(r.busy_s),
                      _num(r.tokens_per_s, ",.0f"), _bytes(r.mem_peak_bytes), cap, _num(r.temperature_c, ".0f"),
                      _num(r.power_w, ".0f"), style=style)

    if view.alerts:
        alerts = FitTable(title="active alerts", compact=True)
        for c in ("alert", "severity", "ranks", "message"):
            alerts.add_column(c, wrap=c != "alert")
        for a in view.alerts:
            alerts.add_row(a.name, Text(a.severity, style="bold red" if a.severity == "critical" else "yellow"),
                           (", ".join(map(str, a.ranks)) or "job") if view.per_rank else "all", a.message)
    else:
        alerts = Text("no active alerts", style="green")
    return Panel(Group(head, Text(""), curves, Text(""), ranks, Text(""), alerts), title="dayzero monitor",
                 expand=False)
