"""Map a derived :class:`~dayzero.derive.describe.ModelDescription` into the planner's ModelSpec.

What the ModelSpec can express is mapped as is: width, depth, vocabulary, tied head, attention
(GQA / MLA shapes, sliding windows per layer), the dense MLP, routed experts (count, top-k,
per-expert width, shared experts, router bias and correction bias), dense vs MoE layers. Counts
stay exact: each layer's module-tree parameters beyond what the shapes give go into
``ModelSpec.layer_extra`` (and those outside the layers into ``outside_extra``), so ``inspect``
equals the meta-device count to the unit.

Recurrent mixers (Mamba-2 SSD, Gated-DeltaNet-style linear attention) whose weights
:func:`dayzero.derive.structure.recurrent_shapes` reads become ``recurrent`` layers of the spec
(ModelSpec.recurrent, layer_mixers); a layer holding such a mixer and softmax attention side by
side (a parallel hybrid, LayerKind.beside) becomes ``attention&recurrent``, costing both; layers
without a mixer or without a feed-forward block are ``none`` there, so they cost no attention or MLP.

What the planner can only approximate is returned as sentences (``approximations``), never
silently: recurrent mixers whose weights are not such a layout, chunked attention, layers whose
attention, recurrent mixer or experts differ in shape from the ones modelled, and parameters the
shapes do not express (their FLOPs come from tracing the layer, :mod:`dayzero.derive.traced_flops`).
"""

from __future__ import annotations

from dataclasses import replace

from dayzero.derive.describe import LayerKind, ModelDescription
from dayzero.specs.counting import embedding_params, head_params, layer_count, norm_params
from dayzero.specs.model import AttentionSpec, MLPSpec, ModelSpec, MoESpec, parallel_mixer


def ranges(layers: tuple[int, ...]) -> str:
    """(0, 1, 2, 5) -> '0-2, 5'; (1, 3, 5) -> '1-5 every 2'."""
    steps = {b - a for a, b in zip(layers, layers[1:])}
    if len(layers) >= 3 and len(steps) == 1 and steps != {1}:
        return f"{layers[0]}-{layers[-1]} every {steps.pop()}"
    out, start = [], layers[0]
    for a, b in zip(layers, layers[1:] + (None,)):
        if b != a + 1:
            out.append(f"{start}" if start == a else f"{start}-{a}")
            start = b
    return ", ".join(out)


def _attention(k: LayerKind) -> AttentionSpec:
    m = _attention_mixer(k) or k.mixer
    if m.kind == "mla":
        return AttentionSpec(kind="mla", heads=m.heads, kv_heads=m.heads, head_dim=m.head_dim, v_head_dim=m.v_head_dim,
                             qkv_bias=m.qkv_bias, o_bias=m.o_bias, q_lora_rank=m.q_lora_rank,
                             kv_lora_rank=m.kv_lora_rank, qk_rope_head_dim=m.qk_rope_head_dim,
                             qk_nope_head_dim=m.qk_nope_head_dim)
    kv = m.kv_heads if m.kv_heads and m.heads % m.kv_heads == 0 else m.heads
    return AttentionSpec(kind="gqa", heads=m.heads, kv_heads=kv, head_dim=m.head_dim, v_head_dim=m.v_head_dim,
                         qkv_bias=m.qkv_bias, o_bias=m.o_bias, sliding_window=m.window)


def _mlp(shape, hidden: int) -> MLPSpec:
    return MLPSpec(intermediate=shape.intermediate, gated=shape.gated, bias=shape.bias)


