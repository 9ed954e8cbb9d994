"""A model's description, derived from its own modeling code on the meta device.

For any ``model_type`` transformers implements (or a directory with its own ``modeling_*.py``, with
``trust_remote_code``), the model is built at full size on the meta device (no memory, no weights;
well under a second for the configs tried) and described from its module tree alone
(:mod:`dayzero.derive.structure`): the decoder layers, grouped into kinds of identical layers; each
kind's mixer (softmax attention GQA/MLA with its window, chunk and RoPE, or a recurrent linear
attention / SSM mixer; a parallel hybrid's layer holds one of each side by side) and feed-forward
block (dense, or routed experts with top-k, per-expert width and shared experts); norms, embeddings
and exact parameter counts.

Counts are of the module tree: ``named_parameters(remove_duplicate=True)`` (a tied head once) plus
persistent buffers (checkpoints store them: DeepSeek's ``e_score_correction_bias`` is one; rotary
tables are non-persistent), which is how :mod:`dayzero.specs.counting` counts the hand-written
families. Vision towers are counted apart. While the model is built and described, every config
attribute read is recorded, so the keys of the config.json nobody read can be reported.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from pathlib import Path

from dayzero.derive import structure as st
from dayzero.errors import DayzeroError, one_line
from dayzero.specs.config_keys import unused_keys
from dayzero.specs.model import RecurrentSpec

VISION_WORDS = ("vision", "visual", "image", "multi_modal_projector", "audio")


@dataclass(frozen=True)
class Mixer:
    """The token mixer of a layer kind. ``kind``: ``softmax`` (GQA, MHA, MQA), ``mla`` (latent
    KV) or ``recurrent`` (linear attention / SSM: a state instead of a softmax over keys)."""

    kind: str
    module: str  # class name
    params: int
    heads: int
    kv_heads: int
    head_dim: int
    v_head_dim: int
    window: int | None = None  # sliding window (tokens)
    chunk: int | None = None  # chunked attention: attends within chunks of this many tokens
    rope: bool = True
    qkv_bias: bool = False
    o_bias: bool = False
    q_lora_rank: int | None = None
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    qk_nope_head_dim: int = 0
    # a recurrent mixer's shapes read from its weights (structure.recurrent_shapes); None where unread
    recurrent: RecurrentSpec | None = None


@dataclass(frozen=True)
class FeedForward:
    """The feed-forward block of a layer kind: ``dense`` (one MLP), ``moe`` or ``none``."""

    kind: str
    module: str
    params: int
    dense: st.MLPShape | None = None
    experts: st.ExpertShape | None = None
    top_k: int = 0
    shared: st.MLPShape | None = None
    shared_gate: bool = False
    router_params: int = 0
    router_bias: bool = False
    score_correction_bias: bool = False
    beside: tuple[str, ...] = ()  # classes of the layer's dense MLPs read as this block's shared experts

    @property
    def modules(self) -> tuple[str, ...]:
        """Classes of the layer's children that make up the block (empty for ``none``)."""
        return tuple(m for m in (self.module, *self.beside) if m)


@dataclass(frozen=True)
class LayerKind:
    """Identical decoder layers: one structure, the indices that have it, and its exact counts."""

    name: str
    layers: tuple[int, ...]
    mixer: Mixer | None
    ffn: FeedForward
    norms: int
    other: int  # parameters of the layer outside mixer(s), feed-forward and norms
    params: int  # one layer, parameters + persistent buffers
    # a second token mixer of the other family beside ``mixer`` (softmax attention next to a read
    # recurrent mixer, or the reverse): a parallel hybrid's layer (Falcon-H1); None in every other
    beside: Mixer | None = None

    @property
    def mixers(self) -> tuple[Mixer, ...]:
        """The layer's token mixers: ``mixer``, then ``beside`` where there is one."""
        return tuple(m for m in (self.mixer, self.beside) if m is not None)


