"""Read a model's structure from its module tree: no table per family.

Every function takes modules of a model built on the meta device and looks only at classes,
parameter shapes and scalar attributes:

- the decoder-layer list is the ``nn.ModuleList`` of repeated blocks holding the most parameters
  (not the one whose length equals ``num_hidden_layers``: hybrid models keep other lists);
- a layer's children are sorted into the mixer (attention, linear attention, SSM), the feed-forward
  block and norms: routed experts make a feed-forward block and a convolution or recurrent state
  (below) a token mixer whatever they are called (a per-token MLP has neither); otherwise the
  names Hugging Face code (and most remote code) uses decide, read from the attribute name and
  the class name *without the model family's name* (the CamelCase words the class shares with the
  model's and the decoder layer's classes: ``GraniteMoeHybridMambaLayer`` is a ``MambaLayer``, not
  an MoE, ``Qwen2MoeAttention`` an ``Attention``);
- routed experts are 3-D weights ``[E, a, b]`` outside convolutions, or a ``ModuleList`` of
  identical MLPs; a 3-D convolution kernel ``[C, 1, k]`` is a convolution, never experts;
- a linear-attention / SSM mixer is one with a convolution or recurrent parameters (``A_log``,
  ``dt_bias``, ``D``: vectors outside any norm) and no softmax over keys.

torch is imported inside the functions, so importing this module stays light.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_SKIP_ATTRS = re.compile(r"(^_|idx|index|^training$)")
_MLP_WORDS = ("mlp", "expert", "moe", "ffn", "feed_forward")
# recurrent state parameters / buffers: SSM decay and step (Mamba's A_log, D, dt_bias), RWKV's
# time_decay, linear attention's per-head decay slopes (Lightning / RetNet style)
_RECURRENT_PARAMS = re.compile(r"^(A_log|A|D|dt_bias|dt_proj_bias|time_decay|time_first)$|decay|slope")


def _is_conv(mod) -> bool:
    from torch import nn

    return isinstance(mod, nn.modules.conv._ConvNd)


def find_layer_list(net) -> tuple[str, object]:
    """(qualified name, ModuleList) of the decoder layers: the list of repeated blocks (one class,
    at least half of them with the same parameter shapes) holding the most parameters; a list of
    ``config.num_hidden_layers`` blocks counts even when its classes differ (a proxy that keeps one
    layer of each kind)."""
    from torch import nn

    n_layers = getattr(getattr(net, "config", None), "num_hidden_layers", None)
    best = None
    for qual, mod in net.named_modules():
        if not isinstance(mod, nn.ModuleList) or not len(mod):
            continue
        classes = {type(m).__name__ for m in mod}
        if len(classes) > max(1, len(mod) // 2) and len(mod) != n_layers:  # unrelated modules, not blocks
            continue
        size = sum(p.numel() for p in mod.parameters())
        if size and (best is None or size > best[0] or (size == best[0] and qual.count(".") < best[1].count("."))):
            best = (size, qual, mod)
    if best is None:
        return "", None
    return best[1], best[2]


def layer_signature(layer) -> tuple:
    """What makes two decoder layers the same kind: classes, parameter shapes, scalar attributes."""
    sig = []
    for qual, mod in layer.named_modules():
        attrs = tuple(sorted((k, v) for k, v in vars(mod).items() if not _SKIP_ATTRS.search(k)
                             and isinstance(v, (bool, int, float, str, type(None)))))
        params = tuple((k, tuple(p.shape), str(p.dtype)) for k, p in mod.named_parameters(recurse=False))
        buffers = tuple((k, tuple(b.shape)) for k, b in mod.named_buffers(recurse=False))
        sig.append((qual, type(mod).__name__, attrs, params, buffers))
    return tuple(sig)


def group_layers(layers) -> list[list[int]]:
    """Indices of identical layers, in order of first appearance."""
    groups: dict[tuple, list[int]] = {}
    for i, layer in enumerate(layers):
        groups.setdefault(layer_signature(layer), []).append(i)
    return list(groups.values())


def numel(mod, persistent_buffers: bool = False) -> int:
    """Parameters of ``mod`` (each shared tensor once), plus its persistent buffers on request."""
    n = sum(p.numel() for _, p in mod.named_parameters(remove_duplicate=True))
    if persistent_buffers:
        n += persistent_buffer_numel(mod)
    return n


def persistent_buffer_numel(mod) -> int:
    """Elements of buffers a checkpoint stores (rotary tables are non-persistent and excluded)."""
    return sum(b.numel() for m in mod.modules() for k, b in m._buffers.items()
               if b is not None and k not in m._non_persistent_buffers_set)


_CAMEL_WORD = re.compile(r"[A-Z]+[a-z0-9]*|[a-z0-9]+")


def family_prefix(*class_names: str) -> str:
    """The CamelCase words all ``class_names`` begin with: the model family's name in its classes
    (``GraniteMoeHybrid`` of ``GraniteMoeHybridForCausalLM`` and ``GraniteMoeHybridDecoderLayer``),
    which says nothing about a module's role; "" when they share none."""
    words = [_CAMEL_WORD.findall(n) for n in class_names]
    common = []
    for ws in zip(*words):
        if len(set(ws)) != 1:
            break
        common.append(ws[0])
    prefix = "".join(common)
    return prefix if all(n.startswith(prefix) for n in class_names) else ""


