"""Starting ranks, for every verb that runs on several local processes.

``launch_local(argv, nproc, error_dir)`` runs ``python <argv>`` on ``nproc`` local ranks under torchrun's
elastic agent (one intra-op thread per rank unless OMP_NUM_THREADS says otherwise, as torchrun
does; a failed rendezvous is retried once). A rank that hits a user error (DayzeroError) writes
its one-line message to ``rank<R>.err`` in the error directory and exits 2; the agent then stops
every other rank, so nothing hangs, and :class:`RanksFailed` carries each distinct message once.
A SIGINT or SIGTERM to the launcher stops every rank and raises :class:`Interrupted`: never a
retry or a restart, whatever ``max_restarts`` says. Each rank dies with the launcher and stops on
the signal as :mod:`dayzero.runtime.resilience.stopping` describes (:func:`run_as_rank`).
A rank joins its process group through :mod:`dayzero.runtime.distributed`.

Who launches: :mod:`dayzero.runtime.train_entry` (``dayzero train --nproc``) and
:mod:`dayzero.validate.launch` (a function on every rank, its results collected).
"""

from __future__ import annotations

import logging
import math
import os
import signal
import sys
import tempfile
import threading
import traceback
import uuid
from pathlib import Path
from typing import Callable

from dayzero.errors import DayzeroError
from dayzero.runtime.resilience import rank_log
from dayzero.runtime.resilience.actions import REQUEST_FILE, read_request
from dayzero.runtime.resilience.exclusion import SLOTS_ENV
from dayzero.runtime.resilience.stopping import STOP_GRACE_S, Interrupted, StopOnSignal, exit_now, training_process


class RanksFailed(Exception):
    """A local launch failed: ``exit_code`` 2 after a user error on some rank (``messages``: each
    distinct one-line message), 1 after a crash or when the ranks could not be started."""

    def __init__(self, exit_code: int, messages: list[str]):
        super().__init__("; ".join(messages))
        self.exit_code, self.messages = exit_code, messages


def write_rank_error(error_dir: str | Path | None, err: DayzeroError) -> None:
    """Leave this rank's one-line message for the launching process (rank 0 prints it when there
    is no launcher to collect it)."""
    rank = int(os.environ.get("RANK", "0"))
    if error_dir:
        Path(error_dir, f"rank{rank}.err").write_text(str(err) + "\n")
    elif rank == 0:
        print(f"dayzero: error: {err}", file=sys.stderr)


