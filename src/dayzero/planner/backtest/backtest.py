"""Backtest: predict every published run and compare tokens/s per device with the measurement.

``mape`` is the mean of |predicted - published| / published over the predicted rows;
``p90_abs_rel_error`` its 90th percentile; ``bias`` the median signed relative error (positive:
the planner predicts too fast). Rows are split into two documented halves by the
parity of their numeric id (``R0124`` -> 124, even = **fit** half, odd = **held** half): the
efficiency constants are fitted on the fit half only (:func:`fit_constants`), so the held
half's error is an out-of-sample figure. :func:`leave_one_group_out` is the stricter one: each
source group (one publication series, with its own software and conventions) is predicted with
constants fitted on the other groups only.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from dayzero.errors import ConfigError
from dayzero.planner.backtest.published import Case, load_cases
from dayzero.planner.perf.calibration import CONSTANT_BOUNDS, PerfConstants
from dayzero.planner.perf.comm import Groups
from dayzero.planner.perf.minimize import first_simplex, nelder_mead
from dayzero.planner.perf.perf import evaluate, placement
from dayzero.specs.counting import params_total
from dayzero.specs.grid import encode

GROUP_BY = ("source", "model", "accelerator", "precision")  # precision groups on the recipe: bf16 fp8 mxfp8 fp4
FIT_FIELDS = ("gemm_scale_bf16", "gemm_scale_fp8", "gemm_scale_fp4", "moe_gemm_scale", "gemm_half_dim", "attention_eff",
              "memory_scale", "layer_overhead_s", "moe_expert_overhead_s", "moe_sync_s", "flash2_max_tflops")


def half_of(row_id: str) -> str:
    """'fit' for even numeric ids, 'held' for odd ones."""
    m = re.search(r"(\d+)", row_id)
    return "fit" if m and int(m.group(1)) % 2 == 0 else "held"


@dataclass(frozen=True)
class Batch:
    """Rows evaluated in one vectorised call: they share a model, cluster, sequence length, layer
    split and options. ``grid`` and ``placed`` do not depend on the efficiency constants, so a fit
    builds its batches once and re-evaluates them (``placed`` memoises the collective times)."""

    first: Case
    rows: list[int]  # indices into the case list
    grid: dict
    placed: Groups


def batch_cases(cases: list[Case]) -> list[Batch]:
    """The rows of ``cases`` grouped into :class:`Batch` es."""
    groups: dict = {}
    for i, case in enumerate(cases):
        key = (case.spec, case.cluster.name, case.cluster.devices, case.cluster.tiers, case.options, case.parallel.seq,
               case.parallel.layer_split, case.parallel.precision)
        groups.setdefault(key, []).append(i)
    out = []
    for idx in groups.values():
        grid = encode([cases[i].parallel for i in idx])
        out.append(Batch(cases[idx[0]], idx, grid, placement(grid, cases[idx[0]].cluster)))
    return out


def predict_batches(batches: list[Batch], n: int, constants: PerfConstants | None = None) -> np.ndarray:
    """Predicted tokens/s per device of the ``n`` rows the batches hold (see :func:`predict_cases`)."""
    out = np.zeros(n)
    for b in batches:
        options = replace(b.first.options, constants=constants) if constants is not None else b.first.options
        ev = evaluate(b.first.spec, b.grid, b.first.cluster, options, layer_split=b.first.parallel.layer_split,
                      placed=b.placed, inventory=False)
        out[b.rows] = ev.tokens_per_s_per_device
    return out


def predict_cases(cases: list[Case], constants: PerfConstants | None = None) -> np.ndarray:
    """Predicted tokens/s per device of many rows; rows sharing a model, cluster, sequence length,
    layer split and options are evaluated in one vectorised call (same numbers as one by one)."""
    return predict_batches(batch_cases(cases), len(cases), constants)


def _summary(errors: list[float]) -> dict:
    a = np.asarray(errors, dtype=float)
    if a.size == 0:
        return {"n": 0, "mape": None, "p90_abs_rel_error": None, "bias": None}
    return {"n": int(a.size), "mape": float(np.abs(a).mean()), "p90_abs_rel_error": float(np.percentile(np.abs(a), 90)),
            "bias": float(np.median(a))}


def memory_summary(rows: list[dict]) -> dict:
    """Share of rows whose predicted peak fits the device (every published run ran), overall and
    among the rows that state their recompute setting."""
    stated = [r for r in rows if r["recompute_stated"]]
    share = lambda rs: sum(r["fits"] for r in rs) / len(rs) if rs else None  # noqa: E731
    return {"fits_share": share(rows), "fits_share_recompute_stated": share(stated),
            "recompute_stated": len(stated), "not_fitting": [r["id"] for r in rows if not r["fits"]]}


def group_of(row: dict, by: str) -> str:
    """The value of a result row that ``--by`` groups on."""
    return str(row["recipe" if by == "precision" else by])


def run_backtest(path: str | Path | None = None, constants: PerfConstants | None = None, by: str = "source") -> dict:
    """The ``dayzero backtest --json`` object (rows, summary, skipped), plus per-half and per-source
    summaries, ``by_group`` in the summary (one of :data:`GROUP_BY`), skip reasons counted by kind,
    and the assumptions made."""
    if by not in GROUP_BY:
        raise ConfigError("--by", None, f"{by!r} is not a grouping; one of: {', '.join(GROUP_BY)}")
    cases, skips = load_cases(path)
    rows, by_source, by_half = [], {}, {"fit": [], "held": []}
    preds = predict_cases(cases, constants)
    for case, pred in zip(cases, preds):
        pred = float(pred)
        err = (pred - case.published) / case.published
        half = half_of(case.id)
        rows.append({"id": case.id, "published": case.published, "predicted": pred, "rel_error": err,
                     "half": half, "source": case.source, "model": case.model or case.spec.name,
                     "accelerator": case.cluster.accelerator.id, "devices": case.cluster.devices,
                     "layout": case.parallel.describe(), "precision": case.gemm_precision,
                     "recipe": case.recipe or case.gemm_precision, "source_group": case.source_group,
                     "family": "moe" if case.spec.is_moe else "dense",
                     "memory_fraction": case.memory_fraction, "fits": case.memory_fraction <= 1.0,
                     "recompute": case.parallel.recompute, "recompute_stated": case.recompute_stated,
                     "assumed": [{"kind": a.kind, "text": a.text} for a in case.assumed]})
        by_source.setdefault(case.source, []).append(err)
        by_half[half].append(err)
    grouped: dict[str, list[float]] = {}
    for r in rows:
        grouped.setdefault(group_of(r, by), []).append(r["rel_error"])
    summary = _summary([r["rel_error"] for r in rows])
    summary["skipped"] = len(skips)
    summary["skipped_fraction"] = len(skips) / max(1, len(skips) + len(rows))
    summary["skipped_by_reason"] = dict(Counter(s.kind for s in skips).most_common())
    summary["assumed"] = dict(Counter(a.kind for c in cases for a in c.assumed).most_common())
    summary["rows_with_assumptions"] = sum(1 for c in cases if c.assumed)
    summary.update(memory_summary(rows))
    summary["by"] = by
    summary["by_group"] = {g: _summary(e) for g, e in sorted(grouped.items())}
    return {"rows": rows, "summary": summary,
            "halves": {h: _summary(e) for h, e in by_half.items()},
            "by_source": {s: _summary(e) for s, e in sorted(by_source.items())},
            "skipped": [{"id": s.id, "reason": s.reason, "kind": s.kind} for s in skips],
            "constants": (constants or PerfConstants()).to_dict()}


def fit_constants(path: str | Path | None, start: PerfConstants | None = None, iterations: int = 400,
                  half: str = "fit") -> tuple[PerfConstants, float]:
    """Fit FIT_FIELDS on one half's rows by minimising its MAPE (Nelder-Mead on log-parameters).
    Returns the constants and the half's MAPE."""
    cases = [c for c in load_cases(path)[0] if half_of(c.id) == half]
    return fit_cases(cases, start, iterations)


