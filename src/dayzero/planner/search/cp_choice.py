"""Which context-parallel exchange (ParallelConfig.cp_comm) the search gives a layout.

The exchange changes the step's cp communication (planner.perf.comm: the ring's overlapped K/V hops,
or Ulysses' exposed all-to-alls) and the exchange buffers (planner.memory.memory_terms.cp_buffers), and
nothing else: the attention's FLOPs are the same. So the search never enumerates both:

* where the engine (the pinned ``--engine``, else every engine) runs only one of them (or
  ``--cp-comm`` pins one: SearchSpace.cp_comm), every
  cp > 1 base takes that one (:func:`with_cp_comm`; DeepSpeed runs only a2a, torchtitan only the
  ring), and a base the heads cannot split that way is left out;
* where a2a is also run, the heads split over cp (layout_rules.ulysses_heads_ok) and the layout
  still fits with a2a's buffers, the row is left open (:data:`~dayzero.specs.grid.CP_OPEN`,
  :func:`open_rows`) and the step-time model times it with the faster exchange
  (planner.perf.comm.choose_cp_comm).
"""

from __future__ import annotations

import numpy as np

from dayzero.errors import LayoutError
from dayzero.specs.grid import A2A, P2P
from dayzero.specs.layout_rules import field_problems, mask, rules_reading, ulysses_heads_ok
from dayzero.specs.model import ModelSpec
from dayzero.specs.parallel import CP_COMMS


def runs(engine: str | None, switches: dict | None = None, allowed: tuple[str, ...] | None = None) -> tuple[bool, bool]:
    """(p2p, a2a): whether ``engine`` (None: some engine) runs context parallelism by each exchange,
    by its limits (planner.engines) on a cp 2 layout, and the search may try it (``allowed``: the
    pinned ``--cp-comm`` exchanges, None: both)."""
    from dayzero.planner.engines import ENGINES, engine_mask

    probe = {"cp": np.array([2, 2]), "cp_comm": np.array([P2P, A2A])}
    names = [engine] if engine else list(ENGINES)
    ok = np.zeros(2, dtype=bool)
    for e in names:
        ok |= engine_mask(e, probe, switches)
    if allowed is not None:
        ok &= np.array([CP_COMMS[P2P] in allowed, CP_COMMS[A2A] in allowed])
    return bool(ok[0]), bool(ok[1])


def with_cp_comm(spec: ModelSpec, bases: dict, devices: int, engine: str | None,
                 switches: dict | None = None, allowed: tuple[str, ...] | None = None) -> tuple[dict, int]:
    """``bases`` with their ``cp_comm`` column (p2p, or a2a on cp > 1 rows where only a2a is run
    and allowed: :func:`runs`) and the number of bases left out: cp > 1 bases whose heads do not
    split over cp where a2a is the only exchange, every cp > 1 base where neither is."""
    for name in allowed or ():
        bad = field_problems("cp_comm", name)
        if bad:
            raise LayoutError(f"search space: cp_comm option {name!r}: {'; '.join(bad)}")
    p2p, a2a = runs(engine, switches, allowed)
    cp = np.asarray(bases["cp"])
    only_a2a = a2a and not p2p
    out = {**bases, "cp_comm": np.where((cp > 1) & only_a2a, A2A, P2P).astype(np.int64)}
    if p2p:
        return out, 0
    ok = cp == 1
    if only_a2a:
        ok = mask(out, spec, devices, tuple(r for r in rules_reading(out, spec, devices) if "cp_comm" in r.reads))
    return {k: v[ok] for k, v in out.items()}, int((~ok).sum())


def open_rows(spec: ModelSpec, cand: dict, engine: str | None, switches: dict | None = None,
              allowed: tuple[str, ...] | None = None) -> np.ndarray:
    """(N,) the ring (p2p) rows of ``cand`` that could run as a2a too: cp > 1, the heads split over
    cp, and the engine (None: some engine) runs the row with a2a. The memory check is the caller's."""
    from dayzero.planner.engines import ENGINES, engine_mask

    cp, tp = np.asarray(cand["cp"]), np.asarray(cand["tp"])
    rows = (cp > 1) & (np.asarray(cand.get("cp_comm", np.zeros_like(cp))) == P2P) & spec.has_attention
    if not rows.any() or not all(runs(engine, switches, allowed)):
        return np.zeros_like(rows)
    rows &= ulysses_heads_ok(spec, tp, cp)
    a2a = {**cand, "cp_comm": np.full(len(cp), A2A, dtype=np.int64)}
    ran = np.zeros_like(rows)
    for e in ([engine] if engine else list(ENGINES)):
        ran |= engine_mask(e, a2a, switches)
    return rows & ran
