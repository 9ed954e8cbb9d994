"""Optimizer CPU offload (Megatron-Core ``--optimizer-cpu-offload``; ZeRO-Offload, arXiv 2101.06840).

Hand count, Llama 3.1 8B (8,030,261,248 parameters: tests/planner/memory/test_fp8_params.py), ZeRO-1 over
dp 8: a shard of 1,003,782,656 parameters per device. Host Adam: 28 B/param (read master, grad, m, v;
write master, m, v; Kingma & Ba 2015, Alg. 1) over 76.8 GB/s (a DGX H100's 2 x 8 DDR5-4800
channels, 2 x 307.2 GB/s, shared by 8 GPUs) = 0.36596 s; PCIe Gen5 x16 per direction 32 GT/s x 16 x
128/130 / 8 = 63.015 GB/s carries the FP32 gradient down and the BF16 parameter up, 6 B/param =
0.09558 s; 0.46154 s in all, in place of the on-device 30 B/param over HBM.
"""

from __future__ import annotations

import pytest

from dayzero.planner.memory.memory import estimate_memory
from dayzero.planner.memory.memory_options import MemoryOptions
from dayzero.planner.memory.offload import HOST_MEMORY_BW_PER_DEVICE, PCIE_GEN5_X16_BW, offloaded_optimizer_s
from dayzero.planner.perf.perf import PerfOptions, evaluate
from dayzero.specs.cluster import build_cluster
from dayzero.specs.grid import encode
from dayzero.specs.parallel import ParallelConfig
from dayzero.specs.registry import load_model

SPEC = load_model("llama-3.1-8b")
H100 = build_cluster("h100", 8)
P = ParallelConfig(tp=1, pp=1, dp=8, mbs=1, gbs=8, seq=4096, zero=1)
SHARD = 8_030_261_248 / 8


def test_constants_are_the_sourced_figures():
    assert PCIE_GEN5_X16_BW == pytest.approx(63.015e9, rel=1e-4)
    assert HOST_MEMORY_BW_PER_DEVICE == pytest.approx(76.8e9)


def test_offloaded_step_is_host_adam_plus_pcie_both_ways():
    want = SHARD * 28 / 76.8e9 + SHARD * 6 / 63.0154e9
    assert want == pytest.approx(0.46154, rel=1e-4)
    assert float(offloaded_optimizer_s(SHARD, 4)) == pytest.approx(want, rel=1e-5)
    on = evaluate(SPEC, encode([P]), H100, PerfOptions(optimizer_offload=True))
    off = evaluate(SPEC, encode([P]), H100, PerfOptions())
    assert float(on.optimizer_s[0]) == pytest.approx(want, rel=1e-5)
    assert float(on.step_s[0] - off.step_s[0]) == pytest.approx(want - float(off.optimizer_s[0]), rel=1e-6)


def test_offloaded_states_leave_device_memory():
    """The FP32 master (4 B) and moments (8 B) of the shard leave: 12 B x 1,003,782,656 = 12.05 GB."""
    off = estimate_memory(SPEC, P, H100.memory_bytes, MemoryOptions())
    on = estimate_memory(SPEC, P, H100.memory_bytes, MemoryOptions(optimizer_offload=True))
    assert off.stages[0].terms["optimizer:master"] == pytest.approx(4 * SHARD, abs=4)
    assert on.stages[0].terms["optimizer:master"] == on.stages[0].terms["optimizer:moments"] == 0
    assert on.stages[0].terms["weights:layers"] == off.stages[0].terms["weights:layers"]
    assert off.peak_bytes - on.peak_bytes == pytest.approx(12 * SHARD, abs=16)


def test_memory_remedies_list_the_options_fp8_storage_first_offload_last():
    """ZeRO-0, dp 8, BF16 on 80 GB H100s: 197 % of capacity; offloading the 12 B/param of FP32 master
    and moments (12 x 8,030,261,248 B = 96.4 GB) brings it to 84.7 %, under the 85 % target. With a
    target every change meets, FP8 parameter storage (FP8 runs only) comes first and the offload last."""
    from dayzero.planner.search.remedies import single_changes

    p = P.with_(zero=0)
    opts = MemoryOptions.for_run(H100.accelerator)
    base = estimate_memory(SPEC, p, H100.memory_bytes, opts)
    fixes = {f.change: f for f in single_changes(SPEC, p, 8, H100.memory_bytes, opts, 0.85)}
    off = fixes[("--optimizer-offload",)]
    assert off.option and off.parallel == p
    assert base.peak_bytes - off.peak_bytes == pytest.approx(12 * 8_030_261_248, abs=16)
    everything = single_changes(SPEC, p.with_(precision="fp8"), 8, H100.memory_bytes, opts, 10.0)
    assert everything[0].change == ("--fp8-param-gather",) and everything[-1].change == ("--optimizer-offload",)
    assert ("--fp8-param-gather",) not in {f.change for f in single_changes(SPEC, p, 8, H100.memory_bytes, opts,
                                                                            10.0)}


