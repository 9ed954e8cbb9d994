"""Checkpoints, resume, fault drills, the hang watchdog and loss guards, for one training loop.

A loop uses it in five places (``R = Resilience(cfg, model=..., optimizer=..., ...)``)::

    pos = R.start()                          # resume (or fresh); pos.step, pos.data
    while step < steps:
        R.begin_step(step + 1)               # watchdog heartbeat, fault drills
        batch ids = next ids from pos.data, skipping R.should_skip(id)
        loss = forward/backward (the global loss, identical on every rank)
        v = R.judge(step + 1, loss, ids)     # loss guard
        if v.action == "rollback": pos = R.rollback(step + 1); continue   # reloaded state
        if v.ok: optimizer.step(); scheduler.step()    # "skip": drop the gradients instead
        step += 1; R.end_step(step, data_position)      # periodic save
    R.finish(step, data_position)            # final save, wait for async saves

The data position is the loop's own JSON value (e.g. ``{"batch": next_batch_id}``); batches
are named by global ids so that a rollback can skip the offending ones on replay.
"""

from __future__ import annotations

import contextlib
import math
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from dayzero.errors import DayzeroError
from dayzero.runtime.checkpoint.checkpointer import Checkpointer, SavedCheckpoint
from dayzero.runtime.checkpoint.manifest import CHECKSUMS, DEFAULT_CHECKSUM, CheckpointError
from dayzero.runtime.distributed import restart_attempt
from dayzero.runtime.resilience.faults import FaultInjector, FaultSpec
from dayzero.runtime.resilience.guards import GuardConfig, GuardVerdict, LossDivergedError, LossGuard
from dayzero.runtime.resilience.watchdog import Watchdog

DEFAULT_SAVE_TIMEOUT_S = 600.0  # with --watchdog and no --save-timeout


@dataclass(frozen=True)
class ResilienceConfig:
    ckpt_dir: str | None = None
    every: int = 0  # save every N steps (0: only at the end)
    keep: int = 3  # versions of this run's lineage to keep
    prune_other_lineages: bool = False  # let retention delete other lineages' versions too
    resume: str = "auto"  # "auto" | "never" | a step number | a version directory
    async_save: bool = False
    checksum: str = DEFAULT_CHECKSUM
    faults: tuple[FaultSpec, ...] = ()
    watchdog_s: float = 0.0  # seconds without a finished step before the watchdog aborts (0: steps not timed)
    # the watchdog's budget for a checkpoint save (sync, or async until committed), a resume or a
    # rollback; None: DEFAULT_SAVE_TIMEOUT_S when watchdog_s is set, else checkpoint I/O is not timed
    save_timeout_s: float | None = None
    guard: GuardConfig | None = None
    max_rollbacks: int = 3  # per process, so a rollback loop cannot run forever

    def __post_init__(self):
        if self.every < 0:
            raise DayzeroError(f"--ckpt-every {self.every}: must be >= 0")
        if self.checksum not in CHECKSUMS:
            raise DayzeroError(f"--ckpt-checksum {self.checksum}: expected one of {', '.join(CHECKSUMS)}")
        if self.guard is not None and self.guard.action == "rollback" and not self.ckpt_dir:
            raise DayzeroError("--on-bad-loss rollback needs --ckpt-dir (there is nothing to roll back to)")
        if self.ckpt_dir is None and self.resume not in ("auto", "never"):
            raise DayzeroError(f"--resume {self.resume}: needs --ckpt-dir")
        if self.watchdog_s < 0:
            raise DayzeroError(f"--watchdog {self.watchdog_s}: must be >= 0 seconds (0: off)")
        if self.save_timeout_s is not None and not self.save_timeout_s > 0:
            raise DayzeroError(f"--save-timeout {self.save_timeout_s}: must be > 0 seconds")

    @property
    def watched(self) -> bool:
        """Whether a watchdog runs: for steps (watchdog_s), checkpoint I/O (save_timeout_s) or both."""
        return self.watchdog_s > 0 or self.save_timeout_s is not None

    @property
    def save_budget_s(self) -> float:
        return self.save_timeout_s if self.save_timeout_s is not None else DEFAULT_SAVE_TIMEOUT_S


