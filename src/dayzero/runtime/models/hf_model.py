"""A model derived from its own modeling code, trained as itself: transformers' module on dayzero's runtime.

For a ``model_type`` dayzero has no hand-written family for (:mod:`dayzero.derive`), the runtime
trains ``transformers.AutoModelForCausalLM.from_config`` of a proxy config: the runtime's proxy flags
(``--layers``, ``--hidden``, ``--experts``, ``--vocab``) applied so the model keeps its structure (one
layer of each kind, widths with the products the modeling code checks, fields the config class
computes left to it), checked by the modeling code before any rank starts
(:mod:`dayzero.runtime.models.proxy_shape`), never per family.

The model is built on CPU in fp32 under the run's seed (transformers' own initialisation), so every
rank builds the same weights; its forward returns the logits, which the runtime's loss, optimizer,
schedule and clipping consume unchanged. The model's own auxiliary losses (a router's balance loss)
are not added: the runtime trains next-token cross-entropy.
"""

from __future__ import annotations

import functools
import json

import torch
from torch import nn

from dayzero.errors import DayzeroError, one_line
from dayzero.runtime.models.proxy_shape import build as _build
from dayzero.runtime.models.proxy_shape import (  # noqa: F401 - shrink_config: the flags alone
    fit,
    shrink_config,
    shrink_towers,
    tie_towers,
)
from dayzero.runtime.models.proxy_shape import probe as _probe


def proxy_config(section):
    """(transformers config of the proxy, name, notes) for a :class:`~dayzero.runtime.config.ModelSection`:
    the structure kept and checked by the modeling code (:mod:`~dayzero.runtime.models.proxy_shape`)."""
    from dayzero.ops.hf_model import _quiet_transformers, as_causal_decoder, config_object, read_model_config

    cfg, name, source, directory = read_model_config(section.name)
    with _quiet_transformers():
        full = config_object(cfg, name, source, directory)[0]
    if not section.shrink:
        full.use_cache = False
        return full, name, ()
    cfg, towers, ties = shrink_towers(cfg, language_model_dict(cfg, full)[0], section.hidden, section.layers,
                                      section.vocab)
    cfg, whole = language_model_dict(cfg, full)

    def wrap(d: dict) -> dict:
        return tie_towers(whole(d), ties, d.get("hidden_size"))

    def make(d: dict):
        with _quiet_transformers():
            try:
                made = type(full)(**{k: v for k, v in wrap(d).items() if k != "model_type"})
            except Exception as e:  # a config class validates in any way; one line
                raise DayzeroError(f"{name}: transformers rejects the proxy config: {one_line(e)}") from None
        return as_causal_decoder(made, [])

    key = (json.dumps(cfg, sort_keys=True, default=str), name, type(full), section.layers, section.hidden,
           section.experts, section.vocab)
    proxy = _fitted(key, make)
    config = make(proxy.cfg)
    config.use_cache = False
    return config, name, (towers, *proxy.notes) if towers else proxy.notes


def language_model_dict(cfg: dict, config):
    """(the part of the config.json the proxy shrinks, how a shrunk part becomes the whole config
    again): the language model's keys. ``config`` built from a multimodal config's ``text_config``
    (ops.hf_model.language_model_config): that sub-dict, as it is. ``config`` holding its language
    model as a sub-config (``get_text_config()``, e.g. Llama 4's text_config beside its vision_config):
    that sub-dict, put back in its place. Otherwise the whole dict."""
    def sub(model_type):
        return next((k for k, v in cfg.items() if isinstance(v, dict) and v.get("model_type") == model_type), None)

    if cfg.get("model_type") != config.model_type and (k := sub(config.model_type)):
        return cfg[k], lambda d: d
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    if text is not config and (k := sub(text.model_type)):
        return cfg[k], lambda d: {**cfg, k: d}
    return cfg, lambda d: d


@functools.lru_cache(maxsize=8)
def _fitted_key(key: tuple) -> list:
    return []  # one slot per key: the fitted proxy, filled by _fitted (the key holds the whole config)


