"""How the best plan moves when the inputs the predictions are least sure of move.

The perturbations and their sizes are the ones the project's issue 16 ("What the plan output must
say") asks for, not published figures: scale-out (inter-node) bandwidth -30 % / +30 %, GEMM
efficiency -10 % / +10 %, MoE routing imbalance 1.2 (busiest device's routed tokens over the
average; MoE models only), and gradient traffic in the other dtype (BF16 when the run reduces in
FP32, FP32 when it reduces in BF16). Each goes through the objects
the step-time model already reads: a copy of the cluster with every scale-out tier's bandwidth
scaled, ``PerfConstants.gemm_eff_scale``, ``CommOptions.moe_imbalance`` and
``CommOptions.grad_reduce_bytes``. None of them changes peak memory (gradient buffers stay as the
memory model has them; only the bytes on the wire change), so the layouts that fit are the same,
and the search is re-run cheaply by re-timing the baseline search's ``pool`` fastest fitting
layouts under each perturbation, one vectorised call each.

``covered`` says whether that re-ranking provably equals a full re-search: a perturbation speeds
no layout up by more than its ``max_speedup`` (bandwidth +30 %: 1.3, GEMM +10 %: 1.1, BF16
gradients: 2, the slowing ones: 1), so a layout outside the pool, at least as slow as the pool's
slowest (``pool_slowest_s``) in the baseline, is at least ``pool_slowest_s / max_speedup`` under
the perturbation; when the perturbed best is faster than that, nothing outside the pool can win.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from dayzero.planner.perf.calibration import constants_for
from dayzero.planner.perf.comm import CommOptions
from dayzero.planner.perf.perf import PerfOptions, evaluate
from dayzero.specs.cluster import Cluster
from dayzero.specs.grid import decode
from dayzero.specs.model import ModelSpec

BANDWIDTH = 0.30  # +-30 % scale-out bandwidth
GEMM = 0.10  # +-10 % GEMM efficiency
IMBALANCE = 1.2  # busiest device's routed tokens / average
POOL = 400  # fastest fitting layouts of the baseline search re-timed under each perturbation


@dataclass(frozen=True)
class Perturbation:
    """One changed input: the cluster and options to time with, and the most it can speed a layout up."""

    name: str
    cluster: Cluster
    options: PerfOptions
    max_speedup: float


def scale_out_scaled(cluster: Cluster, factor: float) -> Cluster:
    """A copy of ``cluster`` with every tier beyond the first (scale-out) ``factor`` x as fast."""
    tiers = tuple(t if i == 0 else replace(t, bw=t.bw * factor, p2p_bw=t.p2p_bw * factor)
                  for i, t in enumerate(cluster.tiers))
    return replace(cluster, tiers=tiers)


def perturbations(spec: ModelSpec, cluster: Cluster, options: PerfOptions) -> list[Perturbation]:
    """The perturbations of one run, in the order the table shows them."""
    consts = options.constants or constants_for(cluster)

    def gemm(f: float) -> PerfOptions:
        return replace(options, constants=replace(consts, gemm_eff_scale=consts.gemm_eff_scale * f))

    def comm(**kw) -> PerfOptions:
        return replace(options, comm=replace(options.comm, **kw))

    out = [Perturbation(f"scale-out bandwidth -{BANDWIDTH:.0%}", scale_out_scaled(cluster, 1 - BANDWIDTH), options,
                        1.0),
           Perturbation(f"scale-out bandwidth +{BANDWIDTH:.0%}", scale_out_scaled(cluster, 1 + BANDWIDTH), options,
                        1 + BANDWIDTH),
           Perturbation(f"GEMM efficiency -{GEMM:.0%}", cluster, gemm(1 - GEMM), 1.0),
           Perturbation(f"GEMM efficiency +{GEMM:.0%}", cluster, gemm(1 + GEMM), 1 + GEMM)]
    if spec.is_moe:
        fixed = comm(moe_imbalance=IMBALANCE, moe_measured=None, moe_expert_cv=0.0)  # the constant, nothing else
        out.append(Perturbation(f"MoE imbalance {IMBALANCE}", cluster, fixed, 1.0))
    fp32 = options.comm.grad_reduce_bytes >= 4
    out.append(Perturbation("gradients in BF16" if fp32 else "gradients in FP32", cluster,
                            comm(grad_reduce_bytes=2 if fp32 else 4), 2.0 if fp32 else 1.0))
    return out


def grad_dtype(comm: CommOptions) -> str:
    return "fp32" if comm.grad_reduce_bytes >= 4 else "bf16"


def sensitivity(spec: ModelSpec, cluster: Cluster, options: PerfOptions, pool: dict, best: int = 0) -> dict:
    """The sensitivity table of a search: ``pool`` is the grid of the baseline search's fastest
    fitting layouts (best first; ``best`` the index of the plan shown as best). Returns the
    baseline row and one row per perturbation: its best layout, step time, MFU, MFU change
    against the baseline plan, whether the best plan changes (its layout differs from the
    baseline's) and whether the re-ranking is provably the full search's (``covered``)."""
    n = len(pool["tp"])
    base = evaluate(spec, pool, cluster, options)
    layouts = decode(pool)
    base_layout = layouts[best]
    slowest = float(np.max(base.step_s))
    rows = []
    for p in perturbations(spec, cluster, options):
        ev = evaluate(spec, pool, p.cluster, p.options)
        i = int(np.argmin(ev.step_s))
        same = evaluate(spec, {k: v[best:best + 1] for k, v in pool.items()}, p.cluster, p.options)
        rows.append({"perturbation": p.name, "layout": layouts[i].describe(), "parallel": layouts[i].to_dict(),
                     "step_s": float(ev.step_s[i]), "mfu": float(ev.mfu[i]),
                     "mfu_change": float(ev.mfu[i] - base.mfu[best]),
                     "baseline_plan_mfu": float(same.mfu[0]),
                     "best_plan_changes": layouts[i] != base_layout,
                     "covered": bool(n < POOL or ev.step_s[i] <= slowest / p.max_speedup)})
    return {"baseline": {"layout": base_layout.describe(), "parallel": base_layout.to_dict(),
                         "step_s": float(base.step_s[best]), "mfu": float(base.mfu[best]),
                         "grad_reduce": grad_dtype(options.comm)},
            "pool": n, "pool_slowest_s": slowest, "rows": rows,
            "method": "the baseline search's fastest fitting layouts re-timed under each perturbation "
                      "(memory is unchanged by every perturbation, so the fitting set is the same)"}
