"""The hang watchdog under torchrun, with the small harness in ckpt_toy.py (2 ranks).

The other drills (kill, crash between shard writes, corrupt shards, reshard) run end to end
through ``dayzero train`` in test_ckpt_train.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.paths import HELPERS

pytestmark = pytest.mark.slow
TOY = str(HELPERS / "ckpt_toy.py")


def torchrun(nproc: int, args: list[str], restarts: int = 0, timeout: int = 300) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
           f"--max-restarts={restarts}", "--monitor-interval=0.2", TOY, *args]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    if p.returncode != 0:
        raise AssertionError(f"torchrun exited {p.returncode}:\n{p.stdout[-3000:]}\n{p.stderr[-6000:]}")
    return p


def records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def losses(recs: list[dict], attempt: int | None = None) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in recs if "event" not in r and (attempt is None or r["attempt"] == attempt)}


def events(recs: list[dict], name: str) -> list[dict]:
    return [r for r in recs if r.get("event") == name]


def test_hang_is_aborted_by_the_watchdog_and_restarted(tmp_path):
    m = tmp_path / "m.jsonl"
    torchrun(2, ["--steps", "6", "--ckpt-every", "2", "--ckpt-dir", str(tmp_path / "ck"), "--metrics", str(m),
                 "--watchdog", "8", "--inject-fault", "step=4,rank=1,kind=hang"], restarts=1)
    recs = records(m)
    abort = events(recs, "watchdog_abort")
    assert abort and abort[0]["attempt"] == 0 and abort[0]["step"] == 3
    assert events(recs, "checkpoint_loaded")[0]["step"] == 2
    assert max(losses(recs, 1)) == 6 and losses(recs, 1)[3] == losses(recs, 0)[3]
