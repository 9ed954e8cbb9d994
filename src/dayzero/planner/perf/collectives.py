"""Collective cost model: alpha-beta times of NCCL/HCCL-style collectives on a real topology.

Conventions: ``nbytes`` is the size of the whole buffer a rank holds before/after the collective
(the unsharded tensor for reduce-scatter/all-gather, the send buffer for all-to-all); ``bw`` is
the achievable bytes/s per device per direction (nominal x efficiency); ``alpha`` the per-step
latency in seconds. Formulas (Thakur, Rabenseifner & Gropp, "Optimization of Collective
Communication Operations in MPICH", IJHPCA 2005; the same forms as Calculon's network.py and
NCCL's tuning model):

    ring all-reduce       2 (n-1) alpha + 2 (n-1)/n * B / bw
    tree all-reduce       2 ceil(log2 n) alpha + 2 B / bw      (pipelined double binary tree;
                          Sanders, Speck & Traeff 2009)
    reduce-scatter,
    all-gather (ring)     (n-1) alpha + (n-1)/n * B / bw
    all-to-all            alpha + (n-1)/n * B / bw            (grouped send/recv: NCCL and HCCL
                          post every peer's transfer at once, so one latency, not n-1)
    send/recv             alpha + B / bw_p2p

Topology: behind a switch (NVSwitch, NVLink Switch) one device can drive its whole bandwidth to
any peer. On a full mesh (8-card HCCS or Infinity Fabric boards) each peer pair has one link
(``p2p_bw``), so a group of n members can use at most n-1 links: reduce-scatter/all-gather/
all-reduce run the direct mesh algorithm at min(bw, (n-1) p2p_bw), and an all-to-all is limited
by its largest per-peer chunk over one link. Groups that span scale-up domains run
hierarchically: reduce-scatter inside the domain, the collective across domains on 1/per_domain
of the data (each member on its own NIC), all-gather inside the domain.

All functions accept numpy arrays (the search evaluates many layouts at once) and return 0 for
groups of one member.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Link:
    """One interconnect tier as a collective sees it (efficiency already applied)."""

    bw: float  # bytes/s per device per direction, achievable
    p2p_bw: float  # bytes/s per direction to one peer, achievable
    alpha: float  # seconds per algorithm step
    topology: str = "switch"  # switch | mesh | torus (torus is treated as a switch; see docs)

    def group_bw(self, n):
        """Per-device bandwidth available to a group of ``n`` members inside this tier."""
        if self.topology == "mesh":
            return np.minimum(self.bw, np.maximum(np.asarray(n) - 1, 1) * self.p2p_bw)
        return np.full(np.shape(n), self.bw) if np.ndim(n) else self.bw


def _n(n):
    return np.maximum(np.asarray(n, dtype=float), 1.0)


# -- flat formulas (one tier) ---------------------------------------------------------------

def ring_all_reduce(nbytes, n, bw, alpha):
    n = _n(n)
    return np.where(n > 1, 2 * (n - 1) * alpha + 2 * (n - 1) / n * nbytes / bw, 0.0)


def tree_all_reduce(nbytes, n, bw, alpha):
    n = _n(n)
    return np.where(n > 1, 2 * np.ceil(np.log2(n)) * alpha + 2 * nbytes / bw, 0.0)


def all_reduce(nbytes, n, bw, alpha):
    """The faster of ring and tree (what NCCL's tuner picks by message size)."""
    return np.minimum(ring_all_reduce(nbytes, n, bw, alpha), tree_all_reduce(nbytes, n, bw, alpha))


def reduce_scatter(nbytes, n, bw, alpha):
    n = _n(n)
    return np.where(n > 1, (n - 1) * alpha + (n - 1) / n * nbytes / bw, 0.0)


all_gather = reduce_scatter  # same volume and steps, the other direction


def all_to_all(nbytes, n, bw, alpha):
    """All-to-all behind a switch: all peer transfers in flight together."""
    n = _n(n)
    return np.where(n > 1, alpha + (n - 1) / n * nbytes / bw, 0.0)


def all_to_all_mesh(nbytes, n, link_bw, agg_bw, alpha, imbalance=1.0):
    """All-to-all on a full mesh: every peer chunk (B/n, times ``imbalance`` for the busiest
    pair) crosses its own link, and the busiest device's links together carry ``imbalance`` x
    (n-1)/n of B."""
    n = _n(n)
    busiest_pair = imbalance * nbytes / n / link_bw
    # single-member groups (n = 1) move nothing: divide by 1 there instead of 0 (the result is masked);
    # the hot receiver takes ``imbalance`` x its share over all its links together
    aggregate = imbalance * (n - 1) / n * nbytes / np.maximum(np.minimum(agg_bw, (n - 1) * link_bw),
                                                              np.where(n > 1, 0.0, 1.0))
    return np.where(n > 1, alpha + np.maximum(busiest_pair, aggregate), 0.0)


def send_recv(nbytes, bw, alpha):
    return alpha + nbytes / bw


def dedup_all_to_all(up_bytes, out_bytes, size, per_domain, domains, intra: Link, inter: Link | None,
                     imbalance=1.0):
    """A deduplicating dispatch or combine (DeepEP normal kernels, HybridEP;
    :mod:`dayzero.planner.perf.moe_dispatch`): ``up_bytes`` is what one device moves over the scale-up
    fabric (one row per rank its tokens hit, the forwarding to the final rank included), of which
    (per-1)/per leaves the arrival GPU; ``out_bytes`` what it sends over the scale-out network
    (one row per remote domain hit). The two run pipelined (DeepEP overlaps the RDMA sends with
    the NVLink forwarding), so the slower sets the time; the busiest device takes ``imbalance``
    x both."""
    up, out = np.asarray(up_bytes, dtype=float), np.asarray(out_bytes, dtype=float)
    size, per, doms = _n(size), _n(per_domain), _n(domains)
    inter = inter or intra
    if intra.topology == "mesh":
        local = all_to_all_mesh(up, per, intra.p2p_bw, intra.bw, intra.alpha, imbalance)
    else:
        local = all_to_all(imbalance * up, per, intra.group_bw(per), intra.alpha)
    remote = inter.alpha + imbalance * out / inter.bw
    return np.where(size > 1, np.where(doms > 1, np.maximum(local, remote), local), 0.0)


# -- on a topology ---------------------------------------------------------------------------

def group_collective(kind: str, nbytes, size, per_domain, domains, intra: Link, inter: Link | None,
                     imbalance=1.0):
    """Time of one collective of ``kind`` (all_reduce, reduce_scatter, all_gather, all_to_all,
    send_recv) over a group of ``size`` members, ``per_domain`` of them in each of ``domains``
    scale-up domains. Vectorised over every argument but the links."""
    nbytes = np.asarray(nbytes, dtype=float)
    size, per, doms = _n(size), _n(per_domain), _n(domains)
    inter = inter or intra
    if kind == "send_recv":
        # Ring neighbours (CP) and pipeline peers: crossing a domain boundary uses the NIC.
        return np.where(size > 1, np.where(doms > 1, send_recv(nbytes, inter.p2p_bw, inter.alpha),
                                           send_recv(nbytes, intra.p2p_bw, intra.alpha)), 0.0)
    intra_bw = intra.group_bw(per)
    if kind == "all_to_all":
        if intra.topology == "mesh":
            local = all_to_all_mesh(nbytes * per / size, per, intra.p2p_bw, intra.bw, intra.alpha, imbalance)
        else:  # behind a switch the busiest device's port carries imbalance x its share
            local = all_to_all(imbalance * nbytes * per / size, per, intra_bw, intra.alpha)
        # Spanning domains: the remote share (size - per)/size of B leaves through the NIC while
        # the local share moves over the scale-up fabric at the same time.
        remote = inter.alpha + imbalance * (size - per) / size * nbytes / inter.bw
        return np.where(size > 1, np.where(doms > 1, np.maximum(local, remote), local), 0.0)
    flat = {"all_reduce": all_reduce, "reduce_scatter": reduce_scatter, "all_gather": all_gather}[kind]
    one_domain = flat(nbytes, per, intra_bw, intra.alpha)
    across_only = flat(nbytes, doms, inter.bw, inter.alpha)
    if kind == "all_reduce":  # hierarchical: RS inside, AR across on B/per, AG inside
        hier = (2 * reduce_scatter(nbytes, per, intra_bw, intra.alpha)
                + all_reduce(nbytes / per, doms, inter.bw, inter.alpha))
    else:  # RS inside then across on B/per (all-gather: the mirror image)
        hier = reduce_scatter(nbytes, per, intra_bw, intra.alpha) + flat(nbytes / per, doms, inter.bw, inter.alpha)
    return np.where(size <= 1, 0.0, np.where(doms <= 1, one_domain, np.where(per <= 1, across_only, hier)))
