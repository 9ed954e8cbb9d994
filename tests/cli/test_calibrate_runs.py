"""``dayzero calibrate --runs FILE.csv``: refit on a team's runs, report the leave-one-out error,
and give predictions made with the file the runs' own band."""

from __future__ import annotations

import csv
import json

from typer.testing import CliRunner

from dayzero.cli.app import app
from dayzero.errors import ConfigError
from dayzero.planner.backtest.published import read_rows
from helpers.paths import data_file


def _runs(path):
    rows = read_rows(data_file("published_runs_dev.csv"))
    own = [r for r in rows if r["model"] == "MPT-3b" and r["accelerator"] == "H100 80GB"][:4]
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(own)


def _json(out: str) -> dict:
    return json.loads(out[out.index("{"):])


def test_calibrate_runs_writes_a_calibration_whose_band_predict_prints(tmp_path):
    runs, cal = tmp_path / "runs.csv", tmp_path / "cal.json"
    _runs(runs)
    r = CliRunner().invoke(app, ["calibrate", "--runs", str(runs), "--out", str(cal), "--json"])
    assert r.exit_code == 0, r.output
    got = _json(r.stdout)
    assert got["leave_one_out"]["n"] == 4 and len(got["rows"]) == 4
    band = json.loads(cal.read_text())["error_band"]
    assert band["engines"] == ["llm-foundry"] and band["p80_abs_rel_error"] >= 0
    p = CliRunner().invoke(app, ["predict", "llama-3.1-8b", "--accelerator", "h100", "--devices", "8",
                                 "--calibration", str(cal), "--json"])
    assert p.exit_code == 0, p.output
    eb = _json(p.stdout)["error_band"]
    assert eb["key"] == "calibrated" and eb["n"] == 4


def test_calibrate_runs_refuses_a_file_without_enough_rows(tmp_path):
    runs = tmp_path / "runs.csv"
    rows = read_rows(data_file("published_runs_dev.csv"))
    with runs.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerow(rows[0])
    r = CliRunner().invoke(app, ["calibrate", "--runs", str(runs)])
    assert isinstance(r.exception, ConfigError)  # the CLI's entry point prints it as one line
    assert "leave-one-out needs at least 2" in str(r.exception)
