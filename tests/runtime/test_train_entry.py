"""dayzero train's launch choice (runtime.train_entry): torchrun or --nproc, and the checkpoint directory's lock."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from dayzero.runtime.checkpoint.dirlock import CheckpointLocked, read_holder
from dayzero.runtime.train_entry import ckpt_dir_lock, launch_world


def test_the_world_is_torchruns_under_torchrun_and_nproc_otherwise(monkeypatch):
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(k, raising=False)
    assert launch_world(None) == (False, 1)
    assert launch_world(4) == (False, 4)
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "8")
    assert launch_world(4) == (False, 4)  # no LOCAL_RANK: not a torchrun rank
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert launch_world(4) == (True, 8)


def test_a_spawning_job_holds_the_lock_and_a_single_process_only_checks_it(tmp_path, monkeypatch):
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(k, raising=False)
    with ckpt_dir_lock(None, False, 4):  # no directory: nothing to lock
        pass
    with ckpt_dir_lock(str(tmp_path), False, 1):
        assert read_holder(tmp_path) is None  # rank 0's Checkpointer takes it, not the launcher
    with ckpt_dir_lock(str(tmp_path), False, 4):
        holder = read_holder(tmp_path)
        assert holder is not None
        with ckpt_dir_lock(str(tmp_path), False, 1):  # this process holds it: the same job
            pass
    assert read_holder(tmp_path) is None


@pytest.mark.slow
def test_a_directory_locked_by_a_live_job_is_refused_before_any_work(tmp_path, monkeypatch):
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(k, raising=False)
    hold = ("import sys, time; from dayzero.runtime.checkpoint.dirlock import DirLock; "
            "lock = DirLock(sys.argv[1]).acquire(); print('ready', flush=True); time.sleep(60)")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in [os.path.abspath("src"),
                                                                   os.environ.get("PYTHONPATH")] if p)}
    p = subprocess.Popen([sys.executable, "-c", hold, str(tmp_path)], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert p.stdout.readline().strip() == "ready"
        for world in (1, 4):
            with pytest.raises(CheckpointLocked, match=f"pid {p.pid}"):
                with ckpt_dir_lock(str(tmp_path), False, world):
                    raise AssertionError("entered a locked directory")
    finally:
        p.kill()
        p.wait()
