"""The one local launcher (runtime/launch.py) as validate's run_ranks uses it: results in rank
order, a user error on one rank becomes its one line, a crash names the rank, nothing hangs; and
as ``dayzero train --nproc`` uses it: a lost rank is one line, a restart and a resume one each,
the surviving ranks' gloo noise only in the run's ranks.log."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytestmark = pytest.mark.slow  # every test here spawns ranks

from dayzero.errors import DayzeroError  # noqa: E402
from dayzero.validate.launch import run_ranks  # noqa: E402
from helpers.paths import TESTS as TESTS_DIR  # noqa: E402

TESTS = str(TESTS_DIR)


@pytest.fixture(autouse=True)
def _importable(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([TESTS, os.environ.get("PYTHONPATH", "")]))
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)


def test_results_in_rank_order_one_thread_each():
    out = run_ranks("helpers.launch_funcs:echo", {"tag": "x"}, 2)
    assert out == [{"rank": r, "sum": 3.0, "threads": "1", "tag": "x"} for r in range(2)]
    assert "OMP_NUM_THREADS" not in os.environ  # restored for the caller


def test_user_error_on_one_rank_is_one_line():
    with pytest.raises(DayzeroError) as e:
        run_ranks("helpers.launch_funcs:user_error_on_rank1", {}, 2)
    assert str(e.value) == "tp 3 does not divide 4 heads; choose a divisor"


def test_crash_names_the_function_and_rank():
    with pytest.raises(DayzeroError) as e:
        run_ranks("helpers.launch_funcs:crash_on_rank0", {}, 2)
    msg = str(e.value)
    assert "helpers.launch_funcs:crash_on_rank0" in msg
    # rank 0's own cause is named either way; whether it had exited (code 1) or was still tearing down
    # when rank 1 failed and the launcher stopped it (SIGTERM) is a race the machine's load decides
    assert re.search(r"rank 0: (exit code 1|killed by SIGTERM); RuntimeError: boom", msg), msg
    log = Path(re.search(r"details in (\S+)$", msg).group(1))  # kept although the launch directory is gone
    try:
        assert "Traceback" in log.read_text() and "raise RuntimeError(\"boom\")" in log.read_text()
    finally:
        log.unlink()


MODEL = ["tiny-llama", "--layers", "2", "--hidden", "64", "--seq", "32", "--gbs", "4", "--quiet", "--nproc", "2",
         "--steps", "6", "--ckpt-every", "2", "--max-restarts", "1"]


def train(tmp: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    return subprocess.run([sys.executable, "-m", "dayzero", "train", *MODEL, "--ckpt-dir", str(tmp / "ck"),
                           "--metrics", str(tmp / "m.jsonl"), *args], capture_output=True, text=True, timeout=600,
                          env=env)


def test_lost_rank_is_one_line_then_restart_and_resume(tmp_path):
    p = train(tmp_path, "--inject-fault", "step=3,rank=1,kind=kill")
    assert p.returncode == 0, p.stderr[-4000:]
    lines = p.stderr.splitlines()
    assert "Traceback" not in p.stderr and len(lines) < 15, p.stderr
    died = [i for i, ln in enumerate(lines) if ln.startswith("dayzero: rank 1: killed by SIGKILL")]
    restart = lines.index("dayzero: restarting (attempt 1/1) from checkpoint step 2")
    resumed = lines.index("dayzero: resumed at step 2")
    assert len(died) == 1 and died[0] < restart < resumed, p.stderr
    assert not [ln for ln in lines if ln.startswith("dayzero: rank 0:")]  # the survivor is a consequence
    log = (tmp_path / "m.ranks.log").read_text()
    headers = re.findall(r"^===== (attempt \d, rank \d): (.*) =====$", log, re.M)
    assert [h for h, _ in headers] == ["attempt 0, rank "
                                       "0", "attempt 0, rank 1", "attempt 1, rank 0", "attempt 1, rank 1"]
    assert headers[1][1].startswith("killed by SIGKILL") and headers[2][1] == headers[3][1] == "ok"
    assert "dayzero: injecting fault step=3,rank=1" in log


def test_exhausted_restarts_end_in_one_line_with_the_cause_and_the_log(tmp_path):
    p = train(tmp_path, "--inject-fault", "step=3,rank=1,kind=kill",
              "--inject-fault", "step=4,rank=0,kind=exception,attempt=1")
    assert p.returncode == 1, p.stderr[-4000:]
    assert "Traceback" not in p.stderr
    errors = [ln for ln in p.stderr.splitlines() if ln.startswith("dayzero: error:")]
    log = tmp_path / "m.ranks.log"
    assert errors == [f"dayzero: error: rank 0: exit code 1; InjectedFault: injected fault step=4,rank=0,"
                      f"kind=exception,at=step,attempt=1; gave up after 1 restart; details in {log}"]
    assert "Traceback" in log.read_text() and "InjectedFault" in log.read_text()
