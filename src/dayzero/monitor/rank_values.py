"""One rank's measurements of one step, as the exporter serves them and the evaluator reads them.

A :class:`RankValues` travels between ranks as a fixed float vector (:meth:`to_vector` /
:meth:`from_vector`, NaN for "not known"), so one ``all_gather`` gives rank 0 every rank's row;
:func:`step_sample` turns the rows of one step into the evaluator's
:class:`~dayzero.monitor.rules.StepSample`. Pure: no torch import.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

from dayzero.monitor.rules import StepSample


@dataclass(frozen=True)
class RankValues:
    rank: int
    step_s: float  # seconds between this rank's consecutive step ends
    comm_s: float  # of its step, seconds with a collective in flight (this rank's own)
    tokens_per_s: float
    mem_peak_bytes: float
    mem_allocated_bytes: float | None = None
    mem_reserved_bytes: float | None = None
    mem_capacity_bytes: float | None = None
    temperature_c: float | None = None
    power_w: float | None = None
    utilization: float | None = None  # 0..1
    device_mem_used_bytes: float | None = None
    device_mem_total_bytes: float | None = None
    rss_bytes: float | None = None
    threads: float | None = None
    # counters over all attempts of the run
    steps_total: float = 0.0
    tokens_total: float = 0.0
    comm_s_total: float = 0.0
    skipped_total: float = 0.0
    saves_total: float = 0.0
    restarts_total: float = 0.0
    cpu_s_total: float | None = None
    time_s: float = 0.0  # unix time of the step's end on this rank
    checkpoint_step: float | None = None  # newest checkpoint's step, as this rank knows it (rank 0 does)

    @property
    def busy_s(self) -> float:
        return max(0.0, self.step_s - self.comm_s)

    def to_vector(self) -> list[float]:
        return [math.nan if v is None else float(v) for v in (getattr(self, f.name) for f in fields(self))]

    @classmethod
    def from_vector(cls, v) -> "RankValues":
        vals = [float(x) for x in v]
        if len(vals) != len(fields(cls)):
            raise ValueError(f"rank values: {len(vals)} numbers for {len(fields(cls))} fields")
        kw = {f.name: (None if math.isnan(x) else x) for f, x in zip(fields(cls), vals)}
        kw["rank"] = int(vals[0])
        for k in ("step_s", "comm_s", "tokens_per_s", "mem_peak_bytes", "steps_total", "tokens_total",
                  "comm_s_total", "skipped_total", "saves_total", "restarts_total", "time_s"):
            kw[k] = 0.0 if kw[k] is None else kw[k]
        return cls(**kw)


def vector_size() -> int:
    return len(fields(RankValues))


def step_sample(step: int, loss: float | None, rows: list[RankValues],
                last_checkpoint_step: int | None = None) -> StepSample:
    """The evaluator's sample of one step; the checkpoint step defaults to the lowest rank's."""
    rows = sorted(rows, key=lambda r: r.rank)
    if last_checkpoint_step is None and rows and rows[0].checkpoint_step is not None:
        last_checkpoint_step = int(rows[0].checkpoint_step)
    return StepSample(step=step, time_s=max(r.time_s for r in rows), loss=loss,
                      tokens_per_s=tuple(r.tokens_per_s for r in rows), step_time_s=tuple(r.step_s for r in rows),
                      comm_time_s=tuple(r.comm_s for r in rows),
                      mem_bytes=tuple(int(r.mem_peak_bytes) for r in rows),
                      mem_capacity_bytes=tuple(int(r.mem_capacity_bytes or 0) for r in rows),
                      temperature_c=tuple(r.temperature_c for r in rows), power_w=tuple(r.power_w for r in rows),
                      last_checkpoint_step=last_checkpoint_step, ranks=tuple(r.rank for r in rows))


# the per-rank columns of a ``{"event": "ranks"}`` record in the metrics stream
EVENT_COLUMNS = ("step_s", "comm_s", "tokens_per_s", "mem_peak_bytes", "mem_capacity_bytes", "temperature_c",
                 "power_w")


def ranks_event(step: int, rows: list[RankValues]) -> dict:
    """The metrics-stream record of one step's rows (written when the ranks all-gather them)."""
    rows = sorted(rows, key=lambda r: r.rank)
    return {"event": "ranks", "step": step, "time_s": max(r.time_s for r in rows), "ranks": [r.rank for r in rows],
            **{c: [getattr(r, c) for r in rows] for c in EVENT_COLUMNS}}


def rows_from_event(ev: dict) -> list[RankValues]:
    """The rows of a ``ranks`` record (a malformed one gives ``[]``)."""
    try:
        ranks = [int(r) for r in ev["ranks"]]
        cols = {c: list(ev.get(c) or [None] * len(ranks)) for c in EVENT_COLUMNS}
        return [RankValues(rank=r, time_s=float(ev["time_s"]), **{c: (cols[c][i] if cols[c][i] is not None else
                                                                     (0.0 if c in _REQUIRED else None))
                                                                 for c in EVENT_COLUMNS})
                for i, r in enumerate(ranks)]
    except (KeyError, TypeError, ValueError, IndexError):
        return []


_REQUIRED = ("step_s", "comm_s", "tokens_per_s", "mem_peak_bytes")
