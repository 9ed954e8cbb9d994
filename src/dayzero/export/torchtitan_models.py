"""The torchtitan model a plan trains: one of torchtitan's own registered configs, proven equal.

torchtitan 0.3 builds a model from a ``config_registry`` function of a model module
(``--module llama3 --config llama3_8b``: ``torchtitan/models/<module>/config_registry.py``); a model
of other dimensions needs Python code, not an override. So the export names the registered config
whose model *is* the planned one, found by the engine's own classes, never by name: for every config
function of the model type's module whose model has the planned hidden size, vocabulary and decoder
layer count, torchtitan builds the model on the meta device, and it is taken when its parameters
(plus the aux-loss-free routing bias, a buffer there: ``expert_bias``) equal ``dayzero inspect``'s,
MTP layers included. A model no registered config equals is refused with what differs (the closest
config's counts), never approximated. Needs torch and torchtitan (the ``engines``/``test`` extras).
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import logging
from dataclasses import dataclass
from functools import lru_cache

from dayzero.errors import ConfigError
from dayzero.specs.counting import params_total
from dayzero.specs.model import ModelSpec

# HF model_type -> torchtitan 0.3 model module (torchtitan/models/*/config_registry.py)
MODULES = {"llama": "llama3", "deepseek_v3": "deepseek_v3", "kimi_k2": "kimi_k2_7", "qwen3": "qwen3",
           "qwen3_moe": "qwen3", "gpt_oss": "gpt_oss"}


@dataclass(frozen=True)
class Registered:
    module: str
    config: str  # the config_registry function
    dim: int
    vocab: int
    layers: int
    mtp_layers: int


@contextlib.contextmanager
def _quiet():
    """torchtitan logs its config notes on the root logger; they are not the export's output."""
    logging.disable(logging.WARNING)
    try:
        yield
    finally:
        logging.disable(logging.NOTSET)


@lru_cache(maxsize=None)
def registered(module: str) -> tuple[tuple[Registered, ...], tuple[str, ...]]:
    """Every config function of ``torchtitan.models.<module>.config_registry`` whose model config
    builds here, with its model's dimensions (configs only: nothing is built), and the ones that
    do not (``name: why``: one needing torchao, say)."""
    reg = importlib.import_module(f"torchtitan.models.{module}.config_registry")
    out, skipped = [], []
    for name, fn in inspect.getmembers(reg, inspect.isfunction):
        if fn.__module__ != reg.__name__ or name.startswith("_") or inspect.signature(fn).parameters:
            continue
        try:
            with _quiet():
                m = fn().model_spec.model
        except Exception as e:  # noqa: BLE001 - a config needing torchao or a card: not one to check here
            skipped.append(f"{name}: {(str(e) or type(e).__name__).split('.')[0]}")
            continue
        layers = getattr(m, "layers", None)
        if not hasattr(m, "dim") or layers is None:
            continue
        out.append(Registered(module, name, int(m.dim), int(m.vocab_size), len(layers),
                              len(getattr(m, "mtp_layers", None) or ())))
    return tuple(out), tuple(skipped)


@lru_cache(maxsize=None)
def parameters(module: str, config: str) -> int:
    """Parameters of the model torchtitan builds from ``config`` on the meta device, the routing bias
    buffer counted as the weight dayzero counts it."""
    import torch

    reg = importlib.import_module(f"torchtitan.models.{module}.config_registry")
    with _quiet():
        m = getattr(reg, config)().model_spec.model
    with torch.device("meta"):
        model = m.build()
    extra = sum(b.numel() for n, b in model.named_buffers() if n.endswith("expert_bias"))
    return sum(p.numel() for p in model.parameters()) + extra


def model_config(spec: ModelSpec) -> Registered:
    """The registered config whose model equals ``spec`` (raises ConfigError saying what differs)."""
    module = MODULES.get(spec.model_type)
    if module is None:
        raise ConfigError("--to torchtitan", None, f"torchtitan 0.3 has no model module for model_type "
                          f"{spec.model_type!r} ({spec.name}); export to megatron or deepspeed")
    want = params_total(spec, with_mtp=True)
    mtp = spec.mtp_layers or 0
    try:
        regs, skipped = registered(module)
    except ImportError as e:
        raise ConfigError("--to torchtitan", None, f"torchtitan's {module} module, {spec.name}'s, does not import "
                          f"here ({e}); install what it needs to look up its configs") from None
    same_shape = [r for r in regs
                  if (r.dim, r.vocab, r.layers) == (spec.hidden, spec.vocab, spec.layers)]
    for r in same_shape:
        if r.mtp_layers == mtp and parameters(module, r.config) == want:
            return r
    if same_shape:
        r = same_shape[0]
        got = parameters(module, r.config)
        why = (f"its MTP layers {r.mtp_layers}, the plan's {mtp}" if r.mtp_layers != mtp
               else f"{got:,} parameters, the plan's {want:,}")
        raise ConfigError("--to torchtitan", None, f"torchtitan's {module}.{r.config} has {spec.name}'s shape but "
                          f"not its model ({why}); a model of other dimensions needs a config_registry function "
                          "of your own: export to megatron or deepspeed, or write one")
    why: dict[str, list[str]] = {}
    for entry in skipped:
        name, _, reason = entry.partition(": ")
        why.setdefault(reason, []).append(name)
    unread = (" (not built here: " + "; ".join(f"{', '.join(n)}: {r}" for r, n in why.items()) + ")") if why else ""
    raise ConfigError("--to torchtitan", None, f"torchtitan 0.3 registers no {module} config of {spec.name}'s shape "
                      f"(hidden {spec.hidden}, vocab {spec.vocab}, {spec.layers} layers){unread}; a model of other "
                      "dimensions needs a config_registry function of your own: export to megatron or deepspeed, "
                      "or write one")
