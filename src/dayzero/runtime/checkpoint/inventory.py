"""What a checkpoint directory holds, and whether it is whole: the Python API of ``dayzero ckpt
list`` and ``dayzero ckpt verify`` (a root with version directories, or one version)."""

from __future__ import annotations

from pathlib import Path


def _versions_of(path: Path):
    """A checkpoint root (all versions) or one version directory."""
    from dayzero.runtime.checkpoint.manifest import CheckpointError
    from dayzero.runtime.checkpoint.versions import Version, scan

    if not path.exists():
        raise CheckpointError(f"{path}: no such checkpoint directory")
    versions = scan(path)
    if versions:
        return versions
    if (path / "manifest.json").exists() or (path / "COMPLETE").exists():
        return [Version(path, -1, "complete" if (path / "COMPLETE").exists() else "incomplete")]
    raise CheckpointError(f"{path}: holds no checkpoint versions (step-NNNNNNNN directories)")


def list_checkpoints(root: Path) -> list[dict]:
    """Python API of ``dayzero ckpt list``: one dict per version, oldest first by write order
    (no hashing)."""
    from dayzero.runtime.checkpoint.lineage import write_order
    from dayzero.runtime.checkpoint.manifest import CheckpointError, read_manifest

    rows = []
    for v in sorted(_versions_of(Path(root)), key=write_order):
        row = {"path": str(v.path), "step": v.step, "state": v.state, "bytes": None, "created": None,
               "world": None, "layout": None, "model": None, "files": None, "lineage": None, "seq": None,
               "parent": None}
        try:
            m = read_manifest(v.path)
            row.update(step=m.step, bytes=m.total_bytes, created=m.created, world=m.world, layout=m.layout,
                       model=m.model.model_dump(), files=len(m.files), contents=m.contents, lineage=m.lineage,
                       seq=m.seq, parent=m.parent.name if m.parent else None)
        except CheckpointError as e:
            row["problem"] = str(e)
        rows.append(row)
    return rows


NOT_VERSIONS = {
    "partial": "a save in progress or cut short: never resumed; removed at the next start or by dayzero ckpt gc",
    "deleting": "a retired version being deleted: never resumed; removed at the next start or by dayzero ckpt gc",
    "replaced": "moved aside by ckpt import --force: not a version",
}


def collect_garbage(root: Path) -> list[dict]:
    """Python API of ``dayzero ckpt gc``: take ``root``'s lock (refused while another job holds it)
    and remove the abandoned ``.partial`` and ``.deleting`` directories; one dict per removal."""
    from dayzero.runtime.checkpoint.dirlock import DirLock
    from dayzero.runtime.checkpoint.manifest import CheckpointError
    from dayzero.runtime.checkpoint.versions import collect_abandoned

    root = Path(root)
    if not root.is_dir():
        raise CheckpointError(f"{root}: no such checkpoint directory")
    with DirLock(root) as lock:
        if not lock.owned:
            raise CheckpointError(f"{root} is in use by this job's launcher; run dayzero ckpt gc after it exits (its "
                                  "next start removes them too)")
        return [{"path": str(p), "bytes": n} for p, n in collect_abandoned(root)]


def verify_checkpoints(path: Path, checksums: bool = True) -> list[dict]:
    """Python API of ``dayzero ckpt verify``: marker, manifest, sizes and the checksum of every file."""
    from dayzero.runtime.checkpoint.manifest import verify_version

    out = []
    for v in _versions_of(Path(path)):
        if v.state in ("partial", "deleting", "replaced"):  # not versions: nothing resumes from them
            out.append({"path": str(v.path), "step": v.step, "ok": True, "problems": [],
                        "skipped": NOT_VERSIONS[v.state]})
            continue
        verdict = verify_version(v.path, checksums=checksums)
        if verdict.ok and checksums:
            verdict = _deep_check(verdict)
        out.append({"path": str(v.path), "step": verdict.manifest.step if verdict.manifest else v.step,
                    "ok": verdict.ok, "problems": list(verdict.problems)})
    return out


def _deep_check(verdict):
    """Also open the DCP index with the restricted unpickler (needs torch)."""
    from dataclasses import replace

    from dayzero.runtime.checkpoint.manifest import CheckpointError

    try:
        from dayzero.runtime.checkpoint.dcp_io import load_metadata
    except ImportError:  # torch not installed: the file-level checks above still stand
        return verdict
    try:
        load_metadata(verdict.path, {f.path for f in verdict.manifest.files})
    except CheckpointError as e:
        return replace(verdict, problems=(str(e),))
    return verdict
