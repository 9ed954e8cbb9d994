"""Interruptions by component, a team's incident log, and the checkpoint interval they drive."""

import math

import pytest

from dayzero.errors import ConfigError
from dayzero.planner.failures import classify, default_rates, load_incidents, rates_from_incidents
from dayzero.planner.training_cost import CostOptions, failure_model, optimal_interval


def test_llama3_reproduced():
    """The component rates, summed over Llama 3's 16,384 GPUs in 2,048 nodes for 54 days, give its
    466 interruptions (419 unexpected + 47 planned); per class as in its Table 5."""
    r = default_rates()
    per_day = r.by_class_per_day(16384, 8)
    assert sum(per_day.values()) * 54 == pytest.approx(466)
    assert per_day["accelerator"] * 54 == pytest.approx(268)
    assert per_day["planned"] * 54 == pytest.approx(47)
    # half the devices per node: the per-node classes double, the rest stay
    assert r.by_class_per_day(16384, 4)["host"] == pytest.approx(2 * per_day["host"])


def test_interval_is_youngs_where_its_assumptions_hold():
    """A checkpoint far shorter than the time between failures: t* = sqrt(2 C M)."""
    f = failure_model(step_s=1.0, ideal_s=1e9, devices=1024, state_bytes_per_device=16e9,
                      options=CostOptions(), devices_per_node=8)
    assert f["interval_s"] == pytest.approx(math.sqrt(2 * f["checkpoint_s"] * f["mtbf_s"]))
    assert f["interval_s"] == pytest.approx(optimal_interval(f["checkpoint_s"], f["mtbf_s"]))
    assert "Young" in f["interval_reason"]
    # restart: relaunch plus reading the checkpoint back at the write bandwidth
    assert f["restart_s"] == pytest.approx(600 + 16e9 / (2e12 / 16384))


def _log(hours_between: float, n: int = 9, devices: int = 512) -> list[dict]:
    causes = ["GPU HBM3 ECC error", "NIC flap", "InfiniBand cable", "NCCL timeout", "firmware upgrade (planned)"]
    return [{"timestamp": "2026-01-01T00:00:00+00:00" if i == 0 else
             __import__("datetime").datetime.fromtimestamp(1767225600 + i * hours_between * 3600,
                                                           tz=__import__("datetime").timezone.utc).isoformat(),
             "component": causes[i % len(causes)], "devices": str(devices)} for i in range(n)]


def test_an_incident_log_with_twice_the_rate_shortens_the_interval_by_sqrt2():
    slow = rates_from_incidents(_log(24.0), "slow.csv")
    fast = rates_from_incidents(_log(12.0), "fast.csv")
    assert fast.job_rate_per_hour(512, 8) == pytest.approx(2 * slow.job_rate_per_hour(512, 8))
    # one incident a day on 512 devices: (9 - 1) incidents over 8 days x 512 devices
    assert slow.job_rate_per_hour(512, 8) == pytest.approx(1 / 24)
    kw = dict(step_s=1.0, ideal_s=1e9, devices=512, state_bytes_per_device=8e9, devices_per_node=8)
    a = failure_model(options=CostOptions(failure_rates=slow), **kw)["interval_s"]
    b = failure_model(options=CostOptions(failure_rates=fast), **kw)["interval_s"]
    assert a / b == pytest.approx(math.sqrt(2))


def test_incident_log_file_and_its_errors(tmp_path):
    p = tmp_path / "incidents.csv"
    rows = _log(6.0, n=5)
    p.write_text("timestamp,component,devices\n" + "".join(f"{r['timestamp']},{r['component']},{r['devices']}\n"
                                                          for r in rows))
    r = load_incidents(str(p))
    assert r.job_rate_per_hour(512, 8) == pytest.approx(1 / 6)
    assert r.per_hour["accelerator"] > 0 and r.per_hour["planned"] > 0
    bad = tmp_path / "bad.csv"
    for text in ("when,what\n1,2\n", "timestamp,component,devices\n2026-01-01,gpu,8\n",
                 "timestamp,component,devices\n2026-01-01,gpu,8\nyesterday,gpu,8\n",
                 "timestamp,component,devices\n2026-01-01,gpu,0\n2026-01-02,gpu,8\n",
                 "timestamp,component,devices\n2026-01-01,gpu,8\n2026-01-01,gpu,8\n"):
        bad.write_text(text)
        with pytest.raises(ConfigError):
            load_incidents(str(bad))


@pytest.mark.parametrize("text,cls", [("GPU HBM3 memory", "accelerator"), ("Faulty GPU", "accelerator"),
                                      ("Network Switch/Cable", "network"), ("Power Supply", "host"),
                                      ("Software Bug", "software"), ("planned maintenance", "planned")])
def test_classify(text, cls):
    assert classify(text) == cls
