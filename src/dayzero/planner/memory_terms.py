"""Every named term of the memory model, for candidates x pipeline ranks at once.

One function, :func:`stage_terms`, computes all terms with numpy broadcasting: candidate arrays
have shape (n, 1), rank features shape (1, pp) (or (n, pp)), results (n, pp). The scalar
:func:`dayzero.planner.memory.estimate_memory` calls it with n = 1 and the batch path
:func:`dayzero.planner.memory.peak_memory_batch` with n candidates sharing (pp, vpp, schedule),
so both agree by construction. Term names are ``category:term``; docs/memory.md explains each.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dayzero.planner.activations import (
    Dims,
    attention_terms,
    first_stage_terms,
    last_stage_terms,
    layer_activation,
    logits_bytes,
    routed_tokens,
)
from dayzero.planner.memory_options import MemoryOptions
from dayzero.planner.params import edge_params, embed_local, head_local, layer_params
from dayzero.planner.schedule import head_inflight, inflight_microbatches
from dayzero.specs.grid import BF16, FIELDS, FULL, SELECTIVE
from dayzero.specs.model import ModelSpec
from dayzero.specs.parallel import expert_data_parallel, microbatches, zero_sharded, zero_shards

CATEGORIES = ("weights", "gradients", "optimizer", "activations", "temporary", "overhead")
KINDS = ("dense", "moe")
CANDIDATE_KEYS = tuple(f for f in FIELDS if f != "rank_order")  # where the ranks sit changes no byte


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
    return RankFeatures(rank=idx, layers={k: count(per_rank_kinds, k) for k in KINDS},
                        full={k: count(full, k) for k in KINDS},
                        first=(idx == 0).astype(float), last=(idx == pp - 1).astype(float))


def stage_terms(spec: ModelSpec, opts: MemoryOptions, c: dict, f: RankFeatures,
                capacity_bytes: float) -> dict[str, np.ndarray]:
    """All terms (bytes per device) for candidates ``c`` (grid columns of shape (n, 1) keyed by
    CANDIDATE_KEYS, schedule normalised by :func:`dayzero.planner.memory.memory_schedule`) on the
    ranks described by ``f``. FP8 and FP4 GEMMs keep the same FP8 weight cache and activations."""
    tp, pp, dp, cp, ep, etp, vpp = (c[k] for k in ("tp", "pp", "dp", "cp", "ep", "etp", "vpp"))
    zero, rc, sched = c["zero"], c["recompute"], c["schedule"]
    d = Dims(seq=c["seq"], mbs=c["mbs"], tp=tp, cp=cp, etp=etp, sp=c["sequence_parallel"] > 0,
             fp8=c["precision"] != BF16)
    m = microbatches(c["gbs"], c["mbs"], dp)
    zd = dp * cp  # dense ZeRO group: replicas of a dense shard (data x context parallel)
    edp = expert_data_parallel(tp, cp, dp, ep, etp)  # expert ZeRO group
    kv = spec.attention.kv_heads
    kinds = [k for k in KINDS if f.layers[k].any()]
    t: dict[str, np.ndarray] = {}

    # -- model states -----------------------------------------------------------------------
    edge = edge_params(spec)
    emb, head = f.first * embed_local(edge, tp), f.last * head_local(edge, tp, pp)
    dense = sum(f.layers[k] * layer_params(spec, k).local_dense(tp, kv) for k in kinds) + 0.0
    experts = sum(f.layers[k] * layer_params(spec, k).local_expert(ep, etp) for k in kinds) + 0.0

    for cat, nbytes in (("weights", opts.param_bytes), ("gradients", opts.grad_bytes)):
        if cat == "weights" and opts.sharded_params_are_master:
            nbytes = np.where(zero_shards(zero, "weights"), 0,
                              nbytes)  # FSDP2: the sharded copy is the fp32 master itself
        t[f"{cat}:layers"] = nbytes * zero_sharded(dense, cat, zero, zd)
        t[f"{cat}:experts"] = nbytes * zero_sharded(experts, cat, zero, edp)
        t[f"{cat}:embedding"] = nbytes * zero_sharded(emb, cat, zero, zd)
        t[f"{cat}:head"] = nbytes * zero_sharded(head, cat, zero, zd)
    states = zero_sharded(dense + emb + head, "optimizer", zero, zd) + zero_sharded(experts, "optimizer", zero, edp)
    t["optimizer:master"] = opts.master_bytes * states
    t["optimizer:moments"] = opts.optim_bytes * states
    # FP8 training caches an FP8 copy (+ transpose) of each local weight across micro-batches;
    # under ZeRO-3 only the gathered units have one (counted with the gather buffers).
    fp8_w = np.where(d.fp8, opts.fp8_weight_cache_bytes, 0)
    t["weights:fp8_cache"] = np.where(zero_shards(zero, "weights"), 0, fp8_w * (dense + experts))

    # -- activations ------------------------------------------------------------------------
    inflight = inflight_microbatches(sched, pp, vpp, m, f.rank)
    head_mb = head_inflight(sched, m)
    acts = {k: layer_activation(spec, k, opts, d) for k in kinds}
    per_mb = 0.0
    transient = 0.0
    for k in kinds:
        a, n = acts[k], f.layers[k]
        nfull = np.where(rc == FULL, f.full[k], 0)
        per_mb = per_mb + (n - nfull) * np.where(rc == SELECTIVE, a.selective, a.none) + nfull * a.full
        tr = a.largest + np.where(rc == SELECTIVE, a.core, 0) + np.where((rc == FULL) & (nfull > 0), a.none - a.full, 0)
        transient = np.maximum(transient, np.where(n > 0, tr, 0))
    t["activations:layers"] = per_mb * inflight
    t["activations:embedding"] = f.first * sum(first_stage_terms(spec, opts, d).values()) * inflight
    t["activations:head"] = f.last * sum(last_stage_terms(spec, opts, d).values()) * head_mb

    # -- temporary --------------------------------------------------------------------------
    t["temporary:layer_transient"] = transient
    t["temporary:logits"] = f.last * logits_bytes(spec, opts, d) * head_mb
    unit = 0.0  # the largest ZeRO-3 unit (a decoder layer, the embedding or the head), unsharded
    for k in kinds:
        lp = layer_params(spec, k)
        unit = np.maximum(unit, np.where(f.layers[k] > 0, lp.local_dense(tp, kv) + lp.local_expert(ep, etp), 0))
    unit = np.maximum(np.maximum(unit, emb), head)
    t["temporary:zero3_gather"] = np.where(zero_shards(zero, "weights"),
                                           opts.zero3_prefetch_units * unit * (opts.param_bytes + fp8_w), 0)
    bucket = opts.grad_bucket_params if opts.grad_bucket_params is not None else np.maximum(40e6, 1e6 * zd)
    local = dense + experts + emb + head
    t["temporary:grad_reduce"] = opts.grad_bytes * np.where(
        zero == 2, np.minimum(opts.grad_buckets_in_flight * bucket, local), np.where(zero_shards(zero, "weights"), unit,
                                                                                     0))
    ab, h = opts.act_bytes, spec.hidden
    t["temporary:sp_gather"] = np.where(d.sp & (tp > 1), ab * d.tok * h, 0)
    if "moe" in kinds:
        t["temporary:ep_a2a"] = np.where((ep > 1) & (f.layers["moe"] > 0), 2 * ab * routed_tokens(spec, opts, d) * h, 0)
    kv_terms = attention_terms(spec, opts, d)  # ring attention double-buffers the K/V blocks it receives
    t["temporary:cp_ring"] = np.where(cp > 1, 2 * (kv_terms["k"] + kv_terms["v"]), 0)
    t["temporary:pp_p2p"] = np.where(pp > 1, 2 * ab * d.tok_rep * h, 0)

    # -- overhead ---------------------------------------------------------------------------
    t["overhead:runtime_context"] = opts.runtime_context_bytes + opts.reserved_fraction * capacity_bytes + 0 * f.rank
    has_moe = f.layers["moe"] > 0
    comms = ((tp > 1) * 1 + (cp > 1) + (zd > 1) + 2 * (pp > 1) + has_moe * ((ep > 1) * 1 + (edp > 1)))
    t["overhead:comm_buffers"] = comms * opts.comm_buffer_bytes
    # Fragmentation comes from the allocations that churn every step: activations and temporaries
    # of varying sizes freed out of order (GMLake, Guo et al. ASPLOS 2024). Model states are a few
    # large tensors allocated once before the first step and never freed (Megatron-Core's
    # contiguous parameter and gradient buffers, the optimizer states): the caching allocator gives
    # each a segment rounded up to 2 MiB (planner.allocator.segment_size), so they leave no holes.
    dynamic = sum(v for k, v in t.items() if k.startswith(("activations:", "temporary:")))
    t["overhead:fragmentation"] = opts.fragmentation * dynamic
    return t


def category_totals(terms: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    for k, v in terms.items():
        cat = k.split(":", 1)[0]
        out[cat] = out.get(cat, 0.0) + v
    return out