def role_class(mod, family: str = "") -> str:
    """The module's class name, lower case, without the family's name (what is left names its role)."""
    cls = type(mod).__name__
    if family and cls.startswith(family) and len(cls) > len(family):
        cls = cls[len(family):]
    return cls.lower()


def is_norm(name: str, mod, family: str = "") -> bool:
    """A normalisation module, by attribute name or class name without the family's name."""
    leaf, cls = name.lower(), role_class(mod, family)
    return "norm" in cls or "norm" in leaf or leaf.startswith("ln_")


def category(name: str, mod, family: str = "") -> str:
    """norm | ffn | mixer | other of a decoder layer's child: by structure where it is decisive
    (routed experts: ffn; a convolution or recurrent state, i.e. a module that mixes tokens without
    attention: mixer), else by attribute name and class name without the family's name."""
    leaf, cls = name.lower(), role_class(mod, family)
    if is_norm(name, mod, family):
        return "norm"
    if expert_tensors(mod) or expert_list(mod):
        return "ffn"
    if is_recurrent_mixer(mod):
        return "mixer"
    if any(w in leaf or w in cls for w in _MLP_WORDS):
        return "ffn"
    if any(w in leaf or w in cls for w in ("attn", "attention", "mixer", "mamba", "ssm", "conv", "rwkv", "delta")):
        return "mixer"
    return "other"


def expert_tensors(mod) -> list:
    """3-D weights ``[E, a, b]`` of routed experts held directly or below ``mod`` (never conv kernels)."""
    out = []
    for m in mod.modules():
        if _is_conv(m):
            continue
        out += [p for p in m.parameters(recurse=False) if p.dim() == 3]
    return out


def expert_holders(mod) -> list[tuple[str, object]]:
    """(qualified name below ``mod``, module) of every module holding routed-expert 3-D weights
    directly (the experts' own module, whose forward computes them; never a convolution)."""
    return [(q, m) for q, m in mod.named_modules() if not _is_conv(m)
            and any(p.dim() == 3 for p in m.parameters(recurse=False))]


def expert_list(mod):
    """A ModuleList (below ``mod``) of two or more identical MLP-like experts, or None."""
    from torch import nn

    for qual, m in mod.named_modules():
        if isinstance(m, nn.ModuleList) and len(m) >= 2 and "expert" in qual.rsplit(".", 1)[-1].lower():
            if len({layer_signature(e) for e in m}) == 1:
                return m
    return None


