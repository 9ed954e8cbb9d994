"""Fault drills: make one rank fail on purpose, at a chosen step and restart attempt.

``--inject-fault step=N,rank=R,kind=kill|exception|hang[,at=step|save][,attempt=A]`` makes rank R
fail on purpose: at the start of step N (``at=step``, the default) or during the save of step N
just before that rank writes its shards (``at=save``, a crash between shard writes). ``kill``
sends SIGKILL to itself (a lost node), ``exception`` raises (a software fault), ``hang`` blocks
forever (a stuck collective or device). ``kind=straggler,sleep=S`` makes rank R slow instead: it
sleeps S seconds at the start of every step from step N on (a throttled or failing device). A
fault fires only on restart attempt A (default 0), so the restarted job runs clean.

The hang watchdog that turns a drill's ``hang`` into a restart is :mod:`dayzero.runtime.resilience.watchdog`.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from dataclasses import dataclass
from typing import Callable, Literal

from dayzero.errors import DayzeroError

Kind = Literal["kill", "exception", "hang", "straggler"]
KINDS = ("kill", "exception", "hang", "straggler")
USAGE = "expected step=N,rank=R,kind=kill|exception|hang|straggler[,sleep=S][,at=step|save][,attempt=A]"


class FaultSpecError(DayzeroError):
    """A malformed --inject-fault value."""


class InjectedFault(RuntimeError):
    """Raised by ``kind=exception`` drills (deliberately not a DayzeroError: it must crash)."""


@dataclass(frozen=True)
class FaultSpec:
    step: int
    rank: int
    kind: Kind
    at: Literal["step", "save"] = "step"
    attempt: int = 0
    sleep: float = 0.0  # straggler: seconds slept at the start of each step

    @classmethod
    def parse(cls, text: str) -> "FaultSpec":
        """``"step=7,rank=1,kind=kill"`` -> FaultSpec; FaultSpecError on anything else."""
        usage = USAGE
        fields: dict[str, str] = {}
        for part in filter(None, (p.strip() for p in str(text).split(","))):
            key, sep, value = part.partition("=")
            if not sep or key not in ("step", "rank", "kind", "at", "attempt", "sleep") or key in fields:
                raise FaultSpecError(f"--inject-fault {text!r}: bad item {part!r}; {usage}")
            fields[key] = value.strip()
        missing = [k for k in ("step", "rank", "kind") if k not in fields]
        if missing:
            raise FaultSpecError(f"--inject-fault {text!r}: missing {', '.join(missing)}; {usage}")
        try:
            step, rank, attempt = int(fields["step"]), int(fields["rank"]), int(fields.get("attempt", 0))
        except ValueError:
            raise FaultSpecError(f"--inject-fault {text!r}: step, rank and attempt must be integers; {usage}") from None
        if step < 1 or rank < 0 or attempt < 0:
            raise FaultSpecError(f"--inject-fault {text!r}: need step >= 1, rank >= 0, attempt >= 0")
        kind, at = fields["kind"], fields.get("at", "step")
        if kind not in KINDS or at not in ("step", "save"):
            raise FaultSpecError(f"--inject-fault {text!r}: kind {kind!r} / at {at!r} unknown; {usage}")
        sleep = 0.0
        if kind == "straggler":
            try:
                sleep = float(fields.get("sleep", ""))
            except ValueError:
                sleep = -1.0
            if not sleep > 0 or at != "step":
                raise FaultSpecError(f"--inject-fault {text!r}: a straggler needs sleep=S seconds > 0 (and at=step)")
        elif "sleep" in fields:
            raise FaultSpecError(f"--inject-fault {text!r}: sleep= applies only to kind=straggler; {usage}")
        return cls(step, rank, kind, at, attempt, sleep)  # type: ignore[arg-type]

    def describe(self) -> str:
        slow = f",sleep={self.sleep:g}" if self.kind == "straggler" else ""
        return f"step={self.step},rank={self.rank},kind={self.kind}{slow},at={self.at},attempt={self.attempt}"


class FaultInjector:
    """Fires the drills meant for this rank and attempt; no-op when ``specs`` is empty."""

    def __init__(self, specs: tuple[FaultSpec, ...] | list[FaultSpec], rank: int, attempt: int,
                 on_event: Callable[[dict], None] | None = None):
        self.rank, self.attempt, self._on_event = rank, attempt, on_event
        for s in specs:
            if not isinstance(s, FaultSpec):
                raise FaultSpecError(f"not a FaultSpec: {s!r}")
        self.specs = tuple(s for s in specs if s.rank == rank and s.attempt == attempt)

    def at_step(self, step: int) -> None:
        self._maybe_fire(step, "step")

    def at_save(self, step: int) -> None:
        self._maybe_fire(step, "save")

    def _maybe_fire(self, step: int, at: str) -> None:
        for spec in self.specs:
            if spec.kind == "straggler" and at == "step" and step > spec.step:
                time.sleep(spec.sleep)  # announced once, at its first step
            elif spec.step == step and spec.at == at:
                self._fire(spec)

    def _fire(self, spec: FaultSpec) -> None:
        ev = {"event": "fault_injected", "step": spec.step, "rank": spec.rank, "kind": spec.kind, "at": spec.at,
              "attempt": self.attempt}
        if self._on_event is not None:
            self._on_event(ev)
        print(f"dayzero: injecting fault {spec.describe()}", file=sys.stderr, flush=True)
        if spec.kind == "straggler":
            time.sleep(spec.sleep)
            return
        if spec.kind == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if spec.kind == "exception":
            raise InjectedFault(f"injected fault {spec.describe()}")
        while True:  # hang: only the watchdog (or torchrun) ends this process
            time.sleep(3600)
