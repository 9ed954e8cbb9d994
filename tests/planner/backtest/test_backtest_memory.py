"""The backtest's memory check: every published run ran, so its predicted peak must fit the device."""

from __future__ import annotations

import pytest

from dayzero.errors import DayzeroError
from dayzero.planner.backtest.backtest import run_backtest
from dayzero.planner.backtest.row_memory import Engine, engine_memory, settle
from dayzero.planner.memory.allocator import CachingAllocator
from dayzero.planner.memory.memory import estimate_memory
from dayzero.planner.memory.memory_options import NVIDIA_DRIVER_RESERVED, MemoryOptions
from dayzero.planner.memory.memory_terms import category_totals
from dayzero.specs.cluster import build_cluster
from dayzero.specs.hardware import get_accelerator
from dayzero.specs.parallel import ParallelConfig
from dayzero.specs.registry import load_model
from helpers.paths import data_file

CSV = data_file("published_runs_dev.csv")
MiB = 2**20


@pytest.fixture(scope="module")
def result():
    return run_backtest(CSV)


def test_published_layouts_fit_their_device(result):
    s = result["summary"]
    assert s["fits_share"] >= 0.95
    assert s["fits_share_recompute_stated"] >= 0.95 and s["recompute_stated"] > 100
    assert len(s["not_fitting"]) == sum(not r["fits"] for r in result["rows"])


def test_rows_report_their_memory_fraction_and_assumptions(result):
    for r in result["rows"]:
        assert r["memory_fraction"] > 0 and r["fits"] == (r["memory_fraction"] <= 1.0)
        blank = [a for a in r["assumed"] if a["kind"] == "memory" and a["text"].startswith("recompute blank")]
        assert bool(blank) == (not r["recompute_stated"])
        if blank:
            assert blank[0]["text"].startswith(f"recompute blank: {r['recompute']}")  # selective: (its modules)


def test_h100_capacity_is_what_nvidia_smi_shows():
    # nvidia-smi on an "H100 80GB HBM3": 81559MiB total (80 GiB less what the driver keeps)
    acc = get_accelerator("nvidia_h100_sxm")
    assert acc.hbm_bytes == 80 * 2**30
    usable = acc.hbm_bytes * (1 - MemoryOptions.for_accelerator(acc).reserved_fraction)
    assert usable / MiB == pytest.approx(81559, abs=1)
    assert MemoryOptions.for_accelerator(get_accelerator("amd_mi300x")).reserved_fraction == 0
    assert NVIDIA_DRIVER_RESERVED == pytest.approx(361 / 81920)


def test_persistent_model_states_leave_no_fragmentation():
    # model states: a few large buffers allocated once; the caching allocator rounds each to 2 MiB
    a = CachingAllocator()
    for nbytes in (5_200_000_017, 10_390_000_001, 370_000_003, 180_000_005):
        a.malloc(nbytes)
    assert a.peak_reserved - a.peak_requested < 4 * 2 * MiB
    # so the fragmentation budget scales with the step's churn (activations, temporaries) only
    spec = load_model("llama-3.1-8b")
    p = ParallelConfig(tp=1, pp=1, dp=8, zero=1, mbs=1, gbs=64)
    opts = MemoryOptions(fragmentation=0.1)
    few, many = (estimate_memory(spec, p, 80 * 2**30, o).stages[0] for o in (opts, opts.with_(grad_bytes=2)))
    assert few.terms["overhead:fragmentation"] == many.terms["overhead:fragmentation"]
    dynamic = few.activations + few.temporary
    assert few.terms["overhead:fragmentation"] == pytest.approx(0.1 * dynamic, abs=2)


