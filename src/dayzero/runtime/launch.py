"""Starting ranks, for every verb that runs on several local processes.

``launch_local(argv, nproc, error_dir)`` runs ``python <argv>`` on ``nproc`` local ranks under torchrun's
elastic agent (one intra-op thread per rank unless OMP_NUM_THREADS says otherwise, as torchrun
does; a failed rendezvous is retried once). A rank that hits a user error (DayzeroError) writes
its one-line message to ``rank<R>.err`` in the error directory and exits 2; the agent then stops
every other rank, so nothing hangs, and :class:`RanksFailed` carries each distinct message once.
A SIGINT or SIGTERM to the launcher stops every rank and raises :class:`Interrupted`: never a
retry or a restart, whatever ``max_restarts`` says. Each rank dies with the launcher and stops on
the signal as :mod:`dayzero.runtime.stopping` describes (:func:`run_as_rank`).
``init_distributed()`` is how a rank joins the group (device and backend: :mod:`dayzero.runtime.device`).

``spawn(configs, nproc)`` trains one or more configs that way (``dayzero train --nproc``); ``main``
is what each of its ranks runs (``python -m dayzero.runtime.launch [--error-dir DIR] CONFIG.json
...``). Several configs run one after another in the same process group (tests share one spawned
world across runs this way). :func:`train_here` trains in the calling process instead (a
single-process run, or one rank of the user's own torchrun). :mod:`dayzero.validate.launch`
runs a function on every rank and collects its results through the same ``launch_local``.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import signal
import sys
import tempfile
import threading
import traceback
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Callable, Iterable

from dayzero.errors import DayzeroError
from dayzero.runtime import rank_log
from dayzero.runtime.config import TrainConfig
from dayzero.runtime.stopping import STOP_GRACE_S, Interrupted, StopOnSignal, exit_now, training_process
from dayzero.runtime.checkpoint.versions import scan

PG_TIMEOUT_S = 600  # a rank stuck longer than this in a collective fails instead of hanging


class RanksFailed(Exception):
    """A local launch failed: ``exit_code`` 2 after a user error on some rank (``messages``: each
    distinct one-line message), 1 after a crash or when the ranks could not be started."""

    def __init__(self, exit_code: int, messages: list[str]):
        super().__init__("; ".join(messages))
        self.exit_code, self.messages = exit_code, messages


def init_distributed():
    """Join torchrun's process group (or make a one-process group) and pick this rank's device."""
    import torch.distributed as dist

    from dayzero.runtime import device as devices

    acc = devices.resolve()
    device = devices.bind(acc, int(os.environ.get("LOCAL_RANK", "0")))
    backend = acc.backend
    if not dist.is_initialized():
        if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
            from dayzero.runtime.faults import init_process_group

            # keys apart from a failed attempt's (torchrun restarts)
            init_process_group(backend, timeout=timedelta(seconds=PG_TIMEOUT_S),
                               device_id=devices.process_group_device(acc, device))
        else:
            dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    return device


def write_rank_error(error_dir: str | Path | None, err: DayzeroError) -> None:
    """Leave this rank's one-line message for the launching process (rank 0 prints it when there
    is no launcher to collect it)."""
    rank = int(os.environ.get("RANK", "0"))
    if error_dir:
        Path(error_dir, f"rank{rank}.err").write_text(str(err) + "\n")
    elif rank == 0:
        print(f"dayzero: error: {err}", file=sys.stderr)


def destroy_process_group() -> None:
    try:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
    except Exception:  # noqa: BLE001 - shutting down after an error must not mask it
        pass


def launch_local(argv: list[str], nproc: int, error_dir: str | Path, *, max_restarts: int = 0,
                 log: str | Path | None = None, restart_from: Callable[[], str] | None = None) -> None:
    """Run ``python <argv>`` on ``nproc`` local ranks; raise :class:`RanksFailed` if any fails
    (after ``max_restarts`` restarts of every rank; a user error is never restarted: it would only
    repeat), :class:`Interrupted` after a stop signal (every rank stopped, nothing relaunched). The
    ranks write user errors to ``error_dir`` (see :func:`write_rank_error`); their stderr goes to
    ``log`` (``ranks.log``; None: a file kept in the temp directory when the launch fails) and only
    their ``dayzero:`` lines to the terminal (:mod:`dayzero.runtime.rank_log`). Before a restart
    the terminal gets one line per failed rank and ``restarting (attempt a/K) <restart_from()>``."""
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
    saved_env = {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", rank_log.DIR_ENV, rank_log.ATTEMPT_ENV)}
    if saved_env["OMP_NUM_THREADS"] is None:  # as torchrun does: one thread per rank unless told otherwise
        os.environ["OMP_NUM_THREADS"] = "1"
    os.environ[rank_log.DIR_ENV] = str(error_dir)
    log_path = Path(log) if log is not None else Path(error_dir, "ranks.log")
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log_path.write_text("")
    handlers = _signal_handlers()  # the agent installs its own and never puts these back
    try:
        for attempt in range(max_restarts + 1):
            os.environ[rank_log.ATTEMPT_ENV] = str(attempt)
            for stale in Path(error_dir).glob("rank*.err"):  # a previous attempt's
                stale.unlink()
            failures: list[rank_log.RankFailure] = []
            try:
                _run_agent(lc, argv, nproc)
                return
            except ChildFailedError as e:
                failures = [rank_log.read_failure(error_dir, attempt, rank, f.exitcode)
                            for rank, f in sorted(e.failures.items())]
            finally:
                rank_log.append_attempt(log_path, error_dir, attempt, nproc, failures)
            causes = rank_log.causes(failures)
            if all(f.user_error for f in causes):
                raise RanksFailed(2, sorted({f.cause for f in causes})) from None
            if attempt == max_restarts:
                if log is None:
                    log_path = _keep(log_path)
                after = f"; gave up after {max_restarts} restart{'s' * (max_restarts != 1)}" if max_restarts else ""
                raise RanksFailed(1, ["; ".join(f.line() for f in causes) + f"{after}; details in {log_path}"]) from None
            also = rank_log.consequence_line(failures)
            for line in [f.line() for f in causes] + ([also] if also else []):
                print(f"dayzero: {line}", file=sys.stderr)
            where = f" {restart_from()}" if restart_from is not None else ""
            print(f"dayzero: restarting (attempt {attempt + 1}/{max_restarts}){where}", file=sys.stderr, flush=True)
            lc.run_id = str(uuid.uuid4())
    finally:
        _restore_signal_handlers(handlers)
        for k, v in saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


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
    fd, kept = tempfile.mkstemp(prefix="dayzero-ranks-", suffix=".log")
    with os.fdopen(fd, "w") as out:
        out.write(log.read_text())
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
    one-line cause (:mod:`dayzero.runtime.rank_log`) and exits 1 so the agent stops the other ranks. After a stop signal the rank exits 128 + the signal at
    once, whatever ``main`` did with it (it reaches DCP as an error on every rank)."""
    code: int | str | None = 1
    with rank_log.capture_stderr(), training_process(bind_to_parent=True) as stop:
        try:
            code = main(stop)
        except SystemExit as e:
            code = e.code
        except BaseException as e:
            if stop.signum is None:
                traceback.print_exc()  # into the run's log (ranks.log); the launcher prints the one line
                rank_log.write_crash(e)
    if stop.signum is not None:
        exit_now(128 + stop.signum)
    sys.exit(code)


