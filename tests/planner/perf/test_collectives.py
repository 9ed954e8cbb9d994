"""Collective cost formulas against hand-computed values, and topology effects."""

from __future__ import annotations

import numpy as np
import pytest

from dayzero.planner.perf import collectives as C
from dayzero.planner.perf.collectives import Link, group_collective


def close(a, b):
    return float(a) == pytest.approx(b, rel=1e-9)


def test_ring_all_reduce_hand_computed():
    # 2 (n-1) alpha + 2 (n-1)/n B/bw = 2*7*10us + 2*7/8 * 1 GB / 100 GB/s
    assert close(C.ring_all_reduce(1e9, 8, 100e9, 1e-5), 1.4e-4 + 0.0175)


def test_tree_all_reduce_hand_computed():
    # 2 ceil(log2 8) alpha + 2 B/bw
    assert close(C.tree_all_reduce(1e9, 8, 100e9, 1e-5), 6e-5 + 0.02)


def test_all_reduce_picks_ring_for_large_and_tree_for_small_messages():
    assert close(C.all_reduce(1e9, 8, 100e9, 1e-5), 1.4e-4 + 0.0175)  # ring
    # 1 kB over 1024 ranks: ring pays 2*1023 latencies, tree 2*10
    assert close(C.all_reduce(1e3, 1024, 100e9, 1e-5), 2 * 10 * 1e-5 + 2e3 / 100e9)


def test_reduce_scatter_and_all_gather_hand_computed():
    # (n-1) alpha + (n-1)/n B/bw = 3*20us + 3/4 * 1 GB / 50 GB/s
    assert close(C.reduce_scatter(1e9, 4, 50e9, 2e-5), 6e-5 + 0.015)
    assert close(C.all_gather(1e9, 4, 50e9, 2e-5), 6e-5 + 0.015)


def test_all_to_all_switch_hand_computed():
    # alpha + (n-1)/n B/bw = 10us + 7/8 * 0.8 GB / 100 GB/s
    assert close(C.all_to_all(8e8, 8, 100e9, 1e-5), 1e-5 + 0.007)


def test_all_to_all_mesh_hand_computed():
    # each of the 7 peer chunks (B/8 = 0.1 GB) on its own 10 GB/s link: 10 ms; links together
    # carry 7/8 B = 0.7 GB at 70 GB/s: 10 ms
    assert close(C.all_to_all_mesh(8e8, 8, 10e9, 70e9, 1e-5), 1e-5 + 0.01)
    # the busiest pair carries 2x its share: 20 ms
    assert close(C.all_to_all_mesh(8e8, 8, 10e9, 70e9, 1e-5, imbalance=2.0), 1e-5 + 0.02)


def test_send_recv_hand_computed():
    assert close(C.send_recv(1e8, 25e9, 2e-5), 2e-5 + 0.004)


def test_groups_of_one_cost_nothing():
    for f in (C.ring_all_reduce, C.tree_all_reduce, C.reduce_scatter, C.all_to_all):
        assert float(f(1e9, 1, 100e9, 1e-5)) == 0.0
    intra = Link(400e9, 400e9, 1e-5)
    assert float(group_collective("all_reduce", 1e9, 1, 1, 1, intra, None)) == 0.0


def test_hierarchical_all_reduce_hand_computed():
    # 16 ranks, 8 per node on 2 nodes: RS inside (7 steps), AR across on B/8, AG inside
    intra, inter = Link(400e9, 400e9, 1e-5), Link(50e9, 50e9, 2e-5)
    rs = 7 * 1e-5 + 7 / 8 * 1.6e9 / 400e9
    ar = 2 * 1 * 2e-5 + 2 * 1 / 2 * 2e8 / 50e9  # ring over 2 nodes on 0.2 GB
    assert close(group_collective("all_reduce", 1.6e9, 16, 8, 2, intra, inter), 2 * rs + ar)


def test_hierarchical_reduce_scatter_hand_computed():
    intra, inter = Link(400e9, 400e9, 1e-5), Link(50e9, 50e9, 2e-5)
    rs_in = 7 * 1e-5 + 7 / 8 * 1.6e9 / 400e9
    rs_out = 3 * 2e-5 + 3 / 4 * 2e8 / 50e9
    assert close(group_collective("reduce_scatter", 1.6e9, 32, 8, 4, intra, inter), rs_in + rs_out)


def test_flat_group_across_nodes_uses_the_nic():
    intra, inter = Link(400e9, 400e9, 1e-5), Link(50e9, 50e9, 2e-5)
    # one member per node: a plain ring over the scale-out network
    assert close(group_collective("all_gather", 1e9, 4, 1, 4, intra, inter), 3 * 2e-5 + 0.75 * 1e9 / 50e9)


def test_all_to_all_slower_on_full_mesh_than_behind_equal_switch():
    """An 8-card full mesh (7 links of 56 GB/s) and a switch giving each device the same
    392 GB/s: a 4-member all-to-all can use only 3 of the mesh's links. With uneven routing
    (imbalance 1.5 on the busiest device) the hot receiver takes 1.5 x its share on either
    fabric: behind the switch through its one port, 1.5 x 7/8 GB / 392 GB/s; on the mesh over its
    7 links, each peer chunk 1.5 x 1/8 GB over one 56 GB/s link -- the same 3.35 ms."""
    mesh = Link(392e9, 56e9, 1e-5, "mesh")
    switch = Link(392e9, 392e9, 1e-5, "switch")
    b = 1e9
    m4 = group_collective("all_to_all", b, 4, 4, 1, mesh, None)
    s4 = group_collective("all_to_all", b, 4, 4, 1, switch, None)
    assert float(m4) > 2 * float(s4)
    assert close(m4, 1e-5 + 0.25e9 / 56e9)  # each peer chunk on one link
    assert close(s4, 1e-5 + 0.75e9 / 392e9)
    m8 = group_collective("all_to_all", b, 8, 8, 1, mesh, None, imbalance=1.5)
    s8 = group_collective("all_to_all", b, 8, 8, 1, switch, None, imbalance=1.5)
    assert close(s8, 1e-5 + 1.5 * 0.875e9 / 392e9)
    assert close(m8, 1e-5 + 1.5 * 0.125e9 / 56e9)
    assert float(s8) > float(group_collective("all_to_all", b, 8, 8, 1, switch, None))  # the hot port counts


def test_small_groups_on_a_mesh_get_fewer_links():
    mesh = Link(392e9, 56e9, 1e-5, "mesh")
    switch = Link(392e9, 392e9, 1e-5, "switch")
    assert float(mesh.group_bw(2)) == pytest.approx(56e9)
    assert float(mesh.group_bw(8)) == pytest.approx(392e9)
    slow = group_collective("all_reduce", 1e9, 2, 2, 1, mesh, None)
    fast = group_collective("all_reduce", 1e9, 2, 2, 1, switch, None)
    assert float(slow) == pytest.approx(float(fast) * 7, rel=0.01)


def test_vectorised_over_candidates():
    intra, inter = Link(400e9, 400e9, 1e-5), Link(50e9, 50e9, 2e-5)
    sizes = np.array([1, 8, 16, 64])
    per = np.array([1, 8, 8, 8])
    doms = np.array([1, 1, 2, 8])
    t = group_collective("all_reduce", np.full(4, 1e9), sizes, per, doms, intra, inter)
    assert t.shape == (4,) and t[0] == 0 and np.all(np.diff(t) > 0)
    one = [float(group_collective("all_reduce", 1e9, s, p, d, intra, inter)) for s, p, d in zip(sizes, per, doms)]
    assert np.allclose(t, one)
