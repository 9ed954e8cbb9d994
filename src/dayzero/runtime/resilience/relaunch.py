"""The launcher's side of a planned restart: which local device slots and which layout the next
attempt runs on.

``dayzero train --nproc N --spares K`` owns N + K local device slots; the first N run ranks, the
other K stay idle. Before the first attempt, after an alert's ``restart`` or ``exclude`` action
(:mod:`dayzero.runtime.resilience.actions`) and, with ``--on-rank-failure exclude``, after ranks
failed on their own (a crash or a lost device: the launcher excludes them), :class:`Relauncher`
reads the run's exclusion list, applies :func:`dayzero.runtime.resilience.exclusion.reshape`
(spares first, else dp reduced with the global batch kept), rewrites the config files the ranks
read (the new layout; drills of spent attempts dropped), says what it did on stderr and in the
metrics stream (a ``relaunch`` event), and hands the launcher the rank count and slots. The ranks
resume from the newest checkpoint, which DCP reshards onto the new layout.
"""

from __future__ import annotations

import datetime as _dt
import socket
import sys
from dataclasses import replace
from pathlib import Path
from typing import Sequence

from dayzero.jsonable import record_line
from dayzero.runtime.config import TrainConfig
from dayzero.runtime.metrics import last_attempt
from dayzero.runtime.resilience.exclusion import reshape
from dayzero.runtime.resilience.faults import FaultSpec
from dayzero.specs.exclusions import Exclusion, add_exclusions, excluded_slots, exclusion_path, read_exclusions


class Relauncher:
    def __init__(self, configs: Sequence[TrainConfig], paths: Sequence[Path], nproc: int):
        self.configs, self.paths = list(configs), list(paths)
        self.host = socket.gethostname()
        spares = max(c.faults.spares for c in self.configs)
        self.slots = tuple(range(nproc))
        self.spares = tuple(range(nproc, nproc + spares))
        self.attempt = 0

    def start(self) -> tuple[int, tuple[int, ...]]:
        """The first attempt: the requested ranks, less any slot a previous run of this checkpoint
        directory excluded."""
        if self._excluded() & set(self.slots):
            self._reshape("start", None)
        self._write()
        return len(self.slots), self.slots

    def replan(self, request: dict) -> tuple[int, tuple[int, ...]]:
        """After rank 0's request (``{"action": "restart"|"exclude", "step": N, ...}``)."""
        self._next_attempt()
        if request.get("action") == "exclude":
            self._reshape("exclude", request.get("step"))
        else:
            self._event({"event": "relaunch", "action": request.get("action"), "step": request.get("step"),
                         "world": len(self.slots), "slots": list(self.slots),
                         "parallel": self.configs[0].parallel.describe()})
        self._write()
        return len(self.slots), self.slots

    def failed(self, ranks: list[int], why: str) -> tuple[int, tuple[int, ...]]:
        """After ranks failed on their own (``--on-rank-failure exclude``): the launcher writes
        their slots to the exclusion list and the next attempt runs without them."""
        self._next_attempt()
        now = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        new = [Exclusion(rank=r, slot=self.slots[r], host=self.host, reason="rank_failed", step=None, time=now,
                         message=why) for r in ranks if 0 <= r < len(self.slots)]
        for d in dict.fromkeys(c.checkpoint.dir for c in self.configs if c.checkpoint.dir):
            add_exclusions(exclusion_path(d), new)
        self._reshape("rank_failed", None)
        self._write()
        return len(self.slots), self.slots

    # -- helpers -------------------------------------------------------------------------------
    def _next_attempt(self) -> None:
        """Drills of the attempts that are over are spent (they would name ranks that may be gone)."""
        self.attempt += 1
        self.configs = [replace(c, faults=replace(c.faults, inject_faults=tuple(
            f for f in c.faults.inject_faults if FaultSpec.parse(f).attempt >= self.attempt))) for c in self.configs]

    def _excluded(self) -> frozenset[int]:
        dirs = {c.checkpoint.dir for c in self.configs if c.checkpoint.dir}
        out: frozenset[int] = frozenset()
        for d in dirs:
            out |= excluded_slots(read_exclusions(exclusion_path(d)), self.host)
        return out

    def _reshape(self, action: str, step) -> None:
        excluded = self._excluded()
        before = self.configs[0].parallel
        r = reshape(before, self.slots, self.spares, excluded, self.configs[0].spec())
        dropped = sorted(s for s in self.slots if s in excluded)
        self.spares = tuple(s for s in (*self.spares, *self.slots) if s not in r.slots and s not in excluded)
        self.slots = r.slots
        self.configs = [replace(c, parallel=r.parallel) for c in self.configs]
        print(f"dayzero: excluding device slot(s) {', '.join(map(str, dropped))} on {self.host} "
              f"({exclusion_path(self.configs[0].checkpoint.dir)}); next run: {r.describe(before)}",
              file=sys.stderr, flush=True)
        self._event({"event": "relaunch", "action": action, "step": step, "excluded_slots": dropped,
                     "host": self.host, "world": r.world, "slots": list(r.slots), "spares_used": list(r.spares_used),
                     "parallel_before": before.describe(), "parallel": r.parallel.describe(),
                     "dp": r.parallel.dp, "gbs": r.parallel.gbs, "microbatches": r.parallel.microbatches})

    def _event(self, ev: dict) -> None:
        """Append to the metrics stream between attempts (no rank is writing it now), as part of
        the attempt that just ended."""
        path = self.configs[0].metrics
        if not path or not Path(path).exists():
            return
        line = record_line({**ev, "attempt": max(1, last_attempt(path))})
        try:
            with open(path, "a", encoding="utf-8") as f:
                f.write(line + "\n")
        except OSError as e:  # a full disk: the record goes to stderr, the run's own error stays the one reported
            print(f"dayzero: warning: cannot append to {path} ({e.strerror or e}): {line}", file=sys.stderr,
                  flush=True)

    def _write(self) -> None:
        for c, p in zip(self.configs, self.paths):
            c.save(p)
