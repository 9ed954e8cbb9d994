"""The error band says what it rests on (issue 34): the cards, device counts and model sizes of
the held-out rows behind it, and where a plan lies outside them; the day0 report shows it beside
the band."""

from __future__ import annotations

from dayzero.planner.search.error_band import error_band, error_table, evidence, load_table, outside

ROWS = [{"family": "dense", "gemm_precision": "bf16", "group": g, "rel_error": e, "accelerator": a, "devices": d,
         "params": p} for g, e, a, d, p in (("A", 0.1, "h100", 8, 8e9), ("A", -0.1, "h100", 64, 70e9),
                                            ("B", 0.05, "a100", 512, 175e9), ("B", 0.0, "a100", 16, 8e9),
                                            ("C", 0.2, "h100", 1024, 405e9))]


def test_error_table_records_the_evidence_of_each_cell():
    t = error_table(ROWS, 1, "cmd", "2026-12-07")
    ev = t["evidence"]["dense/bf16"]
    assert ev == {"accelerators": {"h100": 3, "a100": 2}, "devices": [8, 1024], "params": [8e9, 405e9]}
    assert t["evidence"]["overall"] == evidence(ROWS)


def test_outside_names_each_way_a_plan_extrapolates():
    ev = evidence(ROWS)
    assert outside(ev, "h100", 64, 70e9) == ()
    out = outside(ev, "huawei_ascend_910b", 8192, 3e12)
    assert len(out) == 3 and "huawei_ascend_910b" in out[0] and "8,192" in out[1] and "3000 B" in out[2]


def test_the_shipped_band_names_its_rows_and_the_plan_beyond_them():
    t = load_table()
    inside = error_band(t, "dense", "bf16", 0.4, "nvidia_h100_sxm", 64, 8e9)
    assert "nvidia_h100_sxm" in inside.evidence and inside.extrapolates == ()
    beyond = error_band(t, "dense", "bf16", 0.4, "huawei_ascend_910b", 8192, 3e12)
    assert any("huawei_ascend_910b" in x for x in beyond.extrapolates) and "extrapolates" in beyond.text()


def test_day0_report_shows_the_evidence_beside_the_band(tmp_path, capsys):
    import json

    from dayzero.cli.app import main

    assert main(["day0", "tiny-llama", "-a", "910b", "-n", "8", "--gbs", "64", "--no-ops", "--out", str(tmp_path)]) == 0
    capsys.readouterr()
    band = json.loads((tmp_path / "report.json").read_text())["uncertainty"]["error_band"]
    md = (tmp_path / "report.md").read_text()
    assert band["evidence"] and band["evidence"] in md and "extrapolates: huawei_ascend_910b is in none" in md
    assert band["evidence"].replace("'", "&#x27;") in (tmp_path / "report.html").read_text()
