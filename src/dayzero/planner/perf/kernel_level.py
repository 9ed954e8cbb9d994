"""The engine's kernel level: how many bytes the memory-bound ops of a layer move, by fusion level.

:mod:`dayzero.planner.perf.compute` counts the memory-bound elements of a layer as fused kernels
move them (Megatron-Core + Transformer Engine: one kernel per RMSNorm reading its input and
writing its output, a fused RoPE, a fused SwiGLU, GQA handled inside the attention kernel). That
is the level ``PerfConstants.memory_scale`` was fitted on (the shipped CSV's runs are
Megatron-Core and NeMo, and llm-foundry's MPT models whose ops are single kernels in any mode),
so it stays the per-accelerator factor and the other levels add their extra bytes on top, as
physics: bytes over HBM bandwidth.

Levels (:data:`KERNEL_LEVELS`):

* ``fused``: the reference, nothing added.
* ``eager``: PyTorch eager mode running the model's own code (Hugging Face transformers'
  modeling code, torchtitan without ``--compile``, dayzero's runtime): every ATen op reads its
  inputs and writes its output. Per token and layer, in BF16-element units (2 bytes), beyond the
  fused count, forward / backward, from the op inventory ``dayzero ops`` records
  (:mod:`dayzero.ops.trace`, ``trace_model("llama-3.1-8b")``: Hugging Face ``LlamaRMSNorm``,
  ``apply_rotary_pos_emb`` with ``rotate_half``, ``repeat_kv``, ``LlamaMLP``):

  - RMSNorm with the FP32 upcast (``hidden_states.to(torch.float32)``, ``pow(2).mean(-1)``,
    ``* rsqrt``, ``.to(input_dtype)``, ``weight *``): 18 forward against the fused 2, 49
    backward against 4: +16 / +45 per normed element (LayerNorm is one native ATen kernel,
    ``aten.native_layer_norm``: nothing added).
  - RoPE by ``rotate_half`` (mul, slice + neg, cat, mul, add): 10 forward against 2 and 14
    backward against 4 per rotated element: +8 / +10.
  - ``repeat_kv`` (GQA: heads > kv_heads): K and V expanded to every query head by a copy, read
    kv_heads and written heads wide, forward and (as a sum) backward: +(heads + kv_heads) x
    head_dim each, twice.
  - SwiGLU as ``act_fn(gate) * up``: silu (2 f) and mul (3 f) against the fused 3 f forward,
    silu_backward and two muls (9 f) against 6 f backward: +2 f / +3 f. A plain GELU MLP is one
    kernel either way.

* ``compile``: ``torch.compile`` (Inductor) fuses pointwise chains and their reductions into one
  kernel each (the norm, RoPE and the gated activation move their bytes once, as fused kernels
  do; PyTorch docs, "TorchInductor: fusion of pointwise and reduction operations"), but the
  ``repeat_kv`` copy feeding scaled_dot_product_attention stays: only that is added.

Recurrent mixers (Mamba-2, Gated DeltaNet) run their own fused Triton/CUDA kernels in every
engine: nothing is added for them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dayzero.specs.model import ModelSpec

KERNEL_LEVELS = ("fused", "compile", "eager")

# per normed / rotated / activated element, BF16-element units beyond the fused kernel's
# (dayzero ops' trace of Hugging Face Llama, torch 2.13: module docstring)
RMSNORM_EXTRA = (16.0, 45.0)
ROPE_EXTRA = (8.0, 10.0)
SWIGLU_EXTRA = (2.0, 3.0)  # per element of the MLP's width f


def check_kernel_level(level: str) -> str:
    """``level`` if it is a known kernel level, else a one-line error naming them."""
    if level not in KERNEL_LEVELS:
        from dayzero.errors import ConfigError

        raise ConfigError("--kernel-level", None, f"expected one of {', '.join(KERNEL_LEVELS)}, got {level!r}")
    return level


@dataclass(frozen=True)
class UnfusedElements:
    """Elements one layer moves beyond the fused count, per micro-batch on one device, forward and
    backward, split as the layer's modules are (the token mixer's block and the FFN's block)."""

    mixer_fwd: object
    mixer_bwd: object
    ffn_fwd: object
    ffn_bwd: object


