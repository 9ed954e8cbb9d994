"""Context parallelism's two exchanges (ParallelConfig.cp_comm): the ring (p2p) and the
DeepSpeed-Ulysses all-to-all (a2a, Megatron ``--cp-comm-type a2a``; Jacobs et al. 2023,
arXiv:2309.14509). Expected values are computed by hand from the alpha-beta all-to-all of
:mod:`dayzero.planner.perf.collectives` (alpha + (n-1)/n B / bw behind a switch) with the H100
cluster's achievable NVLink rates, and from the byte counts of
:func:`dayzero.planner.memory.activations.attention_terms`."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from dayzero.errors import LayoutError
from dayzero.planner.engines import engine_problems, engines_for
from dayzero.planner.memory.memory import estimate_memory
from dayzero.planner.perf.calibration import constants_for, rates
from dayzero.planner.perf.perf import evaluate
from dayzero.planner.search.search import plan, search
from dayzero.planner.search.search_space import SearchSpace
from dayzero.specs import layout_rules
from dayzero.specs.cluster import build_cluster
from dayzero.specs.grid import A2A, CP_OPEN, P2P, decode, encode
from dayzero.specs.parallel import ParallelConfig
from dayzero.specs.registry import load_model

LLAMA = load_model("llama-3.1-70b")  # 64 query heads, 8 KV heads, head_dim 128, 80 layers
H100 = build_cluster("h100", 64)
R = rates(H100, constants_for(H100))
MIB = 2**20


def rows(p, cluster=H100):
    ev = evaluate(LLAMA, encode([p]), cluster)
    return {r["name"]: r for r in ev.inventory_of(0)}


def a2a_layout(**kw):
    # tp 2 x cp 4 = 8 ranks: the cp group inside one NVLink domain (tp-cp-dp-pp, tp fastest)
    return ParallelConfig(**{**dict(tp=2, cp=4, dp=8, mbs=1, gbs=8, seq=32768, zero=1, cp_comm="a2a"), **kw})


def test_the_all_to_alls_move_q_k_v_and_o_and_nothing_hides_them():
    """Llama 70B, tp 2, cp 4, one micro-batch of 32768 tokens: a cp rank holds T = 8192 tokens,
    of 64/2 = 32 query heads and 8/2 = 4 KV heads of 128: q = o = 8192 x 32 x 128 x 2 B = 64 MiB,
    k = v = 8192 x 4 x 128 x 2 B = 8 MiB. Per layer 4 all-to-alls forward (q, k, v; o) and 4
    backward (dO; dQ, dK, dV), each alpha + 3/4 B / bw over the 4 cp ranks: 80 x 8 = 640 ops of
    (4 alpha + 3/4 x 144 MiB / bw) / 4 each, all exposed. The ring's hops are gone."""
    r = rows(a2a_layout())
    item = r["cp all-to-all Q/K/V/O"]
    parts = (64 * MIB, 8 * MIB, 8 * MIB, 64 * MIB)
    per_op = sum(R.intra.alpha + 3 / 4 * b / R.intra.bw for b in parts) / 4
    assert item["count"] == 640 and item["group_size"] == 4 and item["tier"] == "scale-up"
    assert item["bytes"] == pytest.approx(sum(parts) / 4, rel=1e-12)
    assert item["time_s"] == pytest.approx(per_op, rel=1e-12)
    assert item["exposed_s"] == pytest.approx(640 * per_op, rel=1e-12) and item["hidden_by"] == ""
    assert "cp ring K/V" not in r
    ring = rows(a2a_layout(cp_comm="p2p"))
    assert "cp all-to-all Q/K/V/O" not in ring and ring["cp ring K/V"]["count"] == 80 * 3 * 3


