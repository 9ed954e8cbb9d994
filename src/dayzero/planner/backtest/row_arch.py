"""A published row's architecture: a model dayzero knows by name, else the row's own columns.

1. **By name** (:mod:`model_names`): a model preset that names a public model, or a ``models``
   entry of ``data/published_models.json`` (a Hugging Face config for a shape the columns cannot
   express, or a layer type dayzero does not model: the row is skipped and says which). The row's
   ``layers`` replaces the depth (proxy models). Where the row's shape columns (hidden, heads,
   KV heads, FFN, experts, top-k, expert FFN) disagree with the named model, the columns win when
   they are complete: the name was read as a different model than the row ran.
2. **By columns**: ``layers hidden_size attention_heads`` (+ ``ffn_hidden_size`` for dense layers),
   ``kv_heads`` (blank: MHA; MQA/GQA per ``attention_type``), ``vocab_size``, a sliding window
   from ``attention_type`` (``alternating sliding-window 128 / full``), and MoE from ``moe_*``
   (routed experts, top-k, expert FFN, shared experts of ``moe_shared_experts`` x expert FFN, a
   dense prefix when ``arch_source`` or ``notes`` say "first 3 layers dense"). The layer style
   (:data:`STYLES`) and a blank vocabulary come from the family's ``families`` entry; with none,
   the style is what ``attention_type``/``arch_source`` name (SwiGLU, GELU, squared ReLU, ...),
   else GPT-style (non-gated MLP) when ``ffn = 4 x hidden``, Llama-style (gated) otherwise, and
   the vocabulary is :data:`DEFAULT_VOCAB`; a family's ``ffn_hidden_ratio`` fills a blank FFN.
   Each such choice is returned as a note.
"""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

from dayzero.errors import DayzeroError
from dayzero.planner.backtest.csv_values import text, whole
from dayzero.planner.backtest.model_names import (
    Candidate,
    best_match,
    parse_name,
    preset_candidates,
    size_value,
    strip_annotations,
)
from dayzero.specs.counting import params_total
from dayzero.specs.hf_config import MAX_LAYERS, check_size, spec_from_hf_config
from dayzero.specs.model import AttentionSpec, MLPSpec, ModelSpec, MoESpec
from dayzero.specs.registry import load_model

DEFAULT_VOCAB = 32000  # Llama 1/2 and Mistral tokenizers; a blank vocab_size with no family entry
# Brown et al. 2020 (GPT-3), Table 2.1: d_ff = 4 x d_model, head dimension 128 at 13B and 175B;
# Kaplan et al. 2020 (Scaling laws), section 2.1: non-embedding parameters ~ 12 x layers x d_model^2
STANDARD_FFN_RATIO = 4
STANDARD_HEAD_DIM = 128
PARAMS_PER_LAYER_WIDTH2 = 12
PARAMS_WARN = 0.25  # columns whose parameter count is this far from the row's total_params get a note
VOCAB_ROUNDING = 0.01  # a round-thousand vocab_size this close to the named model's is its size written round


class NoArchitecture(DayzeroError):
    """Neither a known name nor complete columns."""


class UnsupportedLayers(DayzeroError):
    """The model has a layer type dayzero does not model."""


@dataclass(frozen=True)
class Style:
    label: str
    norm: str
    gated: bool
    activation: str
    bias: bool  # q/k/v/o and MLP biases
    position: str
    tie: bool


STYLES = {
    "llama": Style("Llama-style (RMSNorm, SwiGLU, RoPE, no biases)", "rmsnorm", True, "silu", False, "rope", False),
    "gpt": Style("GPT-style (LayerNorm, GELU MLP, learned positions, biases, tied embeddings)", "layernorm", False,
                 "gelu", True, "learned", True),
    "relu2": Style("Nemotron-style (LayerNorm, squared-ReLU MLP, RoPE, no biases)", "layernorm", False, "relu2",
                   False, "rope", False),
}
STYLE_HINTS = {"relu2": r"squared[- ]?relu|relu\^?2|relu²",
               "gpt": r"\bgelu\b|layer[- ]?norm|\bgpt-?[23j]?\b|\bmpt\b|\bopt\b|\bbloom\b|gpt-?neox",
               "llama": r"swiglu|geglu|\bglu\b|llama|rms[- ]?norm|\bsilu\b|gated|mistral|mixtral|qwen"}
_UNSUPPORTED = re.compile(r"mamba|\bssm\b|state[- ]space|rwkv|linear[- ]attention|retention|hyena|recurren|xlstm", re.I)
_DENSE_PREFIX = re.compile(r"first\s+(\d+)\s+(?:layers?\s+)?(?:are\s+)?dense|"
                           r"(?<!\d)(\d+)\s+dense\s*(?:layers?)?\s*(?:\+|,|then|followed|and)|"
                           r"first[_ ]k[_ ]dense(?:[_ ]replace)?\s*[=:]?\s*(\d+)", re.I)
