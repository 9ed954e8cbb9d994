"""``dayzero train`` end to end: loss falls on the built-in corpus; bad input is one line, exit 2,
and no rank is left running."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

pytest.importorskip("torch")

from dayzero.cli.app import main  # noqa: E402
from dayzero.runtime.config import ModelSection, TrainConfig  # noqa: E402
from dayzero.runtime.train_entry import spawn  # noqa: E402
from dayzero.specs.parallel import ParallelConfig  # noqa: E402


def _run(args, capsys):
    code = main(["train", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.slow
def test_loss_decreases_over_200_steps_on_the_default_corpus(tmp_path, capsys):
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one rank in this process; steadier on a shared 2-core machine
    try:
        m = tmp_path / "m.jsonl"
        code, out, err = _run(["tiny-llama", "--steps", "200", "--seq", "64", "--gbs", "8", "--mbs", "8",
                               "--compute-dtype", "fp32", "--metrics", str(m), "--quiet"], capsys)
    finally:
        torch.set_num_threads(threads)
    assert code == 0, err
    recs = [json.loads(line) for line in m.read_text().splitlines()]
    steps = [r for r in recs if "step" in r]
    assert len(steps) == 200 and recs[-1]["event"] == "end"
    first = sum(r["loss"] for r in steps[:10]) / 10
    last = sum(r["loss"] for r in steps[-10:]) / 10
    assert first > 5.0  # ~ln(257): nothing learned yet
    assert last < 0.5 * first, f"loss {first:.3f} -> {last:.3f}"
    # and it falls steadily, not by luck at the end: each quarter's mean below the previous one
    q = [sum(r["loss"] for r in steps[i:i + 50]) / 50 for i in range(0, 200, 50)]
    assert q == sorted(q, reverse=True), q
    assert (tmp_path / "m.config.json").exists()


@pytest.mark.parametrize("args, expect", [
    (["--tp", "2", "--pp", "2", "--dp", "2", "--nproc", "4"], "2*1*2*2 = 8 must equal the 4 devices"),
    (["--tp", "3", "--nproc", "3"], "attention heads (8) must be divisible by tp (3)"),
    (["--data", "/nonexistent/dir/*.txt", "--nproc", "2"], "--data /nonexistent/dir/*.txt: no such file"),
    (["--compute-dtype", "fp16"], "got 'fp16'"),
])
def test_bad_input_is_one_line_and_exit_2(args, expect, capsys):
    code, out, err = _run(["tiny-llama", "--steps", "2", *args], capsys)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("dayzero: error: ") and expect in lines[0], err
    assert "Traceback" not in err


@pytest.mark.slow
def test_error_inside_ranks_stops_every_rank(tmp_path, capfd):
    """A config that reaches the ranks (no parent check) and fails there: every rank exits, the
    parent prints the message once and returns 2."""
    cfg = TrainConfig(model=ModelSection("tiny-llama"), parallel=ParallelConfig(dp=2, seq=32), steps=2, quiet=True,
                      data=str(tmp_path / "missing" / "*.txt"))
    t0 = time.monotonic()
    code = spawn(cfg, 2)
    elapsed = time.monotonic() - t0
    err = capfd.readouterr().err
    assert code == 2
    msgs = [line for line in err.splitlines() if line.startswith("dayzero: error:")]
    assert len(msgs) == 1 and "no such file" in msgs[0], err
    assert elapsed < 120
    ps = subprocess.run(["ps", "-eo", "ppid=,args="], capture_output=True, text=True).stdout.splitlines()
    mine = [line for line in ps if line.split(None, 1)[0] == str(os.getpid()) and "dayzero.runtime.train_entry" in line]
    assert mine == []  # the agent stopped (and reaped) every rank before returning


def test_help_has_an_example():
    out = subprocess.run([sys.executable, "-m", "dayzero", "train", "--help"], capture_output=True, text=True,
                         env={"COLUMNS": "200", "PATH": "", **_pythonpath()})
    assert out.returncode == 0 and "Example" in out.stdout and "--nproc" in out.stdout


def _pythonpath() -> dict:
    return {k: v for k, v in os.environ.items() if k in ("PYTHONPATH", "HOME")}


def test_json_output(tmp_path, capsys):
    code, out, err = _run(["tiny-llama", "--steps", "2", "--seq", "32", "--gbs", "2", "--hidden", "64",
                           "--layers", "2", "--json", "--data", str(_corpus_file(tmp_path))], capsys)
    assert code == 0, err
    obj = json.loads(out)
    assert obj["end"]["event"] == "end" and obj["end"]["steps"] == 2 and len(obj["steps"]) == 2
    assert obj["config"]["parallel"]["gbs"] == 2 and obj["config"]["compute_dtype"] == "fp32"


def _corpus_file(tmp_path):
    p = tmp_path / "text.txt"
    p.write_text("a small text for a small test. " * 40)
    return p
