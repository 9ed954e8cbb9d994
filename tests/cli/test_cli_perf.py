"""The performance verbs: predict, plan, backtest (tables, --json, one-line errors)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dayzero.cli.app import main
from helpers.paths import published_rows_file

LLAMA_ARGS = ["predict", "llama-3.1-70b", "--accelerator", "h100", "--devices", "64", "--tp", "4", "--pp", "4",
              "--vpp", "5", "--gbs", "128", "--seq", "8192", "--sequence-parallel", "--precision", "fp8",
              "--tp-overlap"]


def run_json(argv, capsys):
    assert main(argv + ["--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_predict_json_contract(capsys):
    obj = run_json(LLAMA_ARGS, capsys)
    assert set(obj) >= {"parallel", "fits", "memory", "time", "throughput", "comm_ratio", "checks"}
    assert set(obj["memory"]) >= {"peak_bytes", "capacity_bytes", "utilization", "stages"}
    assert set(obj["memory"]["stages"][0]) >= {"stage", "weights", "gradients", "optimizer", "activations",
                                               "temporary", "overhead", "total"}
    assert set(obj["time"]) >= {"step_s", "compute_s", "comm_exposed_s", "bubble_s"}
    assert set(obj["throughput"]) >= {"tokens_per_s", "tokens_per_s_per_device", "model_tflops_per_device", "mfu"}
    for c in obj["checks"]:
        assert set(c) == {"metric", "target", "value", "pass"}
    assert obj["parallel"]["gemm_precision"] == "fp8" and obj["parallel"]["vpp"] == 5
    dims = {r["dim"] for r in obj["communication"]}
    assert {"tp", "pp", "dp_cp"} <= dims
    assert obj["groups"]["tp"]["tiers"] == ["scale-up"]


def test_predict_table_and_fp4(capsys):
    assert main(LLAMA_ARGS) == 0
    out = capsys.readouterr().out
    assert "Communication per step" in out and "mfu" in out
    obj = run_json(["predict", "llama-3.1-8b", "-a", "gb300", "-n", "8", "--precision", "fp4", "--gbs", "64",
                    "--seq", "8192", "--mbs", "2"], capsys)
    assert obj["parallel"]["gemm_precision"] == "fp4" and obj["parallel"]["precision"] == "fp4"


def test_plan_json_contract(capsys):
    obj = run_json(["plan", "llama-3.1-8b", "-a", "h100", "-n", "16", "--gbs", "64", "--seq", "4096",
                    "--top", "3", "--mbs", "1,2"], capsys)
    assert set(obj) >= {"plans", "considered", "rejected"}
    assert len(obj["plans"]) == 3
    assert obj["considered"] == sum(obj["rejected"].values()) + len(obj["plans"])
    steps = [p["time"]["step_s"] for p in obj["plans"]]
    assert steps == sorted(steps)
    assert all(p["parallel"]["mbs"] in (1, 2) for p in obj["plans"])


def test_plan_default_is_the_day0_scenario(capsys):
    obj = run_json(["plan", "--top", "1"], capsys)
    assert obj["model"] == "dense-3t" and obj["cluster"] == "ascend910b-8192" and obj["devices"] == 8192
    assert obj["considered"] > 100_000
    best = obj["plans"][0]
    assert best["fits"] and best["memory"]["utilization"] <= 0.85


def test_backtest_json_on_a_small_file(tmp_path: Path, capsys):
    f = published_rows_file(tmp_path, ("R0132", "R0214", "R0555", "R0671"))
    # R0214 (Nemotron 3 Nano) is predicted now; renamed Jamba (Mamba-1 layers) it is skipped, saying why
    f.write_text(f.read_text().replace("Nemotron_3_Nano", "Jamba"))
    obj = run_json(["backtest", str(f)], capsys)
    assert obj["summary"]["n"] == 3 and obj["summary"]["skipped"] == 1
    assert obj["skipped"][0]["id"] == "R0214" and "Jamba" in obj["skipped"][0]["reason"]
    assert main(["backtest", str(f)]) == 0
    assert "MAPE" in capsys.readouterr().out


@pytest.mark.parametrize("argv,needle", [
    (["predict", "llama-3.1-8b", "-a", "h100", "-n", "8", "--tp", "3"], "tp*pp*cp"),
    (["predict", "llama-3.1-8b", "-a", "h100", "-n", "8", "--precision", "fp16"], "--precision"),
    (["predict", "llama-3.1-8b", "-a", "h100", "-n", "8", "--rank-order", "tp-dp-pp"], "rank order"),
    (["plan", "dense-3t", "-a", "h100", "-n", "8", "--gbs", "64"], "no layout of dense-3t fits"),
    (["plan", "llama-3.1-8b", "-a", "h100", "-n", "8", "--tp", "x"], "--tp"),
    (["backtest", "/nonexistent.csv"], "not found"),
    # more stages than layers: the rule memory applies, not a prediction with empty stages
    (["predict", "tiny-llama", "-a", "h100", "-n", "8", "--pp", "8"], "layers (4) must be divisible by pp*vpp"),
    (["memory", "tiny-llama", "-a", "h100", "-n", "8", "--pp", "8"], "layers (4) must be divisible by pp*vpp"),
    (["predict", "llama-3.1-8b", "-a", "h100", "-n", "8", "--calibration", "/nonexistent.json"], "calibration"),
])
def test_errors_are_one_line_exit_2(argv, needle, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1 and "Traceback" not in err


def test_calibration_file_changes_the_prediction(tmp_path: Path, capsys):
    base = run_json(LLAMA_ARGS, capsys)["time"]["step_s"]
    f = tmp_path / "cal.json"
    f.write_text(json.dumps({"constants": {"gemm_scale_fp8": 0.3}}))
    slow = run_json(LLAMA_ARGS + ["--calibration", str(f)], capsys)["time"]["step_s"]
    assert slow > 1.3 * base
    f.write_text(json.dumps({"gemm_scale_fp9": 0.3}))
    assert main(LLAMA_ARGS + ["--calibration", str(f)]) == 2
    assert "unknown efficiency constant" in capsys.readouterr().err


def test_the_ep_dispatcher_is_a_flag_and_follows_the_engine(capsys):
    """DeepSeek-V3 with EP 64 over eight 8-GPU nodes: the deduplicating dispatcher sends each token
    to about 3.6 of 8 nodes (group-limited routing, planner.perf.moe_dispatch), the plain all-to-all
    every one of its 8 routed copies, so the dispatch costs more and the JSON says which one ran;
    plan --engine dayzero prices the runtime's all-to-all; a bad name is one line."""
    base = ["predict", "deepseek-v3", "-a", "h800", "-n", "2048", "--pp", "16", "--ep", "64", "--gbs", "15360",
            "--precision", "fp8", "--json"]
    out = {}
    for d in ("dedup", "all-to-all"):
        assert main([*base, "--ep-dispatcher", d]) == 0
        out[d] = json.loads(capsys.readouterr().out)
    assert out["dedup"]["moe_dispatch"]["dispatcher"] == "dedup"
    assert out["all-to-all"]["moe_dispatch"]["dispatcher"] == "all_to_all"
    ep = {d: sum(c["exposed_s"] for c in o["communication"] if c["name"].startswith("ep ")) for d, o in out.items()}
    assert ep["all-to-all"] > 1.5 * ep["dedup"] > 0
    assert main(["plan", "mixtral-8x7b", "-a", "h100", "-n", "64", "--gbs", "256", "--engine", "dayzero", "--top", "1",
                 "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["plans"][0]["moe_dispatch"]["dispatcher"] == "all_to_all"
    assert main([*base, "--ep-dispatcher", "carrier-pigeon"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--ep-dispatcher" in err[0]


def test_deepseek_fp8_recipe_flags_slow_the_llama_fp8_layout(capsys):
    """--fp8-scaling block multiplies the dense FP8 GEMM rate by 0.691 (planner.perf.fp8_scaling), so
    the FP8 Llama layout gets slower; a layout without MoE has no all-to-all, so --fp8-dispatch and
    --comm-sm-reserved leave it as it was (reserved SMs cost only where there is communication to
    overlap). An unknown scaling is a one-line error."""
    base = run_json(LLAMA_ARGS, capsys)["time"]["step_s"]
    block = run_json(LLAMA_ARGS + ["--fp8-scaling", "block"], capsys)["time"]["step_s"]
    both = run_json(LLAMA_ARGS + ["--fp8-scaling", "block", "--fp8-dispatch", "--comm-sm-reserved"],
                    capsys)["time"]["step_s"]
    assert block > base * 1.1
    assert both == pytest.approx(block)
    assert main(LLAMA_ARGS + ["--fp8-scaling", "mx"]) == 2
    assert "--fp8-scaling" in capsys.readouterr().err


def test_predict_recompute_layers_prices_the_first_n_layers(capsys):
    """``--recompute-layers N`` on predict (a layout flag, as on memory): full recompute of the
    first N layers of each chunk costs less time and keeps more memory than every layer, and more
    time than none; alone it implies --recompute full; more layers than a chunk has, or N with
    selective recompute, is a one-line error."""
    base = ["predict", "llama-3.1-8b", "-a", "h100", "-n", "8", "--tp", "2", "--pp", "2", "--gbs", "16"]
    none = run_json(base, capsys)
    some = run_json(base + ["--recompute-layers", "4"], capsys)
    every = run_json(base + ["--recompute", "full"], capsys)
    assert some["parallel"]["recompute"] == "full" and some["parallel"]["recompute_layers"] == 4
    assert none["time"]["step_s"] < some["time"]["step_s"] < every["time"]["step_s"]
    assert every["memory"]["peak_bytes"] < some["memory"]["peak_bytes"] < none["memory"]["peak_bytes"]
    assert main(base + ["--recompute-layers", "17"]) == 2
    assert "exceed the 16 layers of a model chunk" in capsys.readouterr().err
    assert main(base + ["--recompute", "selective", "--recompute-layers", "2"]) == 2
    assert "need recompute full" in capsys.readouterr().err