_WINDOW = re.compile(r"(?:sliding[- ]?window|\bswa\b|local attention)\D{0,12}?(\d+)", re.I)


@dataclass(frozen=True)
class RowModel:
    spec: ModelSpec
    name: str  # the architecture as reports name it: preset, entry, or the row's name without annotations
    notes: tuple[str, ...] = ()


@lru_cache(maxsize=1)
def table() -> dict:
    return json.loads((resources.files("dayzero.planner.backtest") / "data" / "published_models.json").read_text())


@lru_cache(maxsize=1)
def model_candidates() -> tuple[Candidate, ...]:
    # an entry's ``aliases`` are other names sources give the same model ("Megatron-Turing NLG" for MT-NLG)
    entries = tuple(Candidate(parse_name(n), "unsupported" if "unsupported" in e else "config", e["name"], e)
                    for e in table()["models"] for n in (e["name"], *e.get("aliases", ())))
    return preset_candidates() + entries


@lru_cache(maxsize=1)
def family_candidates() -> tuple[Candidate, ...]:
    return tuple(Candidate(parse_name(e["name"]), "family", e["name"], e) for e in table()["families"])


def model_of(row: dict) -> RowModel:
    """The row's architecture (module docstring); NoArchitecture or UnsupportedLayers when none."""
    name = text(row, "model")
    att = text(row, "attention_type")
    if m := _UNSUPPORTED.search(att):
        raise UnsupportedLayers(f"attention_type {att!r}: {m.group(0)} layers, which a row's columns cannot "
                                "express (no layer pattern or mixer shapes; a name table entry with its config can)")
    match = best_match(name, list(model_candidates()), text(row, "total_params"))
    if match is None:
        spec, notes = from_columns(row)
        return RowModel(spec, spec.name, notes)
    cand = match.candidate
    if cand.kind == "unsupported":
        raise UnsupportedLayers(f"{cand.entry['unsupported']} (model {name!r} read as {cand.target})")
    if cand.kind == "preset":
        spec = load_model(cand.target)
    else:
        spec = spec_from_hf_config(dict(cand.entry["config"]), name=cand.target, source=cand.entry["source"])
    notes = [f"model {name!r} read as {cand.target}: {match.note}"] if match.note else []
    # what the entry or its config approximates (LatentMoE, MTP, ...), stated per row
    notes += ([f"{cand.target}: {cand.entry['notes']}"] if cand.kind == "config" and cand.entry.get("notes") else [])
    notes += [f"{cand.target}: {a}" for a in spec.extra.get("approximations", ())]
    differ = disagreements(spec, row)
    if differ:
        try:
            built, more = from_columns(row)
        except NoArchitecture:
            notes.append(f"the row's {differ} disagree with {cand.target}, but its columns are incomplete: "
                         f"{cand.target} used")
        else:
            return RowModel(built, built.name, (f"the row's {differ} disagree with {cand.target}: built from "
                                                "the columns", *more))
    layers = whole(row, "layers")
    if layers and layers != spec.layers:
        spec = spec.shrink(layers=layers)
    vocab = stated_vocab(row, spec.vocab)
    if vocab and vocab != spec.vocab:
        notes.append(f"vocab_size {vocab} as the row states ({cand.target} has {spec.vocab})")
        spec = dataclasses.replace(spec, vocab=vocab)
    return RowModel(spec, cand.target, tuple(notes))


def stated_vocab(row: dict, named: int) -> int | None:
    """The row's ``vocab_size`` when it states the size the run used; a rounded label (``128K``, or
    a round thousand within :data:`VOCAB_ROUNDING` of the named model's: ``128000`` for Llama 3's
    128256) leaves the named model's. A padded size (``51200`` for GPT-2's 50257) is the run's."""
    if re.search(r"\d\s*[kKmM]\b", text(row, "vocab_size")):
        return None
    v = whole(row, "vocab_size", strict=False)
    if v is None or (v % 1000 == 0 and abs(v - named) <= VOCAB_ROUNDING * named):
        return None
    return v


def disagreements(spec: ModelSpec, row: dict) -> str:
    """The shape columns that contradict ``spec`` ('' when none); vocab and depth are not compared
    (sources round vocabularies, '128K'; proxies cut depth)."""
    a = spec.attention
    checks = [("hidden_size", {spec.hidden}), ("attention_heads", {a.heads})]
    if a.kind == "gqa":
        checks.append(("kv_heads", {a.kv_heads}))
    ffn = {spec.mlp.intermediate}
    if spec.moe is not None:
        ffn.add(spec.moe.expert.intermediate)
        checks += [("moe_num_experts", {spec.moe.experts}), ("moe_top_k", {spec.moe.top_k}),
                   ("moe_expert_ffn", {spec.moe.expert.intermediate})]
    checks.append(("ffn_hidden_size", ffn))
    out = []
    for key, allowed in checks:
        v = whole(row, key, strict=False)
        if v is not None and v not in allowed:
            out.append(f"{key} {v} (vs {'/'.join(str(x) for x in sorted(allowed))})")
    return ", ".join(out)


