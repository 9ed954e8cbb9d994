"""A model derived from its own modeling code, trained as itself: transformers' module on dayzero's runtime.

For a ``model_type`` dayzero has no hand-written family for (:mod:`dayzero.derive`), the runtime
trains ``transformers.AutoModelForCausalLM.from_config`` of a proxy config: the same keys shrunk
generically by the runtime's proxy flags (``--layers``, ``--hidden``, ``--experts``, ``--vocab``),
never per family:

- ``--layers N``: ``num_hidden_layers`` and every per-layer list of the same length (``layer_types``,
  ...) cut to the first N; refused when that loses a layer kind (the layers grouped by structure).
- ``--hidden H``: ``hidden_size``; every ``*heads`` count and ``*intermediate_size`` / ``*lora_rank``
  width scaled by H / hidden (at least 1); kv heads lowered to a divisor of the heads; ``head_dim``
  kept (written out when H / heads would change it).
- ``--experts E``: every ``num_experts`` / ``num_local_experts`` / ``n_routed_experts`` key, top-k
  capped at E, expert groups dropped when E does not split into them.
- ``--vocab V``: ``vocab_size`` (special token ids beyond it dropped).

The model is built on CPU in fp32 under the run's seed (transformers' own initialisation), so every
rank builds the same weights; its forward returns the logits, which the runtime's loss, optimizer,
schedule and clipping consume unchanged. The model's own auxiliary losses (a router's balance loss)
are not added: the runtime trains next-token cross-entropy.
"""

from __future__ import annotations

import re

import torch
from torch import nn

from dayzero.errors import DayzeroError, one_line

_EXPERTS = re.compile(r"^(num|n)_(local_|routed_)?experts$")
_TOP_K = ("num_experts_per_tok", "num_experts_per_token", "moe_topk", "top_k")


def _scaled(v: int, r: float) -> int:
    return max(1, round(v * r))