def fit_cases(cases: list[Case], start: PerfConstants | None = None, iterations: int = 400,
              step: float = 0.15, first_predictions: list[np.ndarray | None] | None = None
              ) -> tuple[PerfConstants, float]:
    """Fit FIT_FIELDS on ``cases`` by minimising their MAPE (Nelder-Mead on log-parameters, the
    first simplex ``step`` along each axis). ``first_predictions``: the rows' predictions at each
    point of that first simplex (None where a point is out of bounds), when the caller has them
    (:func:`simplex_predictions`). Returns the constants and the MAPE."""
    published = np.array([c.published for c in cases])
    start = start or PerfConstants()
    x0 = np.log([getattr(start, f) for f in FIT_FIELDS])
    batches = batch_cases(cases)  # built once: every loss evaluation re-uses grids and placements

    def mape(pred: np.ndarray | None) -> float:
        if pred is None:
            return 1e9  # outside the physical range a calibration file may hold
        return float(np.mean(np.abs(pred - published) / published))

    def loss(x) -> float:
        c = _constants_at(start, x)
        return mape(None if c is None else predict_batches(batches, len(cases), c))

    first = None if first_predictions is None else [mape(p) for p in first_predictions]
    x, fx = nelder_mead(loss, x0, iterations, step, first)
    return _make(start, x), fx


def _make(start: PerfConstants, x) -> PerfConstants:
    return replace(start, **{f: float(np.exp(v)) for f, v in zip(FIT_FIELDS, x)})


def _constants_at(start: PerfConstants, x) -> PerfConstants | None:
    """The constants at log-point ``x``, None outside CONSTANT_BOUNDS."""
    c = _make(start, x)
    return c if all(in_bounds(getattr(c, f), CONSTANT_BOUNDS[f]) for f in FIT_FIELDS) else None


def simplex_predictions(cases: list[Case], start: PerfConstants, step: float) -> list[np.ndarray | None]:
    """Every row's prediction at each point of the first Nelder-Mead simplex around ``start``
    (None where the point is out of bounds): fits of subsets of ``cases`` from one start share it."""
    batches = batch_cases(cases)
    x0 = np.log([getattr(start, f) for f in FIT_FIELDS])
    out: list[np.ndarray | None] = []
    for x in first_simplex(x0, step):
        c = _constants_at(start, x)
        out.append(None if c is None else predict_batches(batches, len(cases), c))
    return out


