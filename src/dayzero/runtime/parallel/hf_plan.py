"""Parallelism for a model derived from its own modeling code (:mod:`dayzero.runtime.models.hf_model`).

Data parallel / ZeRO: FSDP2 ``fully_shard`` on every decoder layer (the list found by structure),
then the root, with the runtime's ZeRO mapping and mixed precision (as ``data_parallel.apply_fsdp``).

Tensor parallel (Megatron-LM's split, Shoeybi et al. 2019, sec. 3): a plan derived from each decoder
layer's Linear modules by name and shape, applied only when every Linear of every layer is
recognised and divisible by tp, else refused with one line naming the module:

- ``q_proj`` / ``k_proj`` / ``v_proj`` column-parallel and ``o_proj`` row-parallel, heads split over
  the tp ranks (the attention reshapes with ``-1`` heads, so each rank runs its own heads). A
  per-head norm inside the attention (q/k norm of width ``head_dim``) stays replicated and its
  gradient is all-reduced over tp (each rank saw only its heads). When the attention holds a norm
  over all heads at once (width = a projection's output), or its projections are packed
  (``qkv_proj``), the projections' outputs are gathered instead and ``o_proj`` splits its input:
  correct for any attention, with the attention itself computed on every rank.
- ``gate_proj`` / ``up_proj`` column-parallel, ``down_proj`` row-parallel; a packed ``gate_up_proj``
  is column-parallel with its output gathered.
- Routed experts (3-D expert weights), linear attention / SSM mixers or any other Linear: refused.

Expert parallel: :mod:`~dayzero.runtime.parallel.hf_experts` (experts split over ep, tokens sent by
all-to-all; their gradients reduced over the expert-data-parallel ranks by :func:`apply_fsdp`).

Context parallel: :mod:`~dayzero.runtime.parallel.hf_context` (a slice of each sequence per cp rank,
the all-to-all of heads around transformers' attention core; gradients reduced over dp x cp).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from dayzero.errors import LayoutError
from dayzero.specs.parallel import zero_shards

COLUMN = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")
PACKED = ("qkv_proj", "gate_up_proj")
ROW = ("o_proj", "down_proj")
ATTENTION = ("q_proj", "k_proj", "v_proj", "qkv_proj", "o_proj")


@dataclass(frozen=True)
class TPEntry:
    """One Linear of a layer's plan: ``colwise`` | ``colwise_gather`` | ``rowwise`` | ``rowwise_split``."""

    name: str  # qualified name inside the decoder layer
    style: str


def _norms(mod: nn.Module) -> list[tuple[str, nn.Module]]:
    return [(q, m) for q, m in mod.named_modules() if q and "norm" in (q.rsplit(".", 1)[-1] + type(m).__name__).lower()]