def test_fsdp_keeps_fp32_shards_as_master_weights_megatron_a_bf16_copy():
    cluster = build_cluster(get_accelerator("nvidia_h100_sxm"), 64)
    fsdp = engine_memory(cluster, Engine(megatron=False, attention_kernel="flash2"), zero=3)
    mcore = engine_memory(cluster, Engine(megatron=True, attention_kernel="fused"), zero=3)
    assert fsdp.sharded_params_are_master and not mcore.sharded_params_are_master
    ddp = engine_memory(cluster, Engine(megatron=False, attention_kernel="fused"), zero=1)
    assert not ddp.sharded_params_are_master
    spec = load_model("llama-3.1-70b")
    p = ParallelConfig(dp=64, zero=3, mbs=1, gbs=64, seq=4096, recompute="full")
    w = estimate_memory(spec, p, cluster.memory_bytes, fsdp).stages[0]
    assert w.weights == 0 and w.optimizer > 0  # the fp32 shard is the optimizer's master copy


def test_blank_recompute_takes_the_cheapest_setting_that_fits():
    spec = load_model("llama-3.1-70b")
    cluster = build_cluster(get_accelerator("nvidia_h100_sxm"), 64)
    p = ParallelConfig(tp=8, pp=1, dp=8, zero=1, mbs=2, gbs=128, seq=8192, sequence_parallel=True)
    engine = Engine(megatron=True, attention_kernel="fused")
    s = settle(spec, p, cluster, engine, recompute_stated=False)
    # 80 layers x 16K tokens: neither no recompute nor the attention core's fits; of Megatron's
    # recompute modules, the MLP's (its FC1 output and activation dropped) does, at less time
    # than a whole forward
    assert s.fits and s.parallel.recompute == "selective" and s.parallel.recompute_modules == ("mlp",)
    assert estimate_memory(spec, p, cluster.memory_bytes, s.memory).utilization > 1
    core = p.with_(recompute="selective", recompute_modules=("core_attn",))
    assert estimate_memory(spec, core, cluster.memory_bytes, s.memory).utilization > 1
    assert "recompute blank: selective (mlp)" in s.assumed
    # outside Megatron there are no recompute modules: full recompute, as before
    other = settle(spec, p, cluster, Engine(megatron=False, attention_kernel="fused"), recompute_stated=False)
    assert other.fits and other.parallel.recompute == "full" and "recompute blank: full" in other.assumed
    # a BF16 gradient buffer costs no time, so it is tried before recomputing
    s2 = settle(spec, p.with_(seq=4096), cluster, engine, recompute_stated=False)
    assert s2.fits and s2.parallel.recompute == "none" and s2.memory.grad_bytes == 2
    s3 = settle(spec, p.with_(seq=4096, mbs=1, gbs=64), cluster, engine, recompute_stated=False)
    assert s3.fits and s3.parallel.recompute == "none" and s3.memory.grad_bytes == 4  # the default fits
    # outside Megatron there is no such buffer to change
    fsdp = settle(spec, p.with_(seq=4096), cluster, Engine(megatron=False, attention_kernel="fused"), False)
    assert fsdp.memory.grad_bytes == 4 and fsdp.parallel.recompute != "none"
    # a stated setting is never changed, even when it is predicted not to fit
    stated = settle(spec, p, cluster, engine, recompute_stated=True)
    assert stated.parallel.recompute == "none" and not stated.fits
    assert "no setting the recipe allows fits the predicted peak" in stated.assumed


def test_the_fastest_fitting_recompute_setting_is_taken():
    """Of the recompute settings that fit, settle takes the one with the least predicted step
    time (checked here against every setting it could take, timed one by one)."""
    from dayzero.planner.backtest.row_memory import recompute_levels
    from dayzero.planner.perf.perf import evaluate
    from dayzero.specs.grid import encode

    spec = load_model("llama-3.1-70b")
    cluster = build_cluster(get_accelerator("nvidia_h100_sxm"), 64)
    p = ParallelConfig(tp=8, pp=1, dp=8, zero=1, mbs=2, gbs=128, seq=8192, sequence_parallel=True)
    engine = Engine(megatron=True, attention_kernel="fused")
    s = settle(spec, p, cluster, engine, recompute_stated=False)
    opts = engine_memory(cluster, engine, p.zero, grad_bytes=2)  # the cheapest buffer: BF16
    fitting = [q for q in recompute_levels(spec, p, engine)
               if estimate_memory(spec, q, cluster.memory_bytes, opts).utilization <= 1]
    step = {q: float(evaluate(spec, encode([q]), cluster).step_s[0]) for q in fitting}
    assert len(fitting) > 1 and s.parallel == min(fitting, key=step.get)


