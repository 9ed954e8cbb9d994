"""ModelSpec: what a decoder-only transformer is, independent of any framework.

A ModelSpec is built from a Hugging Face ``config.json`` by :mod:`dayzero.specs.hf_config` and
is the single description of the model used by counting, the planner, the runtime's model zoo and
operator tracing. It holds shapes only, never weights.

Vocabulary (names as in the papers / HF configs):
    hidden      H, the residual width
    heads       attention (query) heads; ``kv_heads`` key/value heads (GQA/MQA when fewer)
    head_dim    query/key width per head (for MLA: nope + rope dims)
    layer kinds each decoder layer's feed-forward block is ``dense`` (one MLP), ``moe`` (router +
                experts) or ``none`` (hybrid models whose layers are either a mixer or an FFN)
    mixers      each decoder layer's token mixer is ``attention`` (softmax attention over
                ``attention``'s shapes), ``recurrent`` (a state-space / linear-attention mixer of
                ``recurrent``'s shapes), ``none``, or both side by side, ``attention&recurrent``
                (a parallel hybrid: both read the layer's one normed input, their outputs summed)
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass, field, replace
from typing import Literal

Norm = Literal["rmsnorm", "layernorm"]
Activation = Literal["silu", "gelu", "relu2", "swiglu_clamped"]


@dataclass(frozen=True)
class AttentionSpec:
    """Self-attention block shapes.

    ``kind`` is ``gqa`` (covers MHA when kv_heads == heads, and MQA when kv_heads == 1) or ``mla``
    (DeepSeek multi-head latent attention: low-rank compressed Q (optional) and KV).
    """

    kind: Literal["gqa", "mla"]
    heads: int
    kv_heads: int
    head_dim: int  # q/k width per head (MLA: qk_nope_head_dim + qk_rope_head_dim)
    v_head_dim: int
    qkv_bias: bool = False
    o_bias: bool = False
    qk_norm: bool = False  # per-head RMSNorm on q and k (Qwen3, GLM-4.5)
    sinks: bool = False  # one learned logit per head (gpt-oss)
    # MLA only
    q_lora_rank: int | None = None
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    qk_nope_head_dim: int = 0
    # sliding-window attention: window size (tokens); which layers use it is in ModelSpec.layer_windows
    sliding_window: int | None = None
    # RoPE applied to interleaved pairs (x0, x1), (x2, x3), ... instead of halves (DeepSeek MLA checkpoints)
    rope_interleave: bool = False


@dataclass(frozen=True)
class MLPSpec:
    """A feed-forward block: gated (SwiGLU: gate, up, down) or plain (up, down)."""

    intermediate: int
    gated: bool = True
    bias: bool = False
    activation: Activation = "silu"
    # ``swiglu_clamped`` only (gpt-oss): glu = gate * sigmoid(alpha * gate), out = (up + 1) * glu, with
    # gate clamped to <= limit and up to [-limit, limit] (transformers GptOssExperts._apply_gate)
    swiglu_alpha: float | None = None
    swiglu_limit: float | None = None


@dataclass(frozen=True)
class MoESpec:
    """Mixture-of-experts block: a router over ``experts`` routed experts, ``top_k`` per token,
    plus ``shared_experts`` always-on experts (fused as one MLP of ``shared_intermediate``)."""

    experts: int
    top_k: int
    expert: MLPSpec
    shared_experts: int = 0
    shared_intermediate: int = 0
    router_bias: bool = False  # a bias on the router linear (gpt-oss)
    score_correction_bias: bool = False  # noaux_tc per-expert bias (DeepSeek-V3, GLM-4.5)
    shared_expert_gate: bool = False  # sigmoid gate on the shared expert (Qwen2-MoE style)
    scoring: Literal["softmax", "sigmoid"] = "softmax"
    aux_loss_coef: float = 0.0
    # routing details (HF names): renormalise the top-k weights, scale them, and group-limited
    # selection (DeepSeek-V3: pick ``topk_group`` of ``n_group`` expert groups first)
    norm_topk_prob: bool = True
    routed_scaling_factor: float = 1.0
    n_group: int = 1
    topk_group: int = 1
    # LatentMoE (Nemotron 3 Super): the width tokens are dispatched in (the routed experts run in a
    # latent of this width between two dense projections); 0: the hidden width
    latent_size: int = 0


@dataclass(frozen=True)
class RecurrentSpec:
    """A recurrent token mixer: a fixed-size state per head instead of a softmax over keys.

    ``mamba2``: Mamba-2's SSD mixer (Dao & Gu 2024, "Transformers are SSMs", arXiv 2405.21060,
    sec. 7.1 and fig. 6; transformers ``Mamba2Mixer`` / ``NemotronHMamba2Mixer``). ``heads`` SSM
    heads of ``head_dim`` channels (inner width = heads x head_dim), B and C shared by ``n_groups``
    groups of ``d_state``; in_proj H -> 2 inner + 2 groups d_state + heads (z, x, B, C, dt), a
    depthwise causal conv over x, B, C; dt_bias, A_log and D per head; a gated RMSNorm over the
    inner width; out_proj inner -> H.

    ``gated_deltanet``: Gated DeltaNet linear attention (Yang et al. 2024, arXiv 2412.06464;
    transformers ``Qwen3NextGatedDeltaNet``): ``key_heads`` q/k heads of ``key_head_dim``,
    ``heads`` value heads of ``head_dim``; in_proj_qkvz H -> 2 keys + 2 values, in_proj_ba
    H -> 2 value heads, a depthwise conv over q, k, v, dt_bias and A_log per value head, a gated
    RMSNorm of one value head's width (shared by the heads), out_proj values -> H.
    """

    kind: Literal["mamba2", "gated_deltanet"]
    heads: int  # mamba2: SSM heads; gated_deltanet: value heads
    head_dim: int  # mamba2: channels per head (P); gated_deltanet: value head width
    d_state: int = 0  # mamba2: state size N per group
    n_groups: int = 1  # mamba2: groups sharing B and C
    key_heads: int = 0  # gated_deltanet: q/k heads
    key_head_dim: int = 0  # gated_deltanet: q/k head width
    conv_kernel: int = 4
    chunk_size: int = 256  # the chunked scan's block length (SSD sec. 6; GDN kernels: 64)
    gated_norm: bool = True
    conv_bias: bool = True
    proj_bias: bool = False

    @property
    def inner(self) -> int:
        """Width of the values (x): heads x head_dim."""
        return self.heads * self.head_dim

    @property
    def qk_heads(self) -> int:
        """Heads of the key/query-like inputs (mamba2: the B/C groups; GDN: key heads)."""
        return self.n_groups if self.kind == "mamba2" else self.key_heads

    @property
    def qk_dim(self) -> int:
        """Width of one key/query-like head (mamba2: d_state; GDN: key_head_dim)."""
        return self.d_state if self.kind == "mamba2" else self.key_head_dim

    @property
    def conv_channels(self) -> int:
        """Channels of the depthwise conv: x (values) plus the key/query-like inputs."""
        return self.inner + 2 * self.qk_heads * self.qk_dim

    @property
    def in_features(self) -> int:
        """Output width of the input projection(s) (mamba2: z, x, B, C, dt; GDN: q, k, v, z, b, a)."""
        if self.kind == "mamba2":
            return 2 * self.inner + 2 * self.n_groups * self.d_state + self.heads
        return 2 * self.key_heads * self.key_head_dim + 2 * self.inner + 2 * self.heads


MIXERS = ("attention", "recurrent")  # the token mixers a layer can hold, in the order an entry lists them
PARALLEL = "&"  # joins the mixers of a layer that runs several side by side


def mixer_parts(mixer: str) -> tuple[str, ...]:
    """The token mixers of a ModelSpec.layer_mixers entry: ``attention`` -> ("attention",),
    ``attention&recurrent`` -> ("attention", "recurrent"), ``none`` -> ().

    Several mixers side by side are a parallel hybrid's layer: transformers' FalconH1DecoderLayer
    (models/falcon_h1/modeling_falcon_h1.py, forward) feeds its ``input_layernorm`` output to the
    Mamba-2 mixer and to attention and adds the two outputs before the residual. The layer costs
    each mixer's parameters, FLOPs and saved tensors, with one pre-norm and one layer input between
    them ("&", not "+": "+" joins a layer type's mixer and feed-forward block, :func:`layer_type`)."""
    return () if mixer == "none" else tuple(mixer.split(PARALLEL))


def parallel_mixer(parts) -> str:
    """The layer_mixers entry of ``parts`` side by side, in MIXERS order (``none`` for no mixer)."""
    chosen = set(parts)
    got = [m for m in MIXERS if m in chosen]
    return PARALLEL.join(got) if got else "none"


def layer_type(mixer: str, ffn: str) -> str:
    """The key of a (mixer, feed-forward) pair: ``dense`` / ``moe`` for softmax attention with that
    FFN (every transformer layer, as before hybrids), else ``mixer+ffn`` (``recurrent+none``)."""
    return ffn if mixer == "attention" and ffn != "none" else f"{mixer}+{ffn}"


def split_layer_type(t: str) -> tuple[str, str]:
    """Inverse of :func:`layer_type`: (mixer, ffn)."""
    if "+" in t:
        mixer, ffn = t.split("+", 1)
        return mixer, ffn
    return "attention", t


# the proxy sizes of ModelSpec.shrink, the names of the --layers/--hidden/--experts/--vocab flags
SHRINK_KEYS = ("layers", "hidden", "experts", "vocab")


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only language model, by shape."""

    name: str
    model_type: str
    hidden: int
    layers: int  # main decoder layers (MTP layers excluded)
    vocab: int
    attention: AttentionSpec
    mlp: MLPSpec  # the dense MLP (used by dense layers)
    moe: MoESpec | None = None
    layer_kinds: tuple[str, ...] = ()  # "dense" | "moe" | "none" (no FFN) per layer; empty means all dense
    layer_windows: tuple[int | None, ...] = ()  # sliding window per layer (None = full); empty = all full
    norm: Norm = "rmsnorm"
    norm_bias: bool = False  # LayerNorm with bias (GPT-2, Nemotron)
    tie_embeddings: bool = False
    position: Literal["rope", "learned"] = "rope"
    max_positions: int = 4096
    mtp_layers: int = 0  # multi-token-prediction modules (DeepSeek-V3, GLM-4.5)
    mtp_kind: str = ""  # kind of the MTP decoder layer (default: the last layer's kind)
    fp8_block: tuple[int, int] | None = None  # block-quantized FP8 checkpoint (scale tensors)
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    # exact counts of a description derived from the modeling code (dayzero.derive): per decoder layer,
    # the parameters its module tree holds beyond (negative: short of) what the shapes above give,
    # and the same for everything outside the layers; empty / 0 for the hand-parsed families
    layer_extra: tuple[int, ...] = ()
    outside_extra: int = 0
    # forward FLOPs per token of each decoder layer beyond (negative: short of) what the shapes give,
    # as (linear, quadratic) coefficients: extra(seq) = linear + quadratic * keys, keys = seq (half of
    # it causal, as attention counts). Measured by tracing the model's own code at two sequence
    # lengths where the shapes only approximate a layer (dayzero.derive.traced_flops); empty / zeros
    # for the hand-parsed families
    layer_flops_extra: tuple[tuple[float, float], ...] = ()
    # saved-activation bytes per token of each decoder layer beyond (negative: short of) what the
    # planner's activation terms give, as (linear, quadratic) coefficients: extra(seq) = linear +
    # quadratic * seq. Measured in the same traces where the shapes only approximate a layer
    # (dayzero.derive.traced_act); empty / zeros for the hand-parsed families. ``layer_act_extra``
    # counts under every kernel choice (a recognised mixer's or FFN's own tensors: gates, an indexer);
    # ``layer_act_reference`` under eager kernels only (an unread mixer: what its reference algorithm
    # keeps, e.g. a sequential scan's states, which a fused kernel recomputes)
    layer_act_extra: tuple[tuple[float, float], ...] = ()
    layer_act_reference: tuple[tuple[float, float], ...] = ()
    # hybrid models: the recurrent mixer's shapes and each layer's token mixer ("attention" |
    # "recurrent" | "none"); empty means softmax attention in every layer
    recurrent: RecurrentSpec | None = None
    layer_mixers: tuple[str, ...] = ()
    # packed sequences with per-document causal masks (Megatron --reset-attention-mask, document
    # masking): the mean document length in tokens; a query attends within its document only, so
    # attention works over documents, not the window (specs.counting.attention_context). None: the
    # whole window is one sequence
    document_length: int | None = None
    extra: dict = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self):
        if not self.layer_mixers or (len(self.layer_mixers) != self.layers and set(self.layer_mixers) == {"attention"}):
            # all attention (also after a replace() that changed the depth of a transformer)
            object.__setattr__(self, "layer_mixers", ("attention",) * self.layers)
        if not self.layer_kinds:
            object.__setattr__(self, "layer_kinds", ("dense",) * self.layers)
        if not self.mtp_kind:
            object.__setattr__(self, "mtp_kind", self.layer_kinds[-1] if self.layer_kinds else "dense")
        if not self.layer_windows:
            object.__setattr__(self, "layer_windows", (None,) * self.layers)
        if not self.layer_extra:
            object.__setattr__(self, "layer_extra", (0,) * self.layers)
        if not self.layer_flops_extra:
            object.__setattr__(self, "layer_flops_extra", ((0.0, 0.0),) * self.layers)
        for name in ("layer_act_extra", "layer_act_reference"):
            if not getattr(self, name):
                object.__setattr__(self, name, ((0.0, 0.0),) * self.layers)
        if len(self.layer_mixers) != self.layers:
            raise ValueError(f"{self.name}: layer_mixers needs one entry per layer ({self.layers})")
        bad = sorted({m for m in self.layer_mixers if m != parallel_mixer(mixer_parts(m))})
        if bad:
            raise ValueError(f"{self.name}: layer_mixers entries {bad}: expected none or "
                             f"{' / '.join(MIXERS)}, several joined by {PARALLEL!r} in that order")
        if self.has_recurrent and self.recurrent is None:
            raise ValueError(f"{self.name}: recurrent layers need ModelSpec.recurrent (their shapes)")
        # not a field (no digest, no equality): derived once, read per layer by counting and the planner
        object.__setattr__(self, "_layer_types", tuple(layer_type(m, k) for m, k in zip(self.layer_mixers,
                                                                                          self.layer_kinds)))

    # -- derived ---------------------------------------------------------------------------
    @property
    def is_moe(self) -> bool:
        return self.moe is not None and "moe" in self.layer_kinds

    @property
    def num_moe_layers(self) -> int:
        return sum(k == "moe" for k in self.layer_kinds)

    @property
    def layer_types(self) -> tuple[str, ...]:
        """Per layer, :func:`layer_type` of its (mixer, FFN): ``dense``/``moe`` for transformer layers."""
        return self._layer_types

    @property
    def is_hybrid(self) -> bool:
        """Some layer has a recurrent mixer, no mixer or no feed-forward block."""
        return any(m != "attention" for m in self.layer_mixers) or "none" in self.layer_kinds

    @property
    def has_attention(self) -> bool:
        """Some layer has softmax attention (alone or beside a recurrent mixer)."""
        return any("attention" in mixer_parts(m) for m in self.layer_mixers)

    @property
    def has_recurrent(self) -> bool:
        """Some layer has a recurrent mixer (alone or beside attention)."""
        return any("recurrent" in mixer_parts(m) for m in self.layer_mixers)

    def to_dict(self) -> dict:
        d = asdict(self)
        d.pop("extra")
        # the hybrid fields are listed only where used, so every transformer's digest is unchanged
        if d["recurrent"] is None:
            d.pop("recurrent")
        if all(m == "attention" for m in d["layer_mixers"]):
            d.pop("layer_mixers")
        if not any(a or b for a, b in d["layer_flops_extra"]):  # traced FLOPs: listed only where measured
            d.pop("layer_flops_extra")
        for name in ("layer_act_extra", "layer_act_reference"):  # traced saved bytes: likewise
            if not any(a or b for a, b in d[name]):
                d.pop(name)
        # the clamped-SwiGLU constants are listed only where set, so the digest of every other spec
        # (checkpoint manifests) is what it was before they existed
        if d["moe"] is not None and not d["moe"]["latent_size"]:
            d["moe"].pop("latent_size")
        for mlp in (d["mlp"], (d["moe"] or {}).get("expert") or {}):
            for key in ("swiglu_alpha", "swiglu_limit"):
                if mlp.get(key, 0) is None:
                    mlp.pop(key)
        return d

    def digest(self) -> str:
        """A stable hash of the architecture (used by checkpoint manifests)."""
        blob = json.dumps(self.to_dict(), sort_keys=True, default=str).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    def shrink(self, layers: int | None = None, hidden: int | None = None,
               experts: int | None = None, vocab: int | None = None) -> "ModelSpec":
        """A proxy of the same architecture at a smaller size (for runtime validation).

        Head counts and head dims scale with ``hidden`` so the head structure (GQA ratio, MLA
        ranks relative to width) is kept; the layer-kind pattern keeps its dense prefix. With no
        size given the spec itself is returned (no proxy, name unchanged).
        """
        if layers is None and hidden is None and experts is None and vocab is None:
            return self
        spec = self
        if experts is not None and self.moe is None:  # never ignore a size the user asked for
            from dayzero.errors import ConfigError

            raise ConfigError("--experts", None, f"{self.name} is a dense model (no routed experts); drop --experts")
        if hidden is not None and hidden != self.hidden:
            spec = _scale_width(spec, hidden)
        if experts is not None and spec.moe is not None:
            top_k = min(spec.moe.top_k, experts)
            # group-limited routing must still tile the experts and leave room for top-k
            n_group = spec.moe.n_group
            while n_group > 1 and (experts % n_group or experts // n_group < 2):
                n_group -= 1
            topk_group = min(spec.moe.topk_group, n_group)
            while topk_group < n_group and topk_group * (experts // n_group) < top_k:
                topk_group += 1
            spec = replace(spec, moe=replace(spec.moe, experts=experts, top_k=top_k, n_group=n_group,
                                             topk_group=topk_group))
        if layers is not None and layers != spec.layers:
            spec = _take_layers(spec, layers)
        if vocab is not None:
            spec = replace(spec, vocab=vocab)
        return replace(spec, name=f"{self.name}-proxy")


def _take_layers(spec: ModelSpec, layers: int) -> ModelSpec:
    """Keep the dense prefix (first_k_dense) and the repeating pattern of the rest."""
    if spec.is_hybrid:  # a hybrid's layer pattern repeats as a whole (mixer and FFN together)
        n = spec.layers
        pick = [i % n for i in range(layers)]
        return replace(spec, layers=layers, layer_kinds=tuple(spec.layer_kinds[i] for i in pick),
                       layer_mixers=tuple(spec.layer_mixers[i] for i in pick),
                       layer_windows=tuple(spec.layer_windows[i] for i in pick),
                       layer_extra=tuple(spec.layer_extra[i] for i in pick),
                       layer_flops_extra=tuple(spec.layer_flops_extra[i] for i in pick),
                       layer_act_extra=tuple(spec.layer_act_extra[i] for i in pick),
                       layer_act_reference=tuple(spec.layer_act_reference[i] for i in pick))
    kinds = list(spec.layer_kinds)
    dense_prefix = next((i for i, k in enumerate(kinds) if k == "moe"), len(kinds))
    dense_prefix = min(dense_prefix, max(layers - 1, 0)) if spec.is_moe else min(dense_prefix, layers)
    tail = kinds[dense_prefix:] or ["dense"]
    new_kinds = kinds[:dense_prefix] + [tail[i % len(tail)] for i in range(layers - dense_prefix)]
    windows = list(spec.layer_windows)
    new_windows = [windows[i % len(windows)] for i in range(layers)]
    extras, fextras, aextras = list(spec.layer_extra), list(spec.layer_flops_extra), list(spec.layer_act_extra)
    new_extra = [extras[i % len(extras)] for i in range(layers)]
    new_fextra = [fextras[i % len(fextras)] for i in range(layers)]
    new_aextra = [aextras[i % len(aextras)] for i in range(layers)]
    new_aref = [spec.layer_act_reference[i % len(aextras)] for i in range(layers)]
    return replace(spec, layers=layers, layer_kinds=tuple(new_kinds), layer_windows=tuple(new_windows),
                   layer_extra=tuple(new_extra), layer_flops_extra=tuple(new_fextra),
                   layer_act_extra=tuple(new_aextra), layer_act_reference=tuple(new_aref), layer_mixers=())


def _scale_width(spec: ModelSpec, hidden: int) -> ModelSpec:
    r = hidden / spec.hidden
    a = spec.attention

    def scaled(x: int, multiple: int = 1) -> int:
        return max(multiple, int(round(x * r / multiple)) * multiple)

    head_dim = a.head_dim
    heads = max(1, hidden // head_dim) if hidden % head_dim == 0 else max(1, scaled(a.heads))
    while hidden % heads and heads > 1:
        heads -= 1
    group = max(1, a.heads // max(a.kv_heads, 1))
    kv_heads = max(1, heads // group)
    while heads % kv_heads:
        kv_heads -= 1
    if a.kind == "mla":
        att = replace(a, heads=heads, kv_heads=heads,
                      q_lora_rank=None if a.q_lora_rank is None else scaled(a.q_lora_rank, 8),
                      kv_lora_rank=scaled(a.kv_lora_rank, 8))
    else:
        att = replace(a, heads=heads, kv_heads=kv_heads)
    mlp = replace(spec.mlp, intermediate=scaled(spec.mlp.intermediate, 8))
    moe = spec.moe
    if moe is not None:
        moe = replace(moe, expert=replace(moe.expert, intermediate=scaled(moe.expert.intermediate, 8)),
                      shared_intermediate=scaled(moe.shared_intermediate, 8) if moe.shared_intermediate else 0)
    rec = spec.recurrent
    if rec is not None:  # heads scale with the width, the head and state sizes stay
        heads = scaled(rec.heads)
        groups = max(1, math.gcd(heads, rec.n_groups))
        key_heads = max(1, math.gcd(heads, rec.key_heads)) if rec.key_heads else 0
        rec = replace(rec, heads=heads, n_groups=groups, key_heads=key_heads)
    # extras of a derived spec belong to the full width; a proxy keeps only what its shapes give
    return replace(spec, hidden=hidden, attention=att, mlp=mlp, moe=moe, recurrent=rec,
                   layer_extra=(0,) * spec.layers, outside_extra=0, layer_flops_extra=(), layer_act_extra=(),
                   layer_act_reference=())
