"""What the terminal dashboard shows, from either source: a run's metrics stream (JSONL) or an
exporter's ``/metrics`` text. Pure (no torch, no network): ``dayzero monitor`` fetches, this
module reads.

The stream holds rank 0's step records (values reduced over ranks) and, when the ranks gathered
their rows (``--alerts`` or ``--metrics-aggregate``), one ``{"event": "ranks"}`` record per step
with every rank's values; without those the per-rank columns show the step record's values under
"all". The active alerts are the in-process rules (:mod:`dayzero.monitor.evaluator`) run over the
samples read.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from dayzero.errors import DayzeroError
from dayzero.inputs import STREAM_BYTES, read_text
from dayzero.monitor.evaluator import Alert, RuleEvaluator
from dayzero.monitor.rank_values import RankValues, rows_from_event, step_sample

HISTORY = 2000  # points kept for the curves


class SourceError(DayzeroError):
    """The monitor's source cannot be read."""


@dataclass(frozen=True)
class View:
    source: str
    job: str | None = None
    step: int = 0
    finished: bool = False
    losses: tuple[tuple[int, float | None], ...] = ()
    tokens_per_s: tuple[float, ...] = ()
    ranks: tuple[RankValues, ...] = ()
    per_rank: bool = False  # ranks measured one by one (False: one row "all", the max over ranks)
    alerts: tuple[Alert, ...] = ()

    def to_dict(self) -> dict:
        return {"source": self.source, "job": self.job, "step": self.step, "finished": self.finished,
                "loss": self.losses[-1][1] if self.losses else None,
                "losses": [[s, v] for s, v in self.losses], "tokens_per_s": list(self.tokens_per_s),
                "per_rank": self.per_rank,
                "ranks": [{"rank": r.rank if self.per_rank else "all", "step_s": r.step_s, "comm_s": r.comm_s,
                           "busy_s": r.busy_s, "tokens_per_s": r.tokens_per_s, "mem_peak_bytes": r.mem_peak_bytes,
                           "mem_capacity_bytes": r.mem_capacity_bytes, "temperature_c": r.temperature_c,
                           "power_w": r.power_w} for r in self.ranks],
                "alerts": [a.to_dict() for a in self.alerts]}


def is_url(source: str) -> bool:
    return source.startswith(("http://", "https://"))


def metrics_file(source: str | Path) -> Path:
    """A run directory (its ``metrics.jsonl``, or its only ``*.jsonl``) or a metrics file."""
    p = Path(source)
    if p.is_dir():
        if (p / "metrics.jsonl").is_file():
            return p / "metrics.jsonl"
        found = sorted(p.glob("*.jsonl"))
        if len(found) == 1:
            return found[0]
        raise SourceError(f"{p}: no metrics.jsonl here ({len(found)} *.jsonl files); pass the metrics file itself")
    if not p.is_file():
        raise SourceError(f"{p}: no such run directory or metrics file (dayzero train --metrics writes one)")
    return p


def _loss(v) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _amount(v) -> float:
    """A time, rate or size from a record: a finite non-negative number, else 0 (not measured: a
    record another writer filled differently is shown as missing, never a crash)."""
    x = _loss(v)
    return x if x is not None and math.isfinite(x) and x >= 0 else 0.0


def from_stream(path: str | Path, thresholds: Mapping[str, float] | None = None,
                now_s: float | None = None) -> View:
    """The view of a metrics stream; ``now_s`` (unix time) also judges a hang while it runs."""
    path = metrics_file(path)
    try:
        text = read_text(path, "a metrics stream (JSONL)", STREAM_BYTES, errors="replace")
    except OSError as e:
        raise SourceError(f"{path}: cannot read ({e.strerror or e})") from None
    records = []
    for line in text.splitlines():
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            continue  # a record cut by a crash mid-write
        if isinstance(obj, dict):
            records.append(obj)
    steps: dict[int, dict] = {}
    rows: dict[int, list[RankValues]] = {}
    ckpt: dict[int, int] = {}  # step of a record -> newest checkpoint step by then
    newest_ckpt, finished, order = None, False, []
    for obj in records:
        ev = obj.get("event")
        if ev is None and isinstance(obj.get("step"), int):
            steps[obj["step"]] = obj  # a step a restart repeats: the later record wins
            order.append(obj["step"])
            ckpt[obj["step"]] = newest_ckpt
        elif ev == "ranks" and isinstance(obj.get("step"), int):
            rows[obj["step"]] = rows_from_event(obj)
        elif ev in ("checkpoint_saved", "checkpoint_loaded") and isinstance(obj.get("step"), int):
            newest_ckpt = obj["step"]
        elif ev == "end":
            finished = True
    ev_ = RuleEvaluator(thresholds=thresholds)
    clock, alerts, per_rank, last_rows = 0.0, [], False, []
    for s in sorted(steps):
        rec = steps[s]
        clock += _amount(rec.get("step_time_s"))
        r = rows.get(s) or []
        if r:
            per_rank = True
        else:  # no per-rank rows: the step record's values, reduced over ranks
            r = [RankValues(rank=0, step_s=_amount(rec.get("step_time_s")),
                            comm_s=_amount(rec.get("comm_time_s")),
                            tokens_per_s=_amount(rec.get("tokens_per_s")),
                            mem_peak_bytes=_amount(rec.get("peak_mem_bytes")), time_s=clock)]
        last_rows = r
        alerts = ev_.observe(step_sample(s, _loss(rec.get("loss")), r, ckpt.get(s)))
    if now_s is not None and not finished and per_rank and steps:
        alerts = ev_.tick(now_s)
    ordered = sorted(steps)[-HISTORY:]
    return View(source=str(path), job=None, step=max(steps, default=0), finished=finished,
                losses=tuple((s, _loss(steps[s].get("loss"))) for s in ordered),
                tokens_per_s=tuple(_amount(steps[s].get("tokens_per_s")) for s in ordered),
                ranks=tuple(last_rows), per_rank=per_rank, alerts=tuple(alerts))


