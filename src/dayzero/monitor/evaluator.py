"""The alert rules evaluated in process, on the samples the trainer produces (no Prometheus server).

``RuleEvaluator(rules, thresholds).observe(sample)`` adds one step's :class:`StepSample` to the
window and returns the alerts firing after it; ``tick(now_s)`` re-evaluates without a new step
(the hang rule fires this way). A rule with ``for_s`` fires once its condition has held that long
(Prometheus' pending -> firing, https://prometheus.io/docs/prometheus/latest/configuration/alerting_rules/),
timed by the samples' clocks. Consumers (logging, checkpoint-now, stop-for-restart) act on the
returned :class:`Alert` list; the evaluator itself has no side effects.

Pure: no torch import.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Mapping, Sequence

from dayzero.monitor.rules import RULES, Rule, StepSample, resolve_thresholds

MAX_SAMPLES = 10_000  # the window never holds more steps than this, however short they are


@dataclass(frozen=True)
class Alert:
    name: str  # the rule's name, as in alerts.yml
    severity: str  # "critical" | "warning"
    ranks: tuple[int, ...]  # the offending ranks; () for a job-wide condition (loss, hang, checkpoint age)
    message: str
    step: int = 0  # the newest step when it fired

    def to_dict(self) -> dict:
        return {"name": self.name, "severity": self.severity, "ranks": list(self.ranks), "message": self.message,
                "step": self.step}


class RuleEvaluator:
    def __init__(self, rules: Sequence[Rule] = RULES, thresholds: Mapping[str, float] | None = None):
        self.rules = tuple(rules)
        self.thresholds = resolve_thresholds(thresholds)
        self._samples: deque[StepSample] = deque(maxlen=MAX_SAMPLES)
        self._pending: dict[str, float] = {}  # rule name -> time its condition started to hold

    @property
    def samples(self) -> tuple[StepSample, ...]:
        return tuple(self._samples)

    def observe(self, sample: StepSample) -> list[Alert]:
        """Add one step and return the alerts firing after it (rule order)."""
        self._samples.append(sample)
        horizon = sample.time_s - self.thresholds["window_s"]
        while len(self._samples) > 1 and self._samples[0].time_s <= horizon:
            self._samples.popleft()
        return self._evaluate(sample.time_s)

    def tick(self, now_s: float) -> list[Alert]:
        """The alerts firing at ``now_s`` with no new step (a hang shows only this way)."""
        return self._evaluate(now_s)

    def _evaluate(self, now_s: float) -> list[Alert]:
        if not self._samples:
            return []
        samples, out = list(self._samples), []
        for rule in self.rules:
            found = rule.evaluate(samples, self.thresholds, now_s)
            if found is None:
                self._pending.pop(rule.name, None)
                continue
            since = self._pending.setdefault(rule.name, now_s)
            if now_s - since >= rule.for_s:
                out.append(Alert(rule.name, rule.severity, found.ranks, found.message, samples[-1].step))
        return out
