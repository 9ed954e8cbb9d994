"""Rows of a published-runs file (columns of the shipped ``published_runs_dev.csv``) as planner
inputs: model spec, cluster, parallel layout and options, and the measured tokens/s per device.

Reading the sources' conventions (see the data README):

* layout: ``tp pp dp cp ep etp vp`` as published; blank means 1 (``dp``: devices / (tp pp cp));
  ``fsdp`` (Megatron/NeMo: a shard degree, MaxText: the FSDP axis) or an llm-foundry sharding
  strategy selects ZeRO-3 (FULL_SHARD, Megatron FSDP, MaxText) or ZeRO-2 (SHARD_GRAD_OP); other
  Megatron-family rows use the distributed optimizer (ZeRO-1). Sequence parallelism is on with
  tp > 1 (the NeMo/Megatron-Bridge recipes' default), TP communication overlap is on for
  Megatron-family sources (their performance recipes enable it), routing is force-balanced
  (imbalance 1.0, per the data README).
* precision: FP8 in any scaling recipe (per-tensor, current, block, MXFP8) runs GEMMs at the FP8
  peak, NVFP4 at the FP4 peak, everything else BF16.
* measured value: ``tokens_per_sec_per_gpu``, else ``tokens_per_sec_total`` / devices, else
  gbs x seq / ``step_time_s`` / devices.
* model: see ``data/published_models.json`` (presets, published configs, or the row's columns
  with a family's defaults); the row's ``layers`` replaces the preset's depth for proxy models.
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
from dataclasses import dataclass, replace
from functools import lru_cache
from importlib import resources
from pathlib import Path

from dayzero.errors import ConfigError, DayzeroError
from dayzero.inputs import read_text
from dayzero.planner.comm import CommOptions
from dayzero.planner.perf import PerfOptions
from dayzero.specs.cluster import Cluster, build_cluster
from dayzero.specs.hardware import resolve_accelerator
from dayzero.specs.hf_config import spec_from_hf_config
from dayzero.specs.model import ModelSpec
from dayzero.specs.parallel import ParallelConfig, even_split, even_split_fills
from dayzero.specs.presets import reference_data
from dayzero.specs.registry import load_model

REQUIRED_COLUMNS = ("id", "model", "accelerator", "num_accelerators", "tp", "pp", "mbs", "gbs", "seq_len", "precision")


@dataclass(frozen=True)
class Case:
    """One predictable row."""

    id: str
    source: str
    spec: ModelSpec
    cluster: Cluster
    parallel: ParallelConfig
    options: PerfOptions
    published: float  # tokens/s per device
    full_layout: bool  # the row states tp and pp (a layout experts picked, not only a sharding strategy)

    @property
    def gemm_precision(self) -> str:
        """bf16 | fp8 | fp4: the layout's precision."""
        return self.parallel.precision


@dataclass(frozen=True)
class Skip:
    id: str
    reason: str


@lru_cache(maxsize=1)
def model_table() -> list[dict]:
    path = resources.files("dayzero.planner") / "data" / "published_models.json"
    return json.loads(path.read_text())["models"]


def default_runs() -> Path:
    """The shipped published-runs file (448 measured training runs; sources in presets/data/README.md)."""
    return reference_data("published_runs_dev.csv")


def read_rows(path: str | Path | None = None) -> list[dict]:
    """The rows of a published-runs CSV (the shipped one when ``path`` is None)."""
    p = default_runs() if path is None else Path(path)
    text = read_text(p, "pass a CSV with the columns of published_runs_dev.csv")
    try:
        rows = list(csv.DictReader(io.StringIO(text, newline="")))
    except csv.Error as e:
        raise ConfigError(str(p), None, f"malformed CSV: {e}") from None
    if not rows:
        raise ConfigError(str(p), None, "no rows; expected a header and one row per published run")
    missing = [c for c in REQUIRED_COLUMNS if c not in rows[0]]
    if missing:
        raise ConfigError(str(p), missing[0], f"column missing; required: {', '.join(REQUIRED_COLUMNS)}")
    return rows


def _int(row: dict, key: str, default: int | None = None, strict: bool = True) -> int | None:
    """A positive whole-number column (``4``, ``8k`` = 8192, ``1m``); blank -> ``default``. Any other
    text is the row's skip reason (``strict``; lenient columns such as ``fsdp`` may hold words)."""
    v = (row.get(key) or "").strip()
    if not v:
        return default
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([kKmM]?)", v)
    x = float(m.group(1)) * {"": 1, "k": 1024, "m": 2**20}[m.group(2).lower()] if m else None
    if x is None or not x.is_integer() or x < 1:
        if strict:
            raise DayzeroError(f"{key} {v!r} is not a positive whole number")
        return default
    return int(x)


