"""Pipeline stages and activation recompute for a model derived from its own modeling code
(:mod:`dayzero.runtime.models.hf_model`), cut at decoder-layer boundaries found by structure.

A stage is transformers' whole model with only its decoder layers (the list found by
:func:`dayzero.derive.structure.find_layer_list`, original indices kept as parameter names, so a
stage's state dict names are the unpipelined model's). The first stage feeds token ids; a later
stage feeds the previous stage's hidden states as ``inputs_embeds`` (the model's body skips its
embedding); a stage before the last returns the body's output before the final norm (replaced by
the identity there) and drops the head; the last stage returns the logits. The model's own forward
still builds its masks and position embeddings on every stage, from the sequence it is given.

Tied input/output embeddings (Press & Wolf 2017): every stage keeps the input embedding (the first
uses it, the last computes its logits with it as the head; others hold it unused), so each stage
holds one copy of the matrix under the unpipelined name; after backward the copies' gradients are
summed over the pipeline ranks (:func:`reduce_tied`: the one gradient of the tied matrix, Megatron-
Core's embedding group, ``finalize_model_grads``), so every copy takes the same update, and the
global gradient norm counts the matrix once. Refused, one line naming the module: a body whose final
norm or embedding is not found by structure.

Recompute ``full`` (Chen et al. 2016) re-runs each decoder layer in backward (its ``forward``
replaced on the instance by a checkpointed call, names unchanged); ``selective`` needs the
attention core as a module of its own, which transformers' attention computes inside its forward:
refused.
"""

from __future__ import annotations

import functools

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.checkpoint import checkpoint

from dayzero.errors import LayoutError, one_line


def _body(net) -> tuple[str, nn.Module, str]:
    """(qualified name of the body holding the decoder layers, the body, the layer list's attribute)."""
    from dayzero.runtime.models.hf_model import decoder_layers

    qual = decoder_layers(net)[0]
    parent, _, attr = qual.rpartition(".")
    return parent, (net.net.get_submodule(parent) if parent else net.net), attr


def final_norm(body: nn.Module, attr: str) -> str:
    """The body's norm after the decoder layers: the last norm child registered after the layer list."""
    from dayzero.derive import structure as st

    names = list(dict(body.named_children()))
    after = names[names.index(attr) + 1:] if attr in names else names
    norms = [n for n in after if st.is_norm(n, getattr(body, n))]
    if not norms:
        raise LayoutError(f"{type(body).__name__}: no final norm after '{attr}' found by structure; "
                          "pipeline stages for this model need one; use --dp/--tp")
    return norms[-1]


def tied_weight(net) -> nn.Parameter | None:
    """The matrix the output head shares with the input embedding (None: untied)."""
    emb, head = net.get_input_embeddings(), net.get_output_embeddings()
    if head is not None and emb is not None and getattr(head, "weight", None) is getattr(emb, "weight", False):
        return emb.weight
    return None


def check_pp(model) -> None:
    """Raise LayoutError when the derived model cannot be cut into pipeline stages."""
    net = model.net
    emb = net.get_input_embeddings()
    _, body, attr = _body(model)
    final_norm(body, attr)
    if not any(m is emb for m in body.children()):
        raise LayoutError(f"{type(body).__name__}: its input embedding is not a child of the body holding "
                          f"'{attr}'; pipeline stages for this model are refused; use --dp/--tp")


def check_composition(build, ranges: list[range], vocab: int, tokens: int = 16) -> None:
    """Raise LayoutError when the stages cut at ``ranges`` do not compute what the whole model does
    (one CPU forward of two short sequences through each; ``build()`` gives a fresh proxy): a forward
    that reads something by a layer's position in the list it runs, or state kept across layers
    outside them, shows here rather than as a wrong loss."""
    whole = build()
    ids = torch.arange(2 * tokens, dtype=torch.long).remainder(max(2, vocab)).reshape(2, tokens)
    with torch.no_grad(), torch.random.fork_rng(devices=[]):
        want = whole(ids)
        x = ids
        for v, keep in enumerate(ranges):
            try:
                x = DerivedStage(build(), keep, v == 0, v == len(ranges) - 1)(x)
            except Exception as e:  # noqa: BLE001 - any modeling code may fail cut; one line naming the stage
                raise LayoutError(f"{type(whole.net).__name__}: its pipeline stage {v} (layers {keep.start}-"
                                  f"{keep.stop - 1}) fails on its own ({one_line(e, 160)}): the model's forward "
                                  "needs more than the previous stage's hidden states (e.g. the token ids for "
                                  "per-layer inputs); use --dp/--tp") from None
    err = float((x - want).abs().max() / want.abs().max().clamp_min(1e-30))
    if not err <= 1e-4:
        raise LayoutError(f"{type(whole.net).__name__}: its pipeline stages do not compute what the whole model "
                          f"does (largest difference {err:.2g} of the logits' scale on a probe): its forward reads "
                          "something by a layer's position or carries state between layers outside them; use "
                          "--dp/--tp")


class _KeptLayers(nn.ModuleList):
    """A decoder-layer list holding some layers under their original indices (names unchanged)."""

    def __init__(self, layers: nn.ModuleList, keep: range):
        super().__init__()
        for i in keep:
            self._modules[str(i)] = layers[i]

    def __getitem__(self, idx):
        mods = list(self._modules.values())
        return nn.ModuleList(mods[idx]) if isinstance(idx, slice) else mods[idx]


