"""The collectives issue #16 found missing: the sequence-parallel re-gather for the weight gradient,
the shared experts' TP pair, the gradient-norm all-reduce, the tied-embedding gradient sync, the MoE
token-count exchange and ZeRO-3's first gather per model chunk. Each expected value is computed by
hand from the alpha-beta forms in :mod:`dayzero.planner.perf.collectives` (Thakur et al. 2005) with the
H100 cluster's achievable rates (NVLink 370 GB/s, 10 us per step; NIC 45 GB/s, 20 us per step)."""

from __future__ import annotations

from dataclasses import replace
from math import ceil, log2

import pytest

from dayzero.planner.perf.calibration import PerfConstants, constants_for, rates
from dayzero.planner.perf.comm import COUNT_BYTES, GRAD_NORM_BYTES
from dayzero.planner.perf.perf import evaluate
from dayzero.specs.cluster import build_cluster
from dayzero.specs.grid import encode
from dayzero.specs.parallel import ParallelConfig
from dayzero.specs.registry import load_model

LLAMA = load_model("llama-3.1-70b")
QWEN = load_model("qwen3-235b-a22b")  # 94 MoE layers, no shared experts, untied
GPT3 = load_model("gpt3-175b")  # tied embeddings
H100 = build_cluster("h100", 64)
R = rates(H100, constants_for(H100))


def rows(spec, p, cluster=H100):
    ev = evaluate(spec, encode([p]), cluster, layer_split=p.layer_split)
    return {r["name"]: r for r in ev.inventory_of(0)}


def ring_ag(nbytes, n, link):
    """(n-1) alpha + (n-1)/n B / bw."""
    return (n - 1) * link.alpha + (n - 1) / n * nbytes / link.bw


def all_reduce(nbytes, n, link):
    """min(ring 2 (n-1) alpha + 2 (n-1)/n B / bw, tree 2 ceil(log2 n) alpha + 2 B / bw)."""
    return min(2 * (n - 1) * link.alpha + 2 * (n - 1) / n * nbytes / link.bw,
               2 * ceil(log2(n)) * link.alpha + 2 * nbytes / link.bw)


def test_sequence_parallel_regathers_each_column_linear_input_for_the_weight_gradient():
    """Korthikanti et al. 2022 sec. 4.2.2: with sequence parallelism the column-parallel linears
    (QKV, FC1) keep a 1/tp shard of their input and all-gather it again in the backward. Llama 70B,
    tp 8 inside one node, 80 layers, m = 16 micro-batches of 4096 tokens: 2 re-gathers per layer
    -> 2 x 80 x 16 = 2560, each of the full 4096 x 8192 x 2 B = 64 MiB activation, a ring
    all-gather over 8 ranks; next to the 4 x 80 x 16 forward/backward all-gathers. Without
    sequence parallelism (all-reduces) there is none."""
    p = ParallelConfig(tp=8, pp=1, dp=8, mbs=1, gbs=128, seq=4096, sequence_parallel=True)
    r = rows(LLAMA, p)
    re = r["tp sp re-gather (wgrad)"]
    nbytes = 4096 * 8192 * 2
    assert re["count"] == 2560 and r["tp all-gather"]["count"] == 5120
    assert re["bytes"] == nbytes
    assert re["time_s"] == pytest.approx(ring_ag(nbytes, 8, R.intra), rel=1e-12)
    assert 0 <= re["exposed_s"] <= re["total_s"] and re["hidden_by"] == "dgrad GEMMs"
    assert "tp sp re-gather (wgrad)" not in rows(LLAMA, replace(p, sequence_parallel=False))


