"""Activation bytes one rank saves for backward, per decoder layer and micro-batch.

The accounting follows Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large
Transformer Models", sec. 4), tensor by tensor, generalised to GQA, MLA, gated MLPs and MoE:

    s seq, b micro-batch, h hidden, a heads, t tp, c cp, tok = s*b/c tokens on this CP rank
    tok_rep = tok / t with sequence parallelism (SP), else tok: tensors outside the TP region
    (norm inputs, the inputs of the first linear of each block, dropout masks) are replicated on
    every TP rank unless SP shards them along the sequence.

For Korthikanti's GPT (MHA, GELU 4h MLP, dropout, eager attention, no parallelism) the terms add
up to sbh(34 + 5as/h); with TP to sbh(10 + 24/t + 5as/(ht)); with SP + selective recompute to
sbh(34/t); full recompute keeps only the layer input, 2sbh (2sbh/t with SP).

Every function is numpy-compatible: ``seq, mbs, tp, cp, etp, sp, fp8`` may be scalars or arrays of
one broadcastable shape; results are float bytes. Names of the terms are what reports show.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from itertools import combinations

import numpy as np

from dayzero.planner.memory.memory_options import MemoryOptions
from dayzero.specs.model import ModelSpec, mixer_parts, split_layer_type
from dayzero.specs.parallel import RECOMPUTE_MODULES

# Terms selective recompute drops (Megatron's "core_attn" recompute: softmax, its dropout, and
# FlashAttention's log-sum-exp are recomputed in backward from the saved Q, K, V).
CORE_TERMS = ("attn_scores", "attn_dropout", "attn_lse")
LAYER_INPUT = "ln1_in"  # the residual-stream input of the layer: all full recompute keeps
TRACED = "traced_extra"  # a derived layer's measured bytes beyond the terms (traced_act_bytes)
# a recurrent mixer's terms for the tensors it shares with attention beside it (attention&recurrent):
# the layer input and the one pre-norm's output, which both mixers read (FalconH1DecoderLayer)
_SHARED_MIXER_INPUT = (LAYER_INPUT, "rec_in", "ln1_eager")
_EXPERT_INSIDE = ("expert_act_in", "expert_down_in", "expert_act_out")
_SHARED_INSIDE = ("shared_act_in", "shared_down_in", "shared_act_out")
# The saved tensors each module of selective recompute drops (Megatron-LM --recompute-modules,
# megatron/core/transformer/transformer_config.py ``recompute_modules``; specs.parallel.RECOMPUTE_MODULES):
#   core_attn       the softmax core; Q, K, V stay (the checkpoint's inputs)
#   layernorm       the outputs of input_layernorm and pre_mlp_layernorm, i.e. the saved inputs of
#                   the QKV / in_proj, FC1 and router (output-discarding: rebuilt from the kept norm
#                   input, the residual stream), with an eager norm's own saved copies
#   mla_up_proj     MLA's up-projected, rotary-applied per-head Q, K, V (rebuilt from the kept
#                   latents q_b_in / kv_b_in); nothing on other attention kinds
#   moe_act         the routed experts' activation output, the down-projection input (TEGroupedMLP in
#                   megatron/core/transformer/moe/experts.py; under FP8 it makes linear_fc2 save its
#                   original input, set_save_original_input, so the dropped copy is the only one);
#                   the shared experts are a plain MLP, which has no activation checkpoint
#   mlp             a dense MLP's insides, FC1's input included (TE fuses pre_mlp_layernorm into
#                   FC1, so the checkpoint's input is the residual stream ln2_in, which stays)
#   moe             the whole MoE block but its input (moe_in, the pre_mlp_layernorm output that
#                   the checkpoint keeps): router, dispatched rows, experts, combine, shared experts
#   shared_experts  the shared experts' insides
MODULE_TERMS: dict[str, tuple[str, ...]] = {
    "core_attn": CORE_TERMS,
    "layernorm": ("attn_in", "rec_in", "mlp_in", "moe_in", "ln1_eager", "ln2_eager"),
    "mla_up_proj": ("q", "k", "v"),
    "moe_act": ("expert_down_in", "expert_act_out"),
    "mlp": ("mlp_in", "mlp_act_in", "mlp_down_in", "mlp_act_out"),
    "moe": ("router_probs", "router_topk", "expert_in", *_EXPERT_INSIDE, "expert_out", "dispatch_map",
            "combine_eager", *_SHARED_INSIDE),
    "shared_experts": _SHARED_INSIDE,
}


@dataclass(frozen=True)
class Dims:
    """Per-candidate dimensions (scalars or broadcastable arrays)."""

    seq: object
    mbs: object
    tp: object
    cp: object
    etp: object = 1
    sp: object = False
    fp8: object = False

    @property
    def tok(self):
        """Tokens of one micro-batch on this context-parallel rank."""
        return np.asarray(self.seq) * self.mbs / self.cp

    @property
    def tok_rep(self):
        """Tokens held by tensors outside the TP region (sharded by tp only under SP)."""
        return self.tok / np.where(self.sp, self.tp, 1)


DIMS = ("seq", "mbs", "tp", "cp", "etp", "sp", "fp8")


def distinct_dims(d: Dims) -> tuple[Dims, np.ndarray, tuple]:
    """The distinct candidates of ``d``: (their Dims, 1-D arrays; for each candidate of ``d``, its
    index among them; the broadcast shape of ``d``)."""
    names = DIMS
    cols = [c.ravel() for c in np.broadcast_arrays(*(np.asarray(getattr(d, k)) for k in names))]
    shape = np.broadcast_shapes(*(np.shape(getattr(d, k)) for k in names))
    ints = [np.asarray(c, dtype=np.int64) for c in cols]
    key, span = np.zeros(len(ints[0]), dtype=np.int64), 1
    for c in ints:  # a mixed-radix number per candidate (every dim is a small non-negative integer)
        lo, hi = int(c.min(initial=0)), int(c.max(initial=0))
        if lo < 0 or span * (hi + 1) >= 2**62:  # not packable: compare the rows themselves
            _, first, inverse = np.unique(np.stack(ints, axis=1), axis=0, return_index=True, return_inverse=True)
            break
        key, span = key + c * span, span * (hi + 1)
    else:
        _, first, inverse = np.unique(key, return_index=True, return_inverse=True)
    return Dims(**{k: c[first] for k, c in zip(names, cols)}), inverse.ravel(), shape


def _eager_norm(opts: MemoryOptions, rows, dim):
    """What an eager RMSNorm saves beyond the input the fused kernel keeps: its fp32 normalised
    copy (4 B per element; in bf16 the input's fp32 upcast and the bf16 result replace the bf16
    input, again +4 B) and the fp32 reciprocal RMS per row. Zero for fused kernels."""
    return 4 * rows * dim + 4 * rows if opts.kernels == "eager" else 0.0


def _lin(opts: MemoryOptions, d: Dims):
    """Bytes per element of a saved linear-layer input: FP8 under FP8 training (Transformer Engine)."""
    return np.where(d.fp8, opts.fp8_act_bytes, opts.act_bytes)


def attention_terms(spec: ModelSpec, opts: MemoryOptions, d: Dims) -> dict[str, object]:
    a, h, ab = spec.attention, spec.hidden, opts.act_bytes
    tok, rep, t, lin = d.tok, d.tok_rep, d.tp, _lin(opts, d)
    out: dict[str, object] = {LAYER_INPUT: ab * rep * h, "attn_in": lin * rep * h}
    if opts.kernels == "eager":
        out["ln1_eager"] = _eager_norm(opts, rep, h)
    if a.kind == "mla":
        if a.q_lora_rank:
            out["q_a_norm_in"] = ab * rep * a.q_lora_rank
            out["q_b_in"] = lin * rep * a.q_lora_rank
            if opts.kernels == "eager":
                out["q_a_norm_eager"] = _eager_norm(opts, rep, a.q_lora_rank)
        out["kv_a_norm_in"] = ab * rep * a.kv_lora_rank
        if opts.kernels == "eager":
            out["kv_a_norm_eager"] = _eager_norm(opts, rep, a.kv_lora_rank)
        out["kv_b_in"] = lin * rep * a.kv_lora_rank
        out["q"] = ab * tok * a.heads * a.head_dim / t
        out["k"] = ab * tok * a.heads * a.head_dim / t  # decompressed per-head keys (nope + rope)
        out["v"] = ab * tok * a.heads * a.v_head_dim / t
    else:
        kv_local = a.kv_heads / np.minimum(t, a.kv_heads)  # one whole KV head per rank when tp > kv
        out["q"] = ab * tok * a.heads * a.head_dim / t
        out["k"] = ab * tok * kv_local * a.head_dim
        out["v"] = ab * tok * kv_local * a.v_head_dim
        if a.qk_norm:
            out["qk_norm_in"] = out["q"] + out["k"]
            if opts.kernels == "eager":
                rows = tok * (a.heads / t + kv_local)
                out["qk_norm_eager"] = _eager_norm(opts, rows, a.head_dim)
    heads_local = a.heads / t
    if opts.attention == "eager":  # softmax output (b, a/t, s/c, s), and its dropout mask + output
        scores = tok * heads_local * np.asarray(d.seq)
        out["attn_scores"] = ab * scores
        if opts.dropout:
            out["attn_dropout"] = (1 + ab) * scores
    else:  # FlashAttention saves only the FP32 log-sum-exp per query and head
        out["attn_lse"] = 4 * tok * heads_local
    out["attn_out"] = lin * tok * a.heads * a.v_head_dim / t
    if opts.dropout:
        out["attn_drop_mask"] = 1 * rep * h
    return out


def _act_in(opts: MemoryOptions, d: Dims):
    """Bytes per element of a saved activation-function (SwiGLU) input: BF16, or FP8 under FP8
    training with ``act_func_fp8_input`` (MemoryOptions)."""
    return np.where(np.asarray(d.fp8) & opts.act_func_fp8_input, opts.fp8_act_bytes, opts.act_bytes)


def _mlp(prefix: str, gated: bool, inter: float, tokens, t, opts: MemoryOptions, lin, act) -> dict[str, object]:
    """Inside an MLP of width ``inter`` split ``t`` ways: activation input (``act`` bytes per
    element, :func:`_act_in`) and down-projection input (eager gated MLPs also keep the
    activation's output for the gate product)."""
    out = {f"{prefix}_act_in": act * tokens * (2 if gated else 1) * inter / t,
           f"{prefix}_down_in": lin * tokens * inter / t}
    if gated and opts.kernels == "eager":
        out[f"{prefix}_act_out"] = opts.act_bytes * tokens * inter / t
    return out


def mlp_terms(spec: ModelSpec, kind: str, opts: MemoryOptions, d: Dims) -> dict[str, object]:
    h, ab, rep, tok, lin = spec.hidden, opts.act_bytes, d.tok_rep, d.tok, _lin(opts, d)
    out: dict[str, object] = {"ln2_in": ab * rep * h}
    if opts.kernels == "eager":
        out["ln2_eager"] = _eager_norm(opts, rep, h)
    if kind == "moe":
        moe = spec.moe
        out["moe_in"] = ab * rep * h  # router input and dispatch source (kept in BF16)
        out["router_probs"] = 4 * rep * moe.experts  # FP32 scores for the softmax/sigmoid backward
        out["router_topk"] = 12 * rep * moe.top_k  # FP32 weights + int64 expert ids
        routed = routed_tokens(spec, opts, d)
        h_e, inter_e = expert_widths(spec)
        out["expert_in"] = lin * routed * h_e
        out.update(_mlp("expert", moe.expert.gated, inter_e, routed, d.etp, opts, lin, _act_in(opts, d)))
        if opts.moe_probs == "combine" or opts.kernels == "eager":  # dayzero's runtime weights y in the combine
            out["expert_out"] = ab * routed * h_e  # the combine's backward needs each expert's output
        out["dispatch_map"] = 8 * routed  # int64 permutation rows to un-permute
        if opts.kernels == "eager":  # the combine's gathered weights (fp32) and their int64 order;
            # the router's fp32 upcast of its input when computing in a narrower dtype
            out["combine_eager"] = 12 * routed + np.where(ab < 4, 4 * rep * h, 0)
        if moe.shared_experts:
            out.update(_mlp("shared", moe.expert.gated, moe.shared_intermediate, tok, d.tp, opts, lin,
                            _act_in(opts, d)))
    else:
        out["mlp_in"] = lin * rep * h
        out.update(_mlp("mlp", spec.mlp.gated, spec.mlp.intermediate, tok, d.tp, opts, lin, _act_in(opts, d)))
    if opts.dropout:
        out["mlp_drop_mask"] = 1 * rep * h
    return out


def recurrent_terms(spec: ModelSpec, opts: MemoryOptions, d: Dims) -> dict[str, object]:
    """What a recurrent mixer saves for backward (heads split by tp, as Megatron-Core's MambaMixer).

    The pre-norm's and in_proj's input (outside the TP region: sequence-parallel shards under SP)
    and out_proj's input; Mamba-2 what mamba_ssm's fused kernel and the norm keep
    (:func:`mamba2_saved`: the in_proj output, the ungated scan output, the norm's input; the conv
    output and the chunk states are recomputed in backward). Gated DeltaNet: the depthwise conv's
    input and output (q, k, v, which the chunked scan reads), its beta and decay inputs (2 per value
    head), the gate z, the scan output, and the FP32 chunk states (dk x dv per value head, Yang et
    al. 2024, arXiv 2406.06484, sec. 3.3). No term grows with the sequence beyond the tokens
    themselves: no score matrix."""
    r, h, ab = spec.recurrent, spec.hidden, opts.act_bytes
    tok, rep, t, lin = d.tok, d.tok_rep, d.tp, _lin(opts, d)
    out: dict[str, object] = {LAYER_INPUT: ab * rep * h, "rec_in": lin * rep * h}
    if opts.kernels == "eager":
        out["ln1_eager"] = _eager_norm(opts, rep, h)
    if r.kind == "mamba2":
        out.update(mamba2_saved(spec, opts, d))
    else:
        out["conv_in"] = ab * tok * r.conv_channels / t
        out["scan_in"] = ab * tok * r.conv_channels / t  # the conv's activated output: q, k, v
        out["scan_dt"] = ab * tok * r.heads * 2 / t
        out["gate_z"] = ab * tok * r.inner / t
        out["scan_out"] = ab * tok * r.inner / t
        out["scan_states"] = scan_states_bytes(spec, d)
    out["rec_out_in"] = lin * tok * r.inner / t
    if opts.dropout:
        out["rec_drop_mask"] = 1 * rep * h
    return out


def scan_states_bytes(spec: ModelSpec, d: Dims):
    """The FP32 chunk states of a recurrent mixer's chunked scan per micro-batch: one heads x
    head_dim x qk_dim state per chunk (Dao & Gu 2024 sec. 6; Yang et al. 2024 sec. 3.3), heads split by tp."""
    r = spec.recurrent
    chunks = d.tok / np.minimum(r.chunk_size, np.asarray(d.seq))
    return 4 * chunks * r.heads / d.tp * r.head_dim * r.qk_dim


def mamba2_saved(spec: ModelSpec, opts: MemoryOptions, d: Dims) -> dict[str, object]:
    """What a Mamba-2 mixer keeps for backward beyond its block input, as Megatron-Core's MambaMixer
    trains it (``_ssm_training``: mamba_ssm's ``mamba_split_conv1d_scan_combined``, then the grouped
    RMSNorm). ``MambaSplitConv1dScanCombinedFn.forward`` (mamba_ssm/ops/triton/ssd_combined.py)
    saves ``zxbcdt`` (the in_proj output: z, x B C before the conv, dt) and ``out_x`` (the scan
    output before the z gate), besides weights; its backward recomputes the conv output and the
    chunk states (``causal_conv1d_fwd``, ``_chunk_state_fwd``, ``_state_passing_fwd``), so neither
    is kept. The RMSNorm keeps its input (the gated output) and an FP32 rstd per token and group."""
    r, ab, tok, t = spec.recurrent, opts.act_bytes, d.tok, d.tp
    return {"rec_zxbcdt": ab * tok * r.in_features / t, "scan_out_x": ab * tok * r.inner / t,
            "rec_norm_in": ab * tok * r.inner / t, "rec_norm_rstd": 4 * tok * r.n_groups / t}


def expert_widths(spec: ModelSpec) -> tuple[int, int]:
    """(row width, intermediate width) of a routed expert's tensors. LatentMoE (MoESpec.latent_size)
    runs its experts on latent-wide rows with their own intermediate width, which the spec holds as
    the equivalent ``intermediate x latent / hidden`` (specs.hf_config._hybrid): undone here."""
    moe = spec.moe
    if moe.latent_size:
        return moe.latent_size, moe.expert.intermediate * spec.hidden // moe.latent_size
    return spec.hidden, moe.expert.intermediate


def routed_tokens(spec: ModelSpec, opts: MemoryOptions, d: Dims):
    """Token-expert assignments one rank computes per micro-batch.

    A stage's tp*cp*dp ranks hold dp*b*s distinct tokens (each TP rank routes its own 1/t slice, as
    Megatron requires SP with MoE); their k assignments spread over ep*edp = tp*cp*dp/etp expert
    shards, and the etp ranks of one shard see the same tokens: b*s*k*etp/(t*c) per rank, times the
    capacity factor (1.0: balanced and dropless). An expert's capacity is ``T k / E`` times the factor
    (Megatron-Core moe_utils.get_capacity, called with ``num_tokens * topk``) but no expert receives
    more than the ``T`` tokens themselves (a token picks an expert once), so a factor above ``E / k``
    holds no more than ``E / k`` does.
    """
    factor = min(opts.moe_capacity_factor, spec.moe.experts / spec.moe.top_k)
    return d.tok * spec.moe.top_k * np.asarray(d.etp) / d.tp * factor


def layer_terms(spec: ModelSpec, kind: str, opts: MemoryOptions, d: Dims) -> dict[str, object]:
    """Every tensor a layer of type ``kind`` (ModelSpec.layer_types: ``dense``, ``moe`` or a hybrid's
    ``mixer+ffn``) saves for backward without recompute, in bytes. A layer without a mixer starts
    at its FFN's pre-norm (that input is then the layer input). Mixers side by side
    (``attention&recurrent``) each save their own tensors and the normed input they share once; their
    outputs' sum saves nothing (an add's backward needs no input)."""
    mixer, ffn = split_layer_type(kind)
    parts = mixer_parts(mixer)
    out: dict[str, object] = {}
    if "attention" in parts:
        out.update(attention_terms(spec, opts, d))
    if "recurrent" in parts:
        rec = recurrent_terms(spec, opts, d)
        out.update({n: v for n, v in rec.items() if "attention" not in parts or n not in _SHARED_MIXER_INPUT})
    if ffn != "none":
        mlp = mlp_terms(spec, ffn, opts, d)
        if mixer == "none":
            mlp[LAYER_INPUT] = mlp.pop("ln2_in")
        out.update(mlp)
    traced = traced_act_bytes(spec, kind, d, spec.layer_act_extra)
    if opts.kernels == "eager":  # an unread mixer's reference algorithm, as the eager code runs it
        ref = traced_act_bytes(spec, kind, d, spec.layer_act_reference)
        traced = ref if traced is None else traced if ref is None else traced + ref
    if traced is not None:
        out[TRACED] = traced
    return out


def traced_act_bytes(spec: ModelSpec, kind: str, d: Dims, per_layer):
    """Saved bytes a derived layer's own code keeps beyond (negative: short of) the terms above
    (``per_layer``: ModelSpec.layer_act_extra or layer_act_reference, measured by
    dayzero.derive.traced_act): the mean over the layers of type ``kind`` (as planner.memory.params does for
    layer_extra) of ``linear + quadratic x seq`` per token, times this rank's tokens; None where
    nothing was measured.

    Which of those tensors tensor parallelism splits is not known, so the bound is taken each way:
    bytes beyond the terms are held whole on every TP rank (as if replicated, even under SP), bytes
    short of them are taken out of the TP-split share only (divided by tp): every term above is at
    least its unsplit value / tp, so a layer never counts less than its measured bytes / tp."""
    extras = [x for k, x in zip(spec.layer_types, per_layer) if k == kind]
    if not extras or not any(a or b for a, b in extras):
        return None
    lin = sum(a for a, _ in extras) / len(extras)
    quad = sum(b for _, b in extras) / len(extras)
    per_token = lin + quad * np.asarray(d.seq, dtype=float)
    return d.tok * np.where(per_token > 0, per_token, per_token / np.asarray(d.tp))


def module_terms(spec: ModelSpec, module: str, names) -> tuple[str, ...]:
    """The terms among ``names`` (a layer's saved tensors) that recomputing ``module`` drops."""
    if module == "mla_up_proj" and (not spec.has_attention or spec.attention.kind != "mla"):
        return ()
    return tuple(n for n in MODULE_TERMS[module] if n in names)


def recompute_modules_sets(spec: ModelSpec) -> list[tuple[str, ...]]:
    """Every set of Megatron-Core recompute modules that drops a different set of ``spec``'s saved
    tensors (:data:`dayzero.planner.memory.activations.MODULE_TERMS`): modules that drop nothing on this
    model are left out, and of sets that drop the same tensors only the smallest is kept (``moe``
    already drops what ``moe_act`` and ``shared_experts`` drop)."""
    names = set()
    for k in set(spec.layer_types):
        names |= set(layer_terms(spec, k, MemoryOptions(), Dims(seq=1, mbs=1, tp=1, cp=1)))
    useful = [m for m in RECOMPUTE_MODULES if module_terms(spec, m, names)]
    out, seen = [], set()
    for n in range(1, len(useful) + 1):
        for ms in combinations(useful, n):
            dropped = frozenset(t for m in ms for t in module_terms(spec, m, names))
            if dropped not in seen:
                seen.add(dropped)
                out.append(ms)
    return out


@dataclass(frozen=True)
class LayerActivation:
    """Saved bytes of one layer per micro-batch under each recompute mode, plus its transient."""

    none: object  # every saved tensor
    selective: object  # without the core-attention terms (selective recompute of core_attn alone)
    full: object  # the layer input only
    core: object  # what selective recompute of core_attn rebuilds during backward
    largest: object  # the largest single tensor (its gradient is the biggest backward temporary)
    recomputing: object = 0.0  # live at the peak of its backward under full recompute (full_recompute_transient)
    # selective recompute by module: the saved bytes grouped by the modules that drop them,
    # ((bitmask of those modules, bytes), ...) with bit i = RECOMPUTE_MODULES[i] (specs.grid.MODULE_BIT)
    dropped: tuple = ()
    rebuilt: tuple = ()  # ((module bit, bytes that module rebuilds in backward), ...)

    def columns(self) -> tuple:
        """Its bytes as a list of arrays (the fields, then ``dropped``'s and ``rebuilt``'s bytes) and
        the module bits those carry: :meth:`from_columns` undoes it."""
        cols = [self.none, self.selective, self.full, self.core, self.largest, self.recomputing]
        cols += [v for _, v in self.dropped] + [v for _, v in self.rebuilt]
        return cols, (tuple(b for b, _ in self.dropped), tuple(b for b, _ in self.rebuilt))

    @classmethod
    def from_columns(cls, cols, bits) -> "LayerActivation":
        dropped, rebuilt = bits
        rest = cols[6:]
        return cls(*cols[:6], dropped=tuple(zip(dropped, rest[:len(dropped)])),
                   rebuilt=tuple(zip(rebuilt, rest[len(dropped):])))

    def saved(self, modules):
        """Saved bytes under selective recompute of the module bitmask ``modules`` (array or int)."""
        out = self.none
        for bits, nbytes in self.dropped:
            out = out - np.where(np.asarray(modules) & bits, nbytes, 0.0)
        return out

    def rebuilding(self, modules):
        """The largest set of tensors one module rebuilds in backward (modules are replayed one at a
        time, each just before its own backward, and freed after it)."""
        out = 0.0
        for bit, nbytes in self.rebuilt:
            out = np.maximum(out, np.where(np.asarray(modules) & bit, nbytes, 0.0))
        return out


def layer_activations(spec: ModelSpec, kinds, opts: MemoryOptions, d: Dims) -> dict[str, LayerActivation]:
    """{kind: :func:`layer_activation` at every candidate of ``d``} for the layer ``kinds``, each
    distinct (seq, mbs, tp, cp, etp, sp, fp8) computed once and memoised (a search makes hundreds
    of memory calls over thousands of candidates with a few hundred distinct dims). Every byte is
    elementwise in these dims, so the result is layer_activation's, byte for byte."""
    distinct, inverse, shape = distinct_dims(d)
    keys = list(zip(*(np.asarray(getattr(distinct, k)).tolist() for k in DIMS)))
    out = {}
    for kind in kinds:
        memo = _memo(spec, kind, opts)
        missing = [i for i, k in enumerate(keys) if k not in memo]
        if missing:
            sub = Dims(**{k: np.asarray(getattr(distinct, k))[missing] for k in DIMS})
            cols, bits = layer_activation(spec, kind, opts, sub).columns()
            rows = np.stack([np.broadcast_to(np.asarray(c, dtype=float), (len(missing),)) for c in cols], axis=1)
            memo.update({keys[i]: row for i, row in zip(missing, rows)})
            memo[None] = bits  # the module bits the columns carry (the same at every dims)
        table = np.stack([memo[k] for k in keys], axis=1)[:, inverse]  # (columns, candidates)
        out[kind] = LayerActivation.from_columns([c.reshape(shape) for c in table], memo[None])
    return out


@lru_cache(maxsize=64)
def _memo(spec: ModelSpec, kind: str, opts: MemoryOptions) -> dict:
    """(dims tuple -> the layer's columns, LayerActivation.columns), filled by layer_activations: each
    value a pure function of its key."""
    return {}


def layer_activation(spec: ModelSpec, kind: str, opts: MemoryOptions, d: Dims) -> LayerActivation:
    from dayzero.specs.grid import MODULE_BIT

    terms = layer_terms(spec, kind, opts, d)
    total = sum(terms.values())
    core = sum((terms[k] for k in CORE_TERMS if k in terms), 0.0)
    # the traced term is a sum of tensors of unknown sizes, not one tensor: no candidate for the largest
    single = [v for n, v in terms.items() if n != TRACED]
    largest = np.maximum.reduce([np.asarray(v, dtype=float) for v in np.broadcast_arrays(*single)])
    if "recurrent" in mixer_parts(split_layer_type(kind)[0]) and spec.recurrent.kind == "mamba2":
        # the backward's recomputed conv output and FP32 chunk states (mamba2_saved), one at a time
        largest = np.maximum(largest, np.maximum(opts.act_bytes * d.tok * spec.recurrent.conv_channels / d.tp,
                                                 scan_states_bytes(spec, d)))
    if opts.kernels == "eager":
        largest = np.maximum(largest, eager_backward_transient(spec, kind, opts, d))
    by_term = {n: 0 for n in terms}
    rebuilt = []
    for m, bit in MODULE_BIT.items():
        names = module_terms(spec, m, terms)
        for n in names:
            by_term[n] |= bit
        if names:
            rebuilt.append((bit, sum(terms[n] for n in names)))
    groups: dict[int, object] = {}
    for n, bits in by_term.items():
        if bits:
            groups[bits] = groups.get(bits, 0.0) + terms[n]
    return LayerActivation(none=total, selective=total - core, full=terms[LAYER_INPUT], core=core, largest=largest,
                           recomputing=full_recompute_transient(spec, kind, opts, d, terms),
                           dropped=tuple(groups.items()), rebuilt=tuple(rebuilt))


# Saved tensors a block's backward has freed by the time its gradients peak (at the core
# attention's or the scan's backward; at the MLP's activation backward): those saved by the ops
# that run after that point in forward, whose backward has already run. The output projection's
# input (attention, recurrent mixer), the down-projection's input, and a MoE block's combine
# tensors (each expert row's output, the permutation, the gathered weights).
_FREED_BEFORE_MIXER_PEAK = ("attn_out", "attn_drop_mask", "rec_out_in", "rec_drop_mask")
_FREED_BEFORE_FFN_PEAK = ("mlp_down_in", "expert_down_in", "shared_down_in", "expert_out", "dispatch_map",
                          "combine_eager", "mlp_drop_mask")


def block_gradients(spec: ModelSpec, kind: str, opts: MemoryOptions, d: Dims) -> tuple[object, object]:
    """(mixer, FFN) gradients alive at once at each block's backward peak. Mixer: the gradients of
    q, k, v and of the attention output (a recurrent mixer's conv output, z and y,
    :func:`mixer_gradients`). FFN: at the gated product's backward (``act(gate) * up``),
    the gradient of its output (the down-projection input) and of its two inputs, 3 tensors of the
    MLP width (2 without a gate: output and input of the activation); autograd's mul backward
    computes both input gradients while its output gradient is held (torch/csrc/autograd/
    FunctionsManual.cpp, ``mul_tensor_backward``). A MoE block adds its rows' gradients of the
    dispatched width (the combine's, 2 of them, as :func:`eager_backward_transient`); its shared
    experts' backward runs apart from the routed experts' (the larger counts)."""
    mixer, ffn_kind = split_layer_type(kind)
    return mixer_gradients(spec, mixer, opts, d), ffn_gradients(spec, ffn_kind, opts, d, 3, shared_apart=True)


def ffn_gradients(spec: ModelSpec, ffn_kind: str, opts: MemoryOptions, d: Dims, gated_tensors: int,
                  shared_apart: bool):
    """Gradients of an FFN's backward alive at once: ``gated_tensors`` tensors of the MLP width in
    a gated MLP (2 without a gate); a MoE block's experts over their routed rows plus the combine's
    2 row gradients of the dispatched width, its shared experts' either apart (``shared_apart``:
    the larger of the two counts) or on top."""
    ab = opts.act_bytes

    def mlp(rows, inter, t, gated):
        return ab * rows * inter / t * (gated_tensors if gated else 2)

    if ffn_kind == "none":
        return 0.0
    if ffn_kind != "moe":
        return mlp(d.tok, spec.mlp.intermediate, d.tp, spec.mlp.gated)
    moe = spec.moe
    routed = routed_tokens(spec, opts, d)
    h_e, inter_e = expert_widths(spec)
    ffn = mlp(routed, inter_e, d.etp, moe.expert.gated)
    if moe.shared_experts:
        shared = mlp(d.tok, moe.shared_intermediate, d.tp, moe.expert.gated)
        ffn = np.maximum(ffn, shared) if shared_apart else ffn + shared
    return ffn + 2 * ab * routed * h_e


def full_recompute_transient(spec: ModelSpec, kind: str, opts: MemoryOptions, d: Dims, terms: dict):
    """Bytes live at the peak of a fully recomputed layer's backward (beyond its kept input): the
    largest over the backward's phases of what is live then, not the sum of each part's maximum.

    Non-reentrant activation checkpointing (torch.utils.checkpoint, ``use_reentrant=False``;
    Megatron-Core's ``CheckpointWithoutOutput`` likewise) rebuilds the whole layer at the first
    unpack of its backward, then hands each recomputed tensor to the op that saved it once (the
    unpack hook drops the checkpoint's reference), so autograd frees it when that op's backward
    has run. Phases, with the residual stream's gradient (1 hidden-wide tensor, 2 while a block's
    branch adds into it):

    1. the backward's first op: every recomputed tensor and the layer output's gradient;
    2. the FFN's peak (its activation's backward): the recomputed tensors but those the FFN's
       later ops saved (:data:`_FREED_BEFORE_FFN_PEAK`), with its gradients
       (:func:`block_gradients`);
    3. the mixer's peak: the mixer's recomputed tensors but its output projection's input, with
       its gradients (the FFN's tensors are freed by then); mixers side by side keep both mixers'
       tensors here (at the first one's peak the other's are still live) with the larger one's
       gradients (:func:`mixer_gradients`).

    Measured by ``dayzero memory --exact`` (benchmarks/RESULTS.md, "memory --exact vs the analytic
    model"): on Mixtral's MoE layer the exact maximum is phase 1, and at the experts' activation
    backward the live set is phase 2's."""
    ab, h, rep = opts.act_bytes, spec.hidden, d.tok_rep
    mixer, ffn_kind = split_layer_type(kind)
    rebuilt = {n: v for n, v in terms.items() if n != LAYER_INPUT}
    ffn_names = set(mlp_terms(spec, ffn_kind, opts, d)) if ffn_kind != "none" else set()
    mix_grads, ffn_grads = block_gradients(spec, kind, opts, d)
    phases = [sum(rebuilt.values(), 0.0) + ab * rep * h]
    if ffn_kind != "none":
        live = sum((v for n, v in rebuilt.items() if n not in _FREED_BEFORE_FFN_PEAK), 0.0)
        phases.append(live + ffn_grads + 2 * ab * rep * h)
    if mixer != "none":
        live = sum((v for n, v in rebuilt.items() if n not in ffn_names and n not in _FREED_BEFORE_MIXER_PEAK), 0.0)
        if "recurrent" in mixer_parts(mixer) and spec.recurrent.kind == "mamba2":  # its recomputed conv output
            live = live + np.maximum(ab * d.tok * spec.recurrent.conv_channels / d.tp, scan_states_bytes(spec, d))
        phases.append(live + mix_grads + 2 * ab * rep * h)
    return np.maximum.reduce([np.asarray(v, dtype=float) for v in np.broadcast_arrays(*phases)])


def mixer_gradients(spec: ModelSpec, mixer: str, opts: MemoryOptions, d: Dims):
    """Gradients alive together at a mixer's backward: in attention those of q, k, v and of the
    attention output; in a recurrent mixer those of the conv output, z and y. Mixers side by side
    run their backwards one after the other (autograd's engine runs one node at a time), each
    freeing its own gradients: the larger of the two."""
    out = 0.0
    if "attention" in mixer_parts(mixer):
        att = attention_terms(spec, opts, d)
        out = sum(np.asarray(att[k], dtype=float) for k in ("q", "k", "v", "attn_out") if k in att)
    if "recurrent" in mixer_parts(mixer):
        r = spec.recurrent
        out = np.maximum(out, opts.act_bytes * d.tok * (r.conv_channels + 2 * r.inner) / d.tp)
    return out


def eager_backward_transient(spec: ModelSpec, kind: str, opts: MemoryOptions, d: Dims):
    """Gradients alive together in an eager layer's backward (autograd frees each once used):
    in a gated MLP the gradients of the down-projection input, the activation output, the gate
    and the activation input (4 tensors of the MLP width; 2 without a gate), plus the block
    input's gradient accumulating from both branches (2 of the hidden width); in attention the
    gradients of q, k, v and of the attention output. A MoE layer's experts count their routed
    rows; its shared experts and the combine's row gradients come on top."""
    mixer, ffn_kind = split_layer_type(kind)
    attn = mixer_gradients(spec, mixer, opts, d)
    ffn = ffn_gradients(spec, ffn_kind, opts, d, 4, shared_apart=False)
    return np.maximum(attn, ffn) + 2 * opts.act_bytes * d.tok_rep * spec.hidden


def first_stage_terms(spec: ModelSpec, opts: MemoryOptions, d: Dims) -> dict[str, object]:
    """Per micro-batch on the first stage: token ids (int64) and the embedding dropout mask."""
    out = {"token_ids": 8 * d.tok}
    if opts.dropout:
        out["embed_drop_mask"] = 1 * d.tok_rep * spec.hidden
    return out


def last_stage_terms(spec: ModelSpec, opts: MemoryOptions, d: Dims) -> dict[str, object]:
    """Per micro-batch on the last stage: final-norm input and head input (Korthikanti's 4sbh/t)."""
    out = {"final_norm_in": opts.act_bytes * d.tok_rep * spec.hidden,
           "head_in": opts.act_bytes * d.tok_rep * spec.hidden}
    if opts.kernels == "eager":
        out["final_norm_eager"] = _eager_norm(opts, d.tok_rep, spec.hidden)
    return out


def logits_bytes(spec: ModelSpec, opts: MemoryOptions, d: Dims):
    """FP32 logits of one micro-batch for the vocab-parallel cross-entropy: s*b*V/(t*c) elements."""
    return opts.logits_bytes * d.tok * spec.vocab / d.tp
