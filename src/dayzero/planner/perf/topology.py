"""Rank layout and process groups on the real topology.

Ranks are laid out Megatron-style by a dim-order string, fastest-varying dim first; the default
``tp-cp-dp-pp`` puts tensor parallelism innermost (inside a node) and pipeline outermost. Experts
use their own order over the same ranks of a pipeline stage, ``etp-ep-edp-pp`` (Megatron-Core's
separate expert layout), so expert parallelism borrows ranks from dp x cp (x tp when etp < tp).

Worked example (16 ranks on two 8-device nodes, tp2 cp1 dp4 pp2, ep4 etp1)::

    rank  =  tp + 2*(cp + 1*(dp + 4*pp))       tp group of rank 0: [0, 1]
    dp group of rank 0: [0, 2, 4, 6]           pp group of rank 0: [0, 8]   (crosses nodes)
    ep group of rank 0: [0, 1, 2, 3]           edp group of rank 0: [0, 4]

A group whose members sit ``stride`` ranks apart spans ``per_domain`` members inside each
scale-up domain (a node, an NVL72 rack) and ``domains`` domains; it is a scale-up group when
``domains == 1`` and a hierarchical (scale-up + scale-out) group when both exceed 1.

Every function here takes numpy arrays or Python ints, so the search evaluates thousands of
layouts in one call. The rank order is part of the layout (``ParallelConfig.rank_order``, the
grid's ``rank_order`` column); which orders are allowed is a rule of
:mod:`dayzero.specs.layout_rules` (cp and dp adjacent, since gradients are reduced over dp x cp),
so the functions here expect valid layouts.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dayzero.specs.cluster import Cluster
from dayzero.specs.grid import RANK_ORDERS, columns
from dayzero.specs.parallel import DENSE_DIMS, DENSE_ORDER, expert_data_parallel, parse_order

__all__ = ["DENSE_DIMS", "DENSE_ORDER", "EXPERT_ORDER", "Group", "group_ranks", "group_strides", "parse_order",
           "process_groups", "scaleup_domain", "span", "strides"]

EXPERT_ORDER = "etp-ep-edp-pp"
# ORDER_POSITIONS[code, i]: where dense dim DENSE_DIMS[i] sits in rank order RANK_ORDERS[code], fastest = 0
ORDER_POSITIONS = np.array([[o.split("-").index(d) for d in DENSE_DIMS] for o in RANK_ORDERS])


def strides(order: tuple[str, ...], sizes: dict) -> dict:
    """Distance in ranks between neighbours of each dim: the product of the sizes of the dims
    before it in ``order``."""
    out, s = {}, 1
    for d in order:
        out[d] = s
        s = s * sizes[d]
    return out


def scaleup_domain(cluster: Cluster) -> int:
    """Devices of one scale-up domain a job actually fills: the largest whole number of nodes,
    at most the fabric's size, that divides the job's device count. An NVL72 rack holds 18
    4-GPU trays, but a 256-GPU job places 64 ranks per rack (16 trays), so its groups of 64 stay
    inside one NVLink domain."""
    size = cluster.tiers[0].size
    dpn = cluster.devices_per_node
    best = dpn
    for d in range(dpn, min(size, cluster.devices) + 1, dpn):
        if cluster.devices % d == 0:
            best = d
    return best


def span(size, stride, domain: int):
    """(per_domain, domains) of a group of ``size`` members ``stride`` ranks apart on a cluster
    whose scale-up domains hold ``domain`` consecutive ranks."""
    size = np.asarray(size)
    stride = np.asarray(stride)
    fit = np.maximum(1, domain // np.maximum(stride, 1))
    per = np.where(stride >= domain, 1, np.minimum(size, fit))
    return per, -(-size // per)


@dataclass(frozen=True)
class Group:
    """One process group of a layout, as the planner sees it."""

    dim: str
    size: int
    stride: int
    per_domain: int  # members inside one scale-up domain
    domains: int  # scale-up domains the group spans

    @property
    def tiers(self) -> tuple[str, ...]:
        """The interconnect tiers this group's traffic crosses."""
        if self.size <= 1:
            return ()
        if self.domains <= 1:
            return ("scale-up",)
        return ("scale-up", "scale-out") if self.per_domain > 1 else ("scale-out",)

    @property
    def tier(self) -> str:
        """The slowest tier crossed ("" for a group of one)."""
        t = self.tiers
        return t[-1] if t else ""

    def to_dict(self) -> dict:
        return {"dim": self.dim, "size": self.size, "stride": self.stride, "per_domain": self.per_domain,
                "domains": self.domains, "tiers": list(self.tiers)}


