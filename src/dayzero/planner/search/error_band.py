"""The error band of a plan: how far the backtest's honest figure says a prediction of this kind
has been from published measurements.

The figure is the leave-one-source-group-out error of :func:`dayzero.planner.backtest.backtest.leave_one_group_out`
(every published run predicted with efficiency constants fitted on the other source groups only),
shipped as ``presets/data/backtest_error.json`` by ``benchmarks/bench_holdout.py --table`` because
it takes minutes to compute. For a plan of family F (dense | moe) whose GEMMs run in precision P
(bf16 | fp8 | fp4), the band is the error of the held-out rows of F and P: their count ``n``, MAPE
(mean |predicted - published| / published) and signed bias (median of (predicted - published) /
published; positive: the planner predicted faster than the run went). With fewer than
:data:`MIN_ROWS` such rows the overall figure is used instead, with a note saying so.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from dayzero.errors import ConfigError

TABLE_FILE = "backtest_error.json"
SCHEMA = "dayzero.backtest_error/1"
MIN_ROWS = 5  # fewer held-out rows of a family and precision than this: fall back to the overall figure
FAMILIES = ("dense", "moe")


@dataclass(frozen=True)
class ErrorBand:
    """The band applied to one plan: ``key`` is the table entry used (``dense/bf16``, or
    ``overall`` on a fallback), ``low``/``high`` its predicted MFU times (1 -/+ MAPE)."""

    key: str
    n: int
    mape: float
    bias: float
    mfu: float
    low: float
    high: float
    note: str
    evidence: str = ""  # the rows behind it: their cards, device counts, model sizes (:func:`evidence_text`)
    extrapolates: tuple[str, ...] = ()  # where the plan lies outside those rows (:func:`outside`)

    def to_dict(self) -> dict:
        return asdict(self)

    def text(self) -> str:
        return (f"MFU {self.mfu:.1%} +- {self.mape:.1%} relative ({self.low:.1%} to {self.high:.1%}): cross-source "
                f"MAPE of {self.n} held-out {self.key} rows, bias {self.bias:+.1%}" + (f"; {self.note}" if self.note
                                                                                     else "")
                + (f"; rows: {self.evidence}" if self.evidence else "") + (
                    f"; this plan extrapolates: {', '.join(self.extrapolates)}" if self.extrapolates else
                    "; this plan lies within them" if self.evidence else ""))


def summary(errors) -> dict:
    """n, MAPE, signed bias (median) and 90th percentile of |error| of relative errors."""
    a = np.asarray(list(errors), dtype=float)
    if a.size == 0:
        return {"n": 0, "mape": None, "bias": None, "p90_abs_rel_error": None}
    return {"n": int(a.size), "mape": float(np.abs(a).mean()), "bias": float(np.median(a)),
            "p90_abs_rel_error": float(np.percentile(np.abs(a), 90))}


def evidence(rows: list[dict]) -> dict:
    """What rows (each with ``accelerator``, ``devices``, ``params``) cover: rows per card, the
    device counts and the model sizes (total parameters), least to most."""
    accs: dict[str, int] = {}
    for r in rows:
        accs[r["accelerator"]] = accs.get(r["accelerator"], 0) + 1
    return {"accelerators": dict(sorted(accs.items(), key=lambda kv: (-kv[1], kv[0]))),
            "devices": [min(r["devices"] for r in rows), max(r["devices"] for r in rows)],
            "params": [min(r["params"] for r in rows), max(r["params"] for r in rows)]}


def evidence_text(ev: dict) -> str:
    """:func:`evidence` in words: the cards (rows each), device counts and model sizes."""
    accs = ", ".join(f"{a} {n}" for a, n in ev["accelerators"].items())
    (d0, d1), (p0, p1) = ev["devices"], ev["params"]
    return f"{accs}; {d0:,}-{d1:,} devices; models of {p0 / 1e9:.3g}-{p1 / 1e9:.4g} B parameters"


def outside(ev: dict, accelerator: str, devices: int, params: float) -> tuple[str, ...]:
    """Where a plan (its card, device count, model size) lies outside the rows of ``ev``."""
    out = []
    if accelerator not in ev["accelerators"]:
        out.append(f"{accelerator} is in none of them")
    if not ev["devices"][0] <= devices <= ev["devices"][1]:
        out.append(f"{devices:,} devices is outside {ev['devices'][0]:,}-{ev['devices'][1]:,}")
    if not ev["params"][0] <= params <= ev["params"][1]:
        out.append(f"{params / 1e9:.4g} B parameters is outside {ev['params'][0] / 1e9:.3g}-"
                   f"{ev['params'][1] / 1e9:.4g} B")
    return tuple(out)


def error_table(rows: list[dict], iterations: int, command: str, date: str) -> dict:
    """The shipped table from the held-out rows of ``leave_one_group_out`` (each with ``family``,
    ``gemm_precision``, ``group`` and ``rel_error``; with ``accelerator``, ``devices`` and
    ``params`` also each cell's :func:`evidence`): overall, per family/precision and per group."""
    cells: dict[str, list[float]] = {}
    groups: dict[str, list[float]] = {}
    for r in rows:
        cells.setdefault(f"{r['family']}/{r['gemm_precision']}", []).append(r["rel_error"])
        groups.setdefault(r["group"], []).append(r["rel_error"])
    evidences = {}
    if rows and all("accelerator" in r for r in rows):
        evidences = {"overall": evidence(rows), **{k: evidence([r for r in rows if f"{r['family']}/"
                                                                f"{r['gemm_precision']}" == k]) for k in cells}}
    return {"schema": SCHEMA, "definition": "leave-one-source-group-out relative error of tokens/s per device "
            "((predicted - published) / published); mape = mean |error|, bias = median error", "date": date,
            "command": command, "iterations": iterations, "min_rows": MIN_ROWS,
            "overall": summary(r["rel_error"] for r in rows),
            "by_family_precision": {k: summary(v) for k, v in sorted(cells.items())},
            "by_group": {k: summary(v) for k, v in sorted(groups.items())}, "evidence": evidences}


def check_table(table: dict, where: str = TABLE_FILE) -> dict:
    """``table`` when it has the shipped schema, else a ConfigError naming what is wrong."""
    if not isinstance(table, dict) or table.get("schema") != SCHEMA:
        raise ConfigError(where, "schema", f"expected {SCHEMA!r}; regenerate with benchmarks/bench_holdout.py --table")
    for name in ("overall", "by_family_precision", "by_group", "command", "date", "min_rows"):
        if name not in table:
            raise ConfigError(where, name, "missing; regenerate with benchmarks/bench_holdout.py --table")
    cells = [("overall", table["overall"])] + list(table["by_family_precision"].items())
    for key, cell in cells:
        if not isinstance(cell, dict) or not isinstance(cell.get("n"), int) or cell["n"] < 0:
            raise ConfigError(where, key, "needs an integer row count n >= 0")
        if cell["n"] and not all(isinstance(cell.get(k), (int, float)) for k in ("mape", "bias")):
            raise ConfigError(where, key, "needs numeric mape and bias")
    if not table["overall"]["n"]:
        raise ConfigError(where, "overall", "has no rows")
    return table


def load_table(path=None) -> dict:
    """The shipped error table (or the one at ``path``), checked."""
    from pathlib import Path

    from dayzero.specs.presets import reference_data

    p = Path(path) if path else reference_data(TABLE_FILE)
    from dayzero.inputs import load_json

    table = load_json(p, "the backtest error table (JSON)")
    return check_table(table, str(p))


def error_band(table: dict, family: str, precision: str, mfu: float, accelerator: str | None = None,
               devices: int | None = None, params: float | None = None) -> ErrorBand:
    """The band of a plan of ``family`` (dense | moe) in GEMM ``precision`` with predicted ``mfu``;
    see the module docstring. With the plan's ``accelerator`` (catalog id), ``devices`` and
    ``params`` (total), and the table's per-cell ``evidence``, it says which rows it rests on and
    where the plan lies outside them."""
    key = f"{family}/{precision}"
    cell = table["by_family_precision"].get(key, {"n": 0})
    note = ""
    if cell["n"] < table["min_rows"]:
        note = (f"only {cell['n']} held-out {key} rows (< {table['min_rows']}): the overall figure of all "
                f"{table['overall']['n']} rows is used")
        key, cell = "overall", table["overall"]
    mape = float(cell["mape"])
    ev = table.get("evidence", {}).get(key)
    told, beyond = "", ()
    if ev:
        told = evidence_text(ev)
        if accelerator is not None and devices is not None and params is not None:
            beyond = outside(ev, accelerator, devices, params)
    return ErrorBand(key=key, n=int(cell["n"]), mape=mape, bias=float(cell["bias"]), mfu=mfu,
                     low=mfu * (1 - mape), high=mfu * (1 + mape), note=note, evidence=told, extrapolates=beyond)