def _fitted(key: tuple, make):
    """The fitted proxy of a config and flags, computed once per process (a run asks for it from the
    preflight, the layout check and each stage it builds; the key is the config's whole text)."""
    slot = _fitted_key(key)
    if not slot:
        cfg_text, name, _, layers, hidden, experts, vocab = key
        slot.append(fit(json.loads(cfg_text), make, layers, hidden, experts, vocab, name))
    return slot[0]


def proxy_spec(section):
    """The proxy's ModelSpec, described from the proxy module itself (meta device); refused when the
    proxy lost a kind of layer the full model has."""
    from dayzero.derive.describe import describe_module
    from dayzero.derive.to_spec import spec_from_description

    config, name, notes = proxy_config(section)
    net = _build(config, name)
    desc = describe_module(net, config, name, config.model_type)
    spec, approximations = spec_from_description(desc)
    spec.extra.update(derived=True, description=desc, proxy_notes=list(notes), approximations=approximations)
    return spec


def build_proxy(section, seed: int):
    """The proxy on CPU in fp32, initialised by transformers under ``seed`` (identical on every rank),
    wrapped so ``forward(input_ids)`` returns the logits."""
    config, name, _ = proxy_config(section)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        net = _build(config, name, "cpu")
    if section.hf_weights:
        load_by_name(net, section.hf_weights)
    _probe(net, config, name)
    return CausalLM(net)


def load_by_name(net: nn.Module, path: str) -> int:
    """Copy every tensor of the safetensors files at ``path`` into ``net``'s parameter or buffer of the
    same name (transformers' names, as ``save_pretrained`` writes them); one line naming the first
    tensor the model lacks, has a different shape, or the files lack. Returns how many were copied."""
    from pathlib import Path

    from dayzero.errors import ConfigError
    from dayzero.runtime.checkpoint.hf_weights import open_safetensors, read_tensor

    root = Path(path)
    files = sorted(root.glob("*.safetensors")) if root.is_dir() else [root]
    if not files or not all(f.exists() for f in files):
        raise ConfigError(path, None, "no *.safetensors files found; pass the checkpoint directory "
                          "(config.json + model*.safetensors)")
    own = dict(net.state_dict(keep_vars=True))
    seen = set()
    with torch.no_grad():
        for f in files:
            handle = open_safetensors(f)
            for k in handle.keys():
                if k not in own:
                    raise ConfigError(str(f), k, f"the model ({type(net).__name__}) has no tensor of this name; the "
                                      "weights are not of this model_type (or use a converted layout)")
                t = read_tensor(handle, f, k)
                if tuple(t.shape) != tuple(own[k].shape):
                    raise ConfigError(str(f), k, f"checkpoint shape {tuple(t.shape)} != model shape "
                                      f"{tuple(own[k].shape)}; a proxy (--layers/--hidden/--experts/--vocab) cannot "
                                      "load full-size weights; drop the proxy flags or export weights of this shape")
                own[k].copy_(t.to(own[k].dtype))
                seen.add(k)
    tied = {k for k, v in own.items() for j in seen if own[j] is v}
    missing = [k for k, v in net.named_parameters() if k not in seen and k not in tied]
    if missing:
        raise ConfigError(path, missing[0], f"missing from the checkpoint ({len(missing)} parameters in all); "
                          "the weights are not of this config")
    return len(seen)


class CausalLM(nn.Module):
    """A transformers causal LM whose forward maps token ids to logits (no cache, no loss); under
    context parallelism (``context``: :func:`~dayzero.runtime.parallel.hf_context.apply_cp`) the ids
    are one slice of each sequence and the forward passes its positions and the cp group."""

    def __init__(self, net: nn.Module):
        super().__init__()
        self.net = net
        self.context = None

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        from dayzero.runtime.parallel.hf_context import forward_kwargs

        return self.net(input_ids=input_ids, use_cache=False, **forward_kwargs(self, input_ids)).logits


def decoder_layers(model):
    """The decoder-layer ModuleList of a wrapped proxy, found by structure."""
    from dayzero.derive import structure as st

    qual, layers = st.find_layer_list(model.net)
    if layers is None:
        raise DayzeroError(f"{type(model.net).__name__} has no list of repeated decoder blocks")
    return qual, layers