def from_columns(row: dict) -> tuple[ModelSpec, tuple[str, ...]]:
    """A ModelSpec from the row's architecture columns (module docstring, 2) and the choices made."""
    raw = text(row, "model")
    name = strip_annotations(raw) or "model"
    fam = best_match(raw, list(family_candidates()))
    family = fam.candidate.entry if fam else None
    layers, hidden, heads = (whole(row, k) for k in ("layers", "hidden_size", "attention_heads"))
    ffn = whole(row, "ffn_hidden_size")
    notes = []
    experts = whole(row, "moe_num_experts", strict=False)
    moe = experts is not None and experts > 1
    if not moe:
        layers, hidden = _depth_width(row, layers, hidden, notes)
    ratio = (family or {}).get("ffn_hidden_ratio")
    if not ffn and hidden and ratio:
        ffn = int(ratio * hidden)
        notes.append(f"ffn_hidden_size blank: {ratio} x hidden_size = {ffn} ({fam.candidate.target} family)")
    if not ffn and hidden and not moe:
        ffn = STANDARD_FFN_RATIO * hidden
        notes.append(f"ffn_hidden_size blank: {STANDARD_FFN_RATIO} x hidden_size = {ffn} assumed (the GPT-3 ratio)")
    if hidden and not heads and hidden % STANDARD_HEAD_DIM == 0:
        heads = hidden // STANDARD_HEAD_DIM
        notes.append(f"attention_heads blank: hidden_size / {STANDARD_HEAD_DIM} = {heads} assumed (head "
                     f"dimension {STANDARD_HEAD_DIM}, as GPT-3 175B, Llama and most models above 10B)")
    missing = [k for k, v in (("layers", layers), ("hidden_size", hidden), ("attention_heads", heads)) if not v]
    if not moe and not ffn:
        missing.append("ffn_hidden_size")
    top_k = whole(row, "moe_top_k") if moe else None
    expert_ffn = (whole(row, "moe_expert_ffn") or ffn) if moe else None
    if moe:
        missing += [k for k, v in (("moe_top_k", top_k), ("moe_expert_ffn", expert_ffn)) if not v]
    if missing:
        raise NoArchitecture(f"model {raw!r} is not one dayzero knows (a preset or data/published_models.json) and "
                             f"the row's architecture columns are incomplete ({', '.join(missing)} blank)")
    if layers > MAX_LAYERS:  # the same bound as a config.json's (specs.hf_config)
        raise NoArchitecture(f"layers {layers} exceeds {MAX_LAYERS:,}, more than any model dayzero plans")
    att_text = text(row, "attention_type")
    kv = _kv_heads(row, heads, att_text, notes)
    if hidden % heads or heads % kv:
        raise NoArchitecture(f"hidden_size {hidden}, attention_heads {heads}, kv_heads {kv}: heads must divide the "
                             "width and kv_heads the heads (head_dim is not a column)")
    style_key = family["style"] if family else _style(row, ffn or expert_ffn, hidden, notes)
    st = STYLES[style_key]
    vocab = whole(row, "vocab_size") or (family or {}).get("vocab_size")
    if not vocab:
        vocab = DEFAULT_VOCAB
        notes.append(f"vocab_size blank: {DEFAULT_VOCAB} assumed")
    prefix = 0
    if moe:
        m = _DENSE_PREFIX.search(f"{text(row, 'arch_source')} ; {text(row, 'notes')}")
        prefix = min(int(next(g for g in m.groups() if g)), layers - 1) if m else 0
        if prefix and not ffn:
            raise NoArchitecture(f"{prefix} dense layers stated but ffn_hidden_size blank")
    mlp = MLPSpec(ffn or expert_ffn, gated=st.gated, bias=st.bias, activation=st.activation)
    moe_spec = None
    if moe:
        if top_k > experts:
            raise NoArchitecture(f"moe_top_k {top_k} exceeds moe_num_experts {experts}")
        shared = whole(row, "moe_shared_experts", 0, strict=False) or 0
        moe_spec = MoESpec(experts=experts, top_k=top_k, expert=replace_size(mlp, expert_ffn),
                           shared_experts=shared, shared_intermediate=shared * expert_ffn)
    window = int(m.group(1)) if (m := _WINDOW.search(att_text)) else None
    alternating = bool(window and re.search(r"alternat|interleav|every other", att_text, re.I))
    head_dim = hidden // heads
    spec = ModelSpec(
        name=name, model_type=f"{style_key}{'-moe' if moe else ''} (columns)", hidden=hidden, layers=layers,
        vocab=vocab, attention=AttentionSpec(kind="gqa", heads=heads, kv_heads=kv, head_dim=head_dim,
                                             v_head_dim=head_dim, qkv_bias=st.bias, o_bias=st.bias,
                                             sliding_window=window),
        mlp=mlp, moe=moe_spec, layer_kinds=("dense",) * prefix + ("moe" if moe else "dense",) * (layers - prefix),
        layer_windows=tuple(window if not alternating or i % 2 == 0 else None for i in range(layers)),
        norm=st.norm, norm_bias=st.norm == "layernorm", tie_embeddings=(family or {}).get("tie_word_embeddings",
                                                                                          st.tie),
        position=st.position, max_positions=whole(row, "seq_len") or 4096)
    check_size(spec, f"row {text(row, 'id')}")
    stated = size_value(parse_name(f"x {text(row, 'total_params')}").size)
    built = params_total(spec)
    if stated and abs(built - stated) > PARAMS_WARN * stated:
        notes.append(f"the columns give {built / 1e9:.3g}B parameters, total_params says {text(row, 'total_params')}")
    return spec, tuple(notes)


