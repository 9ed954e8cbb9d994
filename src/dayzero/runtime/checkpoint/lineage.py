"""Checkpoint lineage: which run wrote each version, in which order, and what it descends from.

Step numbers do not order a checkpoint directory: a run resumed from step 2 of a directory that
holds steps 2, 4, 6 and 8 writes a step 3 that is *newer* than step 8, on another trajectory.
So every manifest records (:class:`dayzero.runtime.checkpoint.manifest.CheckpointManifest`):

- ``lineage``: the id of the run it belongs to. A run that resumes the newest version of a
  lineage continues that lineage (a restart, or the next job of the same run); a run that
  resumes an older one, while newer versions of its lineage exist, starts a new lineage (a
  branch); a fresh start or an import starts a new lineage with no fork.
- ``seq``: the directory's write sequence number, one more than any before (write order).
- ``parent``: the version the run resumed from, or the run's previous save.
- ``fork``: the version its lineage branched from (the same in every version of the lineage, so
  it survives retention of the lineage's first versions).

Manifests written before lineage existed read as lineage ``legacy``, seq 0, ordered by step
among themselves and before everything written since; a run that continues the newest of them
continues lineage ``legacy``.

The rules here are pure functions over :class:`dayzero.runtime.checkpoint.versions.Version` lists, plus
:class:`RunLineage`, one run's place in them (torch-free, no I/O); :mod:`dayzero.runtime.checkpoint.versions`
reads the records from disk and :class:`dayzero.runtime.checkpoint.checkpointer.Checkpointer` applies the rules.

Worked example (``--keep 3``)::

    run A: step 2,4,6,8             lineage A, seq 1..4
    --resume 2 --steps 4            step 2 is not A's newest: lineage B forks from A@2
        saves step 3                 step-00000003, lineage B, seq 5
        saves step 4                 step-00000004 is A's: B's goes to step-00000004-v2, seq 6
    retention after each save       keeps B's newest 3; never touches A (unless told)
    --resume auto                   newest by write order: B's step 4 (step-00000004-v2)
"""

from __future__ import annotations

import math
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Iterable

from dayzero.runtime.checkpoint.manifest import LEGACY, CheckpointError, CheckpointManifest, VersionRef

if TYPE_CHECKING:
    from dayzero.runtime.checkpoint.versions import Version

__all__ = ["LEGACY", "Record", "RunLineage", "new_lineage_id", "write_order", "history", "resume_order",
           "newer_in_lineage", "retention", "ref", "target_copy"]


@dataclass(frozen=True)
class Record:
    """The lineage fields of one version's manifest."""

    lineage: str
    seq: int
    step: int
    fork: VersionRef | None = None

    @classmethod
    def of(cls, m: CheckpointManifest) -> "Record":
        return cls(m.lineage, m.seq, m.step, m.fork)


def new_lineage_id() -> str:
    return uuid.uuid4().hex[:12]


@dataclass
class RunLineage:
    """Where one run's saves go: its lineage id, the fork point, the parent of its next save, and
    the version it resumed from. Settled by the run's first resume (:meth:`adopt`) or save."""

    id: str  # a fresh id until a resume continues an existing lineage
    fork: VersionRef | None = None
    parent: VersionRef | None = None
    origin: Path | None = None
    settled: bool = False

    def adopt(self, versions: Iterable["Version"], resumed: "Version | None", at: VersionRef, origin: Path,
              bad: set = frozenset()) -> list["Version"]:
        """After the first resume (of ``resumed``, referenced as ``at``; None when it lies outside
        the root): continue its lineage when nothing newer of it exists apart from ``bad`` ones,
        else keep the fresh id, forking at ``at``. Returns those newer versions (empty: continued)."""
        self.settled, self.origin, self.parent, self.fork = True, origin, at, at
        newer = newer_in_lineage(versions, resumed, bad) if resumed is not None else []
        if resumed is not None and not newer:
            self.id, self.fork = resumed.record.lineage, resumed.record.fork
        return newer

    def saved(self, name: str, seq: int, step: int) -> VersionRef:
        """Record a committed save: the parent of the next one."""
        self.parent = VersionRef(name=name, lineage=self.id, seq=seq, step=step)
        return self.parent