def shrink_config(cfg: dict, layers: int | None = None, hidden: int | None = None, experts: int | None = None,
                  vocab: int | None = None) -> dict:
    """The proxy's config dict: ``cfg`` with the proxy sizes applied by key name and shape (see the module)."""
    out = dict(cfg)
    n = cfg.get("num_hidden_layers")
    if layers is not None and isinstance(n, int) and layers < n:
        out["num_hidden_layers"] = layers
        for k, v in cfg.items():
            if isinstance(v, list) and len(v) == n:
                out[k] = v[:layers]
    old = cfg.get("hidden_size")
    if hidden is not None and isinstance(old, int) and hidden != old:
        r = hidden / old
        heads = cfg.get("num_attention_heads")
        head_dim = cfg.get("head_dim") or (old // heads if isinstance(heads, int) and heads else None)
        out["hidden_size"] = hidden
        for k, v in cfg.items():
            if not isinstance(v, int) or isinstance(v, bool):
                continue
            if k.endswith("heads") or "intermediate_size" in k or k.endswith("lora_rank"):
                out[k] = _scaled(v, r)
        h, kv = out.get("num_attention_heads"), out.get("num_key_value_heads")
        if isinstance(h, int) and isinstance(kv, int):
            out["num_key_value_heads"] = max(d for d in range(1, min(kv, h) + 1) if h % d == 0)
        if isinstance(h, int) and head_dim and "head_dim" not in cfg and hidden != h * head_dim:
            out["head_dim"] = head_dim
    if experts is not None:
        for k, v in cfg.items():
            if _EXPERTS.match(k) and isinstance(v, int) and experts < v:
                out[k] = experts
                for t in _TOP_K:
                    if isinstance(cfg.get(t), int):
                        out[t] = min(cfg[t], experts)
                g = cfg.get("n_group")
                if isinstance(g, int) and g > 1 and experts % g:
                    out["n_group"], out["topk_group"] = 1, 1
    if vocab is not None:
        out["vocab_size"] = vocab
        for k, v in cfg.items():
            if k.endswith("token_id") and isinstance(v, int) and v >= vocab:
                out[k] = None
    return out


def proxy_config(section):
    """(transformers config of the proxy, name) for a :class:`~dayzero.runtime.config.ModelSection`."""
    from dayzero.ops.hf_model import _quiet_transformers, config_object, read_model_config

    cfg, name, source, directory = read_model_config(section.name)
    small = shrink_config(cfg, section.layers, section.hidden, section.experts, section.vocab)
    with _quiet_transformers():
        config = config_object(small, name, source, None if small is not cfg else directory)[0]
    config.use_cache = False
    return config, name


def _build(config, name: str, device: str = "meta"):
    from transformers import AutoModelForCausalLM

    from dayzero.ops.hf_model import _quiet_transformers

    with _quiet_transformers(), torch.device(device):
        try:
            return AutoModelForCausalLM.from_config(config, torch_dtype=torch.float32)
        except Exception as e:  # any modeling code can fail; one line, never a traceback
            raise DayzeroError(f"{name}: cannot build the proxy {type(config).__name__}: "
                               f"{one_line(e)}") from None


def _kinds(net) -> int:
    from dayzero.derive import structure as st

    return len(st.group_layers(st.find_layer_list(net)[1]))


def proxy_spec(section):
    """The proxy's ModelSpec, described from the proxy module itself (meta device); refused when the
    proxy lost a kind of layer the full model has."""
    from dayzero.derive.describe import describe_module
    from dayzero.derive.to_spec import spec_from_description
    from dayzero.ops.hf_model import config_object, read_model_config

    config, name = proxy_config(section)
    net = _build(config, name)
    if section.layers is not None:
        cfg, _, source, directory = read_model_config(section.name)
        full = _kinds(_build(config_object(cfg, name, source, directory)[0], name))
        if _kinds(net) < full:
            raise DayzeroError(f"{name}: --layers {section.layers} keeps {_kinds(net)} of its {full} layer kinds; "
                               "raise --layers so the proxy keeps one layer of each kind")
    desc = describe_module(net, config, name, config.model_type)
    spec = spec_from_description(desc)[0]
    spec.extra.update(derived=True, description=desc)
    return spec


def build_proxy(section, seed: int):
    """The proxy on CPU in fp32, initialised by transformers under ``seed`` (identical on every rank),
    wrapped so ``forward(input_ids)`` returns the logits."""
    config, name = proxy_config(section)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        net = _build(config, name, "cpu")
    _probe(net, config, name)
    return CausalLM(net)


def _probe(net, config, name: str, tokens: int = 8) -> None:
    """One forward of two short sequences before any training: a config the model's own code cannot
    run (e.g. MLA with fewer key/value heads than heads) is one line here, not a traceback per rank."""
    vocab = int(getattr(config, "vocab_size", 2) or 2)
    ids = torch.arange(2 * tokens, dtype=torch.long).remainder(vocab).reshape(2, tokens)
    try:
        with torch.no_grad(), torch.random.fork_rng(devices=[]):
            net(input_ids=ids, use_cache=False)
    except Exception as e:  # any modeling code can fail; one line, never a traceback
        raise DayzeroError(f"{name}: the model's own code fails a forward pass of the proxy "
                           f"({one_line(e)}); check the config's shapes "
                           "(heads, key/value heads, head dims) against what the modeling code expects") from None


class CausalLM(nn.Module):
    """A transformers causal LM whose forward maps token ids to logits (no cache, no loss)."""

    def __init__(self, net: nn.Module):
        super().__init__()
        self.net = net

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.net(input_ids=input_ids, use_cache=False).logits


def decoder_layers(model):
    """The decoder-layer ModuleList of a wrapped proxy, found by structure."""
    from dayzero.derive import structure as st

    qual, layers = st.find_layer_list(model.net)
    if layers is None:
        raise DayzeroError(f"{type(model.net).__name__} has no list of repeated decoder blocks")
    return qual, layers
