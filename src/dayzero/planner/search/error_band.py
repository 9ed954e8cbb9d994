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

The band is the 80 % one: +- the 80th percentile of |error| of those held-out rows (``p80``; a
table without it falls back to the MAPE). It is widened where the plan extrapolates past what the
fit saw, by the spread measured when that factor was left out (:data:`FACTORS`): for each factor,
the held-out rows whose value of it (their engine, accelerator, vendor, GEMM precision; their
device count above every other group's largest run) appears in no other source group, so the fit
that predicted them had never seen it. The base spread is that of the rows outside the fit on no
factor (in-distribution), and a plan outside the fit takes the largest spread measured among its
factors: half-width = max(base, spread of each factor it extrapolates). (The factors are not
independent, the same rows leave out an engine and a card together, so they are not added.)
A factor the shipped rows never left out (one vendor only) widens by the largest measured factor's
spread, said so. The output names each factor that widened the band. The table's ``coverage``
is the share of held-out rows inside their own band, computed the same way.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from dayzero.errors import ConfigError

TABLE_FILE = "backtest_error.json"
SCHEMA = "dayzero.backtest_error/1"
MIN_ROWS = 5  # fewer held-out rows of a family and precision than this: fall back to the overall figure
FAMILIES = ("dense", "moe")
BAND_QUANTILE = 80  # the band is the 80 % one: the 80th percentile of held-out |error|
FACTORS = ("engine", "accelerator", "vendor", "gemm_precision", "scale")  # what a plan can extrapolate


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
    half_width: float = 0.0  # relative half-width of the 80 % band (0: the MAPE, an old table)
    widened_by: tuple[str, ...] = ()  # the factors outside the fit that widened it, with their spreads

    def to_dict(self) -> dict:
        return asdict(self)

    def text(self) -> str:
        half = self.half_width or self.mape
        what = "80 % band" if self.half_width else "MAPE"
        return (f"MFU {self.mfu:.1%} +- {half:.1%} relative ({self.low:.1%} to {self.high:.1%}): cross-source "
                f"{what} of {self.n} held-out {self.key} rows (MAPE {self.mape:.1%}), bias {self.bias:+.1%}"
                + (f"; widened for {', '.join(self.widened_by)}" if self.widened_by else "")
                + (f"; {self.note}" if self.note else "")
                + (f"; rows: {self.evidence}" if self.evidence else "") + (
                    f"; this plan extrapolates: {', '.join(self.extrapolates)}" if self.extrapolates else
                    "; this plan lies within them" if self.evidence else ""))


def summary(errors) -> dict:
    """n, MAPE, signed bias (median) and 90th percentile of |error| of relative errors."""
    a = np.asarray(list(errors), dtype=float)
    if a.size == 0:
        return {"n": 0, "mape": None, "bias": None, "p80_abs_rel_error": None, "p90_abs_rel_error": None}
    return {"n": int(a.size), "mape": float(np.abs(a).mean()), "bias": float(np.median(a)),
            "p80_abs_rel_error": float(np.percentile(np.abs(a), BAND_QUANTILE)),
            "p90_abs_rel_error": float(np.percentile(np.abs(a), 90))}


def _value(r: dict, factor: str):
    return r.get(factor) if factor != "scale" else r.get("devices")


def left_out(rows: list[dict], factor: str) -> list[dict]:
    """The held-out rows whose ``factor`` the fit that predicted them never saw: a value no other
    source group has, or (``scale``) more devices than any other group's largest run."""
    out = []
    for r in rows:
        others = [o for o in rows if o["group"] != r["group"]]
        if factor == "scale":
            if r["devices"] > max((o["devices"] for o in others), default=0):
                out.append(r)
        elif r.get(factor) is not None and all(o.get(factor) != r[factor] for o in others):
            out.append(r)
    return out


def factor_spreads(rows: list[dict]) -> dict:
    """Per factor of :data:`FACTORS`: the rows left out of it and their 80th-percentile |error|."""
    out = {}
    for f in FACTORS:
        lo = left_out(rows, f)
        out[f] = {"n": len(lo), "p80_abs_rel_error": summary(r["rel_error"] for r in lo)["p80_abs_rel_error"],
                  "values": sorted({str(_value(r, f)) for r in lo})[:12]}
    return out


def widen(base: float, spreads: dict, factors: list[str]) -> tuple[float, tuple[str, ...]]:
    """The half-width for a plan outside the fit on ``factors`` (module docstring) and the words
    naming each widening."""
    measured = [v["p80_abs_rel_error"] for v in spreads.values() if v.get("n") and v.get("p80_abs_rel_error")]
    half, said = base, []
    for f in factors:
        cell = spreads.get(f, {})
        spread = cell.get("p80_abs_rel_error") if cell.get("n") else None
        how = f"{f} +-{spread:.1%} (measured on {cell['n']} rows left out of it)" if spread else None
        if spread is None and measured:
            spread = max(measured)
            how = f"{f} +-{spread:.1%} (never left out by the shipped rows: the widest measured factor's spread)"
        if spread is None:
            continue
        half = max(half, spread)
        said.append(how)
    return half, tuple(said)


def row_factors(r: dict, rows: list[dict]) -> list[str]:
    """The factors on which held-out row ``r`` lies outside its own fit (the other groups)."""
    others = [o for o in rows if o["group"] != r["group"]]
    out = [f for f in FACTORS if f != "scale" and r.get(f) is not None and all(o.get(f) != r[f] for o in others)]
    if r["devices"] > max((o["devices"] for o in others), default=0):
        out.append("scale")
    return out


def coverage(rows: list[dict], cells: dict, overall: dict, spreads: dict, min_rows: int) -> float:
    """The share of held-out rows inside their own widened 80 % band (module docstring)."""
    inside = 0
    for r in rows:
        cell = cells.get(f"{r['family']}/{r['gemm_precision']}", {"n": 0})
        base = (cell if cell["n"] >= min_rows else overall)["p80_abs_rel_error"]
        half, _ = widen(base, spreads, row_factors(r, rows))
        inside += abs(r["rel_error"]) <= half
    return inside / len(rows) if rows else 0.0


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
    factored = all("group" in r and "devices" in r for r in rows)
    # the base spread: rows the fit saw every factor of (module docstring); all rows when none are
    within = [r for r in rows if not row_factors(r, rows)] if factored else rows
    within = within if len(within) >= MIN_ROWS else rows
    for r in within:
        cells.setdefault(f"{r['family']}/{r['gemm_precision']}", []).append(r["rel_error"])
    for r in rows:
        groups.setdefault(r["group"], []).append(r["rel_error"])
    evidences = {}
    if rows and all("accelerator" in r for r in rows):
        evidences = {"overall": evidence(rows), **{k: evidence([r for r in rows if f"{r['family']}/"
                                                                f"{r['gemm_precision']}" == k]) for k in cells}}
    by_cell = {k: summary(v) for k, v in sorted(cells.items())}
    overall = summary(r["rel_error"] for r in within)
    spreads = factor_spreads(rows) if rows and factored else {}
    return {"schema": SCHEMA, "definition": "leave-one-source-group-out relative error of tokens/s per device "
            "((predicted - published) / published); mape = mean |error|, bias = median error, p80 = the band's "
            "half-width", "date": date,
            "command": command, "iterations": iterations, "min_rows": MIN_ROWS,
            "overall": overall, "by_family_precision": by_cell,
            "by_group": {k: summary(v) for k, v in sorted(groups.items())}, "evidence": evidences,
            "factors": spreads, "fitted": fitted_values(rows) if spreads else {},
            "all_rows": summary(r["rel_error"] for r in rows), "within_fit_rows": len(within),
            "coverage": coverage(rows, by_cell, overall, spreads, MIN_ROWS) if spreads else None}


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
               devices: int | None = None, params: float | None = None, engine: str | None = None,
               vendor: str | None = None) -> ErrorBand:
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
    base = float(cell.get("p80_abs_rel_error") or 0.0)
    if not base:  # a table written before the 80 % band
        return ErrorBand(key=key, n=int(cell["n"]), mape=mape, bias=float(cell["bias"]), mfu=mfu,
                         low=mfu * (1 - mape), high=mfu * (1 + mape), note=note, evidence=told, extrapolates=beyond)
    factors = outside_fit(table, precision, accelerator, devices, engine, vendor)
    half, said = widen(base, table.get("factors") or {}, factors)
    return ErrorBand(key=key, n=int(cell["n"]), mape=mape, bias=float(cell["bias"]), mfu=mfu,
                     low=mfu * max(0.0, 1 - half), high=mfu * (1 + half), note=note, evidence=told,
                     extrapolates=beyond, half_width=half, widened_by=said)


