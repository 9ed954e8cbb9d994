"""How a job stops: SIGINT/SIGTERM, and the death of the launcher.

Ranks run in sessions of their own (torch elastic starts them with ``start_new_session``), so a
Ctrl-C at the terminal reaches only the launcher. Its agent sends the same signal to every rank
and SIGKILLs those still alive ``STOP_GRACE_S`` later; the launcher then exits 128 + the signal
number (130 for SIGINT, 143 for SIGTERM) and never relaunches (:func:`dayzero.runtime.launch.launch_local`).

A process that runs the training loop (a rank, or a single-process run) enters
:func:`training_process`:

* :class:`StopOnSignal` turns the first SIGINT or SIGTERM into :class:`Interrupted`, raised in
  the main thread, so the loop unwinds (metrics closed, watchdog stopped); the caller then ends
  the process with :func:`exit_now`, without waiting for background threads, so an async save in
  flight is abandoned where it stands. That is safe at any instant: a version counts as saved
  only once rank 0 has renamed ``step-N.partial`` to ``step-N`` and written its ``COMPLETE``
  marker (:mod:`dayzero.runtime.checkpoint.versions`), so an abandoned save leaves a ``.partial`` (or an
  unmarked) directory that resume skips, and the previous version stays the newest. A main
  thread blocked in native code (a collective whose peer is gone) cannot raise; a backstop
  thread, woken through ``signal.set_wakeup_fd`` by the signal itself, ends the process
  ``grace_s`` after it.
* :class:`ParentWatch` (ranks only) makes the rank die with the process that started it:
  ``prctl(PR_SET_PDEATHSIG, SIGKILL)`` on Linux, and everywhere a thread that polls
  ``os.getppid()`` and ends the process, without saving, once the parent is gone. An orphan
  would otherwise train on and write checkpoints beside the next job on the same directory.

Torch-free.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import threading
from typing import Iterator, NoReturn

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
STOP_GRACE_S = 10.0  # after a stop signal, a rank that has not exited by then is killed
PARENT_POLL_S = 0.5
ORPHANED_EXIT = 128 + signal.SIGKILL  # as if killed along with the launcher
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


class Interrupted(KeyboardInterrupt):
    """A stop signal (SIGINT, SIGTERM, ...); ``ranks``: how many ranks the launcher stopped."""

    def __init__(self, signum: int, ranks: int | None = None):
        self.signum, self.ranks = int(signum), ranks
        super().__init__(self.describe())

    @property
    def name(self) -> str:
        return signal_name(self.signum)

    @property
    def exit_code(self) -> int:  # what a shell reports for a process killed by the signal
        return 128 + self.signum

    def describe(self) -> str:
        if self.ranks is None:
            stopped = ""
        elif self.ranks == 0:
            stopped = ": before any rank started"
        else:
            stopped = f": stopped {self.ranks} rank{'s' * (self.ranks != 1)}"
        return f"interrupted ({self.name}){stopped}"


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def exit_now(code: int) -> NoReturn:
    """End the process at once: flush stdio, then ``os._exit`` (no atexit handlers, no joining
    of background threads such as an async checkpoint writer)."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


class StopOnSignal:
    """While active (entered on the main thread): each of ``signals`` raises :class:`Interrupted`
    in the main thread; the first is remembered in ``signum``. With ``grace_s`` (a process that
    trains), a second signal ends the process at once, and a backstop thread ends it ``grace_s``
    after the first unless the with-block is over by then (the main thread could not unwind).
    Handlers are restored on exit."""

    def __init__(self, signals: tuple[int, ...] = STOP_SIGNALS, grace_s: float | None = None):
        self.signals, self.grace_s = tuple(int(s) for s in signals), grace_s
        self.signum: int | None = None
        self._old: dict[int, object] = {}
        self._old_fd = -1
        self._pipe: tuple[int, int] | None = None
        self._left = threading.Event()  # the with-block is over: the backstop stands down

    def __enter__(self) -> "StopOnSignal":
        if threading.current_thread() is not threading.main_thread():
            return self  # Python delivers signals to the main thread only
        for s in self.signals:
            self._old[s] = signal.signal(s, self._handle)
        if self.grace_s is not None:
            r, w = os.pipe()
            os.set_blocking(w, False)
            self._pipe = (r, w)
            self._old_fd = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
            threading.Thread(target=self._backstop, args=(r,), name="dayzero-stop-backstop", daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        for s, old in self._old.items():
            signal.signal(s, old)  # type: ignore[arg-type]
        self._old.clear()
        if self._pipe is not None:
            signal.set_wakeup_fd(self._old_fd)
            self._left.set()
            os.close(self._pipe[1])  # the backstop reads EOF and ends
            self._pipe = None

    def _handle(self, signum: int, _frame) -> None:
        if self.signum is None:
            self.signum = signum
        elif self.grace_s is not None:  # a second signal while unwinding: no more waiting
            exit_now(128 + self.signum)
        raise Interrupted(signum)

    def _backstop(self, fd: int) -> None:
        try:
            while data := os.read(fd, 64):  # one byte per signal caught by a Python handler
                caught = [b for b in data if b in self.signals]
                if caught:
                    if self._left.wait(self.grace_s):
                        return
                    print(f"dayzero: {signal_name(caught[0])}: still running {self.grace_s:g} s later; "
                          "ending this process", file=sys.stderr)
                    exit_now(128 + caught[0])
        finally:
            os.close(fd)


class ParentWatch:
    """While active: this process dies with its parent (the launcher or torchrun agent that
    started it) — by the kernel's parent-death signal where available (Linux; it fires when the
    parent's spawning thread ends, and torch elastic spawns from the agent's main thread), and by
    a thread that polls ``os.getppid()`` everywhere. The parent is the one at construction; a
    rank builds this before anything else, so only a parent that died before that instant (while
    the interpreter started) is missed."""

    def __init__(self, poll_s: float = PARENT_POLL_S):
        self.poll_s = poll_s
        self.parent = os.getppid()
        self._stop = threading.Event()
        self._pdeathsig = False

    def __enter__(self) -> "ParentWatch":
        self._pdeathsig = _set_parent_death_signal(signal.SIGKILL)
        self._check()  # the parent may have died before the kernel was told
        threading.Thread(target=self._run, name="dayzero-parent-watch", daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._pdeathsig:
            _set_parent_death_signal(0)

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            self._check()

    def _check(self) -> None:
        if os.getppid() != self.parent:
            print(f"dayzero: rank {os.environ.get('RANK', '?')}: its launcher (pid {self.parent}) is gone; "
                  "stopping without saving", file=sys.stderr)
            exit_now(ORPHANED_EXIT)


def _set_parent_death_signal(sig: int) -> bool:
    """``prctl(PR_SET_PDEATHSIG, sig)``; False where there is no such call (not Linux)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


@contextlib.contextmanager
def training_process(*, bind_to_parent: bool, grace_s: float = STOP_GRACE_S) -> Iterator[StopOnSignal]:
    """Stop signals (and, for a rank, its parent's death) for a process that runs training; once
    ``stop.signum`` is set the caller ends the process with :func:`exit_now` right after the
    with-block."""
    with StopOnSignal(grace_s=grace_s) as stop, (ParentWatch() if bind_to_parent else contextlib.nullcontext()):
        yield stop