def layer_plan(layer: nn.Module, tp: int, where: str) -> tuple[list[TPEntry], list[nn.Parameter]]:
    """(the plan of one decoder layer, replicated parameters whose gradient is all-reduced over tp);
    raises LayoutError naming the first module tensor parallelism cannot split."""
    why = f"tp {tp} for a model derived from its own code"
    for q, m in layer.named_modules():
        if isinstance(m, nn.modules.conv._ConvNd):  # a depthwise convolution (Mamba, linear attention)
            raise LayoutError(f"{where}.{q}: a {type(m).__name__} over the channels is not split by {why}; "
                              "use --dp")
        if any(p.dim() == 3 for p in m.parameters(recurse=False)) or (
                isinstance(m, nn.ModuleList) and "expert" in q.rsplit(".", 1)[-1].lower()):
            raise LayoutError(f"{where}.{q}: routed experts are not split by {why}; use --dp")
    linears = {q: m for q, m in layer.named_modules() if isinstance(m, nn.Linear)}
    attn_parents = {q.rpartition(".")[0] for q in linears if q.rsplit(".", 1)[-1] in ATTENTION}
    plan, allreduce = [], []
    for parent in sorted(attn_parents):
        mod = layer.get_submodule(parent) if parent else layer
        outs = {m.out_features for q, m in linears.items() if q.rpartition(".")[0] == parent}
        norms = _norms(mod)
        widths = {n.weight.shape[-1] for _, n in norms if getattr(n, "weight", None) is not None}
        head_dim = getattr(mod, "head_dim", None)
        packed = any(q.rsplit(".", 1)[-1] in PACKED and q.rpartition(".")[0] == parent for q in linears)
        gathered = packed or bool(widths & outs) or not isinstance(head_dim, int)
        for q, m in linears.items():
            if q.rpartition(".")[0] != parent:
                continue
            leaf = q.rsplit(".", 1)[-1]
            if leaf not in ATTENTION:
                raise LayoutError(f"{where}.{q}: Linear {m.in_features}->{m.out_features} is not a recognised "
                                  f"attention projection (q/k/v/o_proj); {why} refuses it; use --dp")
            if leaf == "o_proj":
                _divisible(m.in_features, tp, f"{where}.{q}")
                plan.append(TPEntry(q, "rowwise_split" if gathered else "rowwise"))
            else:
                _divisible(m.out_features, tp, f"{where}.{q}")
                if not gathered and (m.out_features // head_dim) % tp:
                    raise LayoutError(f"{where}.{q}: {m.out_features // head_dim} heads do not split over tp {tp}")
                plan.append(TPEntry(q, "colwise_gather" if gathered else "colwise"))
        if not gathered:
            allreduce += [p for _, n in norms for p in n.parameters()]
    for q, m in linears.items():
        if q.rpartition(".")[0] in attn_parents:
            continue
        leaf = q.rsplit(".", 1)[-1]
        if leaf in COLUMN:
            _divisible(m.out_features, tp, f"{where}.{q}")
            plan.append(TPEntry(q, "colwise"))
        elif leaf in PACKED:
            _divisible(m.out_features, tp, f"{where}.{q}")
            plan.append(TPEntry(q, "colwise_gather"))
        elif leaf in ROW:
            _divisible(m.in_features, tp, f"{where}.{q}")
            sib = [x for x in linears if x.rpartition(".")[0] == q.rpartition(".")[0]]
            split = any(x.rsplit(".", 1)[-1] in PACKED for x in sib)
            plan.append(TPEntry(q, "rowwise_split" if split else "rowwise"))
        else:
            raise LayoutError(f"{where}.{q}: Linear {m.in_features}->{m.out_features} is not a recognised projection "
                              f"(q/k/v/o_proj, gate/up/down_proj); {why} refuses it; use --dp")
    return plan, allreduce


def _divisible(n: int, tp: int, where: str) -> None:
    if n % tp:
        raise LayoutError(f"{where}: width {n} does not split over tp {tp}")


def check_tp(model, tp: int) -> None:
    """Raise LayoutError when the derived model cannot run tensor parallel at ``tp`` (on any device)."""
    from dayzero.runtime.models.hf_model import decoder_layers

    qual, layers = decoder_layers(model)
    for i, layer in enumerate(layers):
        layer_plan(layer, tp, f"{qual}.{i}")


def _style(name: str):
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    return {"colwise": ColwiseParallel(), "colwise_gather": ColwiseParallel(output_layouts=Replicate()),
            "rowwise": RowwiseParallel(), "rowwise_split": RowwiseParallel(input_layouts=Replicate())}[name]


def apply_tp(model, tp_mesh) -> None:
    """Parallelize every decoder layer by its derived plan (``check_tp`` passed)."""
    from torch.distributed.tensor.parallel import parallelize_module

    from dayzero.runtime.models.hf_model import decoder_layers

    qual, layers = decoder_layers(model)
    group = tp_mesh.get_group()
    for i, layer in enumerate(layers):
        plan, allreduce = layer_plan(layer, tp_mesh.size(), f"{qual}.{i}")
        parallelize_module(layer, tp_mesh, {e.name: _style(e.style) for e in plan})
        for p in allreduce:
            p.register_hook(_allreduce_hook(group))


def _allreduce_hook(group):
    def hook(grad: torch.Tensor) -> torch.Tensor:
        grad = grad.clone()
        dist.all_reduce(grad, group=group)
        return grad

    return hook


def apply_fsdp(model, mesh, param_dtype: torch.dtype, zero: int, gloo: bool, experts=(), edp=None) -> list:
    """fully_shard every decoder layer, then the root; returns the FSDP modules. ``experts``: modules
    split by expert parallelism (:mod:`~dayzero.runtime.parallel.hf_experts`), sharded first over
    ``edp`` (the ranks holding the same experts) with their gradients divided by the data-parallel
    degree, as the runtime's own models (``data_parallel.apply_fsdp``): a token's gradient counts once."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    from dayzero.runtime.models.hf_model import decoder_layers

    mp = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
    reshard = zero_shards(zero, "weights")
    units = []
    for m in experts:
        fully_shard(m, mesh=edp, mp_policy=mp, reshard_after_forward=reshard)
        m.set_gradient_divide_factor(float(mesh.size()))
        # gloo: sum inside the collectives, except where the shard dim has one rank (torch 2.13's FSDP2
        # then divides twice by the factor; the same guard as data_parallel.apply_fsdp)
        if gloo and edp.size(edp.ndim - 1) > 1:
            m.set_force_sum_reduction_for_comms(True)
        units.append(m)
    dense = [*decoder_layers(model)[1], model]
    for m in dense:
        fully_shard(m, mesh=mesh, mp_policy=mp, reshard_after_forward=reshard)
        if gloo:  # guard against averaging inside gloo collectives (torch 2.13; docs/runtime.md, FSDP2)
            m.set_force_sum_reduction_for_comms(True)
    return units + dense


def derived_problems(config) -> list[str]:
    """What the runtime cannot do for a model derived from its own code (no torch needed); what its
    modules make impossible (tp, pp, ep, cp) is found on the built proxy by :func:`check_derived`."""
    p, out = config.parallel, []
    if p.ep > 1 and config.moe.placement is not None:
        out.append("--placement is not supported for a model derived from its own code: its experts are split "
                   "evenly over ep (E/ep consecutive experts per rank); drop --placement")
    if p.recompute == "selective":
        out.append("--recompute selective is not supported for a model derived from its own code (transformers' "
                   "attention computes its core inside its forward); use --recompute full")
    return out


def check_derived(config) -> list[str]:
    """Raise LayoutError for what cannot run; else the dimensions that apply, as sentences."""
    from dayzero.runtime.models.hf_model import CausalLM, _build, proxy_config
    from dayzero.runtime.models.proxy_shape import FORWARD_PROBE_MAX
    from dayzero.runtime.parallel.hf_experts import check_ep
    from dayzero.runtime.parallel.hf_stages import check_composition, check_pp

    problems = derived_problems(config)
    if problems:
        raise LayoutError("; ".join(problems))
    config_obj, name, _ = proxy_config(config.model)
    model = CausalLM(_build(config_obj, name))
    p = config.parallel
    tp_note = _applies("tp", p.tp, lambda: check_tp(model, max(2, p.tp)),
                       "column/row-parallel plan derived from q/k/v/o and gate/up/down projections")
    ep_note = _applies("ep", p.ep, lambda: check_ep(model, max(2, p.ep)),
                       "routed experts found by structure split E/ep per rank, tokens sent to them by all-to-all")

    def stages_ok():
        check_pp(model)
        if p.pp > 1 and sum(x.numel() for x in model.parameters()) <= FORWARD_PROBE_MAX:
            # the same weights on every build, a fresh config each (a stage cuts its per-layer lists)
            check_composition(lambda: _cpu_proxy(config.model, seed=0), p.stage_layers(config.spec()),
                              int(getattr(config_obj, "vocab_size", 2) or 2))

    pp_note = _applies("pp", p.pp, stages_ok, "stages cut at decoder-layer boundaries (transformers' forward "
                       "per stage; the stages' composition checked against the whole model)")
    cp_what = "all-to-all of heads around transformers' attention core (Ulysses), the mask over the whole sequence"
    # the cp probe is a CPU forward of the proxy: run where cp is asked for, else said unchecked
    cp_note = _applies("cp", p.cp, lambda: check_derived_cp(config, p.cp, model), cp_what) if p.cp > 1 \
        else f"cp: {cp_what} (where every decoder layer's mixer is that attention; checked with --cp > 1)"
    return ["dp/zero: FSDP2 fully_shard per decoder layer, then the root", tp_note, pp_note, ep_note, cp_note,
            "recompute full: per decoder layer",
            "checkpoints: transformers' parameter names (resume and reshard across layouts)",
            "--hf-weights: loaded by transformers' names"]


def check_derived_cp(config, cp: int | None = None, model=None) -> None:
    """:func:`~dayzero.runtime.parallel.hf_context.check_cp` at ``cp`` (default the run's) on the
    proxy built on CPU (a forward of it), once per process for a proxy and layout; above the
    pre-launch probe's size (``proxy_shape.FORWARD_PROBE_MAX``) the ranks check it instead.
    ``model``: the proxy on meta, if built."""
    from dayzero.runtime.models.hf_model import CausalLM, _build, proxy_config
    from dayzero.runtime.models.proxy_shape import FORWARD_PROBE_MAX

    if model is None:
        config_obj, name, _ = proxy_config(config.model)
        model = CausalLM(_build(config_obj, name))
    if sum(p.numel() for p in model.parameters()) <= FORWARD_PROBE_MAX:
        problem = _cp_problem(config.model, cp or config.parallel.cp, config.parallel.tp)
        if problem:
            raise LayoutError(problem)


@functools.lru_cache(maxsize=8)
def _cp_problem(section, cp: int, tp: int) -> str | None:
    """Why the proxy of ``section`` cannot run cp (None: it can): the pre-launch check and the
    dimensions a run prints ask for it once."""
    from dayzero.runtime.parallel.hf_context import check_cp

    try:
        check_cp(_cpu_proxy(section), cp, tp)
    except LayoutError as e:
        return str(e)
    return None


def _cpu_proxy(section, seed: int | None = None):
    """The proxy of a :class:`~dayzero.runtime.config.ModelSection` built on CPU (transformers'
    initialisation under ``seed`` when given, no weights loaded): for a forward probe."""
    from dayzero.runtime.models.hf_model import CausalLM, _build, proxy_config

    config_obj, name, _ = proxy_config(section)
    with torch.random.fork_rng(devices=[]):
        if seed is not None:
            torch.manual_seed(seed)
        return CausalLM(_build(config_obj, name, "cpu"))


def _applies(dim: str, degree: int, check, what: str) -> str:
    """``dim: what`` where ``check()`` passes; where it raises, the LayoutError when the run asks for
    the dimension (``degree`` > 1), else ``dim: not applicable (why)``."""
    try:
        check()
    except LayoutError as e:
        if degree > 1:
            raise
        return f"{dim}: not applicable ({e})"
    return f"{dim}: {what}"


def parallelize_derived(config, meshes, device: torch.device, param_dtype: torch.dtype):
    """This rank's proxy of a derived model: built by transformers under the run's seed, cut into its
    pipeline stages, its attention cores between cp's all-to-all exchanges, tensor parallel by the
    derived plan, routed experts split over ep, each decoder layer recomputed when asked, FSDP2 over
    dp x cp (as the runtime skips it at one fp32 rank)."""
    from dayzero.runtime.models.hf_model import build_proxy
    from dayzero.runtime.parallel.hf_context import ContextGroup, apply_cp, check_cp
    from dayzero.runtime.parallel.hf_experts import apply_ep
    from dayzero.runtime.parallel.hf_stages import apply_recompute, split_derived
    from dayzero.runtime.parallel.parallelize import ParallelModel

    problems = derived_problems(config)
    if problems:
        raise LayoutError("; ".join(problems))
    p = config.parallel
    if p.pp > 1:
        if p.cp > 1:  # on every rank before any collective: the same model, the same LayoutError
            check_cp(_cpu_proxy(config.model), p.cp, p.tp)
        ranges = p.stage_layers(config.spec())
        parts = split_derived(lambda: build_proxy(config.model, config.seed), ranges, p.pp, meshes.pp_rank)
    else:
        parts = [(0, build_proxy(config.model, config.seed))]
        if p.cp > 1:
            check_cp(parts[0][1], p.cp, p.tp)
    units = []
    for _, model in parts:
        model.to(device)
        if p.cp > 1:
            apply_cp(model, ContextGroup.of(meshes, p.seq))
        if p.tp > 1:
            check_tp(model, p.tp)
            apply_tp(model, meshes.tp)
        experts = apply_ep(model, meshes.ep) if p.ep > 1 else []
        apply_recompute(model, p.recompute, p.recompute_layers)
        if p.dp * p.cp > 1 or param_dtype != torch.float32:  # gradients over dp x cp (meshes.dp)
            units += apply_fsdp(model, meshes.dp, param_dtype, p.zero, gloo=device.type == "cpu",
                                experts=experts, edp=meshes.edp)
    tied = [m.tied_copy() for _, m in parts if getattr(m, "tied", False)] if p.pp > 1 else []
    return ParallelModel([m for _, m in parts], [v for v, _ in parts], units, tied)