@pytest.mark.parametrize("recompute, modules", [("full", ()), ("selective", ("core_attn",))])
def test_replaying_the_core_attention_replays_its_forward_all_to_alls(recompute, modules):
    """Full recompute, or selective recompute of core_attn (whose checkpoint holds TE's attention
    with its all-to-alls), runs the 4 forward all-to-alls again: 80 x 12 = 960 ops. Recomputing
    only the MLP replays none of them."""
    assert rows(a2a_layout(recompute=recompute, recompute_modules=modules))["cp all-to-all Q/K/V/O"]["count"] == 960
    assert rows(a2a_layout(recompute="selective", recompute_modules=("mlp",)))["cp all-to-all Q/K/V/O"]["count"] == 640


def test_a2a_buffers_replace_the_rings_and_the_activations_stay_the_same():
    """The ring double-buffers its K/V blocks, 2 (k + v) = 2 x 16 MiB = 32 MiB; the all-to-all
    holds the pre-exchange q, k, v and their send copies, 2 (q + k + v) = 2 x 80 MiB = 160 MiB
    (memory_terms.cp_buffers). The saved activations are the same bytes either way."""
    ring = estimate_memory(LLAMA, a2a_layout(cp_comm="p2p"), H100.memory_bytes).stages[0].terms
    a2a = estimate_memory(LLAMA, a2a_layout(), H100.memory_bytes).stages[0].terms
    assert ring["temporary:cp_ring"] == 32 * MIB and "temporary:cp_a2a" not in ring
    assert a2a["temporary:cp_a2a"] == 160 * MIB and a2a["temporary:cp_ring"] == 0
    assert a2a["activations:layers"] == ring["activations:layers"]


def test_a2a_needs_each_tp_ranks_heads_divisible_by_cp():
    """TE's AttnFuncWithCPAndQKVOA2A asserts the local query and key heads divisible by cp: tp 2
    leaves 4 KV heads (cp 4 splits them, cp 8 does not); tp 8 leaves one (no cp > 1 splits it)."""
    assert layout_rules.problems(a2a_layout(), LLAMA, 64) == []
    bad = layout_rules.problems(a2a_layout(tp=2, cp=8, dp=4), LLAMA, 64)
    assert len(bad) == 1 and "32 query heads and 4 key/value heads" in bad[0] and "cp 8" in bad[0]
    assert layout_rules.problems(a2a_layout(tp=8, cp=2, dp=4), LLAMA, 64)
    assert layout_rules.problems(a2a_layout(tp=8, cp=2, dp=4, cp_comm="p2p"), LLAMA, 64) == []
    assert "cp_comm must be p2p|a2a" in layout_rules.problems(a2a_layout(cp_comm="ring"), LLAMA, 64)[0]
    with pytest.raises(LayoutError, match="cp_comm"):
        layout_rules.validate(a2a_layout(tp=8, cp=2, dp=4), LLAMA, 64)


def test_the_layout_says_and_round_trips_its_exchange():
    p = a2a_layout()
    assert "cp4(a2a)" in p.describe() and "a2a" not in a2a_layout(cp_comm="p2p").describe()
    assert decode(encode([p]))[0] == p and encode([p])["cp_comm"][0] == A2A
    assert ParallelConfig(cp=1, cp_comm="a2a").cp_comm == "p2p"  # nothing is exchanged
    assert ParallelConfig.from_dict(p.to_dict()) == p
    from dayzero.cli.next_steps import layout_flags
    from dayzero.specs.plan_layout import layout_of

    assert "--cp-comm a2a" in " ".join(layout_flags(p.to_dict()))
    assert layout_of(p.to_dict(), 64, 32768).cp_comm == "a2a"


def test_engines_run_the_exchanges_their_code_has():
    """DeepSpeed runs only Ulysses, torchtitan only the ring, Megatron-Core both."""
    a2a, ring = a2a_layout(), a2a_layout(cp_comm="p2p")
    assert "deepspeed" in engines_for(a2a) and "torchtitan" not in engines_for(a2a) and "megatron" in engines_for(a2a)
    assert "deepspeed" not in engines_for(ring)
    assert "torchtitan" in engines_for(replace(ring, zero=3, sequence_parallel=True))
    assert any("not ring attention" in w for w in engine_problems("deepspeed", ring))


