"""Every named term of the memory model, for candidates x pipeline ranks at once.

One function, :func:`stage_terms`, computes all terms with numpy broadcasting: candidate arrays
have shape (n, 1), rank features shape (1, pp) (or (n, pp)), results (n, pp). The scalar
:func:`dayzero.planner.memory.memory.estimate_memory` calls it with n = 1 and the batch path
:func:`dayzero.planner.memory.memory.peak_memory_batch` with n candidates and per-candidate features (n, w),
so both agree by construction. Term names are ``category:term``; docs/memory.md explains each.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dayzero.planner.memory.activation_offload import offload_fraction, offload_layers_of
from dayzero.planner.memory.activations import (
    Dims,
    attention_terms,
    expert_widths,
    first_stage_terms,
    last_stage_terms,
    layer_activations,
    logits_bytes,
    routed_tokens,
)
from dayzero.planner.memory.memory_options import MemoryOptions
from dayzero.planner.memory.params import edge_params, embed_local, head_local, layer_params
from dayzero.planner.schedule import gradient_windows, head_inflight, held_zero, inflight_microbatches
from dayzero.specs.grid import A2A, BF16, DUALPIPE, FIELDS, FULL, MODULE_BIT, SELECTIVE, flag, recompute_modules
from dayzero.specs.model import ModelSpec, split_layer_type
from dayzero.specs.parallel import expert_data_parallel, microbatches, zero_sharded, zero_shards

CATEGORIES = ("weights", "gradients", "optimizer", "activations", "temporary", "overhead")
KINDS = ("dense", "moe")
# where the ranks sit changes no byte; the activation offload column is optional (a grid without it
# takes the run's option: planner.memory.activation_offload.offload_layers_of)
CANDIDATE_KEYS = tuple(f for f in FIELDS if f not in ("rank_order", "activation_offload_layers", "cp_comm"))
# the cp exchange is optional too: a grid without it (or without an a2a row) exchanges by the ring
# Not a term of any report: the bytes (with their fragmentation share) a row's recompute level holds
# beyond the least that any level it is above (planner.search.search_space.level_order) can hold, the rest of
# the row unchanged (:func:`_activation_terms`). ``peak_memory_batch(..., without=((RECOMPUTE_EXCESS,),))``
# is then a lower bound on the peak of every such level: the search rules a base out under a recompute
# gate only where that bound does not fit (planner.search.search_fit._fitting_variants).
RECOMPUTE_EXCESS = "recompute_excess"


@dataclass(frozen=True)
class RankFeatures:
    """What differs between pipeline ranks: layers by kind, layers under full recompute, edges."""

    rank: np.ndarray  # (1, pp) pipeline rank index
    layers: dict  # kind -> (1, pp) decoder layers of that kind on the rank (all its chunks)
    full: dict  # kind -> (1, pp) of those, the layers full recompute applies to
    first: np.ndarray  # (1, pp) 1 on the rank with the embedding
    last: np.ndarray  # (1, pp) 1 on the rank with the final norm, head and loss


def rank_features(per_rank_kinds: list[list[str]], per_rank_full: list[list[str]] | None = None) -> RankFeatures:
    """Features from the kinds of the layers on each rank (and of those fully recomputed)."""
    pp = len(per_rank_kinds)
    full = per_rank_full if per_rank_full is not None else per_rank_kinds

    def count(lists, kind):
        return np.array([[sum(k == kind for k in ks) for ks in lists]], dtype=float)

    idx = np.arange(pp, dtype=float)[None, :]
    # dense and moe always (sections read them by name), plus a hybrid's own layer types
    kinds = list(KINDS) + sorted({k for ks in per_rank_kinds for k in ks} - set(KINDS))
    return RankFeatures(rank=idx, layers={k: count(per_rank_kinds, k) for k in kinds},
                        full={k: count(full, k) for k in kinds},
                        first=(idx == 0).astype(float), last=(idx == pp - 1).astype(float))


@dataclass(frozen=True)
class _Candidates:
    """The candidates' columns and what every section of :func:`stage_terms` derives from them."""

    tp: np.ndarray
    pp: np.ndarray
    cp: np.ndarray
    ep: np.ndarray
    etp: np.ndarray
    zero: np.ndarray
    vpp: np.ndarray
    schedule: np.ndarray  # schedule code, as it runs (memory.memory_columns)
    offload: object  # layers per chunk whose saved activations are on the host (planner.memory.activation_offload)
    rc: np.ndarray  # recompute code
    modules: np.ndarray  # recompute-module bitmask (specs.grid.MODULE_BIT), read under selective recompute
    d: Dims
    zd: np.ndarray  # dense ZeRO group: replicas of a dense shard (data x context parallel)
    edp: np.ndarray  # expert ZeRO group
    kinds: list  # the layer kinds present on some rank
    dense: np.ndarray  # dense layer parameters on the rank (elements)
    experts: np.ndarray  # routed-expert parameters on the rank
    emb: np.ndarray  # embedding parameters on the rank (first rank only)
    head: np.ndarray  # head (+ final norm) parameters on the rank (last rank only)
    fp8_w: np.ndarray  # bytes per parameter of the FP8 weight cache (0 for BF16 GEMMs)
    layer_pb: np.ndarray  # bytes per decoder-layer working weight (FP8_BYTES under FP8 parameter storage)
    opt_offload: np.ndarray  # the optimizer states and FP32 master in host memory (optimizer offload)
    a2a: np.ndarray  # context parallelism by all-to-all (cp_comm a2a), not the ring