@dataclass(frozen=True)
class ModelDescription:
    name: str
    model_type: str
    architecture: str  # class of the built model
    hidden: int
    vocab: int
    layer_list: str  # qualified name of the decoder-layer ModuleList
    kinds: tuple[LayerKind, ...]
    embedding: int
    head: int  # 0 when tied to the embedding
    tied: bool
    final_norm: int
    outside: int  # other parameters outside the decoder layers (not embedding, head, final norm, vision)
    vision: int  # vision / audio towers, counted apart
    parameters: int  # named_parameters(remove_duplicate=True) of the whole model
    persistent_buffers: int
    norm: str  # rmsnorm | layernorm (of the first layer's norms)
    norm_bias: bool
    max_positions: int
    rope_theta: float
    norm_eps: float
    unused_config_keys: tuple[str, ...] = ()
    notes: tuple[str, ...] = field(default=(), compare=False)
    remote_code: bool = False  # built from the modeling_*.py its directory ships (--trust-remote-code)

    @property
    def num_layers(self) -> int:
        return sum(len(k.layers) for k in self.kinds)

    @property
    def total(self) -> int:
        """Parameters + persistent buffers of the language model (vision apart)."""
        return self.parameters + self.persistent_buffers - self.vision

    def kind_of(self) -> list[LayerKind]:
        """The layer kind of every layer, by index."""
        out: list[LayerKind | None] = [None] * self.num_layers
        for k in self.kinds:
            for i in k.layers:
                out[i] = k
        return out  # type: ignore[return-value]


@contextlib.contextmanager
def recording_config_reads():
    """Record the name of every attribute read on any transformers config while active."""
    from transformers import PretrainedConfig

    original = PretrainedConfig.__getattribute__
    read: set[str] = set()

    def recorded(self, key):
        read.add(key)
        amap = original(self, "attribute_map")
        if key in amap:
            read.add(amap[key])
        return original(self, key)

    PretrainedConfig.__getattribute__ = recorded
    try:
        yield read
    finally:
        PretrainedConfig.__getattribute__ = original


def _perturbed(v):
    """Another value of the same type (None: drop the key instead)."""
    if isinstance(v, bool):
        return not v
    if isinstance(v, int):
        return v + 1
    if isinstance(v, float):
        return v * 2 + 1
    return None


def config_keys_used(cfg: dict, config, read: set[str], rebuild=None) -> set[str]:
    """Keys of the config.json the code used: read as attributes (or under their ``attribute_map``
    alias), or folded by the config class into fields the code read. ``rebuild(cfg)`` makes the
    config object of a dict; a key is folded when changing it (a number +1, a flag flipped, anything
    else dropped) changes an attribute the code read or makes the config invalid (DeepSeek's
    ``first_k_dense_replace`` becomes ``mlp_layer_types``; transformers 5 moves ``rope_theta`` into
    ``rope_parameters``). Changing rather than dropping: a key equal to its default still counts."""
    amap = dict(getattr(type(config), "attribute_map", {}) or {})
    used = {k for k in cfg if k in read or amap.get(k, k) in read}
    if rebuild is None:
        return used
    watched = sorted(r for r in read if not r.startswith("_") and r in vars(config))
    for k in cfg:
        if k in used or k == "model_type":
            continue
        new = _perturbed(cfg[k])
        changed = {x: v for x, v in cfg.items() if x != k} if new is None else {**cfg, k: new}
        try:
            other = rebuild(changed)
        except Exception:  # noqa: BLE001 - the config class checks this key against others: it is used
            used.add(k)
            continue
        if any(_differs(other, config, r) for r in watched):
            used.add(k)
    return used


def _differs(other, config, attr: str) -> bool:
    """Whether two configs differ in ``attr``; a config class that refuses to give a global value
    (transformers' per-layer attributes raise on global access) counts as a difference (the key is used)."""
    try:
        return bool(getattr(other, attr, None) != getattr(config, attr))
    except Exception:  # noqa: BLE001 - any config class may guard an attribute in any way
        return True


def describe(model: str | Path, trust_remote_code: bool = False) -> ModelDescription:
    """MODEL (preset, config.json or directory) -> its description from its own modeling code."""
    try:
        import torch
        from transformers import AutoModelForCausalLM
    except ImportError as e:
        raise DayzeroError(f"{model}: deriving a model from its modeling code needs torch and transformers "
                           f"({e.name} is not installed); pip install 'dayzero[ops]'") from None
    from dayzero.ops.hf_model import _quiet_transformers, config_object, read_model_config

    cfg, name, source, directory = read_model_config(str(model))
    config, notes, remote = config_object(cfg, name, source, directory, trust_remote_code)
    with recording_config_reads() as read:  # after loading: the config class itself touches every key
        with _quiet_transformers(), torch.device("meta"):
            try:
                net = AutoModelForCausalLM.from_config(config, trust_remote_code=remote)
            except Exception as e:  # any modeling code can fail; one line, never a traceback
                raise DayzeroError(f"{name}: cannot build {type(config).__name__} on the meta device: "
                                   f"{one_line(e)}") from None
        desc = describe_module(net, config, name, cfg.get("model_type") or config.model_type, notes)
    rebuild = None if remote else (lambda c: config_object(c, name, source, directory)[0])
    with _quiet_transformers():
        used = config_keys_used(cfg, config, read, rebuild)
    unused = unused_keys(cfg, used | {"model_type"})
    return _with(desc, unused_config_keys=tuple(unused), remote_code=remote)