def _keep_per_layer_lists(config, n: int, keep: range) -> None:
    """The stage's config with each per-layer list (one entry per decoder layer: ``layer_types``, ...)
    cut to its layers: a body that reads them by the position of a layer in its list (Gemma 3's
    ``config.layer_types[i]`` for the i-th layer it runs) then reads the entry of that layer."""
    for c in {id(x): x for x in (config, getattr(config, "get_text_config", lambda: config)())}.values():
        for k, v in list(vars(c).items()):
            if isinstance(v, list) and len(v) == n and n > len(keep):
                object.__setattr__(c, k, [v[i] for i in keep])


class DerivedStage(nn.Module):
    """One pipeline stage of a derived proxy (see module); parameter names are ``net.<transformers name>``."""

    def __init__(self, model, keep: range, first: bool, last: bool):
        super().__init__()
        self.net = model.net
        self.first, self.last = first, last
        self.context = None  # context parallelism: runtime.parallel.hf_context.apply_cp
        self.tied = tied_weight(self.net) is not None  # the embedding then stays on every stage (see module)
        parent, body, attr = _body(model)
        self.body_name = parent
        _keep_per_layer_lists(self.net.config, len(getattr(body, attr)), keep)
        setattr(body, attr, _KeptLayers(getattr(body, attr), keep))
        if not first and not self.tied:
            emb = self.net.get_input_embeddings()
            for n, m in list(body.named_children()):
                if m is emb:
                    setattr(body, n, None)
        if not last:
            setattr(body, final_norm(body, attr), nn.Identity())
            for n, m in list(self.net.named_children()):
                if m is self.net.get_output_embeddings():
                    setattr(self.net, n, None)

    def tied_copy(self) -> nn.Parameter | None:
        """This stage's copy of the tied matrix (read when asked: FSDP2 replaces the parameter)."""
        return self.net.get_input_embeddings().weight if self.tied else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from dayzero.runtime.parallel.hf_context import forward_kwargs

        kw = {"input_ids": x} if self.first else {"inputs_embeds": x}
        kw.update(forward_kwargs(self, x))
        if self.last:
            return self.net(**kw, use_cache=False).logits
        body = self.net.get_submodule(self.body_name) if self.body_name else self.net
        return body(**kw, use_cache=False).last_hidden_state


def proxy_layer_split(cfg):
    """(``cfg``, a note): for a derived model's proxy whose layer count its pipeline stages do not
    divide (the proxy keeps one layer of each kind, so the count is the tool's choice, not the
    user's), the near-even split stated (earlier stages one layer more: the last holds the head);
    any other config as it is, with no note."""
    from dataclasses import replace

    p = cfg.parallel
    stages = p.pp * p.vpp
    if stages == 1 or p.layer_split is not None or not cfg.model.shrink:
        return cfg, None
    spec = cfg.spec()
    if not spec.extra.get("derived") or spec.layers % stages == 0 or spec.layers < stages:
        return cfg, None
    base, extra = divmod(spec.layers, stages)
    split = tuple(base + (i < extra) for i in range(stages))
    note = (f"the proxy's {spec.layers} layers do not divide into {stages} pipeline stages: layers per stage "
            f"{', '.join(map(str, split))} (--layer-split to choose)")
    return replace(cfg, parallel=replace(p, layer_split=split)), note


@torch.no_grad()
def reduce_tied(copies: list, group) -> None:
    """Sum the gradients of this rank's copies of a tied matrix (one per stage it runs) with every
    pipeline rank's over ``group``, and give each copy the sum; a copy its stage did not use (a middle
    stage) adds zeros. FSDP2 shards every copy alike (the same shape over the same dp ranks), so the
    local shards line up."""
    from torch.distributed.tensor import DTensor

    def local(t):
        return t.to_local() if isinstance(t, DTensor) else t

    total = torch.zeros_like(local(copies[0].data))
    for p in copies:
        if p.grad is not None:
            total += local(p.grad)
    dist.all_reduce(total, group=group)
    for p in copies:
        if p.grad is None:
            p.grad = (DTensor.from_local(total.clone(), p.device_mesh, p.placements) if isinstance(p, DTensor)
                      else total.clone())
        else:
            local(p.grad).copy_(total)


def split_derived(build, ranges: list[range], pp: int, pp_rank: int) -> list[tuple[int, nn.Module]]:
    """(virtual stage, DerivedStage) for every virtual stage on ``pp_rank``; ``build()`` gives a fresh
    proxy (the same weights on every call: built under the run's seed)."""
    last = len(ranges) - 1
    out = []
    for v in range(pp_rank, len(ranges), pp):
        model = build()
        check_pp(model)
        out.append((v, DerivedStage(model, ranges[v], v == 0, v == last)))
    return out


def _checkpointed(module: nn.Module) -> None:
    inner = module.forward

    @functools.wraps(inner)
    def forward(*args, **kwargs):
        return checkpoint(inner, *args, use_reentrant=False, **kwargs)

    module.forward = forward


def apply_recompute(model: nn.Module, mode: str, layers: int | None = None) -> int:
    """Checkpoint each decoder layer of ``model`` (a CausalLM or a DerivedStage) for ``full`` (the
    first ``layers`` when given); refuse ``selective``. Returns how many layers were wrapped."""
    from dayzero.derive import structure as st

    if mode == "none":
        return 0
    qual, blocks = st.find_layer_list(model)
    if mode == "selective":
        attn = next((f"{qual}.{q}" for q, m in blocks[0].named_modules() if "attn" in q.rsplit(".", 1)[-1].lower()
                     or "attention" in type(m).__name__.lower()), f"{qual}.0")
        raise LayoutError(f"{attn}: --recompute selective needs the attention core as a module of its own; "
                          "transformers' attention computes it inside its forward; use --recompute full")
    chosen = list(blocks) if layers is None else list(blocks)[:layers]
    for b in chosen:
        _checkpointed(b)
    return len(chosen)