def _depth_width(row: dict, layers: int | None, hidden: int | None, notes: list[str]) -> tuple:
    """A blank ``layers`` or ``hidden_size`` from the row's ``total_params`` and the other one, by
    the standard ratio params ~ 12 x layers x hidden^2 (Kaplan et al. 2020; GPT-3's shapes), the
    width rounded to a multiple of the head dimension; stated as assumed."""
    if layers and hidden:
        return layers, hidden
    params = size_value(parse_name(f"x {text(row, 'total_params')}").size)
    if not params or not (layers or hidden):
        return layers, hidden
    if hidden:
        layers = max(1, round(params / (PARAMS_PER_LAYER_WIDTH2 * hidden**2)))
        notes.append(f"layers blank: {layers} from total_params {text(row, 'total_params')} = "
                     f"{PARAMS_PER_LAYER_WIDTH2} x layers x hidden^2 (assumed)")
    else:
        width = (params / (PARAMS_PER_LAYER_WIDTH2 * layers)) ** 0.5
        hidden = max(1, round(width / STANDARD_HEAD_DIM)) * STANDARD_HEAD_DIM
        notes.append(f"hidden_size blank: {hidden} from total_params {text(row, 'total_params')} = "
                     f"{PARAMS_PER_LAYER_WIDTH2} x layers x hidden^2 (assumed)")
    return layers, hidden


def replace_size(mlp: MLPSpec, intermediate: int) -> MLPSpec:
    return MLPSpec(intermediate, gated=mlp.gated, bias=mlp.bias, activation=mlp.activation)


def _kv_heads(row: dict, heads: int, att_text: str, notes: list[str]) -> int:
    kv = whole(row, "kv_heads")
    if kv is not None:
        return kv
    if re.search(r"\bmla\b|latent", att_text, re.I):
        raise NoArchitecture("MLA attention: its latent ranks (q_lora_rank, kv_lora_rank, rope and nope head dims) "
                             "are not columns; name a model dayzero knows")
    if re.search(r"\bmqa\b|multi[- ]query", att_text, re.I):
        return 1
    if re.search(r"\bgqa\b|grouped", att_text, re.I):
        raise NoArchitecture("grouped-query attention with kv_heads blank")
    if not re.search(r"\bmha\b|multi[- ]head", att_text, re.I):
        notes.append("kv_heads blank: multi-head attention (kv_heads = attention_heads) assumed")
    return heads


def _style(row: dict, ffn: int, hidden: int, notes: list[str]) -> str:
    # file paths and URLs name repositories, not the layer style (NeMo keeps Llama under .../gpt/model/)
    words = re.sub(r"\S*/\S*", " ", f"{text(row, 'attention_type')} ; {text(row, 'arch_source')}")
    hinted = [k for k, p in STYLE_HINTS.items() if re.search(p, words, re.I)]
    if len(hinted) == 1:
        key, why = hinted[0], "as the row's attention_type/arch_source say"
    elif ffn == 4 * hidden:
        # a 4h FFN is the non-gated GELU/ReLU MLP of GPT, OPT, BLOOM, Falcon, StarCoder2 (GQA or not);
        # gated (SwiGLU) models size theirs near 8h/3 to keep the same FLOPs
        key, why = "gpt", "ffn_hidden_size = 4 x hidden_size and no family entry"
    else:
        key, why = "llama", f"ffn_hidden_size {ffn} is not 4 x hidden_size and no family entry"
    notes.append(f"{STYLES[key].label}: {why}")
    return key
