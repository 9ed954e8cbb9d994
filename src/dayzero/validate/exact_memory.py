"""``dayzero memory --exact``: the runtime's own model and parallelization for one rank, at full
size, under FakeTensorMode and a fake process group, measured by PyTorch's FSDP2 memory tracker.

No memory is allocated and no rank is started: one process joins a ``fake`` process group as
the first rank of a pipeline stage, builds the model on the meta device, parallelizes it with
``runtime.parallelize`` (TP/SP, EP, activation checkpointing, FSDP2), materializes it as fake
tensors and runs two training steps the way the runtime does (micro-batches with its gradient
sync rule, or the pipeline schedule's order; AdamW). The second step is measured by
``torch.distributed._tools.fsdp2_mem_tracker.FSDPMemTracker``, whose categories map onto the
planner's:

    weights      unsharded parameters (the compute-dtype copies FSDP2 gathers) + buffers;
                 under ZeRO-3 without pipelining they are transient gathers -> temporary
    gradients    sharded + unsharded gradients; under ZeRO-2/3 without pipelining the unsharded
                 ones are one block's reduce-scatter input -> temporary
    optimizer    sharded parameters (FSDP2 keeps them in fp32: the master weights) + AdamW states
    activations  tensors saved in forward (+ inputs)
    temporary    backward temporaries, all-gather and reduce-scatter buffers

Each category is measured where it is complete, as the planner means it: weights and saved
activations at the end of each forward (the largest over the micro-batches in flight),
gradients at the end of each backward, optimizer states after the step, and temporary buffers,
which come and go, at their largest after any op. ``peak_bytes`` is the tracker's peak total;
``at_peak`` and ``maxima`` keep the composition at the peak and every category's largest value.

Routing: token counts are data, which fake tensors do not have, so MoE layers route a balanced
assignment (T k / E rows per expert: the planner's capacity factor 1.0) through the same
router, experts, all-to-all and combine as the runtime (:func:`_balanced_moe_forward`).
Pipelines: vpp 1; every backward runs without gradient sync or reshard as
``torch.distributed.pipelining`` does, and the last one syncs (the schedule's final reduce).
"""

from __future__ import annotations

import types
from dataclasses import dataclass, field

from dayzero.errors import LayoutError
from dayzero.specs.parallel import zero_shards
from dayzero.validate.torch_tools import local_tensor

CATEGORIES = ("weights", "gradients", "optimizer", "activations", "temporary")
DTYPES = {"bf16": "bfloat16", "fp32": "float32"}


@dataclass(frozen=True)
class ExactStage:
    stage: int
    rank: int
    categories: dict  # planner category -> bytes, as the planner means it (module docstring)
    at_peak: dict  # planner category -> bytes at the step's peak
    maxima: dict  # planner category -> its largest value at any op
    peak_bytes: int  # tracker peak total
    tracker_peak: dict = field(default_factory=dict)  # FSDPMemTracker categories at the peak, bytes
    seconds: float = 0.0  # wall time of the measurement
    grad_excess: tuple = ()  # (parameter, bytes, placements): unsharded gradients larger than the parameter's shard
    shard_excess: tuple = ()  # (parameter, elements): this rank's FSDP2 shard beyond an even 1/n split
    temporary_at: dict = field(default_factory=dict)  # op, phase, module and live buffers at the temporary maximum

    def to_dict(self) -> dict:
        return {"stage": self.stage, "rank": self.rank, **self.categories, "total": sum(self.categories.values()),
                "peak_bytes": self.peak_bytes, "at_peak": dict(self.at_peak), "maxima": dict(self.maxima),
                "tracker_peak": dict(self.tracker_peak), "seconds": self.seconds,
                "grad_excess": [list(g) for g in self.grad_excess],
                "shard_excess": [list(g) for g in self.shard_excess], "temporary_at": dict(self.temporary_at)}


def schedule_order(schedule: str, pp: int, stage: int, m: int) -> list[tuple[str, int]]:
    """("F"|"B", micro-batch) actions of one pipeline stage: without pipelining each micro-batch's
    forward and backward in turn (runtime.train.forward_backward); 1F1B (Narayanan et al. 2021)
    keeps pp - stage micro-batches in flight, GPipe all m."""
    if pp == 1:
        return [a for i in range(m) for a in (("F", i), ("B", i))]
    if schedule == "gpipe":
        return [("F", i) for i in range(m)] + [("B", i) for i in range(m)]
    warm = min(pp - 1 - stage, m)
    order = [("F", i) for i in range(warm)]
    f, b = warm, 0
    while b < m:
        if f < m:
            order.append(("F", f))
            f += 1
        order.append(("B", b))
        b += 1
    return order


