"""The one wrapper around PyTorch Distributed Checkpoint (DCP) internals, with a version check.

Why it exists: in torch 2.13 DCP reads its ``.metadata`` index with plain ``pickle.load`` and
non-tensor entries (optimizer hyperparameters) with ``torch.load(weights_only=False)``; either
would run arbitrary code from a crafted checkpoint. Here:

- :class:`SafeReader` unpickles ``.metadata`` allowing only DCP's own index classes, torch
  sizes/dtypes/layouts and paths, and refuses shard paths that are not plain file names listed in
  the checkpoint's manifest;
- :class:`SafeLoadPlanner` loads non-tensor entries with ``weights_only=True`` (plain Python
  containers and numbers only); tensors are already read with ``weights_only=True`` by DCP;
- :class:`CachedStager` copies the state for an async save into CPU buffers allocated once and
  reused (DCP's own cache pins memory, which a CPU-only build cannot do);
- :class:`HookedWriter` is DCP's ``FileSystemWriter`` with a callback just before this rank
  writes its shards (fault drills inject a crash "between shard writes" there).

Uses private names (``_StorageInfo``, ``_traverse.set_element``, ``_state_dict_utils``); :func:`check_torch` guards them.
"""

from __future__ import annotations

import contextlib
import io
import pickle
import warnings
from pathlib import Path
from typing import Any, Callable

import torch
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import Metadata
from torch.distributed.checkpoint.staging import BlockingAsyncStager

from dayzero.runtime.manifest import CheckpointError, check_relpath

MIN_TORCH = (2, 10)  # FSDP2 gradients on gloo are wrong before 2.10 (see pyproject.toml)
METADATA_FILE = ".metadata"

_DCP_META = "torch.distributed.checkpoint.metadata"
_ALLOWED = {
    (_DCP_META, "Metadata"), (_DCP_META, "TensorStorageMetadata"), (_DCP_META, "TensorProperties"),
    (_DCP_META, "_MEM_FORMAT_ENCODING"), (_DCP_META, "ChunkStorageMetadata"),
    (_DCP_META, "BytesStorageMetadata"), (_DCP_META, "MetadataIndex"), (_DCP_META, "StorageMeta"),
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch", "Size"), ("torch.serialization", "_get_layout"),
    ("pathlib", "PosixPath"), ("pathlib", "PurePosixPath"),
    ("pathlib", "WindowsPath"), ("pathlib", "PureWindowsPath"),
    ("collections", "OrderedDict"),
}


@contextlib.contextmanager
def single_process(active: bool):
    """Silence DCP's "assuming the intent is to save in a single process" warning when that is
    indeed the intent (it warns even when ``no_dist=True`` is passed)."""
    with warnings.catch_warnings():
        if active:
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def check_torch() -> None:
    """Raise CheckpointError when torch is older than the DCP behaviour this module relies on."""
    parts = torch.__version__.split("+")[0].split(".")
    have = tuple(int("".join(c for c in p if c.isdigit()) or 0) for p in parts[:2])
    if have < MIN_TORCH:
        raise CheckpointError(f"torch {torch.__version__} is too old for dayzero checkpoints; install torch >= "
                              f"{MIN_TORCH[0]}.{MIN_TORCH[1]}")


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _ALLOWED:
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise CheckpointError(f"refusing to unpickle {module}.{name} from a DCP .metadata file: only DCP "
                              "index classes are allowed (the file is corrupt or crafted)")


def load_metadata(path: Path, allowed_files: set[str] | None = None) -> Metadata:
    """Read ``<path>/.metadata`` safely and check every shard path it references."""
    f = Path(path) / METADATA_FILE
    try:
        with open(f, "rb") as fh:
            md = _MetadataUnpickler(fh).load()
    except FileNotFoundError:
        raise CheckpointError(f"{path}: no DCP {METADATA_FILE} index; the save did not finish") from None
    except CheckpointError:
        raise
    except Exception as e:  # any unpickling failure means a damaged index
        raise CheckpointError(f"{f}: unreadable DCP index ({type(e).__name__}: {e})") from None
    if not isinstance(md, Metadata):
        raise CheckpointError(f"{f}: not a DCP index (got {type(md).__name__})")
    for info in (md.storage_data or {}).values():
        rel = getattr(info, "relative_path", None)
        check_relpath(rel)
        if "/" in rel:
            raise CheckpointError(f"{f}: shard path {rel!r} is not a plain file name")
        if allowed_files is not None and rel not in allowed_files:
            raise CheckpointError(f"{f}: shard {rel!r} is not listed in the manifest")
    return md


def referenced_files(md: Metadata) -> set[str]:
    return {info.relative_path for info in (md.storage_data or {}).values()}


class SafeReader(FileSystemReader):
    """``FileSystemReader`` whose metadata load cannot execute code or leave the directory."""

    def __init__(self, path: str | Path, allowed_files: set[str] | None = None):
        super().__init__(path)
        self._allowed = allowed_files

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        if kwargs.get("rank") is not None:
            raise CheckpointError("per-rank DCP metadata (use_collectives=False) is not supported")
        md = load_metadata(Path(self.path), self._allowed)
        if getattr(md, "storage_meta", None) is not None:
            md.storage_meta.load_id = self.load_id
        return md


class SafeLoadPlanner(DefaultLoadPlanner):
    """Loads non-tensor entries with ``weights_only=True``: numbers, strings, containers only."""

    def load_bytes(self, read_item, value: io.BytesIO) -> None:
        from torch.distributed.checkpoint._traverse import set_element

        try:
            obj = torch.load(value, weights_only=True)
        except Exception as e:
            raise CheckpointError(f"checkpoint entry {read_item.dest_index.fqn!r} holds a non-plain object "
                                  f"({type(e).__name__}); refusing to unpickle it") from None
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], obj)
        else:
            self.state_dict[read_item.dest_index.fqn] = obj


class HookedWriter(FileSystemWriter):
    """``FileSystemWriter`` that calls ``before_write()`` right before this rank writes its shards."""

    def __init__(self, path: str | Path, before_write: Callable[[], None] | None = None, **kwargs: Any):
        super().__init__(path, **kwargs)
        self._before_write = before_write

    def write_data(self, plan, planner):
        if self._before_write is not None:
            self._before_write()
        return super().write_data(plan, planner)


class CachedStager(BlockingAsyncStager):
    """Stages into CPU buffers created on the first save and reused after (the caller must not
    start a new save before the previous one is written); pinned only when CUDA is present."""

    def __init__(self) -> None:
        super().__init__(cache_staged_state_dict=True)

    def stage(self, state_dict):
        from torch.distributed._state_dict_utils import _copy_state_dict, _create_cpu_state_dict

        if self.state_dict_cache is None:
            self.state_dict_cache = _create_cpu_state_dict(state_dict, pin_memory=torch.cuda.is_available())
        return _copy_state_dict(state_dict, self.state_dict_cache)
