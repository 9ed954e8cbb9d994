"""MoE dispatch physics: deduplicated rows per token, FP8 dispatch bytes, imbalance per experts
per device, and what they do to a layout's EP time. Every expected value is computed by hand
from the formula in the docstring of the test, not by the code under test."""

from __future__ import annotations

from dataclasses import replace
from math import prod, sqrt
from statistics import NormalDist

import numpy as np
import pytest

from dayzero.errors import ConfigError
from dayzero.planner.perf.collectives import Link, dedup_all_to_all, group_collective
from dayzero.planner.perf.comm import CommOptions
from dayzero.planner.perf.moe_dispatch import (
    FP8_DISPATCH_BYTES,
    dedup_rows,
    device_imbalance,
    expected_units_hit,
    unit_hit_probability,
)
from dayzero.planner.perf.perf import PerfOptions, evaluate
from dayzero.specs.cluster import build_cluster
from dayzero.specs.grid import encode
from dayzero.specs.parallel import ParallelConfig
from dayzero.specs.registry import load_model


def miss(pool: int, excluded: int, k: int = 8) -> float:
    """P(k distinct uniform picks out of ``pool`` avoid ``excluded`` of them), as a product."""
    return prod((pool - excluded - i) / (pool - i) for i in range(k))


def test_deepseek_v3_node_limited_routing_reaches_3_6_of_8_nodes():
    """DeepSeek-V3 (arXiv:2412.19437 sec. 2.1.2): 256 experts in 8 groups, top-4 groups, top-8
    experts, EP over 8 nodes, one group per node. A node is hit when its group is among the 4
    (P = 1/2) and at least one of the 8 experts, uniform over the 128 experts of the 4 groups,
    is among its 32: P = 1/2 (1 - prod_{i<8} (96-i)/(128-i)) = 0.4536; 3.63 nodes per token,
    never more than topk_group = 4 (the report's M = 4)."""
    p = 0.5 * (1 - miss(128, 32))
    assert unit_hit_probability(256, 8, 8, 8, 4) == pytest.approx(p, rel=1e-12)
    assert p == pytest.approx(0.4536, abs=1e-4)
    assert expected_units_hit(256, 8, 8, 8, 4) == pytest.approx(8 * p, rel=1e-12) and 8 * p <= 4


def test_without_group_limit_a_node_is_missed_only_if_all_k_experts_avoid_it():
    """No group limit: P(node hit) = 1 - prod_{i<8} (224-i)/(256-i) = 0.6618 for 256 experts on 8
    nodes, top-8; with n_group 1 the grouped and ungrouped rules agree."""
    p = 1 - miss(256, 32)
    assert unit_hit_probability(256, 8, 8) == pytest.approx(p, rel=1e-12)
    assert unit_hit_probability(256, 8, 8, 1, 1) == pytest.approx(p, rel=1e-12)
    assert p == pytest.approx(0.6618, abs=1e-4)


def test_two_groups_per_node_hypergeometric_and_one_group_over_many_ranks():
    """4 nodes of 2 groups each (G = 8, M = 4): j of a node's 2 groups are selected with
    P(1) = C(2,1) C(6,3)/C(8,4) = 40/70, P(2) = C(6,2)/70 = 15/70; given j the node is missed
    with prod (128 - 32 j - i)/(128 - i). 64 ranks (a group spans 8 ranks of 4 experts):
    P = 4/8 (1 - prod (124-i)/(128-i))."""
    p4 = 40 / 70 * (1 - miss(128, 32)) + 15 / 70 * (1 - miss(128, 64))
    assert unit_hit_probability(256, 8, 4, 8, 4) == pytest.approx(p4, rel=1e-12)
    p64 = 0.5 * (1 - miss(128, 4))
    assert unit_hit_probability(256, 8, 64, 8, 4) == pytest.approx(p64, rel=1e-12)


def test_dedup_rows_count_ranks_over_scale_up_and_remote_nodes_over_scale_out():
    """EP 64 over 8 nodes: 64 p64 rank rows over NVLink, 7 x 0.4536 remote-node rows over the
    NIC (one per remote node hit, DeepEP's RDMA copy); EP 8 inside one node: no scale-out rows."""
    up, out = dedup_rows(256, 8, [64, 8], [8, 8], [8, 1], 8, 4)
    assert up[0] == pytest.approx(64 * 0.5 * (1 - miss(128, 4)), rel=1e-12)
    assert out[0] == pytest.approx(7 * 0.5 * (1 - miss(128, 32)), rel=1e-12)
    assert up[1] == pytest.approx(8 * 0.5 * (1 - miss(128, 32)), rel=1e-12) and out[1] == 0.0


