"""dayzero day0 --validate: the best plan's proxy run on this machine in the Day-0 report
(measured vs predicted, loss curve), the note when torch is absent, and bad input as one line."""

import json
import re

import pytest

from dayzero.cli.app import main
from dayzero.validate.profile import build_profile, write_profile
from helpers.measurements import measurements

# a tiny scenario: tiny-llama on 8 H100s, a small batch so the plan's micro-batches stay small
SCENARIO = ["day0", "tiny-llama", "-a", "h100", "-n", "8", "--gbs", "16", "--seq", "256", "--no-ops"]


def _one_line_error(capsys, argv, flag):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"dayzero: error: {flag}") and len(err.splitlines()) == 1, err


@pytest.mark.slow
def test_day0_validate_puts_the_proxy_run_in_the_report(tmp_path, capsys):
    # a synthetic 2-rank profile: deterministic predictions (accuracy is the benchmark's job)
    profile = write_profile(build_profile(measurements(ranks=2)), tmp_path / "host.yaml")
    out_dir = tmp_path / "r"
    code = main([*SCENARIO, "--validate", "--validate-nproc", "2", "--validate-steps", "6", "--validate-profile",
                 str(profile), "--out", str(out_dir)])
    out = capsys.readouterr()
    assert code == 0, out.err
    r = json.loads((out_dir / "report.json").read_text())
    v = r["validation"]
    assert [c["metric"] for c in v["checks"]] == ["mfu", "peak_memory", "comm_ratio", "step_time", "loss_trend"]
    st = next(c for c in v["checks"] if c["metric"] == "step_time")
    assert st["measured"] > 0 and st["predicted"] > 0
    assert v["run"]["ranks"] == 2 and v["run"]["steps"] == 6 and len(v["measured"]["losses"]) == 6
    assert v["proxy"]["nproc_rule"] == "given" and v["proxy"]["plan_parallel"] == r["plans"][0]["parallel"]
    md = (out_dir / "report.md").read_text()
    assert "## Proxy run on this machine: measured vs predicted" in md and "## Proxy run: Day-0 targets" in md
    assert f"{v['measured']['losses'][-1]:.4g}" in md
    html = (out_dir / "report.html").read_text()
    fig = re.search(r'<figure data-chart="Proxy run loss curve">(.*?)</figure>', html, re.S)
    assert fig and "<polyline" in fig.group(1) and fig.group(1).count("<circle") == 6
    assert "proxy run here" in out.out and "measured vs" in out.out and "predicted" in out.out
    # the next step reruns that proxy layout with dayzero validate
    text = " ".join(out.out.replace("\\\n", " ").split())
    assert f"dayzero validate tiny-llama --nproc 2 --tp {v['run']['parallel']['tp']} --pp 1 --dp " in text


def test_day0_validate_without_torch_is_a_note(tmp_path, capsys, monkeypatch):
    import dayzero.report.day0 as day0

    monkeypatch.setattr(day0, "missing", lambda *modules: list(modules))  # torch and transformers "absent"
    out_dir = tmp_path / "r"
    code = main([*SCENARIO, "--validate", "--out", str(out_dir)])
    out = capsys.readouterr()
    assert code == 0, out.err
    r = json.loads((out_dir / "report.json").read_text())
    assert r["validation"] == {"note": "not run: torch not installed (pip install 'dayzero[runtime]')"}
    assert "torch not installed" in (out_dir / "report.md").read_text()
    assert "torch not installed" in (out_dir / "report.html").read_text()
    assert "torch not installed" in " ".join(out.out.split()) and "Traceback" not in out.err


def test_day0_without_validate_has_no_validation_section(tmp_path, capsys):
    assert main([*SCENARIO, "--out", str(tmp_path)]) == 0
    capsys.readouterr()
    assert "validation" not in json.loads((tmp_path / "report.json").read_text())


def test_a_model_the_runtime_does_not_run_is_a_note(tmp_path, capsys, monkeypatch):
    from dayzero.errors import DayzeroError
    from dayzero.validate import proxy_plan

    def refuse(req, announce):
        raise DayzeroError("x: model_type 'x' is derived from its own modeling code")

    monkeypatch.setattr(proxy_plan, "run_proxy", refuse)
    assert main([*SCENARIO, "--validate", "--out", str(tmp_path)]) == 0
    capsys.readouterr()
    note = json.loads((tmp_path / "report.json").read_text())["validation"]["note"]
    assert note.startswith("not run: x: model_type 'x' is derived")


@pytest.mark.parametrize("flags,flag", [(["--validate-steps", "8"], "--validate-steps"),
                                        (["--validate-nproc", "2"], "--validate-nproc")])
def test_validate_knobs_need_validate(flags, flag, capsys):
    _one_line_error(capsys, [*SCENARIO, *flags], flag)


def test_missing_validate_profile_is_one_line(tmp_path, capsys):
    _one_line_error(capsys, [*SCENARIO, "--validate", "--validate-profile", str(tmp_path / "none.yaml")],
                    str(tmp_path / "none.yaml"))


@pytest.mark.parametrize("flags", [["--validate-steps", "2"], ["--validate-nproc", "0"]])
def test_out_of_range_knobs_exit_2(flags, capsys):
    assert main([*SCENARIO, "--validate", *flags]) == 2
    capsys.readouterr()


@pytest.mark.slow
def test_day0_validate_runs_a_derived_models_proxy(tmp_path, capsys):
    """A model type dayzero has no parser for (derived from transformers' own code) gets its proxy run
    too: measured vs its derived spec, with the approximations' share of each difference."""
    transformers = pytest.importorskip("transformers")
    model = tmp_path / "olmoe"
    transformers.OlmoeConfig(hidden_size=256, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                             num_key_value_heads=4, num_experts=8, num_experts_per_tok=2,
                             vocab_size=512).save_pretrained(model)
    profile = write_profile(build_profile(measurements(ranks=2)), tmp_path / "host.yaml")
    code = main(["day0", str(model), "-a", "h100", "-n", "8", "--gbs", "16", "--seq", "256", "--no-ops", "--validate",
                 "--validate-nproc", "2", "--validate-steps", "5", "--validate-profile", str(profile),
                 "--out", str(tmp_path / "r")])
    out = capsys.readouterr()
    assert code == 0, out.err
    v = json.loads((tmp_path / "r" / "report.json").read_text())["validation"]
    assert v["run"]["derived_from_modeling_code"] and len(v["measured"]["losses"]) == 5
    assert set(v["run"]["approximation_share"]) == {"step_time", "peak_memory"}
    assert "not suggested: dayzero validate" not in out.out