def in_bounds(v: float, bound: tuple[float, float, bool]) -> bool:
    lo, hi, lo_open = bound
    return (v > lo if lo_open else v >= lo) and v <= hi


def constrained_fields(cases: list[Case]) -> tuple[str, ...]:
    """The FIT_FIELDS some of ``cases`` depend on: a precision's GEMM scale needs a row in that
    precision, the MoE constants a MoE row, the FlashAttention-2 cap a row running FA2."""
    precisions = {c.gemm_precision for c in cases}
    moe = any(c.spec.is_moe for c in cases)
    flash2 = any(c.options.attention_kernel == "flash2" for c in cases)
    need = {"gemm_scale_bf16": "bf16" in precisions, "gemm_scale_fp8": "fp8" in precisions,
            "gemm_scale_fp4": "fp4" in precisions, "moe_gemm_scale": moe, "moe_expert_overhead_s": moe,
            "moe_sync_s": moe, "flash2_max_tflops": flash2}
    return tuple(f for f in FIT_FIELDS if need.get(f, True))


def hold_out(cases: list[Case], g: str, start: PerfConstants, iterations: int, step: float,
             shared: list | None = None) -> tuple:
    """One source group of :func:`leave_one_group_out`: (its held-out rows, the fitted constants,
    the fields the other groups cannot constrain). ``shared``: the first simplex's predictions on
    every case (:func:`simplex_predictions`), computed once for all groups; else computed here."""
    train_idx = [i for i, c in enumerate(cases) if c.source_group != g]
    train = [cases[i] for i in train_idx]
    held = [c for c in cases if c.source_group == g]
    first = None if shared is None else [None if q is None else q[train_idx] for q in shared]
    constants, _ = fit_cases(train, start, iterations, step, first)
    free = [f for f in FIT_FIELDS if f not in constrained_fields(train) and f in constrained_fields(held)]
    rows = [{"id": case.id, "group": g, "family": "moe" if case.spec.is_moe else "dense",
             "precision": case.recipe or case.gemm_precision, "gemm_precision": case.gemm_precision,
             "published": case.published, "predicted": float(pred),
             "rel_error": (float(pred) - case.published) / case.published,
             # what the row covers, for the error band's evidence (planner.error_band.evidence)
             "accelerator": case.cluster.accelerator.id, "devices": case.cluster.devices,
             "params": params_total(case.spec), "vendor": case.cluster.accelerator.vendor, "engine": case.engine}
            for case, pred in zip(held, predict_cases(held, constants))]
    return rows, {f: getattr(constants, f) for f in FIT_FIELDS}, free


def _hold_out_job(args: tuple) -> tuple:
    path, g, start, iterations, step = args
    return hold_out(load_cases(path)[0], g, start, iterations, step)


def leave_one_group_out(path: str | Path | None = None, start: PerfConstants | None = None, iterations: int = 20,
                        step: float = 0.05, jobs: int = 1) -> dict:
    """Honest error: for every source group, fit FIT_FIELDS on the other groups' rows (Nelder-Mead
    warm-started from ``start``, by default the shipped constants, ``iterations`` steps) and predict
    the held-out group with those constants. Returns MAPE summaries per held-out group
    (``by_group``), per family (dense/MoE), per precision recipe and ``overall``, each group's
    fitted constants, and the fields the other groups cannot constrain (``unconstrained``: they
    keep the start value, which saw every group's even-id rows). ``jobs`` > 1 fits the groups in
    that many processes (same numbers: each group's fit is independent)."""
    cases, _ = load_cases(path)
    start = start or PerfConstants()
    groups = sorted({c.source_group for c in cases})
    if len(groups) < 2:
        raise ConfigError(str(path or "published runs"), "source_group",
                          f"leave-one-group-out needs rows of at least 2 source groups, got {len(groups)}")
    if jobs > 1:
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(min(jobs, len(groups))) as pool:
            results = list(pool.map(_hold_out_job, [(path, g, start, iterations, step) for g in groups]))
    else:
        shared = simplex_predictions(cases, start, step)  # every group's fit starts from the same simplex
        results = [hold_out(cases, g, start, iterations, step, shared) for g in groups]
    rows, fitted, free = [], {}, {}
    for g, (held_rows, constants, unconstrained) in zip(groups, results):
        rows += held_rows
        fitted[g], free[g] = constants, unconstrained

    def by(key: str) -> dict:
        out: dict[str, list[float]] = {}
        for r in rows:
            out.setdefault(r[key], []).append(r["rel_error"])
        return {k: _summary(v) for k, v in sorted(out.items())}

    return {"by": "source_group", "iterations": iterations, "overall": _summary([r["rel_error"] for r in rows]),
            "by_group": by("group"), "by_family": by("family"), "by_precision": by("precision"),
            "constants": fitted, "unconstrained": free, "rows": rows}