def test_fp8_dispatch_bytes_carry_one_fp32_scale_per_128_elements():
    """DeepSeek-V3 sec. 3.3.2: 1 x 128 activation tiles, one FP32 scale each: 1 + 4/128 B."""
    assert FP8_DISPATCH_BYTES == pytest.approx(1.03125)


def test_dedup_all_to_all_is_the_slower_of_the_nvlink_fan_out_and_the_nic_sends():
    """1 GB of rank rows over a 400 GB/s switch (7/8 leave the GPU: 2.1875 ms + 10 us) against
    0.4 GB of node rows over a 50 GB/s NIC (8 ms + 20 us): the NIC sets the time; imbalance 1.25
    scales both; inside one domain only the NVLink part counts."""
    intra, inter = Link(400e9, 400e9, 1e-5), Link(50e9, 50e9, 2e-5)
    t = dedup_all_to_all(1e9, 0.4e9, 64, 8, 8, intra, inter)
    assert float(t) == pytest.approx(2e-5 + 0.4e9 / 50e9, rel=1e-12)
    t = dedup_all_to_all(1e9, 0.4e9, 64, 8, 8, intra, inter, imbalance=1.25)
    assert float(t) == pytest.approx(2e-5 + 1.25 * 0.4e9 / 50e9, rel=1e-12)
    t = dedup_all_to_all(1e9, 0.0, 8, 8, 1, intra, inter)
    assert float(t) == pytest.approx(1e-5 + 7 / 8 * 1e9 / 400e9, rel=1e-12)


def test_hot_receiver_behind_a_switch_pays_the_imbalance():
    """Plain all-to-all of 1 GB in an 8-device switch domain, imbalance 1.5: the busiest port
    carries 1.5 x 7/8 GB: 1e-5 + 1.5 x 0.875e9 / 400e9."""
    intra = Link(400e9, 400e9, 1e-5)
    t = group_collective("all_to_all", 1e9, 8, 8, 1, intra, None, imbalance=1.5)
    assert float(t) == pytest.approx(1e-5 + 1.5 * 0.875e9 / 400e9, rel=1e-12)


def test_device_imbalance_shrinks_with_experts_per_device():
    """Per-expert CV 0.3, 256 experts: ep 8 (32 per device) gives 1 + z_8 0.3/sqrt(32) with Blom's
    z_8 = Phi^-1(7.625/8.25) = 1.4342, i.e. 1.0761; ep 256 (one expert per device) is the worst
    case 1 + z_256 0.3; ep 1 is balanced."""
    z8 = NormalDist().inv_cdf((8 - 0.375) / (8 + 0.25))
    assert z8 == pytest.approx(1.4342, abs=1e-4)
    got = device_imbalance(0.3, 256, np.array([1, 8, 64, 256]))
    assert got[0] == 1.0
    assert got[1] == pytest.approx(1 + z8 * 0.3 / sqrt(32), rel=1e-12)
    z256 = NormalDist().inv_cdf((256 - 0.375) / (256 + 0.25))
    assert got[3] == pytest.approx(1 + z256 * 0.3, rel=1e-12)
    assert got[3] > got[2] > got[1] > got[0]


DSV3 = load_model("deepseek-v3")
H100 = build_cluster("h100", 512)


def ep_rows(options, p, spec=DSV3, cluster=H100):
    ev = evaluate(spec, encode([p]), cluster, options, layer_split=p.layer_split)
    return {r["name"]: r for r in ev.inventory_of(0) if r["dim"] == "ep"}, float(ev.step_s[0])