GPT3 = load_model("gpt3-175b")  # 96 heads, multi-head (96 KV heads)


@pytest.mark.parametrize("spec, p, faster", [
    # Llama 70B at 32768 tokens, cp 4 inside a node: the ring's hops hide under the attention
    (LLAMA, a2a_layout(), P2P),
    # GPT-3 at 8192 tokens, cp 16 over two nodes: every ring hop crosses the NIC at one peer's
    # bandwidth and the short attention hides little; the all-to-all sends 15/16 of q, k, v, o once
    (GPT3, ParallelConfig(tp=1, cp=16, dp=4, mbs=1, gbs=4, seq=8192, cp_comm="a2a"), A2A),
])
def test_an_open_row_is_timed_with_the_faster_exchange(spec, p, faster):
    """A grid row marked CP_OPEN takes whichever of p2p and a2a gives the shorter step (its step
    is then the faster of the two timed alone); a row not marked keeps its own."""
    p2p, a2a = replace(p, cp_comm="p2p"), p
    g = encode([p2p, p2p])
    g[CP_OPEN] = np.array([True, False])
    ev = evaluate(spec, g, H100)
    alone = [float(evaluate(spec, encode([q]), H100).step_s[0]) for q in (p2p, a2a)]
    assert ev.cp_comm[0] == faster and (alone[1] < alone[0]) == (faster == A2A)
    assert ev.step_s[0] == pytest.approx(min(alone), rel=1e-12)
    assert ev.step_s[1] == pytest.approx(alone[0], rel=1e-12) and ev.cp_comm[1] == P2P


def test_deepspeed_pinned_search_runs_context_parallelism_as_ulysses():
    """DeepSpeed used to refuse every cp > 1 layout; it now runs them as a2a, only where the heads
    split over cp."""
    space = SearchSpace(engine="deepspeed", tp=(1, 2, 8), pp=(1,), cp=(1, 2, 4, 8), mbs=(1,), zero=(3,),
                        recompute=("full",))
    res = search(LLAMA, H100, 64, 32768, space=space, top_k=50)
    layouts = decode(res.candidates)
    assert any(p.cp > 1 for p in layouts)
    assert all(p.cp_comm == "a2a" and layout_rules.problems(p, LLAMA, 64) == [] for p in layouts if p.cp > 1)


def test_an_unpinned_plan_chooses_a2a_where_it_is_faster_and_labels_its_engines():
    """GPT-3 with cp 16 over two nodes (the case above): the unpinned search leaves the exchange
    open, times Ulysses faster, and the plan names the engines that run it (not torchtitan)."""
    space = SearchSpace(tp=(1,), pp=(1,), cp=(16,), mbs=(1,), zero=(3,), recompute=("full",))
    best = plan(GPT3, H100, 4, 8192, space=space)["plans"][0]
    assert (best["parallel"]["cp"], best["parallel"]["cp_comm"]) == (16, "a2a")
    assert "torchtitan" not in best["engines"] and {"megatron", "deepspeed"} <= set(best["engines"])
    pinned = plan(GPT3, H100, 4, 8192, space=replace(space, engine="torchtitan"))["plans"][0]
    assert pinned["parallel"]["cp_comm"] == "p2p"


