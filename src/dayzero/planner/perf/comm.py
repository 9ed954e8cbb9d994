"""Per-step communication inventory: every collective of a training step and what hides it.

Per layer and micro-batch (time added to the stage that runs the layer):

* **TP** (tp > 1): Megatron's column/row-parallel pairs. With sequence parallelism an
  all-gather before and a reduce-scatter after each of attention and MLP, else all-reduces;
  2 per block forward, 2 backward, 2 more forward under full recompute (and for the FFN block under
  selective recompute of its module: mlp, moe or shared_experts). MoE layers with etp = 1
  only pay the attention pair, plus the shared experts' own pair when there are shared experts.
  Exposed, unless TP overlap (userbuffers-style) is on: then only what exceeds the layer's GEMM
  time. Sequence parallelism also re-gathers each column-parallel linear's input in the backward
  for its weight gradient (Korthikanti et al. 2022 sec. 4.2.2), exposed beyond those linears'
  dgrad GEMMs.
* **CP** (cp > 1), by the layout's ``cp_comm``: ring attention (p2p) passes K and V blocks around
  the cp group (cp - 1 sends forward, twice that backward with dK/dV), overlapped with the
  attention core, exposed beyond it; the all-to-all (a2a, DeepSpeed-Ulysses) exchanges Q, K, V
  before the core attention and its output after it (4 all-to-alls forward, 4 backward, 4 more
  where the core attention is recomputed), exposed: the core attention waits for them.
* **EP** (ep > 1): token dispatch and combine (each 1 forward, 1 backward, 1 more under full
  recompute or selective recompute of the moe module) over the ep group, with the routing imbalance
  on the busiest device. The default dispatcher deduplicates (DeepEP/HybridEP: one row per rank hit
  over the scale-up fabric, one per remote domain hit over the scale-out network,
  :mod:`dayzero.planner.perf.moe_dispatch`); the plain all-to-all sends all top_k rows. With
  ``fp8_dispatch`` an FP8 recipe's dispatch direction (the forward dispatch and the backward of the
  combine) travels in FP8 with its scales, the combine direction in BF16 (DeepSeek-V3 sec. 3.3).
  Exposed unless overlapped with another micro-batch's compute (DualPipe-style), then exposed beyond
  the layer's compute; a hybrid stack's MoE layer (no token mixer in the layer) is never overlapped
  (Megatron-LM issue #5854). Before each dispatch the per-expert token counts are all-gathered over
  the ep group (the split sizes) and the host waits for them (``PerfConstants.moe_sync_s``).
* **ZeRO-3**: parameter all-gather before forward and backward, gradient reduce-scatter after
  backward, over dp x cp (experts: edp); prefetched one layer ahead, so exposed beyond the
  layer's own compute (plus the first layer's gather, once per micro-batch and model chunk).

Per step:

* **DP gradients**: all-reduce (ZeRO-0) or reduce-scatter (ZeRO-1/2; ZeRO-2 every micro-batch)
  in buckets of max(40M, 1M x dp) elements (Megatron-Core's default) during the last micro-batch's
  backward; exposed: the last bucket or what exceeds that backward. ZeRO-1/2 then all-gather
  the updated parameters during the next step's first forward.
* **PP**: activations forward and gradients backward between neighbouring stages on their own
  stream; exposed only on the pipeline ramp, (pp x vpp - 1) hops each way.
* **Gradient norm**: one FP32 scalar all-reduced before clipping (tp x pp; ZeRO >= 1: the world).
* **Tied embedding**: its gradient all-reduced between the first and last stage (pp > 1). Both
  exposed, between the gradient reduction and the optimizer step.

Then the window rules of :mod:`dayzero.planner.perf.overlap` hold in every window: collectives of
one layer's window (and the per-step gradient reduces, and gathers) that cross one tier share its
bandwidth (``CommOptions.shared_links``, on), and, with ``CommOptions.overlap_sm``, every
overlapped collective takes its library's SM share from the compute it hides under.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from dayzero.planner.perf.calibration import Rates
from dayzero.planner.perf.collectives import dedup_all_to_all, group_collective
from dayzero.planner.perf.compute import BF16, ComputeCosts, layer_classes, single_seq
from dayzero.planner.perf.moe_dispatch import FP8_DISPATCH_BYTES, check_dispatcher, dedup_rows, device_imbalance
from dayzero.planner.perf.moe_imbalance import MeasuredImbalance, constant_imbalance, derived_imbalance
from dayzero.planner.perf.overlap import shared_links, sm_floor, sm_share, tier_of
from dayzero.planner.perf.topology import group_strides, span
from dayzero.planner.schedule import gradient_windows, warmup_chunks
from dayzero.specs.grid import (
    A2A,
    CP_OPEN,
    DUALPIPE,
    DUALPIPEV,
    FULL,
    MODULE_BIT,
    SELECTIVE,
    cp_comm_of,
    flag,
    recompute_modules,
    replays_layer,
)
from dayzero.specs.grid import BF16 as BF16_CODE
from dayzero.specs.model import ModelSpec, split_layer_type

FP8_PARAM_BYTES = 1  # one FP8 (E4M3) weight element, as --fp8-param-gather all-gathers it
GRAD_NORM_BYTES = 4  # the squared norm, one FP32 scalar
COUNT_BYTES = 8  # one int64 token count per expert (torch.bincount/histc results are int64 in the dispatchers)


@dataclass(frozen=True)
class CommOptions:
    # TP collectives overlapped with the layer's GEMMs (Megatron-Core --tp-comm-overlap): None (the
    # default) wherever Megatron-Core runs it (tp_overlapped: tp > 1 with sequence parallelism),
    # True pinned on for every tp > 1 row, False pinned off
    tp_overlap: bool | None = None
    # EP all-to-all overlapped with another micro-batch's compute: None (the default) wherever the
    # layout's schedule runs it (ep_overlapped: DualPipe/DualPipeV always, Megatron-Core's
    # --overlap-moe-expert-parallel-comm where its conditions hold), True pinned on everywhere,
    # False pinned off (DualPipe/DualPipeV overlap by construction all the same)
    ep_overlap: bool | None = None
    moe_imbalance: float = 1.0  # busiest device's routed tokens / average (NVIDIA benchmarks force-balance)
    moe_measured: MeasuredImbalance | None = None  # measured per EP size (--expert-loads); replaces the constant
    # bytes per gradient element on the wire: FP32, as Megatron-LM reduces BF16 runs unless
    # --grad-reduce-in-bf16 (megatron/training/arguments.py: grad_reduce_in_fp32 defaults on with
    # --bf16), as Llama 3 reduce-scattered (Llama Team 2024, sec. 3.3.2: "reduce-scatter gradients in
    # FP32") and as dayzero's runtime reduces (FSDP2 reduce_dtype=float32); 2 for BF16 reduction
    grad_reduce_bytes: int = 4
    # per-expert load CV (std / mean of the tokens each expert gets); > 0 derives the busiest
    # device's imbalance per EP size, 1 + z_ep c / sqrt(E/ep) (planner.perf.moe_dispatch), in place of
    # the constant; 0: the constant (force-balanced benchmarks route evenly)
    moe_expert_cv: float = 0.0
    # "dedup": DeepEP/HybridEP-style (Megatron-Core --moe-token-dispatcher-type flex, DeepSeek's
    # own), one row per rank / remote domain hit; "all_to_all": Megatron's alltoall dispatcher,
    # every top_k copy travels
    ep_dispatcher: str = "dedup"
    # the dispatch direction in FP8 (+ 1 x 128 FP32 scales) under FP8/FP4 recipes, the combine in
    # BF16 (DeepSeek-V3 sec. 3.3); off: Megatron-Core's dispatchers send BF16 activations
    fp8_dispatch: bool = False
    # the overlapped compute launched on the SMs the communication kernels leave for the whole
    # overlapped window, as DeepSeek-V3 ran DualPipe (sec. 3.5.1: "20 out of the 132 SMs ... for
    # this purpose, which will limit the computational throughput"); off: the kernels share the
    # SMs only while the communication is in flight (overlapped_exposed)
    sm_reserved: bool = False
    # FP8 parameter storage (Megatron-LM --fp8-param-gather: "perform the param all-gather in fp8";
    # MemoryOptions.fp8_params): under an FP8/FP4 recipe the ZeRO parameter all-gathers send the
    # decoder layers' weights in FP8, 1 B instead of 2; the embedding and head stay BF16
    fp8_param_gather: bool = False
    # the window rules of planner.perf.overlap. shared_links: collectives in one window that cross
    # one tier share its bandwidth (off: each priced against its own window alone); overlap_sm:
    # every overlapped collective's kernels take their library's SM share from the compute it hides
    # under (off: only the EP all-to-all's, overlapped_exposed)
    shared_links: bool = True
    overlap_sm: bool = False

    def __post_init__(self):
        check_dispatcher(self.ep_dispatcher)

    def param_gather_bytes(self, precision, stored=False) -> np.ndarray:
        """Bytes per decoder-layer parameter in the ZeRO all-gathers, per candidate
        (``precision``: grid precision codes): FP8_PARAM_BYTES under --fp8-param-gather (these
        options', or the layout's ``stored``: the grid's fp8_param_gather column) and an FP8 recipe,
        else BF16."""
        fp8 = (self.fp8_param_gather | np.asarray(stored, dtype=bool)) & (np.asarray(precision) != BF16_CODE)
        return np.where(fp8, FP8_PARAM_BYTES, BF16)

    def imbalance(self, ep, experts: int = 0):
        """The routing imbalance per candidate (``ep``: EP sizes, (N,)): measured, else derived
        from ``moe_expert_cv`` for ``experts`` routed experts, else the constant."""
        if self.moe_measured is not None:
            return self.moe_measured.values(ep)
        if self.moe_expert_cv > 0 and experts:
            return device_imbalance(self.moe_expert_cv, experts, ep)
        return self.moe_imbalance

    def describe_imbalance(self, ep: int, experts: int = 0) -> dict:
        """Which imbalance a prediction used and where it came from."""
        if self.moe_measured is not None:
            return self.moe_measured.describe(ep)
        if self.moe_expert_cv > 0 and experts:
            return derived_imbalance(float(device_imbalance(self.moe_expert_cv, experts, ep)), self.moe_expert_cv,
                                     experts, ep)
        return constant_imbalance(self.moe_imbalance)


@dataclass(frozen=True)
class Groups:
    """Placement of every group, as arrays: size, per_domain, domains.

    ``memo`` holds the collective times :func:`coll` computed on this placement, keyed by what they
    depend on (kind, group, bytes, imbalance, links): a caller that evaluates the same layouts many
    times (a fit of the efficiency constants) keeps one placement and pays each collective once."""

    g: dict  # name -> (size, per_domain, domains)
    memo: dict = field(default_factory=dict, compare=False, repr=False)

    def __getitem__(self, name):
        return self.g[name]

    def rows(self, index) -> "Groups":
        """The placement of the candidates ``index`` only (a fresh memo: its arrays are shorter)."""
        n = max(len(np.ravel(a)) for v in self.g.values() for a in v)
        return Groups({k: tuple(np.broadcast_to(np.asarray(a), (n,))[index] if np.ndim(a) else a for a in v)
                       for k, v in self.g.items()})


def place_groups(grid: dict, rates: Rates) -> Groups:
    """Every group of every candidate on the cluster's scale-up domains (each row's rank order)."""
    return place_groups_in(grid, rates.domain)


def place_groups_in(grid: dict, domain: int) -> Groups:
    """Every group of every candidate on scale-up domains of ``domain`` ranks (each row's rank order)."""
    out = {}
    for name, (size, stride) in group_strides(grid).items():
        per, doms = span(size, stride, domain)
        out[name] = (np.asarray(size), per, doms)
    out["norm"] = grad_norm_group(grid, domain)
    return Groups(out)


def grad_norm_group(grid: dict, domain: int):
    """(size, per_domain, domains) of the group that sums the squared gradient norm: each rank
    holds the gradients of its tp x pp (model-parallel) shard; with a sharded optimizer (ZeRO >= 1,
    Megatron's distributed optimizer) only its dp x cp slice of those, so the sum runs over the
    whole world (Megatron-Core clip_grads.get_grad_norm_fp32 over the grad-stats group). Placed as
    consecutive ranks: the message is one scalar, so the placement only sets the domains it crosses."""
    zero = np.asarray(grid["zero"])
    model = np.asarray(grid["tp"]) * np.asarray(grid["pp"])
    size = np.where(zero >= 1, model * np.asarray(grid["dp"]) * np.asarray(grid["cp"]), model)
    per = np.minimum(size, domain)
    return size, per, -(-size // per)


def coll(kind, nbytes, groups: Groups, dim: str, rates: Rates, imbalance=1.0):
    """Time of one collective of ``kind`` over the ``dim`` groups (memoised on ``groups``; the
    result is read-only since it may be shared)."""
    nb = np.asarray(nbytes, dtype=float)
    imb = np.asarray(imbalance, dtype=float)
    key = (kind, dim, nb.shape, nb.tobytes(), imb.shape, imb.tobytes(), rates.intra, rates.inter)
    hit = groups.memo.get(key)
    if hit is None:
        size, per, doms = groups[dim]
        hit = np.asarray(group_collective(kind, nb, size, per, doms, rates.intra, rates.inter, imbalance))
        hit.flags.writeable = False
        groups.memo[key] = hit
    return hit


def coll_dedup(up_bytes, out_bytes, groups: Groups, rates: Rates, imbalance=1.0):
    """Time of one deduplicating EP dispatch or combine (:func:`collectives.dedup_all_to_all`),
    memoised on ``groups`` like :func:`coll`."""
    up, out = np.asarray(up_bytes, dtype=float), np.asarray(out_bytes, dtype=float)
    imb = np.asarray(imbalance, dtype=float)
    key = ("dedup", up.shape, up.tobytes(), out.tobytes(), imb.shape, imb.tobytes(), rates.intra, rates.inter)
    hit = groups.memo.get(key)
    if hit is None:
        size, per, doms = groups["ep"]
        hit = np.asarray(dedup_all_to_all(up, out, size, per, doms, rates.intra, rates.inter, imbalance))
        hit.flags.writeable = False
        groups.memo[key] = hit
    return hit


@dataclass(frozen=True)
class LayerComm:
    """One collective issued inside every layer of a class; arrays are (K, N)."""

    name: str
    collective: str
    dim: str
    nbytes: np.ndarray  # per op
    ops: np.ndarray  # per layer per micro-batch
    time: np.ndarray  # per op
    exposed: np.ndarray  # per layer per micro-batch
    hidden_by: str


@dataclass(frozen=True)
class _Layer:
    """What every section of :func:`layer_comm` reads: the candidates' columns and sizes, per layer
    class (K) and candidate (N)."""

    spec: ModelSpec
    g: dict
    rates: Rates
    costs: ComputeCosts
    groups: Groups
    opt: CommOptions
    tp: np.ndarray
    T: np.ndarray  # tokens of one micro-batch on one cp rank
    H: int
    sp: np.ndarray
    full: np.ndarray
    kinds: np.ndarray  # (K, 1): MoE layer classes
    shape: tuple
    mixers: np.ndarray | float = 1.0  # (K, 1): 1 where the class has a token mixer (attention or recurrent)
    dense_ffn: np.ndarray | float = 1.0  # (K, 1): 1 where it has a dense MLP (0: MoE or no FFN)
    modules: np.ndarray | int = 0  # (N,) the modules selective recompute replays (specs.grid.MODULE_BIT)

    def replays(self, module: str) -> np.ndarray:
        """Whether selective recompute replays ``module`` (its collectives run again in backward)."""
        return (np.asarray(self.modules) & MODULE_BIT[module]) > 0

    def kn(self, x) -> np.ndarray:  # per-candidate (or per-class) values as a (K, N) array
        return np.broadcast_to(np.asarray(x, dtype=float), self.shape)


def layer_comm(spec: ModelSpec, grid: dict, rates: Rates, costs: ComputeCosts, groups: Groups,
               opt: CommOptions) -> list[LayerComm]:
    """Every collective of one layer and micro-batch, by section: TP, CP, EP, ZeRO-3 (module docstring)."""
    L = _layer(spec, grid, rates, costs, groups, opt)
    items = _tensor_parallel(L)
    items += _context_parallel(L)
    if spec.moe is not None:
        items += _expert_parallel(L)
    items += _zero3(L)
    return _layer_window(items, L) if opt.shared_links or opt.overlap_sm else items


# the library whose kernels run each overlapped per-layer collective (planner.perf.overlap.COMM_SMS);
# the EP all-to-all's share is already in its own price (overlapped_exposed)
_LIBRARY = {"tp": "userbuffers", "cp": "nccl", "dp_cp": "nccl", "edp": "nccl"}


def _layer_window(items: list[LayerComm], L: _Layer) -> list[LayerComm]:
    """The window rules of :mod:`dayzero.planner.perf.overlap` over one layer and micro-batch: each
    overlapped collective's SMs slow the compute it hides under (rule 2), then the collectives
    crossing one tier share it within the layer's forward and backward compute (rule 1)."""
    busy = [i.ops * i.time for i in items]
    exposed = [i.exposed for i in items]
    if L.opt.overlap_sm:
        for k, (item, b) in enumerate(zip(items, busy)):
            lib = _LIBRARY.get(item.dim)
            share = sm_share(lib, L.rates.comm_sm_fraction) if lib else 0.0
            exposed[k] = np.where((b - item.exposed) > 0, sm_floor(b, item.exposed, share), item.exposed)
    if L.opt.shared_links:
        tiers = [tier_of(L.groups[i.dim][2]) for i in items]
        exposed = shared_links(busy, exposed, tiers, L.costs.fwd + L.costs.bwd)
    return [replace(i, exposed=e) for i, e in zip(items, exposed)]


def _layer(spec: ModelSpec, grid: dict, rates: Rates, costs: ComputeCosts, groups: Groups,
           opt: CommOptions) -> _Layer:
    """What the sections of :func:`layer_comm` read, for the candidates ``grid``."""
    g = grid
    tp, cp = np.asarray(g["tp"], float), np.asarray(g["cp"], float)
    types = [split_layer_type(t) for t, *_ in layer_classes(spec)]  # (mixer, ffn) per class
    return _Layer(spec=spec, g=g, rates=rates, costs=costs, groups=groups, opt=opt, tp=tp,
                   T=g["mbs"] * single_seq(g) / cp, H=spec.hidden, sp=(g["sequence_parallel"] > 0) & (g["tp"] > 1),
                   full=replays_layer(g), kinds=np.array([f == "moe" for _, f in types])[:, None],
                   shape=costs.fwd.shape, mixers=np.array([m != "none" for m, _ in types], float)[:, None],
                   dense_ffn=np.array([k == "dense" for _, k in types], float)[:, None],
                   modules=np.where(np.asarray(g["recompute"]) == SELECTIVE, recompute_modules(g), 0))


def _tensor_parallel(L: _Layer) -> list[LayerComm]:
    """Megatron's column/row-parallel pairs (and the shared experts' pair), and the sequence-parallel
    re-gather of the layer input for the weight gradient."""
    g, costs, groups, rates, opt, spec, kn = L.g, L.costs, L.groups, L.rates, L.opt, L.spec, L.kn
    sp, full, kinds = L.sp, L.full, L.kinds
    items: list[LayerComm] = []
    act = L.T * L.H * BF16  # the full (tp-gathered) activation of one micro-batch
    etp_gt1 = np.asarray(g["etp"]) > 1
    # collectives per layer forward: a pair per TP block (attention, MLP); MoE layers with etp = 1
    # only the attention pair, plus the shared experts' own pair (Megatron-Core's SharedExpertMLP is a
    # tp-parallel MLP on the layer input, gathered and scattered apart from the dispatcher's tokens)
    # A recurrent mixer is one pair as attention (Megatron-Core's MambaMixer: in_proj column-, out_proj
    # row-parallel); a hybrid layer without a mixer or without an FFN lacks that block's pair. Mixers
    # side by side (attention&recurrent) are one pair too: both read the one gathered layer input, and
    # their row-parallel partial outputs are added before the one reduce (the sum of the reduced
    # outputs is the reduce of the summed partials; FalconH1DecoderLayer adds them anyway)
    shared_pair = 2 if spec.moe is not None and spec.moe.shared_experts else 0
    per_fwd = kn(2 * L.mixers + np.where(kinds, np.where(etp_gt1, 2, 0) + shared_pair, 2 * L.dense_ffn))
    # selective recompute of a whole FFN module (mlp; moe, or its shared_experts alone) replays its pair
    moe_again, shared_again = L.replays("moe"), L.replays("shared_experts") & ~L.replays("moe")
    again = np.where(kinds, (np.where(etp_gt1, 2, 0) + shared_pair) * moe_again + shared_pair * shared_again,
                     2 * L.dense_ffn * L.replays("mlp"))
    n_ops = per_fwd * (2 + full) + kn(again)
    over = kn(tp_overlapped(g, opt)) > 0  # the rows whose TP collectives overlap the GEMMs
    hidden = "GEMMs" if np.any(over) else ""
    for kind, name in (("all_gather", "tp all-gather"), ("reduce_scatter", "tp reduce-scatter")):
        t = coll(kind, act, groups, "tp", rates)
        ops = np.where(sp, n_ops / 2, 0.0) * (g["tp"] > 1)
        items.append(LayerComm(name, kind, "tp", kn(act), ops, kn(t), kn(0.0), hidden))
    t = coll("all_reduce", act, groups, "tp", rates)
    ops = np.where(sp, 0.0, n_ops / 2) * (g["tp"] > 1)
    items.append(LayerComm("tp all-reduce", "all_reduce", "tp", kn(act), ops, kn(t), kn(0.0), hidden))
    tp_total = sum(i.ops * i.time for i in items)
    # the forward's GEMMs, the backward's two passes of them, and the GEMMs the recompute replays
    # (each replayed module's collectives overlap its own replayed GEMMs)
    window = costs.gemm_fwd * 3 + costs.gemm_replay
    tp_exposed = np.where(over, np.maximum(0.0, tp_total - window), tp_total)
    share = np.where(tp_total > 0, tp_exposed / np.maximum(tp_total, 1e-30), 0.0)
    items = [LayerComm(i.name, i.collective, i.dim, i.nbytes, i.ops, i.time, i.ops * i.time * share, i.hidden_by)
             for i in items]
    # sequence parallelism keeps only the 1/tp shard of each column-parallel linear's input, so its
    # backward all-gathers it again for the weight gradient (Korthikanti et al. 2022, "Reducing
    # Activation Recomputation in Large Transformer Models", sec. 4.2.2; Megatron-Core's linear
    # backward issues it asynchronously and computes the input gradient meanwhile): one per
    # forward all-gather, exposed beyond the dgrad GEMMs of those linears (under TP overlap: beyond
    # what the other TP collectives leave of the GEMM window)
    t = coll("all_gather", act, groups, "tp", rates)
    ops = np.where(sp, per_fwd / 2, 0.0) * (g["tp"] > 1)
    busy = ops * t
    exp = np.where(over, np.maximum(0.0, tp_total + busy - window) - tp_exposed,
                   np.maximum(0.0, busy - costs.gemm_in_fwd))
    items.append(LayerComm("tp sp re-gather (wgrad)", "all_gather", "tp", kn(act), kn(ops), kn(t), kn(exp),
                           "dgrad GEMMs"))
    return items


def _context_parallel(L: _Layer) -> list[LayerComm]:
    """The cp exchange of each row's ``cp_comm``: the ring's K/V hops (p2p rows) and the Q/K/V/O
    all-to-alls (a2a rows); each item counts no ops on the other rows."""
    a2a = cp_comm_of(L.g) == A2A
    ring = _ring_attention(L)
    if not a2a.any():  # every row on the ring (the search's usual case): no all-to-all to price
        zero = L.kn(0.0)
        return [ring, LayerComm("cp all-to-all Q/K/V/O", "all_to_all", "cp", zero, zero, zero, zero, "")]
    alltoall = _ulysses(L)
    return [replace(ring, ops=ring.ops * ~a2a, exposed=ring.exposed * ~a2a),
            replace(alltoall, ops=alltoall.ops * a2a, exposed=alltoall.exposed * a2a)]


def _ring_attention(L: _Layer) -> LayerComm:
    """Ring attention: K and V of the local tokens travel cp - 1 hops."""
    g, costs, groups, rates, spec, kn, full = L.g, L.costs, L.groups, L.rates, L.spec, L.kn, L.full
    a = spec.attention
    kv_width = (a.heads * (a.head_dim + a.v_head_dim)) if a.kind == "mla" else a.kv_heads * (a.head_dim + a.v_head_dim)
    kv = L.T * kv_width / L.tp * BF16
    t = coll("send_recv", kv, groups, "cp", rates)
    hops = kn(np.asarray(g["cp"]) - 1)
    f_time, b_time = hops * t, 2 * hops * t
    exp = (np.maximum(0, f_time - costs.attn_fwd) * (1 + full) + np.maximum(0, b_time - 2.5 * costs.attn_fwd))
    return LayerComm("cp ring K/V", "send_recv", "cp", kn(kv), hops * (3 + full), kn(t), exp, "attention")


def ulysses_bytes(spec: ModelSpec, T, tp) -> dict[str, np.ndarray]:
    """The local tensors one rank all-to-alls around the core attention, in bytes: q, k, v before
    it and the output o after it, each of the rank's T tokens for its tp shard of the heads (a tp
    rank holds heads / tp query heads and kv_heads / tp key/value heads, one whole one when
    tp > kv_heads; MLA decompresses a key and a value per query head). The backward moves the
    same bytes the other way (dO before the core attention's backward, dQ/dK/dV after it)."""
    a = spec.attention
    kv_local = a.heads / tp if a.kind == "mla" else a.kv_heads / np.minimum(tp, a.kv_heads)
    return {"q": T * a.heads / tp * a.head_dim * BF16, "k": T * kv_local * a.head_dim * BF16,
            "v": T * kv_local * a.v_head_dim * BF16, "o": T * a.heads / tp * a.v_head_dim * BF16}


def _ulysses(L: _Layer) -> LayerComm:
    """DeepSpeed-Ulysses context parallelism (Jacobs et al. 2023, arXiv:2309.14509, sec. 3.1;
    Megatron-Core ``--cp-comm-type a2a``, Transformer Engine AttnFuncWithCPAndQKVOA2A): before the
    core attention q, k and v are each all-to-all'd over the cp group (sequence-sharded to
    head-sharded: every rank then holds the whole sequence for heads / cp of its heads), after it
    the output is all-to-all'd back; the backward mirrors them (dO, then dQ, dK, dV). Each moves
    (cp - 1) / cp of the local tensor (:func:`collectives.all_to_all`); 4 all-to-alls forward,
    4 backward and 4 more where the forward of the core attention is replayed (full recompute, or
    selective recompute of core_attn, whose checkpoint holds TE's attention and so its
    all-to-alls). The core attention waits for them (TE issues them on the cp stream around
    the attention kernel, not under it): exposed. The item's bytes and time per op are the mean
    of the four tensors' (their sum over ops is exact)."""
    g, groups, rates, kn = L.g, L.groups, L.rates, L.kn
    parts = ulysses_bytes(L.spec, L.T, L.tp)
    t = sum(coll("all_to_all", b, groups, "cp", rates) for b in parts.values()) / 4
    nbytes = sum(parts.values()) / 4
    replay = L.full | L.replays("core_attn")
    ops = kn(4 * (np.asarray(g["cp"]) > 1)) * (2 + replay) * L.mixers
    return LayerComm("cp all-to-all Q/K/V/O", "all_to_all", "cp", kn(nbytes), ops, kn(t), ops * kn(t), "")


def choose_cp_comm(spec: ModelSpec, grid: dict, rates: Rates, costs: ComputeCosts, groups: Groups,
                   opt: CommOptions) -> dict:
    """``grid`` with the :data:`~dayzero.specs.grid.CP_OPEN` rows' ``cp_comm`` set to the faster of
    p2p and a2a: the one whose exposed exchange, summed over the model's layers (each layer class
    times its layers), is the smaller (ties keep p2p). Nothing else in the step depends on it (the
    attention's FLOPs are the same either way), so this is the faster layout; the key is dropped."""
    if CP_OPEN not in grid:
        return grid
    open_ = np.asarray(grid[CP_OPEN], dtype=bool)
    out = {k: v for k, v in grid.items() if k != CP_OPEN}
    if not open_.any():
        return out
    from dayzero.planner.perf.compute import layer_class_index

    L = _layer(spec, out, rates, costs, groups, opt)
    ring, a2a = _ring_attention(L), _ulysses(L)
    per_class = np.bincount(layer_class_index(spec), minlength=ring.exposed.shape[0])[:, None]  # (K, 1) layers
    faster = (per_class * a2a.exposed).sum(0) < (per_class * ring.exposed).sum(0)
    out["cp_comm"] = np.where(open_ & faster, A2A, cp_comm_of(out)).astype(np.int64)
    return out


def _expert_parallel(L: _Layer) -> list[LayerComm]:
    """Token dispatch and combine (with the count exchange before them), and the etp gather."""
    g, costs, groups, rates, opt, spec, kn = L.g, L.costs, L.groups, L.rates, L.opt, L.spec, L.kn
    kinds, T, tp, H = L.kinds, L.T, L.tp, L.H
    full = L.full | L.replays("moe")  # recomputing the MoE module dispatches and combines again
    etp_gt1 = np.asarray(g["etp"]) > 1
    layer_fb = costs.fwd + costs.bwd
    items: list[LayerComm] = []
    moe = spec.moe
    imb = opt.imbalance(g["ep"], moe.experts)
    # routed token rows leaving one device, all top_k copies; LatentMoE dispatches latent-wide rows
    H = moe.latent_size or H
    tok = T / tp * moe.top_k * H * BF16
    prec = np.asarray(g["precision"])
    low = (prec != BF16_CODE) & np.asarray(rates.native)[prec]  # FP8/FP4 GEMMs the card runs natively
    width = {"dispatch": np.where(opt.fp8_dispatch & low, FP8_DISPATCH_BYTES, BF16), "combine": BF16}
    ops = kn(kinds * (np.asarray(g["ep"]) > 1) * (2 + full))  # per direction
    if opt.ep_dispatcher == "dedup":
        size, per, doms = groups["ep"]
        up, out = dedup_rows(moe.experts, moe.top_k, size, per, doms, moe.n_group, moe.topk_group)
    # before each dispatch the ranks exchange how many rows each sends every expert (the split
    # sizes): Megatron-Core's all-to-all dispatcher all-gathers the per-expert token counts over
    # its expert group and syncs them to the host (MoEAlltoAllTokenDispatcher.preprocess); DeepEP's
    # dispatch notifies the counts first (notify_dispatch). E int64 counts per rank, latency-bound;
    # once per forward (and recomputed forward), the backward reuses the splits
    counts = np.asarray(g["ep"], float) * moe.experts * COUNT_BYTES
    count_ops = kn(kinds * (np.asarray(g["ep"]) > 1) * (1 + full))
    # then the host waits for them (the split sizes on the CPU before the all-to-all is launched):
    # PerfConstants.moe_sync_s per exchange, hidden like the all-to-all where another micro-batch overlaps
    t_counts = coll("all_gather", counts, groups, "ep", rates) + rates.moe_sync_s
    ep_items = [("ep token counts", "all_gather", counts, count_ops, t_counts)]
    for direction in ("dispatch", "combine"):
        if opt.ep_dispatcher == "dedup":
            b_up, b_out = T / tp * up * H * width[direction], T / tp * out * H * width[direction]
            nb = b_up
            t = coll_dedup(b_up, b_out, groups, rates, imb)
        else:
            nb = tok / BF16 * width[direction]
            t = coll("all_to_all", nb, groups, "ep", rates, imb)
        ep_items.append((f"ep {direction}", "all_to_all", nb, ops, t))
    total = sum(o * t for _, _, _, o, t in ep_items)
    # the 1F1B a2a overlap runs one micro-batch's dispatch/combine under another's attention and
    # experts inside one layer (Megatron-Core's TransformerLayer schedule plan); a hybrid stack's MoE
    # layer has no token mixer of its own, and Megatron-Core's HybridModel cannot schedule it so
    # (NVIDIA/Megatron-LM issue #5854: "there is no single layer that contains both a compute part and
    # a communication part"; the support, PR #4798, is unmerged): its all-to-all stays exposed
    # (Megatron-Bridge's Nemotron 3 recipe, src/megatron/bridge/recipes/nemotronh/nemotron_3_nano.py,
    # sets overlap_moe_expert_parallel_comm = False). DualPipe/DualPipeV overlap whole chunks of two
    # micro-batches, whatever a layer holds.
    overlap = np.where(L.mixers > 0, kn(ep_overlapped(g, opt)), kn(1.0 * dual_schedule(g)))
    # the share of the passes another micro-batch's pass runs beside (ep_overlap_windows): the
    # 1F1B overlap has nothing to pair the warm-up's forwards and the cool-down's backwards with
    windows = np.where(dual_schedule(g), 1.0, kn(ep_overlap_windows(g)))
    exposed = np.where(overlap > 0,
                       windows * overlapped_exposed(total, layer_fb, rates.comm_sm_fraction, opt.sm_reserved)
                       + (1 - windows) * total, total)
    share = exposed / np.maximum(total, 1e-30)
    hidden = "other micro-batch" if np.any((overlap > 0) & (np.asarray(kinds) > 0)) else ""
    for name, kind, nb, o, t in ep_items:
        items.append(LayerComm(name, kind, "ep", kn(nb), o, kn(t), o * t * share, hidden))
    # expert tensor parallelism: gather the routed rows over etp before the experts
    t = coll("all_gather", tok * g["etp"], groups, "etp", rates)
    ops = kn(kinds * etp_gt1 * 2 * (2 + full))
    items.append(LayerComm("etp gather/scatter", "all_gather", "etp", kn(tok * g["etp"]), ops, kn(t), ops * t, ""))
    return items


def dual_schedule(grid: dict) -> np.ndarray:
    """(N,) True where the layout runs DualPipe or DualPipeV."""
    shape = np.shape(grid["tp"])
    sched = np.asarray(grid["schedule"]) if "schedule" in grid else np.zeros(shape, dtype=np.int64)
    return np.broadcast_to((sched == DUALPIPE) | (sched == DUALPIPEV), shape)


def tp_overlapped(grid: dict, opt: CommOptions) -> np.ndarray:
    """(N,) 1.0 where the TP collectives overlap the layer's GEMMs (Megatron-Core
    ``--tp-comm-overlap``, Transformer Engine's userbuffers: the all-gather / reduce-scatter of each
    column / row-parallel pair pipelined with its GEMM). With ``opt.tp_overlap`` None, where
    Megatron-Core runs it: tp > 1 with sequence parallelism (megatron/training/arguments.py asserts
    "Tensor parallel communication/GEMM overlap can happen only when sequence parallelism is
    enabled"), since the overlap never costs time in this model (exposed = what exceeds the GEMM
    window, at most the collectives); True pins it on for every tp > 1 row, False off."""
    shape = np.shape(grid["tp"])
    tp = np.asarray(grid["tp"]) > 1
    if opt.tp_overlap is not None:
        return 1.0 * np.broadcast_to(tp & bool(opt.tp_overlap), shape)
    sp = np.asarray(grid["sequence_parallel"]) > 0 if "sequence_parallel" in grid else np.zeros(shape, dtype=bool)
    return 1.0 * np.broadcast_to(tp & sp, shape)


def ep_overlapped(grid: dict, opt: CommOptions) -> np.ndarray:
    """(N,) 1.0 where the EP all-to-all overlaps another micro-batch's compute.

    Under DualPipe and DualPipeV always (the schedules pair one micro-batch's forward with
    another's backward to hide it, DeepSeek-V3 sec. 3.2.1). Elsewhere, with ``opt.ep_overlap``
    None, where Megatron-Core's ``--overlap-moe-expert-parallel-comm`` runs
    (megatron/core/transformer/transformer_config.py __post_init__ asserts: expert parallelism
    (ep > 1), no full recompute, and a virtual pipeline when pp > 1), since an overlap never
    costs time in this model (:func:`overlapped_exposed` <= the all-to-all); True pins it on
    everywhere, False off."""
    shape = np.shape(grid["tp"])
    dual = dual_schedule(grid)
    if opt.ep_overlap is not None:
        return 1.0 * (dual | bool(opt.ep_overlap))
    g = {k: np.asarray(grid[k]) for k in ("ep", "pp", "vpp", "recompute") if k in grid}
    megatron = ((g["ep"] > 1) & (g.get("recompute", 0) != FULL)
                & ((g.get("pp", 1) == 1) | (g.get("vpp", 1) > 1)))
    return 1.0 * np.broadcast_to(dual | megatron, shape)


def ep_overlap_windows(grid: dict) -> np.ndarray:
    """(N,) The share of a rank's forward and backward chunk-passes whose EP all-to-all another
    micro-batch's pass can hide under Megatron-Core's combined 1F1B
    (``--overlap-moe-expert-parallel-comm``: the forward of micro-batch i + 1 runs beside the
    backward of micro-batch i, megatron/core/pipeline_parallel/combined_1f1b.py). Of a rank's
    ``n = m x vpp`` forwards and ``n`` backwards, the ``w`` warm-up forwards (Megatron's
    num_warmup_microbatches, :func:`planner.schedule.warmup_chunks`, rank 0: the most) and the
    first steady forward have no backward beside them, nor the last ``w + 1`` backwards a forward:
    ``(n - w - 1) / n`` of the passes overlap, 0 with one micro-batch (nothing to pair), 1/2 with
    two and no pipeline (one window of two)."""
    g = {k: np.asarray(grid[k]) for k in ("gbs", "mbs", "dp", "pp", "vpp", "schedule") if k in grid}
    m = g["gbs"] // (g["mbs"] * g["dp"])
    vpp = g.get("vpp", np.ones_like(m))
    n = m * vpp
    w = warmup_chunks(g.get("schedule", np.zeros_like(m)), g.get("pp", np.ones_like(m)), vpp, m, 0)
    return np.broadcast_to(np.maximum(n - w - 1, 0) / np.maximum(n, 1), np.shape(grid["tp"]))


def overlapped_exposed(comm, compute, sm_fraction, reserved: bool = False):
    """What an all-to-all of ``comm`` seconds adds to ``compute`` seconds it overlaps, while its
    kernels hold ``sm_fraction`` of the device's SMs (DeepSeek-V3 sec. 3.2.2: 20 of the H800's
    132 SMs run the dispatch/combine kernels). The compute runs at (1 - f) while the
    communication is in flight and at full rate after: it ends at C + f c when the communication
    ends first (C >= (1 - f) c), else the pair ends with the communication. The pair takes
    max(c, C + f c), so it adds max(c - C, f c): the part nothing hides, or the slowdown.

    ``reserved``: the compute is launched on the 1 - f of the SMs left to it for the whole window
    (CommOptions.sm_reserved): it takes C / (1 - f), and the pair adds max(c - C, C f / (1 - f));
    nothing where there is no communication to overlap."""
    if not reserved:
        return np.maximum(comm - compute, sm_fraction * comm)
    return np.where(np.asarray(comm) > 0, np.maximum(comm - compute, compute * sm_fraction / (1 - sm_fraction)), 0.0)


def _zero3(L: _Layer) -> list[LayerComm]:
    """ZeRO-3: gather parameters (forward, backward), reduce-scatter gradients."""
    g, costs, groups, rates, opt = L.g, L.costs, L.groups, L.rates, L.opt
    items: list[LayerComm] = []
    z3 = np.asarray(g["zero"]) == 3
    for dim, params in (("dp_cp", costs.dense_params), ("edp", costs.expert_params)):
        pbytes = params * opt.param_gather_bytes(g["precision"], flag(g, "fp8_param_gather"))
        gbytes = params * opt.grad_reduce_bytes
        t_ag = coll("all_gather", pbytes, groups, dim, rates)
        t_rs = coll("reduce_scatter", gbytes, groups, dim, rates)
        on = z3 & (np.asarray(groups[dim][0]) > 1) & (params > 0)
        exp_f = np.maximum(0.0, t_ag - costs.fwd) * on
        exp_b = np.maximum(0.0, t_ag + t_rs - costs.bwd) * on
        items.append(LayerComm(f"zero-3 param gather ({dim})", "all_gather", dim, pbytes, 2.0 * on, t_ag,
                               exp_f + exp_b * t_ag / np.maximum(t_ag + t_rs, 1e-30), "previous layer"))
        items.append(LayerComm(f"zero-3 grad scatter ({dim})", "reduce_scatter", dim, gbytes, 1.0 * on, t_rs,
                               exp_b * t_rs / np.maximum(t_ag + t_rs, 1e-30), "next layer"))
    return items


@dataclass(frozen=True)
class StepComm:
    """One collective issued per step (or per micro-batch, counted per step); arrays are (N,)."""

    name: str
    collective: str
    dim: str
    nbytes: np.ndarray
    ops: np.ndarray  # per step
    time: np.ndarray  # per op
    exposed: np.ndarray  # per step
    hidden_by: str


def step_comm(grid: dict, rates: Rates, groups: Groups, opt: CommOptions, *, dense_params, expert_params,
              fwd_mb, bwd_mb, first_layer_ag, microbatches, act_bytes, tied_params=0.0,
              edge_params=0.0) -> list[StepComm]:
    """Per-step collectives of the busiest stage: ``dense_params``/``expert_params`` are its
    parameters per device, ``fwd_mb``/``bwd_mb`` one micro-batch's forward/backward time,
    ``first_layer_ag`` (bytes, seconds) the ZeRO-3 gather of its first layer, ``act_bytes`` one
    micro-batch's activation between stages, ``tied_params`` the word-embedding parameters per
    device that the first and last pipeline stages both hold (tied embeddings under pp > 1; else 0)."""
    g = grid
    zero = np.asarray(g["zero"])
    m = microbatches
    items: list[StepComm] = []
    dp_cp = groups["dp_cp"][0]
    bucket_elems = np.maximum(40e6, 1e6 * dp_cp)
    windows = gradient_windows(g["schedule"], g["pp"], g["vpp"], m)
    for dim, params in (("dp_cp", dense_params), ("edp", expert_params)):
        on = (np.asarray(groups[dim][0]) > 1) & (params > 0) & (zero < 3)
        gbytes = params * opt.grad_reduce_bytes
        bucket = np.minimum(gbytes, bucket_elems * opt.grad_reduce_bytes)
        kind = np.where(zero == 0, 0, 1)  # 0 all-reduce, 1 reduce-scatter
        t_ar, t_rs = coll("all_reduce", gbytes, groups, dim, rates), coll("reduce_scatter", gbytes, groups, dim, rates)
        b_ar, b_rs = coll("all_reduce", bucket, groups, dim, rates), coll("reduce_scatter", bucket, groups, dim, rates)
        t = np.where(kind == 0, t_ar, t_rs)
        tb = np.where(kind == 0, b_ar, b_rs)
        # ZeRO-2: one reduce-scatter of the gradients per contiguous backward window of a chunk
        # (schedule.gradient_windows: m under 1F1B, m / pp under interleaving)
        per_step_ops = np.where(zero == 2, windows, 1) * on
        exposed = np.maximum(tb, t - bwd_mb) * per_step_ops
        name = f"dp grad reduce ({dim})"
        items.append(StepComm(name, "reduce_scatter", dim, gbytes, per_step_ops, t, exposed, "last backward"))
        edge = edge_params if dim == "dp_cp" else 0.0
        pb = opt.param_gather_bytes(g["precision"], flag(g, "fp8_param_gather"))
        pbytes = params * pb + edge * (BF16 - pb)
        t_ag = coll("all_gather", pbytes, groups, dim, rates)
        b_ag = coll("all_gather", np.minimum(pbytes, bucket_elems * pb), groups, dim, rates)
        ag_on = on & (zero >= 1)
        items.append(StepComm(f"dp param gather ({dim})", "all_gather", dim, pbytes, 1.0 * ag_on, t_ag,
                              np.maximum(b_ag, t_ag - fwd_mb) * ag_on, "next forward"))
    if opt.shared_links or opt.overlap_sm:  # the gradient reduces share the last backward, the gathers the next forward
        items[0::2] = _step_window(items[0::2], groups, rates, opt, bwd_mb)
        items[1::2] = _step_window(items[1::2], groups, rates, opt, fwd_mb)
    # ZeRO-3: the first layer's gather of each model chunk and micro-batch has nothing to hide
    # behind: under interleaving each of the vpp chunks a rank runs starts its own prefetch chain
    # (FSDP prefetches the next layer of the same module order, not across chunks)
    ag_bytes, ag_time = first_layer_ag
    chunk_ops = m * np.asarray(g["vpp"]) * (zero == 3)
    items.append(StepComm("zero-3 first gather", "all_gather", "dp_cp", ag_bytes, chunk_ops,
                          ag_time, ag_time * chunk_ops, ""))
    items.append(grad_norm_comm(g, rates, groups))
    items.append(tied_embedding_comm(g, rates, groups, tied_params * opt.grad_reduce_bytes))
    # pipeline: one activation per micro-batch and chunk each way
    pp, vpp = np.asarray(g["pp"]), np.asarray(g["vpp"])
    t = coll("send_recv", act_bytes, groups, "pp", rates)
    ops = 2 * m * vpp * (pp > 1)
    ramp = (pp * vpp - 1) * (pp > 1)
    pp_exposed = 2 * ramp * t
    if opt.overlap_sm:  # the steady-state sends run on NCCL kernels beside the compute
        pp_exposed = sm_floor(ops * t, pp_exposed, sm_share("nccl", rates.comm_sm_fraction))
    items.append(StepComm("pp send/recv", "send_recv", "pp", act_bytes, ops, t, pp_exposed,
                          "own stream (ramp exposed)"))
    return items


def _step_window(items: list[StepComm], groups: Groups, rates: Rates, opt: CommOptions,
                 window) -> list[StepComm]:
    """The window rules of :mod:`dayzero.planner.perf.overlap` over the per-step collectives that
    hide under one window per op (the dense and expert gradient reduce under the last backward of
    a chunk, their parameter gathers under the next forward): NCCL's SM share, then the tiers
    shared, per op."""
    ops = [np.asarray(i.ops, dtype=float) for i in items]
    busy = [np.asarray(i.time, dtype=float) * (o > 0) for i, o in zip(items, ops)]
    per_op = [np.where(o > 0, np.asarray(i.exposed) / np.maximum(o, 1e-30), 0.0) for i, o in zip(items, ops)]
    if opt.overlap_sm:
        share = sm_share("nccl", rates.comm_sm_fraction)
        per_op = [np.where(b > e, sm_floor(b, e, share), e) for b, e in zip(busy, per_op)]
    if opt.shared_links:
        per_op = shared_links(busy, per_op, [tier_of(groups[i.dim][2]) for i in items], window)
    return [replace(i, exposed=e * o) for i, e, o in zip(items, per_op, ops)]


def grad_norm_comm(grid: dict, rates: Rates, groups: Groups) -> StepComm:
    """The all-reduce of the squared gradient norm before clipping: one FP32 scalar per step over
    :func:`grad_norm_group` (Megatron-Core clip_grads.get_grad_norm_fp32). Latency-bound and on the
    critical path between the last gradient reduction and the optimizer step: exposed."""
    size = np.asarray(groups["norm"][0])
    nbytes = np.full(np.shape(size), float(GRAD_NORM_BYTES))
    t = coll("all_reduce", nbytes, groups, "norm", rates)
    on = 1.0 * (size > 1)
    return StepComm("grad-norm all-reduce", "all_reduce", "norm", nbytes, on, t, t * on, "")


def tied_embedding_comm(grid: dict, rates: Rates, groups: Groups, nbytes) -> StepComm:
    """The gradient all-reduce of a tied word embedding between the first and the last pipeline
    stage, which both hold it when pp > 1 (Megatron-LM's embedding group,
    finalize_model_grads._allreduce_word_embedding_grads): a two-member group, over the scale-out
    network when the pipeline group spans domains; after the data-parallel reduction, before the
    optimizer step, so exposed. ``nbytes``: the embedding gradient per device (0: untied, pp = 1)."""
    nb = np.broadcast_to(np.asarray(nbytes, dtype=float), np.shape(grid["tp"]))
    cross = np.asarray(groups["pp"][2]) > 1  # the pipeline group spans scale-up domains
    size = np.full(nb.shape, 2.0)
    t = group_collective("all_reduce", nb, size, np.where(cross, 1.0, 2.0), np.where(cross, 2.0, 1.0),
                         rates.intra, rates.inter)
    on = 1.0 * ((np.asarray(grid["pp"]) > 1) & (nb > 0))
    return StepComm("tied embedding grad all-reduce", "all_reduce", "pp", nb, on, t, t * on, "")
