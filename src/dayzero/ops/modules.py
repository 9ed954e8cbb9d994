"""Where an operator came from: decoder layer and module category, from the module path.

``ModuleTracker`` names modules ``<RootClass>.<qualified name>``; :class:`ModuleMap` turns such a
name into (index of the decoder layer in the reduced model or None, category). Categories are read
from the deepest module upward, by class and attribute names that Hugging Face models (and most
remote code) use:

    head        the output projection (``get_output_embeddings()``)
    embedding   token / position embeddings, rotary tables
    norm        RMSNorm / LayerNorm modules (q/k norms and MLA's latent norms included)
    router      MoE routers (``*Router``, ``gate``) and the MoE block's own routing/combine code
    attention   ``self_attn`` / ``attn`` / ``*Attention`` (projections, rotary, scores, softmax)
    mlp         dense MLPs, experts, shared experts
    residual    code of the decoder layer itself (residual adds)
    root        the top-level model; the tracer splits it into ``loss`` (after the head in the
                forward, before it in the backward) and ``other``
"""

from __future__ import annotations

from torch import nn

CATEGORIES = ("attention", "mlp", "router", "norm", "embedding", "head", "loss", "residual", "other")


class ModuleMap:
    """Tracker name -> (layer, category), computed once per name."""

    def __init__(self, net: nn.Module, layer_list: str):
        root = type(net).__name__
        self._mods = {(f"{root}.{q}" if q else root): m for q, m in net.named_modules()}
        self._root = root
        self._layers_prefix = f"{root}.{layer_list}."
        self._head = net.get_output_embeddings() if hasattr(net, "get_output_embeddings") else None
        self._embed = net.get_input_embeddings() if hasattr(net, "get_input_embeddings") else None
        self._cache: dict[str, tuple[int | None, str]] = {}
        self._params: dict[int, tuple[int | None, str, str]] = {}
        for q, m in net.named_modules():
            name = f"{root}.{q}" if q else root
            for p in m.parameters(recurse=False):
                self._params.setdefault(id(p), (*self.locate(name), name))

    def owner(self, param) -> tuple[int | None, str, str] | None:
        """(layer, category, module) of the module holding ``param``."""
        return self._params.get(id(param))

    def locate(self, name: str) -> tuple[int | None, str]:
        hit = self._cache.get(name)
        if hit is None:
            hit = self._cache[name] = (self._layer(name), self._category(name))
        return hit

    def layer_child(self, name: str) -> str:
        """Class name of the decoder layer's direct child that holds module ``name`` (its mixer, its
        feed-forward block, a norm); "" for the layer's own code or outside the layers."""
        if not name.startswith(self._layers_prefix):
            return ""
        parts = name[len(self._layers_prefix):].split(".")
        if len(parts) < 2:
            return ""
        mod = self._mods.get(self._layers_prefix + ".".join(parts[:2]))
        return type(mod).__name__ if mod is not None else ""

    def _layer(self, name: str) -> int | None:
        if not name.startswith(self._layers_prefix):
            return None
        head = name[len(self._layers_prefix):].split(".", 1)[0]
        return int(head) if head.isdigit() else None

    def _category(self, name: str) -> str:
        if name in ("Global", self._root) or name not in self._mods:
            return "root"
        parts = name.split(".")
        for depth in range(len(parts), 1, -1):
            qual = ".".join(parts[:depth])
            cat = self._own(qual, self._mods.get(qual))
            if cat:
                return cat
        return "root"

    def _own(self, qual: str, mod: nn.Module | None) -> str | None:
        if mod is None:
            return None
        if self._head is not None and mod is self._head:
            return "head"
        if (self._embed is not None and mod is self._embed) or isinstance(mod, nn.Embedding):
            return "embedding"
        leaf = qual.rsplit(".", 1)[-1].lower()
        cls = type(mod).__name__.lower()
        if "rotary" in leaf or "rotary" in cls:
            return "embedding"
        if "norm" in cls or "norm" in leaf or leaf.startswith("ln_"):
            return "norm"
        if "router" in cls or "router" in leaf or leaf == "gate":
            return "router"
        if hasattr(mod, "experts") and isinstance(getattr(mod, "experts"), nn.Module):
            return "router"  # the MoE block's own code: routing weights, dispatch and combine
        if "attn" in leaf or "attention" in leaf or "attention" in cls:
            return "attention"
        if any(k in leaf or k in cls for k in ("mlp", "expert", "moe", "ffn", "feed_forward")):
            return "mlp"
        rest = qual[len(self._layers_prefix):] if qual.startswith(self._layers_prefix) else None
        if rest is not None and rest.isdigit():
            return "residual"
        activation = any(a in cls for a in ("gelu", "silu", "relu", "activation"))
        if rest is not None and (isinstance(mod, nn.Linear) or activation):
            return "mlp"  # an unnamed projection or activation in a decoder layer, outside attention
        return None
