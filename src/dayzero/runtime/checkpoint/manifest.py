"""Checkpoint manifests: what one checkpoint version holds, and whether it is intact.

One version is a directory (see :mod:`dayzero.runtime.checkpoint.versions` for naming)::

    step-00000010/
        manifest.json      this module's CheckpointManifest (JSON, never pickled)
        COMPLETE           commit marker, written last: {"manifest_sha256": ...}
        .metadata          DCP's index of tensor shards (read with a restricted unpickler)
        __0_0.distcp ...   tensor shards, one file per rank (DCP)
        train_state.json   step, data-stream position, LR scheduler, loop extras (rank 0)
        rng-00000.json ... RNG states, one file per rank

Every file except the manifest and the marker is listed in the manifest with its size and a
checksum, so a truncated or bit-flipped shard is found before anything is loaded. Paths in a
manifest are plain relative paths that must stay inside the version's directory.

Checksums are written as ``"<algorithm>:<hex>"``. The default is XXH3-128 (xxHash): 128 bits
catch any corruption a storage system produces, and at ~20 GB/s per core it costs a save almost
nothing, where SHA-256 (~1.7 GB/s per core with SHA-NI) competes with the write itself when every
core runs a rank (benchmarks/RESULTS_ckpt.md). SHA-256 stays available (``sha256``). Neither
stops an attacker who can rewrite a checkpoint and its manifest together; the restricted loaders
in :mod:`dayzero.runtime.checkpoint.dcp_io` are what keep such a checkpoint from running code. Manifests of
format 1 (a ``sha256`` field per file) are still read.

This module imports no torch: ``dayzero ckpt list|verify`` stay instant.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path, PurePosixPath
from typing import Any, Callable, Protocol

import xxhash
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from dayzero.errors import DayzeroError

FORMAT = "dayzero-checkpoint/2"
READABLE = ("dayzero-checkpoint/1", FORMAT)  # 1: per-file "sha256" instead of "checksum"
MANIFEST = "manifest.json"
MARKER = "COMPLETE"
_CHUNK = 8 << 20  # 8 MiB reads keep hashing near memory bandwidth without large buffers


class CheckpointError(DayzeroError):
    """A checkpoint is missing, corrupt, unsafe or does not match the run."""


def dayzero_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("dayzero")
    except PackageNotFoundError:
        return "unknown"


def utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


# -- paths -------------------------------------------------------------------------------------

def check_relpath(rel: str) -> str:
    """Return ``rel`` if it is a plain relative POSIX path with no way out of its directory.

    Rejects absolute paths, ``..`` and ``.`` components, empty components, backslashes (a
    Windows separator on another machine) and NUL bytes. Raises CheckpointError.
    """
    if not isinstance(rel, str) or not rel or "\x00" in rel or "\\" in rel:
        raise CheckpointError(f"unsafe path {rel!r} in checkpoint manifest: expected a plain relative path")
    p = PurePosixPath(rel)
    if p.is_absolute() or rel.startswith("/") or any(part in ("", ".", "..") for part in rel.split("/")):
        raise CheckpointError(f"unsafe path {rel!r} in checkpoint manifest: absolute paths and '..' may not "
                              "leave the checkpoint directory")
    return rel


def safe_join(root: Path, rel: str) -> Path:
    """``root / rel``, refusing paths that escape ``root`` lexically or through symlinks."""
    check_relpath(rel)
    base = Path(root).resolve()
    full = (base / rel).resolve()
    if full != base and base not in full.parents:
        raise CheckpointError(f"path {rel!r} in checkpoint manifest resolves to {full}, outside {base}; "
                              "a symlink points out of the checkpoint directory")
    return full


# -- checksums ---------------------------------------------------------------------------------

class Hasher(Protocol):
    def update(self, data: Any, /) -> None: ...
    def hexdigest(self) -> str: ...


# name -> (constructor, hex digits); both release the GIL on large buffers
CHECKSUMS: dict[str, tuple[Callable[[], Hasher], int]] = {
    "xxh3-128": (xxhash.xxh3_128, 32),
    "sha256": (hashlib.sha256, 64),
}
DEFAULT_CHECKSUM = "xxh3-128"
_CHECKSUM_RE = re.compile(r"^(?P<algo>[a-z0-9-]+):(?P<hex>[0-9a-f]+)$")


def check_algorithm(algo: str) -> str:
    if algo not in CHECKSUMS:
        raise CheckpointError(f"unknown checksum {algo!r}; choose one of: {', '.join(CHECKSUMS)}")
    return algo


def new_hasher(algo: str) -> Hasher:
    return CHECKSUMS[check_algorithm(algo)][0]()


def checksum_file(path: Path, algo: str = DEFAULT_CHECKSUM) -> str:
    """``"<algo>:<hex>"`` of one file, read in 8 MiB chunks."""
    h = new_hasher(algo)
    with open(path, "rb", buffering=0) as f:
        buf = bytearray(_CHUNK)
        view = memoryview(buf)
        while n := f.readinto(buf):
            h.update(view[:n])
    return f"{algo}:{h.hexdigest()}"


# -- the manifest ------------------------------------------------------------------------------

class FileEntry(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    path: str
    bytes: int = Field(ge=0)
    checksum: str  # "<algorithm>:<hex digest>", e.g. "xxh3-128:9f0c..."

    @model_validator(mode="before")
    @classmethod
    def _format1(cls, data: Any) -> Any:
        if isinstance(data, dict) and "sha256" in data and "checksum" not in data:
            data = {**data, "checksum": f"sha256:{data['sha256']}"}
            del data["sha256"]
        return data

    @field_validator("checksum")
    @classmethod
    def _checksum(cls, v: str) -> str:
        m = _CHECKSUM_RE.match(v)
        if m is None or m["algo"] not in CHECKSUMS or len(m["hex"]) != CHECKSUMS[m["algo"]][1]:
            raise ValueError(f"checksum {v!r} is not '<algorithm>:<hex>' with one of: {', '.join(CHECKSUMS)}")
        return v

    @property
    def algorithm(self) -> str:
        return self.checksum.split(":", 1)[0]

    @field_validator("path")
    @classmethod
    def _safe(cls, v: str) -> str:
        try:
            return check_relpath(v)
        except CheckpointError as e:
            raise ValueError(str(e)) from None


class ModelInfo(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = ""
    spec_digest: str = ""  # ModelSpec.digest(); "" when the model has no spec (e.g. a test module)
    # how to rebuild the ModelSpec: {"model": preset | config path, "layers"/"hidden"/...: proxy
    # sizes}; lets ``dayzero ckpt export`` write Hugging Face names and config.json
    recipe: dict[str, Any] = {}


LEGACY = "legacy"  # the lineage of versions whose manifest predates lineage fields


class VersionRef(BaseModel):
    """Names another version of the same checkpoint root: a parent, or a lineage's fork point."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str  # directory name under the checkpoint root (an absolute path for a version outside it)
    lineage: str
    seq: int = Field(ge=0)
    step: int = Field(ge=0)