def _with(desc: ModelDescription, **kw) -> ModelDescription:
    from dataclasses import replace

    return replace(desc, **kw)


def describe_module(net, config, name: str, model_type: str, notes: list[str] | None = None) -> ModelDescription:
    """Describe a built causal LM (on any device) from its module tree."""
    notes = list(notes or [])
    layer_list, layers = st.find_layer_list(net)
    if layers is None:
        raise DayzeroError(f"{name}: {type(net).__name__} has no list of repeated decoder blocks; cannot describe it")
    embed = net.get_input_embeddings()
    head = net.get_output_embeddings()
    hidden, vocab = int(embed.weight.shape[1]), int(embed.weight.shape[0])
    tied = head is not None and getattr(head, "weight", None) is embed.weight
    parameters = st.numel(net)
    buffers = st.persistent_buffer_numel(net)
    vision = _vision(net)
    embed_n = st.numel(embed)
    head_n = 0 if (tied or head is None) else st.numel(head)
    layers_total = st.numel(layers, True)
    family = st.family_prefix(type(net).__name__, type(layers[0]).__name__)
    final_norm = _final_norm(net, layers, embed, head, family)
    outside = parameters + buffers - vision - layers_total - embed_n - head_n - final_norm
    groups = st.group_layers(layers)
    kinds = [_kind(layers[g[0]], g, config, hidden, family) for g in groups]
    kinds = _named(kinds)
    first_norms = [m for q, m in layers[0].named_children() if st.is_norm(q, m, family)] or [
        m for q, m in layers[0].named_modules() if q and st.is_norm(q.rsplit(".", 1)[-1], m, family)]  # nested
    norm_cls = type(first_norms[0]).__name__.lower() if first_norms else "rmsnorm"
    norm_bias = any(getattr(m, "bias", None) is not None for m in first_norms)
    return ModelDescription(
        name=name, model_type=model_type, architecture=type(net).__name__, hidden=hidden, vocab=vocab,
        layer_list=layer_list, kinds=tuple(kinds), embedding=embed_n, head=head_n, tied=tied, final_norm=final_norm,
        outside=outside, vision=vision, parameters=parameters, persistent_buffers=buffers,
        norm="layernorm" if "layernorm" in norm_cls and "rms" not in norm_cls else "rmsnorm", norm_bias=norm_bias,
        max_positions=_int_attr(config, "max_position_embeddings", "n_positions", default=4096),
        rope_theta=_rope_theta(config), norm_eps=_float_attr(config, "rms_norm_eps", "layer_norm_eps",
                                                             "layer_norm_epsilon", "norm_eps", default=1e-6),
        notes=tuple(notes))


def _is_vision(name: str) -> bool:
    return any(w in name.lower() for w in VISION_WORDS)


def _vision(net) -> int:
    """Parameters + persistent buffers of the outermost modules named like a vision / audio tower."""
    total, seen = 0, []
    for q, m in net.named_modules():
        if q and _is_vision(q.rsplit(".", 1)[-1]) and not any(q.startswith(s + ".") for s in seen):
            seen.append(q)
            total += st.numel(m, True)
    return total


def _final_norm(net, layers, embed, head, family: str = "") -> int:
    """The norm applied after the last decoder layer: a norm module outside the layer list and the
    embeddings, directly under the model's body."""
    inside = {id(m) for m in layers.modules()} | {id(embed)} | ({id(head)} if head is not None else set())
    total = 0
    for q, m in net.named_modules():
        if id(m) in inside or not q or _is_vision(q):
            continue
        leaf = q.rsplit(".", 1)[-1]
        if st.is_norm(leaf, m, family) and not any(id(c) in inside for c in m.modules()):
            parent = q.rpartition(".")[0]
            pmod = net.get_submodule(parent) if parent else net
            if not st.is_norm(parent.rsplit(".", 1)[-1], pmod, family):
                total += st.numel(m, True)
    return total


