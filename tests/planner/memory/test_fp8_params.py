"""FP8 parameter storage (Megatron-LM ``--fp8-param-gather``; Transformer Engine ``fp8_model_init``).

Megatron-LM megatron/training/arguments.py, ``--fp8-param-gather``: "Keep the compute param in fp8
(do not use any other intermediate dtype) and perform the param all-gather in fp8." TE
``fp8_model_init``: modules "hold only FP8 copies of its parameters, as opposed to the default
behavior where both higher precision and FP8 copies are present", useful when the optimizer keeps
the high-precision master weights. Hand count for Llama 3.1 8B (config.json: hidden 4096, 32 layers,
32 heads, 8 KV heads of 128, FFN 14336, vocab 128256, untied):
per layer q, o 4096^2 each + k, v 4096 x 1024 each + 3 x 4096 x 14336 + 2 norms x 4096
= 218,112,000 parameters, x 32 layers = 6,979,584,000; embedding 128256 x 4096 = 525,336,576,
head the same + final norm 4096.
"""

from __future__ import annotations

import pytest

from dayzero.planner.memory.memory import estimate_memory
from dayzero.planner.memory.memory_options import MemoryOptions
from dayzero.planner.perf.comm import CommOptions
from dayzero.planner.perf.perf import PerfOptions, evaluate
from dayzero.specs.cluster import build_cluster
from dayzero.specs.grid import encode
from dayzero.specs.parallel import ParallelConfig
from dayzero.specs.registry import load_model

SPEC = load_model("llama-3.1-8b")
H100 = build_cluster("h100", 8)
LAYERS = 32 * (2 * 4096 ** 2 + 2 * 4096 * 1024 + 3 * 4096 * 14336 + 2 * 4096)
EMB, HEAD = 128256 * 4096, 128256 * 4096 + 4096


def _terms(p, fp8_params):
    return estimate_memory(SPEC, p, H100.memory_bytes, MemoryOptions(fp8_params=fp8_params)).stages[0].terms


def _gather(p, fp8_param_gather):
    ev = evaluate(SPEC, encode([p]), H100, PerfOptions(comm=CommOptions(fp8_param_gather=fp8_param_gather)))
    return next(r for r in ev.inventory_of(0) if r["name"] == "dp param gather (dp_cp)")


def test_layer_count_is_the_hand_count():
    assert LAYERS == 6_979_584_000


def test_fp8_params_store_layer_weights_in_one_byte_with_only_the_transpose_cached():
    """ZeRO-1, dp 8, FP8: decoder weights 1 B/param (not 2), the FP8 cache only the transpose
    (1 B/param, not weight + transpose 2 B); embedding, head, FP32 master and moments unchanged."""
    p = ParallelConfig(tp=1, pp=1, dp=8, mbs=1, gbs=8, seq=4096, zero=1, precision="fp8")
    off, on = _terms(p, False), _terms(p, True)
    assert off["weights:layers"] == 2 * LAYERS and on["weights:layers"] == LAYERS
    assert off["weights:fp8_cache"] == 2 * LAYERS and on["weights:fp8_cache"] == LAYERS
    for k in ("weights:embedding", "weights:head", "optimizer:master", "optimizer:moments", "gradients:layers"):
        assert on[k] == off[k]
    assert on["weights:embedding"] == 2 * EMB and on["optimizer:master"] == pytest.approx(4 * (LAYERS + EMB + HEAD) / 8,
                                                                                          abs=8)


def test_fp8_params_do_nothing_under_bf16():
    p = ParallelConfig(tp=1, pp=1, dp=8, mbs=1, gbs=8, seq=4096, zero=1, precision="bf16")
    assert _terms(p, True) == _terms(p, False)
    assert _gather(p, True)["bytes"] == _gather(p, False)["bytes"] == 2 * (LAYERS + EMB + HEAD)


