"""``dayzero moe loads``: what a run's expert-load telemetry says, per MoE layer, and its heat map.

Per layer, over the steps that carry a ``moe`` summary: the expert max/mean (tokens of the busiest
expert over the mean), the coefficient of variation, the dropped share of routed slots and the EP
rank max/mean (the overloaded card: it sets the pace of the all-to-all and the expert GEMMs; see
research/moe_and_ops.md section 1.1) as mean, worst and last value. From the full ``expert_loads``
snapshots summed: the hottest experts and their share of the layer's tokens. The heat map is layer x
expert load (over the layer's mean, summed over the snapshots) beside the rank max/mean per step.
"""

from __future__ import annotations

import math
from pathlib import Path

from dayzero.specs.expert_loads import MoeTelemetry

METRICS = ("max_mean", "cv", "dropped", "rank_max_mean")


def _stats(values: list[float]) -> dict:
    vals = [v for v in values if math.isfinite(v)]
    if not vals:
        return {"mean": None, "worst": None, "last": None}
    return {"mean": sum(vals) / len(vals), "worst": max(vals), "last": vals[-1]}


def _summed(tel: MoeTelemetry) -> dict[int, list[float]]:
    """Global layer index -> tokens per expert summed over every expert_loads snapshot."""
    out: dict[int, list[float]] = {}
    for _, snap in tel.snapshots:
        for layer, row in zip(snap.layers, snap.matrix):
            acc = out.setdefault(layer, [0.0] * len(row))
            for e, v in enumerate(row):
                acc[e] += v
    return out


def loads_report(tel: MoeTelemetry, hottest: int = 3) -> dict:
    """The ``dayzero moe loads --json`` object (see the module docstring)."""
    series: dict[int, dict[str, list[float]]] = {}
    for s in tel.steps:
        for i, layer in enumerate(s.layers):
            row = series.setdefault(layer, {m: [] for m in METRICS})
            for m in METRICS:
                row[m].append(getattr(s, m)[i])
    summed = _summed(tel)
    layers = []
    for layer in sorted(set(series) | set(summed)):
        entry: dict = {"layer": layer, "steps": len(series.get(layer, {}).get("max_mean", []))}
        entry.update({m: _stats(series[layer][m]) if layer in series else _stats([]) for m in METRICS})
        loads = summed.get(layer)
        if loads:
            total = sum(loads)
            mean = total / len(loads)
            order = sorted(range(len(loads)), key=lambda e: (-loads[e], e))[:hottest]
            entry["snapshot_max_mean"] = max(loads) / mean if mean else 1.0
            entry["hottest"] = [{"expert": e, "tokens": loads[e], "share": loads[e] / total if total else 0.0}
                                for e in order]
        layers.append(entry)
    worst = [x["rank_max_mean"]["worst"] for x in layers if x["rank_max_mean"]["worst"] is not None]
    return {"source": tel.source, "steps": len(tel.steps), "snapshots": [step for step, _ in tel.snapshots],
            "experts": tel.snapshots[0][1].experts if tel.snapshots else None, "layers": layers,
            "rank_max_mean_worst": max(worst) if worst else None}


def write_heatmap(tel: MoeTelemetry, path: str | Path) -> str | None:
    """Write the heat map PNG; the reason it was skipped (no matplotlib, no snapshots), else None."""
    try:
        import matplotlib
    except ImportError:
        return "matplotlib is not installed (pip install matplotlib)"
    summed = _summed(tel)
    if not summed:
        return "the run has no expert_loads snapshots (train with --moe-loads-every N)"
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    layers = sorted(summed)
    grid = [[v / (sum(summed[i]) / len(summed[i])) if sum(summed[i]) else 0.0 for v in summed[i]] for i in layers]
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(12, 1.5 + 0.35 * len(layers)), width_ratios=[3, 2])
    im = ax.imshow(grid, aspect="auto", cmap="magma", interpolation="nearest")
    ax.set_yticks(range(len(layers)), [str(i) for i in layers])
    ax.set_xlabel("expert")
    ax.set_ylabel("layer")
    ax.set_title(f"tokens / layer mean, {len(tel.snapshots)} snapshot(s)")
    fig.colorbar(im, ax=ax)
    for i, layer in enumerate(tel.steps[0].layers if tel.steps else []):
        bx.plot([s.step for s in tel.steps], [s.rank_max_mean[i] for s in tel.steps], label=f"layer {layer}", lw=1)
    bx.set_xlabel("step")
    bx.set_ylabel("EP rank max / mean")
    if tel.steps:
        bx.legend(fontsize=7)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None