def _int_attr(obj, *names, default=None):
    for n in names:
        try:
            v = getattr(obj, n, None)
        except Exception:  # noqa: BLE001 - some configs raise on absent attributes
            v = None
        if isinstance(v, int) and not isinstance(v, bool):
            return v
    return default


def _float_attr(obj, *names, default: float) -> float:
    for n in names:
        v = getattr(obj, n, None)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return float(v)
    return default


def _rope_theta(config) -> float:
    rp = getattr(config, "rope_parameters", None)
    if isinstance(rp, dict):
        inner = rp.get("full_attention", rp) if isinstance(rp.get("full_attention"), dict) else rp
        v = inner.get("rope_theta")
        if isinstance(v, (int, float)) and v > 0:
            return float(v)
    return _float_attr(config, "rope_theta", default=10000.0)


def _layer_type(config, index: int, mixer_mod) -> str:
    types = getattr(config, "layer_types", None)
    if isinstance(types, (list, tuple)) and index < len(types) and isinstance(types[index], str):
        return types[index]
    for attr in ("layer_type", "attention_type", "block_type"):
        v = getattr(mixer_mod, attr, None) if mixer_mod is not None else None
        if isinstance(v, str):
            return v
    return ""


def _kind(layer, indices: list[int], config, hidden: int, family: str = "") -> LayerKind:
    children = [(q, m) for q, m in layer.named_children() if st.numel(m, True)]
    cats = {q: st.category(q, m, family) for q, m in children}
    mixer_mods = [(q, m) for q, m in children if cats[q] in ("mixer", "other")]
    ffn_mods = [(q, m) for q, m in children if cats[q] == "ffn"]
    if not mixer_mods and len(ffn_mods) > 1:  # nothing named like a mixer: the first block mixes
        mixer_mods, ffn_mods = ffn_mods[:1], ffn_mods[1:]
    # the token mixer: the largest child that reads as one (small helpers named like attention, a
    # short convolution after it, come second), else the first child of no known role
    named = [(q, m) for q, m in mixer_mods if cats[q] == "mixer"]
    if named:
        mixer_mods = sorted(named, key=lambda qm: -st.numel(qm[1], True))
    mixer_q, mixer_mod = mixer_mods[0] if mixer_mods else ("", None)
    ltype = _layer_type(config, indices[0], mixer_mod)
    mixer = _mixer(mixer_mod, config, hidden, ltype) if mixer_mod is not None else None
    beside = _beside(mixer, [m for _, m in mixer_mods[1:]] if named else [], config, hidden, ltype)
    ffn = _ffn([m for _, m in ffn_mods], config, hidden)
    norms = sum(st.numel(m, True) for q, m in children if cats[q] == "norm")
    total = st.numel(layer, True)
    other = total - sum(m.params for m in (mixer, beside) if m) - ffn.params - norms
    return LayerKind(name="", layers=tuple(indices), mixer=mixer, ffn=ffn, norms=norms, other=other, params=total,
                     beside=beside)


def _beside(mixer: Mixer | None, others: list, config, hidden: int, ltype: str) -> Mixer | None:
    """A second whole token mixer of the other family among the layer's other children that read as
    mixers (largest first), or None: next to softmax attention a recurrent mixer whose weights read
    as a Mamba-2 / Gated-DeltaNet layout, next to such a recurrent mixer a softmax attention with
    projections from and into the hidden width. A parallel hybrid holds both (transformers'
    FalconH1DecoderLayer: ``mamba`` and ``self_attn`` read one ``input_layernorm`` output, their
    outputs summed); a helper named like attention or a short convolution (no per-head state) is
    neither, and stays the layer's unread part."""
    if mixer is None or (mixer.kind == "recurrent" and mixer.recurrent is None):
        return None
    for mod in others:
        if mixer.kind != "recurrent":
            if st.is_recurrent_mixer(mod) and st.recurrent_shapes(mod, hidden) is not None:
                return _mixer(mod, config, hidden, ltype)
        elif not st.is_recurrent_mixer(mod):
            maps = st.linear_maps(mod)
            if any(m.in_features == hidden for m in maps) and any(m.out_features == hidden for m in maps):
                return _mixer(mod, config, hidden, ltype)
    return None


