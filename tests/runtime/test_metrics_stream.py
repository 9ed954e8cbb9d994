"""The metrics stream is strict JSON, and every record says which attempt wrote it."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")

from dayzero.jsonable import dumps  # noqa: E402
from dayzero.runtime.metrics import MetricsWriter, last_attempt, read_metrics  # noqa: E402


def _strict(line: str) -> dict:
    def refuse(token):
        raise AssertionError(f"non-JSON token {token!r} in {line!r}")

    return json.loads(line, parse_constant=refuse)


def test_non_finite_values_are_null_and_named(tmp_path):
    f = tmp_path / "m.jsonl"
    w = MetricsWriter(f, enabled=True)
    w.write({"step": 1, "loss": float("nan"), "grad_norm": float("inf"), "lr": 1e-3})
    w.write({"step": 2, "loss": 2.5, "grad_norm": 1.0, "lr": 1e-3})
    w.close()
    first, second = (_strict(x) for x in f.read_text().splitlines())
    assert first["loss"] is None and first["grad_norm"] is None
    assert first["nonfinite"] == ["loss", "grad_norm"]
    assert "nonfinite" not in second and second["loss"] == 2.5


def test_each_append_is_a_new_attempt(tmp_path):
    f = tmp_path / "m.jsonl"
    for attempt in (1, 2, 3):
        w = MetricsWriter(f, enabled=True, append=attempt > 1)
        assert w.attempt == attempt
        w.write({"step": 5, "loss": float(attempt)})
        w.close()
    recs = [_strict(x) for x in f.read_text().splitlines()]
    assert [(r["step"], r["attempt"]) for r in recs] == [(5, 1), (5, 2), (5, 3)]
    steps, _ = read_metrics(f)
    assert steps == [recs[-1]]  # the repeated step: the latest attempt's record
    assert MetricsWriter(f, enabled=True).attempt == 1  # a new run (no append) starts a new stream


def test_a_stream_from_before_attempts_and_a_cut_last_line(tmp_path):
    f = tmp_path / "m.jsonl"
    f.write_text('{"step": 1, "loss": 3.0}\n{"step": 2, "loss": 2.0}\n{"step": 3, "lo')
    assert last_attempt(f) == 1
    steps, end = read_metrics(f)
    assert [r["step"] for r in steps] == [1, 2] and end is None
    assert last_attempt(tmp_path / "missing.jsonl") == 0


def test_json_outputs_are_strict():
    text = dumps({"mfu": float("nan"), "rows": [{"x": float("-inf")}], "ok": 1.5})
    assert json.loads(text, parse_constant=lambda t: pytest.fail(t)) == {"mfu": None, "rows": [{"x": None}], "ok": 1.5}
