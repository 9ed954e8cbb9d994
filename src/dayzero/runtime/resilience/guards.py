"""Loss guards: catch a NaN/Inf loss or a loss spike before the optimizer applies it.

A loss is bad when it is NaN or infinite, or (after ``warmup`` accepted steps) larger than
``spike_factor`` x the mean of the last ``window`` accepted losses. The training loop then either
skips the step (drops the gradients, the batch is consumed) or rolls back to the last checkpoint
and skips the offending batches on replay, as large runs do after a spike (Chowdhery et al. 2022,
PaLM, section 5.1 "Training instability": they "re-started training from a checkpoint roughly
100 steps before the spike started, and skipped roughly 200-500 data batches"). Every decision
is an event for the metrics stream.

The guard must see the same loss on every rank (the globally reduced loss) so that all ranks take
the same decision; its state is saved in checkpoints so a resumed run decides identically.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Literal

from dayzero.errors import DayzeroError

Action = Literal["skip", "rollback"]


class LossGuardStateError(DayzeroError):
    """A checkpoint's saved loss-guard state cannot be restored."""


class LossDivergedError(DayzeroError):
    """Too many bad losses in a row: the run diverged; skipping more would hide it."""


@dataclass(frozen=True)
class GuardConfig:
    spike_factor: float = 0.0  # k: a loss > k x running mean is a spike; 0 checks NaN/Inf only
    window: int = 20  # accepted losses in the running mean
    warmup: int = 5  # accepted losses needed before spikes are judged
    action: Action = "skip"
    skip_batches: int = 1  # with rollback: batches skipped on replay, ending at the offending one
    max_consecutive: int = 5  # bad losses in a row before giving up with LossDivergedError

    def __post_init__(self):
        if self.spike_factor != 0 and self.spike_factor <= 1:
            raise DayzeroError(f"--spike-factor {self.spike_factor}: must be > 1 (or 0 to check only NaN/Inf)")
        if self.window < 1 or self.warmup < 0 or self.skip_batches < 1 or self.max_consecutive < 1:
            raise DayzeroError(f"loss guard: window {self.window}, skip_batches {self.skip_batches} and "
                               f"max_consecutive {self.max_consecutive} must be >= 1, warmup {self.warmup} >= 0")
        if self.action not in ("skip", "rollback"):
            raise DayzeroError(f"--on-bad-loss {self.action!r}: expected skip or rollback")


@dataclass(frozen=True)
class GuardVerdict:
    ok: bool
    reason: str = ""  # "nan" | "inf" | "spike"
    action: str = ""  # "skip" | "rollback" when not ok
    loss: float = 0.0
    mean: float | None = None

    def event(self, step: int, **extra) -> dict:
        return {"event": "loss_guard", "step": step, "loss": self.loss if math.isfinite(self.loss) else str(self.loss),
                "reason": self.reason, "action": self.action, "running_mean": self.mean, **extra}


class LossGuard:
    def __init__(self, config: GuardConfig):
        self.config = config
        self._history: deque[float] = deque(maxlen=config.window)
        self._consecutive = 0

    @property
    def mean(self) -> float | None:
        return sum(self._history) / len(self._history) if self._history else None

    def check(self, loss: float) -> GuardVerdict:
        """Judge ``loss`` without changing state."""
        loss = float(loss)
        c = self.config
        if math.isnan(loss):
            return GuardVerdict(False, "nan", c.action, loss, self.mean)
        if math.isinf(loss):
            return GuardVerdict(False, "inf", c.action, loss, self.mean)
        mean = self.mean
        if c.spike_factor and len(self._history) >= max(c.warmup,
                                                        1) and mean is not None and loss > c.spike_factor * mean:
            return GuardVerdict(False, "spike", c.action, loss, mean)
        return GuardVerdict(True, loss=loss, mean=mean)

    def observe(self, step: int, loss: float) -> GuardVerdict:
        """Judge ``loss`` and record it; raise LossDivergedError after too many bad ones in a row."""
        v = self.check(loss)
        if v.ok:
            self._history.append(v.loss)
            self._consecutive = 0
            return v
        self._consecutive += 1
        if self._consecutive > self.config.max_consecutive:
            raise LossDivergedError(f"loss was bad ({v.reason}, {v.loss:g}) for {self._consecutive} steps in a row up "
                                    f"to step {step} (running mean {v.mean}); the run diverged: lower the learning "
                                    "rate or resume from an earlier checkpoint")
        return v

    def state_dict(self) -> dict:
        return {"history": list(self._history), "consecutive": self._consecutive}

    def load_state_dict(self, state: dict) -> None:
        ok = isinstance(state, dict)
        history, consecutive = (state.get("history", []), state.get("consecutive", 0)) if ok else (None, None)
        if (not isinstance(history, list) or not all(isinstance(x, (int, float)) and not isinstance(x, bool)
                                                     and math.isfinite(x) for x in history)
                or not isinstance(consecutive, int) or isinstance(consecutive, bool) or consecutive < 0):
            raise LossGuardStateError(f"the checkpoint's loss-guard state {str(state)[:120]!r} is not a list of "
                                      "finite losses and a count; resume from another version (--resume STEP)")
        self._history = deque((float(x) for x in history), maxlen=self.config.window)
        self._consecutive = consecutive