def _candidates(spec: ModelSpec, opts: MemoryOptions, c: dict, f: RankFeatures) -> _Candidates:
    tp, pp, dp, cp, ep, etp = (c[k] for k in ("tp", "pp", "dp", "cp", "ep", "etp"))
    d = Dims(seq=c["seq"], mbs=c["mbs"], tp=tp, cp=cp, etp=etp, sp=c["sequence_parallel"] > 0,
             fp8=c["precision"] != BF16)
    kv = spec.attention.kv_heads
    kinds = [k for k in f.layers if f.layers[k].any()]
    edge = edge_params(spec)
    emb, head = f.first * embed_local(edge, tp), f.last * head_local(edge, tp, pp)
    dense = sum(f.layers[k] * layer_params(spec, k).local_dense(tp, kv) for k in kinds) + 0.0
    experts = sum(f.layers[k] * layer_params(spec, k).local_expert(ep, etp) for k in kinds) + 0.0
    return _Candidates(tp=tp, pp=pp, cp=cp, ep=ep, etp=etp, zero=c["zero"], vpp=c["vpp"], schedule=c["schedule"],
                       offload=offload_layers_of(c, opts.activation_offload_layers),
                       rc=c["recompute"],
                       modules=recompute_modules(c), d=d, zd=dp * cp,
                       edp=expert_data_parallel(tp, cp, dp, ep, etp), kinds=kinds, dense=dense, experts=experts,
                       emb=emb, head=head,
                       fp8_w=opts.fp8_cache_bytes(d.fp8, flag(c, "fp8_param_gather")),
                       layer_pb=opts.layer_param_bytes(d.fp8, flag(c, "fp8_param_gather")),
                       opt_offload=opts.optimizer_offload | flag(c, "optimizer_offload"),
                       a2a=(np.asarray(c["cp_comm"]) == A2A) if "cp_comm" in c else np.False_)


def stage_terms(spec: ModelSpec, opts: MemoryOptions, c: dict, f: RankFeatures,
                capacity_bytes: float, excess: bool = False):
    """All terms (bytes per device) for candidates ``c`` (grid columns of shape (n, 1) keyed by
    CANDIDATE_KEYS, schedule normalised by :func:`dayzero.planner.memory.memory.memory_schedule`) on the
    ranks described by ``f``. FP8 and FP4 GEMMs keep the same FP8 weight cache and activations.
    Under ``opts.pipelined_fsdp`` the ZeRO stage is the one the engine holds at the peak
    (:func:`dayzero.planner.schedule.held_zero`). With ``excess``: (terms, the dynamic bytes of
    :data:`RECOMPUTE_EXCESS` per rank, before their fragmentation share)."""
    # the weights and gradients as the engine holds them (FSDP under torch.distributed.pipelining: ZeRO-1's)
    c = {**c, "zero": held_zero(c["zero"], c["pp"], opts.pipelined_fsdp)}
    x = _candidates(spec, opts, c, f)
    t: dict[str, np.ndarray] = {}
    _model_state_terms(opts, x, t)
    m = microbatches(c["gbs"], c["mbs"], c["dp"])
    inflight = inflight_microbatches(c["schedule"], x.pp, c["vpp"], m, f.rank)
    head_mb = head_inflight(c["schedule"], m)
    transient, above = _activation_terms(spec, opts, x, f, inflight, head_mb, t, excess)
    windows = gradient_windows(c["schedule"], x.pp, c["vpp"], m)
    _temporary_terms(spec, opts, x, f, transient, head_mb, np.asarray(c["vpp"]), windows < m, t)
    _overhead_terms(opts, x, f, capacity_bytes, t)
    return (t, above) if excess else t