def outside_fit(table: dict, precision: str, accelerator: str | None, devices: int | None, engine: str | None,
                vendor: str | None) -> list[str]:
    """The :data:`FACTORS` on which a plan lies outside every row the table was fitted on."""
    fitted = table.get("fitted") or {}
    out = []
    for factor, value in (("engine", engine), ("accelerator", accelerator), ("vendor", vendor),
                          ("gemm_precision", precision)):
        if value is not None and fitted.get(factor) is not None and value not in fitted[factor]:
            out.append(factor)
    if devices is not None and fitted.get("max_devices") and devices > fitted["max_devices"]:
        out.append("scale")
    return out


def fitted_values(rows: list[dict]) -> dict:
    """What the shipped fit saw: every engine, accelerator, vendor and GEMM precision, and the
    largest device count (a plan outside them extrapolates)."""
    return {**{f: sorted({str(r[f]) for r in rows if r.get(f) is not None})
               for f in ("engine", "accelerator", "vendor", "gemm_precision")},
            "max_devices": max((r["devices"] for r in rows), default=0)}


def calibrated_band(cal: dict, mfu: float, table: dict | None = None, accelerator: str | None = None,
                    devices: int | None = None, engine: str | None = None) -> ErrorBand:
    """The band of a plan priced with a team's calibration (``dayzero calibrate --runs``): its
    leave-one-out residuals' 80th-percentile |error|, widened (by the shipped table's measured
    factor spreads) only where the plan lies outside the team's runs: another engine or card, or
    more devices than the largest run."""
    base = float(cal["p80_abs_rel_error"])
    factors = []
    if engine is not None and cal.get("engines") and engine not in cal["engines"]:
        factors.append("engine")
    if accelerator is not None and cal.get("accelerators") and accelerator not in cal["accelerators"]:
        factors.append("accelerator")
    if devices is not None and cal.get("max_devices") and devices > cal["max_devices"]:
        factors.append("scale")
    half, said = widen(base, (table or {}).get("factors") or {}, factors)
    return ErrorBand(key="calibrated", n=int(cal["n"]), mape=float(cal["mape"]), bias=float(cal["bias"]), mfu=mfu,
                     low=mfu * max(0.0, 1 - half), high=mfu * (1 + half),
                     note=f"leave-one-out on the team's runs ({cal.get('source', 'calibrate --runs')})",
                     half_width=half, widened_by=said)


