"""Step time, throughput and MFU of a layout: compute + communication + pipeline bubble.

    t_mb     = max over pipeline ranks of  sum over its layers (forward + backward + exposed
               per-layer communication)  + embedding (first rank) + head and loss (last rank)
    step_s   = (m * t_mb  +  bubble  +  exposed per-step communication  +  optimizer) * straggler
    straggler = 1 + sigma * sqrt(2 ln N)   (the wait for the slowest of the N ranks at the gradient
               sync, sigma = PerfConstants.step_jitter; planner.perf.scale_effects)
    bubble   = (pp - 1) / vpp * t_mb        (1F1B and GPipe: vpp = 1; interleaved 1F1B: vpp;
               DualPipe / DualPipeV: planner.schedule.bubble_microbatches)

``m`` = gbs / (mbs * dp) micro-batches. The bubble fraction (p-1)/(v m) is Narayanan et al.,
"Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM" (SC'21), eq. 1
and 2. The optimizer step is memory-bound: bytes per parameter / HBM bandwidth over the
parameters this rank updates (sharded over dp x cp with ZeRO >= 1).

Outputs per candidate: ``step_s``, ``compute_s`` (m x the slowest rank's compute),
``comm_exposed_s`` (communication nothing hides), ``bubble_s``, ``optimizer_s``, ``straggler_s``
(the wait for the slowest rank); tokens/s,
model TFLOP/s per device (causal attention FLOPs, no recompute), MFU against the peak of the
precision the GEMMs run in, and the communication ratio comm_exposed_s / step_s.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from functools import lru_cache

import numpy as np

from dayzero.planner.memory.offload import offloaded_optimizer_s
from dayzero.planner.perf.calibration import PerfConstants, constants_for, rates
from dayzero.planner.perf.comm import (
    CommOptions,
    Groups,
    choose_cp_comm,
    ep_overlapped,
    layer_comm,
    place_groups,
    place_groups_in,
    step_comm,
)
from dayzero.planner.perf.compute import BF16, compute_costs, layer_class_index, layer_classes, single_seq
from dayzero.planner.perf.scale_effects import straggler_factor
from dayzero.planner.perf.topology import scaleup_domain
from dayzero.planner.schedule import (
    PLACEMENTS,
    bubble_microbatches,
    effective_schedule,
    pipeline_groups,
    placement_code,
)
from dayzero.specs.cluster import Cluster
from dayzero.specs.counting import flops_per_token, mtp_flops_per_token
from dayzero.specs.grid import UNREPLAYED, cp_comm_of, flag, partial_layers
from dayzero.specs.model import ModelSpec
from dayzero.specs.parallel import PRECISIONS, model_split, stage_ranks, zero_sharded


@dataclass(frozen=True)
class PerfOptions:
    """Everything the step-time model needs beyond the layout itself (the GEMM precision and the
    rank order are the layout's: ParallelConfig.precision, ParallelConfig.rank_order)."""

    comm: CommOptions = field(default_factory=CommOptions)
    constants: PerfConstants | None = None  # None: defaults + the cluster file's efficiency overrides
    attention_kernel: str = "fused"  # fused (cuDNN / FlashAttention-3 class) | flash2 | unfused
    fp8_scaling: str = "tensor"  # FP8 recipe's scaling: tensor | block (DeepSeek-V3's; planner.perf.fp8_scaling)
    # optimizer states and FP32 master in host memory, Adam on the CPU (Megatron-Core
    # --optimizer-cpu-offload; planner.memory.offload): the step's optimizer term becomes the host Adam
    # plus the PCIe transfers (MemoryOptions.optimizer_offload drops the states from the device)
    optimizer_offload: bool = False
    # activation CPU offload of the first N layers of each model chunk (Megatron-Core --cpu-offloading
    # --cpu-offloading-num-layers N; planner.memory.activation_offload): each micro-batch pays the D2H and
    # H2D copies the layers' compute does not hide (MemoryOptions.activation_offload_layers drops
    # the bytes from the device); 0: off
    activation_offload_layers: int = 0
    # the engine's fusion level of the memory-bound ops (planner.perf.kernel_level): fused
    # (Megatron-Core + Transformer Engine, MindSpeed: the reference) | compile | eager
    kernel_level: str = "fused"

    def __post_init__(self):
        from dayzero.planner.perf.fp8_scaling import FP8_SCALINGS
        from dayzero.planner.perf.kernel_level import check_kernel_level

        check_kernel_level(self.kernel_level)

        if self.activation_offload_layers < 0:
            from dayzero.planner.memory.activation_offload import check_activation_offload

            check_activation_offload(self.activation_offload_layers)
        if self.fp8_scaling not in FP8_SCALINGS:
            from dayzero.errors import ConfigError

            raise ConfigError("--fp8-scaling", None, f"expected one of {', '.join(FP8_SCALINGS)}, got "
                                                     f"{self.fp8_scaling!r}")

    def switches(self) -> dict:
        """The run-wide switches engine limits read as columns (planner.engines.RUN_SWITCHES)."""
        return {"activation_offload_layers": self.activation_offload_layers}

    @classmethod
    def for_run(cls, cluster=None, tp_overlap: bool | None = None, ep_overlap: bool | None = None,
                moe_imbalance: float = 1.0, calibration: str | None = None, attention_kernel: str = "fused", *,
                moe_expert_cv: float = 0.0,
                ep_dispatcher: str = "dedup", fp8_dispatch: bool = False,
                fp8_scaling: str = "tensor", comm_sm_reserved: bool = False,
                fp8_param_gather: bool = False, optimizer_offload: bool = False,
                activation_offload_layers: int = 0, kernel_level: str = "fused",
                overlap_sm: bool = False) -> "PerfOptions":
        """The options of one run on ``cluster``: its efficiency constants (defaults, the cluster
        file's overrides, then a ``calibration`` file's), the overlap switches (``tp_overlap`` None:
        wherever Megatron-Core runs it, planner.perf.comm.tp_overlapped; ``ep_overlap`` None: wherever
        the layout's schedule runs it, planner.perf.comm.ep_overlapped), the MoE imbalance
        (busiest device's routed tokens over the average, >= 1, or derived per EP size from a
        per-expert load CV ``moe_expert_cv``), the EP dispatcher (``dedup`` | ``all_to_all``), FP8
        dispatch, the attention kernel, the FP8 recipe's scaling (``tensor`` | ``block``) and whether
        overlapped compute runs on the SMs the communication kernels leave for the whole window
        (``comm_sm_reserved``, CommOptions.sm_reserved), and FP8 parameter all-gathers
        (``fp8_param_gather``, CommOptions.fp8_param_gather), the optimizer offloaded to the
        host (``optimizer_offload``), the saved activations of the first
        ``activation_offload_layers`` layers of each model chunk (planner.memory.activation_offload)
        the engine's ``kernel_level`` (planner.perf.kernel_level) and whether every overlapped
        collective takes its library's SM share from the compute (``overlap_sm``,
        CommOptions.overlap_sm, planner.perf.overlap)."""
        from dayzero.errors import ConfigError
        from dayzero.planner.memory.memory_options import check_attention_kernel
        from dayzero.planner.perf.calibration import constants_for, load_calibration

        check_attention_kernel(attention_kernel)
        if not moe_imbalance >= 1.0:
            raise ConfigError("--moe-imbalance", None, f"must be >= 1.0 (busiest over average), got {moe_imbalance}")
        if not moe_expert_cv >= 0.0:
            raise ConfigError("--moe-expert-cv", None, f"must be >= 0 (std over mean of expert loads), "
                              f"got {moe_expert_cv}")
        if moe_expert_cv > 0 and moe_imbalance != 1.0:
            raise ConfigError("--moe-expert-cv", None, "give either a per-device --moe-imbalance or a per-expert "
                              "--moe-expert-cv, not both")
        constants = constants_for(cluster) if cluster is not None else None
        if calibration:
            constants = load_calibration(calibration, constants)
        comm = CommOptions(tp_overlap=tp_overlap, ep_overlap=ep_overlap, moe_imbalance=moe_imbalance,
                           moe_expert_cv=moe_expert_cv, ep_dispatcher=ep_dispatcher, fp8_dispatch=fp8_dispatch,
                           sm_reserved=comm_sm_reserved, fp8_param_gather=fp8_param_gather, overlap_sm=overlap_sm)
        return cls(comm=comm, constants=constants, attention_kernel=attention_kernel, fp8_scaling=fp8_scaling,
                   optimizer_offload=optimizer_offload, activation_offload_layers=activation_offload_layers,
                   kernel_level=kernel_level)

    def with_expert_loads(self, spec: ModelSpec, expert_loads: str | None = None,
                          placement: str | None = None) -> "PerfOptions":
        """These options with the routing imbalance measured from an expert-loads file (a metrics
        JSONL or a layer x expert matrix) under a placement file (default: contiguous), per EP size,
        instead of the constant (:mod:`dayzero.planner.perf.moe_imbalance`); unchanged without either."""
        from dataclasses import replace

        from dayzero.errors import ConfigError
        from dayzero.planner.perf.moe_imbalance import measured_imbalance
        from dayzero.specs.expert_loads import read_expert_loads
        from dayzero.specs.placement import load_placement

        if expert_loads is None and placement is None:
            return self
        if not spec.is_moe:
            raise ConfigError("--expert-loads" if expert_loads else "--placement", None,
                              f"{spec.name} has no MoE layers; expert loads and placements apply to MoE models only")
        if self.comm.moe_imbalance != 1.0 or self.comm.moe_expert_cv > 0:
            flag = "--moe-imbalance" if self.comm.moe_imbalance != 1.0 else "--moe-expert-cv"
            raise ConfigError(flag, None, f"give either {flag} or measured --expert-loads/--placement, not both")
        experts = spec.moe.experts
        loads = read_expert_loads(expert_loads) if expert_loads else None
        placed = load_placement(placement, experts=experts) if placement else None
        measured = measured_imbalance(experts, loads, placed, placement)
        return replace(self, comm=replace(self.comm, moe_measured=measured))


@lru_cache(maxsize=4096)
def stage_work(class_index: tuple[int, ...], n_classes: int, pp: int, vpp: int,
               split: tuple[int, ...] | None = None, schedule: str = "1f1b",
               mtp: tuple[int, int] = (0, 0)) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """What one micro-batch costs each pipeline rank on average: (pp, K) layers of each class it
    runs, and (pp,) the shares of the embedding and of the head it runs. A stage on several ranks
    (DualPipe's mirrored copies, :func:`dayzero.specs.parallel.stage_ranks`) is run by each for
    its share of the micro-batches (DualPipe: half enter at each end). ``mtp``: (class, count) of
    the multi-token-prediction modules' decoder layers, which run on the last stage with their
    own embedding lookup (Megatron-LM builds the MTP block on the last pipeline stage;
    Megatron-Bridge's layouts end "...tmL", the MTP as one more layer of the last stage)."""
    split = split or model_split(len(class_index), pp * vpp, mtp[1])
    placed = stage_ranks(schedule, pp, vpp)
    counts = np.zeros((pp, n_classes))
    start = 0
    for s, n in enumerate(split):
        for r in placed[s]:
            for layer in range(start, start + n):
                counts[r, class_index[layer]] += 1 / len(placed[s])
        start += n
    first, last = np.zeros(pp), np.zeros(pp)
    for share, stage in ((first, placed[0]), (last, placed[-1])):
        for r in stage:
            share[r] += 1 / len(stage)
    for r in placed[-1]:
        counts[r, mtp[0]] += mtp[1] / len(placed[-1])
        first[r] += mtp[1] / len(placed[-1])
    for a in (counts, first, last):
        a.setflags(write=False)
    return counts, first, last


def stage_counts(class_index: tuple[int, ...], n_classes: int, pp: int, vpp: int,
                 split: tuple[int, ...] | None = None, schedule: str = "1f1b") -> np.ndarray:
    """(pp, K): layers of each class one micro-batch passes on each pipeline rank (:func:`stage_work`)."""
    return stage_work(class_index, n_classes, pp, vpp, split, schedule)[0]


@dataclass(frozen=True)
class Evaluation:
    """Predicted times of N candidates (arrays of shape (N,)) and their communication inventory."""

    step_s: np.ndarray
    compute_s: np.ndarray
    comm_exposed_s: np.ndarray
    bubble_s: np.ndarray
    optimizer_s: np.ndarray
    straggler_s: np.ndarray  # the wait for the slowest rank at the step's gradient sync (planner.perf.scale_effects)
    tokens_per_s: np.ndarray
    tokens_per_s_per_device: np.ndarray
    model_tflops_per_device: np.ndarray
    mfu: np.ndarray
    comm_ratio: np.ndarray
    microbatches: np.ndarray
    microbatch_s: np.ndarray  # one micro-batch on the slowest rank, with its exposed per-layer communication
    groups: dict = field(repr=False)  # dim -> (size, per_domain, domains) arrays
    inventory: list = field(repr=False)  # [(item, ops, bytes, busy seconds, exposed seconds) per step, (N,) each]
    # (N,) 1.0 where the EP all-to-all overlaps another micro-batch (planner.perf.comm.ep_overlapped; 0 without MoE)
    ep_overlap: np.ndarray | None = field(default=None, repr=False)
    # (N,) seconds per step of activation-offload copies no compute hides (in microbatch_s; memory.activation_offload)
    offload_s: np.ndarray | None = field(default=None, repr=False)
    # (N,) the cp_comm code each row was timed with (specs.grid.CP_COMMS; the rows the search left
    # open, specs.grid.CP_OPEN, take the faster: planner.perf.comm.choose_cp_comm)
    cp_comm: np.ndarray | None = field(default=None, repr=False)

    def inventory_of(self, i: int) -> list[dict]:
        """The communication inventory of candidate ``i``: one row per collective kind."""
        rows = []
        for item, ops, nbytes, busy, exposed in self.inventory:
            n_ops = float(ops[i])
            if n_ops <= 0:
                continue
            size, per, doms = (int(np.ravel(x)[i] if np.ndim(x) else x) for x in self.groups[item.dim])
            tier = "scale-up" if doms <= 1 else ("scale-up+scale-out" if per > 1 else "scale-out")
            rows.append({"name": item.name, "collective": item.collective, "dim": item.dim, "group_size": size,
                         "tier": tier, "bytes": float(nbytes[i]) / n_ops, "count": n_ops,
                         "time_s": float(busy[i]) / n_ops, "total_s": float(busy[i]),
                         "exposed_s": float(exposed[i]), "hidden_by": item.hidden_by})
        return rows


def placement(grid: dict, cluster: Cluster) -> Groups:
    """The placement of every group of ``grid``'s candidates on ``cluster`` (what
    :func:`evaluate` computes first; independent of the efficiency constants)."""
    return place_groups_in({k: np.asarray(v) for k, v in grid.items()}, scaleup_domain(cluster))


@dataclass(frozen=True)
class SlowestRank:
    """Each candidate's slowest pipeline rank: its layer count per layer class, and whether it is
    the first (embedding) or the last (head and loss) rank."""

    classes: tuple[int, ...]  # layer -> class index (compute.layer_class_index)
    counts: np.ndarray  # (K, N) layers of each class on the slowest rank
    first: np.ndarray  # (N,) the share of the embedding the slowest rank runs per micro-batch (1: the first rank)
    last: np.ndarray  # (N,) its share of the head and loss (1: the last rank)

    def sum(self, x):
        """(K, N) per-layer values -> (N,) summed over the slowest rank's layers."""
        return np.sum(self.counts * x, axis=0)

    def forward(self, costs):  # a third of the embedding's and head's time is the forward
        return self.sum(costs.fwd) + self.first * costs.first_extra / 3 + self.last * costs.last_extra / 3

    def backward(self, costs):
        return self.sum(costs.bwd) + self.first * costs.first_extra * 2 / 3 + self.last * costs.last_extra * 2 / 3

    def dense_params(self, costs):
        return self.sum(costs.dense_params) + self.first * costs.first_params + self.last * costs.last_params


def mtp_class(spec: ModelSpec) -> tuple[int, int]:
    """(layer class, count) of the MTP modules' decoder layers: the class of the first layer of
    ``spec.mtp_kind`` (ModelSpec: the last layer's kind by default); (0, 0) without MTP."""
    if not spec.mtp_layers:
        return 0, 0
    classes = layer_classes(spec)
    index = next((i for i, (k, *_) in enumerate(classes) if k == spec.mtp_kind), len(classes) - 1)
    return index, spec.mtp_layers


def replayed_classes(cls: tuple[int, ...], n_classes: int, split: tuple[int, ...], n: int) -> tuple[int, ...]:
    """Layer -> class when full recompute replays only the first ``n`` layers of each model chunk
    (Megatron's --recompute-method block --recompute-num-layers n; memory._features counts the
    same layers): a replayed layer keeps its class k, the others are class ``n_classes + k``, the
    same layer priced without recompute (:func:`partial_recompute`). ``n`` 0: every layer."""
    out, start = [], 0
    for count in split:
        out += [c if n <= 0 or j < n else n_classes + c for j, c in enumerate(cls[start:start + count])]
        start += count
    return tuple(out)


def slowest_rank(spec: ModelSpec, g: dict, costs, layer_exposed, layer_split: tuple[int, ...] | None,
                 n_classes: int | None = None) -> SlowestRank:
    """The pipeline rank with the longest micro-batch (its layers' forward, backward and exposed
    per-layer communication, plus the embedding or head), per candidate; candidates sharing
    (pp, vpp) share one stage-count matrix. ``costs`` may hold each class twice (``n_classes``
    doubled by :func:`partial_recompute`): the grid's ``recompute_layers`` then sends the layers
    past the first N of each chunk to the second, unreplayed copy."""
    cls = tuple(int(x) for x in layer_class_index(spec))
    K = len(layer_classes(spec))
    K2 = n_classes or K
    n = len(g["tp"])
    per_layer = costs.fwd + costs.bwd + layer_exposed  # (K2, N)
    counts_of = np.zeros((K2, n))  # layer counts of each candidate's slowest rank
    first_of, last_of = np.zeros(n), np.zeros(n)
    place = placement_code(g["schedule"]) if "schedule" in g else np.zeros(n, dtype=np.int64)
    nfull = np.zeros(n, dtype=np.int64) if K2 == K else partial_layers(g)
    _, group = pipeline_groups(g["pp"], g["vpp"], nfull, place)
    order = np.argsort(group, kind="stable")
    bounds = np.flatnonzero(np.diff(group[order])) + 1
    mtp = mtp_class(spec)
    for idx in np.split(order, bounds):
        pp, vpp, nf = int(g["pp"][idx[0]]), int(g["vpp"][idx[0]]), int(nfull[idx[0]])
        row_cls = cls
        if nf:
            row_cls = replayed_classes(cls, K, layer_split or model_split(len(cls), pp * vpp, mtp[1]), nf)
        C, first, last = stage_work(row_cls, K2, pp, vpp, layer_split, PLACEMENTS[int(place[idx[0]])], mtp)
        t = C @ per_layer[:, idx]  # (pp, n_idx)
        t += first[:, None] * costs.first_extra[idx] + last[:, None] * costs.last_extra[idx]
        slow = np.argmax(t, axis=0)
        counts_of[:, idx] = C[slow].T
        first_of[idx] = first[slow]
        last_of[idx] = last[slow]
    return SlowestRank(cls, counts_of, first_of, last_of)


def partial_recompute(g: dict, costs, litems, evaluate_costs):
    """Costs and per-layer collectives with every layer class twice: as the grid prices it (under
    full recompute: replayed), then the same layer without recompute, for the layers past the first
    ``recompute_layers`` of a chunk (:func:`replayed_classes`). ``evaluate_costs(grid, rows)`` gives
    (costs, layer items) of the sub-grid of ``rows``: only the full(N) rows are priced again (the
    others never read the second copy, which holds their first). Returns (costs, litems, classes);
    unchanged without such rows."""
    K, n = costs.fwd.shape
    rows = np.flatnonzero(partial_layers(g))
    if not len(rows):
        return costs, litems, K
    sub = {k: (v[rows] if np.ndim(v) == 1 and len(v) == n else v) for k, v in g.items()}
    costs0, litems0 = evaluate_costs({**sub, UNREPLAYED: np.ones(len(rows), dtype=bool)}, rows)

    def doubled(a, b):
        """(2K, N): ``a`` over every row, then ``a`` with the full(N) rows' columns from ``b``."""
        a = np.broadcast_to(a, (K, n))
        second = np.array(a, dtype=np.result_type(a, b))
        second[:, rows] = np.broadcast_to(b, (K, len(rows)))
        return np.concatenate([a, second])

    stack = {f.name: doubled(getattr(costs, f.name), getattr(costs0, f.name))
             for f in fields(costs) if np.ndim(getattr(costs, f.name)) == 2}
    items = [replace(a, **{k: doubled(getattr(a, k), getattr(b, k)) for k in ("nbytes", "ops", "time", "exposed")})
             for a, b in zip(litems, litems0, strict=True)]
    return replace(costs, **stack), items, 2 * K


def _first_layer_gather(litems, first_class: int, n: int):
    """(bytes, time) of the first layer's ZeRO-3 parameter gather, which nothing hides (zeros without ZeRO-3)."""
    z3 = next((i for i in litems if i.name == "zero-3 param gather (dp_cp)"), None)
    return (z3.nbytes[first_class], z3.time[first_class]) if z3 is not None else (np.zeros(n), np.zeros(n))


def _inventory(litems, sitems, slow: SlowestRank, m) -> list[tuple]:
    """(item, ops, bytes, time, exposed) per step of every collective: the per-layer ones over the
    slowest rank's layers and ``m`` micro-batches, then the per-step ones."""
    on_slow = slow.sum
    return ([(i, on_slow(i.ops) * m, on_slow(i.ops * i.nbytes) * m, on_slow(i.ops * i.time) * m,
              on_slow(i.exposed) * m) for i in litems]
            + [(i, 1.0 * i.ops, i.ops * i.nbytes, i.ops * i.time, i.exposed) for i in sitems])


def activation_offload_s(spec: ModelSpec, g: dict, costs, slow: SlowestRank, options: PerfOptions,
                         host_link_bw: float) -> np.ndarray:
    """(N,) exposed seconds per micro-batch of the slowest rank's activation-offload copies over a
    ``host_link_bw`` host link (:func:`dayzero.planner.memory.activation_offload.offload_exposed_mb`; zeros
    when off; the grid's ``activation_offload_layers`` column, where it has one, over the option). The saved
    bytes are the memory model's, under the attention kernel the step runs (MemoryOptions' other
    defaults); a class :func:`partial_recompute` doubled is priced as saved without recompute."""
    from dayzero.planner.memory.activation_offload import layer_saved_bytes, offload_exposed_mb, offload_layers_of

    n = offload_layers_of(g, options.activation_offload_layers)
    if not np.any(n):
        return np.zeros(len(g["tp"]))
    from dayzero.planner.memory.memory_options import KERNEL_MEMORY, MemoryOptions
    from dayzero.specs.grid import DUALPIPE

    kinds = [k for k, *_ in layer_classes(spec)]
    K2 = costs.fwd.shape[0]
    reps = K2 // len(kinds)
    mem = MemoryOptions(attention=KERNEL_MEMORY[options.attention_kernel])
    saved = layer_saved_bytes(spec, kinds * reps, mem, g, [True] * len(kinds) + [False] * (K2 - len(kinds)))
    chunks = np.where(np.asarray(g["schedule"]) == DUALPIPE, 2, g["vpp"])
    return offload_exposed_mb(n, slow.counts, saved, costs.fwd, costs.bwd, chunks, host_link_bw)


def tied_embedding_params(spec: ModelSpec, grid: dict) -> np.ndarray:
    """Word-embedding parameters per device that the first and last pipeline stages both hold and
    must sum the gradients of: a tied embedding (vocab-parallel over tp) when pp > 1, else 0."""
    pp = np.asarray(grid["pp"])
    tied = spec.tie_embeddings * (pp > 1)
    return tied * spec.vocab * spec.hidden / np.asarray(grid["tp"], dtype=float)


def _optimizer_s(g: dict, groups: Groups, dense_params, expert_params, consts: PerfConstants, r, options: PerfOptions,
                 cluster: Cluster):
    """Seconds of the optimizer step on the slowest rank: its ZeRO-sharded share of the parameters
    at ``optimizer_bytes_per_param`` over HBM, or, with optimizer offload (the options' or the
    layout's), the host Adam over its DRAM share and the copies over its link (specs/host.py)."""
    zero = g["zero"]
    edp = groups["edp"][0]
    upd = zero_sharded(dense_params, "optimizer", zero, groups["dp_cp"][0]) + zero_sharded(expert_params, "optimizer",
                                                                                           zero, edp)
    optimizer_s = upd * consts.optimizer_bytes_per_param / r.hbm_bw
    offload = options.optimizer_offload | flag(g, "optimizer_offload")
    if offload.any():
        host = cluster.host
        optimizer_s = np.where(offload, offloaded_optimizer_s(upd, options.comm.grad_reduce_bytes, host.link_bw,
                                                              host.memory_bw), optimizer_s)
    return optimizer_s


def evaluate(spec: ModelSpec, grid: dict, cluster: Cluster, options: PerfOptions | None = None,
             layer_split: tuple[int, ...] | None = None, placed: Groups | None = None,
             inventory: bool = True) -> Evaluation:
    """Vectorised step-time model over the candidates of ``grid`` (:mod:`dayzero.specs.grid`;
    valid layouts only, see :mod:`dayzero.specs.layout_rules`); see the module docstring.

    ``placed``: :func:`placement` of this grid on this cluster, kept by a caller that evaluates the
    same layouts again with other constants (it does not depend on them, and it memoises the
    collective times); ``inventory=False`` leaves the communication inventory empty (a fit needs
    only the times)."""
    options = options or PerfOptions()
    consts = options.constants or constants_for(cluster)
    r = replace(rates(cluster, consts), fp8_scaling=options.fp8_scaling)
    g = {k: np.asarray(v) for k, v in grid.items()}
    n = len(g["tp"])
    experts = spec.moe.experts if spec.moe is not None else 0
    groups = placed if placed is not None else place_groups(g, r)

    def costs_of(grid, placed_groups=groups, c=None):
        if c is None:
            c = compute_costs(spec, grid, r, consts, options.comm.imbalance(grid["ep"], experts),
                              options.attention_kernel, options.kernel_level)
        return c, layer_comm(spec, grid, r, c, placed_groups, options.comm)

    # the rows whose cp exchange the search left open take the faster (comm.choose_cp_comm); the
    # compute does not depend on it
    c0 = compute_costs(spec, g, r, consts, options.comm.imbalance(g["ep"], experts), options.attention_kernel,
                       options.kernel_level)
    g = choose_cp_comm(spec, g, r, c0, groups, options.comm)
    costs, litems, n_classes = partial_recompute(g, *costs_of(g, c=c0),
                                                 lambda sub, rows: costs_of(sub, groups.rows(rows)))
    layer_exposed = sum(i.exposed for i in litems) if litems else np.zeros_like(costs.fwd)

    slow = slowest_rank(spec, g, costs, layer_exposed, layer_split, n_classes)
    on_slow = slow.sum
    fwd_mb, bwd_mb = slow.forward(costs), slow.backward(costs)
    comm_mb = on_slow(layer_exposed)
    offload_mb = activation_offload_s(spec, g, costs, slow, options, cluster.host.link_bw)  # the cluster's host link
    t_mb = fwd_mb + bwd_mb + comm_mb + offload_mb
    m = g["gbs"] // (g["mbs"] * g["dp"])
    dense_params, expert_params = slow.dense_params(costs), on_slow(costs.expert_params)

    seq = single_seq(g)
    act = g["mbs"] * seq / g["cp"] * spec.hidden * BF16 / np.where((g["sequence_parallel"] > 0) & (g["tp"] > 1),
                                                                   g["tp"], 1)
    first_ag = _first_layer_gather(litems, slow.classes[0], n)
    sitems = step_comm(g, r, groups, options.comm, dense_params=dense_params, expert_params=expert_params,
                       fwd_mb=fwd_mb, bwd_mb=bwd_mb, first_layer_ag=first_ag, microbatches=m, act_bytes=act,
                       tied_params=tied_embedding_params(spec, g),
                       edge_params=slow.first * costs.first_params + slow.last * costs.last_params)

    optimizer_s = _optimizer_s(g, groups, dense_params, expert_params, consts, r, options, cluster)
    # the exposed per-layer communication and offload copies, half with each of F and B
    comm_share = (comm_mb + offload_mb) / 2
    bubble_s = bubble_microbatches(effective_schedule(g["schedule"], g["vpp"]), g["pp"], g["vpp"], fwd_mb + comm_share,
                                   bwd_mb + comm_share, slow.sum(costs.gemm_fwd))
    step_exposed = sum(i.exposed for i in sitems)
    step_s = m * t_mb + bubble_s + step_exposed + optimizer_s
    compute_s = m * (fwd_mb + bwd_mb)
    comm_exposed_s = m * comm_mb + step_exposed

    devices = g["tp"] * g["pp"] * g["dp"] * g["cp"]
    straggler_s = step_s * (straggler_factor(devices, consts.step_jitter) - 1.0)
    step_s = step_s + straggler_s
    tokens_per_s = g["gbs"] * seq / step_s
    per_dev = tokens_per_s / devices
    # model FLOPs as Megatron-LM counts them: the MTP modules' included (counting.mtp_flops_per_token)
    model_flops = flops_per_token(spec, seq, causal=True).train + mtp_flops_per_token(spec, seq, causal=True)
    tflops = per_dev * model_flops
    peak = np.array([r.peak[p] for p in PRECISIONS])[g["precision"]]
    inventory = _inventory(litems, sitems, slow, m) if inventory else []
    return Evaluation(step_s=step_s, compute_s=compute_s, comm_exposed_s=comm_exposed_s, bubble_s=bubble_s,
                      optimizer_s=optimizer_s, straggler_s=straggler_s, tokens_per_s=tokens_per_s,
                      tokens_per_s_per_device=per_dev,
                      model_tflops_per_device=tflops / 1e12, mfu=tflops / peak, comm_ratio=comm_exposed_s / step_s,
                      microbatches=m, microbatch_s=t_mb, groups=groups.g, inventory=inventory,
                      offload_s=m * offload_mb,
                      ep_overlap=ep_overlapped(g, options.comm) * (spec.moe is not None and spec.is_moe),
                      cp_comm=cp_comm_of(g))
