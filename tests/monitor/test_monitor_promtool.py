"""The shipped alerts.yml: generated from the one rule definition, accepted by ``promtool check
rules``, and each rule unit-tested by ``promtool test rules`` with a firing and a quiet case.
promtool comes with Debian's ``prometheus`` package (.ci/run installs it); without it the
promtool tests skip, saying so."""

from __future__ import annotations

import shutil
import subprocess

import pytest
import yaml

from dayzero.monitor.prometheus_rules import rules_yaml, shipped_rules_path
from dayzero.monitor.rules import RULES

PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed (apt-get install prometheus)")

INTERVAL = "10s"


def L(rank=0):
    return {"job": "t", "node": "n0", "rank": str(rank)}


def series(metric, values, rank=0):
    labels = ",".join(f'{k}="{v}"' for k, v in L(rank).items())
    return {"series": f"{metric}{{{labels}}}", "values": values}


def rule(name):
    return next(r for r in RULES if r.name == name)


def expected(name, value, rank=0):
    """The alert promtool must see: labels of the series plus severity, annotations rendered."""
    r = rule(name)
    doc = yaml.safe_load(rules_yaml([r]))["groups"][0]["rules"][0]
    notes = dict(doc["annotations"])
    if "description" in notes:
        notes["description"] = (notes["description"].replace("{{ $labels.job }}", "t")
                                .replace("{{ $labels.rank }}", str(rank)).replace("{{ $labels.node }}", "n0")
                                .replace("{{ $value }}", value))
    return {"exp_labels": {**L(rank), "severity": r.severity}, "exp_annotations": notes}


# rule -> (input series firing, its value and rank, eval time), (input series quiet, eval time)
ranks4 = [0, 1, 3]
CASES = {
    "DayzeroLossNonFinite": ([series("dayzero_loss", "2 2 NaN")], ("NaN", 0), "20s",
                             [series("dayzero_loss", "2 2 2")], "20s"),
    "DayzeroLossSpike": ([series("dayzero_loss", "2+0x8 7")], ("7", 0), "90s",
                         [series("dayzero_loss", "2+0x8 5")], "90s"),
    "DayzeroThroughputDrop": ([series("dayzero_tokens_per_second", "1000+0x8 600")], ("600", 0), "90s",
                              [series("dayzero_tokens_per_second", "1000+0x8 800")], "90s"),
    "DayzeroStragglerRank": ([series("dayzero_step_busy_seconds", "1+0x9", r) for r in ranks4]
                             + [series("dayzero_step_busy_seconds", "2+0x9", 2)], ("2", 2), "90s",
                             [series("dayzero_step_busy_seconds", "1+0x9", r) for r in ranks4]
                             + [series("dayzero_step_busy_seconds", "1.1+0x9", 2)], "90s"),
    "DayzeroMemoryHigh": ([series("dayzero_memory_peak_bytes", "9"), series("dayzero_memory_capacity_bytes", "10")],
                          ("0.9", 0), "0s",
                          [series("dayzero_memory_peak_bytes", "8"), series("dayzero_memory_capacity_bytes", "10")],
                          "0s"),
    "DayzeroCommunicationHigh": ([series("dayzero_step_comm_seconds", "0.2+0x9"),
                                  series("dayzero_step_seconds", "1+0x9")], ("0.2", 0), "90s",
                                 [series("dayzero_step_comm_seconds", "0.1+0x9"),
                                  series("dayzero_step_seconds", "1+0x9")], "90s"),
    "DayzeroHang": ([series("dayzero_last_step_timestamp_seconds", "0+0x40")], ("400", 0), "400s",
                    [series("dayzero_last_step_timestamp_seconds", "0+10x40")], "400s"),
    "DayzeroDeviceTemperatureHigh": ([series("dayzero_device_temperature_celsius", "90")], ("90", 0), "0s",
                                     [series("dayzero_device_temperature_celsius", "80")], "0s"),
    "DayzeroDevicePowerHigh": ([series("dayzero_device_power_watts", "750")], ("750", 0), "0s",
                               [series("dayzero_device_power_watts", "650")], "0s"),
    "DayzeroCheckpointStale": ([series("dayzero_step", "600"), series("dayzero_checkpoint_last_step", "50")],
                               ("550", 0), "0s",
                               [series("dayzero_step", "600"), series("dayzero_checkpoint_last_step", "200")], "0s"),
}


def promtool_tests(rules_path) -> dict:
    tests = []
    for name, (fire, (value, rank), t_fire, quiet, t_quiet) in CASES.items():
        tests.append({"name": f"{name} fires", "interval": INTERVAL, "input_series": fire,
                      "alert_rule_test": [{"eval_time": t_fire, "alertname": name,
                                           "exp_alerts": [expected(name, value, rank)]}]})
        tests.append({"name": f"{name} quiet", "interval": INTERVAL, "input_series": quiet,
                      "alert_rule_test": [{"eval_time": t_quiet, "alertname": name, "exp_alerts": []}]})
    # an infinite loss fires too (the NaN case above is the x != x half of the expression)
    for inf in ("+Inf", "-Inf"):
        tests.append({"name": f"DayzeroLossNonFinite fires on {inf}", "interval": INTERVAL,
                      "input_series": [series("dayzero_loss", f"2 2 {inf}")],
                      "alert_rule_test": [{"eval_time": "20s", "alertname": "DayzeroLossNonFinite",
                                           "exp_alerts": [expected("DayzeroLossNonFinite", inf)]}]})
    return {"rule_files": [str(rules_path)], "evaluation_interval": INTERVAL, "tests": tests}


def test_shipped_file_is_the_generated_one():
    assert shipped_rules_path().read_text(encoding="utf-8") == rules_yaml(), \
        "alerts.yml is stale: regenerate with `dayzero monitor --write-rules src/dayzero/monitor/alerts.yml`"


def test_every_rule_has_both_cases():
    assert set(CASES) == {r.name for r in RULES}


@needs_promtool
def test_promtool_check_rules():
    out = subprocess.run([PROMTOOL, "check", "rules", str(shipped_rules_path())], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"{len(RULES)} rules found" in out.stdout


@needs_promtool
def test_promtool_test_rules(tmp_path):
    f = tmp_path / "alerts_test.yml"
    f.write_text(yaml.safe_dump(promtool_tests(shipped_rules_path()), sort_keys=False), encoding="utf-8")
    out = subprocess.run([PROMTOOL, "test", "rules", str(f)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


@needs_promtool
def test_promtool_test_fails_on_a_wrong_expectation(tmp_path):
    """The harness can fail: a quiet case expected to fire is reported."""
    doc = promtool_tests(shipped_rules_path())
    doc["tests"] = [doc["tests"][1]]
    doc["tests"][0]["alert_rule_test"][0]["exp_alerts"] = [expected("DayzeroLossNonFinite", "2")]
    f = tmp_path / "wrong_test.yml"
    f.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    assert subprocess.run([PROMTOOL, "test", "rules", str(f)], capture_output=True, text=True).returncode != 0
