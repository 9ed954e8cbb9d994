"""What a spawned rank shows on the terminal, and the run's log of everything else (``ranks.log``).

Under dayzero's launcher (:func:`dayzero.runtime.launch.launch_local`) a rank's whole stderr —
Python and native alike: gloo/c10d warnings, a crash's traceback, the watchdog's thread stacks —
goes to its own file ``attempt<A>/rank<R>.log`` in the launch directory. Only lines that begin
with ``dayzero:`` (the messages meant for a person) and rank 0's progress bar reach the terminal
(:func:`capture_stderr`). A crash leaves its one-line cause in ``attempt<A>/rank<R>.crash``
(:func:`write_crash`).

After each attempt the launcher reads every failed rank back as a :class:`RankFailure` (exit
code or signal, its one-line cause), appends the rank files to the run's log under one header
per rank (:func:`append_attempt`), and prints one line per rank whose failure is a cause rather
than a consequence (:func:`causes`): a rank stopped by the launcher, or whose collective broke
because a peer was gone, is only a consequence when another rank failed first on its own.

Torch-free.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator, TextIO

from dayzero.runtime.resilience.stopping import STOP_SIGNALS, signal_name

DIR_ENV = "DAYZERO_LAUNCH_DIR"  # set by the launcher for its ranks: where they leave logs and causes
ATTEMPT_ENV = "DAYZERO_RESTART_ATTEMPT"  # the launcher's restart attempt (0 first)
USER_PREFIX = "dayzero:"  # a line meant for a person
WATCHDOG_EXIT = getattr(os, "EX_TEMPFAIL", 75)  # a hung rank's exit ("temporary failure; retry", sysexits.h)

# what a collective or store call says when the process at the other end went away (gloo's TCP
# transport, NCCL, the c10d store): on a rank that raises it, a consequence of another's failure
_PEER_LOST = ("connection reset by peer", "connection closed by peer", "broken pipe", "connection refused",
              "ncclremoteerror", "communicator was aborted", "remote process exited", "socket closed")


def attempt_dir(launch_dir: str | Path, attempt: int) -> Path:
    return Path(launch_dir, f"attempt{attempt}")


def launcher_attempt() -> int:
    """This rank's restart attempt under dayzero's launcher (0 outside it)."""
    try:
        return int(os.environ.get(ATTEMPT_ENV, "0"))
    except ValueError:
        return 0


# -- in the rank ---------------------------------------------------------------------------------

class _UserLines(io.TextIOBase):
    """``sys.stderr`` of a captured rank: everything to the log (fd 2), complete lines that begin
    with ``dayzero:`` also to ``terminal``."""

    def __init__(self, log_fd: int, terminal: TextIO):
        self._fd, self.terminal, self._line = log_fd, terminal, ""

    def writable(self) -> bool:
        return True

    def write(self, s: str) -> int:
        os.write(self._fd, s.encode("utf-8", "replace"))
        self._line += s
        *done, self._line = self._line.split("\n")
        shown = [ln for ln in done if ln.lstrip("\r").startswith(USER_PREFIX)]
        if shown:
            self.terminal.write("".join(ln + "\n" for ln in shown))
            self.terminal.flush()
        return len(s)

    def fileno(self) -> int:  # native writers (faulthandler) go to the log
        return self._fd

    def isatty(self) -> bool:
        return False


def terminal_stream() -> TextIO:
    """Where output meant only for the terminal (rank 0's progress bar) goes: the terminal even
    when this rank's stderr is captured."""
    return getattr(sys.stderr, "terminal", sys.stderr)


@contextlib.contextmanager
def capture_stderr() -> Iterator[None]:
    """In a rank the launcher started: stderr into ``attempt<A>/rank<R>.log``, ``dayzero:`` lines
    also on the terminal. A no-op outside dayzero's launcher (the user's own torchrun)."""
    launch_dir = os.environ.get(DIR_ENV)
    if not launch_dir:
        yield
        return
    path = attempt_dir(launch_dir, launcher_attempt()) / f"rank{os.environ.get('RANK', '0')}.log"
    path.parent.mkdir(parents=True, exist_ok=True)
    sys.stderr.flush()
    log_fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    term_fd = os.dup(2)
    os.dup2(log_fd, 2)  # native code writes to fd 2: the log, kept even if the process is SIGKILLed
    os.close(log_fd)
    terminal = open(term_fd, "w", buffering=1, encoding="utf-8", errors="replace")
    old = sys.stderr
    sys.stderr = _UserLines(2, terminal)
    try:
        yield
    finally:
        with contextlib.suppress(Exception):
            sys.stderr.flush()
            terminal.flush()
        sys.stderr = old
        os.dup2(term_fd, 2)
        terminal.close()


def write_crash(exc: BaseException) -> None:
    """Leave a crashed rank's one-line cause for the launcher (nothing outside it)."""
    launch_dir = os.environ.get(DIR_ENV)
    if not launch_dir:
        return
    first = (str(exc).strip().splitlines() or [""])[0]
    cause = " ".join(f"{type(exc).__name__}: {first}".split())[:300]
    lost_peer = _is_peer_lost(exc)
    with contextlib.suppress(OSError):
        d = attempt_dir(launch_dir, launcher_attempt())
        d.mkdir(parents=True, exist_ok=True)
        (d / f"rank{os.environ.get('RANK', '0')}.crash").write_text(json.dumps({"cause": cause,
                                                                                "lost_peer": lost_peer}))


def _is_peer_lost(exc: BaseException) -> bool:
    dist_error = next((c for c in type(exc).__mro__ if c.__name__ == "DistNetworkError"), None)
    return dist_error is not None or any(p in str(exc).lower() for p in _PEER_LOST)


# -- in the launcher ------------------------------------------------------------------------------

@dataclass(frozen=True)
class RankFailure:
    rank: int
    exitcode: int  # negative: killed by that signal (as subprocess reports it)
    cause: str = ""  # the rank's one-line cause: its error, its crash, or its last dayzero: line
    user_error: bool = False  # a DayzeroError (bad input): restarting would only repeat it
    consequence: bool = False  # stopped by the launcher, or its collective lost a peer

    @property
    def how(self) -> str:
        if self.exitcode < 0:
            return f"killed by {signal_name(-self.exitcode)}"
        if self.exitcode > 128 and self.exitcode - 128 in {int(s) for s in signal.Signals}:
            return f"exit code {self.exitcode} ({signal_name(self.exitcode - 128)})"
        if self.exitcode == WATCHDOG_EXIT:
            return f"exit code {self.exitcode} (watchdog: no progress)"
        return f"exit code {self.exitcode}"

    def line(self) -> str:
        """``rank 1: killed by SIGKILL; last message: injecting fault ...``"""
        if self.user_error:
            return f"rank {self.rank}: {self.cause}"
        return f"rank {self.rank}: {self.how}" + (f"; {self.cause}" if self.cause else "")


def read_failure(launch_dir: str | Path, attempt: int, rank: int, exitcode: int) -> RankFailure:
    """What the rank left behind: a user error (``rank<R>.err``), a crash, or its last message."""
    d = attempt_dir(launch_dir, attempt)
    err = Path(launch_dir, f"rank{rank}.err")
    if err.is_file():
        return RankFailure(rank, exitcode, err.read_text().strip(), user_error=True)
    crash = d / f"rank{rank}.crash"
    stopped = exitcode in {-int(s) for s in STOP_SIGNALS} | {128 + int(s) for s in STOP_SIGNALS}
    if crash.is_file():
        with contextlib.suppress(ValueError, OSError):
            c = json.loads(crash.read_text())
            return RankFailure(rank, exitcode, c["cause"], consequence=bool(c["lost_peer"]) or stopped)
    last = last_message(d / f"rank{rank}.log")
    return RankFailure(rank, exitcode, f"last message: {last}" if last else "", consequence=stopped)


def last_message(log: Path) -> str:
    """The last ``dayzero:`` line of a rank's log, without the prefix ("" when none)."""
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    found = [ln.lstrip("\r") for ln in lines if ln.lstrip("\r").startswith(USER_PREFIX)]
    return found[-1][len(USER_PREFIX):].strip() if found else ""


def causes(failures: Iterable[RankFailure]) -> list[RankFailure]:
    """The failures that explain the others: ranks that failed on their own (a fault, else a user
    error) when there are any, else every failure as it is."""
    failures = sorted(failures, key=lambda f: f.rank)
    own = [f for f in failures if not f.consequence]
    faults = [f for f in own if not f.user_error]
    return faults or own or failures


def consequence_line(failures: Iterable[RankFailure]) -> str | None:
    """``ranks 0, 2 stopped as a consequence`` for the failures :func:`causes` left out."""
    primary = {f.rank for f in causes(failures)}
    rest = sorted(f.rank for f in failures if f.rank not in primary)
    if not rest:
        return None
    return f"rank{'s' * (len(rest) > 1)} {', '.join(map(str, rest))} stopped as a consequence"


def append_attempt(log: Path, launch_dir: str | Path, attempt: int, nproc: int,
                   failures: Iterable[RankFailure] = ()) -> None:
    """Append each rank's output of ``attempt`` to ``log``, under one header per rank."""
    by_rank = {f.rank: f for f in failures}
    d = attempt_dir(launch_dir, attempt)
    try:
        with open(log, "a", encoding="utf-8") as out:
            for rank in range(nproc):
                f = by_rank.get(rank)
                out.write(f"===== attempt {attempt}, {f.line() if f else f'rank {rank}: ok'} =====\n")
                try:
                    text = (d / f"rank{rank}.log").read_text(errors="replace")
                except OSError:
                    continue
                out.write(text if not text or text.endswith("\n") else text + "\n")
    except OSError as e:  # a full or failed disk: the failure's own cause is what the user must see
        print(f"dayzero: warning: cannot write the ranks' log {log} ({e.strerror or e}); each rank's output stays in "
              f"{d}", file=sys.stderr, flush=True)
