"""The MoE routing imbalance the step-time model uses: a constant, or measured from expert loads.

The step-time model multiplies the routed-expert GEMMs and the EP all-to-all of the busiest rank
by one factor, ``max_j g_j / mean_j g_j`` (``g_j``: the tokens EP rank j computes; see
:mod:`dayzero.planner.perf.eplb`). Measured, it comes from a run's expert loads (``--expert-loads``)
under a placement (``--placement``; default: the contiguous one, expert e on rank e // (E / ep)),
per EP size, since the same loads spread differently over 4 ranks than over 64.

Per layer the factor is max/mean rank load; the model applies **the mean over the measured layers**:
MoE layers run one after another, each at the pace of its own busiest rank, so with equal work per
layer the step's expert time is the mean of the per-layer factors times the balanced time (the
worst layer would charge every layer for one layer's hot spot). The worst layer is reported next to
it. A placement without loads assumes uniform expert loads (what replicas alone do to balance).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dayzero.errors import ConfigError
from dayzero.planner.perf.eplb import rank_imbalance
from dayzero.specs.expert_loads import ExpertLoads
from dayzero.specs.placement import Placement, contiguous_slots


@dataclass(frozen=True)
class EpImbalance:
    ep: int
    mean: float  # the factor used: mean over layers of max/mean rank load
    worst: float
    per_layer: tuple[tuple[int, float], ...]  # (global layer index, max/mean rank load)


@dataclass(frozen=True)
class MeasuredImbalance:
    by_ep: tuple[EpImbalance, ...]
    loads: str  # the loads file, or "uniform (assumed)"
    placement: str  # the placement file, or "contiguous (default)"
    snapshots: int  # expert_loads records summed (0 for assumed uniform loads)

    def at(self, ep: int) -> EpImbalance:
        for x in self.by_ep:
            if x.ep == ep:
                return x
        have = ", ".join(str(x.ep) for x in self.by_ep)
        raise ConfigError("--placement" if self.placement != "contiguous (default)" else "--expert-loads", None,
                          f"the measured imbalance is for ep {have}, not ep {ep}; use --ep {have}")

    def values(self, ep) -> np.ndarray:
        """The factor per candidate, for an array of EP sizes."""
        ep = np.asarray(ep)
        return np.array([self.at(int(e)).mean for e in np.ravel(ep)], dtype=float).reshape(ep.shape)

    def describe(self, ep: int) -> dict:
        x = self.at(ep)
        return {"value": x.mean, "from": "measured", "aggregate": "mean over layers", "worst_layer": x.worst,
                "per_layer": {str(layer): v for layer, v in x.per_layer}, "loads": self.loads,
                "placement": self.placement, "snapshots": self.snapshots}


def constant_imbalance(value: float) -> dict:
    """How a prediction describes the constant factor of ``--moe-imbalance``."""
    return {"value": value, "from": "constant", "flag": "--moe-imbalance"}


def derived_imbalance(value: float, expert_cv: float, experts: int, ep: int) -> dict:
    """How a prediction describes the factor derived from a per-expert load CV
    (:func:`dayzero.planner.perf.moe_dispatch.device_imbalance`)."""
    return {"value": value, "from": "per-expert load CV", "expert_cv": expert_cv,
            "experts_per_device": experts / max(ep, 1), "rule": "1 + z_ep * cv / sqrt(experts per device)"}


def measured_imbalance(experts: int, loads: ExpertLoads | None = None, placement: Placement | None = None,
                       placement_source: str | None = None, eps: tuple[int, ...] | None = None) -> MeasuredImbalance:
    """The factor per EP size (``eps``; default: the placement's ep, else every divisor of
    ``experts``) from ``loads`` under ``placement`` (default contiguous), checked against the
    model's routed-expert count."""
    if loads is not None and loads.experts != experts:
        raise ConfigError(loads.source, None, f"has loads for {loads.experts} experts but the model has {experts} "
                          "routed experts; measure on a run of this model (or its proxy with the same expert count)")
    if placement is not None and placement.experts != experts:
        raise ConfigError(placement_source or "--placement", "experts", f"is {placement.experts} but the model has "
                          f"{experts} routed experts")
    if placement is not None:
        eps = (placement.ep,)
    elif eps is None:
        eps = tuple(d for d in range(1, experts + 1) if experts % d == 0)
    if loads is not None:
        rows = list(zip(loads.layers, (np.array(r) for r in loads.matrix)))
    else:
        layers = placement.layer_indices if placement is not None and placement.layer_indices else (0,)
        rows = [(layer, np.ones(experts)) for layer in layers]
    out = []
    for ep in eps:
        vals = []
        for layer, w in rows:
            slots = placement.slots(layer) if placement is not None else contiguous_slots(experts, ep)
            vals.append((int(layer), rank_imbalance(w, slots)))
        factors = [v for _, v in vals]
        out.append(EpImbalance(int(ep), float(np.mean(factors)), float(max(factors)), tuple(vals)))
    where = "contiguous (default)" if placement is None else (placement_source or "placement")
    return MeasuredImbalance(tuple(out), loads.source if loads is not None else "uniform (assumed)", where,
                             loads.snapshots if loads is not None else 0)
