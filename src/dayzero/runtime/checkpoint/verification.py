"""Verify one version on every rank: rank 0 reads the manifest and DCP's index, every rank hashes
its share of the files (file i on rank i mod world) and, given its model's tensor shapes, checks
them against the saved ones; every rank gets the same verdict."""

from __future__ import annotations

from dataclasses import replace

from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from dayzero.runtime.checkpoint.dcp_io import load_metadata
from dayzero.runtime.checkpoint.manifest import (
    CheckpointError,
    CheckpointManifest,
    ModelInfo,
    Verdict,
    check_file,
    check_marker,
    read_manifest,
)
from dayzero.runtime.checkpoint.rank_group import RankGroup
from dayzero.runtime.checkpoint.state_dicts import fit_problems
from dayzero.runtime.checkpoint.versions import Version


def inspect_version(group: RankGroup, version: Version, model: ModelInfo,
                    want: dict | None) -> tuple[Verdict, list[str]]:
    """(integrity verdict, reasons it does not fit this run): ``model`` is what this run builds,
    ``want`` its model's tensor shapes (None: integrity only)."""
    head: tuple = ((), None, {}, [])
    if group.rank == 0:
        problems = check_marker(version.path)
        try:
            manifest = read_manifest(version.path)
            md = load_metadata(version.path, {f.path for f in manifest.files})
            saved = {k[len("model."):]: tuple(m.size) for k, m in md.state_dict_metadata.items()
                     if k.startswith("model.") and isinstance(m, TensorStorageMetadata)}
            have, mine = manifest.model.spec_digest, model.spec_digest
            unfit = [f"saved for model {manifest.model.name or '?'} (spec {have}), this run builds "
                     f"{model.name or '?'} (spec {mine})"] if have and mine and have != mine else []
            head = (tuple(problems), manifest.model_dump(), saved, unfit)
        except CheckpointError as e:
            head = (tuple(problems) + (str(e),), None, {}, [])
    problems, raw, saved, unfit = group.broadcast(head)
    if raw is None:
        return Verdict(version.path, None, problems), []
    manifest = CheckpointManifest.model_validate(raw)
    mine = [f for i, f in enumerate(manifest.files) if i % group.world == group.rank]
    local = [p for f in mine if (p := check_file(version.path, f, checksum=True))]
    fits = fit_problems(want, saved) if want is not None and not unfit else []
    gathered = group.all_gather((local, fits))
    found = sorted(p for ps, _ in gathered for p in ps)
    unfit = unfit or sorted({p for _, ps in gathered for p in ps})
    return Verdict(version.path, manifest, tuple(problems) + tuple(found)), unfit


def usable(group: RankGroup, version: Version, model: ModelInfo, want: dict) -> Verdict:
    """The verdict resuming goes by: intact, and fits this run (else the reasons it does not)."""
    verdict, unfit = inspect_version(group, version, model, want)
    return verdict if not verdict.ok or not unfit else replace(verdict, problems=tuple(unfit))
