"""The planner's grid: many ParallelConfigs as numpy columns, one integer per layout and field.

A grid is a ``dict`` of equal-length int64 arrays keyed by :data:`FIELDS`, which are
ParallelConfig's own field names. Numbers stay numbers; the fields that are names are coded as
their index in ParallelConfig's tables:

    recompute          RECOMPUTES   0 none, 1 selective, 2 full
    precision          PRECISIONS   0 bf16, 1 fp8, 2 fp4
    schedule           SCHEDULES    0 1f1b, 1 interleaved, 2 gpipe, 3 dualpipe, 4 dualpipev
    rank_order         RANK_ORDERS  0 tp-cp-dp-pp, then the other 23 orders of the dense dims
    cp_comm            CP_COMMS     0 p2p (ring attention), 1 a2a (Ulysses all-to-all); a grid
                       without it reads as p2p
    sequence_parallel  0 / 1
    recompute_modules  a bitmask over RECOMPUTE_MODULES (bit i: module i; core_attn = 1), the
                       modules selective recompute checkpoints (0 without selective recompute)
    recompute_layers   with full recompute, the first N layers of each model chunk replayed
                       (Megatron's --recompute-method block --recompute-num-layers N); 0 for
                       ParallelConfig's None, every layer
    fp8_param_gather   0 / 1: FP8 parameter storage and FP8 ZeRO all-gathers (a memory switch,
    optimizer_offload  0 / 1: the optimizer on the host; both chosen per row by the search:
                       dayzero.planner.search.switches); a grid without them reads as 0
    activation_offload_layers  the first N layers of each chunk with their saved activations on
                       the host (planner.memory.activation_offload; 0: off; the search sets it where
                       nothing fits without it); a grid without it takes the run's option

``layer_split`` is not a column: a grid row stands for the near-even split
(:func:`dayzero.specs.parallel.even_split`), which is what the vectorised models evaluate.
:func:`columns` is the one-layout form (ints, with -1 for a name outside its table, so that the rules can report it);
:func:`encode` and :func:`decode` go from ParallelConfigs to a grid and back::

    g = encode([ParallelConfig(tp=8, pp=2, dp=4, recompute="full")])
    g["tp"], g["recompute"]          # array([8]), array([2])
    decode(g)[0].recompute           # 'full'
"""

from __future__ import annotations

from dataclasses import fields
from itertools import permutations

import numpy as np

from dayzero.errors import LayoutError
from dayzero.specs.parallel import (
    CP_COMMS,
    DENSE_DIMS,
    DENSE_ORDER,
    PRECISIONS,
    RECOMPUTE_MODULES,
    RECOMPUTES,
    SCHEDULES,
    ParallelConfig,
    order_dims,
)

# every order of the dense dims, the default first (rules decide which of them are allowed)
RANK_ORDERS: tuple[str, ...] = (DENSE_ORDER,) + tuple(
    o for o in ("-".join(p) for p in permutations(DENSE_DIMS)) if o != DENSE_ORDER)
TABLES: dict[str, tuple[str, ...]] = {"recompute": RECOMPUTES, "precision": PRECISIONS, "schedule": SCHEDULES,
                                      "rank_order": RANK_ORDERS, "cp_comm": CP_COMMS}
NOT_COLUMNS = ("layer_split",)
FIELDS: tuple[str, ...] = tuple(f.name for f in fields(ParallelConfig) if f.name not in NOT_COLUMNS)

MASKS: dict[str, tuple[str, ...]] = {"recompute_modules": RECOMPUTE_MODULES}  # tuple fields coded as bitmasks
SWITCHES: tuple[str, ...] = ("fp8_param_gather", "optimizer_offload")  # the memory switches (planner.search.switches)
BOOLS: tuple[str, ...] = ("sequence_parallel", *SWITCHES)  # 0 / 1 columns

# codes the models test against
SELECTIVE, FULL = RECOMPUTES.index("selective"), RECOMPUTES.index("full")
MODULE_BIT = {m: 1 << i for i, m in enumerate(RECOMPUTE_MODULES)}
ONE_F_ONE_B, INTERLEAVED, GPIPE, DUALPIPE, DUALPIPEV = (SCHEDULES.index(s) for s in ("1f1b", "interleaved", "gpipe",
                                                                                      "dualpipe", "dualpipev"))
BF16 = PRECISIONS.index("bf16")
P2P, A2A = CP_COMMS.index("p2p"), CP_COMMS.index("a2a")
# a grid key (not a field): rows whose cp_comm the step-time model chooses, the faster of p2p and
# a2a (planner.context_parallel: the search sets it where an engine runs both and a2a fits); their
# cp_comm column holds p2p until then
CP_OPEN = "cp_open"


def code(field: str, name) -> int:
    """Index of ``name`` in the table of ``field`` (-1 when it is not there)."""
    if field == "rank_order":
        dims = order_dims(name)
        name = "-".join(dims) if dims is not None else None
    table = TABLES[field]
    return table.index(name) if name in table else -1


def module_mask(names) -> int:
    """The bitmask of a module set (-1 when a name is not a module)."""
    if any(m not in MODULE_BIT for m in names):
        return -1
    return sum(MODULE_BIT[m] for m in set(names))


