"""The hang watchdog.

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
import sys
import threading
import time
from typing import Callable, Iterator

from dayzero.errors import DayzeroError
from dayzero.runtime.resilience.rank_log import WATCHDOG_EXIT


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
                stalled, limit, step = now - self._last, self._limit, self._step
                doing, bg = self._doing, self._background
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
