"""A team's own measured runs refit the planner's efficiency constants (``dayzero calibrate
--runs FILE.csv``), with the leave-one-out error that becomes the band of a calibrated plan.

The runs are a CSV with the published-runs columns (the shipped ``published_runs_dev.csv``'s; a
row states what it knows, :mod:`published` reads it as written). The constants the rows depend
on (:func:`backtest.constrained_fields`) are fitted on every row, warm-started from the constants
given (the shipped ones by default). Each row is then predicted by constants fitted on the others
only (leave-one-out), and those held-out relative errors are the calibrated band: the file this
writes carries them next to the constants (``error_band``: n, MAPE, bias, 80th percentile of
|error|), and a plan run with ``--calibration FILE`` prints that band instead of the shipped
table's (:func:`dayzero.planner.search.error_band.calibrated_band`).
"""

from __future__ import annotations

from pathlib import Path

from dayzero.errors import ConfigError
from dayzero.planner.backtest.backtest import fit_cases, predict_cases
from dayzero.planner.backtest.published import load_cases
from dayzero.planner.perf.calibration import PerfConstants
from dayzero.planner.search.error_band import summary

MIN_RUNS = 2  # leave-one-out needs another row to fit on


def calibrate_runs(paths, start: PerfConstants | None = None, iterations: int = 60,
                   loo_iterations: int = 20) -> dict:
    """Fit on every row of ``paths`` (one CSV or several), then leave each row out (module
    docstring). Returns the constants, the in-sample and leave-one-out summaries, each row's
    held-out error and the skipped rows with their reasons."""
    paths = [paths] if isinstance(paths, (str, Path)) else list(paths)
    cases, skips = [], []
    for path in paths:
        if str(path).endswith((".jsonl", ".json")):
            raise ConfigError(str(path), None, "calibrate --runs reads a published-runs CSV (the columns of "
                                               "published_runs_dev.csv); write each run as one row")
        c, s = load_cases(path)
        cases += c
        skips += s
    path = ", ".join(map(str, paths))
    if len(cases) < MIN_RUNS:
        raise ConfigError(str(path), None, f"{len(cases)} predictable row(s) (skipped: "
                          f"{'; '.join(f'{s.id}: {s.reason}' for s in skips) or 'none'}); leave-one-out needs at "
                          f"least {MIN_RUNS}")
    start = start or PerfConstants()
    constants, in_sample = fit_cases(cases, start, iterations)
    held = []
    for i, case in enumerate(cases):
        others = cases[:i] + cases[i + 1:]
        fitted, _ = fit_cases(others, start, loo_iterations)
        pred = float(predict_cases([case], fitted)[0])
        held.append({"id": case.id, "published": case.published, "predicted": pred,
                     "rel_error": (pred - case.published) / case.published, "engine": case.engine,
                     "accelerator": case.cluster.accelerator.id, "devices": case.cluster.devices})
    loo = summary(r["rel_error"] for r in held)
    return {"constants": constants, "in_sample_mape": in_sample, "leave_one_out": loo, "rows": held,
            "skipped": [{"id": s.id, "kind": s.kind, "reason": s.reason} for s in skips],
            "error_band": {**loo, "source": str(path), "method": "leave-one-row-out on the team's runs",
                           "engines": sorted({r["engine"] for r in held}),
                           "accelerators": sorted({r["accelerator"] for r in held}),
                           "max_devices": max(r["devices"] for r in held)}}
