"""``dayzero calibrate --runs METRICS.jsonl``: a finished ``dayzero train`` run, read back from its
end record as one published-runs row (planner.backtest.own_runs.metrics_row)."""

from __future__ import annotations

import json

import pytest

from dayzero.errors import ConfigError
from dayzero.planner.backtest.own_runs import calibrate_runs, metrics_row
from dayzero.planner.backtest.published import Skip, cases_of
from dayzero.specs.counting import params_total
from dayzero.specs.parallel import ParallelConfig
from dayzero.specs.registry import load_model

run_architecture = pytest.importorskip("dayzero.runtime.train").run_architecture


def _end(model: str, tokens_per_s: float, **kw) -> dict:
    spec = load_model(model)
    par = ParallelConfig(tp=kw.pop("tp", 1), dp=kw.pop("dp", 8), mbs=1, gbs=kw.pop("gbs", 32), seq=4096)
    return {"event": "end", "steps": 20, "final_loss": 2.0, "first_loss": 3.0, "mean_step_time_s": 1.0,
            "tokens_per_s": tokens_per_s, "world": par.world, "parallel": par.describe(), "model": spec.name,
            "compute_dtype": kw.pop("dtype", "bf16"), "device": "cuda", "layout": par.to_dict(),
            "accelerator": "NVIDIA H100 80GB HBM3", "architecture": run_architecture(spec)}


def _write(path, *records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_the_end_record_becomes_a_row_with_the_runs_model_layout_and_throughput(tmp_path):
    f = _write(tmp_path / "a.jsonl", {"step": 1, "loss": 3.0}, _end("llama-3.1-8b", 60_000.0, tp=2, dp=4))
    row = metrics_row(f)
    assert row["num_accelerators"] == "8" and row["tp"] == "2" and row["dp"] == "4"
    assert row["tokens_per_sec_total"] == "60000.0" and row["framework"] == "dayzero"
    (case,), skips = cases_of([row])
    assert not skips and case.cluster.accelerator.id == "nvidia_h100_sxm" and case.cluster.devices == 8
    assert case.published == pytest.approx(60_000.0 / 8)  # tokens/s per device
    assert params_total(case.spec) == params_total(load_model("llama-3.1-8b"))  # the shape survives


def test_an_moe_runs_shape_survives_the_columns():
    spec = load_model("mixtral-8x7b")
    (case,), skips = cases_of([{**{k: str(v) for k, v in run_architecture(spec).items() if v is not None},
                               "id": "m", "model": spec.name, "accelerator": "H100", "num_accelerators": "8",
                               "tp": "1", "pp": "1", "dp": "8", "mbs": "1", "gbs": "8", "seq_len": "4096",
                               "precision": "bf16", "tokens_per_sec_total": "8000", "framework": "dayzero"}])
    assert params_total(case.spec) == params_total(spec)


def test_two_runs_calibrate_and_an_fp32_or_unfinished_run_is_refused(tmp_path):
    a = _write(tmp_path / "a.jsonl", _end("llama-3.1-8b", 60_000.0))
    b = _write(tmp_path / "b.jsonl", _end("llama-3.1-8b", 50_000.0, tp=2, dp=4))
    got = calibrate_runs([a, b], iterations=5, loo_iterations=3)
    assert got["leave_one_out"]["n"] == 2 and {r["id"] for r in got["rows"]} == {"a", "b"}
    assert got["error_band"]["engines"] == ["dayzero"]
    fp32 = metrics_row(_write(tmp_path / "c.jsonl", _end("llama-3.1-8b", 1.0, dtype="fp32")))
    assert isinstance(fp32, Skip) and "fp32" in fp32.reason
    old = _end("llama-3.1-8b", 1.0)
    del old["layout"], old["architecture"]
    assert "layout, architecture" in metrics_row(_write(tmp_path / "d.jsonl", old)).reason
    with pytest.raises(ConfigError, match="did not finish"):
        metrics_row(_write(tmp_path / "e.jsonl", {"step": 1, "loss": 3.0}))