def test_the_searchs_a2a_peak_is_the_ring_peak_plus_the_buffers_difference():
    """The search prices an open row's a2a peak as its ring peak plus (cp_a2a - cp_ring) x (1 +
    fragmentation budget): both buffers are the same on every pipeline rank, so this is exactly the
    memory model's a2a peak, over layouts with pipelines, recompute, ZeRO-3 and experts."""
    from dayzero.planner.memory.memory import MemoryOptions, a2a_extra_batch, peak_memory_batch

    opts = MemoryOptions()
    for spec in (LLAMA, load_model("mixtral-8x7b")):
        ps = [ParallelConfig(tp=tp, cp=cp, pp=pp, dp=64 // (tp * cp * pp), mbs=mbs, gbs=64, seq=32768, zero=z,
                             recompute=rc, ep=8 if spec.moe else 1)
              for tp in (1, 2) for cp in (1, 2, 4) for pp in (1, 2) for mbs in (1, 2) for z in (1, 3)
              for rc in ("none", "full") if z == 1 or pp == 1]
        ring = peak_memory_batch(spec, encode(ps), H100.memory_bytes, opts)
        a2a = peak_memory_batch(spec, encode([replace(p, cp_comm="a2a") for p in ps]), H100.memory_bytes, opts)
        assert a2a == pytest.approx(ring + a2a_extra_batch(spec, encode(ps), opts), rel=1e-12)
        assert (a2a_extra_batch(spec, encode(ps), opts) > 0).sum() == sum(p.cp > 1 for p in ps)


def test_the_cp_comm_flag_reaches_the_layout_verbs(capsys):
    """``--cp-comm a2a`` on ``dayzero memory`` prices the all-to-all's buffers (160 MiB, as above)."""
    import json

    from dayzero.cli.app import main

    main(["memory", "llama-3.1-70b", "--accelerator", "h100", "--devices", "64", "--tp", "2", "--cp", "4",
          "--cp-comm", "a2a", "--seq", "32768", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert out["parallel"]["cp_comm"] == "a2a" and '"temporary:cp_a2a": 167772160' in json.dumps(out)


def test_a_pinned_exchange_is_the_only_one_searched():
    """``--cp-comm a2a`` (SearchSpace.cp_comm): every cp > 1 layout exchanges by all-to-all, those
    whose heads do not split are not considered; ``--cp-comm p2p``: none does; an unknown name is
    one line naming the valid ones."""
    space = SearchSpace(tp=(1, 2, 8), pp=(1,), cp=(1, 2, 4, 8, 16), mbs=(1,), zero=(3,), recompute=("full",))
    res = search(GPT3, H100, 4, 8192, space=replace(space, cp_comm=("a2a",)), top_k=50)
    layouts = decode(res.candidates)
    assert any(p.cp > 1 for p in layouts) and all(p.cp_comm == "a2a" for p in layouts if p.cp > 1)
    free = search(GPT3, H100, 4, 8192, space=space, top_k=50)
    assert res.considered < free.considered  # cp 16 with tp 8: 12 heads per tp rank do not split 16 ways
    ring = decode(search(GPT3, H100, 4, 8192, space=replace(space, cp_comm=("p2p",)), top_k=50).candidates)
    assert all(p.cp_comm == "p2p" for p in ring)
    with pytest.raises(LayoutError, match="cp_comm must be p2p|a2a"):
        search(GPT3, H100, 4, 8192, space=replace(space, cp_comm=("ring",)))


def test_the_allocator_replay_holds_the_exchange_buffers_of_the_layouts_cp_comm():
    """The one-step replay (planner.memory.replay) allocates the same cp buffers as the memory model
    (memory_terms.cp_buffers): its analytic bytes move by 160 - 32 = 128 MiB from ring to a2a, and
    its requested peak by at most that."""
    from dayzero.planner.memory.memory import MemoryOptions
    from dayzero.planner.memory.replay import simulate_step

    ring, a2a = (simulate_step(LLAMA, p, H100.memory_bytes, MemoryOptions()) for p in (a2a_layout(cp_comm="p2p"),
                                                                                      a2a_layout()))
    assert a2a.analytic_allocated - ring.analytic_allocated == pytest.approx(128 * MIB, abs=1024)
    assert 0 <= a2a.peak_requested - ring.peak_requested <= 128 * MIB + 1024