def spec_from_description(desc: ModelDescription) -> tuple[ModelSpec, list[str]]:
    """(ModelSpec with exact counts, approximations the planner makes for this model)."""
    h = desc.hidden
    approx: list[str] = []
    kinds = desc.kinds
    rec_kind = next((k for k in kinds if _read_recurrent(k)), None)
    recurrent = _recurrent_mixer(rec_kind).recurrent if rec_kind is not None else None
    per_layer = desc.kind_of()
    mixers = tuple(_mixer_kind(k) for k in per_layer)
    attn_kinds = [k for k in kinds if _attention_mixer(k) is not None]
    ref_attn = attn_kinds[0] if attn_kinds else next((k for k in kinds if k.mixer is not None and not
                                                      _read_recurrent(k)), None)
    if ref_attn is None:
        attention = AttentionSpec(kind="gqa", heads=1, kv_heads=1, head_dim=h, v_head_dim=h)
        if "attention" in mixers:
            approx.append("no layer has a token mixer the planner recognises; attention modelled as one head of "
                          f"width {h} (its parameters are counted exactly)")
    else:
        attention = replace(_attention(ref_attn), sliding_window=None) if _attention_mixer(ref_attn) is None else \
            _attention(ref_attn)
    dense_kind = next((k for k in kinds if k.ffn.kind == "dense" and k.ffn.dense is not None), None)
    moe_kind = next((k for k in kinds if k.ffn.kind == "moe"), None)
    moe = None
    if moe_kind is not None:
        f = moe_kind.ffn
        ex = f.experts
        moe = MoESpec(experts=ex.experts, top_k=f.top_k, expert=_mlp(ex.expert, h),
                      shared_experts=1 if f.shared else 0, shared_intermediate=f.shared.intermediate if f.shared else 0,
                      router_bias=f.router_bias, score_correction_bias=f.score_correction_bias,
                      shared_expert_gate=f.shared_gate)
    if dense_kind is not None:
        mlp = _mlp(dense_kind.ffn.dense, h)
    elif moe is not None:
        mlp = moe.expert
    else:
        mlp = MLPSpec(intermediate=0)
    layer_kinds = tuple({"moe": "moe", "none": "none"}.get(k.ffn.kind, "dense") for k in per_layer)
    windows = []
    for k, mixer in zip(per_layer, mixers):
        m = _attention_mixer(k) or k.mixer
        if m is None or mixer == "recurrent":
            windows.append(None)
        elif m.kind == "recurrent":  # a recurrent mixer whose weights are not a layout the planner reads
            windows.append(max(1, m.head_dim))
        else:
            windows.append(m.window or m.chunk)
    spec = ModelSpec(name=desc.name, model_type=desc.model_type, hidden=h, layers=desc.num_layers, vocab=desc.vocab,
                     attention=attention, mlp=mlp, moe=moe, layer_kinds=layer_kinds, layer_windows=tuple(windows),
                     recurrent=recurrent, layer_mixers=mixers,
                     norm=desc.norm, norm_bias=desc.norm_bias, tie_embeddings=desc.tied,
                     max_positions=desc.max_positions, rope_theta=desc.rope_theta, norm_eps=desc.norm_eps)
    extra = tuple(k.params - layer_count(spec, i).total for i, k in enumerate(per_layer))
    outside = desc.embedding + desc.head + desc.final_norm + desc.outside
    outside_extra = outside - embedding_params(spec) - head_params(spec) - norm_params(spec)
    spec = replace(spec, layer_extra=extra, outside_extra=outside_extra)
    approx += _approximations(desc, spec, ref_attn, moe_kind, dense_kind, rec_kind)
    return spec, approx


def _recurrent_mixer(k: LayerKind):
    """The layer's recurrent mixer whose shapes were read from its weights, or None."""
    return next((m for m in k.mixers if m.kind == "recurrent" and m.recurrent is not None), None)


def _attention_mixer(k: LayerKind):
    """The layer's softmax (GQA / MLA) attention, or None."""
    return next((m for m in k.mixers if m.kind != "recurrent"), None)


def _read_recurrent(k: LayerKind) -> bool:
    """A recurrent mixer whose shapes were read from its weights (alone or beside attention)."""
    return _recurrent_mixer(k) is not None


