"""The hang rule in process: no step evaluates it, so the monitor's hang watch ticks the evaluator
between steps and reports the alert once, while the training thread is stuck (issue #19 item 3)."""

from __future__ import annotations

import threading

import pytest

pytest.importorskip("torch")

from dayzero.monitor.evaluator import RuleEvaluator  # noqa: E402
from dayzero.monitor.rules import StepSample  # noqa: E402
from dayzero.runtime.monitoring import HangWatch  # noqa: E402


def one_step(t: float) -> StepSample:
    return StepSample(step=7, time_s=t, loss=2.0, tokens_per_s=(1e3, 1e3), step_time_s=(1.0, 1.0),
                      comm_time_s=(0.05, 0.05), mem_bytes=(1.0, 1.0), mem_capacity_bytes=(10.0, 10.0),
                      temperature_c=(), power_w=(), last_checkpoint_step=None)


def test_the_hang_is_reported_between_steps_once():
    ev = RuleEvaluator(thresholds={"hang_s": 60})
    ev.observe(one_step(1000.0))
    clock = [1030.0]
    active: dict = {}
    fired = []

    def on_alert(a):
        fired.append(a)
        active[a.name] = a

    watch = HangWatch(ev, threading.Lock(), lambda: active, on_alert, 1.0, clock=lambda: clock[0])
    assert watch.check() == [] and fired == []  # 30 s without a step: not yet
    clock[0] = 1061.0
    (hang,) = watch.check()
    assert hang.name == "DayzeroHang" and hang.step == 7 and "61 s" in hang.message and fired == [hang]
    clock[0] = 1100.0
    assert watch.check() == [] and len(fired) == 1  # still hung: reported once


def test_the_watch_thread_ticks_and_stops():
    ev = RuleEvaluator(thresholds={"hang_s": 1})
    ev.observe(one_step(0.0))
    seen = threading.Event()
    watch = HangWatch(ev, threading.Lock(), dict, lambda a: seen.set(), 0.01, clock=lambda: 5.0).start()
    try:
        assert seen.wait(5)
    finally:
        watch.close()
    assert not watch._thread.is_alive()
