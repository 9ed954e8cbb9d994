"""`dayzero plan` and `dayzero day0` show the error band and the sensitivity table (text, --json,
report.json/md/html)."""

from __future__ import annotations

import json

from dayzero.cli.app import main
from dayzero.planner.search.error_band import load_table

ARGS = ["plan", "llama-3.1-8b", "-a", "h100", "-n", "64", "--gbs", "256", "--top", "2"]


def test_plan_json_has_the_band_and_the_sensitivity_rows(capsys):
    assert main(ARGS + ["--json"]) == 0
    obj = json.loads(capsys.readouterr().out)
    band, sens = obj["error_band"], obj["sensitivity"]
    t = load_table()
    cell = t["overall"] if band["key"] == "overall" else t["by_family_precision"][band["key"]]
    assert band["key"] in ("dense/bf16", "overall") and band["mape"] == cell["mape"] and band["n"] == cell["n"]
    assert band["low"] < band["mfu"] == obj["plans"][0]["throughput"]["mfu"] < band["high"]
    assert len(sens["rows"]) == 5 and sens["baseline"]["grad_reduce"] == "fp32"
    for r in sens["rows"]:
        assert set(r) >= {"perturbation", "layout", "parallel", "step_s", "mfu", "mfu_change", "baseline_plan_mfu",
                          "best_plan_changes", "covered"}


def test_plan_text_prints_the_band_and_the_table(capsys):
    assert main(ARGS) == 0
    out = capsys.readouterr().out
    assert "error band: MFU" in out and "cross-source" in out
    assert "Sensitivity" in out and "the best plan changes under:" in out
    for word in ("-30%", "+30%", "-10%", "+10%", "BF16"):  # cells wrap: one word of each row
        assert word in out, word


def test_day0_report_has_its_own_band_and_sensitivity_sections(tmp_path, capsys):
    assert main(["day0", "llama-3.1-8b", "-a", "h100", "-n", "64", "--gbs", "256", "--no-ops", "--out",
                 str(tmp_path), "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert set(r["uncertainty"]) == {"error_band", "sensitivity"}
    assert r["uncertainty"]["error_band"]["mfu"] == r["plans"][0]["throughput"]["mfu"]
    md = (tmp_path / "report.md").read_text()
    html = (tmp_path / "report.html").read_text()
    for title in ("## Error band of the best plan", "## Sensitivity of the best plan"):
        assert title in md
        assert title[3:] in html
    assert "scale-out bandwidth +30%" in md and "GEMM efficiency -10%" in html