# -- dayzero train --nproc -----------------------------------------------------------------------

def run_configs(configs: list[TrainConfig], error_dir: str | None = None, stop: StopOnSignal | None = None) -> int:
    """Train each config in turn on this rank; returns the process exit code. With ``stop``, an
    error after a stop signal (a save it cut short) raises :class:`Interrupted` instead."""
    try:
        device = init_distributed()
        for cfg in configs:
            _train_one(cfg, device)
        return 0
    except DayzeroError as e:
        if stop is not None and stop.signum is not None:
            raise Interrupted(stop.signum) from None
        write_rank_error(error_dir, e)
        return e.exit_code
    finally:
        destroy_process_group()


def train_here(configs: list[TrainConfig], *, under_agent: bool) -> int:
    """Train in this process (a single-process run, or ``under_agent``: one rank of the user's
    torchrun, which dies with its agent). After a stop signal, rank 0 prints one line and the
    process exits 128 + the signal at once (an async save in flight is abandoned)."""
    with training_process(bind_to_parent=under_agent) as stop:
        try:
            return run_configs(configs, stop=stop)
        except BaseException:
            if stop.signum is None:
                raise
    if os.environ.get("RANK", "0") == "0":
        print(f"dayzero: {Interrupted(stop.signum).describe()}{committed_note(c.ckpt_dir for c in configs)}",
              file=sys.stderr)
    exit_now(128 + stop.signum)


