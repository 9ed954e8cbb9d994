"""dayzero validate end to end on 2 gloo ranks: the targets table for a tiny model, a broken run
failing the loss check, the calibration loop and --plan."""

import json

import pytest

from dayzero.cli.app import main
from dayzero.validate.profile import build_profile, write_profile
from helpers.measurements import measurements

pytestmark = pytest.mark.slow

TINY = ["tiny-llama", "--nproc", "2", "--seq", "64", "--mbs", "2", "--gbs", "4", "--steps", "8", "--layers", "2",
        "--hidden", "64"]
METRICS = ["mfu", "peak_memory", "comm_ratio", "step_time", "loss_trend"]


@pytest.fixture(scope="module")
def profile(tmp_path_factory):
    # a synthetic 2-rank profile: deterministic, and enough for the table (accuracy is the benchmark's job)
    return str(write_profile(build_profile(measurements(ranks=2)), tmp_path_factory.mktemp("p") / "host.yaml"))


@pytest.fixture(scope="module")
def good_run(profile, tmp_path_factory):
    out = tmp_path_factory.mktemp("val")
    assert main(["validate", *TINY, "--cluster", profile, "--dp", "2", "--out", str(out)]) == 0
    return out


def test_targets_table_for_a_tiny_model(good_run):
    res = json.loads((good_run / "validation.json").read_text())
    assert [c["metric"] for c in res["checks"]] == METRICS
    for c in res["checks"]:
        assert set(c) >= {"metric", "target", "measured", "predicted", "rel_error", "pass"}
        assert isinstance(c["pass"], bool) and c["measured"] is not None
        if c["metric"] != "loss_trend":
            assert c["predicted"] is not None and c["rel_error"] is not None
    loss = res["checks"][-1]
    assert loss["pass"] and loss["measured"] < 0 and loss["predicted"] is None
    m = res["measured"]
    assert len(m["losses"]) == 8 and len(m["peak_memory_per_rank"]) == 2 and m["step_time_s"] > 0
    assert res["run"]["layout"].startswith("tp1 pp1 dp2") and res["record"]["step_time_s"] == m["step_time_s"]
    md = (good_run / "validation.md").read_text()
    assert "| metric | target | measured | predicted | error | pass |" in md


def test_broken_run_fails_the_loss_check(profile, capsys):
    # injected divergence: a learning rate 30 000x too high and no clipping
    args = ["validate", *TINY, "--cluster", profile, "--dp", "2", "--lr", "30", "--grad-clip", "0"]
    assert main([*args, "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    loss = res["checks"][-1]
    assert loss["metric"] == "loss_trend" and not loss["pass"]
    assert "loss_trend" in res["summary"]["failed"]
    assert main([*args, "--strict"]) == 1


def test_calibration_loop_stores_constants(profile, good_run, tmp_path, capsys):
    cal = tmp_path / "cal.yaml"
    assert main(["validate", "--calibrate", "--cluster", profile, "--runs", str(good_run / "validation.json"),
                 "--profile-out", str(cal), "--json"]) == 0
    res = json.loads(capsys.readouterr().out)["calibration"]
    assert res["keys"] == ["gemm_bf16"] and res["runs"] == 1
    assert res["after"]["mape"] <= res["before"]["mape"] + 1e-9
    import yaml

    prof = yaml.safe_load(cal.read_text())
    assert prof["efficiency"]["gemm_bf16"] == pytest.approx(res["fitted"]["gemm_bf16"], rel=1e-4)
    assert len(prof["measurements"]["validation_runs"]) == 1
    # the process baseline is fitted to the measured peak: one run, so its error vanishes
    mem = res["memory"]
    assert mem["after"]["median_abs_rel_error"] < 0.01 <= mem["before"]["median_abs_rel_error"] + 0.01
    assert prof["accelerator"]["runtime_context_mib"] == pytest.approx(mem["runtime_context_bytes_after"] / 2**20,
                                                                       abs=0.1)
    from dayzero.specs.cluster import get_cluster

    assert get_cluster(str(cal)).efficiency["gemm_bf16"] > 0


def test_layout_from_a_plan_file(profile, tmp_path, capsys):
    assert main(["predict", "tiny-llama", "--accelerator", "h100", "--devices", "8", "--tp", "2", "--seq", "1024",
                 "--json"]) == 0
    plan = tmp_path / "plan.json"
    plan.write_text(capsys.readouterr().out)
    assert main(["validate", "tiny-llama", "--plan", str(plan), "--cluster", profile, "--nproc", "2", "--seq", "64",
                 "--steps", "4", "--layers", "2", "--hidden", "128", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["run"]["parallel"]["tp"] == 2 and res["run"]["parallel"]["dp"] == 1


def test_bad_requests_are_one_line(profile, capsys):
    assert main(["validate", "tiny-llama", "--cluster", profile, "--nproc", "2", "--tp", "3"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "dayzero: error" in err
    assert main(["validate"]) == 2
    assert main(["validate", "--calibrate"]) == 2
