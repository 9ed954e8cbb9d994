"""Replay one training step of one pipeline rank through the caching allocator.

The allocation sequence comes from the same model as :mod:`memory`: the rank's parameter tensors
(sharded as the layout says), the tensors each layer saves (:mod:`activations`), the schedule's
order of forward and backward passes (:mod:`schedule`), and the transient buffers (ZeRO-3 gathers
of the current + next layer, gradient buckets / unit gradients, SP gathers, EP all-to-all, CP ring
blocks, pipeline send/receive buffers, logits, recomputation). Sizes are exact; lifetimes follow
the order in which a PyTorch step creates and drops them. The replay covers min(m, 2 * pp)
micro-batches (all of them under GPipe): the 1F1B steady state has repeated by then, so the peak
is the step's peak.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np

from dayzero.planner.memory.activations import (
    LAYER_INPUT,
    Dims,
    expert_widths,
    first_stage_terms,
    last_stage_terms,
    layer_activation,
    layer_terms,
    logits_bytes,
    module_terms,
    routed_tokens,
)
from dayzero.planner.memory.allocator import AllocatorOOM, CachingAllocator
from dayzero.planner.memory.memory import MemoryOptions, estimate_memory
from dayzero.planner.memory.memory_terms import cp_buffers
from dayzero.planner.memory.params import attention_split, edge_params, embed_local, head_local, layer_params
from dayzero.planner.schedule import gradient_windows, held_zero, step_order
from dayzero.specs.grid import code as code_of
from dayzero.specs.model import ModelSpec, mixer_parts, split_layer_type
from dayzero.specs.parallel import ParallelConfig, zero_sharded, zero_shards

TRACKED = ("weights", "gradients", "optimizer", "activations", "temporary")


@dataclass
class StepSimulation:
    rank: int
    microbatches: int  # micro-batches replayed
    events: int
    peak_allocated: int  # block bytes in use (rounded to 512 B)
    peak_requested: int  # tensor bytes in use
    peak_reserved: int  # segments held by the allocator
    fragmentation: float  # 1 - allocated / reserved when the reservation peaked
    segments: int
    oom_at: int | None  # event index of the first failed reservation, if a capacity was given
    analytic_allocated: int  # the memory model's weights..temporary for this rank
    timeline: dict = field(default_factory=dict, repr=False)  # category -> np.ndarray per event; "reserved"

    def to_dict(self) -> dict:
        return {"rank": self.rank, "microbatches": self.microbatches, "events": self.events,
                "peak_allocated": self.peak_allocated, "peak_requested": self.peak_requested,
                "peak_reserved": self.peak_reserved, "fragmentation": self.fragmentation, "segments": self.segments,
                "oom_at": self.oom_at, "analytic_allocated": self.analytic_allocated}


class _Tracker:
    """Allocates named tensors, records bytes per category after every event."""

    def __init__(self, capacity: int | None, record: bool, expandable: bool = False):
        self.alloc = CachingAllocator(capacity, expandable)
        self.live: dict = {}
        self._by_prefix: dict[tuple, dict] = {}  # every proper prefix of a live key -> its keys, in insertion order
        self.by_cat = dict.fromkeys(TRACKED, 0)
        self.record = record
        self.rows: list[tuple] = []
        self.oom_at: int | None = None
        self.events = 0

    def new(self, key, nbytes: float, cat: str) -> None:
        nbytes = int(round(float(nbytes)))
        if nbytes <= 0:
            return
        try:
            block = self.alloc.malloc(nbytes)
        except AllocatorOOM:
            if self.oom_at is None:
                self.oom_at = self.events
            self.alloc.capacity = None  # keep replaying to report the unconstrained peak
            block = self.alloc.malloc(nbytes)
        if key in self.live:  # replaced: forget its old place in the prefix index
            self._unindex(key)
        self.live[key] = (block, cat)
        for i in range(1, len(key)):
            self._by_prefix.setdefault(key[:i], {})[key] = None
        self.by_cat[cat] += nbytes
        self._tick()

    def drop(self, key) -> None:
        item = self.live.pop(key, None)
        if item is None:
            return
        self._unindex(key)
        block, cat = item
        self.by_cat[cat] -= block.requested
        self.alloc.free(block)
        self._tick()

    def _unindex(self, key) -> None:
        for i in range(1, len(key)):
            group = self._by_prefix.get(key[:i])
            if group is not None:
                group.pop(key, None)
                if not group:
                    del self._by_prefix[key[:i]]

    def live_under(self, prefix: tuple) -> list[tuple[tuple, int]]:
        """(key, bytes) of every live key that starts with ``prefix``, oldest first."""
        return [(key, self.live[key][0].requested) for key in self._by_prefix.get(prefix, ())]

    def drop_prefix(self, prefix: tuple) -> None:
        """Drop every live key that starts with ``prefix``, oldest first (an index, not a scan of
        all live tensors: the scan made deep models quadratic, 37 s at 1,491 layers)."""
        for key in list(self._by_prefix.get(prefix, ())):
            self.drop(key)

    def _tick(self) -> None:
        self.events += 1
        if self.record:
            self.rows.append((*(self.by_cat[c] for c in TRACKED), self.alloc.reserved))


def _param_tensors(spec: ModelSpec, kind: str, p: ParallelConfig) -> list[tuple[str, float, bool]]:
    """(name, local elements, is_expert) of one layer's parameters on this rank, before ZeRO."""
    lp = layer_params(spec, kind)
    # a recurrent mixer's tp-split weights are listed with the layer's other tp-split ones
    a_tp, a_kv, a_rep = attention_split(spec) if "attention" in mixer_parts(split_layer_type(kind)[0]) \
        else (0, 0, 0)
    kv = spec.attention.kv_heads
    out = [("attn", a_tp / p.tp + a_kv / min(p.tp, kv), False), ("mlp", (lp.tp - a_tp) / p.tp, False),
           ("small", lp.rep, False)]
    if lp.expert:
        out += [("experts_fc1", lp.expert * 2 / 3 / (p.ep * p.etp), True), ("experts_fc2",
                                                                            lp.expert / 3 / (p.ep * p.etp), True)]
    return out