def test_dedup_and_fp8_dispatch_cut_a_multi_node_ep_layout():
    """DeepSeek-V3, EP 64 over 8 H100 nodes: the deduplicating dispatcher's NIC rows (3.2 per
    token) are about 45 % of the plain all-to-all's 7 (8 copies, 56 of 64 ranks remote), so the
    NIC-bound dispatch takes ~0.45 x as long; FP8 dispatch halves the dispatch direction again
    (1.03125 / 2 of the bytes) and leaves the combine in BF16."""
    p = ParallelConfig(tp=1, pp=8, dp=64, ep=64, mbs=1, gbs=1024, seq=4096, precision="fp8")
    plain, s_plain = ep_rows(PerfOptions(comm=CommOptions(ep_dispatcher="all_to_all")), p)
    dedup, s_dedup = ep_rows(PerfOptions(comm=CommOptions()), p)
    fp8, _ = ep_rows(PerfOptions(comm=CommOptions(fp8_dispatch=True)), p)
    assert plain["ep dispatch"]["tier"] == "scale-up+scale-out"
    ratio = 7 * 0.5 * (1 - miss(128, 32)) / 7
    assert dedup["ep dispatch"]["time_s"] == pytest.approx(ratio * plain["ep dispatch"]["time_s"], rel=0.02)
    assert s_dedup < s_plain
    assert fp8["ep dispatch"]["bytes"] == pytest.approx(dedup["ep dispatch"]["bytes"] * 1.03125 / 2, rel=1e-12)
    assert fp8["ep combine"]["bytes"] == pytest.approx(dedup["ep combine"]["bytes"], rel=1e-12)
    assert fp8["ep dispatch"]["time_s"] < 0.6 * dedup["ep dispatch"]["time_s"]
    bf16 = replace(p, precision="bf16")  # no FP8 recipe: the switch changes nothing
    assert ep_rows(PerfOptions(comm=CommOptions(fp8_dispatch=True)), bf16)[0]["ep dispatch"]["bytes"] == \
        pytest.approx(ep_rows(PerfOptions(), bf16)[0]["ep dispatch"]["bytes"], rel=1e-12)


def test_expert_cv_imbalance_reaches_the_ep_time_and_the_prediction_says_so():
    """A per-expert CV makes the busiest device slower than the balanced one, and the
    prediction names the rule; the measured path and the constant are unchanged by it."""
    from dayzero.planner.predict import predict

    p = ParallelConfig(tp=1, pp=8, dp=64, ep=64, mbs=1, gbs=1024, seq=4096)
    cv = PerfOptions(comm=CommOptions(moe_expert_cv=0.3))
    assert ep_rows(cv, p)[1] > ep_rows(PerfOptions(), p)[1]
    d = predict(DSV3, p, H100, cv)["moe_imbalance"]
    assert d["from"] == "per-expert load CV" and d["experts_per_device"] == 4
    assert d["value"] == pytest.approx(float(device_imbalance(0.3, 256, 64)), rel=1e-12)
    assert CommOptions(moe_imbalance=1.2).imbalance(np.array([8]), 256) == 1.2


def test_unknown_dispatcher_is_one_clear_error():
    with pytest.raises(ConfigError, match="not a dispatcher"):
        CommOptions(ep_dispatcher="deepep")


def test_run_options_reject_a_negative_cv_and_two_imbalance_sources():
    with pytest.raises(ConfigError, match="must be >= 0"):
        PerfOptions.for_run(moe_expert_cv=-0.1)
    with pytest.raises(ConfigError, match="not both"):
        PerfOptions.for_run(moe_imbalance=1.2, moe_expert_cv=0.3)
    assert PerfOptions.for_run(moe_expert_cv=0.3, ep_dispatcher="all_to_all").comm.ep_dispatcher == "all_to_all"


def test_dedup_rows_vectorised_equals_one_placement_at_a_time():
    """Many candidates share a few placements: the rows are computed once per placement and
    equal the one-at-a-time values; uneven splits (12 over domains of 8) get the plain rows."""
    size, per, doms = np.array([64, 8, 32, 64, 12] * 1000), np.array([8, 8, 8, 8, 8] * 1000), \
        np.array([8, 1, 4, 8, 2] * 1000)
    up, out = dedup_rows(256, 8, size, per, doms, 8, 4)
    for i in range(5):
        u1, o1 = dedup_rows(256, 8, size[i], per[i], doms[i], 8, 4)
        assert up[i::5] == pytest.approx(np.full(1000, float(u1)))
        assert out[i::5] == pytest.approx(np.full(1000, float(o1)))
    assert up[4] == pytest.approx(8 * 8 / 12) and out[4] == pytest.approx(8 * 4 / 12)
