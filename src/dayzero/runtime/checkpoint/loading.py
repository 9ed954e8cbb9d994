"""Load one version into a model (any layout), its optimizer and LR scheduler, on every rank.

Loading goes through ``get_state_dict``/``set_state_dict``, so a checkpoint saved at one layout
loads into another (reshard on load); the optimizer's small state comes from JSON, the RNG streams
from the saving rank's file (round-robin when the world size changed).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import torch.distributed.checkpoint as dcp

from dayzero.runtime.checkpoint.dcp_io import SafeLoadPlanner, SafeReader, dcp_errors, single_process
from dayzero.runtime.checkpoint.manifest import (
    CheckpointError,
    CheckpointManifest,
    ModelInfo,
    Verdict,
    read_manifest,
    safe_join,
)
from dayzero.runtime.checkpoint.rank_group import RankGroup
from dayzero.runtime.checkpoint.side_files import (
    check_optimizer_values,
    load_rng,
    load_scheduler,
    read_json_file,
    read_train_state,
)
from dayzero.runtime.checkpoint.state_dicts import set_train_state, take_saved, train_state_dict
from dayzero.runtime.checkpoint.version_files import OPTIM_GROUPS, TRAIN_STATE, rng_file


@dataclass(frozen=True)
class Resumed:
    step: int
    path: Path
    data: Any  # the data-stream position given to save()
    extra: dict  # loop extras given to save() (loss-guard state, skipped batches, ...)
    manifest: CheckpointManifest
    skipped: tuple[Verdict, ...] = ()


def load_version(group: RankGroup, path: str | Path, model, optimizer=None, scheduler=None, *, built: ModelInfo,
                 manifest: CheckpointManifest | None = None, skipped: Sequence[Verdict] = (),
                 warn: Callable[[str], None] = lambda _: None,
                 event: Callable[[dict], None] = lambda _: None) -> Resumed:
    """Load the version at ``path``; ``built`` is the model this run builds (a checkpoint of
    another spec is refused)."""
    path = Path(path)
    manifest = manifest or read_manifest(path)
    want, have = built.spec_digest, manifest.model.spec_digest
    if want and have and want != have:
        raise CheckpointError(f"{path} was saved for model {manifest.model.name or '?'} (spec {have}), this run "
                              f"builds {built.name or '?'} (spec {want}); use the same model or a new --ckpt-dir")
    use_optim = optimizer if "optimizer" in manifest.contents else None
    if optimizer is not None and use_optim is None:
        warn(f"{path.name} holds no optimizer state (model-only, e.g. imported); optimizer starts fresh")
    state, keys = train_state_dict(model, use_optim)
    small: dict = {}
    if use_optim is None:
        state.pop("optim")
    else:
        saved = read_json_file(path, OPTIM_GROUPS)
        if not isinstance(saved, dict):
            raise CheckpointError(f"{path / OPTIM_GROUPS}: is a {type(saved).__name__}, not an object")
        current = dict(state["optim"])
        state["optim"], small, missing = take_saved(state["optim"], saved)
        check_optimizer_values(small, current, path / OPTIM_GROUPS)
        if missing:
            raise CheckpointError(f"{path}: no optimizer settings for {missing[0]} (and {len(missing) - 1} more); "
                                  "the optimizer differs from the one saved")
    with single_process(group.pg is None), dcp_errors(f"loading {path}"):
        dcp.load(state, storage_reader=SafeReader(path, {f.path for f in manifest.files}),
                 planner=SafeLoadPlanner(), process_group=group.pg, no_dist=group.pg is None)
    if use_optim is not None:
        state["optim"].update(small)
    set_train_state(model, use_optim, state, keys)
    ts = read_train_state(path, manifest, TRAIN_STATE)
    if scheduler is not None and ts.scheduler is not None:
        load_scheduler(scheduler, fit_scheduler_state(ts.scheduler, scheduler), path / TRAIN_STATE)
    # Same world: each rank gets its own streams back (bitwise resume). Resharded: streams are
    # reassigned round-robin, as saved ranks and new ranks no longer correspond.
    src = group.rank if manifest.world == group.world else group.rank % manifest.world
    rng_path = safe_join(path, rng_file(src))
    if rng_path.exists():
        load_rng(path, rng_file(src))
    event({"event": "checkpoint_loaded", "step": ts.step, "path": str(path),
           "saved_world": manifest.world, "world": group.world})
    return Resumed(ts.step, path, ts.data, ts.extra, manifest, tuple(skipped))


def fit_scheduler_state(saved: dict, scheduler) -> dict:
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
