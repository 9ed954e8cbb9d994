"""Exact parameter and FLOP counts of a ModelSpec.

Parameters are counted the way the model's own Hugging Face implementation holds them: every
weight, bias and norm vector; tied embeddings once; MTP layers only on request; FP8 scale tensors
never (they are not parameters; :func:`checkpoint_elements` counts what a checkpoint stores).

FLOPs count multiply-adds of matrix products as 2 FLOPs: every weight matrix a token passes
through, plus attention's score (QK^T) and context (PV) products. Elementwise work (norms,
activations, softmax, biases) is not counted, as in Narayanan et al. 2021 and PaLM's MFU.
Attention convention: ``causal=False`` (default) counts the full s x s score matrix, matching
Narayanan et al.'s closed form 72*l*h^2*(1 + s/6h + V/12lh) per sequence; ``causal=True`` counts
only the lower triangle (half), as FlashAttention-style kernels execute it.

Recurrent mixers (:class:`~dayzero.specs.model.RecurrentSpec`) cost their projections (2 FLOPs per
weight per token, like every linear) plus the chunked scan, linear in the sequence length
(:func:`recurrent_scan_flops_per_token`); their depthwise conv, gates and norm are elementwise.
A layer with both side by side (``attention&recurrent``, :func:`~dayzero.specs.model.mixer_parts`)
counts both mixers; their outputs' sum is elementwise.
"""

from __future__ import annotations

from dataclasses import dataclass

from dayzero.specs.model import AttentionSpec, MLPSpec, ModelSpec, MoESpec, RecurrentSpec, mixer_parts, split_layer_type

# "other": parameters of a layer that the shapes do not express (derived specs only, see ModelSpec.layer_extra)
COMPONENTS = ("attention", "recurrent", "dense_mlp", "routed_experts", "shared_experts", "router", "norms", "other")


@dataclass(frozen=True)
class LayerCount:
    """Parameters of one decoder layer, by component."""

    index: int
    kind: str  # the layer type: dense | moe, or mixer+ffn for hybrid layers (ModelSpec.layer_types)
    attention: int
    dense_mlp: int
    routed_experts: int
    shared_experts: int
    router: int
    norms: int
    other: int = 0
    recurrent: int = 0  # a recurrent (SSM / linear-attention) mixer

    @property
    def total(self) -> int:
        return sum(getattr(self, c) for c in COMPONENTS)

    def as_dict(self) -> dict:
        return {"index": self.index, "kind": self.kind, **{c: getattr(self, c) for c in COMPONENTS},
                "total": self.total}


# -- building blocks ---------------------------------------------------------------------------

def mlp_params(m: MLPSpec, hidden: int) -> int:
    mats = 3 if m.gated else 2
    w = mats * hidden * m.intermediate
    if m.bias:
        w += (2 if m.gated else 1) * m.intermediate + hidden
    return w


def mlp_matmul_params(m: MLPSpec, hidden: int) -> int:
    return (3 if m.gated else 2) * hidden * m.intermediate


def attention_matmul_params(a: AttentionSpec, hidden: int) -> int:
    """Weights of attention's linear projections (what a token multiplies through)."""
    if a.kind == "mla":
        qk = a.heads * a.head_dim
        q = hidden * qk if a.q_lora_rank is None else hidden * a.q_lora_rank + a.q_lora_rank * qk
        kv = (hidden * (a.kv_lora_rank + a.qk_rope_head_dim)
              + a.kv_lora_rank * a.heads * (a.qk_nope_head_dim + a.v_head_dim))
        return q + kv + a.heads * a.v_head_dim * hidden
    q = hidden * a.heads * a.head_dim
    kv = hidden * a.kv_heads * (a.head_dim + a.v_head_dim)
    return q + kv + a.heads * a.v_head_dim * hidden


def attention_params(a: AttentionSpec, hidden: int) -> int:
    w = attention_matmul_params(a, hidden)
    if a.kind == "mla":
        w += a.kv_lora_rank + (a.q_lora_rank or 0)  # kv_a_layernorm, q_a_layernorm
        if a.qkv_bias:  # q_a_proj (or none when q_proj is used) and kv_a_proj_with_mqa biases
            w += (a.q_lora_rank or 0) + a.kv_lora_rank + a.qk_rope_head_dim
    else:
        if a.qkv_bias:
            w += a.heads * a.head_dim + a.kv_heads * (a.head_dim + a.v_head_dim)
        if a.qk_norm:
            w += 2 * a.head_dim
    if a.o_bias:
        w += hidden
    if a.sinks:
        w += a.heads
    return w