@dataclass(frozen=True)
class Position:
    step: int  # optimizer steps completed
    data: Any  # the data position saved with that step (None when starting fresh)
    path: Path | None = None  # the checkpoint it came from


class Resilience:
    def __init__(self, cfg: ResilienceConfig, *, model, optimizer=None, scheduler=None, model_name: str = "",
                 spec_digest: str = "", model_recipe: dict | None = None, layout: dict | None = None, rank: int = 0,
                 on_event: Callable[[dict], None] | None = None):
        self.cfg, self.rank = cfg, rank
        self._model, self._optimizer, self._scheduler = model, optimizer, scheduler
        self._on_event = on_event
        self.faults = FaultInjector(cfg.faults, rank, restart_attempt(), on_event=self._event)
        self.ckpt = None
        if cfg.ckpt_dir:
            self.ckpt = Checkpointer(cfg.ckpt_dir, keep=cfg.keep, async_save=cfg.async_save, model_name=model_name,
                                     spec_digest=spec_digest, model_recipe=model_recipe, layout=layout,
                                     before_shard_write=self.faults.at_save, on_event=self._event,
                                     checksum=cfg.checksum, prune_other_lineages=cfg.prune_other_lineages)
        self.guard = LossGuard(cfg.guard) if cfg.guard else None
        self.watchdog = Watchdog(cfg.watchdog_s or math.inf, on_timeout=self._event) if cfg.watched else None
        self.skipped: set[int] = set()
        self._recent: deque[tuple[int, ...]] = deque(maxlen=cfg.guard.skip_batches if cfg.guard else 1)
        self._rollbacks = 0
        self._last_saved = -1

    # -- the loop's calls ----------------------------------------------------------------------
    def start(self) -> Position:
        pos = Position(0, None)
        if self.watchdog is not None:
            self.watchdog.start()
        if self.ckpt is not None and self.cfg.resume != "never":
            with self._slow_op("checkpoint resume"):
                r = self.ckpt.resume(self._model, self._optimizer, self._scheduler, which=self.cfg.resume)
            if r is not None:
                self._restore_extra(r.extra)
                pos = Position(r.step, r.data, r.path)
                self._last_saved = r.step
        return pos

    def should_skip(self, batch_id: int) -> bool:
        return batch_id in self.skipped

    def begin_step(self, step: int) -> None:
        if self.watchdog is not None:
            self.watchdog.beat(step - 1)
        self.faults.at_step(step)

    def judge(self, step: int, loss: float, batch_ids: Sequence[int] = ()) -> GuardVerdict:
        if self.guard is None:
            loss = float(loss)
            if not math.isfinite(loss):  # the optimizer would apply it: stop rather than train on garbage
                raise LossDivergedError(
                    f"step {step}: the loss is {loss}; training stopped before the optimizer applied it. "
                    "Lower --lr or check the data and config, or pass --on-bad-loss skip|rollback to drop such steps")
            return GuardVerdict(True, loss=loss)
        v = self.guard.observe(step, loss)
        self._recent.append(tuple(int(b) for b in batch_ids))
        if not v.ok:
            self._event(v.event(step, batches=list(batch_ids)))
        return v

    def rollback(self, step: int) -> Position:
        """Reload the newest good checkpoint of this run (its lineage, or the version it resumed
        from); the batches of the last ``skip_batches`` steps up to the offending one are skipped
        when the loop replays the data stream."""
        self._rollbacks += 1
        if self._rollbacks > self.cfg.max_rollbacks:
            raise LossDivergedError(f"bad loss at step {step} after {self.cfg.max_rollbacks} rollbacks already; "
                                    "the run diverged: lower the learning rate or inspect the skipped batches")
        doomed = {b for ids in self._recent for b in ids}
        assert self.ckpt is not None  # ResilienceConfig requires --ckpt-dir for rollback
        with self._slow_op(f"rollback from step {step}"):
            r = self.ckpt.rollback(self._model, self._optimizer, self._scheduler)
        if r is None:
            raise DayzeroError(f"bad loss at step {step} but no checkpoint to roll back to yet; use "
                               "--on-bad-loss skip, or save earlier with a smaller --ckpt-every")
        self._restore_extra(r.extra)
        self.skipped |= doomed
        self._recent.clear()
        self._event({"event": "rollback", "from_step": step, "to_step": r.step, "path": str(r.path),
                     "skip_batches": sorted(doomed)})
        return Position(r.step, r.data, r.path)

    def end_step(self, step: int, data: Any) -> SavedCheckpoint | float | None:
        if self.watchdog is not None:
            self.watchdog.beat(step)
        if self.ckpt is not None and self.cfg.every and step % self.cfg.every == 0:
            return self.save(step, data)
        return None

    def finish(self, step: int, data: Any) -> None:
        """Save the final step (unless just saved) and wait for async saves to commit."""
        try:
            if self.ckpt is not None and step != self._last_saved:
                self.save(step, data)
            if self.ckpt is not None:
                with self._slow_op("the last async checkpoint save"):
                    self.ckpt.wait()
        finally:
            self.close()

    def save(self, step: int, data: Any) -> SavedCheckpoint | float:
        assert self.ckpt is not None
        with self._slow_op(f"checkpoint save of step {step}"):
            out = self.ckpt.save(step, self._model, self._optimizer, scheduler=self._scheduler, data=data,
                                 extra=self._extra())
        if self.watchdog is not None and isinstance(out, float):  # async: the rest runs in the background
            ckpt = self.ckpt
            self.watchdog.watch(f"async checkpoint save of step {step}", lambda: not ckpt.in_flight(),
                                self.cfg.save_budget_s)
        self._last_saved = step
        return out

    @property
    def last_saved(self) -> int | None:
        """The newest step saved or resumed by this process (None: none yet)."""
        return self._last_saved if self._last_saved >= 0 else None

    def save_now(self, step: int, data: Any) -> None:
        """Save ``step`` unless it is saved already, and wait until it is committed (an alert's
        checkpoint: the run may stop right after)."""
        assert self.ckpt is not None  # --on-alert checkpoint|restart|exclude requires --ckpt-dir
        if step != self._last_saved:
            self.save(step, data)
        with self._slow_op(f"the checkpoint of step {step}"):
            self.ckpt.wait()

    def close(self, wait: bool = True) -> None:
        """Stop the watchdog and the checkpointer; ``wait=False`` (the run is failing) abandons
        an async save in flight instead of waiting for ranks that may be gone."""
        if self.watchdog is not None:
            self.watchdog.stop()
        if self.ckpt is not None:
            self.ckpt.close(wait=wait)

    # -- helpers -------------------------------------------------------------------------------
    def _extra(self) -> dict:
        return {"guard": self.guard.state_dict() if self.guard else None, "skipped_batches": sorted(self.skipped)}

    def _restore_extra(self, extra: dict) -> None:
        """The loop's state from a checkpoint's extras (checked: a bad value is one clear error)."""
        if self.guard is not None and extra.get("guard"):
            self.guard.load_state_dict(extra["guard"])
        skipped = extra.get("skipped_batches", [])
        if not isinstance(skipped, list) or not all(isinstance(b, int) and not isinstance(b, bool) and b >= 0
                                                    for b in skipped):
            raise CheckpointError(f"the checkpoint's skipped_batches {str(skipped)[:120]!r} is not a list of batch "
                                  "numbers; resume from another version (--resume STEP)")
        self.skipped |= set(skipped)

    @contextlib.contextmanager
    def _slow_op(self, what: str) -> Iterator[None]:
        """Checkpoint I/O: the watchdog's save budget instead of the step timeout."""
        if self.watchdog is None:
            yield
        else:
            with self.watchdog.allow(self.cfg.save_budget_s, what):
                yield

    def _event(self, ev: dict) -> None:
        if self._on_event is not None:
            self._on_event({**ev, "rank": self.rank})


