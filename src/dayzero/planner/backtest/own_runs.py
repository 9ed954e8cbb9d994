"""A team's own measured runs refit the planner's efficiency constants (``dayzero calibrate
--runs FILE.csv``), with the leave-one-out error that becomes the band of a calibrated plan.

The runs are a CSV with the published-runs columns (the shipped ``published_runs_dev.csv``'s; a
row states what it knows, :mod:`published` reads it as written), or the ``--metrics`` JSONL of
``dayzero train`` (:func:`metrics_row`: its end record states the model's shape, the accelerator,
the device count, the layout and the measured tokens/s, and becomes one such row). The constants the rows depend
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
from dayzero.inputs import jsonl_objects
from dayzero.planner.backtest.backtest import fit_cases, predict_cases
from dayzero.planner.backtest.published import Skip, cases_of, load_cases
from dayzero.planner.perf.calibration import PerfConstants
from dayzero.planner.search.error_band import summary

MIN_RUNS = 2  # leave-one-out needs another row to fit on
PRICED_DTYPES = ("bf16", "fp8")  # the GEMM precisions a measured run is priced at (fp32 is not one)


def end_record(path) -> dict:
    """The last ``{"event": "end"}`` record of a ``dayzero train --metrics`` JSONL; a one-line
    ConfigError when the run never ended (no end record) or the file is no metrics stream."""
    end = None
    for obj in jsonl_objects(path, "pass the --metrics JSONL of a finished `dayzero train` run"):
        if obj.get("event") == "end":
            end = obj
    if end is None:
        raise ConfigError(str(path), None, "no end record: the run did not finish (train writes it last); pass the "
                                           "metrics of a finished run")
    return end


def metrics_row(path) -> dict | Skip:
    """A finished ``dayzero train`` run as one published-runs row: its model and shape
    (``architecture``), accelerator, device count, layout and measured tokens/s (the mean over the
    steps after the first); a Skip with the reason where the end record lacks what a row needs
    (a run from before dayzero wrote them) or was computed in fp32."""
    end, rid = end_record(path), Path(path).stem
    need = [k for k in ("layout", "accelerator", "architecture", "world", "tokens_per_s") if not end.get(k)]
    if need:
        return Skip(rid, f"the end record has no {', '.join(need)} (written by dayzero train since 2026-12); rerun, "
                         "or write the run as a CSV row", "bad value")
    if end.get("compute_dtype") not in PRICED_DTYPES:
        return Skip(rid, f"computed in {end.get('compute_dtype')}: the planner prices bf16 and fp8 GEMMs, not "
                         "this run's", "bad value")
    lay = end["layout"] if isinstance(end["layout"], dict) else {}
    rec = {"none": "none", "selective": "selective", "full": "full"}.get(lay.get("recompute"), "")
    row = {"id": rid, "source": str(path), "model": str(end.get("model", "")), "accelerator": str(end["accelerator"]),
           "num_accelerators": end["world"], "framework": "dayzero", "precision": end["compute_dtype"],
           "tokens_per_sec_total": end["tokens_per_s"], "seq_len": lay.get("seq"), "mbs": lay.get("mbs"),
           "gbs": lay.get("gbs"), "tp": lay.get("tp"), "pp": lay.get("pp"), "dp": lay.get("dp"), "cp": lay.get("cp"),
           "ep": lay.get("ep"), "etp": lay.get("etp"), "vp": lay.get("vpp"), "activation_recompute": rec,
           "zero_or_dist_optimizer": f"zero{lay['zero']}" if isinstance(lay.get("zero"), int) else "",
           "sequence_parallel": "yes" if lay.get("sequence_parallel") else "no",
           **{k: v for k, v in end["architecture"].items() if v is not None}}
    return {k: "" if v is None else str(v) for k, v in row.items()}


def calibrate_runs(paths, start: PerfConstants | None = None, iterations: int = 60,
                   loo_iterations: int = 20) -> dict:
    """Fit on every row of ``paths`` (one CSV or several), then leave each row out (module
    docstring). Returns the constants, the in-sample and leave-one-out summaries, each row's
    held-out error and the skipped rows with their reasons."""
    paths = [paths] if isinstance(paths, (str, Path)) else list(paths)
    cases, skips = [], []
    for path in paths:
        if str(path).endswith((".jsonl", ".json")):
            row = metrics_row(path)
            c, s = cases_of([row]) if isinstance(row, dict) else ([], [row])
        else:
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
