"""How often a job is interrupted, by component, and what a restart costs.

**Rates by component.** Interruptions are counted per component class and divided by the
exposure the class scales with: accelerator, network and software failures per device-hour (one
GPU, its NIC and links, its rank's process), host failures and planned maintenance per
node-hour. The shipped rates are Llama 3's: 466 interruptions (419 unexpected, 47 planned) in a
54-day snapshot on 16,384 H100 in 2,048 servers, by root cause (Llama Team 2024, "The Llama 3 Herd
of Models", arXiv 2407.21783, sec. 3.3.4 and Table 5; grouping in ``presets/data/facility.json``).
A job of ``D`` devices on ``D / d`` nodes is interrupted at ``sum_c rate_c x exposure_c`` per hour
(independent components in series add their rates). A card or cluster with no published breakdown
takes these H100 rates, and the output says so.

**A team's own history** (:func:`rates_from_incidents`): an incident log, one row per interruption
(``timestamp`` ISO 8601, ``component`` free text, ``devices`` the job's size then) refits the
rates: over the log's span the exposure is ``sum_i (t_(i+1) - t_i) x devices_i`` device-hours,
the rate ``(n - 1) / exposure`` (the Poisson maximum-likelihood estimate with the clock started at
the first incident), split across classes by their share of the ``n`` incidents.

**Restart** (:func:`restart_seconds`): relaunching the job (scheduling, process start,
communicator set-up; ``relaunch_s``) plus reading the last checkpoint back: the busiest device's
model states over its share of the storage fabric's bandwidth.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from datetime import datetime

from dayzero.errors import ConfigError
from dayzero.planner.facility import facility_data

HOURS_PER_DAY = 24.0
CLASSES = ("accelerator", "network", "host", "software", "planned")
PER_NODE = ("host", "planned")
# words of an incident's component text -> its class (first match wins; anything else: software)
_KEYWORDS = (
    ("planned", ("planned", "maintenance", "upgrade", "firmware", "scheduled", "config change")),
    ("accelerator", ("gpu", "npu", "hbm", "sram", "accelerator", "xid", "ecc", "nvlink", "hccs", "thermal",
                     "silent data", "sdc", "device")),
    ("network", ("switch", "cable", "link", "network", "infiniband", "roce", "optic", "transceiver", "fabric")),
    ("host", ("host", "nic", "ssd", "disk", "power supply", "psu", "chassis", "cpu", "memory", "dimm", "node",
              "board", "fan")),
)


@dataclass(frozen=True)
class FailureRates:
    """Interruptions per device-hour (accelerator, network, software) and per node-hour (host,
    planned), with where they came from."""

    per_hour: dict  # class -> rate per device-hour, or per node-hour for the classes in per_node
    source: str
    fitted_on: str = ""  # what the rates were measured on (cards, scale)
    per_node: tuple[str, ...] = PER_NODE

    def by_class_per_day(self, devices: int, devices_per_node: int) -> dict:
        """Interruptions a day of a job on ``devices`` devices, ``devices_per_node`` a node, by class."""
        nodes = devices / devices_per_node
        return {c: r * (nodes if c in self.per_node else devices) * HOURS_PER_DAY for c, r in self.per_hour.items()}

    def job_rate_per_hour(self, devices: int, devices_per_node: int) -> float:
        return sum(self.by_class_per_day(devices, devices_per_node).values()) / HOURS_PER_DAY

    def scaled(self, factor: float) -> FailureRates:
        return FailureRates({c: r * factor for c, r in self.per_hour.items()}, self.source + f" x {factor:g}",
                            self.fitted_on, self.per_node)


def default_rates() -> FailureRates:
    """Llama 3's interruptions by component (``facility.json``), per device-hour or node-hour."""
    f = facility_data()["failures"]
    hours = f["window_days"] * HOURS_PER_DAY
    nodes = f["devices"] / f["devices_per_node"]
    per = {c: v["count"] / (hours * (nodes if v["per"] == "node" else f["devices"]))
           for c, v in f["components"].items()}
    return FailureRates(per, f["source"], f"{f['devices']:,} H100 in {nodes:,.0f} nodes, {f['window_days']} days")


