"""The calibration loop: fit the planner's efficiency constants to measured step times.

Microbenchmarks give the rates (GEMM, memory, links); what they cannot see is how a whole
training step uses them: the fraction of the GEMM rate a step reaches, the fixed cost per layer
and micro-batch (kernel launches, Python dispatch, FSDP hooks), how well collectives run under
the step's contention, and how many bytes memory-bound kernels really move. Those are the
cluster-file efficiency keys ``gemm_bf16``, ``layer_overhead_s``, ``intra`` and ``memory_scale``
(planner/perf/calibration.py ``CLUSTER_KEYS`` and ``GEMM_KEYS``),
fitted here by Nelder-Mead on their logarithms, minimising the mean squared log error of the
predicted step times over the validation runs, and stored in the profile's ``efficiency``.
With fewer runs than keys only the first ``len(runs)`` keys are fitted.

Errors are reported before and after: median |rel error|, MAPE and the Spearman rank
correlation between predicted and measured step times.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from dayzero.errors import ConfigError
from dayzero.planner.perf.calibration import CLUSTER_KEYS, MEASURED_FRACTION_MAX, constants_for, rates
from dayzero.planner.perf.minimize import nelder_mead
from dayzero.specs.cluster import Cluster
from dayzero.specs.model import ModelSpec
from dayzero.specs.parallel import ParallelConfig
from dayzero.validate.predicted import compute_view, perf_options

FIT_KEYS = ("gemm_bf16", "layer_overhead_s", "intra", "memory_scale")


@dataclass(frozen=True)
class Observation:
    """One measured validation run."""

    label: str
    spec: ModelSpec
    parallel: ParallelConfig
    compute_dtype: str
    step_time_s: float


def observation_from_record(rec: dict) -> Observation:
    """From a stored run record (``record_of`` / a validation JSON's ``run`` + ``measured``)."""
    from dayzero.specs.registry import load_model

    spec = load_model(rec["model"]).shrink(**(rec.get("shrink") or {}))
    return Observation(rec.get("label") or rec["layout"], spec, ParallelConfig.from_dict(rec["parallel"]),
                       rec["compute_dtype"], float(rec["step_time_s"]))


def predict_steps(observations: list[Observation], cluster: Cluster) -> np.ndarray:
    """The planner's step time for each observation on ``cluster`` (its efficiency applied)."""
    from dayzero.planner.perf.perf import evaluate
    from dayzero.planner.predict import with_even_split
    from dayzero.specs.grid import encode

    out = np.zeros(len(observations))
    groups: dict = {}  # one vectorised evaluation per model, dtype, sequence length and layer split
    for i, o in enumerate(observations):
        p = with_even_split(o.spec, o.parallel)
        groups.setdefault((o.spec, o.compute_dtype, p.seq, p.layer_split), []).append((i, p))
    for (spec, dtype, _, split), members in groups.items():
        view = compute_view(cluster, dtype)
        grid = encode([p for _, p in members])
        ev = evaluate(spec, grid, view, perf_options(dtype, constants_for(view)), layer_split=split)
        out[[i for i, _ in members]] = ev.step_s
    return out


def spearman(a, b) -> float | None:
    """Spearman's rank correlation (average ranks for ties); None for fewer than 3 points."""
    a, b = np.asarray(a, float), np.asarray(b, float)
    if len(a) < 3:
        return None
    ra, rb = _ranks(a), _ranks(b)
    if ra.std() == 0 or rb.std() == 0:
        return None
    return float(np.corrcoef(ra, rb)[0, 1])


def _ranks(x: np.ndarray) -> np.ndarray:
    order = np.argsort(x, kind="stable")
    r = np.empty(len(x))
    r[order] = np.arange(len(x), dtype=float)
    for v in np.unique(x):  # average the ranks of ties
        idx = x == v
        r[idx] = r[idx].mean()
    return r


def errors(predicted, measured, labels=None) -> dict:
    p, m = np.asarray(predicted, float), np.asarray(measured, float)
    rel = (p - m) / m
    labels = labels or [str(i) for i in range(len(p))]
    return {"n": int(len(p)), "median_abs_rel_error": float(np.median(np.abs(rel))) if len(p) else None,
            "mape": float(np.mean(np.abs(rel))) if len(p) else None, "spearman": spearman(p, m),
            "rows": [{"label": lab, "measured_s": float(x), "predicted_s": float(y), "rel_error": float(e)}
                     for lab, x, y, e in zip(labels, m, p, rel)]}


def with_efficiency(cluster: Cluster, values: dict) -> Cluster:
    return replace(cluster, efficiency={**cluster.efficiency, **values})


def check_fit_keys(keys: tuple[str, ...]) -> None:
    """Refuse a key ``fit`` cannot fit (``--fit-keys``)."""
    fittable = (*CLUSTER_KEYS, "gemm_bf16")
    unknown = [k for k in keys if k not in fittable]
    if unknown:
        raise ConfigError("calibration", unknown[0], f"not a fittable efficiency key; known: {', '.join(fittable)}")


def fit(observations: list[Observation], cluster: Cluster, keys: tuple[str, ...] = FIT_KEYS,
        iterations: int = 300) -> dict:
    """Fit ``keys`` (cluster efficiency keys) to the observations. Returns the fitted values,
    the constants before and after, and the error summaries before and after."""
    if not observations:
        raise ConfigError("calibration", None, "no validation runs to fit; run dayzero validate first")
    check_fit_keys(keys)
    keys = tuple(keys[:len(observations)])
    measured = np.array([o.step_time_s for o in observations])
    labels = [o.label for o in observations]
    consts = constants_for(compute_view(cluster, observations[0].compute_dtype)).to_dict()
    r = rates(cluster, constants_for(cluster))

    def current(k: str) -> float:
        if k in cluster.efficiency:
            return float(cluster.efficiency[k])
        if k == "gemm_bf16":
            return float(r.gemm_eff["bf16"])
        return float(consts[CLUSTER_KEYS[k]]) if consts[CLUSTER_KEYS[k]] is not None else 1.0

    start = {k: current(k) for k in keys}
    before = errors(predict_steps(observations, cluster), measured, labels)

    def loss(x) -> float:
        vals = {k: float(np.exp(v)) for k, v in zip(keys, x)}
        if vals.get("intra", 1.0) > MEASURED_FRACTION_MAX or vals.get("gemm_bf16", 1.0) > MEASURED_FRACTION_MAX:
            return 1e9  # 4x faster than its own microbenchmark is not physical
        pred = predict_steps(observations, with_efficiency(cluster, vals))
        return float(np.mean(np.log(pred / measured) ** 2))

    x, _ = nelder_mead(loss, np.log([start[k] for k in keys]), iterations, step=0.3)
    fitted = {k: float(np.exp(v)) for k, v in zip(keys, x)}
    after = errors(predict_steps(observations, with_efficiency(cluster, fitted)), measured, labels)
    return {"keys": list(keys), "runs": len(observations), "fitted": fitted, "constants_before": start,
            "constants_after": fitted, "before": before, "after": after}


def fit_memory(records: list[dict], cluster: Cluster) -> dict | None:
    """The runtime context (bytes a rank holds beyond its tensors: interpreter, libraries,
    allocator caches) that makes the predicted peaks match the measured ones: the median
    difference, added to the profile's value. None when no record has a memory measurement."""
    from dayzero.validate.predicted import predict_run

    rows = []
    for rec in records:
        if not rec.get("peak_memory_bytes"):
            continue
        o = observation_from_record(rec)
        pred = predict_run(o.spec, o.parallel, cluster, o.compute_dtype,
                           device=rec.get("device"))["memory"]["peak_bytes"]
        rows.append((rec.get("label"), float(rec["peak_memory_bytes"]), float(pred)))
    if not rows:
        return None
    from dayzero.planner.memory.memory_options import MemoryOptions

    current = MemoryOptions.for_accelerator(cluster.accelerator).runtime_context_bytes
    offset = float(np.median([m - p for _, m, p in rows]))
    new = max(0.0, current + offset)
    applied = new - current
    labels = [r[0] for r in rows]
    measured = [r[1] for r in rows]
    return {"runtime_context_bytes_before": int(current), "runtime_context_bytes_after": int(new),
            "before": errors([r[2] for r in rows], measured, labels),
            "after": errors([r[2] + applied for r in rows], measured, labels)}
