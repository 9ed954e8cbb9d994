"""Fault drills and the hang watchdog.

``--inject-fault step=N,rank=R,kind=kill|exception|hang[,at=step|save][,attempt=A]`` makes rank R
fail on purpose: at the start of step N (``at=step``, the default) or during the save of step N
just before that rank writes its shards (``at=save``, a crash between shard writes). ``kill``
sends SIGKILL to itself (a lost node), ``exception`` raises (a software fault), ``hang`` blocks
forever (a stuck collective or device). A fault fires only on restart attempt A
(default 0), so the restarted job runs clean.

The :class:`Watchdog` turns a hang into a restart: when the loop stops calling ``beat()`` for
longer than the timeout, or a checkpoint save or load runs past its own budget (``--save-timeout``,
also for an async save writing in the background), it prints every thread's stack and exits the
process with ``EX_TEMPFAIL``; torchrun then tears down the other ranks and restarts the job
(``--max-restarts``).
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass
from typing import Callable, Iterator, Literal

from dayzero.errors import DayzeroError
from dayzero.runtime.rank_log import WATCHDOG_EXIT, launcher_attempt

Kind = Literal["kill", "exception", "hang"]


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

    @classmethod
    def parse(cls, text: str) -> "FaultSpec":
        """``"step=7,rank=1,kind=kill"`` -> FaultSpec; FaultSpecError on anything else."""
        usage = "expected step=N,rank=R,kind=kill|exception|hang[,at=step|save][,attempt=A]"
        fields: dict[str, str] = {}
        for part in filter(None, (p.strip() for p in str(text).split(","))):
            key, sep, value = part.partition("=")
            if not sep or key not in ("step", "rank", "kind", "at", "attempt") or key in fields:
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
        if kind not in ("kill", "exception", "hang") or at not in ("step", "save"):
            raise FaultSpecError(f"--inject-fault {text!r}: kind {kind!r} / at {at!r} unknown; {usage}")
        return cls(step, rank, kind, at, attempt)  # type: ignore[arg-type]

    def describe(self) -> str:
        return f"step={self.step},rank={self.rank},kind={self.kind},at={self.at},attempt={self.attempt}"


def restart_attempt() -> int:
    """Which restart attempt this process belongs to (0 on the first run): dayzero's launcher
    restarts ranks itself (:mod:`dayzero.runtime.rank_log`), the user's torchrun counts its own."""
    try:
        return launcher_attempt() + int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    except ValueError:
        return launcher_attempt()


def init_process_group(backend: str = "gloo", **kwargs) -> None:
    """``torch.distributed.init_process_group`` from torchrun's environment, safe across restarts.

    torchrun's c10d rendezvous shares one TCPStore across restart attempts (torch 2.13), so the
    keys a failed attempt left behind (its ranks' gloo addresses) are still there and the new
    attempt connects to dead peers ("Connection refused" in connectFullMesh). Prefixing every key
    with the attempt number keeps attempts apart. ``kwargs`` go to ``init_process_group``
    (``timeout``, ``device_id``).
    """
    import torch.distributed as dist

    store, rank, world = next(dist.rendezvous("env://"))
    store = dist.PrefixStore(f"dayzero/attempt-{restart_attempt()}", store)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world, **kwargs)


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
            if spec.step == step and spec.at == at:
                self._fire(spec)

    def _fire(self, spec: FaultSpec) -> None:
        ev = {"event": "fault_injected", "step": spec.step, "rank": spec.rank, "kind": spec.kind, "at": spec.at,
              "attempt": self.attempt}
        if self._on_event is not None:
            self._on_event(ev)
        print(f"dayzero: injecting fault {spec.describe()}", file=sys.stderr, flush=True)
        if spec.kind == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if spec.kind == "exception":
            raise InjectedFault(f"injected fault {spec.describe()}")
        while True:  # hang: only the watchdog (or torchrun) ends this process
            time.sleep(3600)


class Watchdog:
    """Exits the process when the loop makes no progress: no ``beat()`` for ``timeout_s`` seconds
    (``math.inf``: steps are not timed), an operation declared with :meth:`allow` running past its
    own budget, or a background operation declared with :meth:`watch` unfinished after its budget."""

    def __init__(self, timeout_s: float, on_timeout: Callable[[dict], None] | None = None,
                 exit_code: int = WATCHDOG_EXIT):
        if not timeout_s > 0:
            raise DayzeroError(f"--watchdog {timeout_s}: the timeout must be > 0 seconds")
        self.timeout_s, self.exit_code, self._on_timeout = float(timeout_s), exit_code, on_timeout
        self._last = time.monotonic()
        self._limit = self.timeout_s
        self._doing: str | None = None  # the operation allow() declared, while it runs
        self._background: tuple[str, Callable[[], bool], float, float] | None = None  # what, done, t0, budget
        self._step = -1
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> "Watchdog":
        self.beat(self._step)
        self._thread = threading.Thread(target=self._run, name="dayzero-watchdog", daemon=True)
        self._thread.start()
        return self

    def beat(self, step: int) -> None:
        with self._lock:
            self._last, self._step = time.monotonic(), step

    @contextlib.contextmanager
    def allow(self, seconds: float, what: str = "a slow operation") -> Iterator[None]:
        """One long operation of the loop (a synchronous save, a resume) gets ``seconds`` (its own
        budget, longer or shorter than the step timeout) instead of the step timeout."""
        with self._lock:
            self._last, self._limit, self._doing = time.monotonic(), float(seconds), what
        try:
            yield
        finally:
            with self._lock:
                self._last, self._limit, self._doing = time.monotonic(), self.timeout_s, None

    def watch(self, what: str, done: Callable[[], bool], seconds: float) -> None:
        """A background operation (an async save) must be ``done()`` within ``seconds`` from now;
        replaces the previous one."""
        with self._lock:
            self._background = (what, done, time.monotonic(), float(seconds))

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _poll_s(self) -> float:
        with self._lock:
            budgets = [self._limit] + ([self._background[3]] if self._background else [])
        return min(1.0, min(budgets) / 4)

    def _run(self) -> None:
        while not self._stop.wait(self._poll_s()):
            with self._lock:
                now = time.monotonic()
                stalled, limit, step, doing, bg = now - self._last, self._limit, self._step, self._doing, self._background
            if stalled > limit:
                self._abort(step, stalled, limit, doing)
            if bg is not None:
                what, done, t0, budget = bg
                if done():
                    with self._lock:
                        if self._background is bg:
                            self._background = None
                elif now - t0 > budget:
                    self._abort(step, now - t0, budget, what)

    def _abort(self, step: int, stalled: float, limit: float, doing: str | None) -> None:
        ev = {"event": "watchdog_abort", "step": step, "stalled_s": round(stalled, 3), "timeout_s": limit,
              "during": doing or "step"}
        where = f"in {doing}" if doing else f"after step {step}"
        try:
            if self._on_timeout is not None:
                self._on_timeout(ev)
            print(f"dayzero: watchdog: no progress for {stalled:.1f} s {where} (timeout {limit:g} s); "
                  "aborting so torchrun can restart the job", file=sys.stderr, flush=True)
            faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        finally:
            os._exit(self.exit_code)
