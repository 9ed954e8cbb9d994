"""The one local launcher (runtime/launch.py) as validate's run_ranks uses it: results in rank
order, a user error on one rank becomes its one line, a crash names the rank, nothing hangs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytest.importorskip("torch")

from dayzero.errors import DayzeroError  # noqa: E402
from dayzero.validate.launch import run_ranks  # noqa: E402

TESTS = str(Path(__file__).resolve().parent)


@pytest.fixture(autouse=True)
def _importable(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([TESTS, os.environ.get("PYTHONPATH", "")]))
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)


def test_results_in_rank_order_one_thread_each():
    out = run_ranks("launch_funcs:echo", {"tag": "x"}, 2)
    assert out == [{"rank": r, "sum": 3.0, "threads": "1", "tag": "x"} for r in range(2)]
    assert "OMP_NUM_THREADS" not in os.environ  # restored for the caller


def test_user_error_on_one_rank_is_one_line():
    with pytest.raises(DayzeroError) as e:
        run_ranks("launch_funcs:user_error_on_rank1", {}, 2)
    assert str(e.value) == "tp 3 does not divide 4 heads; choose a divisor"


def test_crash_names_the_function_and_rank():
    with pytest.raises(DayzeroError) as e:
        run_ranks("launch_funcs:crash_on_rank0", {}, 2)
    assert "launch_funcs:crash_on_rank0" in str(e.value) and "exit code 1" in str(e.value)
