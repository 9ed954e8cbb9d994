"""Every parallel layout trains the same model as one process does (fp32, same seed and global
batch): per-step losses within 1e-5 relative for 5 steps, on gloo with up to 8 ranks.

Worlds are spawned once per size and run several layouts in turn (``train_entry.spawn`` takes a list)
to keep the suite's runtime modest. Five steps are enough for every check: each step's loss is
compared, the reference's loss falls (6.27 -> 4.29 by step 5) and the BF16 MoE run's by over 20 %
(6.30 -> 3.36); a 4-rank step costs seconds on a loaded 2-core machine, so each step counts.
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")

from dayzero.runtime.config import ModelSection, OptimizerSection, TrainConfig  # noqa: E402
from dayzero.runtime.metrics import STEP_KEYS, read_metrics  # noqa: E402
from dayzero.runtime.train_entry import spawn  # noqa: E402
from dayzero.specs.parallel import ParallelConfig  # noqa: E402
from helpers.run_records import run_losses  # noqa: E402

pytestmark = pytest.mark.slow

STEPS = 5
BATCH = dict(seq=32, mbs=1, gbs=8)
DENSE = ModelSection("tiny-llama", hidden=128)  # 4 layers, 4 heads / 2 kv heads of 32
# layouts per world size: name -> (model kind, ParallelConfig)
WORLDS = {
    8: {"tp2_pp2_dp2": ("dense", ParallelConfig(tp=2, pp=2, dp=2, layer_split=(1, 3), **BATCH))},
    4: {"tp2_dp2_zero3": ("dense", ParallelConfig(tp=2, dp=2, zero=3, **BATCH)),
        "tp2_dp2_sp_zero2_selective": ("dense", ParallelConfig(tp=2, dp=2, zero=2, sequence_parallel=True,
                                                               recompute="selective", **BATCH)),
        "tp2_dp2_zero0_full": ("dense", ParallelConfig(tp=2, dp=2, zero=0, recompute="full", **BATCH)),
        # 2 KV heads on 4 tp ranks: KV heads replicated, with sequence parallelism
        "tp4_sp_kv_replicated": ("dense", ParallelConfig(tp=4, sequence_parallel=True, **BATCH)),
        "moe_ep2_dp2_tp2": ("moe", ParallelConfig(ep=2, dp=2, tp=2, **BATCH)),
        # BF16 compute (fp32 master weights and reductions), the GPU default, through every
        # collective: all-to-all, sequence-parallel gathers, FSDP2's mixed precision
        "moe_ep2_dp2_tp2_sp_bf16": ("moe", ParallelConfig(ep=2, dp=2, tp=2, sequence_parallel=True, zero=3,
                                                          **BATCH))},
    2: {"pp2_interleaved": ("dense", ParallelConfig(pp=2, vpp=2, schedule="interleaved", **BATCH)),
        "pp2_gpipe_full": ("dense", ParallelConfig(pp=2, vpp=2, schedule="gpipe", recompute="full", **BATCH))},
    1: {"dense_ref": ("dense", ParallelConfig(**BATCH)), "moe_ref": ("moe", ParallelConfig(**BATCH))},
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("equivalence")
    # the MoE model: tiny DeepSeek-V3 (MLA, shared expert, sigmoid routing with score-correction
    # bias) with a balance loss and group-limited routing switched on so both are exercised
    moe_dir = tmp / "tiny-moe-aux"
    moe_dir.mkdir()
    from dayzero.specs.registry import model_presets

    cfg = {k: v for k, v in model_presets()["tiny-moe"].items() if not k.startswith("_")}
    cfg.update(aux_loss_alpha=0.01, n_group=2, topk_group=1)
    (moe_dir / "config.json").write_text(json.dumps(cfg))
    models = {"dense": DENSE, "moe": ModelSection(str(moe_dir))}
    out, codes = {}, {}
    for world, layouts in WORLDS.items():
        configs = []
        for name, (kind, parallel) in layouts.items():
            metrics = tmp / f"{name}.jsonl"
            # the profiler behind comm_time_s is only needed where the metrics test reads it
            dtype = "bf16" if name.endswith("_bf16") else "fp32"
            configs.append(TrainConfig(parallel=parallel, steps=STEPS, seed=7, compute_dtype=dtype, quiet=True,
                                       metrics=str(metrics), optimizer=OptimizerSection(lr=3e-3),
                                       measure_comm=(world == 8), model=models[kind]))
            out[name] = metrics
        codes[world] = spawn(configs, world)
    return {name: read_metrics(path) for name, path in out.items() if path.exists()}, codes


def _losses(runs, name):
    return run_losses(runs, name, STEPS)


@pytest.mark.parametrize("name", [n for w in (8, 4, 2) for n, (kind, _) in WORLDS[w].items() if kind == "dense"])
def test_dense_layouts_match_single_process(runs, name):
    want, got = _losses(runs, "dense_ref"), _losses(runs, name)
    assert want[-1] < want[0]  # the reference really trains
    for step, (a, b) in enumerate(zip(want, got), 1):
        assert abs(a - b) <= 1e-5 * abs(a), f"{name} step {step}: {b} vs single process {a}"


def test_moe_ep_dp_tp_matches_single_process(runs):
    want, got = _losses(runs, "moe_ref"), _losses(runs, "moe_ep2_dp2_tp2")
    assert want[-1] < want[0]
    for step, (a, b) in enumerate(zip(want, got), 1):
        assert abs(a - b) <= 1e-5 * abs(a), f"moe step {step}: {b} vs single process {a}"


def test_bf16_moe_tracks_fp32(runs):
    want, got = _losses(runs, "moe_ref"), _losses(runs, "moe_ep2_dp2_tp2_sp_bf16")
    for step, (a, b) in enumerate(zip(want, got), 1):
        assert abs(a - b) <= 1e-2 * abs(a), f"bf16 step {step}: {b} vs fp32 single process {a}"
    assert got[-1] < 0.8 * got[0]


def test_metrics_records(runs):
    records, _ = runs
    steps, end = records["tp2_pp2_dp2"]
    for r in steps:
        assert tuple(r) == STEP_KEYS + ("attempt",)
        assert r["tokens"] == 8 * 32 and r["peak_mem_bytes"] > 0 and r["step_time_s"] > 0
        assert r["comm_time_s"] > 0  # 8 ranks do communicate
        assert r["grad_norm"] > 0 and r["lr"] > 0
    assert end["event"] == "end" and end["world"] == 8 and end["steps"] == STEPS
    ref_steps, _ = records["dense_ref"]
    assert all(r["comm_time_s"] == 0 for r in ref_steps)
