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
layouts in one call.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dayzero.errors import LayoutError
from dayzero.specs.cluster import Cluster

DENSE_ORDER = "tp-cp-dp-pp"
EXPERT_ORDER = "etp-ep-edp-pp"
DENSE_DIMS = ("tp", "cp", "dp", "pp")


def parse_order(order: str) -> tuple[str, ...]:
    """``"tp-cp-dp-pp"`` -> ``("tp", "cp", "dp", "pp")``; every dense dim exactly once."""
    dims = tuple(d.strip() for d in order.lower().split("-") if d.strip())
    if sorted(dims) != sorted(DENSE_DIMS):
        raise LayoutError(f"rank order {order!r} must name each of tp, cp, dp, pp exactly once, fastest first "
                          f"(e.g. {DENSE_ORDER})")
    return dims


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


def group_strides(tp, cp, dp, pp, ep, etp, order: str = DENSE_ORDER) -> dict:
    """Stride and size of every group the planner uses; values are arrays or ints.

    ``dp_cp`` is the gradient group (dense grads are reduced over dp x cp, as in Megatron);
    ``ep``/``etp``/``edp`` follow the expert order within a stage (stride of etp is 1)."""
    dims = parse_order(order)
    sizes = {"tp": tp, "cp": cp, "dp": dp, "pp": pp}
    st = strides(dims, sizes)
    i_cp, i_dp = dims.index("cp"), dims.index("dp")
    if abs(i_cp - i_dp) != 1:
        raise LayoutError(f"rank order {order!r}: cp and dp must be adjacent (gradients are reduced over dp x cp)")
    stage = np.asarray(tp) * cp * dp
    edp = np.maximum(1, stage // (np.asarray(ep) * etp))
    return {
        "tp": (tp, st["tp"]), "cp": (cp, st["cp"]), "dp": (dp, st["dp"]), "pp": (pp, st["pp"]),
        "dp_cp": (np.asarray(dp) * cp, np.minimum(st["dp"], st["cp"])),
        "etp": (etp, 1), "ep": (ep, etp), "edp": (edp, np.asarray(ep) * etp),
    }


def process_groups(parallel, cluster: Cluster, order: str = DENSE_ORDER) -> dict[str, Group]:
    """Every process group of one layout, with the tiers it spans."""
    p = parallel
    domain = scaleup_domain(cluster)
    out = {}
    for name, (size, stride) in group_strides(p.tp, p.cp, p.dp, p.pp, p.ep, p.etp, order).items():
        per, doms = span(size, stride, domain)
        out[name] = Group(name, int(size), int(stride), int(per), int(doms))
    return out


def group_ranks(rank: int, dim: str, parallel, order: str = DENSE_ORDER) -> list[int]:
    """The global ranks in ``rank``'s group of ``dim`` (tp, cp, dp, pp, ep, etp or edp)."""
    p = parallel
    if dim in DENSE_DIMS:
        dims = parse_order(order)
        sizes = {"tp": p.tp, "cp": p.cp, "dp": p.dp, "pp": p.pp}
        st = strides(dims, sizes)
        coord = (rank // st[dim]) % sizes[dim]
        base = rank - coord * st[dim]
        return [base + i * st[dim] for i in range(sizes[dim])]
    stage_size = p.tp * p.cp * p.dp
    stage_rank = _stage_local_rank(rank, p, order)
    stage_base = rank - _rank_of_local(stage_rank, p, order, rank)
    edp = max(1, stage_size // (p.ep * p.etp))
    sizes = {"etp": p.etp, "ep": p.ep, "edp": edp}
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
