"""Expert-parallel load balancing (EPLB): replicate hot experts and pack the replicas onto EP ranks.

Reimplemented from the algorithm description of DeepSeek's EPLB (https://github.com/deepseek-ai/EPLB,
README "Hierarchical Load Balancing" and "Global Load Balancing"; DeepSeek-V3 report arXiv:2412.19437
section 3.4, "redundant experts"). Three greedy steps:

1. **Balanced packing** (used twice): items heaviest first, each onto the least-loaded bin that still
   has a free slot; every bin ends with the same number of items.
2. **Replication**: start with one replica per expert; each spare slot goes to the expert whose
   replicas currently carry the most load (``load / replicas``). A replica's load is its expert's
   load divided by its replica count (the dispatcher splits an expert's tokens evenly).
3. **Hierarchical policy** (the number of nodes divides the number of expert groups): pack the
   expert groups onto nodes (step 1, equal groups per node), replicate inside each node (step 2,
   ``(E + R) / nodes`` slots per node), then pack each node's replicas onto its ranks (step 1,
   ``(E + R) / ep`` slots per rank); an expert's replicas stay inside its group's node, so
   group-limited routing sends no extra traffic across nodes. **Global policy**: replicate over all
   slots and pack onto all ranks (the hierarchical policy with one group and one node).

One deliberate difference: EPLB may put two replicas of one expert on the same GPU; a dayzero
placement keeps replicas on distinct ranks (a second copy on one rank adds no compute balance). So
replication stops at one replica per rank of the node, and packing skips a bin that already holds
the expert, swapping with an earlier item when every open bin holds it (a swap always exists: the
open bin has a free slot, so it holds fewer distinct experts than a full bin without this one).

The balance measured throughout is the EP-rank imbalance ``max_j g_j / mean_j g_j`` with
``g_j = sum over rank j's slots of load_e / replicas_e`` (research/moe_and_ops.md section 1.1): the
busiest rank sets the pace of the grouped GEMMs and the all-to-all. Pure numpy; no torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from dayzero.errors import DayzeroError
from dayzero.specs.expert_loads import ExpertLoads
from dayzero.specs.placement import Placement, Slots, contiguous_slots

Policy = Literal["hierarchical", "global"]


class BalanceError(DayzeroError):
    """The EP size, node count, group count or redundant-expert count cannot be balanced."""


def balanced_packing(weights: np.ndarray, bins: int, labels: np.ndarray | None = None) -> list[list[int]]:
    """Item indices per bin: heaviest first onto the least-loaded bin with a free slot, ``len/bins``
    items per bin (ties: the lower bin). Items sharing a ``label`` (replicas of one expert) never
    share a bin."""
    n = len(weights)
    if bins < 1 or n % bins:
        raise BalanceError(f"cannot pack {n} items into {bins} bins of equal size")
    per = n // bins
    labels = np.arange(n) if labels is None else labels
    weights = np.asarray(weights, dtype=float)
    order = np.argsort(-weights, kind="stable")
    packs: list[list[int]] = [[] for _ in range(bins)]
    homes: dict[int, set[int]] = {}  # label -> bins holding it
    load, size = np.zeros(bins), np.zeros(bins, dtype=int)
    for i in order:
        label = int(labels[i])
        open_ = size < per
        free = open_.copy()
        free[list(homes.get(label, ()))] = False
        if free.any():
            b = int(np.argmin(np.where(free, load, np.inf)))  # argmin: the lowest bin among ties
            packs[b].append(int(i))
            homes.setdefault(label, set()).add(b)
            load[b] += weights[i]
            size[b] += 1
            continue
        # every open bin already holds this label: move an item x of a full bin f (without the
        # label) into the lightest open bin, and put item i in its place
        b = int(np.argmin(np.where(open_, load, np.inf)))
        held_b = {int(labels[j]) for j in packs[b]}
        swaps = [(f, k) for f in range(bins) if not open_[f] and f not in homes[label]
                 for k, x in enumerate(packs[f]) if int(labels[x]) not in held_b]
        f, k = min(swaps, key=lambda fk: (max(load[fk[0]] - weights[packs[fk[0]][fk[1]]] + weights[i],
                                              load[b] + weights[packs[fk[0]][fk[1]]]), fk))
        x = packs[f][k]
        packs[f][k] = int(i)
        packs[b].append(x)
        homes[int(labels[x])] = (homes[int(labels[x])] - {f}) | {b}
        homes[label].add(f)
        load[f] += weights[i] - weights[x]
        load[b] += weights[x]
        size[b] += 1
    return packs


def replicate(weights: np.ndarray, slots: int, max_copies: int) -> np.ndarray:
    """Replica count per expert for ``slots`` slots: each spare slot to the expert with the highest
    per-replica load (ties: the lower id), at most ``max_copies`` replicas each."""
    counts = np.ones(len(weights), dtype=int)
    w = np.asarray(weights, dtype=float)
    for _ in range(slots - len(w)):
        per = np.where(counts < max_copies, w / counts, -np.inf)
        counts[int(np.argmax(per))] += 1
    return counts


def _pack_replicas(weights: np.ndarray, experts: np.ndarray, counts: np.ndarray, ranks: int) -> list[list[int]]:
    """Expert ids per rank: each expert's replicas (load ``w / count``) packed onto ``ranks`` bins."""
    ids = np.repeat(experts, counts)
    loads = np.repeat(weights / counts, counts)
    return [[int(ids[i]) for i in pack] for pack in balanced_packing(loads, ranks, labels=ids)]