def group_strides(c: dict) -> dict:
    """Stride and size of every group the planner uses, from a grid (arrays) or one layout's
    columns (ints): tp, cp, dp, pp, ep, etp and the rank order's code.

    A dense dim's stride is the product of the sizes of the dims before it in its row's order.
    ``dp_cp`` is the gradient group (dense grads are reduced over dp x cp, as in Megatron);
    ``ep``/``etp``/``edp`` follow the expert order within a stage (stride of etp is 1)."""
    tp, cp, dp, pp, ep, etp = (c[k] for k in ("tp", "cp", "dp", "pp", "ep", "etp"))
    sizes = {"tp": tp, "cp": cp, "dp": dp, "pp": pp}
    pos = ORDER_POSITIONS[np.asarray(c["rank_order"])]  # (..., 4)
    st = {}
    for i, d in enumerate(DENSE_DIMS):
        s = 1
        for j, e in enumerate(DENSE_DIMS):
            if j != i:
                s = s * np.where(pos[..., j] < pos[..., i], sizes[e], 1)
        st[d] = s
    return {
        "tp": (tp, st["tp"]), "cp": (cp, st["cp"]), "dp": (dp, st["dp"]), "pp": (pp, st["pp"]),
        "dp_cp": (np.asarray(dp) * cp, np.minimum(st["dp"], st["cp"])),
        "etp": (etp, 1), "ep": (ep, etp), "edp": (expert_data_parallel(tp, cp, dp, ep, etp), np.asarray(ep) * etp),
    }


def _with_order(parallel, order: str | None):
    """``parallel`` with ``order`` as its rank order (checked), or as it is."""
    return parallel if order is None else parallel.with_(rank_order="-".join(parse_order(order)))


def process_groups(parallel, cluster: Cluster, order: str | None = None) -> dict[str, Group]:
    """Every process group of one layout, with the tiers it spans (``order`` overrides the
    layout's rank order)."""
    p = _with_order(parallel, order)
    domain = scaleup_domain(cluster)
    out = {}
    for name, (size, stride) in group_strides(columns(p)).items():
        per, doms = span(size, stride, domain)
        out[name] = Group(name, int(size), int(stride), int(per), int(doms))
    return out


def group_ranks(rank: int, dim: str, parallel, order: str | None = None) -> list[int]:
    """The global ranks in ``rank``'s group of ``dim`` (tp, cp, dp, pp, ep, etp or edp), under the
    layout's rank order (or ``order``)."""
    p = _with_order(parallel, order)
    order = p.rank_order
    if dim in DENSE_DIMS:
        dims = parse_order(order)
        sizes = {"tp": p.tp, "cp": p.cp, "dp": p.dp, "pp": p.pp}
        st = strides(dims, sizes)
        coord = (rank // st[dim]) % sizes[dim]
        base = rank - coord * st[dim]
        return [base + i * st[dim] for i in range(sizes[dim])]
    stage_rank = _stage_local_rank(rank, p, order)
    stage_base = rank - _rank_of_local(stage_rank, p, order, rank)
    sizes = {"etp": p.etp, "ep": p.ep, "edp": p.edp}
    st = {"etp": 1, "ep": p.etp, "edp": p.etp * p.ep}
    coord = (stage_rank // st[dim]) % sizes[dim]
    local = [stage_rank - coord * st[dim] + i * st[dim] for i in range(sizes[dim])]
    return [stage_base + _rank_of_local(lr, p, order, rank) for lr in local]


def _stage_local_rank(rank: int, p, order: str) -> int:
    """Index of ``rank`` within its pipeline stage, counting the dense dims fastest first."""
    dims = [d for d in parse_order(order) if d != "pp"]
    sizes = {"tp": p.tp, "cp": p.cp, "dp": p.dp, "pp": p.pp}
    st = strides(parse_order(order), sizes)
    local, mult = 0, 1
    for d in dims:
        local += ((rank // st[d]) % sizes[d]) * mult
        mult *= sizes[d]
    return local


def _rank_of_local(local: int, p, order: str, ref_rank: int) -> int:
    """Offset from the stage's first rank of the stage-local index ``local`` (inverse of
    :func:`_stage_local_rank`), for the stage holding ``ref_rank``."""
    dims = [d for d in parse_order(order) if d != "pp"]
    sizes = {"tp": p.tp, "cp": p.cp, "dp": p.dp, "pp": p.pp}
    st = strides(parse_order(order), sizes)
    off = 0
    for d in dims:
        off += (local % sizes[d]) * st[d]
        local //= sizes[d]
    return off
