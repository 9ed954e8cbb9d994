"""EPLB placement: a hand-worked example, DeepSeek's README example, and invariants as properties."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dayzero.planner.perf.eplb import BalanceError, balanced_packing, place_layer, rank_loads, rebalance, replicate
from dayzero.specs.expert_loads import read_expert_loads
from dayzero.specs.placement import contiguous_slots
from helpers.paths import DATA

FIXTURE = DATA / "moe_skewed_metrics.jsonl"


def test_hand_worked_hierarchical():
    """Layer 1 of the fixture: loads [90, 10, 20, 30, 5, 15, 40, 70] (summed over its two
    expert_loads records), 8 experts in 4 groups of 2, ep=4 on 2 nodes, 4 redundant -> 3 slots per
    rank, 6 per node. By hand, following the EPLB README:

    1. Groups to nodes. Group loads g0={0,1}=100, g1={2,3}=50, g2={4,5}=20, g3={6,7}=110. Heaviest
       first onto the lighter node with room (2 groups each): g3->n0, g0->n1, g1->n1 (100<110),
       g2->n0 (110<150). Node 0 holds experts [6, 7, 4, 5], node 1 [0, 1, 2, 3].
    2. Replicate in each node (6 slots, at most 2 copies: one per rank of the node). Node 0:
       hottest per replica is e7 (70) -> 2 copies, then e6 (40) -> 2. Node 1: e0 (90) -> 2, then
       e0's 45 cannot take a third copy, so e3 (30) -> 2.
    3. Pack replicas onto the node's 2 ranks, 3 slots each, heaviest first to the lighter rank
       without that expert. Node 0 replicas 35,35 (e7), 20,20 (e6), 15 (e5), 5 (e4): e7->r0, e7->r1,
       e6->r0 (tie), e6->r1, e5->r0 (tie, 70), e4->r1 (60). Node 1 replicas 45,45 (e0), 20 (e2),
       15,15 (e3), 10 (e1): e0->r2, e0->r3, e2->r2 (65), e3->r3 (60), e3 -> r2 (r3 holds e3; 80),
       e1->r3 (70).
    Rank loads 70, 60, 80, 70 (mean 70): max/mean 80/70. Contiguous [0,1],[2,3],[4,5],[6,7]
    carries 100, 50, 20, 110: max/mean 110/70. The busiest rank drops by 1 - 80/110 = 27.3 %.
    """
    loads = read_expert_loads(FIXTURE)
    assert loads.layers == (1, 2) and loads.matrix[0] == (90, 10, 20, 30, 5, 15, 40, 70)
    res = rebalance(loads.layers, np.array(loads.matrix), ep=4, nodes=2, redundant=4, groups=4)
    assert res.policy == "hierarchical"
    assert res.placement.slots(1) == ((7, 6, 5), (7, 6, 4), (0, 2, 3), (0, 3, 1))
    first = res.layers[0]
    assert (first.max_before, first.max_after, first.mean) == (110.0, 80.0, 70.0)
    assert first.to_json()["max_rank_load_reduction"] == pytest.approx(1 - 80 / 110)
    assert first.before == pytest.approx(110 / 70) and first.after == pytest.approx(80 / 70)


def test_reported_reduction_matches_placement():
    loads = read_expert_loads(FIXTURE)
    m = np.array(loads.matrix)
    out = rebalance(loads.layers, m, ep=4, nodes=2, redundant=4, groups=4).to_json()
    for row, w in zip(out["layers"], m):
        slots = tuple(tuple(r) for r in out["placement"]["layers"][str(row["layer"])])
        assert row["max_rank_load_after"] == pytest.approx(rank_loads(w, slots).max())
        assert row["max_rank_load_before"] == pytest.approx(rank_loads(w, contiguous_slots(8, 4)).max())
        assert row["max_rank_load_reduction"] > 0.2


def test_deepseek_readme_example():
    """The worked example of https://github.com/deepseek-ai/EPLB (README): 12 experts, 4 groups,
    2 nodes, 8 GPUs, 16 slots; this implementation reproduces its published phy2log (no expert of
    it needs two replicas on one GPU, so the distinct-rank rule changes nothing)."""
    w = np.array([[90, 132, 40, 61, 104, 165, 39, 4, 73, 56, 183, 86],
                  [20, 107, 104, 64, 19, 197, 187, 157, 172, 86, 16, 27]])
    want = [[5, 6, 5, 7, 8, 4, 3, 4, 10, 9, 10, 2, 0, 1, 11, 1],
            [7, 10, 6, 8, 6, 11, 8, 9, 2, 4, 5, 1, 5, 0, 3, 1]]
    for row, phy in zip(w, want):
        slots = place_layer(row, ep=8, nodes=2, redundant=4, groups=4)
        assert [e for r in slots for e in r] == phy


def test_global_policy_and_packing_units():
    assert balanced_packing(np.array([5.0, 1, 4, 2]), 2) == [[0, 1], [2, 3]]
    assert replicate(np.array([10.0, 1, 6]), 5, 3).tolist() == [2, 1, 2]
    res = rebalance((0,), np.array([[90, 10, 20, 30, 5, 15, 40, 70]]), ep=4, nodes=2, redundant=4, groups=8,
                    policy="global")
    assert res.policy == "global" and res.layers[0].after < res.layers[0].before


def test_packing_swaps_when_every_open_bin_holds_the_expert():
    """Items A=100, B=C=D=10 and two replicas of e (5 each) in 2 bins of 3: A->b0, B, C, D->b1
    (full), e->b0; the second e finds only b0 open, which holds e, so it takes B's place in b1 and
    B moves to b0: [A, e, B] and [e, C, D]."""
    w = np.array([100.0, 10, 10, 10, 5, 5])
    labels = np.array([0, 1, 2, 3, 4, 4])
    assert balanced_packing(w, 2, labels) == [[0, 4, 1], [5, 2, 3]]


@pytest.mark.parametrize("kw, match", [
    (dict(ep=3, redundant=0), "does not divide experts \\+ redundant = 8 \\+ 0 = 8"),
    (dict(ep=4, nodes=3), "--nodes 3 does not divide --ep 4"),
    (dict(ep=4, groups=3), "--groups 3 does not divide the 8 experts"),
    (dict(ep=4, nodes=2, groups=1, policy="hierarchical"), "needs --nodes 2 to divide --groups 1"),
    (dict(ep=2, redundant=10), "would put an expert twice on one rank"),
])
def test_bad_shapes_one_line(kw, match):
    with pytest.raises(BalanceError, match=match) as e:
        rebalance((0,), np.ones((1, 8)), **kw)
    assert "\n" not in str(e.value)


def test_redundant_slots_can_lose_to_a_perfect_default():
    """Why `after <= before` is a property only without spare slots: loads [3, 1, 4, 0] on ep=2
    are perfectly balanced by the default ([3+1], [4+0]); with 2 spare slots two experts sit on
    both ranks and each rank keeps one unique expert, so balance needs two unique experts of equal
    load, and these four loads are all different: every placement is worse than the default."""
    res = rebalance((0,), np.array([[3.0, 1, 4, 0]]), ep=2, redundant=2)
    assert res.layers[0].before == 1.0 and res.layers[0].after > 1.0


@st.composite
def cases(draw):
    ep = draw(st.sampled_from([1, 2, 4]))
    nodes = draw(st.sampled_from([n for n in (1, 2) if ep % n == 0]))
    per_rank = draw(st.integers(1, 3))
    experts = ep * per_rank
    groups = draw(st.sampled_from([g for g in range(1, experts + 1) if experts % g == 0 and g % nodes == 0]))
    ranks_per_node = ep // nodes
    spare = draw(st.integers(0, min(2, per_rank * (ranks_per_node - 1)))) * ep
    w = draw(st.lists(st.integers(0, 1000), min_size=experts, max_size=experts))
    policy = draw(st.sampled_from(["hierarchical", "global"]))
    return np.array([w], dtype=float), ep, nodes, spare, groups, policy


@settings(max_examples=300, deadline=None, derandomize=True)
@given(cases())
def test_placement_invariants(case):
    m, ep, nodes, spare, groups, policy = case
    experts = m.shape[1]
    res = rebalance((5,), m, ep=ep, nodes=nodes, redundant=spare, groups=groups, policy=policy)
    slots = res.placement.slots(5)  # the Placement constructor re-checks the file rules too
    assert {e for r in slots for e in r} == set(range(experts))  # every expert placed
    assert {len(r) for r in slots} == {(experts + spare) // ep}  # equal slots per rank
    assert all(len(set(r)) == len(r) for r in slots)  # replicas on distinct ranks
    x = res.layers[0]
    assert x.max_after == pytest.approx(rank_loads(m[0], slots).max())
    if spare == 0:
        assert x.max_after <= x.max_before + 1e-9  # after <= before (see the test above for spare > 0)
    counts = np.bincount([e for r in slots for e in r], minlength=experts)
    # the greedy bound: a rank exceeds the mean rank load of its node (of all ranks, for the global
    # policy) by at most the largest replica load
    g = rank_loads(m[0], slots)
    per_node = ep // nodes if policy == "hierarchical" else ep
    node_mean = g.reshape(-1, per_node).mean(axis=1).repeat(per_node)
    assert (g <= node_mean + (m[0] / counts).max() + 1e-6).all()
    if policy == "hierarchical":  # a group's replicas stay on its node
        size = experts // groups
        for g in range(groups):
            homes = {r // per_node for r, ids in enumerate(slots) for e in ids if e // size == g}
            assert len(homes) == 1
