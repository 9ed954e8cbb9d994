"""State dicts of a training run for DCP: model parts and optimizers, named as the full model.

Everything goes through ``torch.distributed.checkpoint.state_dict`` (``get_state_dict`` /
``set_state_dict``) with ``flatten_optimizer_state_dict``, so optimizer state is keyed by
parameter name (``state.<fqn>.exp_avg``, ``param_groups.<fqn>.lr``) and any layout (FSDP2 shards,
DTensor TP shards, pipeline stages holding different layers) can load what another one saved.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)
from torch.distributed.tensor import DTensor

from dayzero.runtime.checkpoint.manifest import CheckpointError

OPTIONS = StateDictOptions(flatten_optimizer_state_dict=True)


def _small(v: Any) -> bool:
    return not isinstance(v, torch.Tensor) or (v.dim() == 0 and not isinstance(v, DTensor))


def split_small(flat: dict) -> tuple[dict, dict]:
    """({key: tensor for DCP}, {key: value for JSON}) of a flat optimizer state dict.

    Non-tensors (lr, betas, ...) and plain 0-dim tensors (AdamW's per-parameter ``step``) go to
    JSON: as DCP entries each would cost a torch.save (~0.1 ms and ~1 KB of zip records for 4
    bytes), a planning item and a pickled plan entry, and a model has thousands of them."""
    big = {k: v for k, v in flat.items() if not _small(v)}
    return big, {k: v for k, v in flat.items() if k not in big}


def take_saved(flat: dict, saved: dict) -> tuple[dict, dict, list[str]]:
    """Split a flat optimizer state dict for loading against the JSON part of a checkpoint
    (``saved``): ({key: tensor DCP reads}, {key: value from JSON}, [keys found nowhere]).

    Keys the JSON holds come from it (tensors moved to the current value's device); any other
    tensor is read by DCP, so checkpoints that stored ``step`` as a DCP entry still load."""
    dcp_part, json_part, missing = {}, {}, []
    for k, v in flat.items():
        if k in saved:
            s = saved[k]
            json_part[k] = s.to(v.device) if isinstance(s, torch.Tensor) and isinstance(v, torch.Tensor) else s
        elif isinstance(v, torch.Tensor):
            dcp_part[k] = v
        else:
            missing.append(k)
    return dcp_part, json_part, sorted(missing)


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
                raise CheckpointError(f"model parts share state keys {sorted(clash)[:3]}; parts must hold disjoint "
                                      "modules")
            out[name].update(sd)
        keys.append((list(msd), list(osd)))
    return out, keys


def model_shapes(model) -> dict[str, tuple[int, ...]]:
    """{fqn: global shape} of the tensors this rank's model parts load from a checkpoint."""
    state, _ = train_state_dict(model, None)
    return {k: tuple(v.shape) for k, v in state["model"].items() if isinstance(v, torch.Tensor)}


def fit_problems(want: dict[str, tuple[int, ...]], saved: dict[str, tuple[int, ...]]) -> list[str]:
    """Why a checkpoint holding model tensors ``saved`` ({fqn: shape}) cannot load into a model
    wanting ``want``: missing names, or other shapes (empty when it fits)."""
    missing = sorted(k for k in want if k not in saved)
    wrong = sorted(k for k in want if k in saved and tuple(saved[k]) != tuple(want[k]))
    out = []
    if missing:
        out.append(f"holds no tensor {missing[0]} (and {len(missing) - 1} more) of this run's model: written for "
                   "another model, or with other tensor names")
    if wrong:
        k = wrong[0]
        out.append(f"tensor {k} has shape {list(saved[k])}, this run's model {list(want[k])} (and "
                   f"{len(wrong) - 1} more differ): written for another model size")
    return out


def set_train_state(model, optimizer, state: dict, keys) -> None:
    for (m, o), (mkeys, okeys) in zip(model_parts(model, optimizer), keys):
        msd = {k: state["model"][k] for k in mkeys}
        if o is None:
            set_model_state_dict(m, msd, options=OPTIONS)
        else:
            osd = {k: state["optim"][k] for k in okeys}
            set_state_dict(m, o, model_state_dict=msd, optim_state_dict=osd, options=OPTIONS)
