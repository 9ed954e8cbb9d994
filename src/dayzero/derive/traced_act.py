"""Saved-activation bytes the shapes cannot give, measured in the traces of dayzero.derive.traced_flops.

The forward that traced_flops runs at two sequence lengths for each layer the shapes only
approximate runs on the meta device in training mode with autograd on, so autograd saves for
backward exactly the tensors the model's own code needs. :class:`dayzero.ops.trace.SavedTensors`
counts them per decoder layer through ``torch.autograd.graph.saved_tensors_hooks`` (once per
storage; parameters, buffers and the rotary tables / masks every layer shares left out). Per token
they are fitted as ``linear + quadratic x seq`` from the two lengths, exactly as the FLOPs are
(an s x s score matrix is the quadratic term), against what the planner's activation terms give
for the same layer, and the difference goes into ``ModelSpec.layer_act_extra``, which
planner.memory.activations adds to the layer as the ``traced_extra`` term.

Like with like: the trace runs the reference eager code, so the layer is compared with the
planner's eager terms (``MemoryOptions(kernels="eager", attention="eager")``: norms' fp32 copies,
the activation's output, the softmax probabilities), plus what transformers' eager attention saves
beyond the unfused attention those terms describe (Korthikanti et al. 2022, sec. 4.1: one
probability matrix in the activation dtype, K and V per KV head): ``eager_attention_forward``
(transformers/models/llama/modeling_llama.py, the function every model's eager attention copies)
computes the softmax in FP32 and saves that output besides its cast back (``softmax(attn_weights,
dim=-1, dtype=torch.float32).to(query.dtype)``: +4 B per score), and multiplies by K and V after
``repeat_kv``, i.e. copies of every query head's K and V (+ (heads - kv_heads) heads of each). Both
are an implementation's choice the planner's kernels do not make, so they are not in the difference;
for a llama-like layer the difference is then 0 (tests/derive/test_traced_act.py).

Only the approximated side of a layer is compared: a feed-forward block read from its shapes (an
MLP, routed experts) keeps the planner's terms (transformers' MoE code saves a little less than the
runtimes the terms follow, -252 B per token in a small Qwen3-MoE layer, a property of the code, not
of the model), unless the block has no MLP shape; the mixer's side (with the norms) always is.

A mixer the planner does not recognise is modelled as attention (its stand-in). That stand-in's
score matrix is not in the code, so its core is taken at the fused kernel's figure (the log-sum-exp
per query and head); and what the reference code keeps is its reference algorithm's (a sequential
or chunked scan in PyTorch keeps its states: 2.2 MB per token per layer in Jamba's Mamba layers,
where mamba_ssm's fused kernel recomputes them in backward). Its difference therefore goes into
``ModelSpec.layer_act_reference``, counted under eager kernels (``MemoryOptions.kernels="eager"``,
the reference as it runs) only; a plan with fused kernels keeps the stand-in's terms, as before. So
does a layer mostly unread (weights beyond the shapes above the weights the shapes give it: a mixer
the description did not find). The differences of recognised layers (an indexer, an output gate:
tensors any implementation keeps) go into ``layer_act_extra``, counted always.
"""

from __future__ import annotations

from dataclasses import replace

from dayzero.derive.describe import ModelDescription
from dayzero.derive.to_spec import ranges
from dayzero.planner.memory.activations import LAYER_INPUT, TRACED, Dims, layer_terms, mlp_terms
from dayzero.planner.memory.memory_options import MemoryOptions
from dayzero.specs.counting import layer_matmul_params
from dayzero.specs.model import ModelSpec, mixer_parts, split_layer_type

SOFTMAX_FP32 = 4  # bytes per score of the FP32 softmax output transformers' eager attention saves
# the planner's terms of an FFN's pre-norm (its input, its eager copies): charged to the norm module
# in the trace, so on the mixer's side of a layer
_PRE_NORM = ("ln2_in", "ln2_eager", LAYER_INPUT)


def stand_ins(desc: ModelDescription) -> set[int]:
    """Layers whose mixer the planner models as attention without reading it (an unread recurrent mixer)."""
    return {i for i, k in enumerate(desc.kind_of())
            if k.mixer is not None and k.mixer.kind == "recurrent" and k.mixer.recurrent is None}


def reference_only(desc: ModelDescription, spec: ModelSpec) -> set[int]:
    """Layers whose traced difference is their reference algorithm's (ModelSpec.layer_act_reference):
    a stand-in mixer's, or a layer mostly unread, its weights beyond the shapes more than the weights
    a token multiplies through in the shapes (a mixer the description did not find, say)."""
    return stand_ins(desc) | {i for i, t in enumerate(spec.layer_types)
                              if abs(spec.layer_extra[i]) > layer_matmul_params(spec, t)}


def unread_ffns(desc: ModelDescription) -> set[int]:
    """Layers whose feed-forward block has no MLP shape (the planner's MLP stands in for it)."""
    return {i for i, k in enumerate(desc.kind_of()) if k.ffn.kind == "dense" and k.ffn.dense is None}