@dataclass(frozen=True)
class LinearMap:
    """A dense projection ``in_features -> out_features`` (``nn.Linear``, or the transposed
    ``Conv1D`` of GPT-2-style code: weight ``[in, out]``, attribute ``nf`` = out)."""

    in_features: int
    out_features: int
    bias: bool


def linear_maps(mod) -> list[LinearMap]:
    """Every dense projection below ``mod`` (itself included), in module order."""
    from torch import nn

    out = []
    for m in mod.modules():
        w = getattr(m, "weight", None)
        if isinstance(m, nn.Linear):
            out.append(LinearMap(m.in_features, m.out_features, m.bias is not None))
        elif type(m).__name__ == "Conv1D" and isinstance(getattr(m, "nf", None), int) and w is not None \
                and w.dim() == 2 and w.shape[1] == m.nf:
            out.append(LinearMap(int(w.shape[0]), m.nf, getattr(m, "bias", None) is not None))
    return out


@dataclass(frozen=True)
class MLPShape:
    """A feed-forward network's shape: intermediate width and whether it is gated (GLU)."""

    intermediate: int
    gated: bool
    bias: bool
    params: int


def mlp_shape(mod, hidden: int) -> MLPShape | None:
    """Shape of a plain (non-routed) MLP from its Linear layers: the down projection maps the
    intermediate width back to ``hidden``; the up side is gated when it is twice that width."""
    linears = linear_maps(mod)
    down = [m for m in linears if m.out_features == hidden and m.in_features != hidden]
    up = [m for m in linears if m.in_features == hidden and m.out_features != 1]
    if not down or not up:
        square = [m for m in linears if m.in_features == m.out_features == hidden]
        if len(square) >= 2:  # intermediate == hidden
            inter = hidden
            return MLPShape(inter, len(square) >= 3, any(m.bias for m in square), numel(mod))
        return None
    inter = down[0].in_features
    width = sum(m.out_features for m in up)
    return MLPShape(inter, width >= 2 * inter, any(m.bias for m in linears), numel(mod))


@dataclass(frozen=True)
class ExpertShape:
    """Routed experts: count, one expert's MLP shape and the parameters of all of them."""

    experts: int
    expert: MLPShape
    params: int