def _planner_categories(snap: dict, transient_params: bool, transient_grads: bool) -> dict:
    """FSDPMemTracker categories -> the planner's. Copies that exist only around a collective are
    temporary, as the planner counts them: gathered parameters under ZeRO-3 (its gather buffers)
    and unsharded gradients under ZeRO-2/3 (the reduce-scatter input of one block)."""
    from dayzero.validate.torch_tools import ref_types

    R = ref_types()
    g = lambda k: int(snap.get(k, 0))  # noqa: E731
    params, grads = g(R.UNSHARDED_PARAM), g(R.UNSHARDED_GRAD)
    return {"weights": (0 if transient_params else params) + g(R.BUFFER),
            "gradients": g(R.SHARDED_GRAD) + (0 if transient_grads else grads),
            "optimizer": g(R.SHARDED_PARAM) + g(R.OPT),
            "activations": g(R.ACT) + g(R.INP),
            "temporary": g(R.TEMP) + g(R.ALL_GATHER) + g(R.REDUCE_SCATTER) + (params if transient_params else 0)
            + (grads if transient_grads else 0)}


class _Complete:
    """Largest value of chosen categories at the moments they are complete: weights and saved
    activations at the end of each forward, gradients at the end of each backward, optimizer
    states after the step."""

    def __init__(self, categorize):
        self.categorize, self.values = categorize, {}
        self.grad_excess: tuple = ()

    def update(self, tracker, names) -> None:
        for snap in tracker.get_tracker_snapshot("current").values():
            cats = self.categorize(snap)
            for c in names:
                if c == "gradients" and cats[c] > self.values.get(c, 0):
                    self.grad_excess = grad_excess(tracker._root_mod)
                self.values[c] = max(self.values.get(c, 0), cats[c])


def shard_excess(module) -> tuple:
    """Parameters whose FSDP2 shard on this rank holds more than an even 1/n of them: FSDP2 splits
    dim 0 in chunks of ceil(d0 / n) rows (torch.chunk), so with fewer rows than ranks (e.g. one
    local expert over 2 expert-data-parallel ranks) the first ranks hold whole rows and the last
    ones nothing. Returns (parameter, excess elements) per such parameter."""
    from torch.distributed.fsdp import FSDPModule

    out = []
    for mod in module.modules():
        group = mod._get_fsdp_state()._fsdp_param_group if isinstance(mod, FSDPModule) else None
        for fp in (group.fsdp_params if group else ()):
            n = fp.mesh_info.shard_mesh_size
            even = local_tensor(fp._unsharded_param).numel() / n
            extra = local_tensor(fp.sharded_param).numel() - even
            if extra >= 1:
                out.append((fp._param_fqn, int(extra)))
    return tuple(out)


def grad_excess(module) -> tuple:
    """Unsharded gradients (accumulated or fresh) that hold more elements than their parameter's
    local shard: DTensor's backward can produce a gradient replicated where the parameter is
    sharded (e.g. a vocab-parallel embedding's), and FSDP2 accumulates it that way until it syncs.
    Returns (parameter, excess bytes, placements) per such parameter."""
    from torch.distributed.fsdp import FSDPModule

    out = []
    for mod in module.modules():
        group = mod._get_fsdp_state()._fsdp_param_group if isinstance(mod, FSDPModule) else None
        for fp in (group.fsdp_params if group else ()):
            param = getattr(fp, "_unsharded_param", None)
            grad = fp.unsharded_accumulated_grad
            if grad is None and param is not None:
                grad = param.grad
            if grad is None or param is None:
                continue
            extra = local_tensor(grad).numel() - local_tensor(param).numel()
            if extra > 0:
                out.append((fp._param_fqn, extra * local_tensor(grad).element_size(),
                            str(getattr(grad, "placements", ""))))
    return tuple(out)


