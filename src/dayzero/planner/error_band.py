"""The error band of a plan: how far the backtest's honest figure says a prediction of this kind
has been from published measurements.

The figure is the leave-one-source-group-out error of :func:`dayzero.planner.backtest.leave_one_group_out`
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

    def to_dict(self) -> dict:
        return asdict(self)

    def text(self) -> str:
        return (f"MFU {self.mfu:.1%} +- {self.mape:.1%} relative ({self.low:.1%} to {self.high:.1%}): cross-source "
                f"MAPE of {self.n} held-out {self.key} rows, bias {self.bias:+.1%}" + (f"; {self.note}" if self.note
                                                                                     else ""))


def summary(errors) -> dict:
    """n, MAPE, signed bias (median) and 90th percentile of |error| of relative errors."""
    a = np.asarray(list(errors), dtype=float)
    if a.size == 0:
        return {"n": 0, "mape": None, "bias": None, "p90_abs_rel_error": None}
    return {"n": int(a.size), "mape": float(np.abs(a).mean()), "bias": float(np.median(a)),
            "p90_abs_rel_error": float(np.percentile(np.abs(a), 90))}


def error_table(rows: list[dict], iterations: int, command: str, date: str) -> dict:
    """The shipped table from the held-out rows of ``leave_one_group_out`` (each with ``family``,
    ``gemm_precision``, ``group`` and ``rel_error``): overall, per family/precision and per group."""
    cells: dict[str, list[float]] = {}
    groups: dict[str, list[float]] = {}
    for r in rows:
        cells.setdefault(f"{r['family']}/{r['gemm_precision']}", []).append(r["rel_error"])
        groups.setdefault(r["group"], []).append(r["rel_error"])
    return {"schema": SCHEMA, "definition": "leave-one-source-group-out relative error of tokens/s per device "
            "((predicted - published) / published); mape = mean |error|, bias = median error", "date": date,
            "command": command, "iterations": iterations, "min_rows": MIN_ROWS,
            "overall": summary(r["rel_error"] for r in rows),
            "by_family_precision": {k: summary(v) for k, v in sorted(cells.items())},
            "by_group": {k: summary(v) for k, v in sorted(groups.items())}}


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


def error_band(table: dict, family: str, precision: str, mfu: float) -> ErrorBand:
    """The band of a plan of ``family`` (dense | moe) in GEMM ``precision`` with predicted ``mfu``;
    see the module docstring."""
    key = f"{family}/{precision}"
    cell = table["by_family_precision"].get(key, {"n": 0})
    note = ""
    if cell["n"] < table["min_rows"]:
        note = (f"only {cell['n']} held-out {key} rows (< {table['min_rows']}): the overall figure of all "
                f"{table['overall']['n']} rows is used")
        key, cell = "overall", table["overall"]
    mape = float(cell["mape"])
    return ErrorBand(key=key, n=int(cell["n"]), mape=mape, bias=float(cell["bias"]), mfu=mfu,
                     low=mfu * (1 - mape), high=mfu * (1 + mape), note=note)
