"""The 80 % band: held-out residuals, widened by the spread measured when a factor the plan
extrapolates (engine, accelerator, vendor, precision, scale) was left out of the fit, and
narrowed to a team's own leave-one-out residuals after ``calibrate --runs``."""

from __future__ import annotations

import csv

import numpy as np
import pytest

from dayzero.planner.backtest.own_runs import calibrate_runs
from dayzero.planner.backtest.published import read_rows
from dayzero.planner.search.error_band import calibrated_band, error_band, error_table, left_out, widen
from helpers.paths import data_file


def held_rows():
    """Leave-one-group-out rows of three groups: two Megatron groups with small errors on H100, one
    llm-foundry group (an engine no other group ran) with large ones on A100."""
    rng = np.random.default_rng(0)
    rows = []
    for g, engine, acc, scale, devices in (("A", "megatron", "h100", 0.05, 64), ("B", "megatron", "h100", 0.05, 512),
                                           ("C", "llm-foundry", "a100", 0.30, 8)):
        for e in rng.normal(0, scale, 40):
            rows.append({"group": g, "family": "dense", "gemm_precision": "bf16", "rel_error": float(e),
                         "engine": engine, "accelerator": acc, "vendor": "NVIDIA", "devices": devices,
                         "params": 7e9})
    return rows


def test_factor_left_out_is_measured_on_the_rows_the_fit_never_saw():
    rows = held_rows()
    assert {r["group"] for r in left_out(rows, "engine")} == {"C"}
    assert {r["group"] for r in left_out(rows, "scale")} == {"B"}
    assert left_out(rows, "vendor") == []


def test_the_band_widens_for_an_engine_left_out_of_the_fit_and_says_so():
    table = error_table(held_rows(), 1, "test", "today")
    inside = error_band(table, "dense", "bf16", 0.40, "h100", 64, 7e9, engine="megatron", vendor="NVIDIA")
    outside = error_band(table, "dense", "bf16", 0.40, "h100", 64, 7e9, engine="torchtitan", vendor="NVIDIA")
    assert inside.widened_by == () and inside.half_width == pytest.approx(
        table["by_family_precision"]["dense/bf16"]["p80_abs_rel_error"])
    assert outside.half_width > inside.half_width
    assert any(w.startswith("engine") for w in outside.widened_by)
    assert "widened for engine" in outside.text()
    other_vendor = error_band(table, "dense", "bf16", 0.40, "h100", 64, 7e9, engine="megatron", vendor="AMD")
    assert any("never left out" in w for w in other_vendor.widened_by)  # no vendor was ever left out
    big = error_band(table, "dense", "bf16", 0.40, "h100", 4096, 7e9, engine="megatron", vendor="NVIDIA")
    assert any(w.startswith("scale") for w in big.widened_by)
    assert 0.75 <= table["coverage"] <= 0.9  # the 80 % band covers its own held-out rows


def test_widening_takes_the_largest_spread_among_the_factors():
    spreads = {"engine": {"n": 10, "p80_abs_rel_error": 0.3}, "scale": {"n": 5, "p80_abs_rel_error": 0.05}}
    half, said = widen(0.1, spreads, ["engine", "scale"])
    assert half == pytest.approx(0.3)
    assert widen(0.1, spreads, ["scale"])[0] == pytest.approx(0.1)  # below the base: no narrowing
    assert len(said) == 2


def test_calibrate_runs_narrows_the_band_of_that_engine(tmp_path):
    """Five of the shipped MPT runs relabelled as torchtitan runs: before calibration a torchtitan
    plan's band is widened (no torchtitan row in the fit); after ``calibrate --runs`` on them, it is
    their leave-one-out residuals' (narrower)."""
    rows = read_rows(data_file("published_runs_dev.csv"))
    own = [r for r in rows if r["model"] == "MPT-3b" and r["accelerator"] == "H100 80GB"][:5]
    path = tmp_path / "runs.csv"
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows({**r, "framework": "torchtitan (FSDP2)"} for r in own)
    result = calibrate_runs(path, iterations=10, loo_iterations=5)
    assert result["leave_one_out"]["n"] == 5 and result["error_band"]["engines"] == ["torchtitan"]
    table = error_table(held_rows(), 1, "test", "today")
    before = error_band(table, "dense", "bf16", 0.40, "h100", 8, 3e9, engine="torchtitan", vendor="NVIDIA")
    after = calibrated_band(result["error_band"], 0.40, table, "nvidia_h100_sxm", 8, engine="torchtitan")
    assert after.key == "calibrated" and after.widened_by == ()
    assert after.half_width < before.half_width
    elsewhere = calibrated_band(result["error_band"], 0.40, table, "nvidia_h100_sxm", 8, engine="megatron")
    assert elsewhere.half_width > after.half_width  # another engine than the team's runs: widened again