def _model_state_terms(opts: MemoryOptions, x: _Candidates, t: dict) -> None:
    """Weights, gradients and optimizer states, each sharded as ZeRO shards it (dense over dp*cp,
    routed experts over edp)."""
    zero, zd, edp = x.zero, x.zd, x.edp
    for cat, nbytes, layer_bytes in (("weights", opts.param_bytes, x.layer_pb),
                                     ("gradients", opts.grad_bytes, opts.grad_bytes)):
        if cat == "weights" and opts.sharded_params_are_master:
            nbytes = np.where(zero_shards(zero, "weights"), 0,
                              nbytes)  # FSDP2: the sharded copy is the fp32 master itself
            layer_bytes = np.where(zero_shards(zero, "weights"), 0, layer_bytes)
        t[f"{cat}:layers"] = layer_bytes * zero_sharded(x.dense, cat, zero, zd)
        t[f"{cat}:experts"] = layer_bytes * zero_sharded(x.experts, cat, zero, edp)
        t[f"{cat}:embedding"] = nbytes * zero_sharded(x.emb, cat, zero, zd)
        t[f"{cat}:head"] = nbytes * zero_sharded(x.head, cat, zero, zd)
    states = _optimizer_states(x) * ~x.opt_offload  # MemoryOptions.optimizer_offload or the layout's: in host memory
    t["optimizer:master"] = opts.master_bytes * states
    t["optimizer:moments"] = opts.optim_bytes * states
    # FP8 training caches an FP8 copy (+ transpose) of each local weight across micro-batches;
    # under ZeRO-3 only the gathered units have one (counted with the gather buffers).
    t["weights:fp8_cache"] = np.where(zero_shards(zero, "weights"), 0, x.fp8_w * (x.dense + x.experts))


def _optimizer_states(x: _Candidates):
    """Parameters of the rank's optimizer shard: ZeRO-1 shards dense ones over dp*cp, routed experts over edp."""
    return (zero_sharded(x.dense + x.emb + x.head, "optimizer", x.zero, x.zd)
            + zero_sharded(x.experts, "optimizer", x.zero, x.edp))


def optimizer_host_terms(spec: ModelSpec, opts: MemoryOptions, c: dict, f: RankFeatures) -> np.ndarray:
    """(n, pp) host bytes each rank's optimizer takes when it is offloaded, whether or not the
    candidates offload it: the FP32 master, the moments and the FP32 gradient copy the host Adam
    reads, per parameter of the rank's optimizer shard (:func:`dayzero.planner.memory.offload.host_bytes`,
    for candidates x ranks at once; 0 without optimizer states)."""
    from dayzero.planner.memory.offload import HOST_GRAD_BYTES

    if opts.master_bytes + opts.optim_bytes <= 0:
        return np.zeros_like(np.asarray(f.rank, dtype=float))
    c = {**c, "zero": held_zero(c["zero"], c["pp"], opts.pipelined_fsdp)}
    x = _candidates(spec, opts, c, f)
    return _optimizer_states(x) * (opts.master_bytes + opts.optim_bytes + HOST_GRAD_BYTES) + 0 * f.rank