def read_calibrated(path) -> dict | None:
    """The ``error_band`` a calibration file written by ``dayzero calibrate --runs`` carries (None
    for a file of constants only)."""
    from pathlib import Path

    from dayzero.errors import ConfigError
    from dayzero.inputs import load_json

    p = Path(path)
    if p.suffix != ".json":
        return None
    try:
        data = load_json(p)  # the one reader of user files (regular files, bounded, strict JSON)
    except ConfigError:
        return None  # load_calibration, which ran first, reports an unreadable file
    band = data.get("error_band") if isinstance(data, dict) else None
    if isinstance(band, dict) and all(isinstance(band.get(k), (int, float)) for k in ("n", "mape", "bias",
                                                                                      "p80_abs_rel_error")):
        return band
    return None


def band_for(spec, cluster, precision: str, mfu: float, engine: str | None = None,
             calibration: str | None = None) -> ErrorBand:
    """The band of one prediction: a ``calibration`` file's own residuals when it carries them
    (``dayzero calibrate --runs``), else the shipped table's, conditioned on what the plan
    extrapolates (module docstring)."""
    from dayzero.specs.counting import params_total

    table = load_table()
    cal = read_calibrated(calibration) if calibration else None
    acc = cluster.accelerator
    if cal:
        return calibrated_band(cal, mfu, table, acc.id, cluster.devices, engine)
    return error_band(table, "moe" if spec.is_moe else "dense", precision, mfu, acc.id, cluster.devices,
                      params_total(spec), engine=engine, vendor=acc.vendor)
