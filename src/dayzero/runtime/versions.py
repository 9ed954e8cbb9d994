"""Checkpoint versions on disk: naming, atomic commit, retention, and picking one to resume.

A checkpoint root holds one directory per saved step::

    ckpt/
        step-00000005/            complete: has the COMPLETE marker
        step-00000010/            complete
        step-00000015.partial/    being written (or abandoned by a crash): never touched by retention

A save writes everything into ``step-N.partial``, verifies it, renames it to ``step-N`` and then
writes the ``COMPLETE`` marker (see :func:`commit`). A crash at any point leaves either a
``.partial`` directory or a final directory without a marker; neither is ever resumed from.

Torch-free, like :mod:`dayzero.runtime.manifest`.
"""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Literal

from dayzero.runtime.manifest import MARKER, CheckpointError, Verdict, fsync_dir, write_marker

_NAME = re.compile(r"^step-(\d{8,})(\.partial|\.replaced|\.deleting)?$")
State = Literal["complete", "incomplete", "partial", "replaced", "deleting"]


def version_name(step: int) -> str:
    return f"step-{step:08d}"


def partial_name(step: int) -> str:
    return version_name(step) + ".partial"


@dataclass(frozen=True)
class Version:
    """One directory under a checkpoint root. ``complete`` means the marker exists (checked
    cheaply here; :func:`dayzero.runtime.manifest.verify_version` checks the contents)."""

    path: Path
    step: int
    state: State

    @property
    def name(self) -> str:
        return self.path.name


def scan(root: Path) -> list[Version]:
    """All versions under ``root``, oldest step first; unrelated entries are ignored."""
    root = Path(root)
    if not root.is_dir():
        return []
    out = []
    for p in root.iterdir():
        m = _NAME.match(p.name)
        if not m or not p.is_dir() or p.is_symlink():
            continue
        suffix = m.group(2)
        if suffix == ".partial":
            state: State = "partial"
        elif suffix in (".replaced", ".deleting"):
            state = suffix[1:]  # type: ignore[assignment]
        else:
            state = "complete" if (p / MARKER).is_file() else "incomplete"
        out.append(Version(p, int(m.group(1)), state))
    order = {"complete": 0, "incomplete": 1, "partial": 2, "replaced": 3, "deleting": 4}
    return sorted(out, key=lambda v: (v.step, -order[v.state]))


def prepare_partial(root: Path, step: int) -> Path:
    """Create an empty ``step-N.partial``; a stale one of the same step (left by a crashed
    attempt, since this process is now the writer of step N) is removed first."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    partial = root / partial_name(step)
    if partial.exists():
        shutil.rmtree(partial)
    partial.mkdir()
    return partial


def commit(partial: Path, step: int) -> Path:
    """Rename the verified ``partial`` to ``step-N`` and write the marker; returns the final path.

    An existing ``step-N`` (an older trajectory's, or a corrupt one that resume skipped) is moved
    to ``step-N.replaced`` first and deleted after the new one is committed.
    """
    partial = Path(partial)
    root = partial.parent
    final = root / version_name(step)
    old = None
    if final.exists():
        old = root / (final.name + ".replaced")
        if old.exists():
            shutil.rmtree(old)
        final.rename(old)
    partial.rename(final)
    fsync_dir(root)
    write_marker(final)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    return final


def retention(versions: list[Version], keep: int) -> list[Version]:
    """Complete versions to delete so that the newest ``keep`` complete ones remain.

    Never returns the newest complete version, and never an incomplete or partial one (it may be
    a save in flight, or evidence of a crash worth looking at).
    """
    if keep < 1:
        raise CheckpointError(f"--keep {keep}: at least 1 checkpoint must be kept")
    complete = sorted((v for v in versions if v.state == "complete"), key=lambda v: v.step, reverse=True)
    return complete[keep:]


def retire(root: Path, keep: int) -> list[Version]:
    """Apply retention quickly: each doomed version loses its marker (so a deletion cut short can
    never look complete) and is renamed ``step-N.deleting``; :func:`purge` deletes the files."""
    doomed = retention(scan(root), keep)
    for v in doomed:
        (v.path / MARKER).unlink(missing_ok=True)
        target = v.path.with_name(v.name + ".deleting")
        if target.exists():
            shutil.rmtree(target, ignore_errors=True)
        v.path.rename(target)
    return doomed


def purge(root: Path) -> None:
    """Delete every ``step-N.deleting`` directory (retired versions, also those a crash left)."""
    for v in scan(root):
        if v.state == "deleting":
            shutil.rmtree(v.path, ignore_errors=True)


def apply_retention(root: Path, keep: int) -> list[Version]:
    doomed = retire(root, keep)
    purge(root)
    return doomed


def select_newest(versions: list[Version], verify: Callable[[Version], Verdict]
                  ) -> tuple[Verdict | None, list[Verdict]]:
    """Newest version that verifies, and every newer one that was skipped (with reasons).

    ``verify`` is called only on complete versions, newest first, until one passes.
    """
    skipped: list[Verdict] = []
    for v in sorted(versions, key=lambda v: (v.step, v.state == "complete"), reverse=True):
        if v.state in ("replaced", "deleting"):
            continue
        if v.state != "complete":
            why = ("partial: its save was interrupted or is still running" if v.state == "partial"
                   else f"incomplete: no {MARKER} marker (crash during commit)")
            skipped.append(Verdict(v.path, None, (why,)))
            continue
        verdict = verify(v)
        if verdict.ok:
            return verdict, skipped
        skipped.append(verdict)
    return None, skipped
