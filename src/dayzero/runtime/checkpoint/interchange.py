"""Interchange with Hugging Face: consolidated safetensors out of a checkpoint, and back in.

Export reads a verified checkpoint version in one process, whatever layout wrote it, and writes
the model weights as ``model.safetensors`` (or ``model-0000i-of-0000n.safetensors`` shards plus
``model.safetensors.index.json``, the Hugging Face layout). When the manifest records how to
rebuild the model (``model.recipe``, written by ``dayzero train``) and its family is one the zoo
maps (:data:`dayzero.runtime.checkpoint.hf_weights.FAMILIES`), tensors get their Hugging Face names (stacked
experts are split per expert) and, for a model that is not a shrunk proxy, its ``config.json`` is
written too: ``transformers`` and ``dayzero train --hf-weights`` read the result. Otherwise the
zoo's own names are kept. Export streams: each output file's tensors are loaded from the DCP
shards, written and freed before the next, so host memory stays near one output file.

Import reads safetensors only (``.bin`` files are pickles and are refused) and writes a model-only
checkpoint version that any layout resumes from (the optimizer starts fresh). With a model
(``--model``, or the directory's ``config.json``) Hugging Face names are mapped to the zoo's.
An import never replaces or deletes a version (``--force`` moves the one in its way to a backup).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from dayzero.runtime.checkpoint.checkpointer import Checkpointer
from dayzero.runtime.checkpoint.dcp_io import SafeLoadPlanner, SafeReader, load_metadata, single_process
from dayzero.runtime.checkpoint.hf_weights import EXPERT_NAMES
from dayzero.runtime.checkpoint.manifest import (
    CheckpointError,
    default_file_mode,
    manifest_digest,
    verify_version,
    write_json_durable,
)
from dayzero.runtime.checkpoint.versions import version_name
from dayzero.specs.model import SHRINK_KEYS

INDEX = "model.safetensors.index.json"
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
_EXPERTS = re.compile(r"layers\.(\d+)\.moe\.experts\.(w[123])")


@dataclass(frozen=True)
class ExportResult:
    out_dir: Path
    files: tuple[str, ...]
    tensors: int
    bytes: int
    step: int
    names: str  # "hf" or "native"


def export_hf(version_dir: str | Path, out_dir: str | Path, *, dtype: str | None = None,
              max_shard_bytes: int = 5 * 2**30, names: str = "hf") -> ExportResult:
    """Write the model weights of one checkpoint version as safetensors (see the module doc)."""
    from safetensors.torch import save_file

    version_dir, out_dir = Path(version_dir), Path(out_dir)
    if names not in ("hf", "native"):
        raise CheckpointError(f"--names {names!r}: expected hf or native")
    verdict = verify_version(version_dir)
    if not verdict.ok:
        raise CheckpointError(f"{version_dir} failed verification, not exporting: {verdict.summary()}")
    manifest = verdict.manifest
    cast = _dtype(dtype)
    files = {f.path for f in manifest.files}
    md = load_metadata(version_dir, files)
    tensors = [(key[len("model."):], meta) for key, meta in md.state_dict_metadata.items()
               if key.startswith("model.") and isinstance(meta, TensorStorageMetadata)]
    if not tensors:
        raise CheckpointError(f"{version_dir} holds no model tensors")
    spec = _recipe_spec(manifest) if names == "hf" else None
    rename = _hf_renamer(spec) if spec is not None else None

    def nbytes(meta) -> int:
        numel = 1
        for s in meta.size:
            numel *= s
        return numel * torch.empty((), dtype=cast or meta.properties.dtype).element_size()

    groups: list[list] = [[]]
    size = 0
    for name, meta in tensors:
        if groups[-1] and size + nbytes(meta) > max_shard_bytes:
            groups.append([])
            size = 0
        groups[-1].append((name, meta))
        size += nbytes(meta)
    out_dir.mkdir(parents=True, exist_ok=True)
    n = len(groups)
    fnames = ["model.safetensors"] if n == 1 else [f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)]
    weight_map, total = {}, 0
    for fname, group in zip(fnames, groups):
        shard = {name: torch.empty(tuple(meta.size), dtype=meta.properties.dtype) for name, meta in group}
        with single_process(True):
            dcp.load({"model": shard}, storage_reader=SafeReader(version_dir, files), planner=SafeLoadPlanner(),
                     no_dist=True)
        out = {}
        for name, t in shard.items():
            for hf, piece in (rename(name, t) if rename else [(name, t)]):
                if hf in weight_map:
                    raise CheckpointError(f"two tensors map to the same exported name {hf!r}")
                out[hf] = (piece.to(cast) if cast is not None else piece).contiguous()
                weight_map[hf] = fname
                total += out[hf].numel() * out[hf].element_size()
        save_file(out, str(out_dir / fname), metadata={"format": "pt"})
        os.chmod(out_dir / fname, default_file_mode())  # save_file creates the file 0600
        del shard, out
    if n > 1:
        write_json_durable(out_dir / INDEX, json.dumps({"metadata": {"total_size": total},
                                                         "weight_map": weight_map}, indent=1) + "\n")
    config = _hf_config(manifest.model.recipe) if spec is not None else None
    if config is not None:
        write_json_durable(out_dir / "config.json", json.dumps(config, indent=1) + "\n")
    write_json_durable(out_dir / "dayzero_export.json", json.dumps({
        "source": str(version_dir.resolve()), "step": manifest.step, "manifest_sha256": manifest_digest(version_dir),
        "model": manifest.model.model_dump(), "layout": manifest.layout, "dtype": dtype or "as saved",
        "names": "hf" if rename else "native"}, indent=1) + "\n")
    return ExportResult(out_dir, tuple(fnames), len(weight_map), total, manifest.step, "hf" if rename else "native")


def import_hf(hf_dir: str | Path, ckpt_root: str | Path, *, step: int = 0, dtype: str | None = None,
              model: str | None = None, keep: int = 3, force: bool = False,
              on_event: Callable[[dict], None] | None = None) -> Path:
    """Write the safetensors weights under ``hf_dir`` as a model-only checkpoint version.

    ``model`` (a preset or config path; default: ``hf_dir/config.json`` when present) maps Hugging
    Face names to the zoo's, and is recorded so that ``dayzero train MODEL --ckpt-dir`` resumes.

    The version starts a lineage of its own, so retention deletes nothing else. It never replaces
    a version: when ``ckpt_root`` already holds step ``step`` the import is refused before any
    work, unless ``force``, which moves the version named ``step-N`` to a backup once the new one
    is written (a ``checkpoint_backup`` event names it). Holds the directory's lock throughout."""
    hf_dir = Path(hf_dir)
    shards = _hf_files(hf_dir)
    cast = _dtype(dtype)
    if model is None and (hf_dir / "config.json").exists():
        model = str(hf_dir.resolve())
    spec = None
    if model is not None:
        from dayzero.runtime.checkpoint.hf_weights import FAMILIES
        from dayzero.specs.registry import load_model

        spec = load_model(model)
        if spec.model_type not in FAMILIES:
            raise CheckpointError(f"{model}: model_type {spec.model_type!r} has no Hugging Face name mapping "
                                  f"({', '.join(FAMILIES)}); import without --model to keep the file's names")
    ck = Checkpointer(ckpt_root, keep=keep, model_name=spec.name if spec else "",
                      spec_digest=spec.digest() if spec else "", model_recipe={"model": model} if spec else {},
                      on_event=on_event)
    try:
        if ck.world != 1:
            raise CheckpointError("dayzero ckpt import runs in one process; do not launch it under torchrun")
        there = [v for v in ck.versions() if v.step == step and v.state in ("complete", "incomplete")]
        if there and not force:
            raise CheckpointError(f"{ckpt_root} already holds step {step} ({', '.join(v.name for v in there)}); "
                                  "import never replaces a version: choose another --step, or pass --force to "
                                  f"import anyway ({ck.root / version_name(step)} is first moved to a backup)")
        tensors = _hf_tensors(hf_dir, shards, spec, cast)
        saved = ck.save_state(step, {"model": tensors}, contents=["model"],
                              extra={"imported_from": str(hf_dir.resolve())}, backup_existing=force)
    finally:
        ck.close()
    return saved.path


