"""The alert rules in process: each rule fires on its condition and stays quiet without it."""

from __future__ import annotations

import math

import pytest

from dayzero.errors import DayzeroError
from dayzero.monitor.evaluator import RuleEvaluator
from dayzero.monitor.rules import RULES, THRESHOLDS, StepSample, parse_thresholds, resolve_thresholds, select_rules

GIB = 2**30


def sample(step, n=4, loss=2.0, tps=1000.0, step_s=1.0, comm_s=0.05, mem=GIB, cap=10 * GIB, temp=None, power=None,
           ckpt=None, t=None):
    def per(v):
        return (tuple(v) if isinstance(v, (list, tuple)) else (v,) * n)
    return StepSample(step=step, time_s=float(step if t is None else t), loss=loss, tokens_per_s=per(tps),
                      step_time_s=per(step_s), comm_time_s=per(comm_s), mem_bytes=per(mem),
                      mem_capacity_bytes=per(cap), temperature_c=per(temp) if temp is not None else (),
                      power_w=per(power) if power is not None else (), last_checkpoint_step=ckpt)


def run(samples, **th):
    ev = RuleEvaluator(RULES, th)
    out = []
    for s in samples:
        out = ev.observe(s)
    return {a.name: a for a in out}


def test_healthy_run_fires_nothing():
    assert run([sample(i, ckpt=0) for i in range(1, 30)]) == {}


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, None])
def test_nonfinite_loss(bad):
    a = run([sample(1), sample(2, loss=bad)])["DayzeroLossNonFinite"]
    assert a.severity == "critical" and a.ranks == () and a.step == 2


def test_loss_spike_needs_history_and_factor():
    base = [sample(i, loss=2.0) for i in range(1, 10)]
    assert "DayzeroLossSpike" in run(base + [sample(10, loss=6.5)])
    assert "DayzeroLossSpike" not in run(base + [sample(10, loss=5.5)])  # 2.75 x < 3 x
    assert "DayzeroLossSpike" not in run([sample(1), sample(2, loss=50.0)])  # too few samples
    assert "DayzeroLossSpike" in run(base + [sample(10, loss=5.5)], loss_spike_factor=2.5)


def test_throughput_drop():
    base = [sample(i) for i in range(1, 10)]
    a = run(base + [sample(10, tps=600.0)])["DayzeroThroughputDrop"]
    assert a.ranks == (0, 1, 2, 3)
    assert "DayzeroThroughputDrop" not in run(base + [sample(10, tps=800.0)])


def test_straggler_names_the_slow_rank():
    # rank 2 sleeps: its busy time (step - comm) is long, the others wait in communication
    slow = [sample(i, step_s=2.0, comm_s=(1.1, 1.1, 0.1, 1.1)) for i in range(1, 8)]
    a = run(slow)["DayzeroStragglerRank"]
    assert a.ranks == (2,) and "rank 2" in a.message
    even = [sample(i, step_s=2.0, comm_s=(0.1, 0.12, 0.11, 0.1)) for i in range(1, 8)]
    assert "DayzeroStragglerRank" not in run(even)
    # two ranks: the median is their mean
    two = [sample(i, n=2, step_s=1.0, comm_s=(0.5, 0.0)) for i in range(1, 8)]
    assert run(two)["DayzeroStragglerRank"].ranks == (1,)
    # jitter of tiny steps is ignored
    tiny = [sample(i, n=2, step_s=0.01, comm_s=(0.005, 0.0)) for i in range(1, 8)]
    assert "DayzeroStragglerRank" not in run(tiny)


def test_memory_high():
    a = run([sample(1, mem=(GIB, 9 * GIB, GIB, GIB))])["DayzeroMemoryHigh"]
    assert a.ranks == (1,)
    assert "DayzeroMemoryHigh" not in run([sample(1, mem=8 * GIB)])
    assert "DayzeroMemoryHigh" not in run([sample(1, mem=9 * GIB, cap=0)])  # capacity unknown


