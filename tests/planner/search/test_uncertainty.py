"""The plan's error band (backtest cross-source error for its family and precision) and its
sensitivity table (issue 16, "What the plan output must say")."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from dayzero.errors import ConfigError
from dayzero.planner.perf.calibration import PerfConstants, rates
from dayzero.planner.perf.perf import PerfOptions, evaluate
from dayzero.planner.search.error_band import MIN_ROWS, SCHEMA, check_table, error_band, error_table, load_table
from dayzero.planner.search.search import plan
from dayzero.planner.search.sensitivity import perturbations, scale_out_scaled, sensitivity
from dayzero.specs.cluster import Tier, build_cluster
from dayzero.specs.grid import encode
from dayzero.specs.parallel import ParallelConfig as P
from dayzero.specs.presets import reference_data
from dayzero.specs.registry import load_model


def _rows():
    # 5 dense/bf16 rows: |e| = .1 .2 .1 .3 .05 -> MAPE 0.15; median of (.1 -.2 .1 -.3 .05) = 0.05
    dense = [("dense", "bf16", "a", e) for e in (0.1, -0.2, 0.1, -0.3, 0.05)]
    moe = [("moe", "fp8", "b", 0.4), ("moe", "fp8", "b", 0.2)]  # 2 rows: below MIN_ROWS
    return [{"family": f, "gemm_precision": p, "group": g, "rel_error": e} for f, p, g, e in dense + moe]


def test_error_table_holds_hand_computed_mape_and_median_bias():
    t = check_table(error_table(_rows(), 20, "cmd", "2026-12-01"))
    cell = t["by_family_precision"]["dense/bf16"]
    assert cell["n"] == 5 and cell["mape"] == pytest.approx(0.15) and cell["bias"] == pytest.approx(0.05)
    # overall: |e| sum 0.75 + 0.6 = 1.35 over 7; median of all 7 signed errors = 0.1
    assert t["overall"]["n"] == 7 and t["overall"]["mape"] == pytest.approx(1.35 / 7)
    assert t["overall"]["bias"] == pytest.approx(0.1) and t["by_group"]["b"]["n"] == 2


def test_band_uses_the_family_precision_cell_else_the_overall_figure_with_a_note():
    t = error_table(_rows(), 20, "cmd", "2026-12-01")
    b = error_band(t, "dense", "bf16", 0.40)
    assert (b.key, b.n, b.note) == ("dense/bf16", 5, "") and MIN_ROWS == 5
    # the 80 % band: the 80th percentile of |e| = .05 .1 .1 .2 .3 -> 0.2 + 0.2 x 0.1 = 0.22
    assert b.half_width == pytest.approx(0.22) and b.mape == pytest.approx(0.15)
    assert b.low == pytest.approx(0.40 * 0.78) and b.high == pytest.approx(0.40 * 1.22)
    f = error_band(t, "moe", "fp8", 0.30)  # 2 rows < MIN_ROWS
    assert f.key == "overall" and f.n == 7 and "only 2 held-out moe/fp8 rows" in f.note
    assert error_band(t, "dense", "fp4", 0.3).key == "overall"  # no row at all


def test_a_malformed_table_is_one_config_error():
    with pytest.raises(ConfigError, match="schema"):
        check_table({"schema": "other"})
    t = error_table(_rows(), 20, "cmd", "d")
    t["by_family_precision"]["dense/bf16"]["n"] = "five"
    with pytest.raises(ConfigError, match="dense/bf16"):
        check_table(t)


def test_the_shipped_table_has_the_schema_and_the_command_that_made_it():
    t = load_table()
    raw = json.loads(reference_data("backtest_error.json").read_text())
    assert t == raw and t["schema"] == SCHEMA and "bench_holdout.py" in t["command"] and "--table" in t["command"]
    assert t["overall"]["n"] == sum(c["n"] for c in t["by_family_precision"].values())
    every = t.get("all_rows", t["overall"])  # overall: the in-distribution rows the band's base rests on
    assert every["n"] == sum(c["n"] for c in t["by_group"].values()) and len(t["by_group"]) >= 2
    assert {k.split("/")[0] for k in t["by_family_precision"]} == {"dense", "moe"}


@pytest.fixture(scope="module")
def llama_plan():
    return plan(load_model("llama-3.1-8b"), build_cluster("h100", 64, 8), 256, 4096, top_k=3, uncertainty=True)


def test_the_plan_band_is_the_shipped_entry_of_its_family_and_precision(llama_plan):
    t, b = load_table(), llama_plan["error_band"]
    cell = t["by_family_precision"]["dense/bf16"] if b["key"] == "dense/bf16" else t["overall"]
    assert b["key"] in ("dense/bf16", "overall") and (b["key"] == "overall") == (
        t["by_family_precision"].get("dense/bf16", {"n": 0})["n"] < t["min_rows"])
    assert (b["n"], b["mape"], b["bias"]) == (cell["n"], cell["mape"], cell["bias"])
    assert b["mfu"] == llama_plan["plans"][0]["throughput"]["mfu"]


def test_sensitivity_rows_flag_a_change_exactly_when_the_layout_differs(llama_plan):
    s = llama_plan["sensitivity"]
    best = llama_plan["plans"][0]["parallel"]
    assert s["baseline"]["parallel"] == {k: best[k] for k in s["baseline"]["parallel"]}
    assert s["baseline"]["step_s"] == pytest.approx(llama_plan["plans"][0]["time"]["step_s"], rel=1e-9)
    names = [r["perturbation"] for r in s["rows"]]
    assert names == ["scale-out bandwidth -30%", "scale-out bandwidth +30%", "GEMM efficiency -10%",
                     "GEMM efficiency +10%", "gradients in BF16"]  # dense: no imbalance row
    for r in s["rows"]:
        assert r["best_plan_changes"] == (r["parallel"] != s["baseline"]["parallel"])
        if not r["best_plan_changes"]:
            assert r["mfu"] == pytest.approx(r["baseline_plan_mfu"], rel=1e-12)


def test_faster_inputs_never_lower_the_best_mfu_and_slower_never_raise_it(llama_plan):
    """MFU is 1/step times a constant of the scenario (same tokens, devices and peak), and every
    layout is at least as fast with +30 % bandwidth, +10 % GEMM rate or half the gradient bytes."""
    s = llama_plan["sensitivity"]
    base = s["baseline"]["mfu"]
    by = {r["perturbation"]: r for r in s["rows"]}
    for name in ("scale-out bandwidth +30%", "GEMM efficiency +10%", "gradients in BF16"):
        assert by[name]["mfu"] >= base * (1 - 1e-12) and by[name]["baseline_plan_mfu"] >= base * (1 - 1e-12)
    for name in ("scale-out bandwidth -30%", "GEMM efficiency -10%"):
        assert by[name]["baseline_plan_mfu"] <= base * (1 + 1e-12)
        assert by[name]["mfu"] >= by[name]["baseline_plan_mfu"] * (1 - 1e-12)  # the re-search finds at least as good
    assert by["GEMM efficiency +10%"]["baseline_plan_mfu"] > base  # GEMMs are a real share of the step


def test_scale_out_scaling_touches_only_the_tiers_beyond_the_first():
    cl = build_cluster("h100", 16, 8)
    s = scale_out_scaled(cl, 1.3)
    assert s.tiers[0] == cl.tiers[0] and s.tiers[1].bw == pytest.approx(1.3 * 50e9)
    assert s.tiers[1].p2p_bw == pytest.approx(1.3 * 50e9) and s.tiers[1].latency_s == cl.tiers[1].latency_s


def test_a_single_node_plan_is_insensitive_to_scale_out_bandwidth():
    """Eight devices in one NVLink node with a (fake) scale-out tier beyond it: no group of any
    8-device layout leaves the node, so scaling the scale-out tier changes no step time."""
    one = build_cluster("h100", 8, 8)
    cl = replace(one, tiers=one.tiers + (Tier("scale-out", 16, 50e9, 50e9, 2e-5, "switch"),))
    spec = load_model("llama-3.1-8b")
    grid = encode([P(tp=8, dp=1, gbs=8, seq=4096), P(tp=2, dp=4, gbs=8, seq=4096, zero=1),
                   P(tp=1, dp=8, gbs=8, seq=4096, zero=3, recompute="full")])
    base = evaluate(spec, grid, cl).step_s
    for f in (0.7, 1.3):
        assert np.array_equal(evaluate(spec, grid, scale_out_scaled(cl, f)).step_s, base)
    s = sensitivity(spec, cl, PerfOptions(), grid, best=int(np.argmin(base)))
    for r in s["rows"][:2]:
        assert not r["best_plan_changes"] and r["step_s"] == s["baseline"]["step_s"] and r["covered"]


def test_gemm_efficiency_scale_multiplies_every_gemm_rate():
    cl = build_cluster("h100", 8, 8)
    a, b = rates(cl, PerfConstants()), rates(cl, PerfConstants(gemm_eff_scale=1.1))
    for p in a.gemm_eff:
        assert b.gemm_eff[p] == pytest.approx(1.1 * a.gemm_eff[p])


def test_moe_models_get_the_imbalance_row_and_bf16_runs_the_fp32_row():
    cl = build_cluster("h100", 16, 8)
    moe = [p.name for p in perturbations(load_model("tiny-moe"), cl, PerfOptions())]
    assert "MoE imbalance 1.2" in moe and moe[-1] == "gradients in BF16"
    bf16 = replace(PerfOptions(), comm=replace(PerfOptions().comm, grad_reduce_bytes=2))
    ps = perturbations(load_model("tiny-llama"), cl, bf16)
    assert ps[-1].name == "gradients in FP32" and ps[-1].options.comm.grad_reduce_bytes == 4
    imb = next(p for p in perturbations(load_model("tiny-moe"), cl, PerfOptions()) if p.name.startswith("MoE"))
    assert imb.options.comm.moe_imbalance == 1.2 and imb.max_speedup == 1.0


def test_covered_says_when_the_re_ranking_provably_equals_a_full_re_search(monkeypatch):
    """With a pool smaller than every timed layout, a row is covered only when its best beats the
    pool's slowest baseline step divided by the perturbation's most speed-up (1.3 for +30 %
    bandwidth, 1 for -30 %): hand-checked on three single-node layouts whose steps the scale-out
    tier cannot change."""
    import dayzero.planner.search.sensitivity as sens

    cl = build_cluster("h100", 8, 8)
    spec = load_model("llama-3.1-8b")
    grid = encode([P(tp=8, dp=1, gbs=8, seq=4096), P(tp=2, dp=4, gbs=8, seq=4096, zero=1),
                   P(tp=1, dp=8, gbs=8, seq=4096, zero=3, recompute="full")])
    steps = evaluate(spec, grid, cl).step_s
    best, slowest = float(steps.min()), float(steps.max())
    monkeypatch.setattr(sens, "POOL", 2)  # 3 layouts >= POOL: not known to hold every timed layout
    s = sens.sensitivity(spec, cl, PerfOptions(), grid, best=int(np.argmin(steps)))
    minus, plus = s["rows"][0], s["rows"][1]
    assert minus["covered"] is (best <= slowest) is True
    assert plus["covered"] is (best <= slowest / 1.3)
    monkeypatch.setattr(sens, "POOL", 400)
    assert all(r["covered"] for r in sens.sensitivity(spec, cl, PerfOptions(), grid)["rows"])