def _hf_tensors(hf_dir: Path, shards: list[Path], spec, cast: torch.dtype | None) -> dict[str, torch.Tensor]:
    """The tensors to import: under the zoo's names for ``spec``, else as the files name them."""
    from dayzero.runtime.checkpoint.hf_weights import open_safetensors, read_tensor

    tensors: dict[str, torch.Tensor] = {}
    if spec is not None:
        from dayzero.runtime.checkpoint.hf_weights import HFCheckpoint
        from dayzero.runtime.models.model import build_model

        hf = HFCheckpoint(hf_dir, spec)
        zoo = build_model(spec)  # meta device: names and shapes only
        for fqn, p in zoo.state_dict().items():  # parameters and persistent buffers
            tensors[fqn] = hf.tensor(fqn, tuple(p.shape)).to(cast or torch.float32)
    else:
        for f in shards:
            with open_safetensors(f) as fh:
                for key in fh.keys():
                    if key in tensors:
                        raise CheckpointError(f"{f.name}: tensor {key!r} appears in two files")
                    t = read_tensor(fh, f, key)
                    tensors[key] = t.to(cast) if cast is not None else t
    if not tensors:
        raise CheckpointError(f"{hf_dir}: the safetensors files hold no tensors")
    return tensors


def _recipe_spec(manifest):
    """The ModelSpec of the run that wrote ``manifest`` (None when it is not recorded or its
    family has no HF name mapping); its digest must match the manifest's."""
    recipe = manifest.model.recipe
    if not recipe.get("model"):
        return None
    from dayzero.runtime.checkpoint.hf_weights import FAMILIES
    from dayzero.runtime.config import ModelSection

    spec = ModelSection.from_recipe(recipe).spec()
    if manifest.model.spec_digest and spec.digest() != manifest.model.spec_digest:
        raise CheckpointError(f"the checkpoint was written for {manifest.model.name} (spec "
                              f"{manifest.model.spec_digest}) "
                              f"but {recipe['model']} now describes spec {spec.digest()}; export with --names native")
    return spec if spec.model_type in FAMILIES else None