def committed_note(ckpt_dirs: Iterable[str | None]) -> str:
    """``"; last committed checkpoint step N"`` for each checkpoint directory (its newest version
    with the COMPLETE marker), ``""`` without one."""
    dirs = list(dict.fromkeys(d for d in ckpt_dirs if d))
    notes = []
    for d in dirs:
        steps = [v.step for v in scan(Path(d)) if v.state == "complete"]
        where = f" in {d}" if len(dirs) > 1 else ""
        notes.append(f"last committed checkpoint step {max(steps)}{where}" if steps else f"no committed checkpoint{where}")
    return "".join(f"; {n}" for n in notes)


def ranks_log(configs: list[TrainConfig]) -> Path | None:
    """Where a spawned run keeps its ranks' output: ``<metrics>.ranks.log`` next to the metrics
    file, else ``ranks.log`` in the checkpoint directory; None (a temp file, kept on failure)."""
    cfg = configs[0]
    if cfg.metrics:
        return Path(cfg.metrics).with_suffix(".ranks.log")
    return Path(cfg.ckpt_dir, "ranks.log") if cfg.ckpt_dir else None


def resume_point(configs: list[TrainConfig]) -> str:
    """Where restarted ranks pick up: ``from checkpoint step N`` (the version ``--resume`` picks:
    auto's first complete one in resume order, or the step asked for), or ``from the start``."""
    from dayzero.runtime.checkpoint.lineage import resume_order

    cfg = configs[0]  # restarted ranks run the configs again from the first
    if not cfg.ckpt_dir or cfg.resume == "never":
        return "from the start"
    if str(cfg.resume).isdigit():
        return f"from checkpoint step {int(cfg.resume)}"
    if cfg.resume != "auto":
        return f"from checkpoint {cfg.resume}"
    step = next((v.step for v in resume_order(scan(Path(cfg.ckpt_dir))) if v.state == "complete"), None)
    return f"from checkpoint step {step}" if step is not None else "from the start"


def _train_one(cfg: TrainConfig, device) -> None:
    import gc

    from dayzero.runtime.train import build_state, train

    state = build_state(cfg, device)
    train(cfg, state=state)
    del state
    gc.collect()


def main(argv: list[str] | None = None, stop: StopOnSignal | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m dayzero.runtime.launch")
    ap.add_argument("--error-dir", default=None)
    ap.add_argument("configs", nargs="+")
    a = ap.parse_args(argv)
    return run_configs([TrainConfig.load(p) for p in a.configs], a.error_dir, stop)


def spawn(configs: TrainConfig | list[TrainConfig], nproc: int) -> int:
    """Run the config(s) on ``nproc`` local ranks (torchrun --standalone). Returns 0, 2 after a
    user error (its message printed once on stderr), 1 after a crash, or 128 + the signal after
    SIGINT/SIGTERM (one line: ranks stopped, the last committed checkpoint)."""
    configs = configs if isinstance(configs, list) else [configs]
    with tempfile.TemporaryDirectory(prefix="dayzero-launch-") as tmp:
        paths = []
        for i, cfg in enumerate(configs):
            p = Path(tmp, f"config{i}.json")
            cfg.save(p)
            paths.append(str(p))
        errors = Path(tmp, "errors")
        errors.mkdir()
        try:
            launch_local(["-m", "dayzero.runtime.launch", "--error-dir", str(errors), *paths], nproc, errors,
                         max_restarts=max(c.max_restarts for c in configs), log=ranks_log(configs),
                         restart_from=lambda: resume_point(configs))
            return 0
        except RanksFailed as e:
            for m in e.messages:
                print(f"dayzero: error: {m}", file=sys.stderr)
            return e.exit_code
        except Interrupted as e:
            print(f"dayzero: {e.describe()}{committed_note(c.ckpt_dir for c in configs)}", file=sys.stderr)
            return e.exit_code


if __name__ == "__main__":
    run_as_rank(lambda stop: main(stop=stop))
