"""Step-time model: consistency (vectorised == one at a time), structure, and physical trends."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from dayzero.planner.perf.calibration import PerfConstants
from dayzero.planner.perf.comm import CommOptions
from dayzero.planner.perf.perf import PerfOptions, evaluate
from dayzero.specs.cluster import build_cluster, cluster_from_dict
from dayzero.specs.counting import flops_per_token
from dayzero.specs.grid import UNREPLAYED, encode
from dayzero.specs.parallel import ParallelConfig
from dayzero.specs.registry import load_model

LLAMA = load_model("llama-3.1-70b")
MOE = load_model("qwen3-235b-a22b")
H100 = build_cluster("h100", 64)


def one(spec, p, cluster=H100, options=None):
    ev = evaluate(spec, encode([p]), cluster, options, layer_split=p.layer_split)
    return {k: float(getattr(ev, k)[0]) for k in ("step_s", "compute_s", "comm_exposed_s", "bubble_s", "optimizer_s",
                                                  "straggler_s", "tokens_per_s_per_device", "mfu", "microbatch_s",
                                                  "comm_ratio")}, ev


LAYOUTS = [
    ParallelConfig(tp=4, pp=4, dp=4, vpp=5, mbs=1, gbs=128, seq=8192, sequence_parallel=True, precision="fp8"),
    ParallelConfig(tp=8, pp=1, dp=8, mbs=2, gbs=256, seq=4096, zero=3, recompute="full", sequence_parallel=True),
    ParallelConfig(tp=2, pp=2, dp=8, cp=2, mbs=1, gbs=64, seq=8192, zero=0, recompute="selective"),
    ParallelConfig(tp=1, pp=8, dp=8, mbs=1, gbs=512, seq=4096, zero=2),
]


def test_vectorised_equals_one_at_a_time():
    by_seq = {}
    for p in LAYOUTS:
        by_seq.setdefault(p.seq, []).append(p)
    for seq, items in by_seq.items():
        ev = evaluate(LLAMA, encode(items), H100)
        for i, p in enumerate(items):
            single, _ = one(LLAMA, p)
            assert ev.step_s[i] == pytest.approx(single["step_s"], rel=1e-12)
            assert ev.comm_exposed_s[i] == pytest.approx(single["comm_exposed_s"], rel=1e-12, abs=1e-15)


def test_step_is_the_sum_of_its_terms_and_bubble_follows_1f1b():
    for p in LAYOUTS:
        r, _ = one(LLAMA, p)
        assert r["step_s"] == pytest.approx(r["compute_s"] + r["comm_exposed_s"] + r["bubble_s"] + r["optimizer_s"]
                                            + r["straggler_s"], rel=1e-12)
        assert r["bubble_s"] == pytest.approx((p.pp - 1) / p.vpp * r["microbatch_s"], rel=1e-12)
        assert r["tokens_per_s_per_device"] == pytest.approx(p.gbs * p.seq / r["step_s"] / p.world, rel=1e-12)


def test_mfu_is_model_flops_over_the_precision_peak():
    p = LAYOUTS[0]
    r, _ = one(LLAMA, p)
    model = flops_per_token(LLAMA, p.seq, causal=True).train
    assert r["mfu"] == pytest.approx(r["tokens_per_s_per_device"] * model / H100.accelerator.peak("fp8"), rel=1e-12)


def test_interleaving_shrinks_the_bubble():
    base = ParallelConfig(tp=4, pp=4, dp=4, mbs=1, gbs=128, seq=8192, sequence_parallel=True)
    plain, _ = one(LLAMA, base)
    inter, _ = one(LLAMA, base.with_(vpp=5, schedule="interleaved"))
    assert inter["bubble_s"] < plain["bubble_s"] / 4


def test_recompute_costs_time():
    p = ParallelConfig(tp=8, pp=2, dp=4, mbs=1, gbs=64, seq=8192, sequence_parallel=True)
    t = [one(LLAMA, p.with_(recompute=r))[0]["step_s"] for r in ("none", "selective", "full")]
    assert t[0] < t[1] < t[2]
    assert t[2] / t[0] == pytest.approx(4 / 3, rel=0.15)  # one more forward: ~4/3 of the work


def test_fp8_and_fp4_speed_up_gemms_only_where_the_hardware_has_them():
    p = ParallelConfig(tp=8, pp=1, dp=8, mbs=1, gbs=64, seq=4096, sequence_parallel=True)
    bf16 = one(LLAMA, p)[0]["compute_s"]
    fp8 = one(LLAMA, p.with_(precision="fp8"))[0]["compute_s"]
    assert fp8 < 0.8 * bf16
    a100 = build_cluster("a100", 64)
    assert one(LLAMA, p, a100)[0]["step_s"] == pytest.approx(one(LLAMA, p.with_(precision="fp8"), a100)[0]["step_s"],
                                                             rel=0.02)
    gb300 = build_cluster("gb300", 64)
    # without TP overlap: with it this tp 8 layout is TP-bound on GB300, its GEMMs hidden under the
    # collectives either way (planner.perf.comm.tp_overlapped), so FP4 and FP8 steps tie
    no = PerfOptions(comm=CommOptions(tp_overlap=False))
    assert one(LLAMA, p.with_(precision="fp4"), gb300, options=no)[0]["step_s"] < one(
        LLAMA, p.with_(precision="fp8"), gb300, options=no)[0]["step_s"]


def test_tp_overlap_hides_tp_communication():
    """Pinned on, TP overlap hides TP collectives behind the GEMMs; left to the model (None, the
    default) it is on exactly where Megatron-Core runs --tp-comm-overlap: tp > 1 with sequence
    parallelism (megatron/training/arguments.py asserts it), so without sequence parallelism the
    default prices the all-reduces exposed."""
    p = ParallelConfig(tp=8, pp=1, dp=8, mbs=1, gbs=64, seq=8192, sequence_parallel=True)
    off = one(LLAMA, p, options=PerfOptions(comm=CommOptions(tp_overlap=False)))[0]
    on = one(LLAMA, p, options=PerfOptions(comm=CommOptions(tp_overlap=True)))[0]
    assert on["comm_exposed_s"] < off["comm_exposed_s"]
    assert on["step_s"] < off["step_s"]
    assert one(LLAMA, p)[0]["step_s"] == on["step_s"]  # searched: on under sequence parallelism
    plain = p.with_(sequence_parallel=False)
    assert one(LLAMA, plain)[0]["step_s"] == one(LLAMA, plain, options=PerfOptions(
        comm=CommOptions(tp_overlap=False)))[0]["step_s"]


def test_tp_overlap_rule_engines_and_export():
    """comm.tp_overlapped: None -> tp > 1 and sequence parallel; True -> every tp > 1 row; False ->
    none. A search pinned to an engine without TP overlap (DeepSpeed, dayzero's runtime) prices none
    (engines.with_engine_overlaps), Megatron and torchtitan keep it; the runtime prices no EP overlap
    either; Megatron's export writes
    --tp-comm-overlap where the planner priced it and reads it back as the same layout."""
    import numpy as np

    from dayzero.export import megatron
    from dayzero.planner.engines import with_engine_overlaps
    from dayzero.planner.perf.comm import tp_overlapped
    from dayzero.specs.grid import encode

    rows = [ParallelConfig(tp=1, dp=8, gbs=64), ParallelConfig(tp=8, dp=1, gbs=64),
            ParallelConfig(tp=8, dp=1, gbs=64, sequence_parallel=True)]
    g = encode(rows)
    assert list(tp_overlapped(g, CommOptions())) == [0, 0, 1]
    assert list(tp_overlapped(g, CommOptions(tp_overlap=True))) == [0, 1, 1]
    assert not np.any(tp_overlapped(g, CommOptions(tp_overlap=False)))
    for engine, kept in (("deepspeed", False), ("dayzero", False), ("megatron", None), ("torchtitan", None),
                         (None, None)):
        assert with_engine_overlaps(PerfOptions(), engine).comm.tp_overlap is kept
    # the EP overlap likewise where an engine is known to have none (dayzero's runtime: a plain all-to-all)
    assert with_engine_overlaps(PerfOptions(), "dayzero").comm.ep_overlap is False
    assert with_engine_overlaps(PerfOptions(), "megatron").comm.ep_overlap is None
    assert with_engine_overlaps(PerfOptions(comm=CommOptions(tp_overlap=True)), "deepspeed").comm.tp_overlap
    args = [str(a) for a in megatron.layout_args(rows[2])]
    assert "--tp-comm-overlap" in args and "--tp-comm-overlap" not in [str(a) for a in megatron.layout_args(rows[1])]
    back, rest = megatron.parallel_from_args(args, world=8)
    assert back == rows[2] and "--tp-comm-overlap" not in rest


def test_inventory_lists_each_parallel_dim_and_never_exposes_more_than_it_sends():
    p = ParallelConfig(tp=2, pp=2, dp=4, cp=2, ep=8, mbs=1, gbs=64, seq=8192, sequence_parallel=True)
    _, ev = one(MOE, p)
    rows = ev.inventory_of(0)
    dims = {r["dim"] for r in rows}
    assert {"tp", "cp", "ep", "pp", "dp_cp"} <= dims
    for r in rows:
        assert 0 <= r["exposed_s"] <= r["total_s"] + 1e-12, r
        assert r["count"] > 0 and r["bytes"] > 0
    ep = next(r for r in rows if r["dim"] == "ep")
    assert ep["tier"] == "scale-up" and ep["group_size"] == 8


def test_all_to_all_on_a_full_mesh_costs_more_than_behind_a_switch():
    """The same MoE layout on 8-card boards of equal aggregate bandwidth: HCCS-style full mesh
    versus a switch. Expert parallelism over 4 cards uses 3 of the mesh's 7 links."""
    mesh = cluster_from_dict({"accelerator": "910b", "nodes": 8, "topology": "mesh"}, "mesh")
    switch = cluster_from_dict({"accelerator": "910b", "nodes": 8, "topology": "switch",
                                "intra_node_p2p_gbytes_per_s": 392}, "switch")
    p = ParallelConfig(tp=1, pp=1, dp=64, ep=4, mbs=1, gbs=64, seq=4096)
    m = {r["dim"]: r for r in one(MOE, p, mesh)[1].inventory_of(0)}["ep"]
    s = {r["dim"]: r for r in one(MOE, p, switch)[1].inventory_of(0)}["ep"]
    assert m["time_s"] > 2 * s["time_s"]


def test_constants_change_predictions_as_expected():
    p = LAYOUTS[0]
    base = one(LLAMA, p)[0]["step_s"]
    slow = PerfOptions(constants=replace(PerfConstants(), gemm_scale_fp8=PerfConstants().gemm_scale_fp8 / 2))
    assert one(LLAMA, p, options=slow)[0]["step_s"] > 1.3 * base


def test_cluster_calibration_overrides_catalog_rates():
    from dayzero.errors import ConfigError
    from dayzero.planner.perf.calibration import constants_for, rates

    cl = cluster_from_dict({"accelerator": "h100", "nodes": 2, "efficiency": {"gemm": 0.5, "intra": 0.7}}, "cal")
    r = rates(cl, constants_for(cl))
    assert r.gemm_eff["bf16"] == 0.5
    assert r.intra.bw == pytest.approx(450e9 * 0.7)
    default = rates(H100, constants_for(H100))
    assert default.intra.bw == pytest.approx(370e9)  # catalog's measured ring bus bandwidth
    bad = cluster_from_dict({"accelerator": "h100", "nodes": 2, "efficiency": {"gemmm": 0.5}}, "bad")
    with pytest.raises(ConfigError, match="unknown efficiency key"):
        constants_for(bad)


def test_recompute_layers_predict_equals_the_grid_row_and_is_linear_in_n():
    """Full recompute of the first N layers of each chunk (the grid's recompute_layers) replays N
    layers' forward and collectives per chunk: tiny-llama on pp 2 (2 layers a stage) with N = 1
    costs the mean of no replay and full replay of both layers (ep 1: no EP overlap, which full
    granularity switches off, so only the replay differs). predict (one layout) equals the batch row."""
    from dayzero.planner.predict import predict

    spec = load_model("tiny-llama")
    base = dict(tp=1, pp=2, dp=32, gbs=64, recompute="full")
    layouts = [ParallelConfig(**base, recompute_layers=1), ParallelConfig(**base),
               ParallelConfig(**base, recompute_layers=2)]
    ev = evaluate(spec, encode(layouts), H100)
    # the "no replay" reference: the same full-granularity layout with its replay taken out
    plain = evaluate(spec, {**encode(layouts[1:2]), UNREPLAYED: np.array([True])}, H100)
    assert plain.step_s[0] < ev.step_s[1]
    assert ev.step_s[0] == pytest.approx((ev.step_s[1] + plain.step_s[0]) / 2, rel=1e-12)
    assert ev.step_s[2] == ev.step_s[1]  # N = the chunk's layers: every layer
    assert predict(spec, layouts[0], H100)["time"]["step_s"] == pytest.approx(ev.step_s[0], rel=1e-12)


def test_recompute_layers_time_is_linear_in_n_on_a_moe_model():
    """DeepSeek-V3 on pp 8 (8 layers a stage, the first 3 dense): each layer more in the replayed
    block of every chunk adds the same seconds (the slowest rank's layers are alike)."""
    spec = load_model("deepseek-v3")
    base = dict(pp=8, dp=8, ep=8, gbs=128, recompute="full")
    ev = evaluate(spec, encode([ParallelConfig(**base, recompute_layers=n) for n in (1, 2, 3, 4)]), H100)
    steps = np.diff(ev.step_s)
    assert steps[0] > 0
    np.testing.assert_allclose(steps, steps[0], rtol=1e-9)