def check_shape(experts: int, ep: int, nodes: int, redundant: int, groups: int, policy: Policy) -> None:
    """One BalanceError with the numbers that disagree, or nothing."""
    if min(experts, ep, nodes, groups) < 1 or redundant < 0:
        raise BalanceError(f"need experts, --ep, --nodes, --groups >= 1 and --redundant >= 0; got experts={experts}, "
                           f"ep={ep}, nodes={nodes}, groups={groups}, redundant={redundant}")
    if (experts + redundant) % ep:
        raise BalanceError(f"--ep {ep} does not divide experts + redundant = {experts} + {redundant} = "
                           f"{experts + redundant}; every rank needs the same number of slots")
    if ep % nodes:
        raise BalanceError(f"--nodes {nodes} does not divide --ep {ep}; every node needs the same number of ranks")
    if experts % groups:
        raise BalanceError(f"--groups {groups} does not divide the {experts} experts; groups are equal-sized")
    if policy == "hierarchical" and groups % nodes:
        raise BalanceError(f"the hierarchical policy needs --nodes {nodes} to divide --groups {groups}; "
                           "use --policy global")
    per_rank = ep // nodes if policy == "hierarchical" else ep
    if experts + redundant > experts * per_rank:
        where = "per node" if policy == "hierarchical" and nodes > 1 else "in all"
        raise BalanceError(f"{redundant} redundant slots would put an expert twice on one rank: at most "
                           f"{experts * (per_rank - 1)} with {per_rank} ranks {where}")


def place_layer(weights: np.ndarray, ep: int, nodes: int, redundant: int, groups: int = 1,
                policy: Policy = "hierarchical") -> Slots:
    """The slots (expert ids per EP rank) for one layer's expert loads ``weights`` (E,)."""
    w = np.asarray(weights, dtype=float)
    experts = len(w)
    check_shape(experts, ep, nodes, redundant, groups, policy)
    if policy == "global":
        nodes, groups = 1, 1
    size = experts // groups
    group_load = w.reshape(groups, size).sum(axis=1)
    node_groups = balanced_packing(group_load, nodes)
    per_node_slots, per_node_ranks = (experts + redundant) // nodes, ep // nodes
    slots: list[tuple[int, ...]] = []
    for members in node_groups:  # node n's ranks are n * ep/nodes .. (n+1) * ep/nodes - 1
        local = np.concatenate([np.arange(g * size, (g + 1) * size) for g in members])
        counts = replicate(w[local], per_node_slots, per_node_ranks)
        slots.extend(tuple(r) for r in _pack_replicas(w[local], local, counts, per_node_ranks))
    # greedy packing is a heuristic: without spare slots, keep the default when it is better (it also
    # keeps every group inside one node, since a node's E/nodes contiguous experts are whole groups)
    if redundant == 0 and experts % ep == 0:
        base = contiguous_slots(experts, ep)
        if rank_loads(w, base).max() <= rank_loads(w, tuple(slots)).max():
            return base
    return tuple(slots)


