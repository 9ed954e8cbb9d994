"""Sharded, versioned checkpoints with PyTorch Distributed Checkpoint (DCP).

What one save holds: the model and optimizer as DCP shards (each rank writes its own DTensor
shards, in parallel; optimizer state flattened per parameter name so any layout can load it),
the LR scheduler, data-stream position, step and loop extras as JSON (rank 0), and every rank's
RNG states as JSON. The sequence, on every rank::

    save(step)  ->  rank 0 picks the version's name  ->  write into <name>.partial
                ->  each rank hashes its own files
                ->  rank 0: manifest.json, verify, rename to <name>, COMPLETE marker, retention

With ``async_save=True`` the call returns at once: the state is copied into reused CPU buffers on
a thread while the next forward/backward runs (the next ``optimizer.step()`` waits for that copy),
and writing, hashing and the commit run on another thread, whose collectives use their own gloo
process group.

Resume (:meth:`Checkpointer.resume`) walks versions newest first by write order (see
:mod:`dayzero.runtime.checkpoint.lineage`) and loads the first complete one whose files all match their
manifest checksums (hashing is split across ranks) and whose tensors fit the model; newer ones
that are partial, truncated, corrupt or for another model are skipped with a warning naming them.
Loading goes through ``get_state_dict``/``set_state_dict``, so a checkpoint saved at one layout
loads into another (reshard on load).

Lineage: a checkpointer saves into one lineage. It continues the lineage of the version it
resumed when that is the lineage's newest, and otherwise starts a branch from it (said in a
``checkpoint_branch`` event and a warning); retention deletes only the lineage's own old
versions. Rank 0 holds the directory's lock (:mod:`dayzero.runtime.checkpoint.dirlock`) from construction
to :meth:`Checkpointer.close`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import TensorStorageMetadata
from torch.distributed.checkpoint.state_dict_saver import AsyncSaveResponse

from dayzero.runtime.checkpoint.dcp_io import (METADATA_FILE, CachedStager, CachingSavePlanner, HookedWriter,
                                               SafeLoadPlanner, SafeReader, forget_plans, load_metadata,
                                               referenced_files, single_process)
from dayzero.runtime.checkpoint.dirlock import CheckpointLocked, DirLock
from dayzero.runtime.checkpoint.json_state import capture_rng, from_json, restore_rng, to_json
from dayzero.runtime.checkpoint.lineage import RunLineage, history, new_lineage_id, target_copy, write_order
from dayzero.runtime.checkpoint.manifest import (DEFAULT_CHECKSUM, MANIFEST, CheckpointError, CheckpointManifest,
                                                 FileEntry, ModelInfo, Verdict, VersionRef, check_algorithm, check_file,
                                                 check_marker, dayzero_version, describe_file, read_manifest, safe_join,
                                                 utc_now, write_json_durable)
from dayzero.runtime.checkpoint.state_dicts import (fit_problems, model_shapes, set_train_state, split_small,
                                                    take_saved, train_state_dict)
from dayzero.runtime.checkpoint.versions import (Version, backup, commit, next_seq, prepare_partial, purge, retire,
                                                 scan, select_first, select_newest, version_name)
from dayzero.torch_version import require_torch

log = logging.getLogger("dayzero.checkpoint")
TRAIN_STATE = "train_state.json"
OPTIM_GROUPS = "optimizer_groups.json"  # the optimizer's small state: hyperparameters and step per parameter name


def rng_file(rank: int) -> str:
    return f"rng-{rank:05d}.json"


@dataclass(frozen=True)
class SavedCheckpoint:
    step: int
    path: Path
    bytes: int
    seconds: float  # whole save, from the call to the COMPLETE marker
    blocked_s: float  # how long save() held up the training loop
    lineage: str = ""
    backup: Path | None = None  # where a version already there was moved (save_state(backup_existing=True))


@dataclass(frozen=True)
class Resumed:
    step: int
    path: Path
    data: Any  # the data-stream position given to save()
    extra: dict  # loop extras given to save() (loss-guard state, skipped batches, ...)
    manifest: CheckpointManifest
    skipped: tuple[Verdict, ...] = ()


class Checkpointer:
    """Saves and resumes versions under ``root``. Construct it on every rank (it creates a
    process group when torch.distributed is initialized, and rank 0 takes the directory's lock:
    CheckpointLocked on every rank when another job holds it); :meth:`close` releases it.

    ``keep``: versions of this checkpointer's lineage to keep; ``prune_other_lineages``: let
    retention delete the versions of every other lineage too (off by default)."""

    def __init__(self, root: str | Path, *, keep: int = 3, async_save: bool = False, model_name: str = "",
                 spec_digest: str = "", model_recipe: dict | None = None, layout: dict | None = None,
                 before_shard_write: Callable[[int], None] | None = None,
                 on_event: Callable[[dict], None] | None = None, thread_count: int = 1,
                 overlap_staging: bool = True, checksum: str = DEFAULT_CHECKSUM,
                 prune_other_lineages: bool = False):
        require_torch("dayzero checkpoints", CheckpointError)
        if keep < 1:
            raise CheckpointError(f"--keep {keep}: at least 1 checkpoint must be kept")
        self.checksum = check_algorithm(checksum)
        self.root, self.keep, self.async_save = Path(root), keep, async_save
        self.prune_other_lineages = prune_other_lineages
        self.model = ModelInfo(name=model_name, spec_digest=spec_digest, recipe=dict(model_recipe or {}))
        self.layout = dict(layout or {})
        self._before_shard_write, self._on_event = before_shard_write, on_event
        if dist.is_available() and dist.is_initialized():
            self.rank, self.world = dist.get_rank(), dist.get_world_size()
            # Async saves run DCP's collectives on a background thread; a group of their own keeps
            # them from interleaving with the training loop's collectives.
            self.pg = dist.new_group(backend="gloo")
        else:
            self.rank, self.world, self.pg = 0, 1, None
        self._lock = DirLock(self.root) if self.rank == 0 else None
        self.lineage = RunLineage(self._open())
        self._saving_step = -1
        self._plan_key = f"dayzero-{uuid.uuid4().hex}"  # this checkpointer's cached DCP save plans
        self._writer = HookedWriter(self.root, before_write=self._hook, checksum=self.checksum,
                                    thread_count=thread_count, sync_files=True)
        self._stager = CachedStager(background=overlap_staging) if async_save else None
        self._staging: Future | None = None
        self._hooks: dict[int, Any] = {}
        self._purger: threading.Thread | None = None
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="dayzero-ckpt") if async_save else None
        self._pending: Future | None = None

    # -- save ----------------------------------------------------------------------------------
    def save(self, step: int, model, optimizer=None, *, scheduler=None, data: Any = None,
             extra: dict | None = None) -> SavedCheckpoint | float:
        """Save step ``step``. Returns the SavedCheckpoint (sync), or the seconds the call blocked
        (async; :meth:`wait` returns the SavedCheckpoint)."""
        t0 = time.perf_counter()
        self.wait()
        self._guard(optimizer)
        state, _ = train_state_dict(model, optimizer)
        # hyperparameters (lr, betas, ...) and scalar state (step) per parameter name go to JSON:
        # thousands of tiny DCP entries would each cost a torch.save, and JSON needs no unpickling
        state["optim"], hyper = split_small(state["optim"])
        contents = ["model"] + (["optimizer"] if optimizer is not None else []) + (
            ["scheduler"] if scheduler is not None else []) + ["data", "rng"]
        own = {rng_file(self.rank): json.dumps({"rank": self.rank, "world": self.world, "rng": capture_rng()})}
        if self.rank == 0:
            own[TRAIN_STATE] = json.dumps(to_json({
                "step": step, "data": data, "extra": extra or {},
                "scheduler": scheduler.state_dict() if scheduler is not None else None}, "train state"))
        return self._save(step, state, own, contents, t0, to_json(hyper, "optimizer") if optimizer is not None else None)

    def save_state(self, step: int, state: dict, *, contents: list[str], data: Any = None,
                   extra: dict | None = None, backup_existing: bool = False) -> SavedCheckpoint | float:
        """Save a ready state dict ({"model": {fqn: tensor}, ...}); used by ``dayzero ckpt import``.
        ``backup_existing``: write ``step-N`` itself, moving a version already there to a backup
        (:func:`dayzero.runtime.checkpoint.versions.backup`) once the new one is verified."""
        t0 = time.perf_counter()
        self.wait()
        own = {}
        if self.rank == 0:
            own[TRAIN_STATE] = json.dumps(to_json({"step": step, "data": data, "extra": extra or {},
                                                   "scheduler": None}, "train state"))
        return self._save(step, state, own, contents, t0, None, backup_existing)

    def versions(self) -> list[Version]:
        """The versions under the root, as rank 0 sees them (the same list on every rank)."""
        return self._broadcast(scan(self.root) if self.rank == 0 else None)

    def _save(self, step: int, state: dict, own: dict[str, str], contents: list[str], t0: float,
              groups: dict | None, backup_existing: bool = False) -> SavedCheckpoint | float:
        head: tuple = ("ok", "")
        if self.rank == 0:  # a version of another lineage at this step keeps its name: take the next copy
            try:
                self._lock.ensure()
                copy = 1 if backup_existing else target_copy(scan(self.root), step, self.lineage.id)
                head = ("ok", prepare_partial(self.root, step, copy).name)
            except (CheckpointError, OSError) as e:
                head = ("error", str(e))
        head = self._broadcast(head)  # the empty partial directory exists before anyone writes into it
        if head[0] == "error":
            raise CheckpointError(f"saving step {step} under {self.root} failed ({head[1]}); the previous "
                                  "checkpoint stays the newest")
        partial = self.root / head[1]
        self._saving_step, self.lineage.settled = step, True
        ctx = dict(step=step, partial=partial, contents=contents, own=own, groups=groups, t0=t0,
                   backup_existing=backup_existing)
        if not self.async_save:
            with single_process(self.pg is None), _dcp_errors(f"saving step {step} to {partial}"):
                dcp.save(state, checkpoint_id=partial, storage_writer=self._writer, process_group=self.pg,
                         no_dist=self.pg is None, planner=CachingSavePlanner(self._plan_key))
            return self._commit(**ctx, blocked_s=None)
        with single_process(self.pg is None), _dcp_errors(f"saving step {step} to {partial}"):
            resp = dcp.async_save(state, checkpoint_id=partial, storage_writer=self._writer, process_group=self.pg,
                                  planner=CachingSavePlanner(self._plan_key),
                                  async_stager=self._stager, no_dist=self.pg is None)
        upload, self._staging = (resp.upload_completion, resp.staging_completion) \
            if isinstance(resp, AsyncSaveResponse) else (resp, None)
        blocked = time.perf_counter() - t0
        self._pending = self._executor.submit(self._finish_async, upload, ctx, blocked)
        return blocked

    def staged(self) -> float:
        """Block until the state of the in-flight async save has been copied out (seconds waited).
        Runs automatically before every ``optimizer.step()`` of a saved optimizer."""
        fut, self._staging = self._staging, None
        if fut is None:
            return 0.0
        t0 = time.perf_counter()
        with _dcp_errors("staging a checkpoint"):
            fut.result()
        return time.perf_counter() - t0

    def in_flight(self) -> bool:
        """Whether an async save is still being written or committed (any thread may ask)."""
        fut = self._pending
        return fut is not None and not fut.done()

    def wait(self) -> SavedCheckpoint | None:
        """Block until the in-flight async save is committed; re-raise its failure."""
        self.staged()
        fut, self._pending = self._pending, None
        if fut is None:
            return None
        return fut.result()

    def close(self, wait: bool = True) -> None:
        try:
            if wait:
                self.wait()
        finally:
            self._purge_join()
            for h in self._hooks.values():
                h.remove()
            self._hooks.clear()
            if self._stager is not None and wait:
                self._stager.close()
            if self._executor is not None:
                self._executor.shutdown(wait=wait, cancel_futures=not wait)
            forget_plans(self._plan_key)
            if self._lock is not None:
                self._lock.release()

    def _open(self) -> str:
        """Rank 0 takes the lock and mints a lineage id; every rank gets the same answer."""
        head: tuple = ("ok", "")
        if self.rank == 0:
            try:
                self._lock.acquire()
                head = ("ok", new_lineage_id())
            except CheckpointError as e:
                head = ("error", str(e))
        head = self._broadcast(head)
        if head[0] == "error":
            raise CheckpointLocked(head[1])
        return head[1]

    def _purge_join(self) -> None:
        if self._purger is not None:
            self._purger.join()
            self._purger = None

    def _guard(self, optimizer) -> None:
        """With background staging, an optimizer step must wait until the state is copied out."""
        if not self.async_save or optimizer is None:
            return
        for opt in optimizer if isinstance(optimizer, (list, tuple)) else [optimizer]:
            if id(opt) not in self._hooks:
                self._hooks[id(opt)] = opt.register_step_pre_hook(self._staged_hook)

    def _staged_hook(self, *_args) -> None:
        self.staged()

    def _finish_async(self, upload: Future, ctx: dict, blocked: float) -> SavedCheckpoint:
        with _dcp_errors(f"saving step {ctx['step']} to {ctx['partial']}"):
            upload.result()
        return self._commit(**ctx, blocked_s=blocked)

    def _hook(self) -> None:
        if self._before_shard_write is not None:
            self._before_shard_write(self._saving_step)

    def _commit(self, step: int, partial: Path, contents: list[str], own: dict[str, str], groups: dict | None,
                t0: float, backup_existing: bool, blocked_s: float | None) -> SavedCheckpoint:
        """Write own JSON files and hash own files (every rank); then rank 0 writes the manifest,
        verifies and commits."""
        try:
            for name, text in own.items():
                write_json_durable(partial / name, text)
            mine = sorted(f for f in os.listdir(partial) if f.startswith(f"__{self.rank}_"))
            mine += sorted(own) + ([METADATA_FILE] if self.rank == 0 else [])
            entries: Any = ([self._describe(partial, f).model_dump() for f in mine], groups)
        except OSError as e:
            entries = f"rank {self.rank}: {e}"
        gathered = self._gather(entries)
        result: tuple = ("error", "")
        if self.rank == 0:
            try:
                result = self._write_and_commit(step, partial, contents, gathered, backup_existing)
            except Exception as e:  # reported on every rank below, never left hanging
                result = ("error", f"{type(e).__name__}: {e}")
        result = self._broadcast(result)
        if result[0] == "error":
            raise CheckpointError(f"saving step {step} to {partial} failed ({result[1]}); the previous "
                                  "checkpoint stays the newest")
        _, path, nbytes, deleted, backup_path = result
        if self.rank == 0 and deleted:  # deleting old versions' files is off the critical path
            self._purge_join()
            self._purger = threading.Thread(target=purge, args=(self.root,), name="dayzero-purge", daemon=True)
            self._purger.start()
        seconds = time.perf_counter() - t0
        saved = SavedCheckpoint(step, Path(path), nbytes, seconds, seconds if blocked_s is None else blocked_s,
                                self.lineage.id, Path(backup_path) if backup_path else None)
        if backup_path:
            self._event({"event": "checkpoint_backup", "step": step, "path": str(path), "backup": backup_path})
        self._event({"event": "checkpoint_saved", "step": step, "path": str(path), "bytes": nbytes,
                     "seconds": round(seconds, 4), "blocked_s": round(saved.blocked_s, 4), "lineage": self.lineage.id})
        for name, lineage in deleted:
            why = f"retention --keep {self.keep}" if lineage == self.lineage.id else "--ckpt-prune-other-lineages"
            self._event({"event": "checkpoint_deleted", "step": step, "path": str(self.root / name),
                         "lineage": lineage, "reason": why})
        return saved

    def _describe(self, partial: Path, name: str) -> FileEntry:
        """Size and checksum of one file: from the writer's running hash when it wrote the file
        (and the size on disk agrees), else by reading it."""
        seen = self._writer.digests.pop(str(partial / name), None)
        if seen is not None and (partial / name).stat().st_size == seen[0]:
            return FileEntry(path=name, bytes=seen[0], checksum=seen[1])
        return describe_file(partial, name, self.checksum)

    def _write_and_commit(self, step: int, partial: Path, contents: list[str], gathered: list,
                          backup_existing: bool) -> tuple:
        errors = [g for g in gathered if isinstance(g, str)]
        if errors:
            raise CheckpointError("; ".join(errors))
        files = [FileEntry(**e) for g, _ in gathered for e in g]
        if gathered[0][1] is not None:  # one file for all ranks' optimizer hyperparameters
            merged: dict = {}
            for _, groups in gathered:
                merged.update(groups)  # replicas (dp, tp) hold identical values for a name
            write_json_durable(partial / OPTIM_GROUPS, json.dumps(merged, sort_keys=True))
            files.append(describe_file(partial, OPTIM_GROUPS, self.checksum))
        files.sort(key=lambda f: f.path)
        seq = next_seq(self.root, scan(self.root))
        manifest = CheckpointManifest(step=step, created=utc_now(), dayzero_version=dayzero_version(),
                            torch_version=torch.__version__, model=self.model, layout=self.layout,
                            world=self.world, contents=contents, files=files, lineage=self.lineage.id, seq=seq,
                            parent=self.lineage.parent, fork=self.lineage.fork)
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
        self.lineage.saved(final.name, seq, step)
        deleted = [(v.name, v.record.lineage) for v in retire(self.root, self.keep, self.lineage.id,
                                                             prune_other=self.prune_other_lineages,
                                                             protect=final.name)]
        return ("ok", str(final), manifest.total_bytes, deleted, moved)

    # -- resume / load -------------------------------------------------------------------------
    def resume(self, model, optimizer=None, scheduler=None, *, which: str | int = "auto") -> Resumed | None:
        """Load the most recently written good version (``which="auto"``), or a given step or directory.

        ``auto`` tries versions in :func:`dayzero.runtime.checkpoint.lineage.resume_order` and skips, with a
        warning, any that fails verification or does not fit the model; a step number with several
        versions (several lineages) means its most recently written one. Returns None when there is
        nothing to resume from (no complete version). Raises CheckpointError when complete versions
        exist but none is usable, or an explicit one fails. The first resume settles the lineage
        that later saves go to (continued, or a new branch: see :mod:`dayzero.runtime.checkpoint.lineage`).
        """
        self.wait()
        versions = self.versions()
        want = model_shapes(model)
        if which == "auto":
            chosen, skipped = select_newest(versions, lambda v: self._usable(v, want))
            self._report(skipped)
            if chosen is None:
                if any(v.state == "complete" for v in versions):
                    raise CheckpointError(f"no checkpoint under {self.root} passes verification and fits this run "
                                          "(skipped: " + "; ".join(f"{v.path.name}: {v.problems[0]}" for v in skipped)
                                          + "); restore them from backup, or start over with a new --ckpt-dir")
                self.lineage.settled = True
                return None
        else:
            chosen, skipped = self._explicit(versions, which, want), []
        r = self.load(chosen.path, model, optimizer, scheduler, manifest=chosen.manifest, skipped=skipped)
        if not self.lineage.settled:
            self._adopt(versions, chosen, {v.path for v in skipped})
        return r

    def rollback(self, model, optimizer=None, scheduler=None) -> Resumed | None:
        """Reload the newest good version this run descends from: its own lineage's, then the one
        it resumed from and that one's history. None when there is none yet (nothing saved or
        resumed); CheckpointError when there are some but none is usable."""
        self.wait()
        versions = self.versions()
        want = model_shapes(model)
        run = self.lineage
        ordered = history(versions, run.id, run.fork)
        if run.origin is not None and all(v.path != run.origin for v in ordered):
            ordered.append(Version(run.origin, -1, "complete"))
        if not ordered:
            return None
        chosen, skipped = select_first(ordered, lambda v: self._usable(v, want))
        self._report(skipped)
        if chosen is None:
            raise CheckpointError(f"no checkpoint of this run under {self.root} passes verification (skipped: "
                                  + ", ".join(v.path.name for v in skipped) + ")")
        r = self.load(chosen.path, model, optimizer, scheduler, manifest=chosen.manifest, skipped=skipped)
        self.lineage.parent = _ref_of(chosen, self.root)
        return r

    def verify(self, version: Version) -> Verdict:
        """Full check of one version, checksum work split across ranks; same answer on all ranks."""
        return self._inspect(version, None)[0]

    def _inspect(self, version: Version, want: dict | None) -> tuple[Verdict, list[str]]:
        """(integrity verdict, reasons it does not fit this run): rank 0 reads the manifest and the
        DCP index; every rank hashes its share of the files and, given ``want`` (its model's
        tensor shapes), checks them against the saved ones."""
        head: tuple = ((), None, {}, [])
        if self.rank == 0:
            problems = check_marker(version.path)
            try:
                manifest = read_manifest(version.path)
                md = load_metadata(version.path, {f.path for f in manifest.files})
                saved = {k[len("model."):]: tuple(m.size) for k, m in md.state_dict_metadata.items()
                         if k.startswith("model.") and isinstance(m, TensorStorageMetadata)}
                have, mine = manifest.model.spec_digest, self.model.spec_digest
                unfit = [f"saved for model {manifest.model.name or '?'} (spec {have}), this run builds "
                         f"{self.model.name or '?'} (spec {mine})"] if have and mine and have != mine else []
                head = (tuple(problems), manifest.model_dump(), saved, unfit)
            except CheckpointError as e:
                head = (tuple(problems) + (str(e),), None, {}, [])
        problems, raw, saved, unfit = self._broadcast(head)
        if raw is None:
            return Verdict(version.path, None, problems), []
        manifest = CheckpointManifest.model_validate(raw)
        mine = [f for i, f in enumerate(manifest.files) if i % self.world == self.rank]
        local = [p for f in mine if (p := check_file(version.path, f, checksum=True))]
        fits = fit_problems(want, saved) if want is not None and not unfit else []
        gathered = self._all_gather((local, fits))
        found = sorted(p for ps, _ in gathered for p in ps)
        unfit = unfit or sorted({p for _, ps in gathered for p in ps})
        return Verdict(version.path, manifest, tuple(problems) + tuple(found)), unfit

    def _usable(self, version: Version, want: dict) -> Verdict:
        """The verdict ``auto`` goes by: intact, and fits this run."""
        verdict, unfit = self._inspect(version, want)
        return verdict if not verdict.ok or not unfit else replace(verdict, problems=tuple(unfit))

    def _explicit(self, versions: list[Version], which: str | int, want: dict) -> Verdict:
        if str(which).isdigit():
            step = int(which)
            same = sorted((v for v in versions if v.step == step and v.state == "complete"), key=write_order)
            version = same[-1] if same else Version(self.root / version_name(step), step, "complete")
            if len(same) > 1:
                self._warn(f"step {step} has {len(same)} versions ({', '.join(v.name for v in same)}); resuming the "
                           f"most recently written, {version.name}; pass a version directory to --resume to choose")
        else:
            path = Path(which)
            version = next((v for v in versions if v.path.resolve() == path.resolve()), Version(path, -1, "complete"))
        verdict, unfit = self._inspect(version, want)
        if not verdict.ok:
            raise CheckpointError(f"checkpoint {version.path} failed verification: {verdict.summary()}")
        if unfit:
            raise CheckpointError(f"checkpoint {version.path} does not fit this run: {'; '.join(unfit)}; use the "
                                  "same model or a new --ckpt-dir")
        return verdict

    def _adopt(self, versions: list[Version], chosen: Verdict, bad: set[Path]) -> None:
        """Settle the lineage after the first resume: continue the resumed version's lineage when
        nothing newer of it exists (apart from versions this resume found bad), else branch."""
        version = next((v for v in versions if v.path == chosen.path and v.record is not None), None)
        newer = self.lineage.adopt(versions, version, _ref_of(chosen, self.root), chosen.path, bad)
        if not newer:  # continued (or, for a version outside this root, forked from it)
            return
        names = [v.name for v in newer]
        self._warn(f"resuming {version.name} of lineage {version.record.lineage}, which has {len(newer)} newer "
                   f"version(s) ({', '.join(names)}): saves go to a new lineage {self.lineage.id} that branches from "
                   f"it; the newer versions are kept (--ckpt-prune-other-lineages deletes them)")
        self._event({"event": "checkpoint_branch", "lineage": self.lineage.id, "parent": str(version.path),
                     "parent_lineage": version.record.lineage, "newer": names})

    def _report(self, skipped: Sequence[Verdict]) -> None:
        for v in skipped:
            self._warn(f"skipping checkpoint {v.path.name}: {v.summary()}")
            self._event({"event": "checkpoint_skipped", "path": str(v.path), "problems": list(v.problems)})

    def load(self, path: str | Path, model, optimizer=None, scheduler=None, *,
             manifest: CheckpointManifest | None = None, skipped: Sequence[Verdict] = ()) -> Resumed:
        """Load one version into ``model`` (any layout), ``optimizer`` and ``scheduler``."""
        path = Path(path)
        manifest = manifest or read_manifest(path)
        want, have = self.model.spec_digest, manifest.model.spec_digest
        if want and have and want != have:
            raise CheckpointError(f"{path} was saved for model {manifest.model.name or '?'} (spec {have}), this run "
                                  f"builds {self.model.name or '?'} (spec {want}); use the same model or a new --ckpt-dir")
        use_optim = optimizer if "optimizer" in manifest.contents else None
        if optimizer is not None and use_optim is None:
            self._warn(f"{path.name} holds no optimizer state (model-only, e.g. imported); optimizer starts fresh")
        state, keys = train_state_dict(model, use_optim)
        small: dict = {}
        if use_optim is None:
            state.pop("optim")
        else:
            saved = from_json(json.loads(safe_join(path, OPTIM_GROUPS).read_text()))
            state["optim"], small, missing = take_saved(state["optim"], saved)
            if missing:
                raise CheckpointError(f"{path}: no optimizer settings for {missing[0]} (and {len(missing) - 1} more); "
                                      "the optimizer differs from the one saved")
        with single_process(self.pg is None), _dcp_errors(f"loading {path}"):
            dcp.load(state, storage_reader=SafeReader(path, {f.path for f in manifest.files}),
                     planner=SafeLoadPlanner(), process_group=self.pg, no_dist=self.pg is None)
        if use_optim is not None:
            state["optim"].update(small)
        set_train_state(model, use_optim, state, keys)
        ts = from_json(json.loads(safe_join(path, TRAIN_STATE).read_text()))
        if scheduler is not None and ts.get("scheduler") is not None:
            scheduler.load_state_dict(_fit_scheduler_state(ts["scheduler"], scheduler))
        # Same world: each rank gets its own streams back (bitwise resume). Resharded: streams are
        # reassigned round-robin, as saved ranks and new ranks no longer correspond.
        src = self.rank if manifest.world == self.world else self.rank % manifest.world
        rng_path = safe_join(path, rng_file(src))
        if rng_path.exists():
            restore_rng(json.loads(rng_path.read_text())["rng"])
        self._event({"event": "checkpoint_loaded", "step": ts["step"], "path": str(path),
                     "saved_world": manifest.world, "world": self.world})
        return Resumed(int(ts["step"]), path, ts.get("data"), ts.get("extra") or {}, manifest, tuple(skipped))

    # -- helpers -------------------------------------------------------------------------------
    def _event(self, ev: dict) -> None:
        if self.rank == 0 and self._on_event is not None:
            self._on_event(ev)

    def _warn(self, msg: str) -> None:
        if self.rank == 0:  # "dayzero:" marks a line for a person: the rank log forwards it to the terminal
            log.warning("dayzero: warning: %s", msg)

    def _gather(self, obj: Any) -> list:
        if self.pg is None:
            return [obj]
        out = [None] * self.world if self.rank == 0 else None
        dist.gather_object(obj, out, dst=0, group=self.pg)
        return out or []

    def _all_gather(self, obj: Any) -> list:
        if self.pg is None:
            return [obj]
        out: list = [None] * self.world
        dist.all_gather_object(out, obj, group=self.pg)
        return out

    def _broadcast(self, obj: Any) -> Any:
        if self.pg is None:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0, group=self.pg)
        return box[0]


@contextlib.contextmanager
def _dcp_errors(doing: str) -> Iterator[None]:
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
        raise CheckpointError(f"{doing} failed ({'; '.join(causes)}); the previous checkpoint stays the newest") from None


def _ref_of(verdict: Verdict, root: Path) -> VersionRef:
    """A reference to a verified version: by name inside ``root``, by absolute path outside it."""
    m, path = verdict.manifest, verdict.path
    inside = path.parent.resolve() == Path(root).resolve()
    return VersionRef(name=path.name if inside else str(path.resolve()), lineage=m.lineage, seq=m.seq, step=m.step)


def _fit_scheduler_state(saved: dict, scheduler) -> dict:
    """Fit a saved LR-scheduler state to the current optimizer's parameter groups.

    The optimizer has one group per (device mesh, decay class), so a layout change changes the
    number of groups (tp2 pp2 dp2 has more meshes than one process). Every group follows the same
    schedule from the same peak LR, so the per-group lists are rebuilt at the current length."""
    state = dict(saved)
    n = len(scheduler.optimizer.param_groups)
    for key in ("base_lrs", "_last_lr", "lr_lambdas"):
        v = state.get(key)
        if isinstance(v, list) and v and len(v) != n:
            state[key] = [v[0]] * n
    return state