def launch_local(argv: list[str], nproc: int, error_dir: str | Path, *, max_restarts: int = 0,
                 log: str | Path | None = None, restart_from: Callable[[], str] | None = None,
                 replan: Callable[[dict], tuple[int, tuple[int, ...]]] | None = None,
                 slots: tuple[int, ...] | None = None,
                 on_failure: Callable[[list[int], str], tuple[int, tuple[int, ...]]] | None = None) -> None:
    """Run ``python <argv>`` on ``nproc`` local ranks; raise :class:`RanksFailed` if any fails
    (after ``max_restarts`` restarts of every rank; a user error is never restarted: it would only
    repeat), :class:`Interrupted` after a stop signal (every rank stopped, nothing relaunched). The
    ranks write user errors to ``error_dir`` (see :func:`write_rank_error`); their stderr goes to
    ``log`` (``ranks.log``; None: a file kept in the temp directory when the launch fails) and only
    their ``dayzero:`` lines to the terminal (:mod:`dayzero.runtime.resilience.rank_log`). Before a restart
    the terminal gets one line per failed rank and ``restarting (attempt a/K) <restart_from()>``.

    A planned restart (rank 0 left a request: an alert's restart or exclude action,
    :mod:`dayzero.runtime.resilience.actions`) is no failure: ``replan(request)`` returns how many
    ranks the next attempt runs and their device slots (having rewritten what they read), and it
    counts as one restart. ``slots``: the local device each rank uses (default: rank i, device i).
    ``on_failure(ranks, why)``: before restarting after ranks failed on their own (a crash, a kill,
    not a consequence), how many ranks and which slots the next attempt runs without them."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig

    # the agent's own log lines would bury the one line that matters (each of its modules' loggers
    # has a level of its own, so the parent's is not enough)
    for name in [n for n in logging.root.manager.loggerDict if n.startswith("torch.distributed.elastic")]:
        logging.getLogger(name).setLevel(logging.CRITICAL)
    # restarts are ours, not the agent's, so that each can be announced between attempts; on a
    # signal the agent passes it on to every rank and SIGKILLs those still alive this much later
    lc = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=nproc, run_id=str(uuid.uuid4()),
                      rdzv_backend="c10d", rdzv_endpoint="localhost:0", max_restarts=0,
                      monitor_interval=0.1, start_method="spawn", shutdown_timeout=math.ceil(STOP_GRACE_S))
    saved_env = _rank_env(error_dir, slots)
    log_path = Path(log) if log is not None else Path(error_dir, "ranks.log")
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log_path.write_text("")
    handlers = _signal_handlers()  # the agent installs its own and never puts these back
    try:
        for attempt in range(max_restarts + 1):
            os.environ[rank_log.ATTEMPT_ENV] = str(attempt)
            for stale in [*Path(error_dir).glob("rank*.err"), Path(error_dir, REQUEST_FILE)]:  # a previous attempt's
                stale.unlink(missing_ok=True)
            failures: list[rank_log.RankFailure] = []
            try:
                _run_agent(lc, argv, nproc)
                return
            except ChildFailedError as e:
                failures = [rank_log.read_failure(error_dir, attempt, rank, f.exitcode)
                            for rank, f in sorted(e.failures.items())]
            finally:
                rank_log.append_attempt(log_path, error_dir, attempt, nproc, failures)
            request = read_request(error_dir)
            if request is not None and replan is not None:
                nproc = _planned_restart(lc, request, attempt, max_restarts, replan, restart_from)
                continue
            log_path, nproc = _failed_restart(lc, failures, attempt, max_restarts, log is None, log_path, on_failure,
                                              restart_from)
    finally:
        _restore_signal_handlers(handlers)
        _restore_env(saved_env)


def _rank_env(error_dir: str | Path, slots: tuple[int, ...] | None) -> dict:
    """Set the environment the ranks read (one thread per rank unless told otherwise, as torchrun
    does; where they write errors; their device slots); returns what it was, for :func:`_restore_env`."""
    saved_env = {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", rank_log.DIR_ENV, rank_log.ATTEMPT_ENV, SLOTS_ENV)}
    if saved_env["OMP_NUM_THREADS"] is None:
        os.environ["OMP_NUM_THREADS"] = "1"
    os.environ[rank_log.DIR_ENV] = str(error_dir)
    if slots is not None:
        os.environ[SLOTS_ENV] = ",".join(map(str, slots))
    return saved_env


def _restore_env(saved_env: dict) -> None:
    for k, v in saved_env.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def _next_ranks(lc, nproc: int, slots: tuple[int, ...]) -> None:
    """The next attempt runs ``nproc`` ranks on device ``slots``, under a new run id."""
    lc.nproc_per_node = nproc
    os.environ[SLOTS_ENV] = ",".join(map(str, slots))


def _planned_restart(lc, request: dict, attempt: int, max_restarts: int, replan, restart_from) -> int:
    """Set up the restart rank 0 asked for (``replan(request)``: the next ranks and slots); raises
    RanksFailed where no restart is left. Returns the next attempt's rank count."""
    if attempt == max_restarts:
        raise RanksFailed(1, [f"an alert asked for a restart ({request.get('action')} at step "
                              f"{request.get('step')}) after {max_restarts} restart(s) already; raise "
                              "--max-restarts"]) from None
    nproc, slots = replan(request)
    _next_ranks(lc, nproc, slots)
    print(f"dayzero: restarting (attempt {attempt + 1}/{max_restarts}) on {nproc} ranks"
          f"{' ' + restart_from() if restart_from is not None else ''}", file=sys.stderr, flush=True)
    lc.run_id = str(uuid.uuid4())
    return nproc