def routed_experts(mod, hidden: int) -> ExpertShape | None:
    """Routed experts below ``mod``, from 3-D expert tensors or a ModuleList of experts."""
    tensors = expert_tensors(mod)
    if tensors:
        e = tensors[0].shape[0]
        widths = []
        for t in tensors:
            dims = list(t.shape[1:])
            if hidden in dims:
                dims.remove(hidden)
                widths.append(dims[0])
        inter = min(widths) if widths else 0
        holder = expert_holders(mod)[0][1]
        total = numel(holder)
        bias = any(p.dim() == 2 and p.shape[0] == e for p in holder.parameters(recurse=False))
        return ExpertShape(e, MLPShape(inter, sum(widths) >= 3 * inter, bias, total // e), total)
    experts = expert_list(mod)
    if experts is not None:
        one = mlp_shape(experts[0], hidden)
        if one is not None:
            return ExpertShape(len(experts), one, numel(experts))
    return None


def is_recurrent_mixer(mod) -> bool:
    """Linear attention / SSM: a convolution or recurrent parameters (decay, step size) and no
    per-head softmax attention projections."""
    has_conv = any(_is_conv(m) for m in mod.modules())
    names = [k.rsplit(".", 1)[-1] for k, _ in (*mod.named_parameters(), *mod.named_buffers())]
    recurrent = any(_RECURRENT_PARAMS.search(n) for n in names)
    return has_conv or recurrent


def recurrent_shapes(mod, hidden: int):
    """The :class:`~dayzero.specs.model.RecurrentSpec` of a recurrent mixer, read from its weights
    (None where they are not a Mamba-2 or Gated-DeltaNet-like layout).

    Read from shapes, not class names: the depthwise causal conv (groups == channels) gives the
    conv channels, kernel and bias; the per-head vectors (``A_log`` / ``dt_bias``) the head count;
    the output projection (into ``hidden``) the value width; a per-head skip ``D`` marks Mamba-2's
    SSD (2 inner + 2 G N + heads input features, conv over inner + 2 G N), its absence a
    Gated-DeltaNet-style delta rule (2 keys + 2 values + 2 heads, conv over 2 keys + values). The
    state size N needs the module's ``ssm_state_size`` / ``d_state`` and its groups ``n_groups``
    (else 1 group); key heads ``num_k_heads`` (else as many as value heads)."""
    from torch import nn

    from dayzero.specs.model import RecurrentSpec

    convs = [m for m in mod.modules() if isinstance(m, nn.Conv1d) and m.groups == m.in_channels == m.out_channels]
    linears = linear_maps(mod)
    vec = {k: p for k, p in mod.named_parameters(recurse=False) if p.dim() == 1}  # A_log, dt_bias, D
    norms = [m.weight.numel() for m in mod.modules() if not isinstance(m, (nn.Linear, nn.Conv1d))
             and isinstance(getattr(m, "weight", None), nn.Parameter) and m.weight.dim() == 1]
    per_head = vec.get("A_log", vec.get("dt_bias"))
    # the output projection maps into ``hidden``; a square one only where it is the sole such map
    # (a value width equal to hidden: Mamba-2 with expand 1, Gated DeltaNet with heads x dv == hidden)
    into = [i for i, m in enumerate(linears) if m.out_features == hidden]
    if len(into) > 1:
        into = [i for i in into if linears[i].in_features != hidden]
    ins = [m for i, m in enumerate(linears) if m.in_features == hidden and i not in into]
    if len(convs) != 1 or per_head is None or len(into) != 1 or not ins:
        return None
    conv, out = convs[0], linears[into[0]]
    heads, inner = per_head.numel(), out.in_features
    if inner % heads:
        return None
    head_dim, n_in = inner // heads, sum(m.out_features for m in ins)
    channels, kernel = conv.in_channels, conv.kernel_size[0]
    common = dict(heads=heads, head_dim=head_dim, conv_kernel=kernel, conv_bias=conv.bias is not None,
                  proj_bias=out.bias or any(m.bias for m in ins))
    if "D" in vec:  # Mamba-2: conv over x, B, C; in_proj z, x, B, C, dt
        gn2 = channels - inner
        if gn2 <= 0 or gn2 % 2 or n_in != 2 * inner + gn2 + heads:
            return None
        groups = scalar(mod, "n_groups", "ngroups", default=1)
        state = scalar(mod, "ssm_state_size", "d_state", "state_size", default=gn2 // 2 // groups)
        if groups * state != gn2 // 2:
            return None
        return RecurrentSpec(kind="mamba2", d_state=state, n_groups=groups, gated_norm=inner in norms,
                             chunk_size=scalar(mod, "chunk_size", default=256), **common)
    key2 = channels - inner  # Gated DeltaNet: conv over q, k, v; projections q, k, v, z, beta, a
    if key2 <= 0 or key2 % 2 or n_in != key2 + 2 * inner + 2 * heads:
        return None
    key_heads = scalar(mod, "num_k_heads", "num_key_heads", default=heads)
    if (key2 // 2) % key_heads:
        return None
    return RecurrentSpec(kind="gated_deltanet", key_heads=key_heads, key_head_dim=key2 // 2 // key_heads,
                         gated_norm=head_dim in norms, chunk_size=scalar(mod, "chunk_size", default=64), **common)


def scalar(mod, *names: str, default=None):
    """The first int attribute of ``mod`` among ``names`` (transformers modules keep their shapes)."""
    for n in names:
        v = getattr(mod, n, None)
        if isinstance(v, int) and not isinstance(v, bool):
            return v
    return default
