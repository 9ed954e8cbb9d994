"""The small JSON side files of a checkpoint version, read and checked before a value is used.

A version's checksums prove that its bytes are the ones its writer committed, not that the writer
wrote sensible values: a hand-edited file whose manifest was updated, a file from another tool or
a bug in an older release passes them. So every value read from ``train_state.json``,
``optimizer_groups.json`` and ``rng-*.json`` is checked here against what this run expects (its
type, its range, the manifest's own step and contents), and anything else is a
:class:`CheckpointError` naming the file and the field: one line, exit 2, never a traceback
from deep inside PyTorch and never a run that silently continues from a wrong step.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from dayzero.errors import ConfigError
from dayzero.inputs import read_text
from dayzero.runtime.checkpoint.json_state import from_json, restore_rng
from dayzero.runtime.checkpoint.manifest import CheckpointError, CheckpointManifest, safe_join

_HINT = "the file was edited or written by another tool; resume from another version (--resume STEP)"


def read_json_file(version: Path, rel: str, *, decode: bool = True) -> Any:
    """``rel`` of ``version`` parsed as JSON (UTF-8); ``decode``: its tagged tuples and tensors rebuilt."""
    p = safe_join(version, rel)
    try:
        if not p.exists() and not p.is_symlink():
            raise FileNotFoundError(p)
        raw = json.loads(read_text(p))
        return from_json(raw) if decode else raw
    except ConfigError as e:
        raise CheckpointError(f"{e}; {_HINT}") from None
    except FileNotFoundError:
        raise CheckpointError(f"{p}: missing; the checkpoint is incomplete, resume from another version") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise CheckpointError(f"{p}: unreadable ({type(e).__name__}: {e}); {_HINT}") from None


def _bad(p: Path, field: str, why: str) -> CheckpointError:
    return CheckpointError(f"{p}: {field} {why}; {_HINT}")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_real(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


@dataclass(frozen=True)
class TrainState:
    """``train_state.json``: the step, the data position, the loop's extras, the LR scheduler."""

    step: int
    data: Any
    extra: dict
    scheduler: dict | None


def read_train_state(version: Path, manifest: CheckpointManifest, rel: str) -> TrainState:
    """Read ``rel`` (``train_state.json``); its step must be the manifest's, and a scheduler the
    manifest lists in ``contents`` must be there. The data position may be absent (a checkpoint
    saved through the API without one, or imported weights): the training loop says so."""
    p = safe_join(version, rel)
    ts = read_json_file(version, rel)
    if not isinstance(ts, dict):
        raise _bad(p, "the file", f"is a {type(ts).__name__}, not an object")
    step = ts.get("step")
    if not _is_int(step):
        raise _bad(p, "'step'", f"is {step!r}, not an integer")
    if step != manifest.step:
        raise _bad(p, "'step'", f"is {step} but the manifest's step is {manifest.step}")
    extra = ts.get("extra")
    if extra is None:
        extra = {}
    elif not isinstance(extra, dict):
        raise _bad(p, "'extra'", f"is a {type(extra).__name__}, not an object")
    sched = ts.get("scheduler")
    if sched is not None and not isinstance(sched, dict):
        raise _bad(p, "'scheduler'", f"is a {type(sched).__name__}, not an object")
    if "scheduler" in manifest.contents and sched is None:
        raise _bad(p, "'scheduler'", "is missing although the manifest lists it in its contents")
    return TrainState(step, ts.get("data"), extra, sched)


def load_scheduler(scheduler, saved: dict, p: Path) -> None:
    """Load an LR-scheduler state: its learning rates finite and non-negative, its epoch an integer."""
    for key in ("base_lrs", "_last_lr"):
        v = saved.get(key)
        if v is not None and not (isinstance(v, list) and v and all(_is_real(x) and x >= 0 for x in v)):
            raise _bad(p, f"'scheduler.{key}'", f"is {v!r}, not a list of finite non-negative learning rates")
    if "last_epoch" in saved and not _is_int(saved["last_epoch"]):
        raise _bad(p, "'scheduler.last_epoch'", f"is {saved['last_epoch']!r}, not an integer")
    try:
        scheduler.load_state_dict(saved)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as e:
        raise _bad(p, "'scheduler'", f"does not fit this run's LR scheduler ({type(e).__name__}: {e})") from None


def check_optimizer_values(saved: dict, current: dict, p: Path) -> None:
    """Each optimizer setting read from JSON must have the kind of value this run's optimizer
    holds there (a flag a bool, a rate a finite number, ``betas`` a pair of numbers, a step count
    a scalar tensor), so a string where a bool belongs never switches AMSGrad on."""
    for k, v in saved.items():
        problem = _value_problem(v, current.get(k))
        if problem:
            raise _bad(p, f"'{k}'", problem)


def _value_problem(v: Any, want: Any) -> str | None:
    if want is None:
        return None if v is None or isinstance(v, (bool, str)) or _is_real(v) else f"is {v!r}"
    if isinstance(want, bool):
        return None if isinstance(v, bool) else f"is {v!r}, not true/false"
    if isinstance(want, (int, float)):
        return None if _is_real(v) else f"is {v!r}, not a finite number"
    if isinstance(want, str):
        return None if isinstance(v, str) else f"is {v!r}, not a string"
    if isinstance(want, (tuple, list)):
        if not isinstance(v, (tuple, list)) or len(v) != len(want):
            return f"is {v!r}, not a sequence of {len(want)}"
        return next((f"[{i}] {prob}" for i, (a, b) in enumerate(zip(v, want)) if (prob := _value_problem(a, b))),
                    None)
    if isinstance(want, torch.Tensor):
        if want.dim() == 0 and _is_real(v):  # a step count saved as a number
            return None
        if not isinstance(v, torch.Tensor):
            return f"is {v!r}, not a tensor"
        if tuple(v.shape) != tuple(want.shape):
            return f"has shape {tuple(v.shape)}, this optimizer holds {tuple(want.shape)}"
        if v.is_floating_point() and not bool(torch.isfinite(v).all()):
            return "is not finite"
        return None
    return None


def load_rng(version: Path, rel: str) -> None:
    """Restore the random streams saved in ``rel`` (``rng-<rank>.json``)."""
    p = safe_join(version, rel)
    saved = read_json_file(version, rel, decode=False)
    rng = saved.get("rng") if isinstance(saved, dict) else None
    if not isinstance(rng, dict):
        raise _bad(p, "'rng'", "is missing or not an object")
    try:
        restore_rng(rng)
    except (KeyError, TypeError, ValueError, RuntimeError, IndexError, OverflowError) as e:
        raise _bad(p, "'rng'", f"is not a random-generator state this run can restore ({type(e).__name__}: {e})"
                   ) from None