def test_recompute_module_sets_are_the_distinct_ones_that_drop_something():
    """Hand count: Qwen3-235B-A22B (every layer MoE, no shared experts, GQA) has four modules that
    drop a saved tensor: core_attn, layernorm, moe_act and moe, and moe drops what moe_act drops
    (planner.memory.activations.MODULE_TERMS), so the sets are {core_attn, layernorm} subsets (4) x
    {-, moe_act, moe} (3), less the empty one: 11. Llama 3.1 70B (dense, GQA): core_attn,
    layernorm, mlp, all 7 non-empty subsets; mla_up_proj drops nothing without MLA."""
    from dayzero.planner.memory.activations import recompute_modules_sets

    qwen = recompute_modules_sets(load_model("qwen3-235b-a22b"))
    assert len(qwen) == 11 and ("moe",) in qwen and ("moe_act", "moe") not in qwen
    assert all("mla_up_proj" not in ms and "mlp" not in ms and "shared_experts" not in ms for ms in qwen)
    assert len(recompute_modules_sets(load_model("llama-3.1-70b"))) == 7


def test_deepseek_v3_on_gb200_recomputes_what_the_megatron_bridge_preset_does():
    """NVIDIA-NeMo/Megatron-Bridge scripts/performance/configs/deepseek/deepseek_workload_base_configs.py:
    the GB200 presets (pp4 vpp4 ep64, 256 GPUs) set recompute_modules=["mla_up_proj"]; the rows
    of those runs state no recompute, and the fastest setting that fits is that one."""
    from dayzero.planner.backtest.published import load_cases

    cases = {c.id: c for c in load_cases(CSV)[0]}
    for rid in ("R0201", "R0238", "R0284"):
        c = cases[rid]
        assert not c.recompute_stated and c.parallel.recompute == "selective"
        assert c.parallel.recompute_modules == ("mla_up_proj",), (rid, c.parallel.describe())


def test_megatron_bf16_grad_buffer_is_the_zero_paper_16_bytes():
    # grad_reduce_in_fp32 off: BF16 params and grads + FP32 master and Adam = Rajbhandari et al.'s 16 B/param
    opts = engine_memory(build_cluster(get_accelerator("nvidia_h100_sxm"), 8), Engine(True, "fused"), 1, grad_bytes=2)
    assert opts.bytes_per_param == 16
    spec = load_model("llama-3.1-8b")
    p = ParallelConfig(dp=8, zero=1, mbs=1, gbs=8)
    terms = estimate_memory(spec, p, 80 * 2**30, opts).stages[0].terms
    cats = category_totals({k: v for k, v in terms.items()})
    params = sum(v for k, v in terms.items() if k.startswith("weights:") and k != "weights:fp8_cache") / 2
    states = cats["weights"] + cats["gradients"] + cats["optimizer"]
    assert states / params == pytest.approx(4 + 12 / 8, rel=1e-6)  # Megatron-LM docs: distributed optimizer


