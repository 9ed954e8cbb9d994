"""Interchange with Hugging Face: consolidated safetensors out of a checkpoint, and back in.

Export reads a verified checkpoint version in one process, whatever layout wrote it, and writes
the model weights as ``model.safetensors`` (or ``model-0000i-of-0000n.safetensors`` shards plus
``model.safetensors.index.json``, the Hugging Face layout). It streams: each output shard's
tensors are loaded from the DCP shards, written and freed before the next, so host memory stays
near one output shard. Import reads safetensors only (``.bin`` files are pickles and are
refused) and writes a model-only checkpoint version that any layout can resume from (the
optimizer starts fresh).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from dayzero.runtime.checkpoint import Checkpointer
from dayzero.runtime.dcp_io import SafeLoadPlanner, SafeReader, load_metadata, single_process
from dayzero.runtime.manifest import CheckpointError, manifest_digest, verify_version, write_json_durable

INDEX = "model.safetensors.index.json"
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True)
class ExportResult:
    out_dir: Path
    files: tuple[str, ...]
    tensors: int
    bytes: int
    step: int


def export_hf(version_dir: str | Path, out_dir: str | Path, *, dtype: str | None = None,
              max_shard_bytes: int = 5 * 2**30, rename: Callable[[str], str] | None = None,
              config: dict | None = None) -> ExportResult:
    """Write the model weights of one checkpoint version as Hugging Face safetensors."""
    from safetensors.torch import save_file

    version_dir, out_dir = Path(version_dir), Path(out_dir)
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

    def nbytes(meta) -> int:
        numel = 1
        for s in meta.size:
            numel *= s
        return numel * _itemsize(cast or meta.properties.dtype)

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
    names = ["model.safetensors"] if n == 1 else [f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)]
    reader_files = files
    weight_map, total = {}, 0
    for fname, group in zip(names, groups):
        shard = {name: torch.empty(tuple(meta.size), dtype=meta.properties.dtype) for name, meta in group}
        with single_process(True):
            dcp.load({"model": shard}, storage_reader=SafeReader(version_dir, reader_files), planner=SafeLoadPlanner(),
                     no_dist=True)
        out = {}
        for name, t in shard.items():
            hf = rename(name) if rename else name
            if hf in weight_map:
                raise CheckpointError(f"two tensors map to the same exported name {hf!r}")
            out[hf] = t.to(cast) if cast is not None else t
            weight_map[hf] = fname
            total += out[hf].numel() * out[hf].element_size()
        save_file(out, str(out_dir / fname), metadata={"format": "pt"})
        del shard, out
    if n > 1:
        write_json_durable(out_dir / INDEX, json.dumps({"metadata": {"total_size": total},
                                                         "weight_map": weight_map}, indent=1) + "\n")
    if config is not None:
        write_json_durable(out_dir / "config.json", json.dumps(config, indent=1) + "\n")
    write_json_durable(out_dir / "dayzero_export.json", json.dumps({
        "source": str(version_dir.resolve()), "step": manifest.step, "manifest_sha256": manifest_digest(version_dir),
        "model": manifest.model.model_dump(), "layout": manifest.layout, "dtype": dtype or "as saved"}, indent=1) + "\n")
    return ExportResult(out_dir, tuple(names), len(weight_map), total, manifest.step)


def import_hf(hf_dir: str | Path, ckpt_root: str | Path, *, step: int = 0, dtype: str | None = None,
              rename: Callable[[str], str] | None = None, model_name: str = "", spec_digest: str = "",
              keep: int = 3) -> Path:
    """Write the safetensors weights under ``hf_dir`` as a model-only checkpoint version."""
    from safetensors import safe_open

    hf_dir = Path(hf_dir)
    shards = _hf_files(hf_dir)
    cast = _dtype(dtype)
    model: dict[str, torch.Tensor] = {}
    for f in shards:
        with safe_open(str(f), framework="pt") as fh:
            for key in fh.keys():
                name = rename(key) if rename else key
                if name in model:
                    raise CheckpointError(f"{f.name}: tensor {key!r} appears twice (maps to {name!r})")
                t = fh.get_tensor(key)
                model[name] = t.to(cast) if cast is not None else t
    if not model:
        raise CheckpointError(f"{hf_dir}: the safetensors files hold no tensors")
    ck = Checkpointer(ckpt_root, keep=keep, model_name=model_name, spec_digest=spec_digest)
    if ck.world != 1:
        raise CheckpointError("dayzero ckpt import runs in one process; do not launch it under torchrun")
    saved = ck.save_state(step, {"model": model}, contents=["model"],
                          extra={"imported_from": str(hf_dir.resolve())})
    return saved.path


def _hf_files(hf_dir: Path) -> list[Path]:
    if not hf_dir.is_dir():
        raise CheckpointError(f"{hf_dir}: not a directory; pass the folder holding model*.safetensors")
    index = hf_dir / INDEX
    if index.exists():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
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
        raise CheckpointError(f"--dtype {name!r}: expected one of {', '.join(DTYPES)}")
    return DTYPES[name]


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()
