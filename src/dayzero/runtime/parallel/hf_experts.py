"""Expert parallelism for a model derived from its own modeling code (GShard, Lepikhin et al. 2020).

The routed experts are found by structure, with the reader the planner counts them with
(:func:`dayzero.derive.structure.expert_holders`): the module of each decoder layer holding 3-D
expert weights ``[E, a, b]``. Its forward must take the routing from its caller as
``(hidden_states, expert_ids, routing_weights)`` (tokens x hidden, tokens x top-k, tokens x top-k),
the experts interface of transformers' MoE blocks (``transformers.integrations.moe``), so that the
block's own router decides and only the expert computation moves:

1. every parameter of the experts module is split along its expert dim over the ``ep`` ranks (a
   DTensor ``Shard(0)`` on the expert mesh, so checkpoints see the whole tensors, as for the
   runtime's own models) and the module's expert count becomes E / ep;
2. each (token, slot) row is sent with its routing weight to the rank holding its expert
   (``all_to_all_single`` with split sizes, :mod:`~dayzero.runtime.parallel.all_to_all`);
3. there the module's own forward runs on the rows it received, one slot per row, with the local
   expert ids: it computes ``weight * expert(x)`` exactly as it does for its own tokens (gating,
   biases, clamps, whatever it holds);
4. the rows go back and are summed per token. Slots whose id is outside ``[0, E)``
   (transformers' "no expert" sentinel) add nothing, as in transformers' own forward.

The routing weights cross the exchange with autograd, so the router's gradient is the single-rank
one. The experts' gradients are reduced over the expert-data-parallel ranks (those holding the
same experts) and divided by the data-parallel degree (:func:`~dayzero.runtime.parallel.hf_plan.apply_fsdp`).

Refused in one line naming the module: experts held as a list of modules (the MoE block indexes
them itself, so no rank can run another's tokens through them), an experts forward that does not
take the routing from its caller (nothing says which rank each token goes to), an experts module
holding a parameter shared by all experts (its gradient would need every rank's tokens), and E not
divisible by ep.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from dayzero.errors import DayzeroError, LayoutError


@dataclass(frozen=True)
class ExpertSite:
    """One experts module of the model: its qualified name, expert count and the attributes holding
    that count (set to the local count when split)."""

    name: str
    experts: int
    count_attrs: tuple[str, ...]


def _positional(fn) -> int:
    """Positional parameters of a method after ``self`` (through ``functools.wraps`` wrappers)."""
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return sum(p.kind in kinds for p in inspect.signature(fn).parameters.values()) - 1


def site_of(name: str, mod: nn.Module, ep: int) -> ExpertSite:
    """The :class:`ExpertSite` of an experts module (its 3-D weights held directly), or LayoutError
    naming it and why expert parallelism cannot split it."""
    why = f"ep {ep} for a model derived from its own code"
    three = [(k, p) for k, p in mod.named_parameters(recurse=False) if p.dim() == 3]
    e = int(three[0][1].shape[0])
    shared = [k for k, p in mod.named_parameters() if p.dim() == 0 or p.shape[0] != e or "." in k]
    if shared:
        raise LayoutError(f"{name}: parameter '{shared[0]}' is shared by all {e} experts (not one slice per expert); "
                          f"its gradient needs every rank's tokens, so {why} cannot split the experts; use --dp")
    n = _positional(type(mod).forward)
    if n != 3:
        raise LayoutError(f"{name}: {type(mod).__name__}.forward takes {n} positional input(s), not (hidden_states, "
                          f"expert ids, routing weights): the routing does not reach the experts as inputs, so {why} "
                          "cannot send each token to the rank holding its expert; use --dp")
    if e % ep:
        raise LayoutError(f"{name}: {e} experts do not split over ep {ep}")
    # the count its forward reads (transformers' ``num_experts``): an int attribute equal to E, those
    # naming experts first (a width that happens to equal E is left alone)
    equal = [k for k, v in vars(mod).items() if type(v) is int and v == e]
    return ExpertSite(name, e, tuple([k for k in equal if "expert" in k.lower()] or equal))


def expert_sites(model, ep: int) -> list[tuple[ExpertSite, nn.Module]]:
    """Every experts module of a wrapped proxy (:class:`~dayzero.runtime.models.hf_model.CausalLM`) or of
    one of its pipeline stages (which may hold none), in layer order; LayoutError naming the first one
    expert parallelism cannot split."""
    from dayzero.derive import structure as st
    from dayzero.runtime.models.hf_model import decoder_layers

    qual, layers = decoder_layers(model)
    out = []
    for i, layer in enumerate(layers):
        where = f"{qual}.{i}"
        listed = st.expert_list(layer)
        if listed is not None:
            q = next(q for q, m in layer.named_modules() if m is listed)
            raise LayoutError(f"{where}.{q}: experts held as a list of {len(listed)} modules that the MoE block "
                              f"indexes itself; ep {ep} cannot run other ranks' tokens through them; use --dp")
        out += [(site_of(f"{where}.{q}", m, ep), m) for q, m in st.expert_holders(layer)]
    return out


def check_ep(model, ep: int) -> list[ExpertSite]:
    """The experts modules of the whole derived model; LayoutError when it cannot run expert parallel
    at ``ep`` (any device), also when it has no routed experts."""
    sites = [s for s, _ in expert_sites(model, ep)]
    if not sites:
        raise LayoutError(f"ep {ep}: {type(model.net).__name__} has no routed experts (3-D expert weights) in its "
                          "decoder layers; use --dp")
    return sites


def apply_ep(model, ep_mesh) -> list[nn.Module]:
    """Split every experts module over ``ep_mesh`` and dispatch its rows by all-to-all (``check_ep``
    passed); returns the experts modules (FSDP2 shards them over expert data parallel)."""
    from torch.distributed.tensor import Shard, distribute_tensor

    ep, group = ep_mesh.size(), ep_mesh.get_group()
    mods = []
    for site, mod in expert_sites(model, ep):
        for k, p in list(mod.named_parameters(recurse=False)):
            dt = distribute_tensor(p.data, ep_mesh, [Shard(0)], src_data_rank=None)
            mod.register_parameter(k, nn.Parameter(dt, requires_grad=p.requires_grad))
        for a in site.count_attrs:
            setattr(mod, a, site.experts // ep)
        mod.forward = functools.partial(_dispatch, mod, type(mod).forward, site, group, ep)
        mods.append(mod)
    return mods


@contextlib.contextmanager
def _local_weights(mod: nn.Module):
    """The module's expert weights as this rank's slices (plain tensors, autograd through
    ``to_local``) while its own forward runs; the DTensor parameters back afterwards."""
    saved = dict(mod._parameters)
    try:
        for k, p in saved.items():
            if p is not None and hasattr(p, "to_local"):
                mod._parameters[k] = p.to_local()
        yield
    finally:
        mod._parameters.update(saved)


def _check_call(site: ExpertSite, x, ids, w) -> None:
    ts = (x, ids, w)
    if all(isinstance(t, torch.Tensor) for t in ts) and not ids.dtype.is_floating_point and ids.dim() >= 1 \
            and ids.shape == w.shape and tuple(ids.shape[:-1]) == tuple(x.shape[:-1]):
        return
    got = ", ".join(str(tuple(t.shape)) if isinstance(t, torch.Tensor) else type(t).__name__ for t in ts)
    raise DayzeroError(f"{site.name}: the experts were called with {got}, not (tokens, hidden), (tokens, k) expert "
                       "ids, (tokens, k) weights; expert parallelism cannot dispatch them: run with --ep 1")


def _dispatch(mod, forward, site: ExpertSite, group, ep: int, *args, **kwargs):
    """The experts' forward with experts split over ``ep`` ranks (see module); called as the
    module's own forward is (its three inputs by position or by name)."""
    from dayzero.runtime.parallel.all_to_all import AllToAll

    bound = inspect.signature(forward).bind(mod, *args, **kwargs)
    bound.apply_defaults()
    hidden, ids, weights = list(bound.arguments.values())[1:4]
    _check_call(site, hidden, ids, weights)
    e, local = site.experts, site.experts // ep
    x = hidden.reshape(-1, hidden.shape[-1])
    k = ids.shape[-1]
    flat_ids, flat_w = ids.reshape(-1), weights.reshape(-1)
    slots = torch.nonzero((flat_ids >= 0) & (flat_ids < e)).squeeze(1)
    slots = slots[torch.argsort(flat_ids[slots], stable=True)]  # grouped by expert, so by owner rank
    counts = torch.bincount(flat_ids[slots], minlength=e)
    recv = torch.empty_like(counts)
    dist.all_to_all_single(recv, counts, [local] * ep, [local] * ep, group=group)
    recv = recv.view(ep, local)  # recv[s, j]: rows rank s sends to my local expert j
    send_splits, recv_splits = counts.view(ep, local).sum(1).tolist(), recv.sum(1).tolist()
    tokens = slots // k
    xr = AllToAll.apply(x[tokens], recv_splits, send_splits, group)
    wr = AllToAll.apply(flat_w[slots].unsqueeze(1), recv_splits, send_splits, group)
    local_ids = torch.arange(local, device=x.device).repeat(ep).repeat_interleave(recv.reshape(-1))
    with _local_weights(mod):
        y = forward(mod, xr, local_ids.unsqueeze(1), wr)
        if not xr.shape[0]:  # no rows here: keep the weights in the graph so every rank reduces gradients
            y = y + sum(p.sum() for p in mod.parameters(recurse=False)) * 0
    back = AllToAll.apply(y, send_splits, recv_splits, group)
    out = torch.zeros_like(x).index_add(0, tokens, back.to(x.dtype))
    return out.reshape(hidden.shape)
