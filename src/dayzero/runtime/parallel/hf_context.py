"""Context parallelism by all-to-all for a model derived from its own modeling code
(:mod:`dayzero.runtime.models.hf_model`): DeepSpeed-Ulysses (Jacobs et al. 2023, arXiv:2309.14509),
the exchange of :mod:`~dayzero.runtime.parallel.context_parallel`, put around transformers' own
attention core.

Each of the cp ranks holds one contiguous slice of every sequence (S / cp tokens, fed by the
runtime's ``TokenStream`` as for its own models) and transformers' model runs on that slice, with
``position_ids`` = the slice's offset + arange (RoPE as on one rank). transformers dispatches every
attention core through ``ALL_ATTENTION_FUNCTIONS[config._attn_implementation]`` with q/k/v of shape
(B, heads, S/cp, d); the model's configs are switched to an implementation registered here
(``dayzero_a2a<cp>_<inner>``, ``inner`` the one the model was built with: sdpa, eager (the modeling
file's own ``eager_attention_forward``) or a flash kernel) that

1. trades the sequence for heads (all-to-all of q, k and v: (B, h/cp, S, d) on each rank),
2. runs the inner implementation over the whole sequence with a whole-sequence mask, and
3. trades the output's heads back for the sequence.

The mask: transformers builds masks through ``ALL_MASK_ATTENTION_FUNCTIONS`` with the model's own
mask function (causal, sliding window, chunked, ...) of absolute query/key indices; the mask
function registered under the same name calls the inner one with the whole sequence's length, so
each layer gets the mask its kind asks for, over all S tokens. Per-head vectors passed to the
core (attention sinks, ``s_aux``) are cut to this rank's head chunk. The run's process group
reaches the core as a keyword argument of the model's forward (transformers passes a forward's
extra keywords down to the attention interface), so nothing is held globally but the two
registered names (one function per (cp, inner), the same on every call).

Refused in one line naming the module (:func:`check_cp`: one forward of the built proxy on rank 0's
slice under the whole sequence's masks, recording every call of the interface per decoder layer): a
decoder layer that never calls it (a Mamba/SSM, linear-attention or recurrent mixer: its state runs
along the sequence, which no rank holds whole; the mixer named by the structure readers of
:mod:`dayzero.derive.structure`), a recurrent or convolutional mixer beside the attention (a
parallel hybrid), a module that fails when the mask covers the sequence and it holds a slice (it
reads the mask or keys outside the core: a sparse attention's indexer), a mask cut or built outside
transformers' mask interface, and query or key/value heads (per tp rank) that do not divide by cp.
A module that mixes tokens outside the core with none of these signs is not caught.
"""

from __future__ import annotations

import functools
import sys
from dataclasses import dataclass

import torch
from torch import nn

from dayzero.errors import DayzeroError, LayoutError
from dayzero.runtime.parallel.context_parallel import head_chunk, heads_to_sequence, sequence_to_heads

KWARG = "dayzero_cp"  # the keyword the exchange's group reaches the attention core by