def recurrent_matmul_params(r: RecurrentSpec, hidden: int) -> int:
    """Weights of a recurrent mixer's input and output projections (what a token multiplies through)."""
    return hidden * r.in_features + r.inner * hidden


def recurrent_params(r: RecurrentSpec, hidden: int) -> int:
    """Every parameter of a recurrent mixer, as transformers holds them.

    mamba2 (``Mamba2Mixer``, ``NemotronHMamba2Mixer``): in_proj H x (2 inner + 2 groups d_state +
    heads), depthwise conv1d over inner + 2 groups d_state channels (kernel weights + bias),
    dt_bias, A_log and D per head, the gated RMSNorm over the inner width, out_proj inner x H.
    gated_deltanet (``Qwen3NextGatedDeltaNet``): in_proj_qkvz and in_proj_ba, a bias-free depthwise
    conv over q, k, v, dt_bias and A_log per value head, a gated RMSNorm of one value head's width,
    out_proj."""
    w = recurrent_matmul_params(r, hidden)
    if r.proj_bias:
        w += r.in_features + hidden
    w += r.conv_channels * r.conv_kernel + (r.conv_channels if r.conv_bias else 0)
    w += (3 if r.kind == "mamba2" else 2) * r.heads
    if r.gated_norm:
        w += r.inner if r.kind == "mamba2" else r.head_dim
    return w


def router_params(moe: MoESpec, hidden: int) -> int:
    return moe.experts * hidden + (moe.experts if moe.router_bias else 0) + (
        moe.experts if moe.score_correction_bias else 0) + (hidden if moe.shared_expert_gate else 0)


def shared_mlp(moe: MoESpec) -> MLPSpec | None:
    if not moe.shared_experts:
        return None
    return MLPSpec(moe.shared_intermediate, gated=moe.expert.gated, bias=moe.expert.bias)


def norm_params(spec: ModelSpec) -> int:
    """One norm over the hidden width."""
    return spec.hidden * (2 if spec.norm_bias else 1)


def layer_count(spec: ModelSpec, index: int, kind: str | None = None) -> LayerCount:
    """Parameters of layer ``index`` (``kind``: a layer type, ModelSpec.layer_types; default the
    layer's own). Each block present (mixer, feed-forward) has its own pre-norm; mixers side by side
    share one (FalconH1DecoderLayer's ``input_layernorm`` feeds both)."""
    kind = kind or spec.layer_types[index]
    mixer, ffn = split_layer_type(kind)
    h = spec.hidden
    dense = routed = shared = router = 0
    if ffn == "moe":
        moe = spec.moe
        routed = moe.experts * mlp_params(moe.expert, h)
        sm = shared_mlp(moe)
        shared = mlp_params(sm, h) if sm else 0
        router = router_params(moe, h)
    elif ffn == "dense":
        dense = mlp_params(spec.mlp, h)
    parts = mixer_parts(mixer)
    att = attention_params(spec.attention, h) if "attention" in parts else 0
    rec = recurrent_params(spec.recurrent, h) if "recurrent" in parts else 0
    blocks = (mixer != "none") + (ffn != "none")
    return LayerCount(index=index, kind=kind, attention=att, dense_mlp=dense,
                      routed_experts=routed, shared_experts=shared, router=router, norms=blocks * norm_params(spec),
                      other=spec.layer_extra[index] if index < spec.layers else 0, recurrent=rec)


# -- totals ------------------------------------------------------------------------------------

def embedding_params(spec: ModelSpec) -> int:
    """Input embedding (+ learned positions); the output head when it is tied. A derived spec's
    parameters outside the layers that the shapes do not express (``outside_extra``) count here."""
    e = spec.vocab * spec.hidden + spec.outside_extra
    if spec.position == "learned":
        e += spec.max_positions * spec.hidden
    return e


def head_params(spec: ModelSpec) -> int:
    """Output projection (0 when tied to the embedding)."""
    return 0 if spec.tie_embeddings else spec.vocab * spec.hidden


def mtp_layer_params(spec: ModelSpec) -> int:
    """One multi-token-prediction module without its shared embedding/head copies:
    a decoder layer + enorm + hnorm + eh_proj (2H x H) + shared_head.norm."""
    if not spec.mtp_layers:
        return 0
    h = spec.hidden
    return layer_count(spec, spec.layers, spec.mtp_kind).total + 3 * norm_params(spec) + 2 * h * h