def resilience_config(cfg) -> ResilienceConfig:
    """The ResilienceConfig of a :class:`dayzero.runtime.config.TrainConfig` (validates every
    option: call it before starting ranks, so a typo is one line, not a crashed job)."""
    ck, fa = cfg.checkpoint, cfg.faults
    guard = None
    only_with("--spike-factor", bool(fa.spike_factor), "--on-bad-loss skip|rollback", fa.on_bad_loss is not None)
    if fa.on_bad_loss is not None:
        guard = GuardConfig(spike_factor=fa.spike_factor, action=fa.on_bad_loss)
    # checkpoint options that mean nothing without a checkpoint directory (their defaults excepted)
    for flag, used in (("--ckpt-every", ck.every != 0), ("--keep", ck.keep != ResilienceConfig.keep),
                       ("--async-save", ck.async_save), ("--ckpt-prune-other-lineages", ck.prune_other_lineages),
                       ("--ckpt-checksum", ck.checksum != DEFAULT_CHECKSUM)):
        only_with(flag, used, "--ckpt-dir", bool(ck.dir))
    if ck.keep < 1:
        raise DayzeroError(f"--keep {ck.keep}: at least 1 checkpoint must be kept")
    if ck.resume not in ("auto", "never") and not str(ck.resume).isdigit() and not Path(ck.resume).is_dir():
        raise DayzeroError(f"--resume {ck.resume}: expected auto, never, a step number or a checkpoint directory")
    faults = tuple(FaultSpec.parse(f) for f in fa.inject_faults)
    for f in faults:
        check_fires(f, steps=cfg.steps, world=cfg.parallel.world, ckpt_dir=ck.dir, every=ck.every)
    return ResilienceConfig(ckpt_dir=ck.dir, every=ck.every, keep=ck.keep,
                            prune_other_lineages=ck.prune_other_lineages, resume=ck.resume,
                            async_save=ck.async_save, checksum=ck.checksum, faults=faults,
                            watchdog_s=fa.watchdog, save_timeout_s=fa.save_timeout, guard=guard)