def test_leave_one_group_out_predicts_each_group_without_it(tmp_path):
    import csv

    from dayzero.planner.backtest.backtest import FIT_FIELDS, constrained_fields, leave_one_group_out
    from dayzero.planner.backtest.published import load_cases, read_rows

    rows = read_rows(CSV)
    keep = {}
    for r in rows:  # three rows of each of two source groups
        keep.setdefault(r["source_group"], [])
        if len(keep[r["source_group"]]) < 3 and r["source_group"] in ("NeMo_PerfSummary", "MosaicML_llmfoundry_MPT"):
            keep[r["source_group"]].append(r)
    out = tmp_path / "two_groups.csv"
    with out.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows([r for rs in keep.values() for r in rs])
    h = leave_one_group_out(out, iterations=2)
    cases = load_cases(out)[0]
    assert set(h["by_group"]) == {c.source_group for c in cases}
    assert h["overall"]["n"] == len(cases) == sum(v["n"] for v in h["by_group"].values())
    assert set(h["by_family"]) <= {"dense", "moe"} and sum(v["n"] for v in h["by_precision"].values()) == len(cases)
    for r in h["rows"]:  # each row predicted with the constants fitted without its group
        assert r["rel_error"] == pytest.approx((r["predicted"] - r["published"]) / r["published"])
    for g, c in h["constants"].items():
        assert set(c) == set(FIT_FIELDS)
    mpt = [c for c in cases if c.source_group == "MosaicML_llmfoundry_MPT"]
    assert "flash2_max_tflops" in constrained_fields(mpt)  # only llm-foundry runs FlashAttention-2 here
    assert "flash2_max_tflops" in h["unconstrained"]["MosaicML_llmfoundry_MPT"]
    assert {r["gemm_precision"] for r in h["rows"]} <= {"bf16", "fp8", "fp4"}
    with pytest.raises(DayzeroError, match="at least 2 source groups"):
        one = tmp_path / "one.csv"
        with one.open("w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(keep["NeMo_PerfSummary"])
        leave_one_group_out(one, iterations=1)


@pytest.mark.slow
def test_leave_one_group_out_in_two_processes_gives_the_same_result(tmp_path):
    import csv

    from dayzero.planner.backtest.backtest import leave_one_group_out
    from dayzero.planner.backtest.published import read_rows

    rows = read_rows(CSV)
    keep = []
    for g in ("NeMo_PerfSummary", "MosaicML_llmfoundry_MPT"):
        keep += [r for r in rows if r["source_group"] == g][:3]
    out = tmp_path / "two_groups.csv"
    with out.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(keep)
    assert leave_one_group_out(out, iterations=2, jobs=2) == leave_one_group_out(out, iterations=2)


def test_fused_cross_entropy_keeps_bf16_logits_and_the_mpt_runs_fit(result):
    # llm-foundry's default loss is flash-attn's xentropy kernel: BF16 logits, gradient written in
    # place (csrc/xentropy/README.md), so the loss temporary is 2 B per logit, not Megatron's FP32 4 B
    from dayzero.planner.backtest.published import fused_loss

    assert fused_loss({"framework": "Composer/llm-foundry (PyTorch FSDP)"})
    assert not fused_loss({"framework": "Megatron-Bridge / Megatron-Core (NeMo 26.02.01 container)"})
    cluster = build_cluster(get_accelerator("nvidia_a100_40gb_sxm"), 64)
    plain = engine_memory(cluster, Engine(megatron=False, attention_kernel="flash2"), zero=3)
    fused = engine_memory(cluster, Engine(megatron=False, attention_kernel="flash2", fused_loss=True), zero=3)
    assert (plain.logits_bytes, fused.logits_bytes) == (4, 2)
    rows = {r["id"]: r for r in result["rows"]}
    # MPT-1b, mbs 10 x seq 2048 on A100 40GB with no recompute, as published (R0629-R0631): the
    # 20,480 x 50,368 logits are 3.84 GiB in FP32 and pushed the prediction to 101-102 %
    for rid in ("R0629", "R0630", "R0631"):
        assert rows[rid]["recompute_stated"] and rows[rid]["recompute"] == "none"
        assert 0.9 < rows[rid]["memory_fraction"] <= 1.0
    assert result["summary"]["fits_share_recompute_stated"] == 1.0