def _activation_terms(spec: ModelSpec, opts: MemoryOptions, x: _Candidates, f: RankFeatures, inflight, head_mb,
                      t: dict, excess: bool = False):
    """Saved activations of the micro-batches in flight; returns (the largest transient of a layer,
    a temporary term; with ``excess``, the bytes of :data:`RECOMPUTE_EXCESS`, else None).

    The floor those bytes are measured from, per layer kind, with the rest of the row unchanged
    (only these two terms depend on the recompute level): saved, the least of the levels below
    the row's (full: below every level, so the least of its layer input and of what every module
    at once saves, which a negative traced term can make the smaller; selective: a level dropping
    a subset of its tensors saves at least what it saves; none: its own), and as transient the
    largest saved tensor, which every level has (none: itself; selective: plus the rebuilt module;
    full: at most the largest phase of the replay, activations.full_recompute_transient)."""
    rc, d = x.rc, x.d
    acts = layer_activations(spec, x.kinds, opts, d)  # each once per distinct dims
    per_mb = 0.0
    floor_mb = 0.0  # saved per micro-batch at the floor
    transient = 0.0
    common = 0.0  # the transient every level has
    for k in x.kinds:
        a, n = acts[k], f.layers[k]
        nfull = np.where(rc == FULL, f.full[k], 0)
        saved = np.where(rc == SELECTIVE, a.saved(x.modules), a.none)
        per_mb = per_mb + (n - nfull) * saved + nfull * a.full
        # full recompute: the largest over the backward's phases (activations.full_recompute_transient)
        tr = np.where((rc == FULL) & (nfull > 0), np.maximum(a.largest, a.recomputing),
                      a.largest + np.where(rc == SELECTIVE, a.rebuilding(x.modules), 0))
        transient = np.maximum(transient, np.where(n > 0, tr, 0))
        if excess:
            least = np.minimum(a.full, a.saved(sum(MODULE_BIT.values())))
            floor_mb = floor_mb + n * np.where(rc == FULL, least, saved)
            common = np.maximum(common, np.where(n > 0, a.largest, 0))
    # activation CPU offload: the offloaded layers' share of the saved bytes is in host memory
    # (planner.memory.activation_offload; DualPipe ranks hold two chunks, the others vpp)
    if np.any(x.offload):
        layers = sum(f.layers[k] for k in x.kinds) + 0.0
        chunks = np.where(x.schedule == DUALPIPE, 2, x.vpp)
        kept = 1 - offload_fraction(x.offload, layers, chunks)
        per_mb, floor_mb = per_mb * kept, floor_mb * kept
    t["activations:layers"] = per_mb * inflight
    t["activations:embedding"] = f.first * sum(first_stage_terms(spec, opts, d).values()) * inflight
    t["activations:head"] = f.last * sum(last_stage_terms(spec, opts, d).values()) * head_mb
    return transient, ((per_mb - floor_mb) * inflight + transient - common) if excess else None


def _temporary_terms(spec: ModelSpec, opts: MemoryOptions, x: _Candidates, f: RankFeatures, transient, head_mb,
                     vpp, chunk_windows, t: dict) -> None:
    """Buffers that live within a step: the layer transient, logits, ZeRO-3 gathers, gradient
    buckets and the TP/SP, EP, CP and PP communication buffers. ``chunk_windows``: ZeRO-2
    reduce-scatters a whole model chunk's gradient once its contiguous backward passes end
    (:func:`dayzero.planner.schedule.gradient_windows` fewer than one per micro-batch), so that
    chunk's gradient is held unsharded meanwhile, not just the DP buckets."""
    tp, cp, ep, etp, pp, zero, d = x.tp, x.cp, x.ep, x.etp, x.pp, x.zero, x.d
    kv = spec.attention.kv_heads
    t["temporary:layer_transient"] = transient
    t["temporary:logits"] = f.last * logits_bytes(spec, opts, d) * head_mb
    unit = 0.0  # the largest ZeRO-3 unit (a decoder layer, the embedding or the head), unsharded
    for k in x.kinds:
        lp = layer_params(spec, k)
        unit = np.maximum(unit, np.where(f.layers[k] > 0, lp.local_dense(tp, kv) + lp.local_expert(ep, etp), 0))
    layer_unit = unit
    unit = np.maximum(np.maximum(unit, x.emb), x.head)
    # the largest gathered unit's bytes: a decoder layer in its storage dtype (+ FP8 cache) or an edge in BF16
    unit_bytes = np.maximum(layer_unit * (x.layer_pb + x.fp8_w), np.maximum(x.emb, x.head) * opts.param_bytes)
    unit_bytes = np.where(x.layer_pb == opts.param_bytes, unit * (opts.param_bytes + x.fp8_w), unit_bytes)
    t["temporary:zero3_gather"] = np.where(zero_shards(zero, "weights"), opts.zero3_prefetch_units * unit_bytes, 0)
    bucket = opts.grad_bucket_params if opts.grad_bucket_params is not None else np.maximum(40e6, 1e6 * x.zd)
    local = x.dense + x.experts + x.emb + x.head
    layers = sum(f.layers[k] for k in x.kinds) + 0.0
    # the rank's largest model chunk: its layers split evenly over the vpp chunks, with the edge
    # (embedding / head) the rank holds in it (an upper bound for the chunks without one)
    chunk = layer_unit * np.ceil(layers / vpp) + x.emb + x.head
    held = np.where(chunk_windows, np.maximum(opts.grad_buckets_in_flight * bucket, chunk),
                    opts.grad_buckets_in_flight * bucket)
    t["temporary:grad_reduce"] = opts.grad_bytes * np.where(
        zero == 2, np.minimum(held, local), np.where(zero_shards(zero, "weights"), unit, 0))
    ab, h = opts.act_bytes, spec.hidden
    t["temporary:sp_gather"] = np.where(d.sp & (tp > 1), ab * d.tok * h, 0)
    moe_layers = _moe_layers(f)
    if any(split_layer_type(k)[1] == "moe" for k in x.kinds):
        h_e = expert_widths(spec)[0]  # the dispatched row width (LatentMoE: latent-wide rows)
        t["temporary:ep_a2a"] = np.where((ep > 1) & (moe_layers > 0), 2 * ab * routed_tokens(spec, opts, d) * h_e, 0)
    ring, a2a = cp_buffers(attention_terms(spec, opts, d), cp, x.a2a)
    t["temporary:cp_ring"] = ring * spec.has_attention
    if np.any(x.a2a):
        t["temporary:cp_a2a"] = a2a * spec.has_attention
    t["temporary:pp_p2p"] = np.where(pp > 1, 2 * ab * d.tok_rep * h, 0)


