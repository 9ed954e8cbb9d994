"""Rank layout, process groups and the tiers they span."""

from __future__ import annotations

import numpy as np
import pytest

from dayzero.errors import LayoutError
from dayzero.planner.topology import group_ranks, process_groups, scaleup_domain, span
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
        seen = sorted(r for rank in range(p.world) for r in group_ranks(rank, dim, p) if rank == min(group_ranks(rank, dim, p)))
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