def params_total(spec: ModelSpec, with_mtp: bool = False) -> int:
    total = embedding_params(spec) + head_params(spec) + norm_params(spec)
    total += sum(layer_count(spec, i).total for i in range(spec.layers))
    if with_mtp:
        total += spec.mtp_layers * mtp_layer_params(spec)
    return total


def params_active(spec: ModelSpec) -> int:
    """Parameters a token touches: total minus the routed experts it is not sent to
    (embedding and head included, as in DeepSeek's and Mixtral's published active counts)."""
    total = params_total(spec)
    if spec.moe is None:
        return total
    idle = (spec.moe.experts - spec.moe.top_k) * mlp_params(spec.moe.expert, spec.hidden)
    return total - idle * spec.num_moe_layers


def checkpoint_elements(spec: ModelSpec) -> int:
    """Every tensor element a Hugging Face checkpoint of this model stores: main model, MTP
    modules with their own copies of embed_tokens and shared_head.head, and FP8 block scales."""
    total = params_total(spec, with_mtp=True)
    total += spec.mtp_layers * (spec.vocab * spec.hidden * 2)
    if spec.fp8_block:
        total += fp8_scale_elements(spec)
    return total


def fp8_scale_elements(spec: ModelSpec) -> int:
    """weight_scale_inv elements: ceil(out/b0) x ceil(in/b1) per quantized Linear (every linear of
    the decoder and MTP layers except routers, embeddings, heads and the MTP eh_proj; matches
    DeepSeek-V3's published F32 element count exactly)."""
    b0, b1 = spec.fp8_block
    h = spec.hidden

    def blocks(out_f: int, in_f: int) -> int:
        return -(-out_f // b0) * -(-in_f // b1)

    def mlp_blocks(m: MLPSpec) -> int:
        return (2 if m.gated else 1) * blocks(m.intermediate, h) + blocks(h, m.intermediate)

    a = spec.attention
    if a.kind == "mla":
        att = blocks(a.kv_lora_rank + a.qk_rope_head_dim, h) + blocks(a.heads * (a.qk_nope_head_dim + a.v_head_dim),
                                                                      a.kv_lora_rank)
        att += blocks(h, a.heads * a.v_head_dim)
        if a.q_lora_rank is None:
            att += blocks(a.heads * a.head_dim, h)
        else:
            att += blocks(a.q_lora_rank, h) + blocks(a.heads * a.head_dim, a.q_lora_rank)
    else:
        att = blocks(a.heads * a.head_dim, h) + 2 * blocks(a.kv_heads * a.head_dim,
                                                           h) + blocks(h, a.heads * a.v_head_dim)

    r = spec.recurrent
    rec = blocks(r.in_features, h) + blocks(h, r.inner) if r is not None else 0

    def layer_blocks(kind: str) -> int:
        mixer, ffn = split_layer_type(kind)
        parts = mixer_parts(mixer)
        out = att * ("attention" in parts) + rec * ("recurrent" in parts)
        if ffn == "moe":
            sm = shared_mlp(spec.moe)
            return out + spec.moe.experts * mlp_blocks(spec.moe.expert) + (mlp_blocks(sm) if sm else 0)
        return out + (mlp_blocks(spec.mlp) if ffn == "dense" else 0)

    total = sum(layer_blocks(k) for k in spec.layer_types)
    total += spec.mtp_layers * layer_blocks(spec.mtp_kind)
    return total


# -- FLOPs -------------------------------------------------------------------------------------

def attention_context(spec: ModelSpec, seq: int, index: int, causal: bool) -> float:
    """Average number of keys a query attends to in layer ``index``. Packed documents of mean
    length d (``spec.document_length``) bound the context as a sequence of d would: causal
    attention over documents of length d in a window of s costs s (d + 1) / 2 keys per head
    dimension instead of s (s + 1) / 2."""
    if spec.document_length and spec.document_length < seq:
        seq = spec.document_length
    window = spec.layer_windows[index]
    if causal:
        if window and window < seq:  # first w queries see (i+1) keys, the rest see w
            return (window * (window + 1) / 2 + (seq - window) * window) / seq
        return (seq + 1) / 2
    return float(min(seq, window) if window else seq)


def layer_matmul_params(spec: ModelSpec, kind: str) -> int:
    """Weights one token multiplies through in a layer of type ``kind`` (routed experts: top_k of them)."""
    h = spec.hidden
    mixer, ffn = split_layer_type(kind)
    parts = mixer_parts(mixer)
    w = 0
    if "attention" in parts:
        w += attention_matmul_params(spec.attention, h)
    if "recurrent" in parts:
        w += recurrent_matmul_params(spec.recurrent, h)
    if ffn == "moe":
        moe = spec.moe
        w += moe.top_k * mlp_matmul_params(moe.expert, h) + moe.experts * h
        sm = shared_mlp(moe)
        w += mlp_matmul_params(sm, h) if sm else 0
    elif ffn == "dense":
        w += mlp_matmul_params(spec.mlp, h)
    return w


def attention_flops_per_token(spec: ModelSpec, seq: int, index: int, causal: bool) -> float:
    """QK^T and PV of layer ``index`` per token (0 where the layer has no softmax attention)."""
    if "attention" not in mixer_parts(spec.layer_mixers[index]):
        return 0.0
    a = spec.attention
    keys = attention_context(spec, seq, index, causal)
    return 2.0 * keys * a.heads * (a.head_dim + a.v_head_dim)  # QK^T and PV


def recurrent_scan_flops_per_token(r: RecurrentSpec, seq: int, causal: bool) -> float:
    """Forward FLOPs per token of a recurrent mixer's chunked scan (the matmuls inside it; its
    projections are counted as linears). Linear in the sequence length: each token works against
    the ``Q = min(chunk_size, seq)`` tokens of its chunk and one state per head.

    mamba2 (SSD, Dao & Gu 2024, arXiv 2405.21060, sec. 6 "the SSD algorithm", steps 1-4): the
    diagonal blocks C B^T per group (Q x N per token) and their product with X per head (Q x P),
    the chunk states B^T X and the state-to-output C h (N x P each per head); the inter-chunk
    recurrence is N x P per chunk, negligible. gated_deltanet (chunkwise delta rule, Yang et al.
    2024, arXiv 2406.06484, sec. 3.3, with Gated DeltaNet's decay, arXiv 2412.06464 sec. 3.3): per
    value head K K^T, W = T K and Q K^T (Q x dk each), U = T V and the masked scores times U - W S
    (Q x dv each), and W S, Q S and the state update K^T (U - W S) (dk x dv each).
    ``causal``: the masked within-chunk products count their lower triangle only ((Q + 1) / 2
    keys), as the attention convention of this module.

    For comparison, Megatron-LM's ``num_floating_point_operations`` (megatron/training/training.py)
    counts a Mamba layer's scan as 7 d_in N per token (its note: "should be updated based on new
    SSD kernels") and Gated DeltaNet's as 2 x 4 heads dv^2; for Nemotron-H 8B's mixer (d_in 8,192,
    N 128, chunk 256) that is 7.3 M FLOPs per token against 8.9 M here: both a few percent of the
    layer's projections (2 x 4,096 x (18,560 + 8,192) = 219 M)."""
    q = min(r.chunk_size, seq)
    ctx = (q + 1) / 2 if causal else float(q)
    if r.kind == "mamba2":
        return 2.0 * (ctx * r.d_state * r.n_groups + r.heads * (ctx * r.head_dim + 2 * r.d_state * r.head_dim))
    dk, dv = r.key_head_dim, r.head_dim
    return 2.0 * r.heads * (ctx * (3 * dk + 2 * dv) + 3 * dk * dv)


@dataclass(frozen=True)
class FlopsPerToken:
    forward: float
    train: float  # forward + backward (2x forward), no recompute
    matmul_forward: float
    attention_forward: float
    head_forward: float
    recurrent_forward: float = 0.0  # recurrent mixers' chunked scans
    traced_forward: float = 0.0  # what tracing the model's own code adds beyond the shapes (derived specs)


def layer_forward_flops(spec: ModelSpec, index: int, seq: int, causal: bool) -> float:
    """Forward FLOPs per token of decoder layer ``index`` as the shapes give them (linears, the
    attention core, a recurrent scan), without ModelSpec.layer_flops_extra."""
    f = 2.0 * layer_matmul_params(spec, spec.layer_types[index]) + attention_flops_per_token(spec, seq, index, causal)
    if "recurrent" in mixer_parts(spec.layer_mixers[index]):
        f += recurrent_scan_flops_per_token(spec.recurrent, seq, causal)
    return f


def traced_extra_flops(spec: ModelSpec, index: int, seq: int, causal: bool) -> float:
    """ModelSpec.layer_flops_extra of layer ``index`` at ``seq``: linear + quadratic x keys, the keys
    halved when causal (the convention of :func:`attention_context`); 0 beyond the listed layers."""
    if index >= len(spec.layer_flops_extra):
        return 0.0
    lin, quad = spec.layer_flops_extra[index]
    return lin + quad * ((seq + 1) / 2 if causal else seq)


def flops_per_token(spec: ModelSpec, seq: int | None = None, causal: bool = False) -> FlopsPerToken:
    """Model FLOPs per token at sequence length ``seq`` (default: min(max_positions, 4096))."""
    seq = seq or min(spec.max_positions, 4096)
    mm = sum(2.0 * layer_matmul_params(spec, k) for k in spec.layer_types)
    att = sum(attention_flops_per_token(spec, seq, i, causal) for i in range(spec.layers))
    n_rec = sum("recurrent" in mixer_parts(m) for m in spec.layer_mixers)
    rec = n_rec * recurrent_scan_flops_per_token(spec.recurrent, seq, causal) if n_rec else 0.0
    head = 2.0 * spec.vocab * spec.hidden
    traced = sum(traced_extra_flops(spec, i, seq, causal) for i in range(spec.layers))
    fwd = mm + att + rec + head + traced
    return FlopsPerToken(forward=fwd, train=3.0 * fwd, matmul_forward=mm, attention_forward=att, head_forward=head,
                         recurrent_forward=rec, traced_forward=traced)


def mtp_flops_per_token(spec: ModelSpec, seq: int | None = None, causal: bool = False) -> float:
    """Training FLOPs per token of the multi-token-prediction modules (0 without them): per module
    its decoder layer (the last layer's kind and attention), the eh_proj of [norm(h); norm(emb)]
    (2H x H) and a second pass through the shared output head, forward x 3. Megatron-LM counts
    them in its model FLOPs (megatron/training/training.py num_floating_point_operations: "MTP
    norms and proj" 2 H^2 and the logits x (mtp_num_layers + 1)); DeepSeek-V3 sec. 2.2 for the
    module."""
    if not spec.mtp_layers:
        return 0.0
    seq = seq or min(spec.max_positions, 4096)
    h = spec.hidden
    layer = 2.0 * layer_matmul_params(spec, spec.mtp_kind)
    if "attention" in mixer_parts(split_layer_type(spec.mtp_kind)[0]):
        layer += attention_flops_per_token(spec, seq, spec.layers - 1, causal)
    return 3.0 * spec.mtp_layers * (layer + 2.0 * 2 * h * h + 2.0 * spec.vocab * h)


@dataclass(frozen=True)
class Summary:
    params_total: int
    params_total_with_mtp: int
    params_active: int
    params_embedding: int
    params_head: int
    checkpoint_elements: int
    flops: FlopsPerToken
    seq: int
    causal: bool
    layers: list[LayerCount]

    def to_dict(self, spec: ModelSpec, with_mtp: bool = False) -> dict:
        """The ``dayzero inspect --json`` object of ``spec`` (this summary's model)."""
        return {
            "name": spec.name, "model_type": spec.model_type,
            "params_total": self.params_total_with_mtp if with_mtp else self.params_total,
            "params_total_main": self.params_total, "params_total_with_mtp": self.params_total_with_mtp,
            "params_active": self.params_active, "params_embedding": self.params_embedding,
            "params_head": self.params_head, "checkpoint_elements": self.checkpoint_elements,
            "flops_per_token_train": self.flops.train, "flops_per_token_forward": self.flops.forward,
            "flops_breakdown_forward": {"matmul": self.flops.matmul_forward, "attention": self.flops.attention_forward,
                                        "head": self.flops.head_forward,
                                        **({"recurrent": self.flops.recurrent_forward}
                                           if spec.recurrent is not None else {}),
                                        **({"traced": self.flops.traced_forward}
                                           if self.flops.traced_forward else {})},
            "seq": self.seq, "causal": self.causal, "layers": spec.layers, "mtp_layers": spec.mtp_layers,
            "hidden": spec.hidden, "vocab": spec.vocab,
            "per_layer": [lc.as_dict() for lc in self.layers],
        }


def summarize(spec: ModelSpec, seq: int | None = None, causal: bool = False) -> Summary:
    seq = seq or min(spec.max_positions, 4096)
    return Summary(params_total=params_total(spec), params_total_with_mtp=params_total(spec, with_mtp=True),
                   params_active=params_active(spec), params_embedding=embedding_params(spec),
                   params_head=head_params(spec), checkpoint_elements=checkpoint_elements(spec),
                   flops=flops_per_token(spec, seq, causal), seq=seq, causal=causal,
                   layers=[layer_count(spec, i) for i in range(spec.layers)])