def _mixer(mod, config, hidden: int, ltype: str) -> Mixer:

    params = st.numel(mod, True)
    linears = st.linear_maps(mod)
    heads = st.scalar(mod, "num_heads", "num_attention_heads", "n_heads", "num_v_heads",
                      default=_int_attr(config, "num_attention_heads", default=1))
    head_dim = st.scalar(mod, "head_dim", "head_v_dim", "attention_head_size",
                         default=_int_attr(config, "head_dim", default=max(1, hidden // max(heads, 1))))
    kv_heads = st.scalar(mod, "num_key_value_heads", "num_kv_heads", "num_k_heads", default=None)
    if kv_heads is None:
        groups = st.scalar(mod, "num_key_value_groups", default=None)
        kv_heads = heads // groups if groups else _int_attr(config, "num_key_value_heads", default=heads)
    out_bias = any(m.out_features == hidden and m.bias for m in linears)
    in_bias = any(m.in_features == hidden and m.bias for m in linears)
    if st.is_recurrent_mixer(mod):
        k_dim = st.scalar(mod, "head_k_dim", "head_dim", default=head_dim)
        v_dim = st.scalar(mod, "head_v_dim", "head_dim", default=head_dim)
        return Mixer(kind="recurrent", module=type(mod).__name__, params=params, heads=heads, kv_heads=heads,
                     head_dim=k_dim, v_head_dim=v_dim, rope=False, qkv_bias=in_bias, o_bias=out_bias,
                     recurrent=st.recurrent_shapes(mod, hidden))
    window = chunk = None
    if "sliding" in ltype or "local" in ltype:
        window = st.scalar(mod, "sliding_window", default=_int_attr(config, "sliding_window"))
    elif "chunk" in ltype:
        chunk = _int_attr(config, "attention_chunk_size", "chunk_size")
    elif not ltype:
        window = st.scalar(mod, "sliding_window", default=None)
    rope = bool(getattr(mod, "use_rope", True)) and "no_rope" not in ltype
    kv_lora = st.scalar(mod, "kv_lora_rank", default=None)
    if kv_lora:
        nope = st.scalar(mod, "qk_nope_head_dim", default=0)
        rope_d = st.scalar(mod, "qk_rope_head_dim", default=0)
        q_lora = st.scalar(mod, "q_lora_rank", default=None)
        return Mixer(kind="mla", module=type(mod).__name__, params=params, heads=heads, kv_heads=heads,
                     head_dim=nope + rope_d, v_head_dim=st.scalar(mod, "v_head_dim", default=nope),
                     window=window, chunk=chunk, rope=rope, qkv_bias=in_bias, o_bias=out_bias,
                     q_lora_rank=q_lora or None, kv_lora_rank=kv_lora, qk_rope_head_dim=rope_d, qk_nope_head_dim=nope)
    return Mixer(kind="softmax", module=type(mod).__name__, params=params, heads=heads, kv_heads=kv_heads,
                 head_dim=head_dim, v_head_dim=head_dim, window=window, chunk=chunk, rope=rope,
                 qkv_bias=in_bias, o_bias=out_bias)


def _ffn(mods: list, config, hidden: int) -> FeedForward:
    """The feed-forward block of a layer from its feed-forward children. One with routed experts is
    the MoE block; dense MLPs beside it are its shared experts (every token runs them: Granite 4.0's
    ``shared_mlp`` next to ``block_sparse_moe``, the sum of both the layer's output), the same as a
    shared expert held inside the block."""
    from dataclasses import replace

    from torch import nn

    if not mods:
        return FeedForward(kind="none", module="", params=0)
    routed = [m for m in mods if st.routed_experts(m, hidden) is not None]
    if not routed:
        mod = mods[0]
        return FeedForward(kind="dense", module=type(mod).__name__, params=st.numel(mod, True),
                           dense=st.mlp_shape(mod, hidden))
    moe = _moe(routed[0], config, hidden)
    others = [e for m in mods if m is not routed[0] for e in (m if isinstance(m, nn.ModuleList) else [m])]
    beside = [st.mlp_shape(m, hidden) for m in others]  # a list of MLPs (LongCat-Flash's mlps): each one
    if not beside or any(s is None for s in beside):
        return moe
    shared = ([moe.shared] if moe.shared else []) + beside
    sh = st.MLPShape(sum(s.intermediate for s in shared), shared[0].gated, shared[0].bias,
                     sum(s.params for s in shared))
    return replace(moe, params=moe.params + sum(st.numel(m, True) for m in others), shared=sh,
                   beside=tuple(type(m).__name__ for m in mods if m is not routed[0]))  # the layer's children


def _moe(mod, config, hidden: int) -> FeedForward:
    from torch import nn

    params = st.numel(mod, True)
    experts = st.routed_experts(mod, hidden)
    e = experts.experts
    expert_ids = {id(p) for p in st.expert_tensors(mod)}
    holder = st.expert_list(mod)
    if holder is not None:
        expert_ids |= {id(p) for p in holder.parameters()}
    router_n, router_bias, correction = 0, False, False
    shared: list[st.MLPShape] = []
    shared_gate = False
    top_k = st.scalar(mod, "top_k", "num_experts_per_tok", default=None)
    for q, child in mod.named_children():
        own = [p for p in child.parameters() if id(p) not in expert_ids]
        if not own and not st.persistent_buffer_numel(child):
            continue
        top_k = top_k or st.scalar(child, "top_k", "num_experts_per_tok", default=None)
        w = getattr(child, "weight", None)
        if w is not None and w.dim() == 2 and w.shape[0] == e and w.shape[1] == hidden:
            router_n += st.numel(child, True)
            router_bias = router_bias or getattr(child, "bias", None) is not None
            correction = correction or any(b.numel() == e for b in child.buffers()) or any(
                p.dim() == 1 and p.numel() == e and p is not getattr(child, "bias", None) for p in child.parameters())
        elif isinstance(child, nn.Linear) and child.out_features == 1 and child.in_features == hidden:
            shared_gate = True
        else:
            shape = st.mlp_shape(child, hidden)
            if shape is not None:
                shared.append(shape)
    for k, b in mod.named_buffers(recurse=False):  # a correction bias held by the block itself
        correction = correction or b.numel() == e
    top_k = top_k or _int_attr(config, "num_experts_per_tok", "moe_topk", "top_k", default=1)
    sh = None
    if shared:
        sh = st.MLPShape(sum(s.intermediate for s in shared), shared[0].gated, shared[0].bias,
                         sum(s.params for s in shared))
    return FeedForward(kind="moe", module=type(mod).__name__, params=params, experts=experts, top_k=min(top_k, e),
                       shared=sh, shared_gate=shared_gate, router_params=router_n, router_bias=router_bias,
                       score_correction_bias=correction)


def _named(kinds: list[LayerKind]) -> list[LayerKind]:
    """Readable kind names: mixer/feed-forward plus what tells same-named kinds apart."""
    from dataclasses import replace

    def base(k: LayerKind) -> str:
        m = k.mixer
        mix = "none" if m is None else {"softmax": "attention", "mla": "mla", "recurrent": "linear"}[m.kind]
        tags = []
        if m is not None and m.window:
            tags.append(f"sliding {m.window}")
        if m is not None and m.chunk:
            tags.append(f"chunk {m.chunk}")
        if m is not None and m.kind != "recurrent" and not m.rope:
            tags.append("no-rope")
        if k.beside is not None:
            mix = "&".join(sorted((mix, "linear" if k.beside.kind == "recurrent" else "attention")))
        return f"{mix}+{k.ffn.kind}" + (f" ({', '.join(tags)})" if tags else "")

    names = [base(k) for k in kinds]
    out = []
    for i, (k, n) in enumerate(zip(kinds, names)):
        if names.count(n) > 1:
            n = f"{n} #{names[:i + 1].count(n)}"
        out.append(replace(k, name=n))
    return out


def experts_build_modules(cfg: dict, source: str, key: str) -> bool:
    """Whether the modeling code builds modules per expert counted by ``cfg[key]`` (a MoE block), not
    rows of a table (PEER, Doge's CDMoE): one decoder layer built twice on the meta device, with 8 and
    16 experts (top-k within them), the module counts compared. A config these builds fail on counts
    as modules (the bound then applies)."""
    import torch
    from transformers import AutoModelForCausalLM

    from dayzero.ops.hf_model import _quiet_transformers, config_object
    from dayzero.specs.hf_config import TOP_K_KEYS

    counts = []
    for e in (8, 16):
        trial = dict(cfg, num_hidden_layers=1, **{key: e},
                     **{k: min(cfg[k], e) for k in TOP_K_KEYS if isinstance(cfg.get(k), int)})
        try:
            config = config_object(trial, "probe", source, None)[0]
            with _quiet_transformers(), torch.device("meta"):
                counts.append(sum(1 for _ in AutoModelForCausalLM.from_config(config).modules()))
        except Exception:  # noqa: BLE001 - cannot tell: the bound applies
            return True
    return counts[0] != counts[1]
