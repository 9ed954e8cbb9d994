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

The class holds the sequence; its collaborators, one module each: ``rank_group`` (the
checkpoint's own process group and object collectives), ``async_saves`` (staging and the
background write of an async save), ``commit`` (own files, manifest, verify, rename, retention),
``verification`` (a version's verdict, hashing split across ranks), ``loading`` (one version into
a model at any layout), ``version_files`` (the names of a version's own files).

Lineage: a checkpointer saves into one lineage. It continues the lineage of the version it
resumed when that is the lineage's newest, and otherwise starts a branch from it (said in a
``checkpoint_branch`` event and a warning); retention deletes only the lineage's own old
versions. Rank 0 holds the directory's lock (:mod:`dayzero.runtime.checkpoint.dirlock`) from construction
to :meth:`Checkpointer.close`.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import torch.distributed.checkpoint as dcp

from dayzero.runtime.checkpoint.async_saves import AsyncSaves
from dayzero.runtime.checkpoint.commit import own_entries, write_and_commit
from dayzero.runtime.checkpoint.dcp_io import CachingSavePlanner, HookedWriter, dcp_errors, forget_plans, single_process
from dayzero.runtime.checkpoint.dirlock import CheckpointLocked, DirLock
from dayzero.runtime.checkpoint.json_state import capture_rng, to_json
from dayzero.runtime.checkpoint.lineage import RunLineage, history, new_lineage_id, target_copy, write_order
from dayzero.runtime.checkpoint.loading import Resumed, load_version
from dayzero.runtime.checkpoint.manifest import (
    DEFAULT_CHECKSUM,
    CheckpointError,
    CheckpointManifest,
    ModelInfo,
    Verdict,
    VersionRef,
    check_algorithm,
)
from dayzero.runtime.checkpoint.rank_group import RankGroup
from dayzero.runtime.checkpoint.state_dicts import model_shapes, split_small, train_state_dict
from dayzero.runtime.checkpoint.verification import inspect_version, usable
from dayzero.runtime.checkpoint.version_files import OPTIM_GROUPS, TRAIN_STATE, rng_file
from dayzero.runtime.checkpoint.versions import (
    Version,
    collect_abandoned,
    prepare_partial,
    purge,
    scan,
    select_first,
    select_newest,
    version_name,
)
from dayzero.torch_version import require_torch

__all__ = ["OPTIM_GROUPS", "TRAIN_STATE", "Checkpointer", "Resumed", "SavedCheckpoint", "rng_file"]
log = logging.getLogger("dayzero.checkpoint")


