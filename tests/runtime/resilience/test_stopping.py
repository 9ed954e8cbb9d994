"""Stop signals and parent death for one process (dayzero.runtime.resilience.stopping), the watchdog's save
budget, and the launcher's one-line summary; the multi-rank drills are in test_signals.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from dayzero.errors import DayzeroError
from dayzero.runtime.checkpoint.manifest import MARKER
from dayzero.runtime.config import ModelSection, TrainConfig
from dayzero.runtime.resilience.loop import DEFAULT_SAVE_TIMEOUT_S, ResilienceConfig, resilience_config
from dayzero.runtime.resilience.rank_log import WATCHDOG_EXIT
from dayzero.runtime.resilience.stopping import Interrupted, StopOnSignal
from helpers.procs import alive


def run_py(code: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_stop_signal_raises_interrupted_and_handlers_come_back(sig):
    before = signal.getsignal(sig)
    with pytest.raises(Interrupted) as e:
        with StopOnSignal() as stop:
            os.kill(os.getpid(), sig)
            time.sleep(5)  # the handler raises out of the sleep
    assert stop.signum == sig and e.value.exit_code == 128 + sig
    assert str(e.value) == f"interrupted ({sig.name})" and isinstance(e.value, KeyboardInterrupt)
    assert signal.getsignal(sig) is before


def test_interrupted_says_how_many_ranks_stopped():
    assert Interrupted(signal.SIGTERM, ranks=2).describe() == "interrupted (SIGTERM): stopped 2 ranks"
    assert Interrupted(signal.SIGINT, ranks=1).describe() == "interrupted (SIGINT): stopped 1 rank"
    assert Interrupted(signal.SIGINT, ranks=0).describe() == "interrupted (SIGINT): before any rank started"
    assert Interrupted(signal.SIGINT).exit_code == 130 and Interrupted(signal.SIGTERM).exit_code == 143


@pytest.mark.slow
def test_backstop_ends_a_process_that_does_not_unwind():
    p = run_py("""
        import os, signal, time
        from dayzero.runtime.resilience.stopping import StopOnSignal
        with StopOnSignal(grace_s=0.5):
            try:
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(30)
            except KeyboardInterrupt:
                time.sleep(30)  # stuck while unwinding (in a real rank: a collective whose peer is gone)
        print("unreachable")
    """)
    assert p.returncode == 143 and "unreachable" not in p.stdout
    assert "still running 0.5 s later" in p.stderr


@pytest.mark.slow
def test_backstop_stands_down_once_the_block_is_left():
    p = run_py("""
        import os, signal, time
        from dayzero.runtime.resilience.stopping import StopOnSignal
        try:
            with StopOnSignal(grace_s=0.5):
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(30)
        except KeyboardInterrupt:
            pass
        time.sleep(1.5)
        print("alive")
    """)
    assert p.returncode == 0 and p.stdout.strip() == "alive"


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="finds processes through /proc")
@pytest.mark.parametrize("pdeathsig", [True, False], ids=["prctl", "polling"])
def test_a_process_dies_with_its_parent(tmp_path, pdeathsig):
    """The parent starts a child in ParentWatch and is SIGKILLed; the child must go, by the
    kernel's parent-death signal or (without it) by the polling thread."""
    pidfile = tmp_path / "child.pid"
    child = textwrap.dedent(f"""
        import os, sys, time
        import dayzero.runtime.resilience.stopping as S
        if not {pdeathsig}:
            S._set_parent_death_signal = lambda sig: False
        with S.ParentWatch(poll_s=0.1):
            open({str(pidfile)!r}, "w").write(str(os.getpid()))
            time.sleep(60)
    """)
    parent = subprocess.Popen([sys.executable, "-c", f"import subprocess, sys, time\n"
                               f"subprocess.Popen([sys.executable, '-c', {child!r}])\ntime.sleep(60)"])
    try:
        end = time.monotonic() + 30
        while not pidfile.exists() or not pidfile.read_text():
            assert time.monotonic() < end, "the child never started"
            time.sleep(0.05)
        pid = int(pidfile.read_text())
        parent.kill()
        parent.wait()
        end = time.monotonic() + 5
        while alive(pid) and time.monotonic() < end:
            time.sleep(0.05)
        left = alive(pid)
        if left:
            os.kill(pid, signal.SIGKILL)
        assert not left, "the child outlived its parent"
    finally:
        parent.kill()


# -- the watchdog's save budget ---------------------------------------------------------------

@pytest.mark.slow
def test_save_budget_shorter_than_the_step_timeout_catches_a_hung_save():
    t0 = time.monotonic()
    p = run_py("""
        import time
        from dayzero.runtime.resilience.watchdog import Watchdog
        w = Watchdog(60).start()
        with w.allow(0.5, "checkpoint save of step 3"):
            time.sleep(30)
    """)
    assert p.returncode == WATCHDOG_EXIT and time.monotonic() - t0 < 20
    assert "in checkpoint save of step 3 (timeout 0.5 s)" in p.stderr


@pytest.mark.slow
def test_background_save_past_its_budget_is_a_hang_and_a_finished_one_is_not():
    p = run_py("""
        import time
        from dayzero.runtime.resilience.watchdog import Watchdog
        w = Watchdog(float("inf")).start()  # steps not timed: only checkpoint I/O
        w.watch("async checkpoint save of step 1", lambda: True, 0.3)
        time.sleep(1.5)
        print("finished save ok", flush=True)
        w.watch("async checkpoint save of step 2", lambda: False, 0.3)
        time.sleep(30)
    """)
    assert p.returncode == WATCHDOG_EXIT and "finished save ok" in p.stdout
    assert "in async checkpoint save of step 2 (timeout 0.3 s)" in p.stderr


def test_save_timeout_config():
    cfg = TrainConfig(model=ModelSection("tiny-llama"))
    assert not resilience_config(cfg).watched
    r = resilience_config(cfg.with_(faults={"watchdog": 30}))
    assert r.watched and r.save_budget_s == DEFAULT_SAVE_TIMEOUT_S
    r = resilience_config(cfg.with_(faults={"save_timeout": 5}))  # alone: only checkpoint I/O is timed
    assert r.watched and r.watchdog_s == 0 and r.save_budget_s == 5
    assert TrainConfig.from_dict(cfg.with_(faults={"save_timeout": 7.5}).to_dict()).faults.save_timeout == 7.5
    for bad in (0, -1):
        with pytest.raises(DayzeroError, match=f"--save-timeout {bad}"):
            ResilienceConfig(save_timeout_s=bad)


# -- the launcher's summary line --------------------------------------------------------------

def test_committed_note_names_the_newest_marked_version(tmp_path):
    from dayzero.runtime.train_entry import committed_note

    a, b = tmp_path / "a", tmp_path / "b"
    for name, marked in [("step-00000002", True), ("step-00000004", True), ("step-00000006", False),
                         ("step-00000008.partial", False)]:
        (a / name).mkdir(parents=True)
        if marked:
            (a / name / MARKER).write_text("")
    b.mkdir()
    assert committed_note([str(a)]) == "; last committed checkpoint step 4"
    assert committed_note([None]) == ""
    assert committed_note([str(a), str(a), str(b)]) == (f"; last committed checkpoint step 4 in {a}; "
                                                        f"no committed checkpoint in {b}")