def _balanced_moe_forward(self, x):
    """MoE.forward (runtime/models/moe.py) with a balanced routing table instead of the data-dependent
    one; every tensor the real forward keeps is kept here with the same shape."""
    import torch

    from dayzero.runtime.parallel.all_to_all import AllToAll
    from dayzero.runtime.parallel.expert_parallel import AllToAllDispatch

    bs, seq, hidden = x.shape
    xf = x.reshape(-1, hidden)  # (T, H)
    weights, idx, probs = self.router(xf)
    k = idx.shape[1]
    flat = idx.reshape(-1)
    order = torch.argsort(flat, stable=True)
    token_of = order // k
    E, rows = self.spec.experts, flat.shape[0]
    counts = [rows // E + (e < rows % E) for e in range(E)]
    xs = xf[token_of]  # (T k, H) grouped by expert
    d = self.dispatcher
    if isinstance(d, AllToAllDispatch):
        # every rank sends rows / ep to each peer and receives as many: balanced both ways
        per_peer = [sum(counts[s * d.local:(s + 1) * d.local]) for s in range(d.ep)]
        xr = AllToAll.apply(xs, per_peer, per_peer, d.group)
        local_counts = [rows // d.local + (j < rows % d.local) for j in range(d.local)]
        perm = torch.arange(rows, device=x.device)
        y = self.experts(xr[perm], local_counts)
        y = torch.empty_like(y).index_copy_(0, perm, y)
        y = AllToAll.apply(y, per_peer, per_peer, d.group)
    else:
        y = self.experts(xs, counts)
    c = torch.tensor(counts, dtype=torch.float32, device=x.device)
    out = self.combine(xf, y, weights, order, probs, c)
    return out.view(bs, seq, hidden)


def _check_exact(spec, p) -> None:
    """What one fake rank can measure: a layout the runtime runs, vpp 1, a process of its own."""
    import torch.distributed as dist

    from dayzero.runtime.checks import check_runtime

    check_runtime(spec, p, p.world)
    if spec.moe is not None:  # the runtime runs one GEMM per local expert and the measurement per-expert lists
        from dayzero.specs.hf_config import MAX_EXPERT_MODULES

        moe_layers = sum(k == "moe" for k in spec.layer_kinds)
        if spec.moe.experts * moe_layers > MAX_EXPERT_MODULES:
            raise LayoutError(f"--exact: {spec.moe.experts:,} experts x {moe_layers:,} MoE layers = "
                              f"{spec.moe.experts * moe_layers:,} experts to run under fake tensors; it measures at "
                              f"most {MAX_EXPERT_MODULES:,} (5x the largest released model); use the analytic model")
    if p.vpp > 1:
        raise LayoutError(f"--exact measures vpp 1 pipelines; got vpp {p.vpp} (interleaved stages hold several "
                          "FSDP roots); use the analytic model for interleaved layouts")
    if dist.is_initialized():
        raise LayoutError("--exact needs a process of its own (a process group is already running)")


def _fake_step(spec, p, stage: int, part, opt, dtype, complete: "_Complete | None" = None, tracker=None) -> None:
    """One training step of this stage's part in the schedule's order (inputs, targets and
    incoming gradients are empty tensors of the right shapes); with ``tracker``, each category is
    recorded in ``complete`` when the step has built all of it."""
    import torch
    import torch.nn.functional as F

    from dayzero.runtime.train import loss_context

    m, first, last = p.microbatches, stage == 0, stage == p.pp - 1
    # the residual stream a stage receives: sequence-sharded under sequence parallelism
    stage_seq = p.seq // p.tp if p.sequence_parallel and p.tp > 1 else p.seq
    outs = {}
    for kind, i in schedule_order(p.schedule, p.pp, stage, m):
        if kind == "F":
            if tracker is not None:
                tracker.reset_mod_stats()  # the tracker keeps module stats per call
            x = (torch.randint(0, spec.vocab, (p.mbs, p.seq)) if first else
                 torch.empty(p.mbs, stage_seq, spec.hidden, dtype=dtype, requires_grad=True))
            with loss_context(p.tp):
                out = part(x)
                if last:
                    y = torch.randint(0, spec.vocab, (p.mbs, p.seq))
                    out = F.cross_entropy(out.flatten(0, 1).float(), y.flatten()) / m
            outs[i] = out
            if tracker is not None:
                complete.update(tracker, ("weights", "activations"))
        else:
            last_b = i == m - 1
            if p.pp > 1:  # torch.distributed.pipelining: no sync or reshard until the last one
                part.set_is_last_backward(last_b)
                part.set_reshard_after_backward(last_b)
                part.set_requires_gradient_sync(last_b)
            else:  # runtime.train.forward_backward's rule
                part.set_requires_gradient_sync(last_b or zero_shards(p.zero, "gradients"))
            out = outs.pop(i)
            with loss_context(p.tp):
                if last:
                    out.backward()
                else:
                    out.backward(torch.empty_like(out))
            if tracker is not None:
                complete.update(tracker, ("gradients",))
    opt.step()
    if tracker is not None:
        complete.update(tracker, ("optimizer",))
    opt.zero_grad(set_to_none=True)


def _create_optimizer_states(pm, opt) -> None:
    """AdamW creates its states on the first step; a step on zero gradients creates them (the
    steady step holds them throughout) without tracing an untracked forward and backward."""
    import torch

    for param in pm.parameters():
        param.grad = torch.zeros_like(param)
    opt.step()
    opt.zero_grad(set_to_none=True)


def exact_stage(spec, parallel, stage: int, compute_dtype: str = "bf16") -> ExactStage:
    """Measure pipeline stage ``stage`` (its first rank) under fake tensors and a fake group."""
    import time

    import torch
    import torch.distributed as dist
    from torch._subclasses.fake_tensor import FakeTensorMode

    from dayzero.runtime.models.model import build_model
    from dayzero.runtime.models.moe import MoE
    from dayzero.runtime.optim import build_optimizer
    from dayzero.runtime.parallel.mesh import build_meshes
    from dayzero.runtime.parallel.parallelize import parallelize
    from dayzero.torch_version import require_torch
    from dayzero.validate.torch_tools import category_tracker, fake_store, local_sharding_propagation, ref_types

    require_torch("memory --exact")
    p = parallel
    _check_exact(spec, p)
    dtype = getattr(torch, DTYPES[compute_dtype])
    start = time.perf_counter()
    rank = stage * p.tp * p.cp * p.dp
    dist.init_process_group("fake", rank=rank, world_size=p.world, store=fake_store())
    try:
        meshes = build_meshes(p, "cpu")  # device meshes need real tensors: built before fake mode
        pm = parallelize(build_model(spec, p.seq), meshes, torch.device("meta"), dtype,
                         lambda fqn, shape: torch.empty(shape, device="meta"))
        if len(pm.parts) != 1:
            raise LayoutError(f"--exact expects one model part per rank, got {len(pm.parts)}")
        part = pm.parts[0]
        with FakeTensorMode(allow_non_fake_inputs=True), local_sharding_propagation():
            part.to_empty(device="cpu")
            for mod in part.modules():
                if isinstance(mod, MoE):
                    mod.forward = types.MethodType(_balanced_moe_forward, mod)
                    mod.aux_loss_scale = 1.0 / p.microbatches
            part.train()
            opt = build_optimizer(pm.parameters(), 1e-3, 0.1)
            _create_optimizer_states(pm, opt)
            # pipelining keeps gathered parameters and full gradients until the step's end (runtime_layout)
            t_params = zero_shards(p.zero, "weights") and p.pp == 1
            t_grads = zero_shards(p.zero, "gradients") and p.pp == 1
            complete = _Complete(lambda snap: _planner_categories(snap, t_params, t_grads))
            R = ref_types()
            transient = {R.TEMP, R.ALL_GATHER, R.REDUCE_SCATTER} | ({R.UNSHARDED_PARAM} if t_params else set()) | (
                {R.UNSHARDED_GRAD} if t_grads else set())
            tracker = category_tracker(part, opt, lambda snap: _planner_categories(snap, t_params, t_grads), transient)
            with tracker:
                _fake_step(spec, p, stage, part, opt, dtype, complete, tracker)
            peak = next(iter(tracker.get_tracker_snapshot("peak").values()))
            uneven = shard_excess(part)  # after a forward: FSDP2 creates the unsharded parameters lazily
    finally:
        dist.destroy_process_group()
    at_peak = _planner_categories(peak, t_params, t_grads)
    total_key = next(k for k in peak if str(k) == "Total")
    cats = {**{c: int(complete.values.get(c, 0)) for c in CATEGORIES},
            "temporary": int(tracker.maxima.get("temporary", 0))}
    return ExactStage(stage=stage, rank=rank, categories=cats, at_peak=at_peak,
                      maxima={c: int(tracker.maxima.get(c, 0)) for c in CATEGORIES}, peak_bytes=int(peak[total_key]),
                      tracker_peak={str(getattr(k, "value", k)): int(v) for k, v in peak.items()},
                      seconds=time.perf_counter() - start, grad_excess=complete.grad_excess, shard_excess=uneven,
                      temporary_at=dict(tracker.temporary_at))


def exact_memory(spec, parallel, compute_dtype: str = "bf16", stages: list[int] | None = None,
                 progress=None) -> list[ExactStage]:
    """Every pipeline stage (or ``stages``), one fake rank each; ``progress(done, total, stage,
    last)`` is called before each stage (last None) and after it (last its ExactStage)."""
    todo = list(stages if stages is not None else range(parallel.pp))
    out = []
    for i, s in enumerate(todo):
        if progress:
            progress(i, len(todo), s, None)
        out.append(exact_stage(spec, parallel, s, compute_dtype))
        if progress:
            progress(i + 1, len(todo), s, out[-1])
    return out


def analytic_for_runtime(spec, parallel, compute_dtype: str = "bf16", capacity_bytes: int = 10**15, cluster=None):
    """The planner's report for what the runtime actually runs (validate.predicted: FSDP2
    semantics, eager kernels, the runtime's dtypes, no MTP modules); capacity only sets utilization."""
    from dayzero.planner.memory.memory import estimate_memory
    from dayzero.runtime.planner_view import memory_options, runtime_layout, runtime_spec

    eff, spec = runtime_layout(parallel), runtime_spec(spec)
    return estimate_memory(spec, eff, capacity_bytes, memory_options(cluster, compute_dtype, spec, eff, "cpu"))


MIB = 2**20


def _mib(n: float) -> str:
    return f"{n / MIB:,.0f} MiB"


def explain_gradients(e: ExactStage) -> tuple[int, str]:
    """Bytes and words for unsharded gradients kept larger than their parameter's shard."""
    if not e.grad_excess:
        return 0, ""
    extra = sum(b for _, b, _ in e.grad_excess)
    names = ", ".join(f"{n} {pl} +{_mib(b)}" for n, b, pl in e.grad_excess)
    return extra, (f"runtime keeps {_mib(extra)} more: DTensor's backward returns a gradient replicated where the "
                   f"parameter is tensor-parallel sharded ({names}), and FSDP2 accumulates it so until the gradient "
                   "sync; the planner counts every gradient at its parameter's shard")


def explain_uneven(e: ExactStage, nbytes: int, what: str) -> tuple[int, str]:
    """Bytes and words for FSDP2 shards larger than an even split (:func:`shard_excess`)."""
    if not e.shard_excess:
        return 0, ""
    elems = sum(n for _, n in e.shard_excess)
    names = sorted({n.split(".")[-2] if "." in n else n for n, _ in e.shard_excess})
    return elems * nbytes, (f"runtime keeps {_mib(elems * nbytes)} more {what}: FSDP2 splits dim 0 in chunks of "
                            f"ceil(rows / ranks), so this rank's shard of {len(e.shard_excess)} parameters "
                            f"({', '.join(names)}) is larger than the even split the planner assumes (fewer rows "
                            "than ranks)")


def attention_saved(spec, parallel, compute_dtype: str = "bf16", seqs: tuple[int, int] = (16, 32)) -> float:
    """Bytes the runtime's core attention saves for its backward, for one layer and micro-batch at
    the layout's size, measured with the kernel PyTorch picks on this machine (SDPA's CPU flash
    kernel needs equal q/k and v head dims; otherwise its math kernel, which computes bf16 in
    fp32): the distinct storages its autograd saves (the output excluded: it is the output
    projection's input, counted there) at two short sequence lengths, fitted as a s^2 + b s."""
    import torch

    from dayzero.runtime.models.attention import CoreAttention

    a, p = spec.attention, parallel
    heads = max(1, a.heads // p.tp)
    kv = heads if a.kind == "mla" else max(1, a.kv_heads // p.tp)
    dtype = getattr(torch, DTYPES[compute_dtype])
    core = CoreAttention(a.head_dim ** -0.5)
    sizes = []
    for n in seqs:
        q = torch.zeros(1, heads, n, a.head_dim, dtype=dtype, requires_grad=True)
        k = torch.zeros(1, kv, n, a.head_dim, dtype=dtype, requires_grad=True)
        v = torch.zeros(1, kv, n, a.v_head_dim, dtype=dtype, requires_grad=True)
        saved: dict = {}

        def pack(t, saved=saved):
            st = t.untyped_storage()
            saved[st.data_ptr()] = st.nbytes()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = core(q, k, v)
        saved.pop(out.untyped_storage().data_ptr(), None)
        sizes.append(sum(saved.values()))
    s1, s2 = seqs
    quad = (sizes[1] - sizes[0] * s2 / s1) / (s2 * s2 - s1 * s2)
    lin = (sizes[0] - quad * s1 * s1) / s1
    return p.mbs * (quad * p.seq ** 2 + lin * p.seq)


def _attention_planned(spec, parallel, compute_dtype: str) -> float:
    """What the planner's runtime model counts for the same tensors: q, k, v and the scores (eager
    attention) or the log-sum-exp (a fused kernel), one layer and micro-batch."""
    from dayzero.planner.memory.activations import Dims, attention_terms
    from dayzero.runtime.planner_view import memory_options, runtime_layout

    p = runtime_layout(parallel)
    opts = memory_options(None, compute_dtype, spec, p, "cpu")
    d = Dims(seq=p.seq, mbs=p.mbs, tp=p.tp, cp=p.cp, etp=p.etp, sp=p.sequence_parallel, fp8=False)
    t = attention_terms(spec, opts, d)
    return float(sum(float(t[k]) for k in ("q", "k", "v", "attn_scores", "attn_lse") if k in t))


def explain_attention(e: ExactStage, spec, parallel, compute_dtype: str, layers: int) -> tuple[int, str]:
    """Bytes and words for saved attention tensors kept at another size than the planner counts:
    the kernel's measured saved bytes (:func:`attention_saved`) against the planner's terms, times
    the layers whose attention is saved at the stage's activation maximum (no recompute: every
    layer of the stage, for each micro-batch in flight)."""
    p = parallel
    if p.recompute != "none" or not layers:
        return 0, ""
    inflight = 1 if p.pp == 1 else (p.microbatches if p.schedule == "gpipe" else min(p.pp - e.stage, p.microbatches))
    kernel, planned = attention_saved(spec, p, compute_dtype), _attention_planned(spec, p, compute_dtype)
    extra = (kernel - planned) * layers * inflight
    if abs(extra) < MIB:
        return 0, ""
    a = spec.attention
    why = (f"SDPA's math kernel (v head dim {a.v_head_dim} != q/k {a.head_dim} rules out the CPU flash kernel) "
           "computes in fp32 and saves the scores and q, k, v as fp32 copies" if a.head_dim != a.v_head_dim else
           "the attention kernel saves other tensors than the planner counts")
    return int(extra), (f"attention: {why}: {_mib(kernel)} per layer and micro-batch, measured on a probe of the "
                        f"runtime's attention at this layout's heads, where the planner counts {_mib(planned)} (q, k, "
                        f"v and the scores or log-sum-exp in the compute dtype): {_mib(extra)} more over {layers} "
                        f"layers x {inflight} micro-batch(es) in flight")


def temporary_terms(e: ExactStage, terms: dict, spec, parallel, compute_dtype: str = "bf16") -> list[dict]:
    """The exact temporary maximum's live buffers (``temporary_at``), sorted into the planner's
    transient terms, each with the planner's bytes for it (the planner's one-layer transient split
    into its score matrix and the rest): ``loss backward`` (buffers of a whole
    number of one micro-batch's logits, live outside the decoder layers; planner 0, a fused
    cross-entropy), ``attention backward`` (buffers of one micro-batch's s x s scores, in an
    attention module; planner: its eager score term), ``parameter gathers`` (all-gather outputs and
    gathered parameters; planner: zero3_gather), ``gradient buffers`` (reduce-scatter inputs,
    unsharded gradients, the parameters' gradients produced in this backward, which the tracker
    lists as unsharded gradients (validate.torch_tools.category_tracker), and inside a decoder
    layer gradients of the embedding's or head's size, which FSDP2 reduces only at the end of
    backward; planner: grad_reduce) and ``layer backward``
    (the rest: a layer's recomputed tensors and gradients in flight, which the tracker files as
    temporaries, and buffers under 1 MiB; planner: layer_transient's rest and the communication
    buffers)."""
    at = e.temporary_at
    live, module = at.get("live", []), at.get("module", "") or ""
    b = 2 if compute_dtype == "bf16" else 4
    in_layer = ".layers." in f".{module}."
    half = terms.get("temporary:logits", 0) / 2  # one micro-batch's logits in bf16; the fp32 ones are 2 halves
    a, p = spec.attention, parallel
    score = p.mbs * max(1, a.heads // p.tp) * (p.seq / p.cp) * p.seq * b  # one s x s score matrix
    root = spec.vocab * spec.hidden / p.tp * b  # the embedding's (or head's) local weight

    def multiple(n, unit, most):
        r = n / unit if unit else 0
        return 1 <= round(r) <= most and abs(r - round(r)) <= 0.01 * r

    cls = {"loss backward": [], "attention backward": [], "parameter gathers": [], "gradient buffers": [],
           "layer backward": []}
    for kind, n in live:
        if kind in ("All Gather", "Unsharded Param"):
            cls["parameter gathers"].append(n)
        elif kind in ("Reduce Scatter", "Unsharded Grad"):
            cls["gradient buffers"].append(n)
        elif not in_layer and multiple(n, half, 8):
            cls["loss backward"].append(n)
        elif "attention" in module and score >= 64 * MIB and multiple(n, score, 2 * 4 // b):
            cls["attention backward"].append(n)
        elif in_layer and multiple(n, root, 2):
            cls["gradient buffers"].append(n)
        else:
            cls["layer backward"].append(n)
    small = max(0, int(at.get("bytes", e.categories["temporary"])) - sum(n for _, n in live))  # buffers < 1 MiB
    t = lambda k: float(terms.get(f"temporary:{k}", 0))  # noqa: E731
    exact = {k: sum(v) + (small if k == "layer backward" else 0) for k, v in cls.items()}
    scores_planned = min(t("layer_transient"), score) if cls["attention backward"] else 0.0
    comm = {k: t(k) for k in ("ep_a2a", "sp_gather", "cp_ring", "cp_a2a", "pp_p2p") if t(k)}
    planned = {"loss backward": (0.0, "none: a fused cross-entropy"),
               "attention backward": (scores_planned, "the eager score matrix of layer_transient"),
               "parameter gathers": (t("zero3_gather"), "zero3_gather"),
               "gradient buffers": (t("grad_reduce"), "grad_reduce"),
               "layer backward": (t("layer_transient") - scores_planned + sum(comm.values()),
                                  " + ".join(["layer_transient" + (" (rest)" if scores_planned else "")]
                                             + list(comm)))}
    why = {"loss backward": "the eager cross-entropy backward's buffers (gradient, softmax, their sum, dtype "
                            "casts) live at once",
           "attention backward": "SDPA's math kernel's softmax backward holds the probabilities and their gradient "
                                 "in fp32 (CPU; see the activations row)",
           "parameter gathers": "FSDP2 keeps the root unit (embedding, head) gathered through the backward, with "
                                "the current and the prefetched layer; the planner counts 2 of the largest unit",
           "gradient buffers": "FSDP2's reduce-scatter input (a copy of one unit's unsharded gradients at the "
                               "syncing micro-batch), the parameter gradients this unit's backward has produced "
                               "so far (kept until its reduce-scatter), and the root unit's (embedding, head) "
                               "unsharded gradients, reduced only at the end of backward" + ("" if t("grad_reduce") else
                                                                      "; the planner counts them only under "
                                                                      "ZeRO-2/3"),
           "layer backward": "one layer's backward temporaries (its recomputed tensors, gradients in flight), buffers "
                             "under 1 MiB and communication buffers" + ("" if in_layer else
                                                                        "; not live at this op (the maximum is "
                                                                        "outside the decoder layers), the planner "
                                                                        "adds it to the other terms")}
    return [{"term": k, "exact": int(v), "analytic": int(planned[k][0]), "planner_term": planned[k][1],
             "why": why[k], "buffers": [int(n) for n in cls[k]], "under_1_mib": int(small if k == "layer backward"
                                                                                     else 0)}
            for k, v in exact.items() if v or planned[k][0]]


def _widths(buffers, module: str, spec, parallel, compute_dtype: str) -> str:
    """A dense layer's backward buffers in the units the planner's eager backward term counts: one
    micro-batch's tensors of the MLP width and of the hidden width (it assumes 4 and 2 of them for
    a gated MLP, :func:`dayzero.planner.memory.activations.eager_backward_transient`)."""
    if ".layers." not in f".{module}." or "moe" in module or not spec.mlp.gated:
        return ""
    p, b = parallel, 2 if compute_dtype == "bf16" else 4
    tok = p.mbs * p.seq / p.cp
    mlp, hid = tok * spec.mlp.intermediate / p.tp * b, tok * spec.hidden * b
    n_mlp = sum(round(n / mlp) for n in buffers if n >= mlp * 0.99 and abs(n / mlp - round(n / mlp)) < 0.01)
    n_hid = sum(round(n / hid) for n in buffers if hid * 0.99 <= n < mlp * 0.99
                and abs(n / hid - round(n / hid)) < 0.01)
    return (f"; that is {n_mlp} tensors' worth of the MLP width ({_mib(mlp)}) and {n_hid} of the hidden width "
            f"({_mib(hid)}), where the planner's eager backward counts 4 and 2"
            + (" besides the recomputed layer" if parallel.recompute != "none" else ""))


def explain_temporary(e: ExactStage, terms: dict, spec=None, parallel=None, compute_dtype: str = "bf16",
                      tolerance: float = 0.10) -> tuple[int, str]:
    """Bytes and words for the temporary maximum, term by term: the exact run's largest set of
    buffers live at one op, sorted into the planner's transient terms (:func:`temporary_terms`).
    Every term but ``layer backward`` is a named mechanism the planner does not model as the
    runtime runs it, so its difference is explained; ``layer backward`` is the term the two
    models both claim to count, and is explained only when it is not live at the maximum (an op
    outside the decoder layers). What is left is named when it exceeds ``tolerance``."""
    at = e.temporary_at
    if not at or spec is None:
        return 0, ""
    rows = temporary_terms(e, terms, spec, parallel, compute_dtype)
    where = f"{at['phase']} of {at['module'] or 'the model'} at {at['op']}"
    parts, explained, left, listed = [], 0, 0, ""
    for r in rows:
        diff = r["exact"] - r["analytic"]
        layer = r["term"] == "layer backward"
        if layer and r["exact"] > 0.05 * max(r["analytic"], 1):
            left = diff
            sizes = sorted(r["buffers"], reverse=True)
            groups = [f"{_mib(n)}" + (f" x {sizes.count(n)}" if sizes.count(n) > 1 else "")
                      for n in sorted(set(sizes), reverse=True)]
            listed = ", ".join(groups[:8] + ([f"{len(groups) - 8} more sizes"] if len(groups) > 8 else [])
                               + [f"{_mib(r['under_1_mib'])} in buffers under 1 MiB"])
            listed += _widths(r["buffers"], at.get("module", "") or "", spec, parallel, compute_dtype)
        else:
            explained += diff
        parts.append(f"{r['term']} {_mib(r['exact'])} vs {_mib(r['analytic'])} ({r['planner_term']}): {r['why']}")
    text = f"term by term at the exact maximum ({where}; exact vs planner): " + "; ".join(parts)
    total = e.categories["temporary"]
    if total and abs(left) > tolerance * total:
        text += (f"; remaining: layer backward, {_mib(abs(left))} {'more' if left > 0 else 'less'} live than the "
                 f"planner's one-layer transient (live: {listed})")
    return int(explained), text


def _join(a: tuple[int, str], b: tuple[int, str]) -> tuple[int, str]:
    return a[0] + b[0], "; ".join(t for t in (a[1], b[1]) if t)


def peak_row(stage: int, analytic: dict, exact: dict, explained: dict, peak_bytes: int, tolerance: float) -> dict:
    """The peak, term by term. The planner's peak is the sum of each category's largest value; the
    tracker's is one moment, at most the sum of its own category maxima. So the difference splits into
    (a) the categories' differences, each explained or not in its own row (``explained`` bytes: the
    mechanisms the exact run measured), and (b) what the exact maxima do not reach at once. The row is
    explained when the planner's peak with (a)'s explained bytes added is within ``tolerance`` of the
    exact maxima's sum (the planner's convention), and (b) is stated with its size."""
    total_an = sum(analytic.values())
    err = (total_an - peak_bytes) / peak_bytes
    within = abs(err) <= tolerance
    row = {"stage": stage, "category": "peak", "analytic": int(total_an), "exact": int(peak_bytes), "rel_error": err,
           "compared": True, "within": within, "explained_bytes": 0, "residual": err, "explained": False,
           "explanation": ""}
    if within:
        return row
    maxima = sum(exact.values())
    added = sum(explained.values())
    residual = (total_an + added - maxima) / maxima if maxima else err
    apart = maxima - peak_bytes
    mib = 2 ** 20
    parts = ", ".join(f"{c} {(analytic[c] + explained.get(c, 0) - exact[c]) / mib:+,.0f}" for c in analytic
                      if abs(analytic[c] + explained.get(c, 0) - exact[c]) >= mib)
    row.update(explained_bytes=int(added), residual=residual, explained=abs(residual) <= tolerance,
               explanation=(f"the planner sums each category's largest value ({total_an / mib:,.0f} MiB); the "
                            f"exact categories' largest values sum to {maxima / mib:,.0f} MiB, of which "
                            f"{apart / mib:,.0f} MiB are not live at the tracker's one peak moment; the categories' "
                            f"explained mechanisms add {added / mib:+,.0f} MiB to the planner's figure, leaving "
                            f"{residual:+.1%}"
                            + (f" (MiB left per category: {parts})" if parts else "")))
    return row


def compare(spec, parallel, compute_dtype: str = "bf16", stages: list[int] | None = None, tolerance: float = 0.10,
            exact: list[ExactStage] | None = None) -> dict:
    """Exact vs analytic per stage and category. A category is compared where both report it
    (non-zero); the loss's log-softmax output, which the planner files as temporary ``logits``,
    is an activation to the tracker (saved in forward) and is compared as one.

    Where they differ by more than ``tolerance`` for a reason the exact run measures (a gradient
    kept replicated, the loss backward's buffers), the row's ``explanation`` says what and how
    much (``explained`` bytes), and ``residual`` is the error left once those are added to the
    analytic figure; ``explained`` is true when that residual is within the tolerance. A temporary
    row also holds ``terms``: the exact maximum's live buffers against the planner's transient
    terms, one by one (:func:`temporary_terms`)."""
    from dayzero.runtime.planner_view import runtime_layout

    exact = exact if exact is not None else exact_memory(spec, parallel, compute_dtype, stages)
    analytic = analytic_for_runtime(spec, parallel, compute_dtype)
    t_grads = zero_shards(parallel.zero, "gradients") and parallel.pp == 1
    rows = []
    for e in exact:
        s = analytic.stages[e.stage]
        logits = s.terms.get("temporary:logits", 0)
        an = {c: getattr(s, c) for c in CATEGORIES}
        an["activations"] += logits
        an["temporary"] -= logits
        ex = e.categories
        grads = explain_gradients(e)
        notes = {"gradients": (0, "") if t_grads else grads,
                 "temporary": explain_temporary(e, s.terms, spec, parallel, compute_dtype, tolerance),
                 "optimizer": explain_uneven(e, 12, "fp32 master weights and AdamW moments"),
                 "activations": explain_attention(e, spec, parallel, compute_dtype, len(s.layers))}
        if zero_shards(runtime_layout(parallel).zero, "gradients"):  # the gradients the planner counts are sharded
            notes["gradients"] = _join(notes["gradients"], explain_uneven(e, 4, "sharded fp32 gradients"))
        if t_grads and grads[0]:
            b, text = notes["temporary"]
            notes["temporary"] = (b + grads[0], f"{text}; {grads[1]}")
        for c in CATEGORIES:
            both = an[c] > 0 and ex[c] > 0
            err = (an[c] - ex[c]) / ex[c] if ex[c] else None
            within = bool(both and abs(err) <= tolerance)
            extra, text = notes.get(c, (0, ""))
            residual = (an[c] + extra - ex[c]) / ex[c] if ex[c] and text else err
            rows.append({"stage": e.stage, "category": c, "analytic": int(an[c]), "exact": int(ex[c]),
                         "rel_error": err, "compared": both, "within": within,
                         "explained_bytes": int(extra) if text else 0, "residual": residual,
                         "explained": bool(both and not within and text and abs(residual) <= tolerance),
                         "explanation": text if text and not within else ""})
            if c == "temporary" and e.temporary_at:  # the same, as data: exact vs planner per transient term
                rows[-1]["terms"] = temporary_terms(e, s.terms, spec, parallel, compute_dtype)
        extras = {r["category"]: r["explained_bytes"] for r in rows[-len(CATEGORIES):]}
        rows.append(peak_row(e.stage, an, ex, extras, e.peak_bytes, tolerance))
    compared = [r for r in rows if r["compared"] and r["category"] != "peak"]
    return {"model": spec.name, "parallel": parallel.to_dict(), "compute_dtype": compute_dtype, "tolerance": tolerance,
            "rows": rows, "stages": [e.to_dict() for e in exact],
            "summary": {"compared": len(compared), "within": sum(r["within"] for r in compared),
                        "explained": sum(r["explained"] for r in compared),
                        "max_abs_rel_error": max((abs(r["rel_error"]) for r in compared), default=None),
                        "max_abs_residual": max((abs(r["residual"]) for r in compared), default=None),
                        "seconds": sum(e.seconds for e in exact)}}