def _failed_restart(lc, failures: list, attempt: int, max_restarts: int, keep_log: bool, log_path: Path,
                    on_failure, restart_from) -> tuple[Path, int]:
    """After ranks failed: raise RanksFailed (exit 2) where every cause is a user error, or (exit 1)
    where no restart is left (the log kept, ``keep_log``, when it was a temporary one); else print one
    line per failed rank, run the next attempt without the ranks that failed on their own
    (``on_failure``), and announce the restart. Returns (the log, the next attempt's rank count)."""
    causes = rank_log.causes(failures)
    if all(f.user_error for f in causes):
        raise RanksFailed(2, sorted({f.cause for f in causes})) from None
    if attempt == max_restarts:
        if keep_log:
            log_path = _keep(log_path)
        after = f"; gave up after {max_restarts} restart{'s' * (max_restarts != 1)}" if max_restarts else ""
        raise RanksFailed(1, ["; ".join(f.line() for f in causes) + f"{after}; details in "
                                                                    f"{log_path}"]) from None
    also = rank_log.consequence_line(failures)
    for line in [f.line() for f in causes] + ([also] if also else []):
        print(f"dayzero: {line}", file=sys.stderr)
    own = [f.rank for f in causes if not f.consequence and not f.user_error]
    nproc = lc.nproc_per_node
    if on_failure is not None and own:
        nproc, slots = on_failure(own, "; ".join(f.line() for f in causes))
        _next_ranks(lc, nproc, slots)
    where = f" {restart_from()}" if restart_from is not None else ""
    print(f"dayzero: restarting (attempt {attempt + 1}/{max_restarts}){where}", file=sys.stderr, flush=True)
    lc.run_id = str(uuid.uuid4())
    return log_path, nproc


def _run_agent(lc, argv: list[str], nproc: int) -> None:
    """One attempt: every rank under torchrun's agent (a failed rendezvous is retried once)."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import elastic_launch

    for attempt in (1, 2):
        try:
            elastic_launch(lc, sys.executable)(*argv)
            return
        except ChildFailedError:
            raise
        except SignalException as e:  # the agent has stopped every rank: a stop, never a retry
            raise Interrupted(e.sigval, ranks=nproc) from None
        except Interrupted as e:  # our own handler: the agent had not started the ranks yet
            raise Interrupted(e.signum, ranks=0) from None
        except Exception as e:  # noqa: BLE001 - the launcher itself (rendezvous, store) failed
            what = " ".join(f"{type(e).__name__}: {e}".split())[:300]
            if attempt == 2:
                raise RanksFailed(1, [f"could not run {nproc} ranks: {what}"]) from None
            print(f"dayzero: note: starting {nproc} ranks failed ({what}); retrying once", file=sys.stderr)
            lc.run_id = str(uuid.uuid4())


def _keep(log: Path) -> Path:
    """A copy of ``log`` that outlives the launch directory."""
    try:
        fd, kept = tempfile.mkstemp(prefix="dayzero-ranks-", suffix=".log")
        with os.fdopen(fd, "w") as out:
            out.write(log.read_text())
    except OSError as e:  # a full disk must not hide the ranks' failure
        print(f"dayzero: warning: cannot copy the ranks' log {log} ({e.strerror or e})", file=sys.stderr, flush=True)
        return log
    return Path(kept)


def _signal_handlers() -> dict[int, object]:
    if threading.current_thread() is not threading.main_thread():
        return {}
    return {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)}


def _restore_signal_handlers(handlers: dict[int, object]) -> None:
    for s, h in handlers.items():
        if h is not None:
            signal.signal(s, h)  # type: ignore[arg-type]


def run_as_rank(main: Callable[[StopOnSignal], int | None]) -> None:
    """The ``__main__`` of a rank module: run ``main(stop)`` (see :func:`training_process`: the
    rank dies with its launcher) and exit with its code; a crash logs its traceback, leaves its
    one-line cause (:mod:`dayzero.runtime.resilience.rank_log`) and exits 1 so the agent stops the
    other ranks. After a stop signal the rank exits 128 + the signal at once, whatever ``main`` did
    with it (it reaches DCP as an error on every rank)."""
    code: int | str | None = 1
    try:
        with rank_log.capture_stderr(), training_process(bind_to_parent=True) as stop:
            try:
                code = main(stop)
            except SystemExit as e:
                code = e.code
            except BaseException as e:
                if stop.signum is None:
                    traceback.print_exc()  # into the run's log (ranks.log); the launcher prints the one line
                    rank_log.write_crash(e)
    except Interrupted as e:  # the stop signal came while the rank was leaving its process context: no traceback
        exit_now(128 + e.signum)
    if stop.signum is not None:
        exit_now(128 + stop.signum)
    sys.exit(code)
