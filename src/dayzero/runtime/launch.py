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
from dayzero.runtime.config import TrainConfig
from dayzero.runtime.stopping import STOP_GRACE_S, Interrupted, StopOnSignal, exit_now, training_process
from dayzero.runtime.versions import scan

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


def launch_local(argv: list[str], nproc: int, error_dir: str | Path, *, max_restarts: int = 0) -> None:
    """Run ``python <argv>`` on ``nproc`` local ranks; raise :class:`RanksFailed` if any fails,
    :class:`Interrupted` after a stop signal (every rank stopped, nothing relaunched). The ranks
    write user errors to ``error_dir`` (see :func:`write_rank_error`)."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    # the agent's own log lines would bury the one line that matters (each of its modules' loggers
    # has a level of its own, so the parent's is not enough)
    for name in [n for n in logging.root.manager.loggerDict if n.startswith("torch.distributed.elastic")]:
        logging.getLogger(name).setLevel(logging.CRITICAL)
    # on a signal the agent passes it on to every rank and SIGKILLs those still alive this much later
    lc = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=nproc, run_id=str(uuid.uuid4()),
                      rdzv_backend="c10d", rdzv_endpoint="localhost:0", max_restarts=max_restarts,
                      monitor_interval=0.1, start_method="spawn", shutdown_timeout=math.ceil(STOP_GRACE_S))
    env_threads = os.environ.get("OMP_NUM_THREADS")
    if env_threads is None:  # as torchrun does: one thread per rank unless told otherwise
        os.environ["OMP_NUM_THREADS"] = "1"
    handlers = _signal_handlers()  # the agent installs its own and never puts these back
    try:
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
    except ChildFailedError as e:
        messages = sorted({f.read_text().strip() for f in Path(error_dir).glob("rank*.err")})
        if messages:
            raise RanksFailed(2, messages) from None
        rank, failure = e.get_first_failure()
        raise RanksFailed(1, [f"rank {rank} failed with exit code {failure.exitcode}; its traceback is above"]) from None
    finally:
        _restore_signal_handlers(handlers)
        if env_threads is None:
            os.environ.pop("OMP_NUM_THREADS", None)


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
    rank dies with its launcher) and exit with its code; a crash shows its traceback and exits 1
    so the agent stops the other ranks. After a stop signal the rank exits 128 + the signal at
    once, whatever ``main`` did with it (it reaches DCP as an error on every rank)."""
    code: int | str | None = 1
    with training_process(bind_to_parent=True) as stop:
        try:
            code = main(stop)
        except SystemExit as e:
            code = e.code
        except BaseException:
            if stop.signum is None:
                traceback.print_exc()
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
                         max_restarts=max(c.max_restarts for c in configs))
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
