"""Training features a published run states in words -> the planner's options.

Sources put run settings in the ``framework`` column (``torchtitan (FSDP2, compile, Float8)``),
in the model name's annotations (``Llama 3.1 8B [FSDP2, compile]``) and in ``notes``.
:func:`read_features` finds the phrases below; the caller uses a feature only where the row's
own column for it is blank (a column always wins). ``notes`` are prose: a clause there that is
conditional (``when``, ``if``, ``unless``) or a legend (``FSDP column: 1 = FSDP, 0 = DDP``) states
no setting of this run and is skipped, and a feature set to false/off/no there is off.

=====================================  =====================================================
phrase                                 planner option
=====================================  =====================================================
FSDP, FSDP2, fully_shard, ZeRO-3,      ``zero = 3`` (parameters, gradients, optimizer sharded)
HSDP, FULL_SHARD, HYBRID_SHARD
ZeRO-2, SHARD_GRAD_OP                  ``zero = 2``
ZeRO-1, distributed optimizer          ``zero = 1``
DDP (alone)                            ``zero = 0``
Float8, FP8, MXFP8                     GEMMs in FP8 (``mxfp8`` marks block scaling)
async TP, TP comm overlap              ``CommOptions.tp_overlap``
DualPipe, a2a overlap, EP overlap      ``CommOptions.ep_overlap``
interleaved 1F1B, virtual pipeline     interleaved schedule (``vpp``; the degree from ``vp``)
context parallel, CP, ring attention   ``cp`` (the degree from ``cp`` or ``cp4``; none: listed)
full / selective AC (recompute)        ``recompute``
FlashAttention-2 / FA2                 ``attention_kernel = "flash2"``
FlashAttention-3 / FA3, cuDNN attn     ``attention_kernel = "fused"``
tp2, cp 4, pp=8, ep8, vp2, dp4          that degree
=====================================  =====================================================

Features with no planner option (torch.compile, CUDA graphs, activation CPU offload) are
returned in ``not_modelled`` so the report lists them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_ZERO = ((3, r"\bfsdp2?\b|fully[_ ]shard|full[_ ]shard|hybrid[_ ]shard|\bhsdp\b|zero[- _]?3\b|megatron[- ]fsdp"),
         (2, r"zero[- _]?2\b|shard[_ ]grad[_ ]op"),
         (1, r"zero[- _]?1\b|dist(?:ributed)?[- _]?opt(?:imizer)?\b"),
         (0, r"\bddp\b"))
_FLOAT8 = r"float8|\bfp8\b|mxfp8"
_MX = r"mxfp8|\bmx\b|block[- ]?scal"
_TP_OVERLAP = r"async[- _]?tp\b|tp[- _]comm[- _]overlap|tp[- ]overlap|micro[- ]?pipeline[- _]tp"
_EP_OVERLAP = r"dualpipe|a2a[- _]overlap|ep[- _]overlap|all[- ]to[- ]all overlap"
_INTERLEAVED = r"interleaved|virtual[- ]pipeline|\bvpp\b|looped"
_CONTEXT_PARALLEL = r"context[- ]parallel\w*|\bcp\b|ring[- ]attention"
_RECOMPUTE = (("selective", r"selective|\bsac\b|op[- ]level (?:ac|checkpoint)"),
              ("none", r"\bno (?:ac|activation checkpointing|activation recomput\w*|recomput\w*)\b|\bac[ "
                       r"=:]+(?:none|off)"),
              ("full", r"\bfull (?:ac|activation checkpointing|activation recomput\w*|recomput\w*)\b|\bac[ =:]+full"
                       r"|activation checkpointing|activation recomput\w*"))
_KERNEL = (("flash2", r"flash[- ]?attention[- ]?2|\bfa2\b|flash[- ]?attn[- ]?2"),
           ("fused", r"flash[- ]?attention[- ]?3|\bfa3\b|cudnn (?:attention|sdpa|fused)"))
_DEGREE = re.compile(r"\b(tp|pp|cp|ep|etp|dp|vpp|vp)\s*[=:]?\s*(\d+)\b", re.I)
_NOT_MODELLED = (("torch.compile", r"\bcompiled?\b|torch\.compile"), ("CUDA graphs", r"cuda[- ]?graphs?"),
                 ("activation CPU offload", r"cpu[- ]offload|offload(?:ing)? activations"))
_CONDITIONAL = re.compile(r"\b(?:when|if|unless|whether)\b|\bcolumn\b|legend|\d\s*=\s*[a-z]", re.I)
_NEGATED = (r"(?:\bno\s+|\bwithout\s+|\bw/o\s+|\bdisabled?\s+)(?:{p})"
            r"|(?:{p})[\w ]{{0,20}}?\s*(?:=|:|is)\s*(?:false|off|no|disabled|0)\b")


@dataclass(frozen=True)
class Features:
    zero: int | None = None
    fp8: bool = False
    mx: bool = False
    tp_overlap: bool = False
    ep_overlap: bool = False
    interleaved: bool = False
    context_parallel: bool = False  # context parallelism named (its degree, if stated, is in ``degrees``)
    recompute: str | None = None
    kernel: str | None = None
    degrees: dict = field(default_factory=dict)  # tp/pp/cp/ep/etp/dp/vp stated in the framework or the annotations
    not_modelled: tuple[str, ...] = ()
    found: tuple[str, ...] = ()  # "FSDP2 (model name)": what was read, and where


def _on(pattern: str, text: str) -> re.Match | None:
    """A match of ``pattern`` that is not negated (``no X``, ``X = False``)."""
    m = re.search(pattern, text, re.I)
    if m is None or re.search(_NEGATED.format(p=pattern), text, re.I):
        return None
    return m


def _settings(text: str, prose: bool) -> str:
    """The parts of ``text`` that state settings (prose: conditional and legend clauses dropped)."""
    if not prose:
        return text
    return " ; ".join(c for c in re.split(r"[.;]\s", text) if not _CONDITIONAL.search(c))


def read_features(framework: str, annotations: list[str], notes: str) -> Features:
    """Features stated in the three places (module docstring)."""
    parts = [("framework", framework, False), ("model name", " ; ".join(annotations), False), ("notes", notes, True)]
    got: dict = {"degrees": {}}
    found, not_modelled = [], []

    def mark(key, value, where, m):
        if key not in got:
            got[key] = value
            found.append(f"{m.group(0)} ({where})")

    for where, raw, prose in parts:
        text = _settings(raw or "", prose)
        if not text.strip():
            continue
        for level, pat in _ZERO:  # most sharding first: "DDP" only where no sharding is named
            if m := _on(pat, text):
                mark("zero", level, where, m)
                break
        if m := _on(_FLOAT8, text):
            mark("fp8", True, where, m)
            if re.search(_MX, text, re.I):
                got.setdefault("mx", True)
        for key, pat in (("tp_overlap", _TP_OVERLAP), ("ep_overlap", _EP_OVERLAP), ("interleaved", _INTERLEAVED),
                         ("context_parallel", _CONTEXT_PARALLEL)):
            if m := _on(pat, text):
                mark(key, True, where, m)
        for value, pat in _RECOMPUTE:
            if m := re.search(pat, text, re.I):
                mark("recompute", value, where, m)
                break
        for value, pat in _KERNEL:
            if m := _on(pat, text):
                mark("kernel", value, where, m)
                break
        if not prose:
            for m in _DEGREE.finditer(text):
                got["degrees"].setdefault(m.group(1).lower().replace("vpp", "vp"), int(m.group(2)))
        for name, pat in _NOT_MODELLED:
            if _on(pat, text) and name not in not_modelled:
                not_modelled.append(name)
    if got["degrees"]:
        found.append("degrees " + " ".join(f"{k}{v}" for k, v in got["degrees"].items()))
    return Features(zero=got.get("zero"), fp8=got.get("fp8", False), mx=got.get("mx", False),
                    tp_overlap=got.get("tp_overlap", False), ep_overlap=got.get("ep_overlap", False),
                    interleaved=got.get("interleaved", False), context_parallel=got.get("context_parallel", False),
                    recompute=got.get("recompute"),
                    kernel=got.get("kernel"), degrees=got["degrees"], not_modelled=tuple(not_modelled),
                    found=tuple(found))
