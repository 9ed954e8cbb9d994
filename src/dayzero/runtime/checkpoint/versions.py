"""Checkpoint versions on disk: naming, atomic commit, retention, and picking one to resume.

A checkpoint root holds one directory per saved version::

    ckpt/
        .lock                     advisory lock of the job writing here (dayzero.runtime.checkpoint.dirlock)
        step-00000005/            complete: has the COMPLETE marker
        step-00000010/            complete
        step-00000010-v2/         step 10 again, written by another lineage (a branch)
        step-00000015.partial/    being written (or abandoned by a crash): never touched by retention
        step-00000008.backup-20250101T120000Z/   moved aside by ``ckpt import --force``: not a version

A save writes everything into ``<name>.partial``, verifies it, renames it to ``<name>`` and then
writes the ``COMPLETE`` marker (see :func:`commit`). A crash at any point leaves either a
``.partial`` directory or a final directory without a marker; neither is ever resumed from.
Which versions to keep and which to resume is decided by lineage (:mod:`dayzero.runtime.checkpoint.lineage`).

Torch-free, like :mod:`dayzero.runtime.checkpoint.manifest`.
"""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Literal

from dayzero.runtime.checkpoint.lineage import Record, resume_order, retention
from dayzero.runtime.checkpoint.manifest import (
    MARKER,
    CheckpointError,
    Verdict,
    fsync_dir,
    read_manifest,
    utc_now,
    write_json_durable,
    write_marker,
)

_NAME = re.compile(r"^step-(\d{8,})(?:-v(\d+))?(\.partial|\.replaced|\.deleting)?$")
State = Literal["complete", "incomplete", "partial", "replaced", "deleting"]


def version_name(step: int, copy: int = 1) -> str:
    """``step-N`` for the first version of step N in a root, ``step-N-vK`` for the K-th."""
    return f"step-{step:08d}" + (f"-v{copy}" if copy > 1 else "")


def partial_name(step: int, copy: int = 1) -> str:
    return version_name(step, copy) + ".partial"


@dataclass(frozen=True)
class Version:
    """One directory under a checkpoint root. ``complete`` means the marker exists (checked
    cheaply here; :func:`dayzero.runtime.checkpoint.manifest.verify_version` checks the contents).
    ``record`` holds the manifest's lineage fields (None: no readable manifest)."""

    path: Path
    step: int
    state: State
    copy: int = 1
    record: Record | None = None

    @property
    def name(self) -> str:
        return self.path.name


def scan(root: Path, records: bool = True) -> list[Version]:
    """All versions under ``root``, oldest step first; unrelated entries are ignored. With
    ``records`` the lineage fields of complete and incomplete versions are read."""
    root = Path(root)
    if not root.is_dir():
        return []
    out = []
    for p in root.iterdir():
        m = _NAME.match(p.name)
        if not m or not p.is_dir() or p.is_symlink():
            continue
        suffix = m.group(3)
        if suffix == ".partial":
            state: State = "partial"
        elif suffix in (".replaced", ".deleting"):
            state = suffix[1:]  # type: ignore[assignment]
        else:
            state = "complete" if (p / MARKER).is_file() else "incomplete"
        record = read_record(p) if records and state in ("complete", "incomplete") else None
        out.append(Version(p, int(m.group(1)), state, int(m.group(2) or 1), record))
    order = {"complete": 0, "incomplete": 1, "partial": 2, "replaced": 3, "deleting": 4}
    return sorted(out, key=lambda v: (v.step, v.copy, -order[v.state]))


def read_record(version_dir: Path) -> Record | None:
    """The lineage fields of a version's manifest; None when it has no readable manifest."""
    try:
        return Record.of(read_manifest(version_dir))
    except CheckpointError:
        return None


SEQUENCE = ".sequence"  # the last write sequence number given out in this root


def next_seq(root: Path, versions: list[Version]) -> int:
    """The next write sequence number of ``root``: one more than any manifest's and than the
    counter's, so numbers never repeat even after versions are deleted. Call under the lock."""
    try:
        from dayzero.inputs import read_text

        last = int(read_text(Path(root) / SEQUENCE, limit=64))
    except (OSError, ValueError):
        last = 0
    seq = max([last] + [v.record.seq for v in versions if v.record is not None]) + 1
    write_json_durable(Path(root) / SEQUENCE, f"{seq}\n")
    return seq


