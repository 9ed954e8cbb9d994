"""The exclusion list file: device slots (and their hosts) a failing-rank alert took out of a run.

``exclusions.json`` in a run's checkpoint directory, written by the trainer's alert actions
(:mod:`dayzero.runtime.resilience.actions`), honoured by the local relaunch
(:mod:`dayzero.runtime.resilience.exclusion`) and by the scheduler exports (``dayzero export
--to slurm|kubernetes --exclude-from``). One entry per (host, device slot), merged across
restarts, so a slot flagged once stays out of every later attempt. Pure: no torch.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterable

from dayzero.errors import DayzeroError
from dayzero.inputs import load_json

FILE = "exclusions.json"
FORMAT = "dayzero-exclusions/1"


class ExclusionError(DayzeroError):
    """The exclusion list cannot be read, or no layout fits the ranks that remain."""


@dataclass(frozen=True)
class Exclusion:
    rank: int  # the global rank in the attempt that flagged it
    slot: int  # the local device slot it ran on
    host: str
    reason: str  # the alert's name
    step: int | None  # the step at which it was flagged (None: a rank that failed, step unknown)
    time: str  # UTC, ISO 8601
    message: str = ""


def exclusion_path(ckpt_dir: str | Path) -> Path:
    return Path(ckpt_dir) / FILE


def read_exclusions(path: str | Path) -> tuple[Exclusion, ...]:
    """The entries of an exclusion file (none when it does not exist)."""
    p = Path(path)
    if not p.exists():
        return ()
    try:
        doc = load_json(p, "a dayzero exclusion list (JSON)")
        if doc.get("format") != FORMAT:
            raise ValueError(f"format {doc.get('format')!r}, expected {FORMAT!r}")
        return tuple(Exclusion(**e) for e in doc["excluded"])
    except (ValueError, TypeError, KeyError, AttributeError) as e:
        raise ExclusionError(f"{p}: not a dayzero exclusion list ({e}); fix or delete it") from None


def merge(old: Iterable[Exclusion], new: Iterable[Exclusion]) -> tuple[Exclusion, ...]:
    """``old`` then the entries of ``new`` whose (host, slot) is not excluded yet, in order."""
    out, seen = [], set()
    for e in [*old, *new]:
        if (e.host, e.slot) not in seen:
            seen.add((e.host, e.slot))
            out.append(e)
    return tuple(out)


def add_exclusions(path: str | Path, new: Iterable[Exclusion]) -> tuple[Exclusion, ...]:
    """Merge ``new`` into the file (written whole, then renamed into place) and return all entries."""
    p = Path(path)
    entries = merge(read_exclusions(p), new)
    tmp = p.with_suffix(".json.tmp")
    tmp.write_text(json.dumps({"format": FORMAT, "excluded": [asdict(e) for e in entries]}, indent=1) + "\n")
    os.replace(tmp, p)
    return entries


def excluded_slots(entries: Iterable[Exclusion], host: str) -> frozenset[int]:
    return frozenset(e.slot for e in entries if e.host == host)


def excluded_hosts(entries: Iterable[Exclusion]) -> list[str]:
    """The hosts with at least one excluded slot, sorted: a scheduler keeps whole nodes off."""
    return sorted({e.host for e in entries})
