"""Pipeline schedules: the order of forward/backward passes on a rank, and how many micro-batches'
activations a rank holds at its peak.

- GPipe (Huang et al. 2019): all m forwards, then all backwards: every rank holds m micro-batches.
- 1F1B (PipeDream-Flush, Narayanan et al. 2021): rank r runs min(pp - r - 1, m) warm-up forwards,
  then alternates one forward and one backward: it holds min(pp - r, m) micro-batches at its peak.
- Interleaved 1F1B (Megatron, vpp model chunks per rank): rank r warms up with
  2 (pp - r - 1) + (vpp - 1) pp chunk-forwards, so it holds up to that + 1 chunks of L/(pp vpp)
  layers. For rank 0 that is pp (1 + (pp - 1)/(pp vpp)) micro-batches' worth of its layers:
  Korthikanti et al. 2022's interleaving factor 1 + (p - 1)/(p v).

``inflight_*`` are numpy-compatible (arrays of candidates x ranks broadcast); schedules are the
grid's codes (:mod:`dayzero.specs.grid`: 0 1f1b, 1 interleaved, 2 gpipe).
"""

from __future__ import annotations

import numpy as np

from dayzero.specs.grid import GPIPE, INTERLEAVED, ONE_F_ONE_B
from dayzero.specs.grid import code as code_of


def effective_schedule(code, vpp):
    """The schedule that really runs: interleaved 1F1B with one model chunk per rank is 1F1B."""
    code = np.asarray(code)
    return np.where((code == INTERLEAVED) & (np.asarray(vpp) == 1), ONE_F_ONE_B, code)


def warmup_chunks(code, pp, vpp, m, rank):
    """Chunk-forwards a rank runs before its first backward (Megatron's num_warmup_microbatches)."""
    total = np.asarray(m) * vpp
    interleaved = effective_schedule(code, vpp) == INTERLEAVED
    w = np.where(interleaved, 2 * (np.asarray(pp) - rank - 1) + (np.asarray(vpp) - 1) * pp, np.asarray(pp) - rank - 1)
    w = np.where(np.asarray(code) == GPIPE, total, w)
    return np.minimum(w, total)


def inflight_chunks(code, pp, vpp, m, rank):
    """Model chunks whose activations a rank holds at its peak (one more than the warm-up when a
    steady state exists: its next forward runs before the first backward frees anything)."""
    total = np.asarray(m) * vpp
    return np.minimum(warmup_chunks(code, pp, vpp, m, rank) + 1, total)


def inflight_microbatches(code, pp, vpp, m, rank):
    """Micro-batches' worth of this rank's layers held at its peak (chunks / vpp; may be fractional)."""
    return inflight_chunks(code, pp, vpp, m, rank) / np.asarray(vpp)


def head_inflight(code, m):
    """Micro-batches whose logits the last stage holds: its loss backward follows each forward
    immediately except under GPipe, where all m forwards run first."""
    return np.where(np.asarray(code) == GPIPE, m, 1)


def step_order(schedule: str, pp: int, vpp: int, m: int, rank: int) -> list[tuple[str, int, int]]:
    """The passes of one training step on ``rank``: ("F" | "B", micro-batch, model chunk)."""
    sched = int(effective_schedule(code_of("schedule", schedule), vpp))
    total = m * vpp
    if sched == GPIPE:
        return [("F", i, c) for c in range(vpp) for i in range(m)] + \
               [("B", i, c) for c in reversed(range(vpp)) for i in range(m)]

    def chunk(k: int, forward: bool) -> tuple[int, int]:
        if sched == ONE_F_ONE_B:
            return k, 0
        group, pos = divmod(k, pp * vpp)
        c = pos // pp
        return group * pp + pos % pp, (c if forward else vpp - 1 - c)

    warm = int(warmup_chunks(sched, pp, vpp, m, rank))
    order = [("F", *chunk(k, True)) for k in range(warm)]
    for i in range(total - warm):
        order.append(("F", *chunk(warm + i, True)))
        order.append(("B", *chunk(i, False)))
    order += [("B", *chunk(k, False)) for k in range(total - warm, total)]
    return order
