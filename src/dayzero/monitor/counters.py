"""The exporter's counters, kept across restarts: each rank persists its totals in a small JSON
file next to the run's metrics (``<metrics>.counters/rank-R.json``) after every step, and a
continuing run (a resume, a torchrun restart, a relaunch on fewer ranks) starts from them, so a
``_total`` series never goes back (Prometheus counter semantics:
https://prometheus.io/docs/concepts/metric_types/#counter). Pure: no torch import."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, fields
from pathlib import Path

FORMAT = "dayzero-monitor-counters/1"


@dataclass
class Counters:
    steps: float = 0.0
    tokens: float = 0.0
    comm_s: float = 0.0
    skipped: float = 0.0
    saves: float = 0.0
    restarts: float = 0.0
    cpu_s: float = 0.0  # CPU seconds of the earlier processes of this rank (this one's are added live)

    @classmethod
    def load(cls, path: Path | None) -> "Counters":
        """The counters saved at ``path``; zero when there is none (or it is unreadable: a counter
        that starts again at zero is a reset Prometheus handles, never a crash)."""
        if path is None or not path.is_file():
            return cls()
        try:
            from dayzero.inputs import read_text

            d = json.loads(read_text(path, limit=1 << 20))
        except (OSError, ValueError):
            return cls()
        if not isinstance(d, dict) or d.get("format") != FORMAT:
            return cls()
        return cls(**{f.name: float(d[f.name]) for f in fields(cls)
                      if isinstance(d.get(f.name), (int, float)) and not isinstance(d.get(f.name), bool)})

    def save(self, path: Path | None) -> None:
        if path is None:
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps({"format": FORMAT, **asdict(self)}), encoding="utf-8")
        os.replace(tmp, path)


def counters_path(metrics: str | Path | None, rank: int) -> Path | None:
    """Where rank ``rank`` keeps its counters: beside the metrics file, None without one."""
    if not metrics:
        return None
    m = Path(metrics)
    return m.with_name(m.name + ".counters") / f"rank-{rank}.json"