def rank_loads(weights: np.ndarray, slots: Slots) -> np.ndarray:
    """Load per EP rank (ep,): the sum of ``load_e / replicas_e`` over the rank's slots."""
    w = np.asarray(weights, dtype=float)
    counts = np.zeros(len(w))
    for ids in slots:
        counts[list(ids)] += 1
    return np.array([sum(w[e] / counts[e] for e in ids) for ids in slots])


def rank_imbalance(weights: np.ndarray, slots: Slots) -> float:
    """max / mean rank load; 1.0 for a layer without load."""
    g = rank_loads(weights, slots)
    return float(g.max() / g.mean()) if g.mean() > 0 else 1.0


@dataclass(frozen=True)
class LayerBalance:
    layer: int  # global layer index
    mean: float  # mean tokens per rank (the same under any placement)
    max_after: float  # busiest rank's tokens under the EPLB placement
    max_before: float | None  # ... under the contiguous default (None when ep does not divide the experts)

    @property
    def after(self) -> float:
        return self.max_after / self.mean if self.mean > 0 else 1.0

    @property
    def before(self) -> float | None:
        if self.max_before is None:
            return None
        return self.max_before / self.mean if self.mean > 0 else 1.0

    def to_json(self) -> dict:
        cut = 1.0 - self.max_after / self.max_before if self.max_before else None
        return {"layer": self.layer, "mean_rank_load": self.mean, "max_rank_load_before": self.max_before,
                "max_rank_load_after": self.max_after, "max_mean_before": self.before, "max_mean_after": self.after,
                "max_rank_load_reduction": cut}


def _summary(values: list[float | None]) -> dict:
    if any(v is None for v in values):
        return {"worst": None, "mean": None}
    return {"worst": max(values), "mean": float(np.mean(values))}


@dataclass(frozen=True)
class Rebalance:
    placement: Placement
    policy: Policy
    groups: int
    nodes: int
    layers: tuple[LayerBalance, ...]
    loads: dict | None = None  # where the loads came from: source, layers, snapshots

    def to_json(self) -> dict:
        return {"loads": self.loads, "policy": self.policy, "experts": self.placement.experts, "ep": self.placement.ep,
                "nodes": self.nodes, "groups": self.groups, "redundant": self.placement.redundant,
                "slots_per_rank": self.placement.slots_per_rank,
                "max_mean_before": _summary([x.before for x in self.layers]),
                "max_mean_after": _summary([x.after for x in self.layers]),
                "layers": [x.to_json() for x in self.layers], "placement": self.placement.to_json()}


def rebalance(layers: tuple[int, ...], matrix: np.ndarray, ep: int, nodes: int = 1, redundant: int = 0,
              groups: int | None = None, policy: Policy | None = None) -> Rebalance:
    """EPLB placement for a (layers x experts) load ``matrix`` whose rows are the global layer indices
    ``layers``; ``groups`` defaults to one group per expert, ``policy`` to hierarchical when the
    nodes divide the groups (the README's rule), else global. "Before" is the contiguous default
    placement (expert e on rank e // (E / ep))."""
    m = np.asarray(matrix, dtype=float)
    experts = m.shape[1]
    groups = experts if groups is None else groups
    policy = policy or ("hierarchical" if groups % nodes == 0 else "global")
    check_shape(experts, ep, nodes, redundant, groups, policy)
    base = contiguous_slots(experts, ep) if experts % ep == 0 else None
    placed, stats = [], []
    for layer, w in zip(layers, m):
        slots = place_layer(w, ep, nodes, redundant, groups, policy)
        after = rank_loads(w, slots)
        before = float(rank_loads(w, base).max()) if base is not None else None
        placed.append((int(layer), slots))
        stats.append(LayerBalance(int(layer), float(after.mean()), float(after.max()), before))
    return Rebalance(Placement(experts, ep, tuple(sorted(placed))), policy, groups, nodes, tuple(stats))


def rebalance_loads(loads: ExpertLoads, ep: int, nodes: int = 1, redundant: int = 0, groups: int | None = None,
                    policy: Policy | None = None) -> Rebalance:
    """:func:`rebalance` of measured loads, remembering where they came from."""
    r = rebalance(loads.layers, np.array(loads.matrix), ep, nodes, redundant, groups, policy)
    info = {"source": loads.source, "layers": list(loads.layers), "experts": loads.experts,
            "snapshots": loads.snapshots}
    return Rebalance(r.placement, r.policy, r.groups, r.nodes, r.layers, info)