def _hf_renamer(spec) -> Callable[[str, torch.Tensor], list[tuple[str, torch.Tensor]]]:
    from dayzero.runtime.checkpoint.hf_weights import hf_sources

    mla_q_lora = spec.attention.q_lora_rank is not None

    def rename(fqn: str, t: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
        m = _EXPERTS.fullmatch(fqn)
        if m:  # (E, out, in) stacked in the zoo -> one tensor per expert
            layer, w = m.groups()
            return [(f"model.layers.{layer}.mlp.experts.{e}.{EXPERT_NAMES[w][0]}.weight",
                     t[e]) for e in range(t.shape[0])]
        names = hf_sources(fqn, mla_q_lora)
        return [(names[0] if names else fqn, t)]

    return rename


def _hf_config(recipe: dict) -> dict | None:
    """config.json of an unshrunk preset or config file; None for proxies (no HF config matches)."""
    if any(recipe.get(k) is not None for k in SHRINK_KEYS):
        return None
    from dayzero.specs.hf_config import load_config_file
    from dayzero.specs.registry import model_presets

    model = recipe["model"]
    if Path(model).exists():
        return load_config_file(model)[0]
    cfg = model_presets().get(model)
    return None if cfg is None else {k: v for k, v in cfg.items() if not k.startswith("_")}


def _hf_files(hf_dir: Path) -> list[Path]:
    if not hf_dir.is_dir():
        raise CheckpointError(f"{hf_dir}: not a directory; pass the folder holding model*.safetensors")
    index = hf_dir / INDEX
    if index.exists():
        try:
            from dayzero.inputs import read_text

            weight_map = json.loads(read_text(index))["weight_map"]
        except (ValueError, KeyError, TypeError) as e:
            raise CheckpointError(f"{index}: unreadable index ({e})") from None
        names = sorted(set(weight_map.values()))
        for n in names:
            if "/" in n or "\\" in n or n in ("", ".", ".."):
                raise CheckpointError(f"{index}: file name {n!r} leaves the model directory")
        files = [hf_dir / n for n in names]
        missing = [f.name for f in files if not f.exists()]
        if missing:
            raise CheckpointError(f"{index} names missing files: {', '.join(missing[:3])}")
        return files
    files = sorted(hf_dir.glob("*.safetensors"))
    if files:
        return files
    if list(hf_dir.glob("*.bin")) or list(hf_dir.glob("*.pt")):
        raise CheckpointError(f"{hf_dir}: only pickle weights (.bin/.pt) found; dayzero imports safetensors only "
                              "(pickles can run code): convert them with a trusted tool first")
    raise CheckpointError(f"{hf_dir}: no *.safetensors files")


def _dtype(name: str | None) -> torch.dtype | None:
    if name is None:
        return None
    if name not in DTYPES:
        raise CheckpointError(f"--weights-dtype {name!r}: expected one of {', '.join(DTYPES)}")
    return DTYPES[name]
