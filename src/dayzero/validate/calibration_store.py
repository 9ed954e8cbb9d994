"""The calibration loop's storage: validation runs and fitted constants live in the profile.

A profile (``dayzero calibrate``'s cluster YAML) keeps every run it was validated with under
``measurements.validation_runs`` (one record per layout label; a newer run replaces an older
one) and the last fit under ``measurements.calibration``; the fitted values themselves go to
``efficiency``, where the planner reads them (planner/perf/calibration.py ``CLUSTER_KEYS``), and the
fitted process baseline to ``runtime_context_mib`` (the planner's runtime-context memory term).
"""

from __future__ import annotations

import datetime as _dt
from pathlib import Path

from dayzero.errors import ConfigError
from dayzero.inputs import load_yaml
from dayzero.specs.cluster import cluster_from_dict
from dayzero.validate.fit import FIT_KEYS, fit, fit_memory, observation_from_record
from dayzero.validate.profile import write_profile


def calibrate_profile(profile_path: str | Path, records: list[dict], keys=FIT_KEYS,
                      out: str | Path | None = None) -> dict:
    """Add ``records`` to the profile's runs, fit ``keys`` on all of them, write the profile
    (to ``out``, default in place). Returns the fit report plus ``profile`` (the path written)."""
    path = Path(profile_path)
    raw = load_yaml(path, "a cluster profile YAML (dayzero calibrate writes one)")
    if not isinstance(raw, dict):
        raise ConfigError(str(path), None, "expected a cluster YAML mapping")
    meas = dict(raw.get("measurements") or {})
    runs = {r["label"]: r for r in meas.get("validation_runs", [])}
    for r in records:
        runs[r["label"]] = r
    if not runs:
        raise ConfigError(str(path), "measurements.validation_runs", "no validation runs stored or given; run "
                          "`dayzero validate MODEL --cluster PROFILE --calibrate` first")
    # fit from the profile as it was measured: earlier fits must not be the starting point's bias
    base = dict(raw)
    cluster = cluster_from_dict(base, str(path))
    report = fit([observation_from_record(r) for r in runs.values()], cluster, tuple(keys))
    raw["efficiency"] = {**(raw.get("efficiency") or {}), **{k: float(f"{v:.6g}") for k, v in report["fitted"].items()}}
    memory = fit_memory(list(runs.values()), cluster)
    if memory is not None:  # the measured process baseline, where the profile keeps it
        mib = round(memory["runtime_context_bytes_after"] / 2**20, 1)
        if isinstance(raw.get("accelerator"), dict):
            raw["accelerator"] = {**raw["accelerator"], "runtime_context_mib": mib}
        else:
            raw["runtime_context_mib"] = mib
        report["memory"] = memory
    meas["validation_runs"] = list(runs.values())
    meas["calibration"] = {"date": _dt.date.today().isoformat(), "keys": report["keys"], "runs": report["runs"],
                           "before": {k: report["before"][k] for k in ("median_abs_rel_error", "mape", "spearman")},
                           "after": {k: report["after"][k] for k in ("median_abs_rel_error", "mape", "spearman")},
                           "constants_before": report["constants_before"],
                           "memory": None if memory is None else {k: memory[k] for k in (
                               "runtime_context_bytes_before", "runtime_context_bytes_after")}}
    raw["measurements"] = meas
    target = write_profile(raw, out or path)
    return {**report, "profile": str(target)}


def calibrate_from_files(profile_path: str | None, records: list[dict], run_files, keys=FIT_KEYS,
                         out: str | Path | None = None) -> dict:
    """:func:`calibrate_profile` on ``records`` plus the records of stored ``dayzero validate``
    results (``validation.json`` files); the profile must be a file (``dayzero calibrate`` writes one)."""
    records = list(records) + calibration_inputs(profile_path, run_files, keys)
    return calibrate_profile(profile_path, records, keys, out)


def calibration_inputs(profile_path: str | None, run_files, keys=FIT_KEYS) -> list[dict]:
    """The inputs of a fit, checked before any work (``dayzero validate --calibrate``, also with
    ``--dry-run``): the profile file, the keys, and the records of the stored runs."""
    from dayzero.inputs import load_json
    from dayzero.validate.fit import check_fit_keys

    if not profile_path or not Path(profile_path).exists():
        raise ConfigError("--cluster", None, "--calibrate updates a profile file: pass --cluster FILE.yaml "
                          "(from dayzero calibrate)")
    check_fit_keys(tuple(keys))
    records = []
    for f in run_files:
        obj = load_json(f, "pass validation.json files written by `dayzero validate --out DIR`")
        if not isinstance(obj, dict) or "record" not in obj:
            raise ConfigError(str(f), "record", "not a dayzero validate result (no 'record')")
        records.append(obj["record"])
    return records