def _mixer_kind(k: LayerKind) -> str:
    """ModelSpec.layer_mixers entry: a read recurrent mixer, none, (softmax, MLA, or an unread
    recurrent mixer approximated by a window) attention, or attention and a read recurrent mixer
    side by side (``attention&recurrent``)."""
    if k.mixer is None:
        return "none"
    if not _read_recurrent(k):
        return "attention"
    return parallel_mixer(("attention" if m.kind != "recurrent" else "recurrent") for m in k.mixers)


def _approximations(desc: ModelDescription, spec: ModelSpec, ref_attn, moe_kind, dense_kind, rec_kind) -> list[str]:
    out = []
    ref = _attention(ref_attn) if ref_attn is not None and _attention_mixer(ref_attn) is not None else None
    for k in desc.kinds:
        where = f"layers {ranges(k.layers)} ({k.name})"
        m = k.mixer
        if _read_recurrent(k):
            if k is not rec_kind and _recurrent_mixer(k).recurrent != _recurrent_mixer(rec_kind).recurrent:
                out.append(f"{where}: recurrent mixer shapes differ from layers {ranges(rec_kind.layers)}; "
                           "modelled with those (parameters exact)")
            m = _attention_mixer(k)  # attention beside it, compared below as any attention
        if m is not None and m.kind == "recurrent":
            out.append(f"{where}: {m.module} is linear attention / SSM (a recurrent state, no softmax over keys); "
                       f"its parameters are exact, its compute and activations are modelled as attention with the "
                       f"modelled attention's shapes over a window of {max(1, m.head_dim)} keys (= head_dim: updating "
                       "and reading a d x d state per head costs what attending to d keys does)")
        elif m is not None and m.chunk:
            out.append(f"{where}: chunked attention (chunks of {m.chunk} tokens) modelled as a sliding window of "
                       f"{m.chunk} (the same keys per query without a causal mask; up to 2x the causal cost)")
        elif m is not None and ref is not None and replace(_attention(k), sliding_window=None) != replace(
                ref, sliding_window=None):
            out.append(f"{where}: attention shapes differ from layers {ranges(ref_attn.layers)}; "
                       "modelled with those (parameters exact)")
        f = k.ffn
        if f.kind == "moe" and moe_kind is not None and k is not moe_kind and (
                f.experts.experts, f.experts.expert.intermediate, f.top_k) != (
                moe_kind.ffn.experts.experts, moe_kind.ffn.experts.expert.intermediate, moe_kind.ffn.top_k):
            out.append(f"{where}: routed experts differ in shape from layers {ranges(moe_kind.layers)}; "
                       "modelled with those (parameters exact)")
        if f.kind == "dense" and f.dense is None:
            out.append(f"{where}: feed-forward block {f.module} has no recognised MLP shape; its parameters are "
                       "counted exactly, its compute only as the trace measures it")
        if f.kind == "dense" and dense_kind is not None and f.dense is not None and f.dense != dense_kind.ffn.dense:
            out.append(f"{where}: dense MLP differs from layers {ranges(dense_kind.layers)}; modelled with that "
                       "(parameters exact)")
    extras = {}
    for i, x in enumerate(spec.layer_extra):
        if x:
            extras.setdefault(x, []).append(i)
    for x, layers in sorted(extras.items(), key=lambda kv: kv[1][0]):
        sign = "more" if x > 0 else "fewer"
        out.append(f"layers {ranges(tuple(layers))}: {abs(x):,} {sign} parameters per layer than the planner's shapes "
                   "give (norms, gates or mixer weights it does not model by name); counted exactly in totals and "
                   "in memory (as replicated on every TP rank); in FLOPs only as the trace measures them")
    if spec.outside_extra:
        out.append(f"{spec.outside_extra:,} parameters outside the decoder layers beyond embedding, head and final "
                   "norm; counted with the embedding")
    if desc.vision:
        out.append(f"{desc.vision:,} vision/audio tower parameters are reported apart and not planned")
    return out