@dataclass(frozen=True)
class SavedCheckpoint:
    step: int
    path: Path
    bytes: int
    seconds: float  # whole save, from the call to the COMPLETE marker
    blocked_s: float  # how long save() held up the training loop
    lineage: str = ""
    backup: Path | None = None  # where a version already there was moved (save_state(backup_existing=True))


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
        self.group = RankGroup()
        self.rank, self.world, self.pg = self.group.rank, self.group.world, self.group.pg
        self._lock = DirLock(self.root) if self.rank == 0 else None
        self.lineage = RunLineage(self._open())
        self._saving_step = -1
        self._plan_key = f"dayzero-{uuid.uuid4().hex}"  # this checkpointer's cached DCP save plans
        self._writer = HookedWriter(self.root, before_write=self._hook, checksum=self.checksum,
                                    thread_count=thread_count, sync_files=True)
        self._async = AsyncSaves(overlap_staging) if async_save else None
        self._purger: threading.Thread | None = None

    # -- save ----------------------------------------------------------------------------------
    def save(self, step: int, model, optimizer=None, *, scheduler=None, data: Any = None,
             extra: dict | None = None) -> SavedCheckpoint | float:
        """Save step ``step``. Returns the SavedCheckpoint (sync), or the seconds the call blocked
        (async; :meth:`wait` returns the SavedCheckpoint)."""
        t0 = time.perf_counter()
        self.wait()
        if self._async is not None:
            self._async.guard(optimizer)
        state, _ = train_state_dict(model, optimizer)
        # hyperparameters (lr, betas, ...) and scalar state (step) per parameter name go to JSON:
        # thousands of tiny DCP entries would each cost a torch.save, and JSON needs no unpickling
        state["optim"], hyper = split_small(state["optim"])
        contents = ["model"] + (["optimizer"] if optimizer is not None else []) + (
            ["scheduler"] if scheduler is not None else []) + (["data"] if data is not None else []) + ["rng"]
        own = {rng_file(self.rank): json.dumps({"rank": self.rank, "world": self.world, "rng": capture_rng()})}
        if self.rank == 0:
            own[TRAIN_STATE] = json.dumps(to_json({
                "step": step, "data": data, "extra": extra or {},
                "scheduler": scheduler.state_dict() if scheduler is not None else None}, "train state"))
        return self._save(step, state, own, contents, t0,
                          to_json(hyper, "optimizer") if optimizer is not None else None)

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
        return self.group.broadcast(scan(self.root) if self.rank == 0 else None)

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
        head = self.group.broadcast(head)  # the empty partial directory exists before anyone writes into it
        if head[0] == "error":
            raise CheckpointError(f"saving step {step} under {self.root} failed ({head[1]}); the previous "
                                  "checkpoint stays the newest")
        partial = self.root / head[1]
        self._saving_step, self.lineage.settled = step, True
        ctx = dict(step=step, partial=partial, contents=contents, own=own, groups=groups, t0=t0,
                   backup_existing=backup_existing)
        if self._async is None:
            with single_process(self.pg is None), dcp_errors(f"saving step {step} to {partial}"):
                dcp.save(state, checkpoint_id=partial, storage_writer=self._writer, process_group=self.pg,
                         no_dist=self.pg is None, planner=CachingSavePlanner(self._plan_key))
            return self._commit(**ctx, blocked_s=None)
        with single_process(self.pg is None), dcp_errors(f"saving step {step} to {partial}"):
            resp = dcp.async_save(state, checkpoint_id=partial, storage_writer=self._writer, process_group=self.pg,
                                  planner=CachingSavePlanner(self._plan_key),
                                  async_stager=self._async.stager, no_dist=self.pg is None)
        blocked = time.perf_counter() - t0

        def finish(upload: Future) -> SavedCheckpoint:
            with dcp_errors(f"saving step {step} to {partial}"):
                upload.result()
            return self._commit(**ctx, blocked_s=blocked)

        self._async.started(resp, finish)
        return blocked

    def staged(self) -> float:
        """Block until the state of the in-flight async save has been copied out (seconds waited).
        Runs automatically before every ``optimizer.step()`` of a saved optimizer."""
        return 0.0 if self._async is None else self._async.staged()

    def in_flight(self) -> bool:
        """Whether an async save is still being written or committed (any thread may ask)."""
        return self._async is not None and self._async.in_flight()

    def wait(self) -> SavedCheckpoint | None:
        """Block until the in-flight async save is committed; re-raise its failure."""
        return None if self._async is None else self._async.wait()

    def close(self, wait: bool = True) -> None:
        try:
            if wait:
                self.wait()
        finally:
            self._purge_join()
            if self._async is not None:
                self._async.close(wait)
            forget_plans(self._plan_key)
            if self._lock is not None:
                self._lock.release()

    def _open(self) -> str:
        """Rank 0 takes the lock and mints a lineage id; every rank gets the same answer."""
        head: tuple = ("ok", "")
        if self.rank == 0:
            try:
                self._lock.acquire()
                # under the lock, before any save of this job: what an interrupted save or deletion left
                for path, size in collect_abandoned(self.root):
                    self._event({"event": "checkpoint_abandoned_removed", "path": str(path), "bytes": size})
                head = ("ok", new_lineage_id())
            except CheckpointError as e:
                head = ("error", str(e))
        head = self.group.broadcast(head)
        if head[0] == "error":
            raise CheckpointLocked(head[1])
        return head[1]

    def _purge_join(self) -> None:
        if self._purger is not None:
            self._purger.join()
            self._purger = None

    def _hook(self) -> None:
        if self._before_shard_write is not None:
            self._before_shard_write(self._saving_step)

    def _commit(self, step: int, partial: Path, contents: list[str], own: dict[str, str], groups: dict | None,
                t0: float, backup_existing: bool, blocked_s: float | None) -> SavedCheckpoint:
        """The commit protocol (:mod:`dayzero.runtime.checkpoint.commit`): every rank describes its
        files, rank 0 writes the manifest, verifies and commits; the outcome is every rank's."""
        gathered = self.group.gather(own_entries(partial, own, groups, self.rank, self._writer, self.checksum))
        result: tuple = ("error", "")
        if self.rank == 0:
            try:
                result = write_and_commit(self.root, step, partial, contents, gathered, model=self.model,
                                          layout=self.layout, world=self.world, lineage=self.lineage, keep=self.keep,
                                          prune_other_lineages=self.prune_other_lineages, checksum=self.checksum,
                                          backup_existing=backup_existing)
            except Exception as e:  # reported on every rank below, never left hanging
                result = ("error", f"{type(e).__name__}: {e}")
        result = self.group.broadcast(result)
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
            chosen, skipped = select_newest(versions, lambda v: usable(self.group, v, self.model, want))
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
        chosen, skipped = select_first(ordered, lambda v: usable(self.group, v, self.model, want))
        self._report(skipped)
        if chosen is None:
            raise CheckpointError(f"no checkpoint of this run under {self.root} passes verification (skipped: "
                                  + ", ".join(v.path.name for v in skipped) + ")")
        r = self.load(chosen.path, model, optimizer, scheduler, manifest=chosen.manifest, skipped=skipped)
        self.lineage.parent = _ref_of(chosen, self.root)
        return r

    def verify(self, version: Version) -> Verdict:
        """Full check of one version, checksum work split across ranks; same answer on all ranks."""
        return inspect_version(self.group, version, self.model, None)[0]

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
        verdict, unfit = inspect_version(self.group, version, self.model, want)
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
        return load_version(self.group, path, model, optimizer, scheduler, built=self.model, manifest=manifest,
                            skipped=skipped, warn=self._warn, event=self._event)

    # -- helpers -------------------------------------------------------------------------------
    def _event(self, ev: dict) -> None:
        if self.rank == 0 and self._on_event is not None:
            self._on_event(ev)

    def _warn(self, msg: str) -> None:
        if self.rank == 0:  # "dayzero:" marks a line for a person: the rank log forwards it to the terminal
            log.warning("dayzero: warning: %s", msg)


def _ref_of(verdict: Verdict, root: Path) -> VersionRef:
    """A reference to a verified version: by name inside ``root``, by absolute path outside it."""
    m, path = verdict.manifest, verdict.path
    inside = path.parent.resolve() == Path(root).resolve()
    return VersionRef(name=path.name if inside else str(path.resolve()), lineage=m.lineage, seq=m.seq, step=m.step)