class _StepReplay:
    """One pipeline rank's step as allocations and frees on a :class:`_Tracker`: the persistent
    model states first, then each forward and backward of a micro-batch and model chunk in the
    schedule's order, with ZeRO-3 gathers, gradient buckets and per-layer transients."""

    def __init__(self, spec: ModelSpec, p: ParallelConfig, o: MemoryOptions, rank: int, tr: _Tracker):
        self.spec, self.p, self.o, self.tr = spec, p, o, tr
        self.chunks = [list(r) for v, r in enumerate(p.stage_layers(spec)) if v % p.pp == rank]
        # the multi-token-prediction modules: layers L, L+1, ... of spec.mtp_kind after the last
        # chunk of the last rank, with their embedding lookup and a second head pass (memory.placed_features)
        self.mtp = spec.mtp_layers if rank == p.pp - 1 else 0
        self.kind_of = list(spec.layer_types) + [spec.mtp_kind] * spec.mtp_layers
        if self.mtp:
            self.chunks[-1] += list(range(spec.layers, spec.layers + self.mtp))
        self.zd, self.edp = p.dp * p.cp, p.edp
        self.d = d = Dims(seq=p.seq, mbs=p.mbs, tp=p.tp, cp=p.cp, etp=p.etp, sp=p.sequence_parallel,
                          fp8=p.precision != "bf16")
        self.first, self.last = rank == 0, rank == p.pp - 1
        # FP8 parameter storage: MemoryOptions.fp8_params or the layout's ParallelConfig.fp8_param_gather
        self.fp8_cache = float(o.fp8_cache_bytes(p.precision != "bf16", p.fp8_param_gather))
        self.layer_pb = float(o.layer_param_bytes(p.precision != "bf16", p.fp8_param_gather))
        # -- per-layer sizes from the activation model
        self.terms = {k: {n: float(v) for n, v in layer_terms(spec, k, o, d).items()} for k in set(spec.layer_types)}
        self.recomputing = {k: float(layer_activation(spec, k, o, d).recomputing) for k in set(self.kind_of)}
        self.unit = {i: sum(e for _, e, _ in _param_tensors(spec, self.kind_of[i], p))
                     for c in self.chunks for i in c}
        self.full_n = [len(c) if p.recompute_layers is None else min(p.recompute_layers, len(c)) for c in self.chunks]
        # activation offload: the first N layers of each chunk, at most all but one (planner.memory.activation_offload;
        # the layout's own N, at least the run's option: activation_offload.offload_layers_of)
        n_off = max(p.activation_offload_layers, o.activation_offload_layers)
        self.offload_n = [max(0, min(n_off, len(c) - 1)) for c in self.chunks]
        self.on_host: dict = {}  # (mb, c, layer) -> {term: bytes} offloaded
        self.bucket = o.grad_bucket_params or max(40e6, 1e6 * self.zd)
        self.ab, self.h = o.act_bytes, spec.hidden
        self.gathered: deque = deque()
        self.grad_fill = {"bytes": 0.0, "live": deque(), "n": 0}
        # ZeRO-2 reduce-scatters a chunk's gradient once per window of contiguous backward passes
        # (schedule.gradient_windows); with fewer windows than micro-batches the chunk's unsharded
        # gradient lives through its window: micro-batches per window (0: per-layer buckets)
        self.window, self.last_mb = 0, -1
        self.p2p = self.ab * float(d.tok_rep) * self.h  # one pipeline send or receive buffer

    # -- persistent model states -------------------------------------------------------------
    def shard(self, elems: float, expert: bool, state: str) -> float:
        return float(zero_sharded(elems, state, self.p.zero, self.edp if expert else self.zd))

    def model_states(self) -> None:
        spec, p, o, tr, shard = self.spec, self.p, self.o, self.tr, self.shard
        tensors: list[tuple[tuple, float, bool]] = []
        for layer in (i for ch in self.chunks for i in ch):
            tensors += [(("w", layer, n), e, x) for n, e, x in _param_tensors(spec, self.kind_of[layer], p)]
        edge = edge_params(spec)
        if self.first or self.mtp:
            tensors.append((("w", "embed"), float(embed_local(edge, p.tp)), False))
        if self.last:
            tensors.append((("w", "head"), float(head_local(edge, p.tp, p.pp)), False))
        fp8_cache = self.fp8_cache
        for key, elems, expert in tensors:
            nbytes = o.param_bytes if key[1] in ("embed", "head") else self.layer_pb
            tr.new(key, nbytes * shard(elems, expert, "weights"), "weights")
            if fp8_cache and not zero_shards(p.zero, "weights") and key[1] not in ("embed", "head"):
                tr.new(("fp8",) + key[1:], fp8_cache * elems, "weights")
        # one contiguous gradient buffer (Megatron's grad buffer; buckets are views into it)
        if not zero_shards(p.zero, "gradients"):
            tr.new(("g", "buffer"), o.grad_bytes * sum(e for _, e, _ in tensors), "gradients")
        else:
            for key, elems, expert in tensors:
                tr.new(("g",) + key[1:], o.grad_bytes * shard(elems, expert, "gradients"), "gradients")
        offloaded = o.optimizer_offload or p.optimizer_offload  # in host memory
        for key, elems, expert in tensors * (not offloaded):
            for name, nbytes in (("master", o.master_bytes), ("exp_avg", o.optim_bytes / 2), ("exp_avg_sq",
                                                                                              o.optim_bytes / 2)):
                tr.new((name,) + key[1:], nbytes * shard(elems, expert, "optimizer"), "optimizer")

    # -- what each layer adds while it runs ------------------------------------------------------
    def gather(self, layer: int) -> None:  # ZeRO-3: all-gather this layer (and keep the previous one)
        p, o, tr, gathered = self.p, self.o, self.tr, self.gathered
        if not zero_shards(p.zero, "weights") or ("gather", layer) in tr.live:
            return
        tr.new(("gather", layer), self.unit[layer] * (self.layer_pb + self.fp8_cache), "temporary")
        gathered.append(layer)
        while len(gathered) > o.zero3_prefetch_units:
            tr.drop(("gather", gathered.popleft()))

    def layer_grads(self, layer: int) -> None:
        p, o, tr, grad_fill, bucket = self.p, self.o, self.tr, self.grad_fill, self.bucket
        if zero_shards(p.zero, "weights"):  # unsharded gradients of the unit, freed once reduce-scattered
            tr.new(("ugrad", layer), o.grad_bytes * self.unit[layer], "temporary")
            tr.drop(("ugrad", layer))
        elif p.zero == 2:  # fill DP buckets; two in flight
            grad_fill["bytes"] += self.unit[layer]
            while grad_fill["bytes"] >= bucket:
                grad_fill["bytes"] -= bucket
                grad_fill["n"] += 1
                tr.new(("bucket", grad_fill["n"]), o.grad_bytes * bucket, "temporary")
                grad_fill["live"].append(grad_fill["n"])
                while len(grad_fill["live"]) > o.grad_buckets_in_flight:
                    tr.drop(("bucket", grad_fill["live"].popleft()))

    def transients(self, layer: int) -> None:  # buffers that live only while a layer runs
        spec, p, o, d, tr, ab, h = self.spec, self.p, self.o, self.d, self.tr, self.ab, self.h
        kind = self.kind_of[layer]
        if p.sequence_parallel and p.tp > 1:
            tr.new(("sp",), ab * float(d.tok) * h, "temporary")
            tr.drop(("sp",))
        if split_layer_type(kind)[1] == "moe" and p.ep > 1:
            tr.new(("a2a",), 2 * ab * float(routed_tokens(spec, o, d)) * expert_widths(spec)[0], "temporary")
            tr.drop(("a2a",))
        if p.cp > 1:  # the ring's K/V blocks or the all-to-all's copies (memory_terms.cp_buffers)
            ring, a2a = cp_buffers(self.terms[kind], p.cp, p.cp_comm == "a2a")
            tr.new(("cp",), float(ring + a2a), "temporary")
            tr.drop(("cp",))

    # -- the schedule's operations -----------------------------------------------------------------
    def forward(self, mb: int, c: int) -> None:
        spec, p, o, d, tr, p2p = self.spec, self.p, self.o, self.d, self.tr, self.p2p
        layers = self.chunks[c]
        edge_in = self.first and c == 0
        edge_out = self.last and c == len(self.chunks) - 1
        if not edge_in:
            tr.new(("recv", mb, c), p2p, "temporary")
        else:
            for n, v in first_stage_terms(spec, o, d).items():
                tr.new(("act", mb, c, "edge", n), float(v), "activations")
        for j, layer in enumerate(layers):
            self.gather(layer)
            if j + 1 < len(layers):
                self.gather(layers[j + 1])
            kind = self.kind_of[layer]
            for n, v in self.terms[kind].items():
                tr.new(("act", mb, c, layer, n), v, "activations")
            self.transients(layer)
            if j == 0 and not edge_in:
                tr.drop(("recv", mb, c))
            keep = (LAYER_INPUT,) if p.recompute == "full" and j < self.full_n[c] else None
            dropped = {n for m in self.modules(kind) for n in m}
            for n in self.terms[kind]:
                if (keep is not None and n not in keep) or (keep is None and n in dropped):
                    tr.drop(("act", mb, c, layer, n))
            if j >= 1 and j - 1 < self.offload_n[c]:  # the layer below is on the host once this one has run
                self.to_host(mb, c, layers[j - 1])
        if edge_out:
            for n, v in last_stage_terms(spec, o, d).items():
                tr.new(("act", mb, c, "edge", n), float(v) * (1 + self.mtp), "activations")
            if self.mtp:  # the MTP modules' embedding lookup
                for n, v in first_stage_terms(spec, o, d).items():
                    tr.new(("act", mb, c, "edge", "mtp", n), float(v), "activations")
            tr.new(("logits", mb), float(logits_bytes(spec, o, d)) * (1 + self.mtp), "temporary")
        else:
            tr.new(("send", mb, c), p2p, "temporary")
            tr.drop(("send", mb, c))

    def to_host(self, mb: int, c: int, layer: int) -> None:
        """Activation offload: ``layer``'s saved tensors leave the device (TE keeps at most L - N
        sets resident: the layer's copy ends during the next layer's forward)."""
        self.on_host[(mb, c, layer)] = {key[-1]: nbytes for key, nbytes in self.tr.live_under(("act", mb, c, layer))}
        self.tr.drop_prefix(("act", mb, c, layer))

    def from_host(self, mb: int, c: int, layer: int) -> None:
        for n, nbytes in self.on_host.pop((mb, c, layer), {}).items():
            self.tr.new(("act", mb, c, layer, n), nbytes, "activations")

    def modules(self, kind: str) -> list[tuple[str, ...]]:
        """The saved terms of a ``kind`` layer each recomputed module drops, per module (selective
        recompute; none otherwise)."""
        if self.p.recompute != "selective":
            return []
        names = self.terms[kind]
        return [ts for ts in (module_terms(self.spec, m, names) for m in self.p.recompute_modules) if ts]

    def chunk_grads(self, c: int, edge_in: bool, edge_out: bool) -> None:
        """ZeRO-2 with backward windows: the chunk's unsharded gradient, for its window."""
        if ("cgrad", c) in self.tr.live:
            return
        edge = edge_params(self.spec)
        elems = sum(self.unit[i] for i in self.chunks[c])
        elems += float(embed_local(edge, self.p.tp)) * edge_in
        elems += float(head_local(edge, self.p.tp, self.p.pp)) * edge_out
        self.tr.new(("cgrad", c), self.o.grad_bytes * elems, "temporary")

    def backward(self, mb: int, c: int) -> None:
        p, tr = self.p, self.tr
        layers = self.chunks[c]
        edge_in = self.first and c == 0
        edge_out = self.last and c == len(self.chunks) - 1
        if self.window:
            self.chunk_grads(c, edge_in, edge_out)
        if edge_out:
            tr.drop(("logits", mb))
            tr.drop_prefix(("act", mb, c, "edge"))
        else:
            tr.new(("grad_recv", mb, c), self.p2p, "temporary")
        back = layers[::-1]
        for j, layer in enumerate(back):
            below = layers.index(layer) - 1
            if 0 <= below < self.offload_n[c]:  # reloaded while this layer's backward runs
                self.from_host(mb, c, layers[below])
            self.gather(layer)
            if j + 1 < len(back):
                self.gather(back[j + 1])
            kind = self.kind_of[layer]
            t = self.terms[kind]
            if p.recompute == "full" and layers.index(layer) < self.full_n[c]:
                rebuilt = 0.0
                for n, v in t.items():
                    if n != LAYER_INPUT:
                        tr.new(("re", n), v, "temporary")
                        rebuilt += v
                # the gradients on top reach the backward's largest phase (activations.full_recompute_transient)
                dgrad = max(0.0, self.recomputing[kind] - rebuilt)
            else:
                if self.modules(kind):  # the module rebuilding most (activations.LayerActivation.rebuilding)
                    for n in max(self.modules(kind), key=lambda names: sum(t[x] for x in names)):
                        tr.new(("re", n), t[n], "temporary")
                dgrad = max(t.values())
            tr.new(("dgrad",), dgrad, "temporary")
            self.transients(layer)
            tr.drop(("dgrad",))
            tr.drop_prefix(("re",))
            tr.drop_prefix(("act", mb, c, layer))
            if j == 0 and not edge_out:
                tr.drop(("grad_recv", mb, c))
            if not self.window:
                self.layer_grads(layer)
        if edge_in:
            tr.drop_prefix(("act", mb, c, "edge"))
        if self.window and (mb % self.window == self.window - 1 or mb == self.last_mb):
            tr.drop(("cgrad", c))  # reduce-scattered into its shard