def test_fp8_param_gather_sends_layers_in_fp8_and_edges_in_bf16():
    """The ZeRO-1 parameter all-gather: 1 B x 6,979,584,000 + 2 B x (525,336,576 + 525,340,672)
    = 9,080,938,496 B (BF16: 16,060,522,496 B), so it takes less time."""
    p = ParallelConfig(tp=1, pp=1, dp=8, mbs=1, gbs=8, seq=4096, zero=1, precision="fp8")
    off, on = _gather(p, False), _gather(p, True)
    assert off["bytes"] == 16_060_522_496 and on["bytes"] == 9_080_938_496
    assert on["time_s"] < off["time_s"]


def test_zero3_gather_buffer_and_per_layer_gather_halve_for_the_layers():
    """ZeRO-3: the two gathered units in flight are decoder layers of 218,112,000 params: FP8
    weight + transpose 2 B/param (not BF16 + FP8 weight + transpose, 4 B), unless an edge (the
    head, 525,340,672 params x 2 B) is larger; the per-layer gather sends 1 B/param."""
    p = ParallelConfig(tp=1, pp=1, dp=8, mbs=1, gbs=8, seq=4096, zero=3, precision="fp8")
    off, on = _terms(p, False), _terms(p, True)
    assert off["temporary:zero3_gather"] == 2 * HEAD * 4
    assert on["temporary:zero3_gather"] == 2 * max(LAYERS // 32 * 2, HEAD * 2)
    per_layer = {f: next(r for r in evaluate(SPEC, encode([p]), H100, PerfOptions(
        comm=CommOptions(fp8_param_gather=f))).inventory_of(0) if r["name"] == "zero-3 param gather (dp_cp)")
        for f in (False, True)}
    assert per_layer[True]["bytes"] * 2 == pytest.approx(per_layer[False]["bytes"])


def test_megatron_export_writes_the_flag_under_fp8_only():
    from dayzero.export.megatron import export, parallel_from_args

    p = ParallelConfig(tp=1, pp=1, dp=8, mbs=1, gbs=8, seq=4096, zero=1, precision="fp8")
    out = export(SPEC, p, fp8_param_gather=True)
    assert "--fp8-param-gather" in out.command
    assert "--fp8-param-gather" not in export(SPEC, p).command
    bf16 = export(SPEC, p.with_(precision="bf16"), fp8_param_gather=True)
    assert "--fp8-param-gather" not in bf16.command and any("fp8-param-gather" in m for m in bf16.unexpressed)
    z0 = export(SPEC, p.with_(zero=0), fp8_param_gather=True)  # Megatron: distributed optimizer or FSDP only
    assert "--fp8-param-gather" not in z0.command and any("fp8-param-gather" in m for m in z0.unexpressed)
    back, rest = parallel_from_args(out.command[out.command.index("pretrain_gpt.py") + 1:], 8)
    assert back.precision == "fp8" and "--fp8-param-gather" not in rest


def test_allocator_replay_follows_both_options():
    """The one-step allocator replay (planner.memory.replay) reads the same rules: with FP8 parameter
    storage the decoder weights and FP8 cache shrink by 2 x 6,979,584,000 B, with the optimizer
    offloaded the 12 B/param shard (12 x 8,030,261,248 / 8 B) is never allocated, so its requested
    peak falls by those amounts (both held all step), as the analytic model's does."""
    from dayzero.planner.memory.replay import simulate_step

    p = ParallelConfig(tp=1, pp=1, dp=8, mbs=1, gbs=8, seq=4096, zero=1, precision="fp8")
    peaks = {kw: simulate_step(SPEC, p, H100.memory_bytes, MemoryOptions(**dict(kw))).peak_requested
             for kw in ((), (("fp8_params", True),), (("optimizer_offload", True),))}
    assert peaks[()] - peaks[(("fp8_params", True),)] == pytest.approx(2 * LAYERS, abs=1024)
    assert peaks[()] - peaks[(("optimizer_offload", True),)] == pytest.approx(12 * (LAYERS + EMB + HEAD) / 8,
                                                                              abs=1024)
