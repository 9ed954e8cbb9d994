"""Per-device, per-pipeline-stage memory of a training step, for any parallel layout.

Six categories per stage (docs/memory.md has every term and its source):
    weights      BF16 working parameters of the stage's layers (+ embedding / head), ZeRO-3 sharded
    gradients    the gradient buffer (FP32 by default), ZeRO-2 sharded
    optimizer    FP32 master weights + AdamW moments, ZeRO-1 sharded (over dp*cp; experts over edp)
    activations  saved tensors of the micro-batches in flight under the pipeline schedule
    temporary    logits + loss, ZeRO-3 gather buffers, DP gradient buckets, TP/SP, EP, CP and PP
                 communication buffers, the largest transient of a layer
    overhead     runtime context, communicator buffers, allocator fragmentation (explicit terms)

Example (16 ranks, tp 2, pp 2, dp 4): ``estimate_memory(load_model("llama-3.1-8b"),
ParallelConfig(tp=2, pp=2, dp=4, gbs=64), 80e9).stages[0].total`` is rank 0's bytes: the
embedding, half the layers, and min(pp, m) = 2 micro-batches of activations.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from functools import lru_cache

import numpy as np

from dayzero.errors import LayoutError
from dayzero.planner.memory.activation_offload import COLUMN as OFFLOAD_COLUMN
from dayzero.planner.memory.memory_options import MemoryOptions
from dayzero.planner.memory.memory_terms import (
    CANDIDATE_KEYS,
    CATEGORIES,
    RECOMPUTE_EXCESS,
    RankFeatures,
    category_totals,
    rank_features,
    stage_terms,
)
from dayzero.planner.schedule import PLACEMENTS, effective_schedule, pipeline_groups, placement_code
from dayzero.specs import layout_rules
from dayzero.specs.grid import SWITCHES, encode, flag, partial_layers, recompute_layers, recompute_modules
from dayzero.specs.model import ModelSpec
from dayzero.specs.parallel import ParallelConfig, model_split, stage_ranks, zero_sharded

_DYNAMIC = ("activations:", "temporary:")  # the terms the allocator's fragmentation budget is on

__all__ = ["MemoryOptions", "StageMemory", "MemoryReport", "estimate_memory", "peak_memory_batch",
           "optimizer_host_batch", "model_states", "zero_comparison", "CATEGORIES"]


@dataclass(frozen=True)
class StageMemory:
    stage: int  # pipeline rank 0..pp-1
    layers: tuple[int, ...]  # decoder layers on this rank (all virtual stages)
    weights: int
    gradients: int
    optimizer: int
    activations: int
    temporary: int
    overhead: int
    terms: dict = field(default_factory=dict, compare=False)  # "category:term" -> bytes

    @property
    def total(self) -> int:
        return sum(getattr(self, c) for c in CATEGORIES)

    @property
    def model_states(self) -> int:
        return self.weights + self.gradients + self.optimizer

    def to_dict(self, terms: bool = False) -> dict:
        d = {"stage": self.stage, **{c: getattr(self, c) for c in CATEGORIES}, "total": self.total,
             "layers": list(self.layers)}
        if terms:
            d["terms"] = dict(self.terms)
        return d


@dataclass(frozen=True)
class MemoryReport:
    stages: tuple[StageMemory, ...]
    capacity_bytes: int

    @property
    def peak_bytes(self) -> int:
        return max(s.total for s in self.stages)

    @property
    def busiest_stage(self) -> int:
        return max(self.stages, key=lambda s: s.total).stage

    @property
    def utilization(self) -> float:
        return self.peak_bytes / self.capacity_bytes if self.capacity_bytes else float("inf")

    @property
    def fits(self) -> bool:
        return self.peak_bytes <= self.capacity_bytes

    def to_dict(self, terms: bool = False) -> dict:
        """The ``memory`` object of ``dayzero predict --json`` (plus ``fits``)."""
        return {"peak_bytes": self.peak_bytes, "capacity_bytes": self.capacity_bytes,
                "utilization": self.utilization, "stages": [s.to_dict(terms) for s in self.stages],
                "fits": self.fits}


# -- the scalar path ---------------------------------------------------------------------------

def candidate(p: ParallelConfig) -> dict[str, np.ndarray]:
    """One layout as the (1, 1) columns :func:`stage_terms` broadcasts against its ranks."""
    return memory_columns(encode([p]), (1, 1))


def memory_columns(grid: dict, shape) -> dict[str, np.ndarray]:
    """The grid columns the memory terms read, reshaped to ``shape``, with the schedule that
    really runs (:func:`dayzero.planner.schedule.effective_schedule`)."""
    if "recompute_modules" not in grid and "recompute" in grid:  # a grid built by hand: Megatron's default
        grid = {**grid, "recompute_modules": recompute_modules(grid)}
    if "recompute_layers" not in grid and "tp" in grid:  # a grid built by hand: full on every layer
        grid = {**grid, "recompute_layers": recompute_layers(grid)}
    if "tp" in grid and any(s not in grid for s in SWITCHES):  # a grid built by hand: the switches off
        grid = {**grid, **{s: flag(grid, s).astype(np.int64) for s in SWITCHES}}
    missing = [k for k in CANDIDATE_KEYS if k not in grid]
    if missing:
        raise LayoutError(f"memory planner: grid lacks {', '.join(missing)}; give equal-length arrays for "
                          f"{', '.join(CANDIDATE_KEYS)} (dayzero.specs.grid.encode builds them)")
    cols = {k: np.asarray(grid[k], dtype=np.int64).reshape(shape) for k in CANDIDATE_KEYS}
    if "cp_comm" in grid and np.any(np.asarray(grid["cp_comm"]) != 0):  # an a2a row (memory_terms.cp_buffers)
        cols["cp_comm"] = np.asarray(grid["cp_comm"], dtype=np.int64).reshape(shape)
    if OFFLOAD_COLUMN in grid:  # a per-row activation offload (planner.memory.activation_offload)
        cols[OFFLOAD_COLUMN] = np.asarray(grid[OFFLOAD_COLUMN], dtype=np.int64).reshape(shape)
    cols["schedule"] = effective_schedule(cols["schedule"], cols["vpp"])
    return cols


def placed_features(kinds: list[list[str]], full: list[list[str]] | None,
                    placed: tuple[tuple[int, ...], ...], spec: ModelSpec | None = None) -> RankFeatures:
    """Rank features with the embedding on the ranks holding the first stage and the head on those
    holding the last (``placed``: :func:`dayzero.specs.parallel.stage_ranks`; DualPipeV puts both
    on rank 0, DualPipe on ranks 0 and pp - 1). ``spec``'s multi-token-prediction modules
    (DeepSeek-V3 sec. 2.2) sit on the ranks holding the last stage, as Megatron-LM builds them: a
    decoder layer of ``spec.mtp_kind`` each (its weights, gradients, optimizer states and
    activations as any layer's) and a copy of the shared embedding (their input lookup)."""
    kinds = [list(k) for k in kinds]
    full = [list(k) for k in full] if full is not None else None
    mtp = spec.mtp_layers if spec is not None else 0
    for r in placed[-1] if mtp else ():
        kinds[r] += [spec.mtp_kind] * mtp
        if full is not None:
            full[r] += [spec.mtp_kind] * mtp
    f = rank_features(kinds, full)
    pp = len(kinds)
    first = np.array([[float(r in placed[0] or (mtp > 0 and r in placed[-1])) for r in range(pp)]])
    last = np.array([[float(r in placed[-1]) for r in range(pp)]])
    return replace(f, first=first, last=last)


def _stage_terms(spec: ModelSpec, options: MemoryOptions, c: dict, f: RankFeatures,
                 capacity: float, excess: bool = False):
    """:func:`stage_terms`, with each MTP module's second pass through the head on the last stage:
    its saved head inputs and its logits, as many again as the main head's (Megatron-LM's MTP
    block computes each depth's logits and loss in the same forward). Returns (terms, the
    :data:`RECOMPUTE_EXCESS` bytes with ``excess``, else None)."""
    t, above = stage_terms(spec, options, c, f, capacity, excess=True) if excess else (
        stage_terms(spec, options, c, f, capacity), None)
    if spec.mtp_layers:
        for k in ("activations:head", "temporary:logits"):
            if k in t:
                t[k] = t[k] * (1 + spec.mtp_layers)
    return t, above


def _features(spec: ModelSpec, p: ParallelConfig) -> tuple[RankFeatures, list[list[int]]]:
    ranks = p.rank_layers(spec)
    types = spec.layer_types
    kinds = [[types[i] for i in r] for r in ranks]
    full = [[] for _ in range(p.pp)]
    placed = stage_ranks(p.schedule, p.pp, p.vpp)
    for v, chunk in enumerate(p.stage_layers(spec)):  # full recompute: first N layers of each chunk
        n = len(chunk) if p.recompute_layers is None else min(p.recompute_layers, len(chunk))
        for r in placed[v]:
            full[r].extend(types[i] for i in list(chunk)[:n])
    return placed_features(kinds, full, placed, spec), ranks


def estimate_memory(spec: ModelSpec, parallel: ParallelConfig, capacity_bytes: int,
                    options: MemoryOptions = MemoryOptions()) -> MemoryReport:
    """Bytes per device on every pipeline stage. Raises LayoutError for an impossible layout."""
    layout_rules.validate(parallel, spec)
    feats, ranks = _features(spec, parallel)
    terms, _ = _stage_terms(spec, options, candidate(parallel), feats, float(capacity_bytes))
    cats = category_totals(terms)
    stages = []
    for r in range(parallel.pp):
        row = {c: int(np.rint(np.broadcast_to(cats.get(c, 0.0), (1, parallel.pp))[0, r])) for c in CATEGORIES}
        named = {k: int(np.rint(np.broadcast_to(v, (1, parallel.pp))[0, r])) for k, v in terms.items()}
        stages.append(StageMemory(stage=r, layers=tuple(ranks[r]), terms=named, **row))
    return MemoryReport(stages=tuple(stages), capacity_bytes=int(capacity_bytes))


# -- the vectorised path -------------------------------------------------------------------------

def peak_memory_batch(spec: ModelSpec, grid: dict[str, np.ndarray], capacity_bytes: int,
                      options: MemoryOptions = MemoryOptions(), without: tuple[tuple[str, ...], ...] = ()):
    """Peak bytes (busiest stage, even layer split) for each candidate of ``grid``.

    ``grid`` is the planner's grid (:mod:`dayzero.specs.grid`: equal-length integer arrays keyed by
    ParallelConfig's field names, names coded; ``rank_order`` may be absent). Returns a float64
    array equal (to rounding) to ``estimate_memory(...).peak_bytes`` of each candidate. Layout
    validity is not checked here: filter candidates with :func:`dayzero.specs.layout_rules.mask`
    (layout_rules.problems) first.

    With ``without`` (term-name sets, e.g. the optimizer states a switch moves to the host:
    planner.search.switches.Switch.drops) it returns (peaks, [the peaks with each set's terms left out on
    every stage]) from the same terms: the search prices a switch that only removes terms without a
    second call. A dynamic term (activations, temporary) left out takes its share of the allocator's
    fragmentation with it (``overhead:fragmentation`` is the budget times their sum,
    memory_terms._overhead_terms). A set may name :data:`dayzero.planner.memory.memory_terms.RECOMPUTE_EXCESS`:
    its peaks are then a lower bound on the peak of every recompute level below each row's.
    """
    n = len(np.ravel(grid["tp"])) if "tp" in grid else 0
    if any(len(np.ravel(grid[k])) != n for k in CANDIDATE_KEYS if k in grid):
        raise LayoutError("peak_memory_batch: grid arrays must all have the same length")
    out = np.empty(n, dtype=np.float64)
    less = [np.empty(n, dtype=np.float64) for _ in without]
    floor = any(RECOMPUTE_EXCESS in dropped for dropped in without)
    if n == 0:
        return (out, less) if without else out
    for rows, c, f, w in _batches(spec, memory_columns(grid, (n,))):
        terms, excess = _stage_terms(spec, options, c, f, float(capacity_bytes), excess=floor)
        totals = sum(category_totals(terms).values())
        out[rows] = np.broadcast_to(totals, (len(rows), w)).max(axis=1)
        for dropped, to in zip(without, less):
            gone = sum(((1 + options.fragmentation_budget) * terms[k] if k.startswith(_DYNAMIC) else terms[k]
                        for k in dropped if k in terms), 0.0)
            if RECOMPUTE_EXCESS in dropped:
                gone = gone + (1 + options.fragmentation_budget) * excess
            to[rows] = np.broadcast_to(totals - gone, (len(rows), w)).max(axis=1)
    return (out, less) if without else out


def _batches(spec: ModelSpec, cols: dict[str, np.ndarray]):
    """(rows, candidate columns (len(rows), 1), their rank features (len(rows), w), w) per batch of
    ``cols`` (:func:`memory_columns`): one batch per rank-feature width (a few) rather than one per
    (pp, vpp, schedule) group (hundreds in a search); each row gets its own group's rank features
    (:func:`_even_features`), the schedule is a column."""
    n = len(cols["tp"])
    place = placement_code(cols["schedule"])
    nfull = partial_layers(cols)  # full recompute of the first N layers of each chunk (0: every layer)
    first, group = pipeline_groups(cols["pp"], cols["vpp"], nfull, place)
    feats = [_even_features(spec, int(cols["pp"][i]), int(cols["vpp"][i]), PLACEMENTS[int(place[i])], int(nfull[i]))
             for i in first]
    width = np.array([f.rank.shape[1] for f in feats])
    for w in np.unique(width):
        ids = np.flatnonzero(width == w)
        local = np.zeros(len(feats), dtype=np.int64)
        local[ids] = np.arange(len(ids))
        rows = np.flatnonzero(width[group] == w)
        if len(rows) == n:
            c = {k: v[:, None] for k, v in cols.items()}
        else:
            c = {k: v[rows][:, None] for k, v in cols.items()}
        yield rows, c, _stacked([feats[i] for i in ids], local[group[rows]]), int(w)


def a2a_extra_batch(spec: ModelSpec, grid: dict[str, np.ndarray],
                    options: MemoryOptions = MemoryOptions()) -> np.ndarray:
    """(N,) bytes by which each row's peak (:func:`peak_memory_batch`) grows when its context
    parallelism exchanges by all-to-all instead of the ring: the all-to-all's buffers less the
    ring's (:func:`dayzero.planner.memory.memory_terms.cp_buffers`), and the fragmentation budget on
    them. Both are the same on every pipeline rank (the attention's q, k, v of one micro-batch),
    so the busiest rank stays the busiest and the peak moves by exactly this (0 where cp = 1)."""
    from dayzero.planner.memory.activations import Dims, attention_terms
    from dayzero.planner.memory.memory_terms import cp_buffers
    from dayzero.specs.grid import BF16

    n = len(np.ravel(grid["tp"]))
    c = {k: np.asarray(grid[k], dtype=np.int64).reshape(n) for k in ("tp", "cp", "etp", "seq", "mbs",
                                                                      "sequence_parallel", "precision")}
    d = Dims(seq=c["seq"], mbs=c["mbs"], tp=c["tp"], cp=c["cp"], etp=c["etp"], sp=c["sequence_parallel"] > 0,
             fp8=c["precision"] != BF16)
    attn = attention_terms(spec, options, d)
    ring, _ = cp_buffers(attn, c["cp"], False)
    _, a2a = cp_buffers(attn, c["cp"], True)
    return (a2a - ring) * spec.has_attention * (1 + options.fragmentation_budget)


def optimizer_host_batch(spec: ModelSpec, grid: dict[str, np.ndarray],
                         options: MemoryOptions = MemoryOptions()) -> np.ndarray:
    """Host bytes per device (busiest rank, even layer split) each candidate of ``grid`` would keep
    with its optimizer offloaded, whether or not it offloads it (:func:`dayzero.planner.memory.memory_terms.
    optimizer_host_terms`; :func:`dayzero.planner.predict.host_memory` states the same bytes for one
    layout). The search caps optimizer offload with it (planner.search.search_fit.SwitchPlan.host_ok)."""
    from dayzero.planner.memory.memory_terms import optimizer_host_terms

    n = len(np.ravel(grid["tp"])) if "tp" in grid else 0
    out = np.zeros(n, dtype=np.float64)
    if n == 0:
        return out
    for rows, c, f, w in _batches(spec, memory_columns(grid, (n,))):
        out[rows] = np.broadcast_to(optimizer_host_terms(spec, options, c, f), (len(rows), w)).max(axis=1)
    return out


def _stacked(groups: list[RankFeatures], group: np.ndarray) -> RankFeatures:
    """Per-candidate rank features: row i holds those of ``groups[group[i]]`` (the groups it
    indexes all have the same number of ranks)."""

    def take(arrays: list[np.ndarray]) -> np.ndarray:
        return np.concatenate(arrays)[group]

    def field_of(name: str):
        first = getattr(groups[0], name)
        if isinstance(first, dict):
            return {k: take([getattr(g, name)[k] for g in groups]) for k in first}
        return take([getattr(g, name) for g in groups])

    return RankFeatures(**{f.name: field_of(f.name) for f in fields(RankFeatures)})


@lru_cache(maxsize=512)
def _even_features(spec: ModelSpec, pp: int, vpp: int, schedule: str = "1f1b",
                   recompute_layers: int = 0) -> RankFeatures:
    """Features of the ranks that can be the busiest under an even split: the first and last rank,
    and, among the middle ranks, the lowest-index one of each layer composition (and composition of
    its fully recomputed layers: the first ``recompute_layers`` of each chunk, as
    :func:`_features` counts them; 0 for every layer). A middle rank's
    total depends on its index only through the in-flight micro-batches, which never grow with the
    index, so the others cannot exceed it. This keeps the batch at a few columns per candidate.

    A pure function of its arguments, memoised (a search asks for the same (pp, vpp) in every
    memory pass); its arrays are read-only, so no caller can change the cached value."""
    split = model_split(spec.layers, pp * vpp, spec.mtp_layers)
    kinds: list[list[str]] = [[] for _ in range(pp)]
    full: list[list[str]] = [[] for _ in range(pp)]
    placed = stage_ranks(schedule, pp, vpp)
    start = 0
    for v, count in enumerate(split):
        n = count if recompute_layers <= 0 else min(recompute_layers, count)
        for r in placed[v]:
            kinds[r].extend(spec.layer_types[start:start + count])
            full[r].extend(spec.layer_types[start:start + n])
        start += count
    keep, seen = [0, pp - 1] if pp > 1 else [0], set()
    for r in range(1, pp - 1):
        comp = (tuple(sorted(kinds[r])), tuple(sorted(full[r])))
        if comp not in seen:
            seen.add(comp)
            keep.append(r)
    f = placed_features(kinds, full, placed, spec)
    cols = np.array(sorted(keep))

    def frozen(a: np.ndarray) -> np.ndarray:
        a = a[:, cols]
        a.setflags(write=False)
        return a

    return RankFeatures(rank=frozen(f.rank), layers={k: frozen(v) for k, v in f.layers.items()},
                        full={k: frozen(v) for k, v in f.full.items()}, first=frozen(f.first), last=frozen(f.last))


# -- the classic arithmetic ----------------------------------------------------------------------

@dataclass(frozen=True)
class ModelStates:
    """Model-state bytes for the whole model before any sharding (the ZeRO paper's arithmetic)."""

    params: int
    weights: int
    gradients: int
    master: int
    moments: int

    @property
    def total(self) -> int:
        return self.weights + self.gradients + self.master + self.moments

    def to_dict(self) -> dict:
        return {"params": self.params, "weights": self.weights, "gradients": self.gradients,
                "master": self.master, "moments": self.moments, "total": self.total}


def model_states(params: int, options: MemoryOptions = MemoryOptions()) -> ModelStates:
    return ModelStates(params=params, weights=params * options.param_bytes, gradients=params * options.grad_bytes,
                       master=params * options.master_bytes, moments=params * options.optim_bytes)


def zero_state_bytes(params: float, dp: int, zero: int, options: MemoryOptions = MemoryOptions()) -> float:
    """Model-state bytes per device for ``params`` replicated over ``dp`` ranks under ZeRO ``zero``
    (Rajbhandari et al. 2020, Fig. 1: (2 + 2 + K) psi, then 2psi + 2psi + K psi / Nd, ...)."""
    p, g, o = options.param_bytes, options.grad_bytes, options.master_bytes + options.optim_bytes
    per_param = zero_sharded(p, "weights", zero, dp) + zero_sharded(g, "gradients", zero,
                                                                    dp) + zero_sharded(o, "optimizer", zero, dp)
    return float(params * per_param)


def zero_comparison(spec: ModelSpec, parallel: ParallelConfig, capacity_bytes: int,
                    options: MemoryOptions = MemoryOptions()) -> list[dict]:
    """Model states and total on the busiest stage under ZeRO 0..3 for this layout, with the factor
    each stage cuts the model states by relative to no sharding."""
    rows = []
    for z in range(4):
        rep = estimate_memory(spec, parallel.with_(zero=z), capacity_bytes, options)
        s = max(rep.stages, key=lambda st: st.model_states)
        rows.append({"zero": z, "stage": s.stage, "weights": s.weights, "gradients": s.gradients,
                     "optimizer": s.optimizer, "model_states": s.model_states, "peak_bytes": rep.peak_bytes,
                     "peak_stage": rep.busiest_stage, "fits": rep.fits})
    base = rows[0]["model_states"]
    for r in rows:
        r["cut_factor"] = base / r["model_states"] if r["model_states"] else float("inf")
    return rows