def classify(component: str) -> str:
    """The class of an incident's component text ('GPU HBM3 ECC' -> accelerator); unknown: software."""
    text = component.lower()
    for cls, words in _KEYWORDS:
        if any(w in text for w in words):
            return cls
    return "software"


def _timestamp(text: str, where: str) -> float:
    try:
        t = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise ConfigError(where, "timestamp", f"expected an ISO 8601 time such as 2026-03-01T12:00:00, got "
                                              f"{text[:40]!r}") from None
    return t.timestamp() if t.tzinfo else t.replace(tzinfo=None).timestamp()


def rates_from_incidents(rows: list[dict], source: str) -> FailureRates:
    """Rates refitted on an incident log (rows with ``timestamp``, ``component``, ``devices``), every
    class per device-hour of the team's own jobs."""
    if len(rows) < 2:
        raise ConfigError(source, None, f"an incident log needs at least 2 incidents to measure a rate, got "
                                        f"{len(rows)}")
    events = []
    for i, r in enumerate(rows, start=2):
        where = f"{source} line {i}"
        missing = [k for k in ("timestamp", "component", "devices") if not str(r.get(k) or "").strip()]
        if missing:
            raise ConfigError(where, missing[0], "missing; each row needs timestamp, component and devices")
        try:
            devices = int(str(r["devices"]).strip())
        except ValueError:
            devices = 0
        if devices < 1:
            raise ConfigError(where, "devices", f"expected a whole number of devices >= 1, got {r['devices']!r}")
        events.append((_timestamp(str(r["timestamp"]), where), classify(str(r["component"])), devices))
    events.sort()
    span_h = (events[-1][0] - events[0][0]) / 3600
    if span_h <= 0:
        raise ConfigError(source, "timestamp", "every incident has the same time: the log spans no time")
    exposure = sum((b[0] - a[0]) / 3600 * a[2] for a, b in zip(events, events[1:]))  # device-hours
    total = (len(events) - 1) / exposure  # per device-hour
    counts = {c: sum(1 for e in events if e[1] == c) for c in CLASSES}
    per = {c: total * counts[c] / len(events) for c in CLASSES}
    return FailureRates(per, f"{source}: {len(events)} incidents over {span_h / HOURS_PER_DAY:,.1f} days",
                        f"this team's log, {exposure:,.0f} device-hours", per_node=())


def load_incidents(path: str) -> FailureRates:
    """:func:`rates_from_incidents` of a CSV file (header ``timestamp,component,devices``)."""
    from dayzero.inputs import read_text

    text = read_text(path, "an incident log CSV: timestamp,component,devices")
    reader = csv.DictReader(text.splitlines())
    if not reader.fieldnames or not {"timestamp", "component", "devices"} <= {f.strip() for f in reader.fieldnames}:
        raise ConfigError(path, None, "expected a CSV header with timestamp, component and devices, got "
                                      f"{', '.join(reader.fieldnames or []) or 'none'}")
    rows = [{k.strip(): v for k, v in r.items() if k} for r in reader]
    return rates_from_incidents(rows, path)


def restart_seconds(state_bytes_per_device: float, read_bytes_per_s_per_device: float, relaunch_s: float) -> float:
    """Relaunch plus reading the busiest device's checkpoint back."""
    if not (read_bytes_per_s_per_device > 0 and math.isfinite(read_bytes_per_s_per_device)):
        raise ConfigError("restart", "storage bandwidth", f"expected a positive finite rate, got "
                                                          f"{read_bytes_per_s_per_device!r}")
    return relaunch_s + state_bytes_per_device / read_bytes_per_s_per_device