def simulate_step(spec: ModelSpec, parallel: ParallelConfig, capacity_bytes: int | None = None,
                  options: MemoryOptions = MemoryOptions(), rank: int | None = None,
                  record_timeline: bool = False) -> StepSimulation:
    """Replay one step on ``rank`` (default: the busiest stage of estimate_memory), with the ZeRO
    stage's weights and gradients as the engine holds them (``options.pipelined_fsdp``:
    :func:`dayzero.planner.schedule.held_zero`)."""
    report = estimate_memory(spec, parallel, capacity_bytes or 1, options)
    p = parallel.with_(zero=int(held_zero(parallel.zero, parallel.pp, options.pipelined_fsdp)))
    rank = report.busiest_stage if rank is None else rank
    st = report.stages[rank]
    m_all = p.microbatches
    m = m_all if p.schedule == "gpipe" else min(m_all, 2 * p.pp)
    tr = _Tracker(capacity_bytes, record_timeline, options.allocator == "expandable")
    replay = _StepReplay(spec, p, options, rank, tr)
    windows = int(gradient_windows(code_of("schedule", p.schedule), p.pp, p.vpp, m_all))
    if p.zero == 2 and windows < m_all:
        replay.window, replay.last_mb = m_all // windows, m - 1
    replay.model_states()
    for op, mb, c in step_order(p.schedule, p.pp, p.vpp, m, rank):
        if op == "F":
            replay.forward(mb, c)
        else:
            replay.backward(mb, c)
    analytic = st.weights + st.gradients + st.optimizer + st.activations + st.temporary
    a = tr.alloc
    timeline = {}
    if record_timeline and tr.rows:
        arr = np.array(tr.rows, dtype=float)
        timeline = {c: arr[:, i] for i, c in enumerate(TRACKED)}
        timeline["reserved"] = arr[:, -1]
    return StepSimulation(rank=rank, microbatches=m, events=tr.events, peak_allocated=a.peak_allocated,
                          peak_requested=a.peak_requested, peak_reserved=a.peak_reserved, fragmentation=a.fragmentation,
                          segments=len(a.segments), oom_at=tr.oom_at, analytic_allocated=analytic, timeline=timeline)


def plot_timeline(sim: StepSimulation, path: str, title: str = "") -> None:
    """Write a PNG of memory over the step by category (stacked) with the reserved bytes on top."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not sim.timeline:
        raise ValueError("simulate_step(..., record_timeline=True) first")
    x = np.arange(len(sim.timeline["reserved"]))
    gib = 2**30
    fig, ax = plt.subplots(figsize=(10, 4.5))
    ax.stackplot(x, *[sim.timeline[c] / gib for c in TRACKED], labels=TRACKED, alpha=0.85)
    ax.plot(x, sim.timeline["reserved"] / gib, color="black", lw=1, label="reserved (allocator)")
    ax.set_xlabel("allocator event")
    ax.set_ylabel("GiB")
    ax.set_title(title or f"stage {sim.rank}: one training step")
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    from pathlib import Path

    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