class CheckpointManifest(BaseModel):
    """The JSON document at ``<version>/manifest.json``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    format: str = FORMAT
    step: int = Field(ge=0)
    created: str
    dayzero_version: str
    torch_version: str = ""
    model: ModelInfo = ModelInfo()
    layout: dict[str, Any] = {}  # ParallelConfig.to_dict() of the run that wrote it
    world: int = Field(ge=1, default=1)
    contents: list[str] = []  # of "model", "optimizer", "scheduler", "data", "rng"
    files: list[FileEntry] = []
    extra: dict[str, Any] = {}
    # lineage (see dayzero.runtime.checkpoint.lineage): the run this version belongs to, its place in the
    # directory's write order (0: written before lineage existed), the version it descends from
    # (the one its run resumed from, or the run's previous save) and the version its lineage
    # branched from (None for a run that started fresh, or an import)
    lineage: str = LEGACY
    seq: int = Field(ge=0, default=0)
    parent: VersionRef | None = None
    fork: VersionRef | None = None

    @field_validator("format")
    @classmethod
    def _format(cls, v: str) -> str:
        if v not in READABLE:
            raise ValueError(f"unsupported checkpoint format {v!r}; this dayzero reads {' and '.join(READABLE)} "
                             "(a newer dayzero wrote it: upgrade dayzero)")
        return v

    @field_validator("files")
    @classmethod
    def _unique(cls, v: list[FileEntry]) -> list[FileEntry]:
        seen = set()
        for f in v:
            if f.path in (MANIFEST, MARKER):
                raise ValueError(f"{f.path} may not list itself")
            if f.path in seen:
                raise ValueError(f"file {f.path!r} listed twice")
            seen.add(f.path)
        return v

    @property
    def total_bytes(self) -> int:
        return sum(f.bytes for f in self.files)

    def file(self, path: str) -> FileEntry | None:
        return next((f for f in self.files if f.path == path), None)

    def to_json(self) -> str:
        return json.dumps(self.model_dump(), indent=1, sort_keys=True) + "\n"


def describe_file(root: Path, rel: str, algo: str = DEFAULT_CHECKSUM) -> FileEntry:
    p = safe_join(root, rel)
    return FileEntry(path=rel, bytes=p.stat().st_size, checksum=checksum_file(p, algo))


def write_json_durable(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` via a temporary file, fsync, rename: readers see old or new."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def default_file_mode() -> int:
    """The mode ``open()`` gives a new file under this process's umask (0o644 under the usual
    022), for files written by libraries that create them private (safetensors' ``save_file``)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return 0o666 & ~int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)  # no /proc: read the umask by setting it, and put it straight back
    os.umask(mask)
    return 0o666 & ~mask


def fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # some filesystems do not open directories; the rename is still atomic
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def read_manifest(version_dir: Path) -> CheckpointManifest:
    """Parse ``manifest.json``; raise CheckpointError naming the directory on any problem."""
    from dayzero.errors import ConfigError
    from dayzero.inputs import read_text

    p = Path(version_dir) / MANIFEST
    if not p.exists() and not p.is_symlink():
        raise CheckpointError(f"{version_dir}: no {MANIFEST}; not a dayzero checkpoint, or its save was "
                              "interrupted")
    try:
        raw = json.loads(read_text(p))
    except ConfigError as e:
        raise CheckpointError(f"{e}; the checkpoint is corrupt, resume from an older one") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise CheckpointError(f"{p}: unreadable manifest ({e}); the checkpoint is corrupt, resume from an "
                              "older one") from None
    try:
        return CheckpointManifest.model_validate(raw)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(x) for x in first["loc"])
        raise CheckpointError(f"{p}: invalid manifest, field '{where}': {first['msg']}") from None