def module_names(mask: int) -> tuple[str, ...]:
    """The module set of a bitmask, in RECOMPUTE_MODULES order."""
    return tuple(m for m, bit in MODULE_BIT.items() if int(mask) & bit)


def recompute_modules(g: dict):
    """The ``recompute_modules`` column of a grid; a grid without it (built by hand) reads as
    Megatron's default: core_attn under selective recompute, nothing otherwise."""
    if "recompute_modules" in g:
        return np.asarray(g["recompute_modules"])
    return np.where(np.asarray(g["recompute"]) == SELECTIVE, MODULE_BIT["core_attn"], 0)


def flag(g: dict, name: str):
    """A 0 / 1 column of :data:`BOOLS` as bools; a grid without it (built by hand) reads as off."""
    if name in g:
        return np.asarray(g[name]) > 0
    return np.zeros(np.shape(np.asarray(g["tp"])), dtype=bool)


def cp_comm_of(g: dict):
    """The ``cp_comm`` column of a grid (:data:`P2P` / :data:`A2A`); a grid without it reads as p2p."""
    if "cp_comm" in g:
        return np.asarray(g["cp_comm"])
    return np.full(np.shape(np.asarray(g["tp"])), P2P, dtype=np.int64)


def recompute_layers(g: dict):
    """The ``recompute_layers`` column of a grid (0: every layer); a grid without it reads as 0."""
    if "recompute_layers" in g:
        return np.asarray(g["recompute_layers"])
    return np.zeros_like(np.asarray(g["tp"]))


def partial_layers(g: dict) -> np.ndarray:
    """(N,) the N of each full(N) row (full recompute of the first N layers of each chunk), else 0
    (every layer under full recompute, or no full recompute)."""
    return np.where(np.asarray(g["recompute"]) == FULL, np.maximum(recompute_layers(g), 0), 0)


# a grid key (not a field): rows whose full recompute replays none of the layers a per-layer model
# prices, the copy planner.perf.perf.partial_recompute prices the layers past the first N of a chunk by
UNREPLAYED = "unreplayed"


def replays_layer(g: dict):
    """(N,) True where full recompute replays the layer a per-layer model prices: the full rows,
    except those marked :data:`UNREPLAYED`."""
    full = np.asarray(g["recompute"]) == FULL
    return full & ~np.asarray(g[UNREPLAYED], dtype=bool) if UNREPLAYED in g else full


def columns(p: ParallelConfig) -> dict[str, int]:
    """One layout as the grid's integers (names outside their tables code as -1)."""
    out = {}
    for f in FIELDS:
        v = getattr(p, f)
        # sizes beyond int64 code as -1 (the degree rules refuse them; encoding must not overflow)
        if f in MASKS:
            out[f] = module_mask(v)
            continue
        if f == "recompute_layers":
            v = 0 if v is None else v
        out[f] = code(f, v) if f in TABLES else (int(v) if -2**62 < int(v) < 2**62 else -1)
    return out


def encode(layouts) -> dict[str, np.ndarray]:
    """ParallelConfigs -> grid. Raises LayoutError for a name outside its table (validate first)."""
    rows = [columns(p) for p in layouts]
    for p, r in zip(layouts, rows):
        bad = [f for f in (*TABLES, *MASKS) if r[f] < 0]
        if bad:
            names = {**TABLES, **MASKS}[bad[0]]
            raise LayoutError(f"cannot encode {p.describe()}: {bad[0]} {getattr(p, bad[0])!r} is not one of "
                              f"{'|'.join(names)}")
    return {f: np.array([r[f] for r in rows], dtype=np.int64) for f in FIELDS}


def decode(grid: dict, index=None) -> list[ParallelConfig]:
    """Grid (or the rows ``index`` of it) -> ParallelConfigs, in row order."""
    n = len(grid["tp"])
    rows = range(n) if index is None else np.asarray(index).ravel()
    out = []
    grid = {**grid, "recompute_layers": recompute_layers(grid),  # a grid built without it: every layer
            "cp_comm": cp_comm_of(grid)}  # without it: ring attention
    grid.update({b: flag(grid, b).astype(np.int64) for b in BOOLS})  # without a switch column: off
    for i in rows:
        kw = {f: int(grid[f][i]) for f in FIELDS}
        for f, table in TABLES.items():
            kw[f] = table[kw[f]]
        kw.update({b: bool(kw[b]) for b in BOOLS})
        kw["recompute_modules"] = module_names(kw["recompute_modules"]) if kw["recompute"] == "selective" else ()
        kw["recompute_layers"] = kw["recompute_layers"] or None
        out.append(ParallelConfig(**kw))
    return out


def default_schedule(vpp):
    """The schedule a layout runs when none is named: interleaved 1F1B with virtual stages, else
    1F1B (ParallelConfig promotes 1f1b to interleaved the same way)."""
    return np.where(np.asarray(vpp) > 1, INTERLEAVED, ONE_F_ONE_B)


def pick(table, index, default=False):
    """``table[index]`` for an int or an array of indices; ``default`` where the index is outside
    the table (-1: a name that is not in it)."""
    index = np.asarray(index)
    inside = (index >= 0) & (index < len(table))
    return np.where(inside, np.asarray(table)[np.where(inside, index, 0)], default)
