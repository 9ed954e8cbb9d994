"""The alert rules: one definition, two consumers.

Each :class:`Rule` carries its thresholds (defaults with their source), the PromQL expression
Prometheus evaluates (:mod:`dayzero.monitor.prometheus_rules` writes the shipped alerts.yml from
it) and the same condition in Python over the window of per-step samples the trainer sees
(:mod:`dayzero.monitor.evaluator`), so a rule changes in one place only.

The two sides read the same quantities: the Python side a :class:`StepSample` per step (every
rank's values of that step), Prometheus the exporter's gauges (:mod:`dayzero.monitor.names`)
scraped every few seconds. Rolling statistics are medians over the last ``window_s`` seconds (the
Python side over the steps finished in it, Prometheus over the scrapes in it,
``quantile_over_time(0.5, ...)``), judged only once ``min_samples`` values are in the window.
Job-wide quantities (the loss, which every rank holds after its all-reduce, and the checkpoint
step) are read from rank 0's series; their alerts name no rank (``ranks == ()``).

Pure: no torch import.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Callable, Literal, Mapping, Sequence

from dayzero.errors import DayzeroError
from dayzero.planner.targets import Targets

Severity = Literal["critical", "warning"]


class ThresholdError(DayzeroError):
    """An alert threshold that does not exist or has an impossible value."""


@dataclass(frozen=True)
class Threshold:
    key: str
    default: float
    unit: str
    source: str  # where the default comes from
    help: str
    minimum: float = 0.0  # values below are refused
    integer: bool = False


@dataclass(frozen=True)
class StepSample:
    """Every rank's values of one finished step (index i of each per-rank tuple is rank ``ranks[i]``).

    ``step_time_s``: the rank's iteration, seconds between its consecutive step ends (so a rank that
    sleeps anywhere in the iteration shows it); ``comm_time_s``: the part of its step with a
    collective in flight (time spent waiting for a slower rank counts here); ``None`` in the
    device tuples: not known."""

    step: int
    time_s: float  # unix time at which the step finished
    loss: float | None  # the global loss; None or NaN/Inf when not finite
    tokens_per_s: tuple[float, ...]
    step_time_s: tuple[float, ...]
    comm_time_s: tuple[float, ...]
    mem_bytes: tuple[int, ...]  # peak allocated (CPU: peak resident set)
    mem_capacity_bytes: tuple[int, ...]  # 0: unknown
    temperature_c: tuple[float | None, ...] = ()
    power_w: tuple[float | None, ...] = ()
    last_checkpoint_step: int | None = None  # None: the run does not checkpoint
    ranks: tuple[int, ...] = ()  # default 0..n-1

    def __post_init__(self):
        n = len(self.step_time_s)
        if not self.ranks:
            object.__setattr__(self, "ranks", tuple(range(n)))
        for name in ("tokens_per_s", "comm_time_s", "mem_bytes", "mem_capacity_bytes", "ranks"):
            if len(getattr(self, name)) != n:
                raise DayzeroError(f"step sample {self.step}: {name} has {len(getattr(self, name))} values for "
                                   f"{n} ranks")
        for name in ("temperature_c", "power_w"):
            if getattr(self, name) and len(getattr(self, name)) != n:
                raise DayzeroError(f"step sample {self.step}: {name} has {len(getattr(self, name))} values for "
                                   f"{n} ranks")

    @property
    def busy_s(self) -> tuple[float, ...]:
        """Per rank: iteration time less communication time (the straggler's is the largest)."""
        return tuple(max(0.0, t - c) for t, c in zip(self.step_time_s, self.comm_time_s))


@dataclass(frozen=True)
class Finding:
    """A rule's condition holds: the ranks it names (``()``: the whole job) and why."""

    ranks: tuple[int, ...]
    message: str


Check = Callable[[Sequence[StepSample], Mapping[str, float], float], "Finding | None"]


@dataclass(frozen=True)
class Rule:
    name: str  # the Prometheus alert name
    severity: Severity
    summary: str
    thresholds: tuple[Threshold, ...]
    expr: Callable[[Mapping[str, float]], str]  # thresholds -> PromQL
    check: Check  # (samples oldest first, thresholds, now unix s) -> Finding | None
    description: str = ""  # Prometheus annotation (templated with $labels / $value)
    for_s: float = 0.0  # the condition must hold this long before the alert fires (Prometheus' `for`)

    def promql(self, thresholds: Mapping[str, float] | None = None) -> str:
        return self.expr(resolve_thresholds(thresholds))

    def evaluate(self, samples: Sequence[StepSample], thresholds: Mapping[str, float], now_s: float) -> Finding | None:
        return self.check(samples, thresholds, now_s) if samples else None


# -- thresholds ------------------------------------------------------------------------------

_TARGETS = "dayzero.planner.targets (the Day-0 targets)"
_DAY0 = Targets()  # the planner's targets are the alerts' thresholds: one value each
_OURS = "dayzero default (issue #19); tune per job"

WINDOW = Threshold("window_s", 300.0, "s", _OURS, "Rolling window of the median-based rules.", minimum=1.0)
MIN_SAMPLES = Threshold("min_samples", 5, "samples", _OURS, "Values the window must hold before a rolling rule "
                        "judges.", minimum=1, integer=True)
SPIKE = Threshold("loss_spike_factor", 3.0, "x", "dayzero default; spike detection against a rolling statistic "
                  "as in PaLM (Chowdhery et al. 2022, section 5.1)", "A loss above this x the window's median loss.",
                  minimum=1.0)
DROP = Threshold("throughput_drop_ratio", 0.3, "ratio", _OURS, "Tokens/s below (1 - this) x the window's median.",
                 minimum=0.0)
STRAGGLER = Threshold("straggler_ratio", 0.2, "ratio", _OURS, "A rank's median busy time this share above the "
                      "median rank's.", minimum=0.0)
STRAGGLER_ABS = Threshold("straggler_min_excess_s", 0.05, "s", _OURS, "... and at least this many seconds above it "
                          "(ignores jitter of tiny steps).", minimum=0.0)
MEMORY = Threshold("memory_ratio", _DAY0.memory, "ratio", _TARGETS, "Peak memory above this share of capacity.")
COMM = Threshold("comm_ratio", _DAY0.comm_ratio, "ratio", _TARGETS, "Communication above this share of the step "
                 "(medians over the window).")
HANG = Threshold("hang_s", 300.0, "s", _OURS, "No finished step for this many seconds.", minimum=1.0)
TEMPERATURE = Threshold("temperature_c", 85.0, "celsius", "dayzero default; below the slowdown temperature "
                        "`nvidia-smi -q -d TEMPERATURE` reports on current NVIDIA data-centre GPUs",
                        "Device temperature above this.")
POWER = Threshold("power_w", 700.0, "W", "NVIDIA H100 SXM5 datasheet: max thermal design power 700 W",
                  "Device power draw above this.")
CKPT_AGE = Threshold("checkpoint_max_age_steps", 500, "steps", _OURS, "Steps since the newest checkpoint above "
                     "this.", minimum=1, integer=True)


def _window(samples: Sequence[StepSample], t: Mapping[str, float]) -> list[StepSample]:
    """The samples of the last ``window_s`` seconds, ending at the newest."""
    end = samples[-1].time_s
    return [s for s in samples if s.time_s > end - t["window_s"]]


def _finite(x: float | None) -> bool:
    return x is not None and math.isfinite(x)


def _job(t: Mapping[str, float], metric: str) -> str:
    return f'{metric}{{rank="0"}}'


def _median_over(metric: str, t: Mapping[str, float]) -> str:
    return f"quantile_over_time(0.5, {metric}[{_dur(t['window_s'])}])"


def _enough(metric: str, t: Mapping[str, float]) -> str:
    return f"count_over_time({metric}[{_dur(t['window_s'])}]) >= {_num(t['min_samples'])}"


def _dur(seconds: float) -> str:
    return f"{int(round(seconds))}s"


def _num(x: float) -> str:
    return f"{x:g}"


# -- the rules -------------------------------------------------------------------------------

def _nonfinite_expr(t):
    m = _job(t, "dayzero_loss")
    return f"({m} != {m}) or ({m} == +Inf) or ({m} == -Inf)"  # NaN != NaN; the series' own value is reported


def _nonfinite_check(samples, t, now):
    s = samples[-1]
    if not _finite(s.loss):
        return Finding((), f"loss is {s.loss if s.loss is not None else 'NaN/Inf'} at step {s.step}")
    return None


def _spike_expr(t):
    m = _job(t, "dayzero_loss")
    return f"({m} > {_num(t['loss_spike_factor'])} * {_median_over(m, t)}) and ({_enough(m, t)})"


def _spike_check(samples, t, now):
    w = [s.loss for s in _window(samples, t) if _finite(s.loss)]
    loss = samples[-1].loss
    if len(w) < t["min_samples"] or not _finite(loss):
        return None
    med = statistics.median(w)
    if loss > t["loss_spike_factor"] * med:
        return Finding((), f"loss {loss:.4g} at step {samples[-1].step} is {loss / med:.2f} x the window's median "
                           f"{med:.4g} (threshold {t['loss_spike_factor']:g} x)")
    return None


def _drop_expr(t):
    m = "dayzero_tokens_per_second"
    return f"({m} < {_num(1 - t['throughput_drop_ratio'])} * {_median_over(m, t)}) and ({_enough(m, t)})"


def _per_rank(samples, t, attr):
    """rank -> its values over the window, oldest first."""
    out: dict[int, list[float]] = {}
    for s in _window(samples, t):
        for r, v in zip(s.ranks, getattr(s, attr)):
            out.setdefault(r, []).append(v)
    return out


def _drop_check(samples, t, now):
    last = samples[-1]
    bad, worst = [], None
    for r, vals in _per_rank(samples, t, "tokens_per_s").items():
        if len(vals) < t["min_samples"] or r not in last.ranks:
            continue
        med, now_v = statistics.median(vals), last.tokens_per_s[last.ranks.index(r)]
        if now_v < (1 - t["throughput_drop_ratio"]) * med:
            bad.append(r)
            worst = (now_v, med) if worst is None or now_v / med < worst[0] / worst[1] else worst
    if bad:
        return Finding(tuple(bad), f"tokens/s {worst[0]:.4g} at step {last.step} is {worst[0] / worst[1]:.0%} of the "
                                   f"window's median {worst[1]:.4g} (threshold "
                                   f"{1 - t['throughput_drop_ratio']:.0%}) on rank(s) {_ranks(bad)}")
    return None


def _straggler_expr(t):
    m = "dayzero_step_busy_seconds"
    per_rank = _median_over(m, t)
    median_rank = f"quantile by (job) (0.5, {per_rank})"
    return (f"({per_rank} > on(job) group_left() ({_num(1 + t['straggler_ratio'])} * {median_rank}))"
            f" and ({per_rank} - on(job) group_left() {median_rank} > {_num(t['straggler_min_excess_s'])})"
            f" and ({_enough(m, t)})")


def _straggler_check(samples, t, now):
    meds = {r: statistics.median(v) for r, v in _per_rank(samples, t, "busy_s").items()
            if len(v) >= t["min_samples"]}
    if len(meds) < 2:
        return None
    mid = statistics.median(meds.values())
    slow = sorted(r for r, m in meds.items()
                  if m > (1 + t["straggler_ratio"]) * mid and m - mid > t["straggler_min_excess_s"])
    if slow:
        worst = max(slow, key=meds.get)
        return Finding(tuple(slow), f"straggler rank(s) {_ranks(slow)}: median busy time {meds[worst]:.4g} s "
                                    f"(rank {worst}) vs {mid:.4g} s for the median rank (threshold "
                                    f"+{t['straggler_ratio']:.0%} and +{t['straggler_min_excess_s']:g} s)")
    return None


def _memory_expr(t):
    return f"dayzero_memory_peak_bytes / dayzero_memory_capacity_bytes > {_num(t['memory_ratio'])}"


def _memory_check(samples, t, now):
    s = samples[-1]
    over = [(r, m / c) for r, m, c in zip(s.ranks, s.mem_bytes, s.mem_capacity_bytes)
            if c > 0 and m / c > t["memory_ratio"]]
    if over:
        r, worst = max(over, key=lambda x: x[1])
        return Finding(tuple(r for r, _ in over), f"peak memory {worst:.0%} of capacity on rank {r} (threshold "
                                                  f"{t['memory_ratio']:.0%}); rank(s) over: "
                                                  f"{_ranks([r for r, _ in over])}")
    return None


def _comm_expr(t):
    return (f"({_median_over('dayzero_step_comm_seconds', t)} / {_median_over('dayzero_step_seconds', t)} > "
            f"{_num(t['comm_ratio'])}) and ({_enough('dayzero_step_seconds', t)})")


def _comm_check(samples, t, now):
    comm, step = _per_rank(samples, t, "comm_time_s"), _per_rank(samples, t, "step_time_s")
    over = []
    for r, vals in step.items():
        med_step = statistics.median(vals)
        if len(vals) >= t["min_samples"] and med_step > 0:
            share = statistics.median(comm[r]) / med_step
            if share > t["comm_ratio"]:
                over.append((r, share))
    if over:
        r, worst = max(over, key=lambda x: x[1])
        return Finding(tuple(r for r, _ in over), f"communication {worst:.0%} of the step on rank {r} (median over "
                                                  f"the window; threshold {t['comm_ratio']:.0%}); rank(s) over: "
                                                  f"{_ranks([r for r, _ in over])}")
    return None


def _hang_expr(t):
    return f"time() - dayzero_last_step_timestamp_seconds > {_num(t['hang_s'])}"


def _hang_check(samples, t, now):
    s = samples[-1]
    if now - s.time_s > t["hang_s"]:
        return Finding((), f"no step finished for {now - s.time_s:.0f} s since step {s.step} (threshold "
                           f"{t['hang_s']:g} s)")
    return None


def _device_rule(attr: str, key: str, metric: str, what: str, unit: str):
    def expr(t):
        return f"{metric} > {_num(t[key])}"

    def check(samples, t, now):
        s = samples[-1]
        over = [(r, v) for r, v in zip(s.ranks, getattr(s, attr)) if v is not None and v > t[key]]
        if over:
            r, worst = max(over, key=lambda x: x[1])
            return Finding(tuple(r for r, _ in over), f"{what} {worst:g} {unit} on rank {r} (threshold {t[key]:g} "
                                                      f"{unit}); rank(s) over: {_ranks([r for r, _ in over])}")
        return None

    return expr, check


def _ckpt_expr(t):
    return (f"{_job(t, 'dayzero_step')} - {_job(t, 'dayzero_checkpoint_last_step')} > "
            f"{_num(t['checkpoint_max_age_steps'])}")


def _ckpt_check(samples, t, now):
    s = samples[-1]
    if s.last_checkpoint_step is not None and s.step - s.last_checkpoint_step > t["checkpoint_max_age_steps"]:
        return Finding((), f"newest checkpoint is {s.step - s.last_checkpoint_step} steps old (step "
                           f"{s.last_checkpoint_step}; threshold {t['checkpoint_max_age_steps']:g} steps)")
    return None


def _ranks(rs) -> str:
    return ", ".join(str(r) for r in rs)


_temp_expr, _temp_check = _device_rule("temperature_c", "temperature_c", "dayzero_device_temperature_celsius",
                                       "device temperature", "C")
_power_expr, _power_check = _device_rule("power_w", "power_w", "dayzero_device_power_watts", "device power", "W")

RULES: tuple[Rule, ...] = (
    Rule("DayzeroLossNonFinite", "critical", "Training loss is NaN or infinite", (), _nonfinite_expr,
         _nonfinite_check, "Job {{ $labels.job }}: the loss is {{ $value }}."),
    Rule("DayzeroLossSpike", "warning", "Training loss spiked above k x its rolling median", (SPIKE, WINDOW,
         MIN_SAMPLES), _spike_expr, _spike_check, "Job {{ $labels.job }}: loss {{ $value }}."),
    Rule("DayzeroThroughputDrop", "warning", "Tokens/s fell below the run's rolling median", (DROP, WINDOW,
         MIN_SAMPLES), _drop_expr, _drop_check, "Rank {{ $labels.rank }} of {{ $labels.job }}: {{ $value }} tokens/s."),
    Rule("DayzeroStragglerRank", "warning", "One rank is slower than the median rank", (STRAGGLER, STRAGGLER_ABS,
         WINDOW, MIN_SAMPLES), _straggler_expr, _straggler_check,
         "Rank {{ $labels.rank }} on {{ $labels.node }}: median busy time {{ $value }} s."),
    Rule("DayzeroMemoryHigh", "warning", "Peak memory above its share of capacity", (MEMORY,), _memory_expr,
         _memory_check, "Rank {{ $labels.rank }} on {{ $labels.node }}: {{ $value }} of capacity."),
    Rule("DayzeroCommunicationHigh", "warning", "Communication takes too large a share of the step", (COMM, WINDOW,
         MIN_SAMPLES), _comm_expr, _comm_check, "Rank {{ $labels.rank }}: {{ $value }} of the step."),
    Rule("DayzeroHang", "critical", "No training step finished recently", (HANG,), _hang_expr, _hang_check,
         "Rank {{ $labels.rank }} on {{ $labels.node }}: {{ $value }} s since its last step."),
    Rule("DayzeroDeviceTemperatureHigh", "warning", "Device temperature over threshold", (TEMPERATURE,), _temp_expr,
         _temp_check, "Rank {{ $labels.rank }} on {{ $labels.node }}: {{ $value }} C."),
    Rule("DayzeroDevicePowerHigh", "warning", "Device power draw over threshold", (POWER,), _power_expr,
         _power_check, "Rank {{ $labels.rank }} on {{ $labels.node }}: {{ $value }} W."),
    Rule("DayzeroCheckpointStale", "warning", "Newest checkpoint is too many steps old", (CKPT_AGE,), _ckpt_expr,
         _ckpt_check, "Job {{ $labels.job }}: {{ $value }} steps since the newest checkpoint."),
)

THRESHOLDS: dict[str, Threshold] = {th.key: th for r in RULES for th in r.thresholds}


def default_thresholds() -> dict[str, float]:
    return {k: th.default for k, th in THRESHOLDS.items()}


def resolve_thresholds(overrides: Mapping[str, float] | None = None) -> dict[str, float]:
    """The defaults with ``overrides`` applied; an unknown key or an impossible value is a ThresholdError."""
    out = default_thresholds()
    for k, v in (overrides or {}).items():
        th = THRESHOLDS.get(k)
        if th is None:
            raise ThresholdError(f"alert threshold {k!r}: unknown; expected one of {', '.join(sorted(THRESHOLDS))}")
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < th.minimum:
            raise ThresholdError(f"alert threshold {k}={v!r}: must be a finite number >= {th.minimum:g}")
        if th.integer and v != int(v):
            raise ThresholdError(f"alert threshold {k}={v!r}: must be a whole number of {th.unit}")
        out[k] = float(v)
    return out


def parse_thresholds(items: Sequence[str]) -> dict[str, float]:
    """``["key=value", ...]`` (the CLI's repeatable ``--alert-threshold``) -> resolved thresholds."""
    return resolve_thresholds(threshold_overrides(items))


def threshold_overrides(items: Sequence[str]) -> dict[str, float]:
    """``["key=value", ...]`` -> just those keys, validated."""
    raw: dict[str, float] = {}
    for item in items:
        k, sep, v = item.partition("=")
        try:
            raw[k.strip()] = float(v)
        except ValueError:
            sep = ""
        if not sep:
            raise ThresholdError(f"--alert-threshold {item!r}: expected KEY=NUMBER, e.g. straggler_ratio=0.3")
    resolved = resolve_thresholds(raw)
    return {k: resolved[k] for k in raw}


def rule_names() -> tuple[str, ...]:
    return tuple(r.name for r in RULES)


def select_rules(names: Sequence[str] | None = None) -> tuple[Rule, ...]:
    """The rules named (all by default); an unknown name is a ThresholdError."""
    if names is None:
        return RULES
    by = {r.name: r for r in RULES}
    missing = [n for n in names if n not in by]
    if missing:
        raise ThresholdError(f"alert rule(s) {', '.join(missing)}: unknown; expected {', '.join(by)}")
    return tuple(by[n] for n in names)


__all__ = ["RULES", "THRESHOLDS", "Finding", "Rule", "StepSample", "Threshold", "ThresholdError",
           "default_thresholds", "parse_thresholds", "resolve_thresholds", "rule_names", "select_rules",
           "threshold_overrides"]
