"""DualPipe and DualPipeV schedules: stage placement, bubble, activations in flight, parameter
copies, layout rules and the EP overlap they bring, each against a hand-computed value."""

from __future__ import annotations

import numpy as np
import pytest

from dayzero.planner.comm import CommOptions
from dayzero.planner.memory import estimate_memory, peak_memory_batch
from dayzero.planner.perf import PerfOptions, evaluate
from dayzero.planner.schedule import bubble_microbatches, inflight_microbatches
from dayzero.specs.cluster import build_cluster
from dayzero.specs.grid import DUALPIPE, DUALPIPEV, INTERLEAVED, ONE_F_ONE_B, encode
from dayzero.specs.parallel import ParallelConfig, stage_ranks
from dayzero.specs.registry import load_model

LLAMA = load_model("llama-3.1-8b")
MOE = load_model("qwen3-235b-a22b")


def test_stage_placement():
    """DualPipe (deepseek-ai/DualPipe dualpipe.py): rank r holds stage r and its mirror pp - 1 - r.
    DualPipeV (dualpipev.py, torch ScheduleDualPipeV style "v"): 2 pp stages, rank r holds r and
    2 pp - 1 - r. Interleaved 1F1B: stage s on rank s % pp."""
    assert stage_ranks("dualpipe", 4, 1) == ((0, 3), (1, 2), (2, 1), (3, 0))
    assert stage_ranks("dualpipev", 2, 2) == ((0,), (1,), (1,), (0,))
    assert stage_ranks("interleaved", 2, 2) == ((0,), (1,), (0,), (1,))


def test_bubble_against_the_dualpipe_table():
    """DualPipe README / DeepSeek-V3 Table 2, pp = 16 with F = 1, B = 2, W = 1 (per chunk):
    1F1B (PP-1)(F+B) = 15 x 3 = 45; DualPipe (PP/2-1)(F&B+B-3W) = 7 x (3 + 2 - 3) = 14 (F&B = F + B);
    DualPipeV: DualPipe over 2 pp = 32 stages of half a rank's layers, (32/2-1)(F&B+B-3W)/2 =
    15 x 2 / 2 = 15 in units of a rank's micro-batch; interleaved vpp 2: 45 / 2 = 22.5."""
    codes = np.array([ONE_F_ONE_B, DUALPIPE, DUALPIPEV, INTERLEAVED])
    got = bubble_microbatches(codes, 16, np.array([1, 1, 2, 2]), 1.0, 2.0, 1.0)
    assert got == pytest.approx([45.0, 14.0, 15.0, 22.5])


def test_activations_in_flight():
    """DualPipe holds PP + 1 chunks on every rank (README: 'Activation PP+1'): pp - r of its
    first chunk and r + 1 of its mirror; pp = 4 -> 5 chunks = 2.5 micro-batches of the rank's two
    chunks. DualPipeV, pp = 4 (8 stages): 8 - r + r + 1 = 9 chunks = 4.5. 1F1B rank 0: pp = 4."""
    ranks = np.arange(4)
    assert inflight_microbatches(DUALPIPE, 4, 1, 16, ranks) == pytest.approx([2.5] * 4)
    assert inflight_microbatches(DUALPIPEV, 4, 2, 16, ranks) == pytest.approx([4.5] * 4)
    assert inflight_microbatches(ONE_F_ONE_B, 4, 1, 16, ranks) == pytest.approx([4, 3, 2, 1])


def test_dualpipe_holds_two_copies_of_each_stage_and_dualpipev_one():
    """DualPipe README: 'Parameter 2x' for DualPipe (each rank also holds the mirror stage), 1x for
    DualPipeV; the V puts the embedding and the head on rank 0. Llama 3.1 8B, 32 layers, pp 4:
    1F1B rank 1 holds 8 layers, DualPipe rank 1 stages 1 and 2 (16), DualPipeV rank 1 stages 1
    and 6 of 8 (8)."""
    base = dict(pp=4, dp=2, gbs=32, mbs=1, seq=2048)
    mem = {s: estimate_memory(LLAMA, ParallelConfig(schedule=s, **base), 80e9) for s in ("1f1b", "dualpipe",
                                                                                         "dualpipev")}
    w = {s: m.stages[1].terms["weights:layers"] for s, m in mem.items()}
    assert w["dualpipe"] == pytest.approx(2 * w["1f1b"])
    assert w["dualpipev"] == pytest.approx(w["1f1b"])
    v = mem["dualpipev"].stages
    assert v[0].terms["weights:head"] > 0 and v[0].terms["weights:embedding"] > 0 and v[3].terms["weights:head"] == 0
    d = mem["dualpipe"].stages
    assert d[0].terms["weights:head"] > 0 and d[3].terms["weights:embedding"] > 0
    # the vectorised path agrees with the scalar one
    layouts = [ParallelConfig(schedule=s, **base) for s in ("1f1b", "dualpipe", "dualpipev")]
    assert peak_memory_batch(LLAMA, encode(layouts), 80e9) == pytest.approx([m.peak_bytes for m in mem.values()])


def test_layout_rules():
    """dualpipe.py asserts num_ranks % 2 == 0 and an even num_chunks >= 2 num_ranks; dualpipev.py
    num_chunks >= 2 num_ranks and two chunks per rank."""
    assert ParallelConfig(pp=3, dp=2, gbs=24, schedule="dualpipe").problems(LLAMA)
    assert ParallelConfig(pp=4, dp=2, gbs=14, schedule="dualpipe").problems(LLAMA)  # 7 micro-batches < 8
    assert not ParallelConfig(pp=4, dp=2, gbs=16, schedule="dualpipe").problems(LLAMA)
    assert ParallelConfig(pp=4, dp=2, gbs=8, schedule="dualpipev").vpp == 2
    assert ParallelConfig(pp=4, dp=2, gbs=14, schedule="dualpipev").problems(LLAMA)
    assert not ParallelConfig(pp=4, dp=2, gbs=16, schedule="dualpipev").problems(LLAMA)


def test_dualpipe_hides_the_ep_all_to_all_behind_the_other_micro_batch():
    """Under DualPipe the EP dispatch/combine of one micro-batch overlaps another's compute
    (DeepSeek-V3 sec. 3.2.1): exposed = max(0, a2a - layer compute) x the SM-sharing rule, never
    more than 1F1B's fully exposed all-to-all; and the step is faster."""
    cl = build_cluster("h100", 64)
    base = dict(pp=4, dp=16, ep=16, gbs=256, mbs=1, seq=4096)
    opts = PerfOptions(comm=CommOptions(ep_overlap=False))
    ev = evaluate(MOE, encode([ParallelConfig(schedule=s, **base) for s in ("1f1b", "dualpipe")]), cl, opts)
    ep = {r["name"]: r for r in ev.inventory_of(0) if r["dim"] == "ep"}
    ep_d = {r["name"]: r for r in ev.inventory_of(1) if r["dim"] == "ep"}
    assert ep["ep dispatch"]["exposed_s"] == pytest.approx(ep["ep dispatch"]["total_s"])
    assert ep_d["ep dispatch"]["exposed_s"] < ep_d["ep dispatch"]["total_s"]
    assert ev.step_s[1] < ev.step_s[0]