def test_regather_is_exposed_only_beyond_the_dgrad_gemms_it_overlaps():
    """Megatron-Core issues the re-gather asynchronously before the input-gradient GEMM: the
    exposed part is max(0, regathers - dgrad GEMMs). Short sequences (256 tokens) make the GEMMs
    small next to the per-step latency, so some of it shows; long ones (8192) hide it."""
    short = rows(LLAMA, ParallelConfig(tp=8, pp=1, dp=8, mbs=1, gbs=64, seq=256, sequence_parallel=True))
    long = rows(LLAMA, ParallelConfig(tp=8, pp=1, dp=8, mbs=1, gbs=64, seq=8192, sequence_parallel=True))
    assert short["tp sp re-gather (wgrad)"]["exposed_s"] > 0
    assert long["tp sp re-gather (wgrad)"]["exposed_s"] < short["tp sp re-gather (wgrad)"]["total_s"]


def test_shared_experts_add_their_own_tp_pair_to_each_moe_layer():
    """Megatron-Core's SharedExpertMLP is a tp-parallel MLP on the layer input: per MoE layer and
    forward one more all-gather and reduce-scatter (sequence parallel). Qwen3-235B (94 MoE layers,
    etp 1) on tp 2, pp 2 (47 layers per rank), m = 8: all-gathers per layer 2 -> 4 (forward +
    backward), so 2 x 47 x 8 = 752 -> 1504; re-gathers 1 -> 2 per layer: 376 -> 752."""
    p = ParallelConfig(tp=2, pp=2, dp=16, mbs=1, gbs=128, seq=4096, sequence_parallel=True)
    plain = rows(QWEN, p)
    shared_spec = replace(QWEN, moe=replace(QWEN.moe, shared_experts=1, shared_intermediate=1536))
    shared = rows(shared_spec, p)
    assert plain["tp all-gather"]["count"] == 752 and shared["tp all-gather"]["count"] == 1504
    assert plain["tp sp re-gather (wgrad)"]["count"] == 376 and shared["tp sp re-gather (wgrad)"]["count"] == 752
    assert shared["tp reduce-scatter"]["count"] == 1504


def test_grad_norm_is_one_scalar_all_reduce_over_the_world_with_a_sharded_optimizer():
    """One FP32 scalar per step (Megatron-Core get_grad_norm_fp32). ZeRO-1 on 64 ranks = 8 nodes:
    hierarchical, 2 RS inside (8 ranks) + an all-reduce of B/8 over 8 nodes; ZeRO-0 tp 4 x pp 2 =
    8 ranks inside one node (the model-parallel group): min(ring, tree) over NVLink."""
    b = GRAD_NORM_BYTES
    assert b == 4
    z1 = rows(LLAMA, ParallelConfig(tp=8, pp=1, dp=8, mbs=1, gbs=64, seq=4096, zero=1))["grad-norm all-reduce"]
    want = 2 * ring_ag(b, 8, R.intra) + all_reduce(b / 8, 8, R.inter)
    assert z1["count"] == 1 and z1["group_size"] == 64
    assert z1["time_s"] == pytest.approx(want, rel=1e-12) and z1["exposed_s"] == pytest.approx(want, rel=1e-12)
    z0 = rows(LLAMA, ParallelConfig(tp=4, pp=2, dp=8, mbs=1, gbs=64, seq=4096, zero=0))["grad-norm all-reduce"]
    assert z0["group_size"] == 8 and z0["time_s"] == pytest.approx(all_reduce(b, 8, R.intra), rel=1e-12)


def test_tied_embedding_gradients_are_summed_between_first_and_last_stage():
    """GPT-3 175B ties input and output embeddings: with pp > 1 both end stages hold a copy and
    all-reduce its gradient (FP32, 50257 x 12288 / tp elements) once per step. pp 8 with tp 8 on
    8-GPU nodes puts the stages on different nodes: a 2-member all-reduce over the NIC, the ring
    2 alpha + B / bw. pp 1 or an untied model: none."""
    p = ParallelConfig(tp=8, pp=8, dp=1, mbs=1, gbs=64, seq=2048)
    tied = rows(GPT3, p)["tied embedding grad all-reduce"]
    nbytes = 50257 * 12288 / 8 * 4
    assert tied["bytes"] == pytest.approx(nbytes) and tied["count"] == 1 and tied["tier"] == "scale-out"
    assert tied["exposed_s"] == pytest.approx(2 * R.inter.alpha + nbytes / R.inter.bw, rel=1e-12)
    assert "tied embedding grad all-reduce" not in rows(GPT3, replace(p, pp=1, dp=8))
    assert "tied embedding grad all-reduce" not in rows(LLAMA, replace(p, pp=8))