def test_megatron_export_writes_the_offload_flags_and_reads_them_back():
    from dayzero.export.megatron import export, parallel_from_args

    out = export(SPEC, P, optimizer_offload=True)
    i = out.command.index("--optimizer-cpu-offload")
    assert out.command[i + 1:i + 4] == ["--optimizer-offload-fraction", "1.0", "--use-precision-aware-optimizer"]
    assert "--optimizer-cpu-offload" not in export(SPEC, P).command
    back, rest = parallel_from_args(out.command[out.command.index("pretrain_gpt.py") + 1:], 8)
    # the offload reads back as the layout's switch (ParallelConfig.optimizer_offload, planner.search.switches)
    assert back == P.with_(optimizer_offload=True)
    assert not {"--optimizer-cpu-offload", "--use-precision-aware-optimizer"} & set(rest)
    # a plan whose layout chose it writes it without the flag
    assert "--optimizer-cpu-offload" in export(SPEC, P.with_(optimizer_offload=True)).command


def test_predict_states_the_host_memory_the_offloaded_optimizer_takes():
    """Host memory per device under optimizer offload: the FP32 master (4 B), the two FP32 moments
    (8 B) and the FP32 gradient copy the host Adam reads (4 B; Megatron's HybridDeviceOptimizer keeps
    CPU FP32 copies of parameters and gradients) of the device's ZeRO-1 shard: 1,003,782,656 x 16 B
    = 16,060,522,496 B; with BF16 moments 12 B a state. Absent without offload."""
    from dayzero.planner.predict import predict

    off = predict(SPEC, P.with_(optimizer_offload=True), H100)
    assert off["memory"]["host_bytes"] == pytest.approx(SHARD * 16, rel=1e-12)
    bf16 = predict(SPEC, P.with_(optimizer_offload=True), H100, memory_options=MemoryOptions.for_run(
        H100.accelerator).with_(optim_bytes=4))
    assert bf16["memory"]["host_bytes"] == pytest.approx(SHARD * 12, rel=1e-12)
    assert "host_bytes" not in predict(SPEC, P, H100)["memory"]
    # within a DGX H100's 2 TB for 8 GPUs (the cluster's host, Cluster.host; the search's cap too)
    assert off["memory"]["host_limit_bytes"] == 250e9 and off["memory"]["host_fits"]
    assert off["memory"]["host_system"] == "DGX H100 / DGX H200" and off["memory"]["host_assumed"] == []


def test_host_memory_adds_the_offloaded_activations():
    """With activations offloaded too, the host also holds what the offloaded layers saved: the busiest
    stage's activations without offload less with it (both from estimate_memory)."""
    from dayzero.planner.predict import predict

    both = predict(SPEC, P.with_(optimizer_offload=True, activation_offload_layers=4), H100)
    none = estimate_memory(SPEC, P, H100.memory_bytes, MemoryOptions.for_run(H100.accelerator))
    act = estimate_memory(SPEC, P.with_(activation_offload_layers=4), H100.memory_bytes,
                          MemoryOptions.for_run(H100.accelerator))
    moved = max(a.activations - b.activations for a, b in zip(none.stages, act.stages))
    assert moved > 0
    assert both["memory"]["host_bytes"] == pytest.approx(SHARD * 16 + moved, rel=1e-12)


def test_the_searchs_host_bytes_are_predicts():
    """planner.memory.memory.optimizer_host_batch, the bytes the search caps optimizer offload with, is the
    host memory predict states (the busiest stage's shard x 16 B): 1,003,782,656 x 16 B for the ZeRO-1
    layout above, and for pp 2 (the first stage, with the embedding, the larger) and ZeRO over dp 4
    the same as predict's, whether or not the row offloads it."""
    from dayzero.planner.memory.memory import optimizer_host_batch
    from dayzero.planner.predict import predict

    layouts = [P, ParallelConfig(tp=1, pp=2, dp=4, mbs=1, gbs=8, seq=4096, zero=1),
               ParallelConfig(tp=2, pp=1, dp=4, mbs=1, gbs=8, seq=4096, zero=3, optimizer_offload=True)]
    got = optimizer_host_batch(SPEC, encode(layouts), MemoryOptions.for_run(H100.accelerator))
    assert got[0] == pytest.approx(SHARD * 16, rel=1e-12)
    for p, g in zip(layouts, got):
        want = predict(SPEC, p.with_(optimizer_offload=True), H100)["memory"]["host_bytes"]
        assert g == pytest.approx(want, rel=1e-12)
    assert got[1] > got[0] / 2 * 1.01  # the stage with the embedding holds more than half the model's shard
