"""Layer split balanced by memory: contiguous layers per pipeline stage minimising the peak stage.

Stage 0 holds the embedding and the most in-flight micro-batches, the last stage the head and the
logits, so an even split is rarely the best one. Every (stage, first layer, layer count) total is
evaluated in one vectorised call of the memory model, then a min-max dynamic program over
contiguous splits picks the one with the lowest peak (ties: the most even).
"""

from __future__ import annotations

import numpy as np

from dayzero.errors import LayoutError
from dayzero.planner.memory.memory import MemoryOptions, candidate
from dayzero.planner.memory.memory_terms import KINDS, RankFeatures, category_totals, stage_terms
from dayzero.specs.model import ModelSpec
from dayzero.specs.parallel import ParallelConfig


def _totals_for_rank(spec: ModelSpec, p: ParallelConfig, rank: int, capacity: float,
                     options: MemoryOptions) -> np.ndarray:
    """(L+1, L+1) array: total bytes of ``rank`` holding layers [start, start + n); inf where out of range."""
    layers = spec.layers
    starts, counts = np.meshgrid(np.arange(layers + 1), np.arange(layers + 1), indexing="ij")
    ok = starts + counts <= layers
    s, n = starts[ok], counts[ok]
    types = spec.layer_types
    names = list(KINDS) + sorted(set(types) - set(KINDS))  # dense, moe and a hybrid's own layer types
    kinds = np.array([[k == kind for k in types] for kind in names], dtype=float)  # (K, L)
    prefix = np.concatenate([np.zeros((len(names), 1)), np.cumsum(kinds, axis=1)], axis=1)  # (K, L+1)
    full_n = n if p.recompute_layers is None else np.minimum(n, p.recompute_layers)
    cols = len(s)
    feats = RankFeatures(
        rank=np.full((1, cols), float(rank)),
        layers={k: (prefix[i, s + n] - prefix[i, s])[None, :] for i, k in enumerate(names)},
        full={k: (prefix[i, s + full_n] - prefix[i, s])[None, :] for i, k in enumerate(names)},
        first=np.full((1, cols), float(rank == 0)), last=np.full((1, cols), float(rank == p.pp - 1)))
    total = sum(category_totals(stage_terms(spec, options, candidate(p), feats, capacity)).values())
    out = np.full((layers + 1, layers + 1), np.inf)
    out[s, n] = np.broadcast_to(total, (1, cols))[0]
    return out


def balance_layers(spec: ModelSpec, parallel: ParallelConfig, capacity_bytes: int,
                   options: MemoryOptions = MemoryOptions()) -> tuple[int, ...]:
    """Layers per pipeline stage (vpp = 1) that minimise the busiest stage's memory."""
    p = parallel
    if p.vpp > 1:
        raise LayoutError(f"memory balancing splits one chunk per rank; got vpp {p.vpp} (use --vpp 1 or --layer-split)")
    if p.pp > spec.layers:
        raise LayoutError(f"pp {p.pp} exceeds the {spec.layers} layers of {spec.name}")
    L, pp = spec.layers, p.pp
    totals = [_totals_for_rank(spec, p.with_(layer_split=None), r, float(capacity_bytes), options) for r in range(pp)]
    # best[r][start]: lowest achievable peak of ranks r..pp-1 covering layers start..L-1
    best = np.full((pp + 1, L + 1), np.inf)
    best[pp, L] = 0.0
    choice = np.zeros((pp, L + 1), dtype=int)
    even = L / pp
    for r in range(pp - 1, -1, -1):
        for start in range(L + 1):
            n = np.arange(L + 1 - start)
            peak = np.maximum(totals[r][start, n], best[r + 1, start + n])
            if not np.isfinite(peak).any():
                continue
            lowest = peak.min()
            ties = np.flatnonzero(peak <= lowest * (1 + 1e-12))
            pick = ties[np.argmin(np.abs(ties - even))]
            best[r, start], choice[r, start] = lowest, pick
    split, start = [], 0
    for r in range(pp):
        split.append(int(choice[r, start]))
        start += split[-1]
    return tuple(split)