def test_moe_token_counts_are_all_gathered_before_each_dispatch():
    """Megatron-Core's all-to-all dispatcher all-gathers the per-expert counts (int64) over the
    expert group before each dispatch; the backward reuses them. Qwen3-235B, ep 8 in one node,
    pp 2 (47 MoE layers per rank), m = 8: 47 x 8 = 376 per step, each 8 x 128 x 8 B gathered,
    7 x 10 us + 7/8 x 8 KiB / 370 GB/s, and the host then waits for them (PerfConstants.moe_sync_s:
    Megatron-Core's cuda_sync_point before the EP all-to-all); under full recompute twice as many."""
    p = ParallelConfig(tp=1, pp=2, dp=32, ep=8, mbs=1, gbs=256, seq=4096)
    counts = rows(QWEN, p)["ep token counts"]
    nbytes = 8 * 128 * COUNT_BYTES
    assert counts["count"] == 376 and counts["bytes"] == nbytes
    assert counts["time_s"] == pytest.approx(ring_ag(nbytes, 8, R.intra) + PerfConstants().moe_sync_s, rel=1e-12)
    assert counts["exposed_s"] == pytest.approx(376 * counts["time_s"], rel=1e-12)
    assert rows(QWEN, replace(p, recompute="full"))["ep token counts"]["count"] == 752
    assert "ep token counts" not in rows(QWEN, replace(p, ep=1))


def test_zero3_first_gather_is_exposed_once_per_model_chunk():
    """ZeRO-3 prefetches the next layer inside a chunk, not across chunks: with interleaving each
    of the vpp chunks a rank runs exposes its first gather, m x vpp per step (vpp 1: m)."""
    p = ParallelConfig(tp=1, pp=2, dp=32, vpp=1, mbs=1, gbs=128, seq=4096, zero=3)
    one = rows(LLAMA, p)["zero-3 first gather"]
    four = rows(LLAMA, replace(p, vpp=4))["zero-3 first gather"]
    assert one["count"] == 4 and four["count"] == 16
    assert four["exposed_s"] == pytest.approx(16 * four["time_s"], rel=1e-12)


def test_unfused_attention_costs_memory_as_well_as_time():
    """``--attention-kernel unfused`` (plain matmul + softmax) keeps the s x s probabilities of
    every layer for the backward, BF16 (b a s^2 x 2 B per layer; Korthikanti et al. 2022 sec. 4.1,
    without dropout) where FlashAttention keeps an FP32 log-sum-exp per row (Dao et al. 2022,
    sec. 3.1). Llama 3.1 8B, 32 layers, 32 heads, one 4096-token sequence per device: the peak
    rises by at least 32 x (2 x 32 x 4096^2 - 4 x 32 x 4096) B = 34.4 GB, and the step is slower."""
    from dayzero.planner.perf.perf import PerfOptions
    from dayzero.planner.predict import predict

    spec, cluster = load_model("llama-3.1-8b"), build_cluster("h100", 8)
    p = ParallelConfig(tp=1, pp=1, dp=8, mbs=1, gbs=8, seq=4096)
    fused = predict(spec, p, cluster, PerfOptions())
    unfused = predict(spec, p, cluster, PerfOptions(attention_kernel="unfused"))
    stored = 32 * (2 * 32 * 4096 ** 2 - 4 * 32 * 4096)
    grown = unfused["memory"]["peak_bytes"] - fused["memory"]["peak_bytes"]
    assert stored <= grown < 2 * stored
    assert unfused["time"]["step_s"] > fused["time"]["step_s"]