def _float(row: dict, key: str) -> float | None:
    try:
        v = float((row.get(key) or "").strip())
    except ValueError:
        return None
    return v if math.isfinite(v) and v > 0 else None


def precision_of(text: str) -> str:
    t = text.lower()
    if "fp4" in t:
        return "fp4"
    if "fp8" in t:
        return "fp8"
    return "bf16"


def published_tokens_per_device(row: dict, devices: int) -> float | None:
    v = _float(row, "tokens_per_sec_per_gpu")
    if v:
        return v
    v = _float(row, "tokens_per_sec_total")
    if v:
        return v / devices
    step, gbs, seq = _float(row, "step_time_s"), _int(row, "gbs"), _int(row, "seq_len")
    if step and gbs and seq:
        return gbs * seq / step / devices
    return None


def model_entry(row: dict) -> dict:
    """The first entry of the published-model table whose pattern matches the row's model."""
    name = row["model"].strip()
    for entry in model_table():
        if re.search(entry["pattern"], name):
            return entry
    return {}


def model_for(row: dict) -> ModelSpec:
    """The row's architecture; DayzeroError with the reason when it cannot be known."""
    name = row["model"].strip()
    for entry in model_table():
        if not re.search(entry["pattern"], name):
            continue
        if "unsupported" in entry:
            raise DayzeroError(entry["unsupported"])
        layers = _int(row, "layers")
        if "preset" in entry:
            spec = load_model(entry["preset"])
        elif "config" in entry:
            spec = spec_from_hf_config(dict(entry["config"]), name=name, source=entry.get("source", name))
        else:
            spec = _from_columns(row, entry)
        if layers and layers != spec.layers:
            spec = spec.shrink(layers=layers)
        return spec
    raise DayzeroError(f"model {name!r} is not in dayzero's published-model table")


def _from_columns(row: dict, entry: dict) -> ModelSpec:
    fam = entry["family"]
    need = ("layers", "hidden_size", "attention_heads", "ffn_hidden_size")
    vals = {k: _int(row, k) for k in need}
    missing = [k for k, v in vals.items() if not v]
    if missing:
        raise DayzeroError(f"architecture incomplete in the row ({', '.join(missing)} blank)")
    vocab = _int(row, "vocab_size") or entry.get("vocab_size")
    if not vocab:
        raise DayzeroError("vocab_size blank and no family default")
    heads = vals["attention_heads"]
    kv = _int(row, "kv_heads") or heads
    if fam == "gpt2":
        cfg = {"model_type": "gpt2", "n_embd": vals["hidden_size"], "n_layer": vals["layers"], "n_head": heads,
               "n_inner": vals["ffn_hidden_size"], "vocab_size": vocab, "n_positions": _int(row, "seq_len") or 2048,
               "tie_word_embeddings": entry.get("tie_word_embeddings", True)}
    else:
        cfg = {"model_type": fam, "hidden_size": vals["hidden_size"], "num_hidden_layers": vals["layers"],
               "num_attention_heads": heads, "num_key_value_heads": kv, "intermediate_size": vals["ffn_hidden_size"],
               "vocab_size": vocab, "max_position_embeddings": _int(row, "seq_len") or 4096}
    return spec_from_hf_config(cfg, name=row["model"].strip(), source=entry.get("source", fam))


def _zero(row: dict) -> int:
    fsdp = (row.get("fsdp") or "").strip().upper()
    if fsdp in ("FULL_SHARD", "HYBRID_SHARD"):
        return 3
    if fsdp == "SHARD_GRAD_OP":
        return 2
    if fsdp.isdigit() and int(fsdp) > 0:
        return 3
    return 1


def _recompute(row: dict) -> str:
    r = (row.get("activation_recompute") or "").strip().lower()
    if r.startswith("full"):
        return "full"
    if r.startswith("selective"):
        return "selective"
    return "none"