@dataclass(frozen=True)
class ContextGroup:
    """The cp ranks one sequence is split over, as a rank's forward and attention cores need them."""

    group: object  # torch.distributed ProcessGroup
    cp: int
    rank: int
    offset: int  # the position of this rank's first token: rank x seq / cp

    @classmethod
    def of(cls, meshes, seq: int) -> "ContextGroup":
        """This rank's group on the cp dim of :class:`~dayzero.runtime.parallel.mesh.Meshes`."""
        cp, rank = meshes.cp.size(), meshes.cp_rank
        return cls(meshes.cp.get_group(), cp, rank, rank * (seq // cp))


def _interfaces():
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS, AttentionInterface

    return ALL_ATTENTION_FUNCTIONS, AttentionInterface, ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface


def _inner_attention(inner: str, module: nn.Module):
    """transformers' attention function ``inner`` as ``module``'s forward would pick it (eager: its
    modeling file's own ``eager_attention_forward``)."""
    attn = _interfaces()[0]
    if inner != "eager" and inner in attn:
        return attn[inner]
    own = getattr(sys.modules.get(type(module).__module__), "eager_attention_forward", None)
    if own is None:
        raise DayzeroError(f"{type(module).__name__}: its modeling file has no eager_attention_forward for cp to run "
                           "over the whole sequence; run with --cp 1")
    return own


def _attention(inner: str, cp: int, module: nn.Module, query, key, value, attention_mask, *args, **kwargs):
    """The core over the whole sequence between the two exchanges (see module)."""
    ctx = kwargs.pop(KWARG, None)
    where = type(module).__name__
    if not isinstance(ctx, ContextGroup):
        raise DayzeroError(f"{where}: the model's forward does not pass its keyword arguments down to the attention "
                           f"core, so cp {cp} cannot reach it; run with --cp 1")
    heads = (query.shape[1], key.shape[1], value.shape[1])
    if any(h % cp for h in heads):
        raise LayoutError(f"{where}: {heads[0]} query and {heads[1]} key/value heads per rank do not split over "
                          f"cp {cp}")
    s = query.shape[2] * cp
    if attention_mask is not None and tuple(attention_mask.shape[-2:]) != (s, key.shape[2] * cp):
        raise DayzeroError(f"{where}: its attention mask covers {tuple(attention_mask.shape[-2:])} tokens, not the "
                           f"whole sequence of {s}: the model builds it outside transformers' mask interface, so cp "
                           f"{cp} cannot extend it; run with --cp 1")
    for k, v in list(kwargs.items()):
        if isinstance(v, torch.Tensor) and v.dim() == 1 and v.shape[0] == heads[0]:  # per-head: sinks
            kwargs[k] = head_chunk(v, ctx.rank, cp)
    if isinstance(kwargs.get("position_ids"), torch.Tensor):  # a flash kernel reads sequence starts from them
        kwargs["position_ids"] = torch.arange(s, device=query.device).expand(query.shape[0], s)
    q, k, v = (sequence_to_heads(t.contiguous(), ctx.group, cp) for t in (query, key, value))
    out, _ = _inner_attention(inner, module)(module, q, k, v, attention_mask, *args, **kwargs)
    # transformers' cores return (B, S, h, d): the exchange runs on (B, h, S, d)
    out = heads_to_sequence(out.transpose(1, 2).contiguous(), ctx.group, cp).transpose(1, 2).contiguous()
    return out, None


def _mask(inner: str, cp: int, *args, q_length: int, kv_length: int, **kwargs):
    """The inner implementation's mask of the model's own mask function over the whole sequence."""
    return _interfaces()[2][inner](*args, q_length=q_length * cp, kv_length=kv_length * cp, **kwargs)


def implementation(inner: str, cp: int) -> str:
    """Register (once per name) and return the attention implementation of cp ranks around ``inner``."""
    attn, attn_cls, masks, mask_cls = _interfaces()
    if inner not in masks or (inner != "eager" and inner not in attn) or inner.startswith(("flex", "paged")):
        raise LayoutError(f"attention implementation {inner!r}: cp {cp} for a model derived from its own code runs "
                          "around sdpa, eager or a flash kernel; build the model with one of them or use --cp 1")
    name = f"dayzero_a2a{cp}_{inner}"
    if name not in attn:
        attn_cls.register(name, functools.partial(_attention, inner, cp))
        mask_cls.register(name, functools.partial(_mask, inner, cp))
    return name


def _configs(model: nn.Module) -> list:
    from transformers import PretrainedConfig

    seen = {}
    for m in model.modules():
        c = getattr(m, "config", None)
        if isinstance(c, PretrainedConfig):
            seen[id(c)] = c
    return list(seen.values())


def _inner_of(model: nn.Module) -> str:
    kinds = {c._attn_implementation for c in _configs(model) if c._attn_implementation}
    inner = sorted(k for k in kinds if not k.startswith("dayzero_a2a"))
    return inner[0] if inner else "sdpa"


def _sequence_mixers(layer: nn.Module, callers: set[int]) -> list[tuple[str, nn.Module]]:
    """A decoder layer's children that mix tokens without calling the attention interface: a
    convolution or recurrent state (:func:`dayzero.derive.structure.is_recurrent_mixer`) in a child
    that holds no attention caller; where the layer calls none, its mixer children by category."""
    from dayzero.derive import structure as st

    kids = list(layer.named_children())
    holds = {q: any(id(m) in callers for m in c.modules()) for q, c in kids}
    if not any(holds.values()):
        return [(q, c) for q, c in kids if st.category(q, c) == "mixer"]
    return [(q, c) for q, c in kids if not holds[q] and st.is_recurrent_mixer(c)]


def _probe_attention(inner: str, cp: int, module: nn.Module, query, key, value, attention_mask, *args, **kwargs):
    """The probe's core (:func:`check_cp`): records the call, then runs the inner core on rank 0's
    slice with its block of the whole-sequence mask."""
    s, t = query.shape[2], key.shape[2]
    whole = attention_mask is None or tuple(attention_mask.shape[-2:]) == (s * cp, t * cp)
    kwargs.pop(KWARG)(module, query, key, whole)
    if attention_mask is not None:
        attention_mask = attention_mask[..., :s, :t]
    return _inner_attention(inner, module)(module, query, key, value, attention_mask, *args, **kwargs)


def _probe_implementation(inner: str, cp: int) -> str:
    attn, attn_cls, _, mask_cls = _interfaces()
    implementation(inner, cp)  # refuses an inner it cannot run around
    name = f"dayzero_probe{cp}_{inner}"
    if name not in attn:
        attn_cls.register(name, functools.partial(_probe_attention, inner, cp))
        mask_cls.register(name, functools.partial(_mask, inner, cp))
    return name


def _running_modules(net: nn.Module) -> tuple[list[str], list]:
    """(the stack of modules whose forward is running, the hooks that keep it): where a forward failed."""
    stack: list[str] = []

    def enter(q: str):
        def hook(mod, _args):
            stack.append(f"{q} ({type(mod).__name__})")
        return hook

    def leave(_mod, _args, _out):
        stack.pop()  # returns None: the output is kept

    hooks = []
    for q, m in net.named_modules():
        hooks += [m.register_forward_pre_hook(enter(q)), m.register_forward_hook(leave)]
    return stack, hooks


def check_cp(model, cp: int, tp: int = 1) -> int:
    """Raise LayoutError when ``model`` (a wrapped proxy) cannot run cp ranks around its attention
    (see module); else the number of attention calls per forward. One forward of rank 0's slice of a
    short sequence under the whole sequence's masks, recording each call of the attention interface
    and its decoder layer: a module that reads the mask outside the interface (e.g. a sparse
    attention's indexer) fails it, and is named."""
    from dayzero.derive import structure as st
    from dayzero.errors import one_line
    from dayzero.ops.hf_model import _quiet_transformers

    qual, layers = st.find_layer_list(model.net)
    if layers is None:
        raise LayoutError(f"{type(model.net).__name__}: no list of repeated decoder blocks found by structure; "
                          f"cp {cp} needs one; use --dp/--tp")
    owner = {id(m): i for i, layer in enumerate(layers) for m in layer.modules()}
    calls: dict[int, list[tuple[int, str, int, int, bool]]] = {i: [] for i in range(len(layers))}

    def record(module, query, key, whole: bool):
        i = owner.get(id(module))
        if i is not None:
            calls[i].append((id(module), type(module).__name__, query.shape[1], key.shape[1], whole))

    name = _probe_implementation(_inner_of(model), cp)
    saved = [(c, c._attn_implementation) for c in _configs(model)]
    net = model.net
    vocab = int(getattr(net.config, "vocab_size", 2) or 2)
    device = next(net.parameters()).device
    ids = torch.arange(8, device=device).remainder(vocab).reshape(1, -1)
    stack, hooks = _running_modules(net)
    try:
        for c, _ in saved:
            c._attn_implementation = name
        with _quiet_transformers(), torch.no_grad(), torch.random.fork_rng(devices=[]):
            net(input_ids=ids, use_cache=False, **{KWARG: record})
    except Exception as e:  # any modeling code can fail; one line naming where
        where = stack[-1] if stack else type(net).__name__
        raise LayoutError(f"{where}: fails when its attention "
                          f"mask covers the whole sequence of {8 * cp} tokens and it holds a slice of 8 "
                          f"({one_line(e)}): it reads the sequence outside transformers' attention core; cp {cp} "
                          "cannot split it; use --dp/--tp") from None
    finally:
        for h in hooks:
            h.remove()
        for c, impl in saved:
            c._attn_implementation = impl
    why = f"cp {cp} for a model derived from its own code splits the sequence around transformers' attention core only"
    callers = {c[0] for v in calls.values() for c in v}
    for i, layer in enumerate(layers):
        where = f"{qual}.{i}"
        mixers = _sequence_mixers(layer, callers)
        named = [f"{where}.{q} ({type(m).__name__})" for q, m in mixers] or [f"{where} ({type(layer).__name__})"]
        if not calls[i]:
            raise LayoutError(f"{named[0]}: its token mixer never calls transformers' attention interface (a "
                              "recurrent, SSM or linear-attention state runs along the whole sequence); "
                              f"{why}; use --dp/--tp")
        if mixers:
            raise LayoutError(f"{named[0]}: a recurrent or convolutional token mixer beside the attention (its state "
                              f"runs along the whole sequence); {why}; use --dp/--tp")
        for _, cls, h, hk, whole in calls[i]:
            if not whole:
                raise LayoutError(f"{where} ({cls}): its attention mask does not cover the whole sequence (built or "
                                  f"cut outside transformers' mask interface); {why}; use --dp/--tp")
            per = [n // tp if n % tp == 0 else n for n in (h, hk)]
            if per[0] % cp or per[1] % cp:
                raise LayoutError(f"{where} ({cls}): {per[0]} query and {per[1]} key/value heads per tp rank do not "
                                  f"split over cp {cp}; use a cp that divides both")
    return sum(len(v) for v in calls.values())


def apply_cp(model: nn.Module, group: ContextGroup) -> None:
    """Run ``model`` (a wrapped proxy or one of its pipeline stages) on this rank's slice of each
    sequence over ``group`` (``check_cp`` passed): its configs switched to the exchanging
    implementation, its forward given the group (:func:`forward_kwargs`)."""
    name = implementation(_inner_of(model), group.cp)
    for c in _configs(model):
        c._attn_implementation = name
    model.context = group


def forward_kwargs(model: nn.Module, x: torch.Tensor) -> dict:
    """The keywords a wrapped proxy's forward adds under cp (:func:`apply_cp`): the slice's positions
    and the group; none without cp."""
    group = getattr(model, "context", None)
    if group is None:
        return {}
    b, s = x.shape[0], x.shape[1]
    return {"position_ids": (group.offset + torch.arange(s, device=x.device)).expand(b, s), KWARG: group}
