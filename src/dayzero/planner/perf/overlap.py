"""Overlap windows: what a window of compute can hide of the collectives that run beside it.

Each collective of :mod:`dayzero.planner.perf.comm` is first priced against its own window (TP
under userbuffers against the layer's GEMMs, the CP ring against the attention core, the EP
all-to-all against another micro-batch's layer, the ZeRO-3 prefetch against the layer it runs
beside, the DP gradient reduce against the last backward). Two rules then hold for every window,
whatever the collective:

1. **Links are shared** (:func:`shared_links`). Collectives that run in the same window and cross
   the same tier (the scale-up fabric: NVLink / HCCS; the scale-out NIC) share its bandwidth.
   Whether the engine's streams serialise them or the fabric shares it max-min fairly, the last
   byte leaves after the sum of their bytes over the tier's bandwidth, i.e. after the sum of the
   times each would take alone; so the tier's collectives cannot hide more than the window: the
   exposed time of a tier is at least its summed busy time minus the window. Tiers are separate
   links and run concurrently. A collective spanning domains is counted on the NIC, its
   bottleneck (:func:`dayzero.planner.perf.collectives.group_collective` prices it so).

2. **Overlap is not free for compute** (:func:`sm_floor`). A communication kernel that overlaps
   compute holds part of the device's SMs (AI cores) while it runs, so the compute beside it runs
   at 1 - f for as long: a hidden collective of c seconds still adds f x c
   (:func:`dayzero.planner.perf.comm.overlapped_exposed`, the rule the EP all-to-all already
   followed). f per library, in SMs of an H100's 132 (:data:`COMM_SMS`), scaled to the
   accelerator by the cluster's ``comm_sm_fraction`` (DeepEP's 20 SMs as the unit).
"""

from __future__ import annotations

import numpy as np

# SMs a library's communication kernels hold while they run (of an H100's 132):
# - deepep: DeepEP's dispatch/combine, deep_ep/buffer.py Buffer.num_sms = 20; Megatron-Core
#   TransformerConfig.moe_deepep_num_sms = 20 (megatron/core/transformer/transformer_config.py)
# - userbuffers: Transformer Engine's TP comm/GEMM overlap (transformer_engine/pytorch/module/base.py
#   initialize_ub's default config: "num_sm": 1 for the ring_exchange method (copy engines move the
#   data: the all-gather side, qkv/fc1 fprop and proj/fc2 dgrad), 16 for pipeline and bulk (the
#   reduce-scatter side and the backward's bulk overlaps)): 8.5 on average over the two halves
# - nccl: one CTA (one SM) per NCCL channel; NCCL opens 2 channels per network peer
#   (NCCL_NCHANNELS_PER_NET_PEER, default 2, https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html)
#   over the 8 NICs of a DGX H100 node: 16
COMM_SMS = {"deepep": 20.0, "userbuffers": 8.5, "nccl": 16.0}
UNIT_SMS = COMM_SMS["deepep"]  # PerfConstants.comm_sm_fraction is DeepEP's share of the device


def sm_share(library: str, comm_sm_fraction: float) -> float:
    """The share of the device's SMs ``library``'s kernels hold, on an accelerator where DeepEP's
    hold ``comm_sm_fraction`` (PerfConstants.comm_sm_fraction)."""
    return comm_sm_fraction * COMM_SMS[library] / UNIT_SMS


def sm_floor(busy, exposed, share):
    """Exposed seconds of an overlapped collective of ``busy`` seconds at least ``share`` x busy:
    what its SMs take from the compute it overlaps (module docstring, rule 2)."""
    return np.maximum(exposed, share * np.asarray(busy))


def tier_of(domains) -> np.ndarray:
    """(N,) 1 where a group spans scale-up domains (its collectives cross the NIC), else 0."""
    return (np.asarray(domains) > 1).astype(np.int64)


def shared_links(busy: list, exposed: list, tiers: list, window) -> list:
    """Rule 1 of the module docstring over one window: ``busy`` and ``exposed`` seconds of each
    collective in the window (arrays of one shape), ``tiers`` the tier each crosses (arrays
    broadcastable to it), ``window`` the compute they run beside. Per tier, the summed exposed time
    is raised to the summed busy time minus the window where that is more; the difference is shared
    among the tier's collectives by their busy time (none above its busy time). Returns the new
    exposed arrays."""
    if not busy:
        return []
    shape = np.broadcast_shapes(*(np.shape(x) for x in (*busy, *exposed, *tiers)), np.shape(window))
    busy = [np.broadcast_to(np.asarray(b, dtype=float), shape) for b in busy]
    out = [np.broadcast_to(np.asarray(e, dtype=float), shape).copy() for e in exposed]
    tiers = [np.broadcast_to(np.asarray(t), shape) for t in tiers]
    for t in (0, 1):  # tier_of's codes: scale-up, scale-out
        on = [tr == t for tr in tiers]
        load = sum(np.where(o, b, 0.0) for o, b in zip(on, busy))
        own = sum(np.where(o, e, 0.0) for o, e in zip(on, out))
        deficit = np.maximum(0.0, load - np.asarray(window) - own)
        for i, (o, b) in enumerate(zip(on, busy)):
            add = np.where(o & (load > 0), deficit * b / np.maximum(load, 1e-30), 0.0)
            out[i] = np.minimum(out[i] + add, b)
    return out