def case_of(row: dict) -> Case:
    """Resolve one row; raises DayzeroError with the reason it cannot be predicted."""
    rid = row["id"].strip()
    devices = _int(row, "num_accelerators")
    if not devices:
        raise DayzeroError("num_accelerators blank")
    acc = resolve_accelerator(row["accelerator"])
    if acc is None:
        raise DayzeroError(f"accelerator {row['accelerator']!r} is not in the catalog")
    published = published_tokens_per_device(row, devices)
    if not published:
        raise DayzeroError("no tokens/s, total tokens/s or step time published")
    spec = model_for(row)
    tp, pp, cp = _int(row, "tp", 1), _int(row, "pp", 1), _int(row, "cp", 1)
    defaults = model_entry(row).get("layout_defaults", {})
    ep, etp = _int(row, "ep", 1), _int(row, "etp", 1)
    vpp = _int(row, "vp") or defaults.get("vp", 1)
    mbs, gbs, seq = _int(row, "mbs"), _int(row, "gbs"), _int(row, "seq_len")
    if not (mbs and gbs and seq):
        raise DayzeroError("mbs, gbs or seq_len blank")
    zero = _zero(row)
    framework = (row.get("framework") or "").lower()
    maxtext_fsdp = "maxtext" in framework or "maxtext" in row["model"].lower()
    if devices % (tp * pp * cp):
        raise DayzeroError(f"{devices} devices not divisible by tp*pp*cp = {tp * pp * cp}")
    dp = devices // (tp * pp * cp)  # MaxText rows give dp x fsdp; both are data-parallel here
    stated_dp = _int(row, "dp")
    # DGX Cloud's Grok rows count dp without the expert-parallel ranks (tp*pp*cp*dp*ep = devices)
    if stated_dp and stated_dp not in (dp, dp // max(ep, 1)) and not maxtext_fsdp and not _int(row, "fsdp", strict=False):
        raise DayzeroError(f"dp {stated_dp} disagrees with devices / (tp*pp*cp) = {dp}")
    prec = precision_of(row["precision"])
    cluster = build_cluster(acc, devices)
    vpp = vpp if pp > 1 else 1
    # Megatron counts the embedding and the loss as one layer each when splitting
    # (account_for_embedding/loss_in_pipeline_split): 126 layers fill pp*vp = 128 stages.
    if not even_split_fills(spec.layers, pp * vpp):
        raise DayzeroError(f"{spec.layers} layers cannot fill pp*vp = {pp * vpp} stages")
    split = None if spec.layers % (pp * vpp) == 0 else even_split(spec.layers, pp * vpp)
    parallel = ParallelConfig(tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, etp=etp, vpp=vpp, mbs=mbs, gbs=gbs, seq=seq,
                              zero=zero, recompute=_recompute(row), sequence_parallel=tp > 1,
                              precision=prec, layer_split=split)
    problems = parallel.problems(spec, devices)
    if problems:
        raise DayzeroError("layout inconsistent: " + "; ".join(problems))
    megatron = "megatron" in framework or "nemo" in framework or ("nemo" in row.get("source", "").lower())
    # Megatron-Bridge overlaps the EP all-to-all with another micro-batch's compute in its MXFP8 MoE
    # presets (moe_a2a_overlap=True in scripts/performance/configs/*/..._workload_base_configs.py,
    # *_FP8_MX_* for DeepSeek-V3 and GPT-OSS); its BF16, FP8-CS and NVFP4 presets leave it off
    mxfp8 = "mxfp8" in row["precision"].lower() or "fp8-mx" in row["precision"].lower()
    bridge = "megatron-bridge" in framework and mxfp8
    # llm-foundry's MPT benchmarks (2023) ran FlashAttention-2; Megatron uses cuDNN fused attention,
    # except for learnable softmax sinks (gpt-oss), where Transformer Engine falls back to unfused
    # attention (NVIDIA/TransformerEngine issue #2318, TE 2.8)
    kernel = "flash2" if "foundry" in framework or "mosaic" in row.get("source", "").lower() else "fused"
    if spec.attention.sinks and kernel == "fused":
        kernel = "unfused"
    options = PerfOptions(comm=CommOptions(tp_overlap=megatron, ep_overlap=bridge), attention_kernel=kernel)
    return Case(id=rid, source=row.get("source", "").strip(), spec=spec, cluster=cluster, parallel=parallel,
                options=options, published=published,
                full_layout=bool((row.get("tp") or "").strip() and (row.get("pp") or "").strip()))


def load_cases(path: str | Path | None = None) -> tuple[list[Case], list[Skip]]:
    cases, skips = [], []
    for row in read_rows(path):
        try:
            cases.append(case_of(row))
        except DayzeroError as e:
            skips.append(Skip(row.get("id", "?").strip(), str(e)))
    return cases, skips


def with_constants(case: Case, constants) -> Case:
    return replace(case, options=replace(case.options, constants=constants))
