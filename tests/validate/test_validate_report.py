"""The targets table and its JSON / Markdown report."""

import json

import numpy as np

from dayzero.report.validation import to_markdown, write_report
from dayzero.validate.loss_trend import loss_trend
from dayzero.validate.targets import Measured, checks, summary

PRED = {"memory": {"peak_bytes": 400 * 2**20, "capacity_bytes": 3 * 2**30}, "time": {"step_s": 1.1},
        "throughput": {"mfu": 0.2}, "comm_ratio": 0.3}


def measured(losses):
    return Measured(step_time_s=1.0, mfu=0.18, peak_memory_bytes=500 * 2**20, capacity_bytes=3 * 2**30,
                    comm_ratio=0.5, loss=loss_trend(losses))


def test_rows_follow_the_contract():
    rows = checks(measured(np.linspace(5, 3, 12)), PRED)
    assert [r["metric"] for r in rows] == ["mfu", "peak_memory", "comm_ratio", "step_time", "loss_trend"]
    for r in rows:
        assert {"metric", "target", "measured", "predicted", "rel_error", "pass"} <= set(r)
        assert isinstance(r["pass"], bool)
    by = {r["metric"]: r for r in rows}
    assert by["step_time"]["rel_error"] == 0.1 * 1.0 / 1.0 or abs(by["step_time"]["rel_error"] - 0.1) < 1e-12
    assert by["step_time"]["pass"]  # within 20 %
    assert not by["mfu"]["pass"] and by["peak_memory"]["pass"] and not by["comm_ratio"]["pass"]
    assert by["loss_trend"]["predicted"] is None and by["loss_trend"]["pass"]
    assert abs(by["peak_memory"]["rel_error"] - (400 - 500) / 500) < 1e-12
    json.dumps(rows)  # plain JSON (no NaN objects)


def test_diverging_loss_fails_the_loss_row():
    rows = checks(measured([3, 3.5, 4.5, 6, 9, 14, 25, 60]), PRED)
    loss = rows[-1]
    assert not loss["pass"] and "not decreasing" in loss["detail"]
    assert summary(rows)["failed"][-1] == "loss_trend"
    nan_rows = checks(measured([3, 2.5, float("nan"), 2.0, 1.9]), PRED)
    assert nan_rows[-1]["measured"] is None and not nan_rows[-1]["pass"]


def test_report_files(tmp_path):
    rows = checks(measured(np.linspace(5, 3, 12)), PRED)
    result = {"run": {"model": "tiny-llama", "layout": "tp2 dp4"}, "checks": rows, "summary": summary(rows),
              "prediction": {"time": {"step_s": 1.1, "compute_s": 0.8, "comm_exposed_s": 0.2, "bubble_s": 0.1,
                                      "optimizer_s": 0.0}}}
    j, m = write_report(result, tmp_path)
    assert json.loads(j.read_text())["checks"][0]["metric"] == "mfu"
    md = m.read_text()
    assert "| metric | target | measured | predicted | error | pass |" in md and "**FAIL**" in md
    assert md == to_markdown(result)