def manifest_digest(version_dir: Path) -> str:
    from dayzero.errors import ConfigError
    from dayzero.inputs import read_bytes

    try:
        return hashlib.sha256(read_bytes(Path(version_dir) / MANIFEST)).hexdigest()
    except ConfigError as e:
        raise OSError(str(e)) from None


def write_marker(version_dir: Path) -> None:
    """The commit point: a version is complete once this file exists (and names its manifest)."""
    text = json.dumps({"manifest_sha256": manifest_digest(version_dir), "committed": utc_now()}) + "\n"
    write_json_durable(Path(version_dir) / MARKER, text)
    fsync_dir(Path(version_dir))


# -- verification ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Verdict:
    """Result of checking one checkpoint version; ``problems`` name every file at fault."""

    path: Path
    manifest: CheckpointManifest | None
    problems: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return not self.problems

    def summary(self) -> str:
        return "ok" if self.ok else "; ".join(self.problems)


def check_marker(version_dir: Path) -> list[str]:
    m = Path(version_dir) / MARKER
    if not m.exists():
        return [f"no {MARKER} marker (incomplete: its save was interrupted or is still running)"]
    try:
        from dayzero.inputs import read_text

        want = json.loads(read_text(m, limit=4096))["manifest_sha256"]
    except (OSError, ValueError, KeyError, TypeError):
        return [f"{MARKER} marker unreadable"]
    try:
        have = manifest_digest(version_dir)
    except OSError:
        return [f"{MANIFEST} missing"]
    return [] if have == want else [f"{MANIFEST} changed after commit (sha256 differs from the {MARKER} marker)"]


def check_file(version_dir: Path, entry: FileEntry, checksum: bool = True) -> str | None:
    """One problem string naming the file, or None when it matches the manifest."""
    try:
        p = safe_join(version_dir, entry.path)
    except CheckpointError as e:
        return str(e)
    try:
        size = p.stat().st_size
    except FileNotFoundError:
        return f"{entry.path}: missing"
    if not p.is_file():
        return f"{entry.path}: not a regular file"
    if size != entry.bytes:
        kind = "truncated" if size < entry.bytes else "longer than recorded"
        return f"{entry.path}: {size} bytes, manifest says {entry.bytes} ({kind})"
    if checksum and checksum_file(p, entry.algorithm) != entry.checksum:
        return f"{entry.path}: {entry.algorithm} checksum mismatch (corrupt: bit flip or partial overwrite)"
    return None


def verify_version(version_dir: Path, checksums: bool = True,
                   entries: list[FileEntry] | None = None) -> Verdict:
    """Check marker, manifest and files of one version (all files, or only ``entries``)."""
    version_dir = Path(version_dir)
    problems = check_marker(version_dir)
    if problems and not (version_dir / MANIFEST).exists():
        return Verdict(version_dir, None, tuple(problems))
    try:
        manifest = read_manifest(version_dir)
    except CheckpointError as e:
        return Verdict(version_dir, None, tuple(problems + [str(e)]))
    for entry in manifest.files if entries is None else entries:
        bad = check_file(version_dir, entry, checksums)
        if bad:
            problems.append(bad)
    return Verdict(version_dir, manifest, tuple(problems))
