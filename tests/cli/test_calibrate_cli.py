"""dayzero calibrate end to end on 2 gloo ranks (quick sizes), and the profile as --cluster."""

import json

import pytest

from dayzero.cli.app import main

pytestmark = pytest.mark.slow


def test_calibrate_writes_a_profile_the_planner_accepts(tmp_path, capsys):
    out = tmp_path / "host.yaml"
    assert main(["calibrate", "--nproc", "2", "--quick", "--out", str(out), "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    prof = res["profile"]
    assert res["path"] == str(out) and out.exists()
    assert prof["accelerator"]["devices_per_node"] == 2 and prof["efficiency"]["intra"] == 1.0
    fits = prof["measurements"]["fits"]
    assert {"fp32", "bf16"} <= set(fits) and all(f["peak_tflops"] > 0 for f in fits.values())
    kinds = {r["collective"] for r in prof["measurements"]["collectives"]}
    assert kinds == {"all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv"}
    assert main(["predict", "tiny-llama", "--cluster", str(out), "--dp", "2", "--seq", "256", "--json"]) == 0
    pred = json.loads(capsys.readouterr().out)
    assert pred["devices"] == 2 and pred["time"]["step_s"] > 0


def test_calibrate_rejects_stray_options(capsys):
    assert main(["calibrate", "--accelerator", "h100"]) == 2
    assert "only apply with --import-nccl-tests" in capsys.readouterr().err
