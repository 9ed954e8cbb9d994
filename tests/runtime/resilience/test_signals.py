"""Stopping a ``dayzero train --nproc 2`` job: SIGINT/SIGTERM to the launcher stop every rank
(exit 130/143, never a relaunch), a SIGKILLed launcher leaves no orphan rank, and a save that
hangs is caught by the watchdog's save budget (``--save-timeout``).

Linux only (rank processes are found through /proc).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dayzero.runtime.checkpoint.manifest import verify_version
from dayzero.runtime.checkpoint.versions import scan
from helpers.procs import alive

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="finds rank processes through /proc")]
MODEL = ["tiny-llama", "--layers", "2", "--hidden", "64", "--seq", "32", "--gbs", "4", "--quiet"]


def children(pid: int) -> set[int]:
    """Live child processes of ``pid`` (zombies excluded)."""
    out = set()
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            stat = (p / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) "
        if int(fields[1]) == pid and fields[0] != "Z":
            out.add(int(p.name))
    return out


class Job:
    """``dayzero train --nproc 2`` in the background, stderr into a file."""

    def __init__(self, tmp: Path, *args: str):
        self.metrics, self.ckpt, self.err_path = tmp / "m.jsonl", tmp / "ck", tmp / "stderr.txt"
        env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
        self.err = self.err_path.open("w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "dayzero", "train", *MODEL, "--nproc", "2", "--metrics", str(self.metrics),
             "--ckpt-dir", str(self.ckpt), *args], stdout=subprocess.DEVNULL, stderr=self.err, env=env)

    def records(self) -> list[dict]:
        if not self.metrics.exists():
            return []
        return [json.loads(line) for line in self.metrics.read_text().splitlines() if line.strip()]

    def stderr(self) -> str:
        return self.err_path.read_text()

    def wait_for(self, ready, what: str, timeout: float = 120) -> None:
        end = time.monotonic() + timeout
        while not ready():
            if self.proc.poll() is not None:
                raise AssertionError(f"the job exited {self.proc.returncode} before {what}:\n{self.stderr()[-4000:]}")
            if time.monotonic() > end:
                raise AssertionError(f"no {what} after {timeout} s:\n{self.stderr()[-4000:]}")
            time.sleep(0.1)

    def ranks(self) -> set[int]:
        return children(self.proc.pid)

    def finish(self, timeout: float = 60) -> int:
        try:
            return self.proc.wait(timeout)
        finally:
            self.close()

    def close(self) -> None:
        if self.proc.poll() is None:
            for pid in self.ranks():  # never leave a stuck test's processes behind
                os.kill(pid, signal.SIGKILL)
            self.proc.kill()
            self.proc.wait()
        self.err.close()


def steps(recs: list[dict]) -> list[int]:
    return [r["step"] for r in recs if "event" not in r]


def committed(root: Path) -> list[int]:
    return [v.step for v in scan(root) if v.state == "complete"]


@pytest.mark.parametrize("sig, restarts", [(signal.SIGINT, 0), (signal.SIGTERM, 0), (signal.SIGINT, 1),
                                           (signal.SIGTERM, 1)], ids=["INT", "TERM", "INT-restarts1", "TERM-restarts1"])
def test_signal_stops_every_rank_without_relaunch(tmp_path, sig, restarts):
    job = Job(tmp_path, "--steps", "100000", "--ckpt-every", "3", "--max-restarts", str(restarts))
    try:
        job.wait_for(lambda: len(steps(job.records())) >= 4 and committed(job.ckpt), "training steps")
        ranks = job.ranks()
        assert len(ranks) == 2
        job.proc.send_signal(sig)
        code = job.finish(timeout=60)
    finally:
        job.close()
    err = job.stderr()
    assert code == 128 + sig, err[-4000:]
    assert not any(alive(pid) for pid in ranks)
    assert "retrying" not in err and "Traceback" not in err, err[-4000:]
    recs = job.records()
    assert not [r for r in recs if r.get("event") == "end"]  # stopped, not run to completion
    done = steps(recs)
    assert done == list(range(1, len(done) + 1))  # one attempt: never a relaunch from step 1 or a checkpoint
    last = max(committed(job.ckpt))
    assert verify_version(job.ckpt / f"step-{last:08d}").ok
    line = [ln for ln in err.splitlines() if ln.startswith("dayzero: interrupted")]
    assert line == [f"dayzero: interrupted ({sig.name}): stopped 2 ranks; last committed checkpoint step {last}"]


@pytest.mark.parametrize("async_save", [False, True], ids=["sync", "async"])
def test_signal_during_a_hung_save_keeps_the_previous_version_newest(tmp_path, async_save):
    """Rank 1 hangs inside the save of step 4; the interrupted save must not look committed."""
    job = Job(tmp_path, "--steps", "100000", "--ckpt-every", "2", "--inject-fault", "step=4,rank=1,kind=hang,at=save",
              *(["--async-save"] if async_save else []))
    try:
        job.wait_for(lambda: "injecting fault" in job.stderr(), "the injected hang")
        time.sleep(0.5)
        job.proc.send_signal(signal.SIGINT)
        code = job.finish(timeout=60)
    finally:
        job.close()
    err = job.stderr()
    assert code == 130, err[-4000:]
    assert committed(job.ckpt) == [2]
    assert [v.state for v in scan(job.ckpt) if v.step == 4] in ([], ["partial"])
    assert "last committed checkpoint step 2" in err


def test_sigkill_of_the_launcher_leaves_no_orphan_rank(tmp_path):
    job = Job(tmp_path, "--steps", "100000", "--ckpt-every", "2")
    try:
        job.wait_for(lambda: len(committed(job.ckpt)) >= 2, "two checkpoints")
        ranks = job.ranks()
        assert len(ranks) == 2
        job.proc.kill()
        job.proc.wait()
        end = time.monotonic() + 10
        while any(alive(pid) for pid in ranks) and time.monotonic() < end:
            time.sleep(0.1)
        left = [pid for pid in ranks if alive(pid)]
        versions = [v.name for v in scan(job.ckpt)]
        time.sleep(3)
        later = [v.name for v in scan(job.ckpt)]
    finally:
        for pid in ranks:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        job.close()
    assert not left, f"ranks {left} outlived their launcher"
    assert later == versions  # nothing written after the launcher died


def test_hang_inside_a_save_is_caught_by_the_save_budget(tmp_path):
    job = Job(tmp_path, "--steps", "4", "--ckpt-every", "2", "--watchdog", "60", "--save-timeout", "2",
              "--max-restarts", "1", "--inject-fault", "step=2,rank=1,kind=hang,at=save")
    code = job.finish(timeout=120)
    err = job.stderr()
    assert code == 0, err[-4000:]
    # both ranks are inside the save (rank 0 waits for rank 1's shards): whichever aborts first
    assert re.search(r"watchdog: no progress for [0-9.]+ s in checkpoint save of step 2 \(timeout 2 "
                     r"s\)", err), err[-4000:]
    recs = job.records()
    assert [r for r in recs if r.get("event") == "end"][0]["steps"] == 4
    assert committed(job.ckpt) == [2, 4]
