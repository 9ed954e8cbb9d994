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
  reused (DCP's own cache pins memory, which a CPU-only build cannot do), optionally on a thread;
- :class:`CachingSavePlanner` is DCP's default save planner with plan caching under a key of its
  owner's (one :class:`~dayzero.runtime.checkpoint.checkpointer.Checkpointer`), dropped by :func:`forget_plans`;
- :func:`dcp_errors` turns DCP's gathered per-rank exception into one CheckpointError line;
- :class:`HookedWriter` is DCP's ``FileSystemWriter`` with a callback just before this rank
  writes its shards (fault drills inject a crash "between shard writes" there), checksumming
  each shard file as it is written so the manifest's checksums cost no second read.

Uses private names (``_StorageInfo``, ``_traverse.set_element``, ``_state_dict_utils``, the
planner's ``_cached_*`` caches); :func:`dayzero.torch_version.require_torch` guards the torch version.
"""

from __future__ import annotations

import contextlib
import io
import os
import pickle
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Iterator

import torch
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner, DefaultSavePlanner
from torch.distributed.checkpoint.filesystem import FileSystem
from torch.distributed.checkpoint.metadata import Metadata
from torch.distributed.checkpoint.planner import SavePlanner
from torch.distributed.checkpoint.staging import BlockingAsyncStager
from torch.utils.serialization import config as _serialization_config

from dayzero.runtime.checkpoint.manifest import DEFAULT_CHECKSUM, CheckpointError, check_relpath, new_hasher

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


@contextlib.contextmanager
def dcp_errors(doing: str) -> Iterator[None]:
    """DCP gathers every rank's exception into one CheckpointException (a BaseException, so
    ``except Exception`` misses it); turn it into one CheckpointError line naming each rank's cause."""
    try:
        yield
    except CheckpointException as e:
        causes = []
        for rank, (exc, _trace) in sorted(e.failures.items()):
            if isinstance(exc, CheckpointError):  # already a complete message
                raise CheckpointError(str(exc)) from None
            causes.append(f"rank {rank}: {type(exc).__name__}: {exc}")
        raise CheckpointError(f"{doing} failed ({'; '.join(causes)}); the previous checkpoint stays the "
                              "newest") from None


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


class CachingSavePlanner(DefaultSavePlanner):
    """DCP's default save planner with plan caching (``enable_plan_caching``), under ``key``.

    From the second save of a state with the same structure, no rank sends its local plan and
    the coordinator skips global planning: one gather of "unchanged" flags instead of every
    rank's pickled plan (2 ranks, 0.75 GiB, 384 tensors: ~35 ms of a 0.4 s save). A plan that did
    change is planned again. DCP keeps the caches in class attributes keyed by planner class
    name; the key here scopes them to one owner, and :func:`forget_plans` frees them."""

    def __init__(self, key: str):
        super().__init__(enable_plan_caching=True)
        self._cached_plans_key = key


def forget_plans(key: str) -> None:
    """Drop the plans :class:`CachingSavePlanner` cached under ``key``."""
    for name in ("_cached_save_plan", "_cached_final_save_plan", "_cached_all_plans", "_cached_global_plan",
                 "_cached_metadata"):
        cache = getattr(SavePlanner, name, None)
        if isinstance(cache, dict):
            cache.pop(key, None)


class _HashingStream(io.RawIOBase):
    """A write-only file wrapper that feeds every byte written to a checksum on the way to disk.

    A large write is hashed on a worker thread while the calling thread writes the same buffer
    to the file (hashlib and the write syscall both release the GIL), and the call returns when
    both are done: no copy, and the buffer (which may point into a tensor torch.save is writing)
    is only read while the call runs. Small writes (record headers) are copied into a batch that
    is hashed in the background.

    Every :attr:`WRITEBACK` bytes it asks the kernel to start writing the file's new pages to disk
    (``posix_fadvise(DONTNEED)`` starts asynchronous writeback of dirty pages, then drops the clean
    ones), so the disk works while torch.save serialises the next tensors and the closing fsync
    waits only for the tail; checkpoint pages also stop crowding other data out of the page cache."""

    _SMALL = 1 << 20  # writes below this size are batched
    WRITEBACK = 32 << 20

    def __init__(self, raw, algo: str = DEFAULT_CHECKSUM):
        super().__init__()
        self._raw, self._algo, self._hash, self._size = raw, algo, new_hasher(algo), 0
        self._pending = bytearray()
        self._worker = ThreadPoolExecutor(1, thread_name_prefix="dayzero-checksum")
        self._written_back = 0  # file offset up to which writeback has been started
        self._writeback = hasattr(os, "posix_fadvise")  # Linux and most Unixes; not macOS or Windows

    def writable(self) -> bool:
        return True

    def _flush_pending(self) -> None:
        if self._pending:
            self._worker.submit(self._hash.update, bytes(self._pending))
            self._pending.clear()

    def write(self, b) -> int:
        view = memoryview(b).cast("B")
        if view.nbytes < self._SMALL:
            n = self._raw.write(view)
            n = view.nbytes if n is None else n
            self._pending += view[:n]
            self._size += n
            if len(self._pending) >= self._SMALL:
                self._flush_pending()
            return n
        self._flush_pending()
        hashed = self._worker.submit(self._hash.update, view)  # runs after the batches queued before
        try:
            n = self._raw.write(view)
            n = view.nbytes if n is None else n
        finally:
            hashed.result()  # the buffer must not be read after this call returns
        if n < view.nbytes:  # a regular file's buffered writer writes everything or raises
            raise OSError(f"short write: {n} of {view.nbytes} bytes")
        self._size += n
        self._start_writeback()
        return n

    def _start_writeback(self) -> None:
        if not self._writeback or self._size - self._written_back < self.WRITEBACK:
            return
        self._raw.flush()
        end = self._raw.tell()
        try:
            os.posix_fadvise(self._raw.fileno(), self._written_back, end - self._written_back, os.POSIX_FADV_DONTNEED)
        except (OSError, ValueError, io.UnsupportedOperation):  # not a plain file: the fsync does it all
            self._writeback = False
        self._written_back = end

    def finish(self) -> tuple[int, str]:
        """Wait for the hash worker: (bytes written, "<algo>:<hex>")."""
        self._flush_pending()
        self._worker.shutdown(wait=True)
        return self._size, f"{self._algo}:{self._hash.hexdigest()}"

    def tell(self) -> int:
        return self._raw.tell()

    def fileno(self) -> int:
        return self._raw.fileno()

    def flush(self) -> None:
        self._raw.flush()

    def close(self) -> None:
        self._raw.flush()
        super().close()


class HashingFileSystem(FileSystem):
    """DCP's local file system, checksumming shard files while they are written (no read-back)."""

    def __init__(self, algo: str = DEFAULT_CHECKSUM) -> None:
        super().__init__()
        self.algo = algo
        self.digests: dict[str, tuple[int, str]] = {}  # path -> (bytes, "<algo>:<hex>")

    @contextlib.contextmanager
    def create_stream(self, path, mode):
        if "w" not in mode or not Path(path).name.endswith(".distcp"):
            with super().create_stream(path, mode) as stream:
                yield stream
            return
        with super().create_stream(path, mode) as raw:
            stream = _HashingStream(raw, self.algo)
            try:
                yield stream
            finally:
                size, digest = stream.finish()
            self.digests[str(path)] = (size, digest)


class HookedWriter(FileSystemWriter):
    """``FileSystemWriter`` that calls ``before_write()`` right before this rank writes its shards
    and checksums the shard files as it writes them (:attr:`digests`)."""

    def __init__(self, path: str | Path, before_write: Callable[[], None] | None = None,
                 checksum: str = DEFAULT_CHECKSUM, **kwargs: Any):
        super().__init__(path, **kwargs)
        self.fs = HashingFileSystem(checksum)
        self._before_write = before_write

    @property
    def digests(self) -> dict[str, tuple[int, str]]:
        return self.fs.digests

    def write_data(self, plan, planner):
        if self._before_write is not None:
            self._before_write()
        # torch.save's zip writer CRC-32s every record (~0.3 s per GB on one core); the shard
        # files' checksums in the manifest already cover every byte, so that second pass is skipped.
        with _serialization_config.patch({"save.compute_crc32": False}):
            return super().write_data(plan, planner)


class CachedStager(BlockingAsyncStager):
    """Copies the state for an async save into CPU buffers created on the first save and reused
    after (pinned only when an accelerator is present). With ``background=True`` the copy runs on a thread
    and :meth:`stage` returns a Future, so the copy overlaps the next forward/backward; the caller
    must not change the state (optimizer step) before that Future is done."""

    def __init__(self, background: bool = False) -> None:
        super().__init__(cache_staged_state_dict=True)
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="dayzero-stage") if background else None

    def stage(self, state_dict):
        if self._executor is None:
            return self._copy(state_dict)
        return self._executor.submit(self._copy, state_dict)

    def _copy(self, state_dict):
        from torch.distributed._state_dict_utils import _copy_state_dict, _create_cpu_state_dict

        from dayzero.runtime.device import has_accelerator

        if self.state_dict_cache is None:
            self.state_dict_cache = _create_cpu_state_dict(state_dict, pin_memory=has_accelerator())
        return _copy_state_dict(state_dict, self.state_dict_cache)

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=True)
