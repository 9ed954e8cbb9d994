"""Rank layout, process groups and the tiers they span."""

from __future__ import annotations

import numpy as np
import pytest

from dayzero.errors import LayoutError
from dayzero.planner.perf.topology import group_ranks, process_groups, scaleup_domain, span
from dayzero.specs.cluster import build_cluster, get_cluster
from dayzero.specs.parallel import ParallelConfig


def test_docstring_example_16_ranks():
    p = ParallelConfig(tp=2, pp=2, dp=4, ep=4, etp=1)
    assert group_ranks(0, "tp", p) == [0, 1]
    assert group_ranks(0, "dp", p) == [0, 2, 4, 6]
    assert group_ranks(0, "pp", p) == [0, 8]
    assert group_ranks(0, "ep", p) == [0, 1, 2, 3]
    assert group_ranks(0, "edp", p) == [0, 4]
    assert group_ranks(13, "tp", p) == [12, 13]
    assert group_ranks(13, "ep", p) == [12, 13, 14, 15]
    assert group_ranks(13, "edp", p) == [9, 13]


def test_every_rank_in_exactly_one_group_per_dim():
    p = ParallelConfig(tp=2, pp=2, dp=2, cp=2, ep=4, etp=2)
    for dim in ("tp", "cp", "dp", "pp", "ep", "etp", "edp"):
        seen = sorted(r for rank in range(p.world) for r in group_ranks(rank, dim,
                                                                        p) if rank == min(group_ranks(rank, dim, p)))
        assert seen == list(range(p.world)), dim


def test_order_changes_strides():
    p = ParallelConfig(tp=2, pp=2, dp=4)
    assert group_ranks(0, "dp", p, "dp-tp-cp-pp") == [0, 1, 2, 3]
    assert group_ranks(0, "tp", p, "dp-tp-cp-pp") == [0, 4]
    with pytest.raises(LayoutError):
        group_ranks(0, "dp", p, "tp-dp-pp")


def test_span_formula():
    per, doms = span(np.array([8, 8, 4, 64, 2]), np.array([1, 8, 2, 1, 16]), 8)
    assert per.tolist() == [8, 1, 4, 8, 1]
    assert doms.tolist() == [1, 8, 1, 8, 2]


def test_groups_and_tiers_on_dgx_h100():
    cluster = build_cluster("h100", 64)
    g = process_groups(ParallelConfig(tp=8, pp=2, dp=4), cluster)
    assert g["tp"].tiers == ("scale-up",)
    assert g["dp"].tiers == ("scale-out",) and g["dp"].domains == 4
    assert g["pp"].tier == "scale-out"
    g = process_groups(ParallelConfig(tp=2, pp=2, dp=16), cluster)
    assert g["dp"].tiers == ("scale-up", "scale-out") and g["dp"].per_domain == 4 and g["dp"].domains == 4


def test_nvl72_domain_holds_an_ep64_group():
    cluster = build_cluster("gb200", 256)
    assert scaleup_domain(cluster) == 64  # 16 trays of 4 per rack for a 256-GPU job
    assert scaleup_domain(get_cluster("gb200-nvl72-1152")) == 72
    g = process_groups(ParallelConfig(tp=1, pp=4, dp=64, ep=64), cluster)
    assert g["ep"].tiers == ("scale-up",)
    g = process_groups(ParallelConfig(tp=1, pp=4, dp=64, ep=64), build_cluster("b200", 256))
    assert g["ep"].tiers == ("scale-up", "scale-out") and g["ep"].domains == 8


# -- the planner's groups are the runtime's device-mesh groups ----------------------------------------

# planner dim -> (runtime mesh view, the view's dims that make up that group)
MESH_OF = {"tp": ("dense", ("tp",)), "cp": ("dense", ("cp",)), "dp": ("dense", ("dp_replicate", "dp_shard")),
           "pp": ("dense", ("pp",)), "ep": ("expert", ("ep",)), "edp": ("expert", ("edp_replicate", "edp_shard"))}
RUNTIME_LAYOUTS = [ParallelConfig(tp=4, pp=2, dp=8, ep=8, zero=1), ParallelConfig(tp=2, pp=2, dp=4, cp=2, ep=4, zero=0),
                   ParallelConfig(tp=1, pp=1, dp=16, ep=16, zero=3), ParallelConfig(tp=8, pp=4, dp=2, ep=2, zero=2),
                   ParallelConfig(tp=2, pp=3, dp=6, ep=3, zero=1), ParallelConfig(tp=2, pp=2, dp=2, cp=2, ep=1, zero=0)]


@pytest.mark.parametrize("p", RUNTIME_LAYOUTS, ids=lambda p: p.describe())
def test_planner_groups_are_the_runtime_mesh_groups(p):
    from dayzero.runtime.parallel.mesh import MeshShape, view_groups

    shape = MeshShape.of(p)
    assert shape.world == p.world
    for dim, (view, dims) in MESH_OF.items():
        groups = view_groups(shape, view, dims)
        assert sorted(r for g in groups for r in g) == list(range(p.world)), dim
        of = {r: g for g in groups for r in g}
        for rank in range(p.world):
            assert group_ranks(rank, dim, p) == of[rank], (dim, rank)
    # every rank of a stage is in its stage group, the stage's ranks the product of its tp, cp and dp groups
    for rank in range(p.world):
        stage = {a for b in group_ranks(rank, "dp",
                                        p) for c in group_ranks(b, "cp", p) for a in group_ranks(c, "tp", p)}
        assert sorted(stage) == {r: g for g in view_groups(shape, "stage", ("stage",)) for r in g}[rank]


def test_rank_order_of_the_layout_moves_the_groups():
    p = ParallelConfig(tp=2, pp=2, dp=4, rank_order="dp-tp-cp-pp")
    assert group_ranks(0, "dp", p) == [0, 1, 2, 3] and group_ranks(0, "tp", p) == [0, 4]
    g = process_groups(p, build_cluster("h100", 16))
    assert (g["dp"].stride, g["tp"].stride, g["pp"].stride) == (1, 4, 8)


def test_vectorised_strides_follow_each_rows_rank_order():
    from dayzero.planner.perf.topology import group_strides
    from dayzero.specs.grid import RANK_ORDERS, encode

    cluster = build_cluster("h100", 64)
    layouts = [ParallelConfig(tp=2, pp=2, dp=4, cp=2, ep=4, rank_order=o) for o in RANK_ORDERS]
    st = {dim: [np.broadcast_to(x, (len(layouts),)) for x in v] for dim, v in group_strides(encode(layouts)).items()}
    for i, p in enumerate(layouts):
        for dim, g in process_groups(p, cluster).items():
            assert (st[dim][0][i], st[dim][1][i]) == (g.size, g.stride), (p.rank_order, dim)