def prepare_partial(root: Path, step: int, copy: int = 1) -> Path:
    """Create an empty ``<name>.partial``; a stale one of the same name (left by a crashed
    attempt, since this process is now the writer of that version) is removed first."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    partial = root / partial_name(step, copy)
    if partial.exists():
        shutil.rmtree(partial)
    partial.mkdir()
    return partial


def commit(partial: Path, step: int | None = None) -> Path:
    """Rename the verified ``partial`` to its final name and write the marker; returns the final
    path (``step`` is implied by the partial's name, and checked when given).

    An existing version of that name is replaced only when it belongs to the same lineage (a
    corrupt one that resume skipped): it is moved to ``<name>.replaced`` first and deleted after
    the new one is committed. A version of another lineage, or one whose lineage cannot be read,
    is never replaced (CheckpointError): callers pick a free name (:func:`lineage.target_copy`).
    """
    partial = Path(partial)
    root = partial.parent
    m = _NAME.match(partial.name)
    if m is None or m.group(3) != ".partial" or (step is not None and int(m.group(1)) != step):
        raise CheckpointError(f"{partial}: not the partial directory of step {step}")
    final = root / partial.name[:-len(".partial")]
    old = None
    if final.exists():
        mine, theirs = read_record(partial), read_record(final)
        if mine is None or theirs is None or mine.lineage != theirs.lineage:
            raise CheckpointError(f"{final} exists and belongs to lineage "
                                  f"{theirs.lineage if theirs else '(unreadable)'}; refusing to replace it")
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


def backup(version: Path) -> Path:
    """Move a version aside to ``<name>.backup-<UTC time>`` (no longer a version: never resumed
    from automatically, never deleted); returns the new path."""
    version = Path(version)
    stamp = utc_now().replace(":", "").replace("-", "")
    target = version.with_name(f"{version.name}.backup-{stamp}")
    n = 1
    while target.exists():
        n += 1
        target = version.with_name(f"{version.name}.backup-{stamp}-{n}")
    version.rename(target)
    fsync_dir(version.parent)
    return target


def retire(root: Path, keep: int, lineage: str | None = None, *, prune_other: bool = False,
           protect: str | None = None) -> list[Version]:
    """Apply :func:`lineage.retention` quickly: each doomed version loses its marker (so a deletion
    cut short can never look complete) and is renamed ``<name>.deleting``; :func:`purge` deletes
    the files."""
    doomed = retention(scan(root), keep, lineage, prune_other=prune_other, protect=protect)
    for v in doomed:
        (v.path / MARKER).unlink(missing_ok=True)
        target = v.path.with_name(v.name + ".deleting")
        if target.exists():
            shutil.rmtree(target, ignore_errors=True)
        v.path.rename(target)
    return doomed


def purge(root: Path) -> None:
    """Delete every ``step-N.deleting`` directory (retired versions, also those a crash left)."""
    for v in scan(root, records=False):
        if v.state == "deleting":
            shutil.rmtree(v.path, ignore_errors=True)


def _tree_bytes(path: Path) -> int:
    total = 0
    for dirpath, _, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(dirpath, f)).st_size
            except OSError:
                pass
    return total


def collect_abandoned(root: Path) -> list[tuple[Path, int]]:
    """Delete every ``.partial`` (a save a crash cut short) and ``.deleting`` (a retired version
    whose deletion was cut short) directory under ``root``; (path, bytes freed) of each removed.

    Call only while holding ``root``'s directory lock and before this job's first save: then no
    writer can still own them (a save writes under the lock, and every process of an earlier
    attempt has exited before the next one starts)."""
    out = []
    for v in scan(root, records=False):
        if v.state in ("partial", "deleting"):
            size = _tree_bytes(v.path)
            shutil.rmtree(v.path, ignore_errors=True)
            if not v.path.exists():
                out.append((v.path, size))
    return out


def apply_retention(root: Path, keep: int) -> list[Version]:
    doomed = retire(root, keep)
    purge(root)
    return doomed


def select_newest(versions: list[Version], verify: Callable[[Version], Verdict]
                  ) -> tuple[Verdict | None, list[Verdict]]:
    """First version in :func:`lineage.resume_order` that verifies, and every one before it that
    was skipped (with reasons). ``verify`` is called only on complete versions, until one passes.
    """
    return select_first(resume_order(versions), verify)


def select_first(ordered: list[Version], verify: Callable[[Version], Verdict]
                 ) -> tuple[Verdict | None, list[Verdict]]:
    """First of ``ordered`` that verifies, and every one before it that was skipped."""
    skipped: list[Verdict] = []
    for v in ordered:
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