def cp_buffers(attn: dict, cp, a2a):
    """(ring, all-to-all) bytes of the context-parallel exchange buffers, each 0 where the layout
    does not use it (``attn``: :func:`dayzero.planner.memory.activations.attention_terms`; ``a2a``: the
    rows with cp_comm a2a). Ring attention double-buffers the K/V blocks it receives: 2 (k + v).
    The all-to-all (Transformer Engine flash_attn_a2a_communicate) makes a contiguous send copy of
    each of q, k, v and receives into a new tensor, while the pre-exchange q, k, v are still held
    by the caller: beyond the received tensors (the core attention's inputs, which the activations
    count at the same bytes as the ring's local q, k, v: s/cp tokens x heads/tp = s tokens x
    heads/(tp cp)) the originals and their send copies, 2 (q + k + v); the output's exchange
    after the attention (2 o) is smaller whenever q + k + v >= o. The core attention's saved
    tensors are the same bytes either way (its log-sum-exp, or the s x s scores of an eager
    kernel, over s/cp queries x heads/tp or s queries x heads/(tp cp))."""
    on = np.asarray(cp) > 1
    if not np.any(a2a):  # every row on the ring
        return np.where(on, 2 * (attn["k"] + attn["v"]), 0), 0.0
    a2a = np.asarray(a2a, dtype=bool)
    return (np.where(on & ~a2a, 2 * (attn["k"] + attn["v"]), 0),
            np.where(on & a2a, 2 * (attn["q"] + attn["k"] + attn["v"]), 0))


def _overhead_terms(opts: MemoryOptions, x: _Candidates, f: RankFeatures, capacity_bytes: float, t: dict) -> None:
    """Runtime context, communicator buffers and allocator fragmentation (of the dynamic terms already in ``t``)."""
    tp, cp, pp, ep = x.tp, x.cp, x.pp, x.ep
    t["overhead:runtime_context"] = opts.runtime_context_bytes + opts.reserved_fraction * capacity_bytes + 0 * f.rank
    has_moe = _moe_layers(f) > 0
    comms = ((tp > 1) * 1 + (cp > 1) + (x.zd > 1) + 2 * (pp > 1) + has_moe * ((ep > 1) * 1 + (x.edp > 1)))
    t["overhead:comm_buffers"] = comms * opts.comm_buffer_bytes
    # Fragmentation comes from the allocations that churn every step: activations and temporaries
    # of varying sizes freed out of order (GMLake, Guo et al. ASPLOS 2024). Model states are a few
    # large tensors allocated once before the first step and never freed (Megatron-Core's
    # contiguous parameter and gradient buffers, the optimizer states): the caching allocator gives
    # each a segment rounded up to 2 MiB (planner.memory.allocator.segment_size), so they leave no holes.
    dynamic = sum(v for k, v in t.items() if k.startswith(("activations:", "temporary:")))
    t["overhead:fragmentation"] = opts.fragmentation_budget * dynamic


def _moe_layers(f: RankFeatures):
    """(1, pp) layers with a MoE feed-forward block on each rank (transformer and hybrid layers)."""
    return sum(v for k, v in f.layers.items() if split_layer_type(k)[1] == "moe")


def category_totals(terms: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    for k, v in terms.items():
        cat = k.split(":", 1)[0]
        out[cat] = out.get(cat, 0.0) + v
    return out
