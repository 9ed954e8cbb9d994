"""Planner physics against hand-computed values, each with its source."""

import pytest

from dayzero.planner.perf.comm import CommOptions
from dayzero.planner.perf.perf import PerfOptions
from dayzero.planner.predict import predict
from dayzero.specs.cluster import build_cluster
from dayzero.specs.parallel import ParallelConfig
from dayzero.specs.registry import load_model

LLAMA_8B_PARAMS = 8_030_261_248  # meta-llama/Llama-3.1-8B, every tensor of the checkpoint (model_configs.json)


def _grad_reduce(options=None):
    spec = load_model("llama-3.1-8b")
    p = ParallelConfig(dp=16, gbs=64, seq=4096, zero=1)
    obj = predict(spec, p, build_cluster("h100", 16), options)
    (rs,) = [c for c in obj["communication"] if c["name"].startswith("dp grad reduce")]
    return rs


def test_gradients_are_reduced_in_fp32_by_default():
    """Megatron-LM reduces BF16 runs' gradients in FP32 unless --grad-reduce-in-bf16
    (arguments.py: grad_reduce_in_fp32 follows --bf16), Llama 3 reduce-scattered in FP32 (Llama
    Team 2024, sec. 3.3.2), dayzero's runtime uses FSDP2 reduce_dtype=float32. ZeRO-1 over dp 16:
    one reduce-scatter of every gradient, 8,030,261,248 x 4 B = 32,121,044,992 B."""
    rs = _grad_reduce()
    assert rs["collective"] == "reduce_scatter" and rs["group_size"] == 16
    assert rs["bytes"] == LLAMA_8B_PARAMS * 4


def test_bf16_gradient_reduction_halves_the_bytes():
    rs32, rs16 = _grad_reduce(), _grad_reduce(PerfOptions(comm=CommOptions(grad_reduce_bytes=2)))
    assert rs16["bytes"] == LLAMA_8B_PARAMS * 2
    assert rs16["time_s"] < rs32["time_s"]
    assert rs32["time_s"] == pytest.approx(2 * rs16["time_s"], rel=0.05)  # bandwidth-bound at 32 GB


def test_single_member_groups_cost_nothing_and_warn_nothing():
    """A group of one moves no bytes; numpy must not warn about 0/0 on the masked lane."""
    import warnings

    import numpy as np

    from dayzero.planner.perf.collectives import all_to_all_mesh

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        t = all_to_all_mesh(np.array([1e6, 1e6]), np.array([1, 8]), 50e9, 400e9, 1e-5)
    # n = 8 on a mesh: max(busiest pair 1e6/8/50e9, aggregate 7/8 x 1e6 / min(400e9, 7 x 50e9)) + alpha
    assert t[0] == 0.0 and t[1] == pytest.approx(1e-5 + 7 / 8 * 1e6 / 350e9)
