"""The entry point of ``dayzero train``: train one or more configs here or on spawned ranks.

``spawn(configs, nproc)`` trains them on ``nproc`` local ranks through
:func:`dayzero.runtime.launch.launch_local` (``dayzero train --nproc``); ``main`` is what each of
those ranks runs (``python -m dayzero.runtime.train_entry [--error-dir DIR] CONFIG.json ...``).
Several configs run one after another in the same process group (tests share one spawned world
across runs this way). :func:`train_here` trains in the calling process instead (a single-process
run, or one rank of the user's own torchrun). After a stop signal both say where a restart would
pick up (:func:`committed_note`, :func:`resume_point`). :func:`run_train` is the choice between
the two for ``dayzero train`` (:func:`launch_world`: under the user's torchrun, or ``--nproc`` ranks),
holding the checkpoint directory's lock for the job.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import sys
import tempfile
from pathlib import Path
from typing import Iterable, Iterator

from dayzero.errors import DayzeroError
from dayzero.runtime.checkpoint.dirlock import DirLock, check_free
from dayzero.runtime.checkpoint.lineage import resume_order
from dayzero.runtime.checkpoint.versions import scan
from dayzero.runtime.config import TrainConfig
from dayzero.runtime.distributed import destroy_process_group, init_distributed
from dayzero.runtime.launch import RanksFailed, launch_local, run_as_rank, write_rank_error
from dayzero.runtime.resilience.actions import RESTART_EXIT, PlannedRestart
from dayzero.runtime.resilience.relaunch import Relauncher
from dayzero.runtime.resilience.stopping import Interrupted, StopOnSignal, exit_now, training_process
from dayzero.runtime.train import build_state, train


def run_configs(configs: list[TrainConfig], error_dir: str | None = None, stop: StopOnSignal | None = None) -> int:
    """Train each config in turn on this rank; returns the process exit code. With ``stop``, an
    error after a stop signal (a save it cut short) raises :class:`Interrupted` instead."""
    try:
        device = init_distributed()
        for cfg in configs:
            _train_one(cfg, device)
        return 0
    except PlannedRestart:  # an alert's restart or exclude: the checkpoint is saved, the launcher relaunches
        return RESTART_EXIT
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
        print(f"dayzero: {Interrupted(stop.signum).describe()}{committed_note(c.checkpoint.dir for c in configs)}",
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
        notes.append(f"last committed checkpoint step {max(steps)}{where}" if steps
                     else f"no committed checkpoint{where}")
    return "".join(f"; {n}" for n in notes)


def ranks_log(configs: list[TrainConfig]) -> Path | None:
    """Where a spawned run keeps its ranks' output: ``<metrics>.ranks.log`` next to the metrics
    file, else ``ranks.log`` in the checkpoint directory; None (a temp file, kept on failure)."""
    cfg = configs[0]
    if cfg.metrics:
        return Path(cfg.metrics).with_suffix(".ranks.log")
    return Path(cfg.checkpoint.dir, "ranks.log") if cfg.checkpoint.dir else None


def resume_point(configs: list[TrainConfig]) -> str:
    """Where restarted ranks pick up: ``from checkpoint step N`` (the version ``--resume`` picks:
    auto's first complete one in resume order, or the step asked for), or ``from the start``."""
    cfg = configs[0]  # restarted ranks run the configs again from the first
    if not cfg.checkpoint.dir or cfg.checkpoint.resume == "never":
        return "from the start"
    if str(cfg.checkpoint.resume).isdigit():
        return f"from checkpoint step {int(cfg.checkpoint.resume)}"
    if cfg.checkpoint.resume != "auto":
        return f"from checkpoint {cfg.checkpoint.resume}"
    step = next((v.step for v in resume_order(scan(Path(cfg.checkpoint.dir))) if v.state == "complete"), None)
    return f"from checkpoint step {step}" if step is not None else "from the start"


def _train_one(cfg: TrainConfig, device) -> None:
    state = build_state(cfg, device)
    train(cfg, state=state)
    del state
    gc.collect()


def main(argv: list[str] | None = None, stop: StopOnSignal | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m dayzero.runtime.train_entry")
    ap.add_argument("--error-dir", default=None)
    ap.add_argument("configs", nargs="+")
    a = ap.parse_args(argv)
    return run_configs([TrainConfig.load(p) for p in a.configs], a.error_dir, stop)


def spawn(configs: TrainConfig | list[TrainConfig], nproc: int) -> int:
    """Run the config(s) on ``nproc`` local ranks (torchrun --standalone), with
    ``faults.spares`` more local device slots kept idle for replacing excluded ones. Returns 0, 2
    after a user error (its message printed once on stderr), 1 after a crash, or 128 + the signal
    after SIGINT/SIGTERM (one line: ranks stopped, the last committed checkpoint). An alert's
    restart or exclude action relaunches the ranks (:mod:`dayzero.runtime.resilience.relaunch`)."""
    configs = configs if isinstance(configs, list) else [configs]
    with tempfile.TemporaryDirectory(prefix="dayzero-launch-") as tmp:
        paths = [Path(tmp, f"config{i}.json") for i in range(len(configs))]
        errors = Path(tmp, "errors")
        errors.mkdir()
        try:
            plan = Relauncher(configs, paths, nproc)
            nproc, slots = plan.start()
            launch_local(["-m", "dayzero.runtime.train_entry", "--error-dir", str(errors), *map(str, paths)], nproc,
                         errors, max_restarts=max(c.faults.max_restarts for c in configs), log=ranks_log(configs),
                         restart_from=lambda: resume_point(configs), replan=plan.replan, slots=slots,
                         on_failure=plan.failed if any(c.faults.on_rank_failure == "exclude" for c in configs)
                         else None)
            return 0
        except DayzeroError as e:  # no layout fits the ranks left
            print(f"dayzero: error: {e}", file=sys.stderr)
            return e.exit_code
        except RanksFailed as e:
            for m in e.messages:
                print(f"dayzero: error: {m}", file=sys.stderr)
            return e.exit_code
        except Interrupted as e:
            print(f"dayzero: {e.describe()}{committed_note(c.checkpoint.dir for c in configs)}", file=sys.stderr)
            return e.exit_code


def under_torchrun() -> bool:
    """Whether this process is one rank of a job torchrun (or another launcher) started."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ and "LOCAL_RANK" in os.environ


def launch_world(nproc: int | None) -> tuple[bool, int]:
    """``(torchrun, world)``: under torchrun its WORLD_SIZE (``--nproc`` ignored), else ``nproc`` or 1."""
    torchrun = under_torchrun()
    return torchrun, int(os.environ["WORLD_SIZE"]) if torchrun else (nproc or 1)


@contextlib.contextmanager
def ckpt_dir_lock(ckpt_dir: str | None, torchrun: bool, world: int) -> Iterator[None]:
    """One job per checkpoint directory (:mod:`dayzero.runtime.checkpoint.dirlock`), refused before any work.

    Spawning ranks, this process owns the job (it outlives restarts of its ranks): it holds the
    lock and lends it to them. Otherwise rank 0's Checkpointer takes it; here it is only checked
    (by rank 0 alone under torchrun: another rank could see this job's own lock)."""
    if not ckpt_dir:
        yield
        return
    if torchrun or world == 1:
        if not torchrun or os.environ.get("RANK") == "0":
            check_free(ckpt_dir)
        yield
        return
    with DirLock(ckpt_dir, lend_to_children=True):
        yield


def run_train(cfg: TrainConfig, world: int, torchrun: bool) -> int:
    """``dayzero train``'s run: here (one process, or one rank under torchrun) or on ``world``
    spawned local ranks, under the checkpoint directory's lock; returns the exit code."""
    with ckpt_dir_lock(cfg.checkpoint.dir, torchrun, world):
        if torchrun or world == 1:
            return train_here([cfg], under_agent=torchrun)
        return spawn(cfg, world)


if __name__ == "__main__":
    run_as_rank(lambda stop: main(stop=stop))
