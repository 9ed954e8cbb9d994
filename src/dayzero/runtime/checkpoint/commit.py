"""The commit protocol of one save, after every rank has written its DCP shards into
``<name>.partial``::

    every rank: write its own JSON files, describe (size, checksum) the files it wrote
    rank 0:     gather the descriptions, write the optimizer's small state and manifest.json,
                verify the partial directory, rename it to <name> (COMPLETE marker), retention

Checksums come from the writer's running hash when it wrote the file, so the manifest costs no
second read of the shards.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch

from dayzero.runtime.checkpoint.dcp_io import METADATA_FILE, HookedWriter, load_metadata, referenced_files
from dayzero.runtime.checkpoint.lineage import RunLineage
from dayzero.runtime.checkpoint.manifest import (
    MANIFEST,
    CheckpointError,
    CheckpointManifest,
    FileEntry,
    ModelInfo,
    check_file,
    dayzero_version,
    describe_file,
    utc_now,
    write_json_durable,
)
from dayzero.runtime.checkpoint.version_files import OPTIM_GROUPS
from dayzero.runtime.checkpoint.versions import backup, commit, next_seq, retire, scan


def own_entries(partial: Path, own: dict[str, str], groups: dict | None, rank: int, writer: HookedWriter,
                checksum: str) -> Any:
    """Every rank's part: write its own JSON files, then describe the files it wrote (its DCP
    shards, those files, and on rank 0 DCP's index). A failure comes back as one line."""
    try:
        for name, text in own.items():
            write_json_durable(partial / name, text)
        mine = sorted(f for f in os.listdir(partial) if f.startswith(f"__{rank}_"))
        mine += sorted(own) + ([METADATA_FILE] if rank == 0 else [])
        return ([_describe(writer, partial, f, checksum).model_dump() for f in mine], groups)
    except OSError as e:
        return f"rank {rank}: {e}"


def _describe(writer: HookedWriter, partial: Path, name: str, checksum: str) -> FileEntry:
    """Size and checksum of one file: from the writer's running hash when it wrote the file
    (and the size on disk agrees), else by reading it."""
    seen = writer.digests.pop(str(partial / name), None)
    if seen is not None and (partial / name).stat().st_size == seen[0]:
        return FileEntry(path=name, bytes=seen[0], checksum=seen[1])
    return describe_file(partial, name, checksum)


def write_and_commit(root: Path, step: int, partial: Path, contents: list[str], gathered: list, *,
                     model: ModelInfo, layout: dict, world: int, lineage: RunLineage, keep: int,
                     prune_other_lineages: bool, checksum: str, backup_existing: bool) -> tuple:
    """Rank 0's part, given every rank's :func:`own_entries`: ``("ok", final path, bytes,
    [(deleted version, its lineage)], backup path or None)``; raises CheckpointError."""
    errors = [g for g in gathered if isinstance(g, str)]
    if errors:
        raise CheckpointError("; ".join(errors))
    files = [FileEntry(**e) for g, _ in gathered for e in g]
    if gathered[0][1] is not None:  # one file for all ranks' optimizer hyperparameters
        merged: dict = {}
        for _, groups in gathered:
            merged.update(groups)  # replicas (dp, tp) hold identical values for a name
        write_json_durable(partial / OPTIM_GROUPS, json.dumps(merged, sort_keys=True))
        files.append(describe_file(partial, OPTIM_GROUPS, checksum))
    files.sort(key=lambda f: f.path)
    seq = next_seq(root, scan(root))
    manifest = CheckpointManifest(step=step, created=utc_now(), dayzero_version=dayzero_version(),
                                  torch_version=torch.__version__, model=model, layout=layout, world=world,
                                  contents=contents, files=files, lineage=lineage.id, seq=seq, parent=lineage.parent,
                                  fork=lineage.fork)
    write_json_durable(partial / MANIFEST, manifest.to_json())
    # Verify before commit: every listed file is there at its size, and DCP's index names no
    # file outside the manifest (hashes were just taken from the files on disk).
    problems = [p for f in files if (p := check_file(partial, f, checksum=False))]
    names = {f.path for f in files}
    missing = referenced_files(load_metadata(partial, names)) - names
    if problems or missing:
        raise CheckpointError("; ".join(problems + [f"{m}: referenced but not written" for m in missing]))
    occupant = partial.with_name(partial.name[:-len(".partial")])
    moved = str(backup(occupant)) if backup_existing and occupant.exists() else None
    final = commit(partial, step)
    lineage.saved(final.name, seq, step)
    deleted = [(v.name, v.record.lineage) for v in retire(root, keep, lineage.id, prune_other=prune_other_lineages,
                                                         protect=final.name)]
    return ("ok", str(final), manifest.total_bytes, deleted, moved)