def only_with(flag: str, used: bool, needed: str, present: bool) -> None:
    """Refuse an option that applies only together with another one (it would be ignored)."""
    if used and not present:
        raise DayzeroError(f"{flag} applies only with {needed}; add {needed} or drop {flag}")


def check_fires(f: FaultSpec, *, steps: int, world: int, ckpt_dir: str | None, every: int) -> None:
    """Refuse a drill that can never fire in this run (a drill that silently does nothing would
    pass as a run that survived it)."""
    what = f"--inject-fault {f.describe()}"
    if f.step > steps:
        raise DayzeroError(f"{what}: step {f.step} is past the last step ({steps}); use a step <= --steps")
    if f.rank >= world:
        raise DayzeroError(f"{what}: rank {f.rank} does not exist in a world of {world}; use a rank < {world}")
    if f.at == "save":
        saves = bool(ckpt_dir) and (f.step == steps or (every > 0 and f.step % every == 0))
        if not saves:
            when = f"steps divisible by --ckpt-every {every} and the last step {steps}" if ckpt_dir and every \
                else f"the last step {steps}" if ckpt_dir else "no step: there is no --ckpt-dir"
            raise DayzeroError(f"{what}: no checkpoint is saved at step {f.step} (saves happen at {when})")


def build_resilience(cfg, state, on_event: Callable[[dict], None]) -> Resilience:
    """Resilience for a runtime TrainState (model parts, one optimizer, LR scheduler)."""
    return Resilience(resilience_config(cfg), model=state.model, optimizer=state.optimizer,
                      scheduler=state.scheduler, model_name=state.spec.name, spec_digest=state.spec.digest(),
                      model_recipe=cfg.model.recipe(), layout=cfg.parallel.to_dict(), rank=state.rank,
                      on_event=on_event)