@dataclass
class ExporterReader:
    """Reads successive scrapes of one exporter (all its ranks, or one per port), keeping the
    curves and the rule window across them."""

    source: str
    thresholds: Mapping[str, float] | None = None
    _evaluator: RuleEvaluator = field(init=False)
    _losses: list = field(default_factory=list)
    _tps: list = field(default_factory=list)
    _last_step: int = -1

    def __post_init__(self):
        self._evaluator = RuleEvaluator(thresholds=self.thresholds)

    def read(self, texts: list[str], now_s: float) -> View:
        """The view after one scrape of each exporter (their exposition ``texts``)."""
        fams = [x for text in texts for x in parse_exposition(text)]
        by_rank: dict[int, dict[str, float]] = {}
        job = None
        for name, labels, value in fams:
            if "rank" not in labels or "layer" in labels:
                continue
            try:
                rank = int(labels["rank"])
            except ValueError:
                continue
            job = labels.get("job", job)
            by_rank.setdefault(rank, {})[name] = value
        if not by_rank:
            return View(source=self.source, job=job, step=max(self._last_step, 0),
                        losses=tuple(self._losses), tokens_per_s=tuple(self._tps))
        rows = [_row(r, m) for r, m in sorted(by_rank.items())]
        first = by_rank[min(by_rank)]
        step = int(first.get("dayzero_step", 0))
        loss = first.get("dayzero_loss")
        ckpt = first.get("dayzero_checkpoint_last_step")
        if step != self._last_step:  # a new step since the last scrape
            self._last_step = step
            self._losses = (self._losses + [(step, loss)])[-HISTORY:]
            self._tps = (self._tps + [min(r.tokens_per_s for r in rows)])[-HISTORY:]
            alerts = self._evaluator.observe(step_sample(step, loss, rows, None if ckpt is None else int(ckpt)))
        else:
            alerts = self._evaluator.tick(now_s)
        return View(source=self.source, job=job, step=step, losses=tuple(self._losses), tokens_per_s=tuple(self._tps),
                    ranks=tuple(rows), per_rank=True, alerts=tuple(alerts))


def _row(rank: int, m: dict[str, float]) -> RankValues:
    def g(name, default=None):
        v = m.get(name)
        return default if v is None or math.isnan(v) else v

    return RankValues(rank=rank, step_s=g("dayzero_step_seconds", 0.0), comm_s=g("dayzero_step_comm_seconds", 0.0),
                      tokens_per_s=g("dayzero_tokens_per_second", 0.0),
                      mem_peak_bytes=g("dayzero_memory_peak_bytes", 0.0),
                      mem_capacity_bytes=g("dayzero_memory_capacity_bytes"),
                      temperature_c=g("dayzero_device_temperature_celsius"), power_w=g("dayzero_device_power_watts"),
                      time_s=g("dayzero_last_step_timestamp_seconds", 0.0))


def parse_exposition(text: str) -> list[tuple[str, dict, float]]:
    """(sample name, labels, value) of Prometheus text exposition (prometheus-client's parser)."""
    try:
        from prometheus_client.parser import text_string_to_metric_families
    except ImportError:
        raise SourceError("reading an exporter needs prometheus-client (pip install prometheus-client)") from None
    try:
        return [(s.name, dict(s.labels), float(s.value)) for f in text_string_to_metric_families(text)
                for s in f.samples]
    except ValueError as e:
        raise SourceError(f"not Prometheus text exposition ({e})") from None