def traced_sides(saved: dict[tuple[int, str], int], layer: int, ffn_module: str | tuple[str, ...],
                 tokens: int) -> tuple[float, float]:
    """(mixer side, feed-forward side) bytes per token a traced layer saved (Trace.saved_bytes): the
    feed-forward side is what the layer's children of class ``ffn_module`` (FeedForward.modules: the
    block and any shared-expert MLP beside it) save."""
    ffn_modules = {ffn_module} if isinstance(ffn_module, str) else set(ffn_module)
    ffn_modules.discard("")
    ffn = sum(b for (i, c), b in saved.items() if i == layer and c in ffn_modules)
    every = sum(b for (i, _), b in saved.items() if i == layer)
    return (every - ffn) / tokens, ffn / tokens


def reference_bytes(spec: ModelSpec, index: int, seq: int, stand_in: bool = False) -> tuple[float, float]:
    """(mixer side, feed-forward side) saved bytes per token of layer ``index`` at ``seq`` tokens (one
    sequence, no parallelism) as the planner's eager terms give them for the reference code (module
    docstring). The feed-forward side is what its block saves from its first linear or router on."""
    kind = spec.layer_types[index]
    opts = MemoryOptions(kernels="eager", attention="flash" if stand_in else "eager")
    d = Dims(seq=seq, mbs=1, tp=1, cp=1)
    terms = layer_terms(spec, kind, opts, d)
    total = sum(float(v) for n, v in terms.items() if n != TRACED)
    mixer, ffn_kind = split_layer_type(kind)
    ffn = 0.0
    if ffn_kind != "none":
        ffn = sum(float(v) for n, v in mlp_terms(spec, ffn_kind, opts, d).items() if n not in _PRE_NORM)
    if "attention" in mixer_parts(mixer) and not stand_in:
        a = spec.attention
        total += SOFTMAX_FP32 * a.heads * seq * seq
        if a.kind != "mla":  # MLA's K and V are per query head already
            total += opts.act_bytes * seq * (a.heads - a.kv_heads) * (a.head_dim + a.v_head_dim)
    return (total - ffn) / seq, ffn / seq


def fit_extra(traced: tuple[float, float], modelled: tuple[float, float],
              seqs: tuple[int, int]) -> tuple[float, float]:
    """(linear, quadratic) of the difference traced - modelled, per token, from two lengths ``seqs``."""
    (t1, t2), (m1, m2), (s1, s2) = traced, modelled, seqs
    d1, d2 = t1 - m1, t2 - m2
    quad = (d2 - d1) / (s2 - s1)
    return d1 - quad * s1, quad


def act_extra(desc: ModelDescription, spec: ModelSpec, layers: list[int], traced: list, seqs) -> ModelSpec:
    """``spec`` with the traced layers' differences, fitted as the FLOPs are, in
    ModelSpec.layer_act_extra, or layer_act_reference for a stand-in mixer (module docstring).
    ``traced[i]``: layer i's (mixer side, feed-forward side) bytes per token at each of the two
    lengths, or None. A feed-forward block read from its shapes (an MLP, routed experts) keeps the
    planner's terms: the difference is the mixer side's alone (what the reference's MoE code saves
    differs from the runtimes' the terms follow, but not with the model), unless the block has no
    MLP shape."""
    standin, unread, ref_only = stand_ins(desc), unread_ffns(desc), reference_only(desc, spec)
    extra, reference = list(spec.layer_act_extra), list(spec.layer_act_reference)
    for i in layers:
        if traced[i] is None:
            continue
        ref = [reference_bytes(spec, i, s, i in standin) for s in seqs]
        lin, quad = fit_extra(tuple(t[0] for t in traced[i]), tuple(r[0] for r in ref), seqs)
        if i in unread:
            fl, fq = fit_extra(tuple(t[1] for t in traced[i]), tuple(r[1] for r in ref), seqs)
            lin, quad = lin + fl, quad + fq
        (reference if i in ref_only else extra)[i] = (lin, quad)
    return replace(spec, layer_act_extra=tuple(extra), layer_act_reference=tuple(reference))

def act_notes(desc: ModelDescription, spec: ModelSpec, layers: list[int], seqs: tuple[int, int]) -> list[str]:
    """One line per group of traced layers with the same difference: bytes per token per layer at the
    planning length beyond the planner's terms (fused kernels, as a plan counts them)."""
    ref_only = reference_only(desc, spec)
    groups: dict[tuple, list[int]] = {}
    for i in layers:
        groups.setdefault((spec.layer_act_reference if i in ref_only else spec.layer_act_extra)[i], []).append(i)
    seq = min(spec.max_positions, 4096)
    d = Dims(seq=seq, mbs=1, tp=1, cp=1)
    notes = []
    for (lin, quad), idx in groups.items():
        if not (lin or quad):
            continue
        terms = layer_terms(spec, spec.layer_types[idx[0]], MemoryOptions(), d)
        shapes = sum(float(v) for n, v in terms.items() if n != TRACED) / seq
        where = ("under eager kernels only (the reference algorithm of code the planner does not read: a fused "
                 "kernel may recompute what it keeps)" if idx[0] in ref_only else "under every kernel choice")
        notes.append(f"layers {ranges(tuple(idx))}: saved activations measured by tracing the model's own code at "
                     f"{seqs[0]} and {seqs[1]} tokens: {(lin + quad * seq) / 1e3:+,.1f} kB per token per layer "
                     f"beyond the planner's {shapes / 1e3:,.1f} kB at {seq} tokens ({lin:+,.0f} B {quad:+,.2f} x seq, "
                     f"against its eager terms); counted in memory {where}, as the mean per layer type, held whole "
                     "on every TP rank")
    return notes
