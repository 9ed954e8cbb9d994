"""Measured expert loads: tokens routed to each expert of each MoE layer, read from a run's metrics
JSONL or from a layer x expert JSON matrix.

The runtime's metrics stream (``dayzero train``) carries, per step of an MoE run::

    "moe": {"layers": [global layer index of each MoE layer], "max_mean": [...], "cv": [...],
            "dropped": [...], "rank_max_mean": [...]}

and, every ``--moe-loads-every`` steps and on the last step, ``"expert_loads": [[tokens per expert]
per MoE layer]`` (layer-major, in the order of ``moe.layers``). Records without these keys (dense
models, events) are skipped. A step redone after a resume appears twice; the later record counts,
as in the runtime's own reader. A JSON matrix is a list of rows (row i is MoE layer i) or
``{"layers": {"<global layer index>": [loads], ...}}``. Pure Python; no torch.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dayzero.errors import ConfigError
from dayzero.inputs import parse_json, read_text

MAX_LOAD = 2.0**53  # float64's largest run of exact integers (IEEE 754 binary64: 53-bit significand)
HINT = "pass a run's metrics.jsonl (with expert_loads records) or a layer x expert JSON matrix"


class LoadsError(ConfigError):
    """An expert-loads input is malformed (ragged, negative, or without any expert loads)."""


@dataclass(frozen=True)
class MoeStep:
    """The per-layer load summary of one training step."""

    step: int
    layers: tuple[int, ...]
    max_mean: tuple[float, ...]
    cv: tuple[float, ...]
    dropped: tuple[float, ...]
    rank_max_mean: tuple[float, ...]


@dataclass(frozen=True)
class ExpertLoads:
    """Tokens per expert: ``matrix[i][e]`` for global MoE layer ``layers[i]``, summed over
    ``snapshots`` expert_loads records (1 for a JSON matrix)."""

    layers: tuple[int, ...]
    matrix: tuple[tuple[float, ...], ...]
    source: str
    snapshots: int = 1

    @property
    def experts(self) -> int:
        return len(self.matrix[0])


@dataclass(frozen=True)
class MoeTelemetry:
    """What a metrics file says about expert loads: per-step summaries and full snapshots."""

    steps: tuple[MoeStep, ...]
    snapshots: tuple[tuple[int, ExpertLoads], ...]  # (step, loads of that step)
    source: str


def _row(values: Any, source: str, where: str, experts: int | None) -> tuple[float, ...]:
    if not isinstance(values, list) or not values:
        raise LoadsError(source, where, "expected a non-empty list of per-expert token counts")
    out = []
    for e, v in enumerate(values):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise LoadsError(source, where, f"expert {e} has load {v!r}; loads are finite numbers")
        if v < 0:
            raise LoadsError(source, where, f"expert {e} has negative load {v}; loads count routed tokens")
        if v > MAX_LOAD:
            raise LoadsError(source, where, f"expert {e} has load {v:g}; a token count is at most 2^53 (beyond it "
                             "float64 cannot count tokens one by one, and sums over experts overflow)")
        out.append(float(v))
    if experts is not None and len(out) != experts:
        raise LoadsError(source, where, f"has {len(out)} experts but the first row has {experts}; "
                         "every layer needs the same expert count (a ragged matrix)")
    return tuple(out)


def _matrix(rows: list, source: str, where: str) -> tuple[tuple[float, ...], ...]:
    if not isinstance(rows, list) or not rows:
        raise LoadsError(source, where, "expected a non-empty list of layer rows")
    first = _row(rows[0], source, f"{where}[0]", None)
    return (first,) + tuple(_row(r, source, f"{where}[{i}]", len(first)) for i, r in enumerate(rows[1:], 1))


def loads_from_json(obj: Any, source: str) -> ExpertLoads:
    """A JSON matrix: a list of rows (MoE layers 0..L-1) or {"layers": {"<index>": row}}."""
    if isinstance(obj, dict) and isinstance(obj.get("layers"), dict):
        keys = list(obj["layers"])
        if not keys or not all(str(k).isdigit() for k in keys):
            raise LoadsError(source, "layers", "must map global layer indices (non-negative integers) to rows")
        keys.sort(key=int)
        return ExpertLoads(tuple(int(k) for k in keys), _matrix([obj["layers"][k] for k in keys], source, "layers"),
                           source)
    if isinstance(obj, list):
        m = _matrix(obj, source, "rows")
        return ExpertLoads(tuple(range(len(m))), m, source)
    raise LoadsError(source, None, f"is neither a layer x expert matrix nor a metrics record; {HINT}")


def _records(text: str, source: str) -> list[dict]:
    """Step records (the later one of a redone step), in step order."""
    by_step: dict[int, dict] = {}
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except (ValueError, RecursionError):
            raise LoadsError(source, None, f"line {n} is not JSON; {HINT}") from None
        step = obj.get("step") if isinstance(obj, dict) else None
        if isinstance(step, int) and not isinstance(step, bool) and "event" not in obj:
            by_step[step] = obj
    return [by_step[s] for s in sorted(by_step)]


def _summary(rec: dict, source: str) -> MoeStep | None:
    moe = rec.get("moe")
    if not isinstance(moe, dict):
        return None
    where = f"step {rec['step']} moe"
    layers = moe.get("layers")
    if not isinstance(layers, list) or not all(isinstance(x, int) and not isinstance(x, bool) for x in layers):
        raise LoadsError(source, where, "'layers' must be a list of global layer indices")
    cols = []
    for key in ("max_mean", "cv", "dropped", "rank_max_mean"):
        vals = moe.get(key, [])
        if not isinstance(vals, list) or len(vals) != len(layers):
            raise LoadsError(source, where, f"'{key}' must hold one number per MoE layer ({len(layers)})")
        cols.append(tuple(float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else math.nan
                          for v in vals))
    return MoeStep(rec["step"], tuple(layers), *cols)


def telemetry_from_text(text: str, source: str) -> MoeTelemetry:
    steps, snaps, layers = [], [], None
    for rec in _records(text, source):
        summary = _summary(rec, source)
        if summary is not None:
            steps.append(summary)
            layers = summary.layers
        if "expert_loads" in rec:
            m = _matrix(rec["expert_loads"], source, f"step {rec['step']} expert_loads")
            idx = layers if layers is not None else tuple(range(len(m)))
            if len(idx) != len(m):
                raise LoadsError(source, f"step {rec['step']} expert_loads",
                                 f"has {len(m)} layer rows but moe.layers names {len(idx)} layers")
            if snaps and (snaps[0][1].layers, snaps[0][1].experts) != (idx, len(m[0])):
                raise LoadsError(source, f"step {rec['step']} expert_loads",
                                 f"layers {list(idx)} x {len(m[0])} experts differ from step {snaps[0][0]}'s "
                                 f"{list(snaps[0][1].layers)} x {snaps[0][1].experts}")
            snaps.append((rec["step"], ExpertLoads(idx, m, source)))
    return MoeTelemetry(tuple(steps), tuple(snaps), source)


def _parse(path: str | Path) -> tuple[Any, str, str]:
    """(parsed JSON document, or None for a metrics JSONL; text; source) of a loads file. A
    metrics JSONL is recognised by its first line: one record with a ``step``."""
    source = str(path)
    text = read_text(path, HINT)
    first = next((line for line in text.splitlines() if line.strip()), "")
    try:
        head = json.loads(first)
    except (ValueError, RecursionError):
        head = None
    if isinstance(head, dict) and ("step" in head or "event" in head):
        return None, text, source
    return parse_json(text, source), text, source


def read_telemetry(path: str | Path) -> MoeTelemetry:
    """The MoE records of a metrics JSONL; a file with none of them is one LoadsError."""
    obj, text, source = _parse(path)
    if obj is not None:
        raise LoadsError(source, None, "is a JSON document, not a metrics JSONL; pass a run's metrics.jsonl")
    tel = telemetry_from_text(text, source)
    if not tel.steps and not tel.snapshots:
        raise LoadsError(source, None, "has no MoE records (no 'moe' or 'expert_loads' keys); "
                         "is this a dense model's run, or a run from before expert-load telemetry?")
    return tel


def read_expert_loads(path: str | Path) -> ExpertLoads:
    """Loads per layer and expert: a JSON matrix as it is, or a metrics JSONL's expert_loads
    records summed."""
    obj, text, source = _parse(path)
    if obj is not None:
        return loads_from_json(obj, source)
    snaps = telemetry_from_text(text, source).snapshots
    if not snaps:
        raise LoadsError(source, None, "has no expert_loads records; train with --moe-loads-every N "
                         "or pass a layer x expert JSON matrix")
    first = snaps[0][1]
    total = [[sum(s.matrix[i][e] for _, s in snaps) for e in range(first.experts)] for i in range(len(first.layers))]
    return ExpertLoads(first.layers, tuple(tuple(r) for r in total), source, len(snaps))