def write_order(v: "Version") -> tuple[float, int, int]:
    """Sort key, oldest first: write sequence number, then step and copy (legacy versions all have
    seq 0). A version without a readable manifest (a save cut short) counts as the newest: it is
    reported first when resuming, and never deleted."""
    return (math.inf if v.record is None else v.record.seq, v.step, v.copy)


def ref(v: "Version") -> VersionRef:
    assert v.record is not None
    return VersionRef(name=v.name, lineage=v.record.lineage, seq=v.record.seq, step=v.step)


def history(versions: Iterable["Version"], lineage: str, fork: VersionRef | None = None) -> list["Version"]:
    """The versions a run of ``lineage`` descends from, newest first: the lineage's own, then those
    of the lineage it forked from, up to the fork point, and so on. ``fork`` stands in when the
    lineage has no version yet (a branch that has not saved)."""
    versions = [v for v in versions if v.record is not None and v.state in ("complete", "incomplete")]
    out: list[Version] = []
    bound: tuple = (math.inf,)
    seen: set[str] = set()
    while lineage not in seen:
        seen.add(lineage)
        mine = sorted((v for v in versions if v.record.lineage == lineage and write_order(v) <= bound),
                      key=write_order, reverse=True)
        out += mine
        fork = next((v.record.fork for v in mine if v.record.fork is not None), fork)
        if fork is None:
            break
        lineage, bound, fork = fork.lineage, (fork.seq, fork.step, math.inf), None
    return out


def resume_order(versions: Iterable["Version"]) -> list["Version"]:
    """The order ``--resume auto`` tries versions in: versions without a readable manifest first
    (to report them), then the history of the most recently written version (the lineage the last
    job was on, falling back along it when its newest versions are corrupt), then every other
    version by write order, newest first (so a directory with a good version is never refused)."""
    live = sorted((v for v in versions if v.state not in ("replaced", "deleting")), key=write_order, reverse=True)
    head = next((v for v in live if v.record is not None), None)
    first = [v for v in live if v.record is None]
    hist = history(live, head.record.lineage) if head is not None else []
    chosen = {v.path for v in first + hist}
    return first + hist + [v for v in live if v.path not in chosen]


def newer_in_lineage(versions: Iterable["Version"], v: "Version", bad: set = frozenset()) -> list["Version"]:
    """Versions of ``v``'s lineage written after it (complete or incomplete, not in ``bad``): a run
    resuming ``v`` continues its lineage only when there are none."""
    if v.record is None:
        return []
    return sorted((w for w in versions if w.record is not None and w.record.lineage == v.record.lineage
                   and w.state in ("complete", "incomplete") and write_order(w) > write_order(v)
                   and w.path not in bad), key=write_order)


def retention(versions: Iterable["Version"], keep: int, lineage: str | None = None, *,
              prune_other: bool = False, protect: str | None = None) -> list["Version"]:
    """Complete versions to delete, newest first: those of ``lineage`` beyond its newest ``keep``
    by write order, and, only with ``prune_other``, every complete version of another lineage.

    ``lineage`` defaults to that of the most recently written complete version. Never returns the
    version named ``protect`` (the one just written), one without a readable manifest, or one that
    is not complete (a save in flight, or evidence of a crash)."""
    if keep < 1:
        raise CheckpointError(f"--keep {keep}: at least 1 checkpoint must be kept")
    complete = sorted((v for v in versions if v.state == "complete" and v.record is not None),
                      key=write_order, reverse=True)
    if lineage is None:
        if not complete:
            return []
        lineage = complete[0].record.lineage
    mine = [v for v in complete if v.record.lineage == lineage]
    doomed = {v.path for v in mine[keep:]}
    if prune_other:
        doomed |= {v.path for v in complete if v.record.lineage != lineage}
    return [v for v in complete if v.path in doomed and v.name != protect]


def target_copy(versions: Iterable["Version"], step: int, lineage: str) -> int:
    """Which copy of ``step`` a save of ``lineage`` writes (1: ``step-N``, k: ``step-N-vk``).

    A version of the same step and lineage (one that resume found corrupt and skipped) is
    replaced; a version of another lineage never is: the save takes the next free copy."""
    same = [v for v in versions if v.step == step and v.state in ("complete", "incomplete")]
    own = [v for v in same if v.record is not None and v.record.lineage == lineage]
    if own:
        return max(own, key=write_order).copy
    taken = {v.copy for v in same}
    copy = 1
    while copy in taken:
        copy += 1
    return copy