def test_communication_share():
    assert run([sample(i, comm_s=0.2) for i in range(1, 8)])["DayzeroCommunicationHigh"].ranks == (0, 1, 2, 3)
    assert "DayzeroCommunicationHigh" not in run([sample(i, comm_s=0.1) for i in range(1, 8)])


def test_hang_fires_on_tick():
    ev = RuleEvaluator()
    ev.observe(sample(1, t=1000.0))
    assert not [a for a in ev.tick(1200.0) if a.name == "DayzeroHang"]
    hang = [a for a in ev.tick(1301.0) if a.name == "DayzeroHang"]
    assert hang and hang[0].severity == "critical" and "301 s" in hang[0].message


def test_device_thresholds():
    fired = run([sample(1, temp=(60.0, 90.0, None, 60.0), power=(300.0, 300.0, 750.0, None))])
    assert fired["DayzeroDeviceTemperatureHigh"].ranks == (1,)
    assert fired["DayzeroDevicePowerHigh"].ranks == (2,)
    assert not run([sample(1, temp=80.0, power=650.0)])


def test_checkpoint_age():
    assert run([sample(600, ckpt=50)])["DayzeroCheckpointStale"].ranks == ()
    assert "DayzeroCheckpointStale" not in run([sample(600, ckpt=200)])
    assert "DayzeroCheckpointStale" not in run([sample(600)])  # no checkpointing
    assert "DayzeroCheckpointStale" in run([sample(20, ckpt=5)], checkpoint_max_age_steps=10)


def test_for_duration_delays_firing():
    from dataclasses import replace

    rule = replace(select_rules(["DayzeroMemoryHigh"])[0], for_s=2.0)
    ev = RuleEvaluator((rule,))
    assert ev.observe(sample(1, mem=9 * GIB)) == []
    assert ev.observe(sample(2, mem=9 * GIB)) == []
    assert [a.name for a in ev.observe(sample(3, mem=9 * GIB))] == ["DayzeroMemoryHigh"]
    assert ev.observe(sample(4)) == []  # cleared
    assert ev.observe(sample(5, mem=9 * GIB)) == []  # pending again


def test_window_forgets_old_samples():
    # the spike is judged against the last window_s seconds only
    old = [sample(i, loss=10.0) for i in range(1, 10)]
    recent = [sample(100 + i, loss=2.0) for i in range(1, 10)]
    assert "DayzeroLossSpike" in run(old + recent + [sample(120, loss=7.0)], window_s=50)


def test_thresholds_are_validated():
    assert resolve_thresholds()["memory_ratio"] == 0.85
    assert parse_thresholds(["straggler_ratio=0.5"])["straggler_ratio"] == 0.5
    for bad in (["nope=1"], ["memory_ratio"], ["memory_ratio=x"], ["min_samples=2.5"], ["comm_ratio=-1"]):
        with pytest.raises(DayzeroError):
            parse_thresholds(bad)
    with pytest.raises(DayzeroError):
        select_rules(["DayzeroNope"])


def test_every_threshold_has_a_source_and_every_rule_a_query():
    for th in THRESHOLDS.values():
        assert th.source and th.help and th.unit
    for r in RULES:
        assert r.name.startswith("Dayzero") and r.severity in ("critical", "warning")
        assert "dayzero_" in r.promql()


def test_sample_shape_is_checked():
    with pytest.raises(DayzeroError):
        StepSample(step=1, time_s=0.0, loss=1.0, tokens_per_s=(1.0,), step_time_s=(1.0, 1.0), comm_time_s=(0.0, 0.0),
                   mem_bytes=(1, 1), mem_capacity_bytes=(2, 2))


def test_the_memory_and_comm_alerts_judge_by_the_planners_day0_targets():
    from dayzero.planner.targets import MEMORY_TARGET, Targets

    assert THRESHOLDS["memory_ratio"].default == MEMORY_TARGET == Targets().memory
    assert THRESHOLDS["comm_ratio"].default == Targets().comm_ratio