def unfused_elements(spec: ModelSpec, level: str, T, T_el, tp, mixer: bool, ffn_rows=None, ffn_width: float = 0.0,
                     gated: bool = True) -> UnfusedElements:
    """The extra elements of one layer at kernel ``level`` (module docstring). ``T``: tokens of the
    micro-batch on this device's CP shard; ``T_el``: the tokens its hidden-size elementwise
    kernels see (T / tp under sequence parallelism); ``mixer``: the layer has an attention block;
    ``ffn_rows`` x ``ffn_width``: rows and (per-device) width of the FFN's activation, ``gated``:
    a gated (SwiGLU) activation. Zeros at the fused level."""
    check_kernel_level(level)
    zero = np.zeros_like(np.asarray(T, dtype=float))
    if level == "fused":
        return UnfusedElements(zero, zero, zero, zero)
    a, H = spec.attention, spec.hidden
    eager = level == "eager"
    rms = eager and spec.norm == "rmsnorm"
    mf, mb, ff, fb = zero, zero, zero, zero
    if mixer and a is not None:
        if rms:  # the block's pre-norm, and per-head q/k norms where the model has them
            mf, mb = mf + RMSNORM_EXTRA[0] * T_el * H, mb + RMSNORM_EXTRA[1] * T_el * H
            if a.qk_norm:
                width = (a.heads + a.kv_heads) * a.head_dim / tp
                mf, mb = mf + RMSNORM_EXTRA[0] * T * width, mb + RMSNORM_EXTRA[1] * T * width
        if eager and spec.position == "rope":
            if a.kind == "mla":  # the rotated parts only: each head's q_pe and the shared k_pe
                rotated = (a.heads / tp + 1) * a.qk_rope_head_dim
            else:
                rotated = (a.heads + a.kv_heads) * a.head_dim / tp
            mf, mb = mf + ROPE_EXTRA[0] * T * rotated, mb + ROPE_EXTRA[1] * T * rotated
        if a.kind != "mla" and a.kv_heads < a.heads:  # repeat_kv's copies of K and V, both levels
            rep = 2 * (a.heads + a.kv_heads) * a.head_dim / tp
            mf, mb = mf + T * rep, mb + T * rep
    if ffn_rows is not None:
        if rms:
            ff, fb = ff + RMSNORM_EXTRA[0] * T_el * H, fb + RMSNORM_EXTRA[1] * T_el * H
        if eager and gated:
            ff, fb = ff + SWIGLU_EXTRA[0] * ffn_rows * ffn_width, fb + SWIGLU_EXTRA[1] * ffn_rows * ffn_width
    return UnfusedElements(mf, mb, ff, fb)


def engine_kernel_level(framework: str) -> str:
    """The kernel level of an engine named by free text (a backtest row's framework column):
    ``compile`` where it says torch.compile / compiled; ``eager`` for PyTorch-native engines
    (torchtitan, FSDP/FSDP2 without Megatron, DeepSpeed on a Hugging Face model, dayzero's
    runtime); ``fused`` for Megatron-Core (NeMo, Megatron-Bridge, Megatron-LM, Megatron-DeepSpeed:
    Transformer Engine or Apex fused kernels), MindSpeed (its fused RMSNorm, RoPE and SwiGLU ops,
    MindSpeed-LLM ``--use-fused-rmsnorm --use-fused-rotary-pos-emb --use-fused-swiglu``), MaxText
    (XLA fuses) and anything unnamed (the reference the constants were fitted on)."""
    t = framework.lower()
    if any(k in t for k in ("megatron", "nemo", "mindspeed", "maxtext", "jax", "transformer engine")):
        return "fused"
    if "compile" in t:
        return "compile"
    if any(k in t for k in ("torchtitan", "fsdp", "pytorch", "deepspeed", "dayzero", "hugging face", "transformers")):
        return "eager"
    return "fused"
