"""A published row's measured throughput as tokens/s per device, whichever metric it publishes.

Throughput columns are read directly (``published.published_tokens_per_device``); a row that
publishes only TFLOP/s per device, MFU or HFU is converted through the FLOP count its definition
names, so the backtest predicts and scores it like any other (the relative error of tokens/s is
that of the utilisation: both are the same measurement over a constant):

* FLOPs per token: 6 x parameters + the attention term (Megatron-LM's, PaLM's appendix B,
  torchtitan's: full, non-causal attention) unless the definition says otherwise: ``causal``
  halves the attention term, ``without attention`` / ``6N`` / ``6 x params`` drops it (Kaplan
  et al. 2020's C = 6N, the definition of many MFU reports); HFU, or a definition that counts
  hardware FLOPs, adds the recompute forward (x 4/3) when the run recomputes fully.
* MFU's peak: the dense peak of the precision the definition names (``FP8 peak``), the row's own
  precision when the definition says so (DGX Cloud divides FP8 rows by the FP8 peak), else the
  BF16 peak (PaLM, Megatron-LM and the vendors' MFU use the 16-bit dense peak).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from dayzero.planner.backtest.csv_values import positive, text
from dayzero.planner.backtest.row_text import mfu_in
from dayzero.specs.counting import flops_per_token
from dayzero.specs.hardware import Accelerator
from dayzero.specs.model import ModelSpec

_NO_ATTENTION = re.compile(r"without attention|excl\w*\.?\s*attention|no attention", re.I)
_SIX_N = re.compile(r"\b6\s*[x*]?\s*n\b|\b6\s*[x*]\s*(?:n_)?param|\b6nd\b", re.I)
_ATTENTION_WORD = re.compile(r"att(?:entio)?n", re.I)
_CAUSAL = re.compile(r"(?<!non-)(?<!non)\bcausal", re.I)
_HARDWARE = re.compile(r"hardware|\bhfu\b|incl\w*\.?\s*recomput|with recomput", re.I)
_PEAK = re.compile(r"\b(fp8|fp4|bf16|fp16)\b[^;,.]{0,12}peak|peak[^;,.]{0,12}\b(fp8|fp4|bf16|fp16)\b", re.I)
_ROW_PRECISION_PEAK = re.compile(r"(?:row'?s|its|the run'?s|same)\s+precision|precision'?s peak|precision[- ]specific",
                                 re.I)


@dataclass(frozen=True)
class FlopDefinition:
    attention: str  # full | causal | none
    hardware: bool  # counts the recompute forward


def definition_of(definition: str, hfu: bool = False) -> FlopDefinition:
    """How a metric's definition text counts FLOPs (module docstring)."""
    if _NO_ATTENTION.search(definition) or (_SIX_N.search(definition) and not _ATTENTION_WORD.search(definition)):
        attention = "none"
    elif _CAUSAL.search(definition):
        attention = "causal"
    else:
        attention = "full"
    return FlopDefinition(attention, hfu or bool(_HARDWARE.search(definition)))


def flops_per_token_as(spec: ModelSpec, seq: int, d: FlopDefinition, recompute: str) -> float:
    """Training FLOPs per token under definition ``d``."""
    f = flops_per_token(spec, seq, causal=d.attention == "causal")
    per_token = f.train - (3.0 * f.attention_forward if d.attention == "none" else 0.0)
    return per_token * (4 / 3 if d.hardware and recompute == "full" else 1.0)


def describe(d: FlopDefinition, recompute: str) -> str:
    att = {"full": "full attention", "causal": "causal attention", "none": "without attention"}[d.attention]
    return att + (", with the recompute forward" if d.hardware and recompute == "full" else "")


def has_metric(row: dict) -> bool:
    """The row publishes a utilisation (TFLOP/s per device, MFU, HFU) to convert."""
    return bool(positive(row, "tflops_per_gpu") or positive(row, "mfu_pct") or positive(row, "hfu_pct")
                or mfu_in(_metric_text(row)))


def _metric_text(row: dict) -> str:
    return f"{text(row, 'other_published_metric')} ; {text(row, 'notes')}"


def peak_precision(row: dict, definition: str, precision: str) -> str:
    if _ROW_PRECISION_PEAK.search(definition):
        return precision
    if m := _PEAK.search(definition):
        return (m.group(1) or m.group(2)).lower().replace("fp16", "bf16")
    return "bf16"


def tokens_from_utilization(row: dict, spec: ModelSpec, seq: int, recompute: str, acc: Accelerator,
                            precision: str) -> tuple[float, str] | None:
    """tokens/s per device from ``tflops_per_gpu``, else ``mfu_pct``, ``hfu_pct`` or an MFU the
    notes state, and the sentence saying how; None when the row publishes none of them."""
    tflops = positive(row, "tflops_per_gpu")
    if tflops:
        d = definition_of(text(row, "tflops_definition"))
        per_token = flops_per_token_as(spec, seq, d, recompute)
        return tflops * 1e12 / per_token, (f"tokens/s from tflops_per_gpu {tflops:g} / {per_token / 1e9:.4g} GFLOP "
                                           f"per token ({describe(d, recompute)})")
    mfu_def = text(row, "mfu_definition")
    found = None
    if v := positive(row, "mfu_pct"):
        found = (v / 100, "mfu_pct", definition_of(mfu_def))
    elif v := positive(row, "hfu_pct"):
        found = (v / 100, "hfu_pct", definition_of(mfu_def, hfu=True))
    elif stated := mfu_in(_metric_text(row)):
        found = (stated[0], f"the notes' {stated[1]!r}", definition_of(f"{mfu_def} {stated[1]}"))
    if found is None or not 0 < found[0] <= 1:
        return None
    util, where, d = found
    peak_prec = peak_precision(row, mfu_def, precision)
    peak = acc.peak(peak_prec)
    per_token = flops_per_token_as(spec, seq, d, recompute)
    return util * peak / per_token, (f"tokens/s from {where} {util:.1%} x the {peak_prec.upper()} peak "
                                     f"{peak / 1e12:g} TFLOP/s / {per_token / 1e9:.4g} GFLOP per token "
                                     f"({describe(d, recompute)})")
