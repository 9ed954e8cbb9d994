"""The best plan of one model on several clusters, side by side: what a different card changes.

:func:`compare` plans the model on each cluster (:func:`dayzero.planner.search.search.plan`, its best
layout with :func:`~dayzero.planner.training_cost.cost_of_prediction`) and returns one row per
cluster: the card (HBM capacity and bandwidth, scale-up and scale-out bandwidth and topology,
TDP), the plan (layout, step time, MFU) and training (wall days, MWh, TFLOP/s per W, cost). A
cluster where no layout fits gets a row with ``fits: false`` and the reason, not an error.
"""

from __future__ import annotations

from dayzero.errors import FitError, LayoutError
from dayzero.planner.perf.perf import PerfOptions
from dayzero.planner.targets import MEMORY_TARGET
from dayzero.planner.training_cost import CostOptions, cost_of_prediction
from dayzero.specs.cluster import Cluster
from dayzero.specs.hardware import HBM_GB
from dayzero.specs.model import ModelSpec


def card(cluster: Cluster) -> dict:
    a = cluster.accelerator
    up, out = cluster.tiers[0], cluster.tiers[-1]
    return {"cluster": cluster.name, "accelerator": a.id, "name": a.name, "devices": cluster.devices,
            "hbm_gib": a.hbm_bytes / HBM_GB, "hbm_tbytes_per_s": None if a.hbm_bw is None else a.hbm_bw / 1e12,
            "scaleup_gbytes_per_s": up.bw / 1e9, "scaleup_size": up.size, "scaleup_topology": up.topology,
            "scaleout_gbytes_per_s": out.bw / 1e9 if len(cluster.tiers) > 1 else None, "tdp_w": a.tdp_w,
            "peak_tflops_bf16": a.peak("bf16") / 1e12}


def compare(spec: ModelSpec, clusters: list[Cluster], gbs: int, seq: int, precision: str = "bf16",
            cost: CostOptions = CostOptions(), perf_for=lambda cluster: PerfOptions(),
            max_memory: float = MEMORY_TARGET) -> dict:
    """One row per cluster, in the order given; ``perf_for(cluster)`` gives its PerfOptions."""
    from dayzero.planner.search.search import plan

    rows = []
    for cl in clusters:
        row = card(cl)
        try:
            obj = plan(spec, cl, gbs, seq, precision, perf_for(cl), 1, max_memory)
        except (FitError, LayoutError) as e:  # nothing fits, or no layout of it passes the rules
            rows.append({**row, "fits": False, "reason": str(e)})
            continue
        best = obj["plans"][0]
        tr = cost_of_prediction(best, cl, cost)
        e = tr["energy"]
        rows.append({**row, "fits": True, "parallel": best["parallel"], "step_s": best["time"]["step_s"],
                     "mfu": best["throughput"]["mfu"], "comm_ratio": best["comm_ratio"],
                     "memory_utilization": best["memory"]["utilization"], "wall_days": tr["wall_days"],
                     "device_hours": tr["device_hours"], "mwh": e["mwh"] if e else None,
                     "model_tflops_per_w": e["model_tflops_per_w"] if e else None,
                     "tokens_per_joule": e["tokens_per_joule"]["facility"] if e else None,
                     "cost": tr["cost"]["total"] if tr["cost"] else None,
                     "cost_source": tr["cost"].get("price_source") if tr["cost"] else None,
                     **{k: (tr["cost"] or {}).get(k) for k in ("price_offer", "price_kind", "price_per_device_hour")},
                     "training": tr})
    return {"model": spec.name, "gbs": gbs, "seq": seq, "precision": precision, "tokens": cost.tokens, "rows": rows}


def mixed_prices(rows: list[dict]) -> str | None:
    """A sentence when the costs compared rest on prices of different kinds (a rental rate beside an
    amortized purchase, which leaves out energy, facility and operations), else None."""
    kinds: dict[str, list[str]] = {}
    for r in rows:
        if r.get("fits") and r.get("price_kind"):
            kinds.setdefault(r["price_kind"], []).append(r["cluster"])
    if len(kinds) < 2:
        return None
    parts = "; ".join(f"{k}: {', '.join(v)}" for k, v in sorted(kinds.items()))
    return (f"the costs rest on prices of different kinds ({parts}): a purchase amortized leaves out energy, facility "
            "and operations that a rental rate includes; give --price-per-device-hour to compare like for like")


# --rank-by: the row's figure and whether larger is better
RANK_BY = {"days": ("wall_days", False), "mwh": ("mwh", False), "cost": ("cost", False),
           "tokens-per-joule": ("tokens_per_joule", True)}


def ranked(rows: list[dict], by: str) -> list[int]:
    """Indices of ``rows`` best first by ``by`` (a key of :data:`RANK_BY`); rows that do not fit or
    lack the figure (no TDP, no price) last, in their given order."""
    key, larger = RANK_BY[by]
    have = [i for i, r in enumerate(rows) if r["fits"] and r.get(key) is not None]
    have.sort(key=lambda i: -rows[i][key] if larger else rows[i][key])
    return have + [i for i in range(len(rows)) if i not in have]
