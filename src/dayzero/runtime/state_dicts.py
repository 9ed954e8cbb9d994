"""State dicts of a training run for DCP: model parts and optimizers, named as the full model.

Everything goes through ``torch.distributed.checkpoint.state_dict`` (``get_state_dict`` /
``set_state_dict``) with ``flatten_optimizer_state_dict``, so optimizer state is keyed by
parameter name (``state.<fqn>.exp_avg``, ``param_groups.<fqn>.lr``) and any layout (FSDP2 shards,
DTensor TP shards, pipeline stages holding different layers) can load what another one saved.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict, get_state_dict,
                                                     set_model_state_dict, set_state_dict)

from dayzero.runtime.manifest import CheckpointError

OPTIONS = StateDictOptions(flatten_optimizer_state_dict=True)


def split_non_tensors(flat: dict) -> tuple[dict, dict]:
    """({key: tensor}, {key: anything else}) of a flat state dict."""
    tensors = {k: v for k, v in flat.items() if isinstance(v, torch.Tensor)}
    return tensors, {k: v for k, v in flat.items() if k not in tensors}


def model_parts(model, optimizer) -> list[tuple[torch.nn.Module, Any]]:
    """(module, optimizer) pairs to take state dicts from.

    ``model`` is a module, a list of parts (the pipeline stages this rank runs) or an object with
    a ``parts`` list. With one optimizer per part they pair up; one optimizer over several parts
    is paired with a view of the parts as one module (see :func:`as_one_module`).
    """
    models = list(getattr(model, "parts", model)) if isinstance(model, (list, tuple)) or hasattr(model, "parts") \
        else [model]
    if optimizer is None:
        return [(m, None) for m in models]
    optims = list(optimizer) if isinstance(optimizer, (list, tuple)) else [optimizer]
    if len(optims) == 1 and len(models) > 1:
        return [(as_one_module(models), optims[0])]
    if len(optims) != len(models):
        raise CheckpointError(f"{len(models)} model parts but {len(optims)} optimizers; pass one optimizer per "
                              "part, or one for all of them")
    return list(zip(models, optims))


def as_one_module(parts: list[torch.nn.Module]) -> torch.nn.Module:
    """A plain module holding the parts' children under their own names (``layers`` ModuleDicts
    keyed by global layer index are merged), so parameter names are the full model's and one
    optimizer over all parts maps onto them. The parts' modules are shared, not copied."""
    root = torch.nn.Module()
    for part in parts:
        for name, child in part.named_children():
            have = root._modules.get(name)
            if have is None:
                root._modules[name] = torch.nn.ModuleDict(dict(child.items())) \
                    if isinstance(child, torch.nn.ModuleDict) else child
            elif isinstance(have, torch.nn.ModuleDict) and isinstance(child, torch.nn.ModuleDict) \
                    and not set(have.keys()) & set(child.keys()):
                have.update(dict(child.items()))
            else:
                raise CheckpointError(f"model parts both hold {name!r}; parts must be disjoint pieces of one model")
        for name, p in part.named_parameters(recurse=False):
            if name in root._parameters:
                raise CheckpointError(f"model parts both hold parameter {name!r}")
            root.register_parameter(name, p)
        for name, b in part.named_buffers(recurse=False):
            root.register_buffer(name, b, persistent=name not in part._non_persistent_buffers_set)
    return root


def train_state_dict(model, optimizer) -> tuple[dict, list[tuple[list[str], list[str]]]]:
    """{"model": {fqn: tensor}, "optim": {flat key: value}} over all parts, and each part's keys."""
    out: dict[str, dict] = {"model": {}, "optim": {}}
    keys = []
    for m, o in model_parts(model, optimizer):
        if o is None:
            msd, osd = get_model_state_dict(m, options=OPTIONS), {}
        else:
            msd, osd = get_state_dict(m, o, options=OPTIONS)
        for name, sd in (("model", msd), ("optim", osd)):
            clash = set(sd) & set(out[name])
            if clash:
                raise CheckpointError(f"model parts share state keys {sorted(clash)[:3]}; parts must hold disjoint modules")
            out[name].update(sd)
        keys.append((list(msd), list(osd)))
    return out, keys


def set_train_state(model, optimizer, state: dict, keys) -> None:
    for (m, o), (mkeys, okeys) in zip(model_parts(model, optimizer), keys):
        msd = {k: state["model"][k] for k in mkeys}
        if o is None:
            set_model_state_dict(m, msd, options=OPTIONS)
        else:
            osd = {k: state["optim"][k] for k in okeys}
            set_state_dict(m, o, model_state_dict=msd, optim_state_dict=osd, options=OPTIONS)
