"""ZeRO-2 under a pipeline schedule: how often a chunk's gradient is reduce-scattered, what stays
unsharded meanwhile, and the allocator mode's fragmentation budget; hand-computed values."""

import pytest

from dayzero.planner.memory.memory import estimate_memory
from dayzero.planner.memory.memory_options import FRAGMENTATION, MemoryOptions
from dayzero.planner.predict import predict
from dayzero.planner.schedule import gradient_windows
from dayzero.specs.cluster import get_cluster
from dayzero.specs.grid import code
from dayzero.specs.parallel import ParallelConfig
from dayzero.specs.registry import load_model

# Llama 3.1 405B per decoder layer under tp 8: (q 16384^2 + k, v 16384 x 1024 + o 16384^2
# + gate, up, down 3 x 16384 x 53248) / 8 + two RMSNorm weights 2 x 16384 replicated
LLAMA_405B_LAYER_TP8 = (2 * 16384**2 + 2 * 16384 * 1024 + 3 * 16384 * 53248) // 8 + 2 * 16384


def _layout(**kw):
    base = dict(tp=8, pp=16, dp=128, vpp=8, mbs=1, gbs=2048, seq=8192, zero=2, recompute="none",
                sequence_parallel=True)
    return ParallelConfig(**{**base, **kw})


@pytest.mark.parametrize("schedule,pp,vpp,m,windows", [
    ("interleaved", 16, 8, 16, 1),  # Llama 3.1 405B: 16 micro-batches = one group of pp
    ("interleaved", 16, 8, 32, 2),  # two groups of pp = 16 contiguous micro-batches per chunk
    ("interleaved", 4, 2, 8, 2),
    ("1f1b", 16, 1, 16, 16),  # one chunk holds every layer: a reduce-scatter per micro-batch
    ("interleaved", 16, 1, 16, 16),  # interleaving with one chunk is 1F1B
    ("gpipe", 4, 2, 8, 1),  # all backwards of a chunk together
    ("gpipe", 4, 1, 8, 8),
    ("dualpipev", 8, 2, 16, 16),
])
def test_gradient_windows(schedule, pp, vpp, m, windows):
    """Megatron-Core's interleaved schedule runs micro-batches in groups of
    microbatch_group_size_per_vp_stage = pp per chunk (model_parallel_config.py), so a chunk's
    backward passes are contiguous in groups of pp: m / pp windows; vpp 1: m."""
    assert int(gradient_windows(code("schedule", schedule), pp, vpp, m)) == windows


def test_zero2_interleaved_holds_one_chunk_of_fp32_gradients_and_reduces_once():
    """Llama 3.1 405B on its published layout (Llama Team 2024, Table 4: tp 8, pp 16, dp 128, 16
    micro-batches; vpp 8 = one layer per chunk) under ZeRO-2 (FSDP sharding gradients and optimizer
    states, sec. 3.3.2): while a chunk's 16 backward passes run, its FP32 gradient is unsharded,
    4 B x 398,491,648 = 1,593,966,592 B (more than two 128M-element DP buckets, 1,073,741,824 B);
    the rank's gradients are reduce-scattered once per step, not once per micro-batch."""
    spec, cluster = load_model("llama-3.1-405b"), get_cluster("dgx-h100-16384")
    p = _layout()
    stage = estimate_memory(spec, p.with_(layer_split=(0,) + (1,) * 126 + (0,)), cluster.memory_bytes).stages[1]
    assert stage.terms["temporary:grad_reduce"] == 4 * LLAMA_405B_LAYER_TP8
    assert LLAMA_405B_LAYER_TP8 == 398_491_648
    comm = {c["name"]: c for c in predict(spec, p, cluster)["communication"]}
    rs = comm["dp grad reduce (dp_cp)"]
    # 8 layers on the busiest rank (the step-time model divides the norms by tp too: 3 in 10^4)
    assert rs["count"] == 1 and rs["bytes"] == pytest.approx(4 * 8 * LLAMA_405B_LAYER_TP8, rel=1e-4)
    one_f_one_b = {c["name"]: c for c in predict(spec, p.with_(vpp=1, schedule="1f1b"), cluster)["communication"]}
    assert one_f_one_b["dp grad reduce (dp_cp)"]["count"] == 16  # 1F1B: every micro-batch


def test_zero2_interleaved_is_not_slower_than_zero1_and_holds_less():
    """With one reduce-scatter per step ZeRO-2 moves ZeRO-1's bytes: same step time, 12.65 GB less
    gradient memory on the busiest rank (FP32 8 x 398,491,648 x (1 - 1/128))."""
    spec, cluster = load_model("llama-3.1-405b"), get_cluster("dgx-h100-16384")
    z1, z2 = predict(spec, _layout(zero=1), cluster), predict(spec, _layout(), cluster)
    assert z2["time"]["step_s"] == pytest.approx(z1["time"]["step_s"], rel=1e-9)
    g1, g2 = (max(p["memory"]["stages"], key=lambda s: s["total"])["gradients"] for p in (z1, z2))
    assert g1 - g2 == pytest.approx(4 * 8 * LLAMA_405B_LAYER_TP8 * (1 - 1 / 128), rel=1e-6)


def test_the_fragmentation_budget_follows_the_allocator_mode():
    """10 % of the activation and temporary bytes under the caching allocator, 1.6 % under
    expandable segments (the mean replayed slack over the published runs,
    benchmarks/bench_fragmentation.py); an explicit budget wins."""
    assert MemoryOptions().fragmentation_budget == FRAGMENTATION["caching"] == 0.10
    assert MemoryOptions(allocator="expandable").fragmentation_budget == FRAGMENTATION["expandable"] == 0.016
    assert MemoryOptions(allocator="expandable", fragmentation=0.05).fragmentation_budget == 0.05
    spec, cluster = load_model("llama-3.1-405b"), get_cluster("dgx-h100-16384")
    p = _layout(layer_split=(0,) + (1,) * 126 + (0,))
    st = estimate_memory(spec, p, cluster.memory_bytes, MemoryOptions(allocator="expandable")).stages[1]
    assert st.terms["overhead:fragmentation"] == pytest.approx(0.016 * (st.activations + st.temporary), abs=2)


def test_the_replay_holds_a_chunk_gradient_per_window_and_stays_under_the_analytic_total():
    """The allocator replay of the same layout (ZeRO-2, interleaved, one window) allocates each
    chunk's FP32 gradient at its first backward and frees it after the window's last one: its peak
    lies between the held state and the analytic total, and above what the per-layer buckets alone
    would reach (the held state plus 1,593,966,592 B for the chunk being reduced)."""
    from dayzero.planner.memory.replay import simulate_step

    spec, cluster = load_model("llama-3.1-405b"), get_cluster("dgx-h100-16384")
    p = _layout(layer_split=(0,) + (1,) * 126 + (0,))
    sim = simulate_step(spec, p, cluster.memory_bytes)
    st = estimate_memory(spec, p, cluster.memory_bytes).stages[sim.rank]
    held = st.weights + st.gradients + st.optimizer + st.activations
    assert held + 4 * LLAMA_405B_LAYER_TP8 <= sim.peak_requested <= sim.analytic_allocated
