"""Which variants of each base layout fit, and the fewest that need trying.

A base is a layout with every dim but its memory-shaping choices; its variants are the ZeRO stages,
recompute levels (none, Megatron's recompute-module sets, full, full on the first N layers of each
chunk), the memory switches (:mod:`dayzero.planner.search.switches`) and activation offload of N layers.
Pruning is exact under the models: a variant is timed only where no variant that takes no more time
fits, and a variant is ruled out unchecked only where a lower bound on its peak does not fit
(:func:`_fitting_variants`: a level above a fitting one only adds time; ZeRO-2 only where
ZeRO-1 does not fit; a last-resort switch only where nothing fits without it), and the counted ones
(full(N), offloaded layers) take the least N that fits by bisection
(:func:`fewest_recomputed_layers`, :func:`dayzero.planner.memory.activation_offload.fewest_offloaded_layers`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dayzero.errors import LayoutError
from dayzero.planner.engines import ENGINES, engine_mask, with_run
from dayzero.planner.memory.activation_offload import COLUMN as OFFLOAD
from dayzero.planner.perf.perf import PerfOptions
from dayzero.planner.search.level_climb import PassProbe, climb_group
from dayzero.planner.search.search_space import SearchSpace, _with, dropped_terms
from dayzero.specs.cluster import Cluster
from dayzero.specs.grid import (
    DUALPIPE,
    FULL,
)
from dayzero.specs.grid import SWITCHES as SWITCH_COLUMNS
from dayzero.specs.host import HOST_MEMORY_PER_DEVICE
from dayzero.specs.model import ModelSpec
from dayzero.specs.parallel import RECOMPUTES, model_split


def _row_patterns(flags: np.ndarray) -> np.ndarray:
    """A number per row of a boolean matrix, equal for equal rows (bit-packed 64 columns at a time)."""
    bits = np.packbits(flags, axis=1, bitorder="little")
    bits = np.pad(bits, ((0, 0), (0, -bits.shape[1] % 8))).view(np.uint64)
    key = np.zeros(len(flags), dtype=np.int64)
    for w in bits.T:
        _, part = np.unique(w, return_inverse=True)
        _, key = np.unique(key * (int(part.max(initial=0)) + 1) + part, return_inverse=True)
    return key.ravel()


def _engine_runs(engine, grid: dict, run_switches: dict | None = None) -> np.ndarray:
    """The rows of ``grid`` the pinned ``engine`` runs, or (None) some engine of planner.engines
    (with the run's switches, planner.engines.RUN_SWITCHES)."""
    if engine:
        return engine_mask(engine, grid, run_switches)
    return np.logical_or.reduce([engine_mask(e, grid, run_switches) for e in ENGINES])


LEVEL_COLUMNS = ("recompute", "recompute_modules")


def _runs_at_levels(g: dict, levels, run_switches: dict | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Which recompute levels some engine of planner.engines runs each row of ``g`` at, as (the
    distinct rows of that (rows, levels) matrix, (rows,) the index of each row's among them): the
    ``engine_mask`` of every row at every level, with each engine's limits split into those that
    read only the rows' columns, only the level's, or both; the first two are evaluated once, so
    a row's levels are the union over the engines whose row limits it meets of their levels, one
    of at most 2^engines patterns (the run's switches read as columns where on, as engine_mask
    reads them). The patterns are numbered as :func:`_row_patterns` numbers them."""
    n, width = len(g["tp"]), len(levels)
    g = with_run(g, run_switches)
    lv = {"recompute": np.array([rc for rc, _ in levels], dtype=np.int64),
          "recompute_modules": np.array([m for _, m in levels], dtype=np.int64)}
    code = np.zeros(n, dtype=np.int64)  # bit e: the row meets engine e's row limits
    level_oks, both = [], []
    for e, eng in enumerate(ENGINES.values()):
        row_ok, level_ok = np.ones(n, dtype=bool), np.ones(width, dtype=bool)
        for lim in eng.limits:
            reads = set(lim.reads)
            if not reads & set(LEVEL_COLUMNS):
                if reads <= set(g):
                    row_ok &= np.broadcast_to(np.asarray(lim.ok(g), dtype=bool), (n,))
            elif reads <= set(LEVEL_COLUMNS):
                level_ok &= np.broadcast_to(np.asarray(lim.ok(lv), dtype=bool), (width,))
            elif reads <= set(g) | set(LEVEL_COLUMNS):
                both.append((e, lim))
        code |= row_ok.astype(np.int64) << e
        level_oks.append(level_ok)
    if both:  # a limit reading a row and its level: every row at every level
        out = np.zeros((n, width), dtype=bool)
        for e, level_ok in enumerate(level_oks):
            runs = ((code >> e) & 1).astype(bool)[:, None] & level_ok[None, :]
            for _, lim in (x for x in both if x[0] == e):
                for j, (rc, m) in enumerate(levels):
                    runs[:, j] &= np.broadcast_to(np.asarray(lim.ok(_with(g, recompute=rc, recompute_modules=m)),
                                                             dtype=bool), (n,))
            out |= runs
        table, code = out, np.arange(n)
    else:
        bits = np.arange(2 ** len(level_oks))[:, None]
        table = np.logical_or.reduce([((bits >> e) & 1).astype(bool) & ok[None, :] for e, ok in enumerate(level_oks)])
    used, code = np.unique(code, return_inverse=True)
    table = table[used]
    pattern = _row_patterns(table)  # rows with the same levels share a number
    first = np.zeros(int(pattern.max(initial=-1)) + 1, dtype=np.int64)
    first[pattern[::-1]] = np.arange(len(pattern))[::-1]  # a table row of each pattern
    return table[first], pattern[code.ravel()]


@dataclass(frozen=True)
class SwitchPlan:
    """How the search sets the memory switches (:mod:`dayzero.planner.search.switches`): ``saves`` on
    wherever an engine runs them, ``ladder`` (the last-resort ones) tried only where nothing fits
    without them, one more per pass, ``forced`` on wherever the layout rules allow (the user's
    flags); the others off. ``rule_ok``: grid -> rows the layout rules reading a switch allow."""

    saves: tuple[str, ...] = ()
    ladder: tuple[str, ...] = ()
    forced: tuple[str, ...] = ()
    rule_ok: object = None
    # per pass, the memory terms its ladder switches remove and nothing else (Switch.drops), or None
    # where one of them changes more: a pass's peaks are then read off the earlier passes' memory calls
    drops: tuple = ()
    # grid -> (rows,) host bytes per device the rows' switches on keep there (:func:`switch_host_bytes`),
    # or None: not priced (a search with its own memory function)
    host_bytes: object = None
    # the device's share of host memory those bytes must fit (the cluster's, Cluster.host.memory_bytes;
    # default the DGX H100's 250 GB, dayzero.specs.host.FALLBACK)
    host_limit: float = HOST_MEMORY_PER_DEVICE

    def host(self, grid: dict) -> np.ndarray:
        """(rows,) host bytes per device the switches on in ``grid`` keep (0 where not priced)."""
        if self.host_bytes is None:
            return np.zeros(len(grid["tp"]))
        return np.asarray(self.host_bytes(grid), dtype=float)

    def on_host(self, grid: dict) -> np.ndarray:
        """The rows of ``grid`` whose switches' host bytes fit the device's share of host memory
        (:attr:`host_limit`)."""
        return self.host(grid) <= self.host_limit

    def held(self, bases: dict, z: int, engine, run_switches: dict | None = None) -> dict[str, np.ndarray]:
        """The switch columns every pass of ZeRO stage ``z`` shares (the ladder's start off)."""
        n = len(bases["tp"])
        cols = {s: np.zeros(n, dtype=np.int64) for s in SWITCH_COLUMNS}
        zb = _with(bases, zero=z)
        for name in self.forced:
            cols[name] = self.rule_ok({**zb, **cols, name: np.ones(n, dtype=np.int64)}).astype(np.int64)
        for name in self.saves:
            trial = {**zb, **cols, name: np.ones(n, dtype=np.int64)}
            cols[name] = (self.rule_ok(trial) & _engine_runs(engine, trial, run_switches)
                          & self.on_host(trial)).astype(np.int64)
        return cols

    def passes(self) -> list[dict[str, int]]:
        """The ladder's passes: none of it, then one more last-resort switch on each."""
        return [{name: 1 for name in self.ladder[:k]} for k in range(len(self.ladder) + 1)]


def _row_groups(bases: dict, zb: dict, levels, engine, searched_dual: bool, pi: int,
                run_switches: dict | None) -> tuple[list, int]:
    """The bases of one pass split into groups (rows, the level indices they may take), and the
    number of (row, level) layouts ruled out by the engines (counted on the first pass only): with
    ``engine``, the rows it runs at every level; unpinned (``searched_dual``), each row only at the
    levels some engine runs it with (DualPipe, which none runs, is only tried when pinned, so it is
    not filtered); on a later pass (a last-resort switch on), only the rows an engine runs with it."""
    n = len(bases["tp"])
    everything = tuple(range(len(levels)))
    groups, n_engine = [(np.arange(n), everything)], 0
    if engine:
        runs = engine_mask(engine, zb, run_switches)
        n_engine += int((~runs).sum()) * len(levels) * (pi == 0)
        groups = [(np.flatnonzero(runs), everything)]
    elif searched_dual:
        dual = np.flatnonzero(bases["schedule"] != DUALPIPE)
        if len(dual):
            # the distinct rows of (rows, levels) an engine runs, and each row's among them
            runs, which = _runs_at_levels({k: v[dual] for k, v in zb.items()}, levels, run_switches)
            n_engine += int((~runs).sum(axis=1)[which].sum()) * (pi == 0)
            groups = [(np.flatnonzero(bases["schedule"] == DUALPIPE), everything)]
            for k in np.unique(which):
                allowed = np.flatnonzero(runs[k])
                if len(allowed):
                    groups.append((dual[which == k], tuple(allowed.tolist())))
    if pi:  # a last-resort switch only where an engine runs it
        ok_rows = _engine_runs(engine, zb, run_switches)
        groups = [(rows[ok_rows[rows]], allowed) for rows, allowed in groups]
    return groups, n_engine


def _kept_variants(found: list, z: int, held: dict, held_at: dict, fits_at: dict, passes: list) -> list:
    """ZeRO stage ``z``'s fitting variants as (base indices, zero, level index, peak, switch columns,
    pass), ZeRO-2 kept only where ZeRO-1 (with no more switches) does not fit: ZeRO-1 then takes no
    more time (ZeRO-2 adds a reduce-scatter per micro-batch)."""
    out = []
    for idx, j, peak, pi in found:
        if z == 2 and (1, pi) in fits_at:
            same = np.logical_and.reduce([held_at[1][s][idx] >= held[s][idx] for s in SWITCH_COLUMNS])
            keep = ~(fits_at[1, pi][idx, j] & same)
            idx, peak = idx[keep], peak[keep]
        cols = {s: np.full(len(idx), 0, dtype=np.int64) + held[s][idx] for s in SWITCH_COLUMNS}
        for s, v in passes[pi].items():
            cols[s] = np.full(len(idx), v, dtype=np.int64)
        out.append((idx, z, np.full(len(idx), j, dtype=np.int64), peak, cols, pi))
    return out


def _fitting_variants(spec, bases: dict, zeros, levels, memory, limit, engine=None,
                      searched_dual: bool = False, below: np.ndarray | None = None,
                      switches: SwitchPlan | None = None, memory_less=None,
                      run_switches: dict | None = None) -> tuple[list, int, int]:
    """For each base and ZeRO stage, the recompute levels (``levels``: SearchSpace.levels) that fit
    with no fitting level below them (``below``: :func:`level_order`, default a chain in the given
    order): a level above a fitting one keeps less memory but only adds time, so it is never the
    fastest; the search times the rest and keeps the fastest. Memory does not always fall as
    recompute grows (a replay's transient can outweigh what it drops) nor as ZeRO grows (ZeRO-3's
    gathered layers and ZeRO-2's buckets can cost more than they save), so each ZeRO stage is
    checked under a level above all the others first (full recompute) with the floor of every level
    below it in the same call (memory_terms.RECOMPUTE_EXCESS: a lower bound on their peaks; a base
    whose floor does not fit fits nowhere), then likewise under every selective module at once,
    and the rest go up the levels in order, each checked only on the bases that no level below it
    fits; a base that fits a gate and no level below it takes the gate. ZeRO-2 is kept only at levels
    where ZeRO-1 does not fit (it adds a reduce-scatter per micro-batch and nothing else).

    The memory switches (``switches``: :class:`SwitchPlan`): the ``saves`` ones are set per base
    before anything is checked; then each pass of the last-resort ladder climbs again with one more
    of them on, only at the (base, level)s where no level at or below fits with fewer (those fit
    with less time: the switch only adds time), and only on the bases an engine runs with it.

    Returns ([(base indices, zero, level index, peak, switch columns, pass)], number of fitting (base,
    zero, level) layouts, number ruled out by ``engine``; without one, with ``searched_dual`` (an
    unpinned schedule), the (row, ZeRO stage, recompute level) layouts no engine runs, which are left
    out: DualPipe rows, tried only when pinned, excepted). ``run_switches``: the run's switches the
    engine limits read (planner.engines.RUN_SWITCHES, PerfOptions.switches)."""
    n = len(bases["tp"])
    switches = switches or SwitchPlan()
    if below is None:
        below = np.triu(np.ones((len(levels), len(levels)), dtype=bool))
    out, n_fit, n_engine = [], 0, 0
    fits_at = {}  # (ZeRO stage, pass) -> (bases, levels) fitting by that pass, a level above a fitting one included
    held_at = {}  # ZeRO stage -> the switch columns held
    known: dict[int, frozenset] = {}

    def drops(mask: int) -> frozenset:
        if mask not in known:
            known[mask] = dropped_terms(spec, mask)
        return known[mask]
    passes = switches.passes()
    for z in sorted(zeros):
        held_at[z] = held = switches.held(bases, z, engine, run_switches)
        fitting = np.zeros((n, len(levels)), dtype=bool)  # fits (or a level below does), by some pass so far
        found, ahead, excess_at = [], {}, {}  # the last two: PassProbe's, shared by the passes
        for pi, on in enumerate(passes):
            zb = _with(bases, zero=z, **{**held, **on})
            groups, ruled_out = _row_groups(bases, zb, levels, engine, searched_dual, pi, run_switches)
            n_engine += ruled_out
            probe = PassProbe(zb, pi, n, len(passes), switches, memory, memory_less, limit, ahead, excess_at)
            for rows, allowed in groups:
                if len(rows):
                    climb_group(probe, rows, allowed, levels, below, fitting, found, drops)
            fits_at[z, pi] = fitting.copy()
        n_fit += int(fitting.sum())
        out += _kept_variants(found, z, held, held_at, fits_at, passes)
    return out, n_fit, n_engine


def chunk_layers(spec: ModelSpec, pp: np.ndarray, vpp: np.ndarray) -> np.ndarray:
    """(N,) decoder layers of the longest model chunk under the even split (MTP modules excluded:
    memory counts them replayed whatever N is)."""
    stages = np.asarray(pp) * np.asarray(vpp)
    out = np.zeros(len(stages), dtype=np.int64)
    for s in np.unique(stages):
        out[stages == s] = max(model_split(spec.layers, int(s), spec.mtp_layers))
    return out


def fewest_recomputed_layers(spec: ModelSpec, cand: dict, peaks: np.ndarray, memory, limit: float):
    """The least N such that full recompute of the first N layers of each chunk
    (``recompute_layers``, Megatron's --recompute-method block) still fits, for the rows of
    ``cand`` under full recompute (the search takes full only where no lower level fits). Memory
    falls as N grows (each replayed layer keeps its input instead of its activations), so a
    bisection over 1..the longest chunk's layers finds it; time only grows with N (each replayed
    layer adds its forward and collectives again), so the least N is the fastest. Returns (the
    recompute_layers column, 0 where every layer is replayed; the rows' peaks)."""
    col = np.zeros(len(peaks), dtype=np.int64)
    rows = np.flatnonzero(np.asarray(cand["recompute"]) == FULL)
    if not len(rows):
        return col, peaks
    sub = {k: np.asarray(v)[rows] for k, v in cand.items()}
    hi = chunk_layers(spec, sub["pp"], sub["vpp"])  # fits: every layer (the level's own peak)
    lo = np.zeros_like(hi)  # does not fit (no lower recompute level did)
    peak = np.asarray(peaks, dtype=float)[rows].copy()
    while True:
        open_ = np.flatnonzero(hi - lo > 1)
        if not len(open_):
            break
        mid = (lo[open_] + hi[open_]) // 2
        pk = memory({**{k: v[open_] for k, v in sub.items()}, "recompute_layers": mid})
        ok = pk <= limit
        hi[open_[ok]], peak[open_[ok]] = mid[ok], pk[ok]
        lo[open_[~ok]] = mid[~ok]
    every = chunk_layers(spec, sub["pp"], sub["vpp"])
    col[rows] = np.where(hi < every, hi, 0)
    out = np.asarray(peaks, dtype=float).copy()
    out[rows] = peak
    return col, out


def smallest_chunk(spec: ModelSpec, pp: np.ndarray, vpp: np.ndarray) -> np.ndarray:
    """(N,) decoder layers of the shortest model chunk under the even split (the cap on activation
    offload: fewer than it, planner.memory.activation_offload.check_activation_offload)."""
    stages = np.asarray(pp) * np.asarray(vpp)
    out = np.zeros(len(stages), dtype=np.int64)
    for s in np.unique(stages):
        split = [x for x in model_split(spec.layers, int(s), spec.mtp_layers) if x > 0]
        out[stages == s] = min(split) if split else 0
    return out


def _offloaded_layers(memory, g: dict, cand: np.ndarray, limit: float, top: np.ndarray):
    """For the rows ``cand`` of ``g`` (no recompute): the layers offloaded per chunk that make each
    fit (0: it fits without offload; -1: no offload row, as for every row outside ``cand``), first
    checked at the most layers (``top`` - 1: a row that does not fit there fits at none), and the
    rows whose peak without offload was computed, with those peaks."""
    from dayzero.planner.memory.activation_offload import fewest_offloaded_layers

    got = np.full(len(cand), -1, dtype=np.int64)
    idx = np.flatnonzero(cand)
    checked, peaks = idx[:0], np.zeros(0)
    if len(idx):
        sub = {k: v[idx] for k, v in g.items()}
        most = memory({**sub, OFFLOAD: top[idx] - 1}) <= limit
        idx, sub = idx[most], {k: v[most] for k, v in sub.items()}
    if len(idx):
        checked, peaks = idx, memory({**sub, OFFLOAD: np.zeros(len(idx), dtype=np.int64)})
        fits = peaks <= limit
        got[idx[fits]] = 0
        idx, sub = idx[~fits], {k: v[~fits] for k, v in sub.items()}
        if len(idx):
            k = fewest_offloaded_layers(memory, sub, limit, top[idx])
            got[idx] = np.where(k > 0, k, -1)
    return got, checked, peaks


def offloaded_variants(spec: ModelSpec, bases: dict, zeros, levels, memory, limit: float,
                       switches: SwitchPlan, engine=None, run_switches: dict | None = None,
                       host_bytes: float | None = None) -> tuple[dict, np.ndarray, np.ndarray, int]:
    """The activation-offload rows (:mod:`dayzero.planner.memory.activation_offload`) the search times beside
    :func:`_fitting_variants`' levels: for each base, ZeRO stage and pass of the last-resort ladder
    where no recompute does not fit and an engine runs the base with offload there (Megatron-Core:
    pp 1, recompute none; planner.engines), the fewest offloaded layers per chunk that fit
    (:func:`dayzero.planner.memory.activation_offload.fewest_offloaded_layers`). Offload trades memory for
    PCIe time as recompute trades it for compute, so neither is faster by the models and both are
    timed; where no recompute fits, offload only adds time and is not tried. Pruning stays exact:
    a row is left out where one that takes no more time and no less of it fits: the same ZeRO stage
    one rung down the ladder (fewer switches) with at most as many layers offloaded, and for ZeRO-2
    the ZeRO-1 row of the same pass with at most as many (ZeRO-2 adds a reduce-scatter per
    micro-batch and nothing else; planner.memory.activation_offload: time grows with the layers offloaded).
    The offloaded bytes must fit the device's share of host memory (``host_bytes``, default
    ``switches.host_limit``: the cluster's, :attr:`dayzero.specs.host.HostSpec.memory_bytes`): the
    fewest layers hold the least, so a row whose fewest do not fit there is dropped.

    Returns (the rows as a grid with every variant column set, their peaks, their rungs, the count of
    (base, ZeRO stage) layouts without recompute that only offload makes fit: the caller's fitting)."""
    from dayzero.planner.memory.activation_offload import COLUMN

    host_bytes = switches.host_limit if host_bytes is None else host_bytes
    none = [i for i, (rc, _) in enumerate(levels) if RECOMPUTES[rc] == "none"]
    empty = {k: v[:0] for k, v in bases.items()}
    n = len(bases["tp"])
    if not none or not n:
        return empty, np.zeros(0), np.zeros(0, dtype=np.int64), 0
    rc0 = levels[none[0]][0]
    top = smallest_chunk(spec, bases["pp"], bases["vpp"])
    rows_all, peaks_all, rungs_all, rescued = [], [], [], 0
    plain = np.full(n, np.nan)  # the rows' peaks without offload, where checked
    taken: dict = {}  # (ZeRO stage, pass) -> (N,) layers offloaded there (0: none), nothing fits without: -1
    held_at = {}
    for z in sorted(zeros):
        held_at[z] = held = switches.held(bases, z, engine, run_switches)
        none_fits = np.zeros(n, dtype=bool)  # by some pass so far
        offloaded = np.zeros(n, dtype=bool)
        for pi, on in enumerate(switches.passes()):
            g = _with(bases, zero=z, recompute=rc0, recompute_modules=0, recompute_layers=0, **{**held, **on})
            g[COLUMN] = np.ones(n, dtype=np.int64)
            cand = _engine_runs(engine, g, run_switches) & (top > 1) & ~none_fits
            same = None
            if z == 2 and (1, pi) in taken:  # ZeRO-1 with no fewer held switches, at this pass
                same = np.logical_and.reduce([held_at[1][s] >= held[s] for s in SWITCH_COLUMNS])
            got, checked, checked_peaks = _offloaded_layers(memory, g, cand, limit, top)
            plain[checked] = checked_peaks
            none_fits |= got == 0
            got[none_fits] = 0
            keep = got > 0
            if pi:  # strictly fewer layers than one rung down (else that row takes no more time and fits)
                before = taken[z, pi - 1]
                keep &= (before < 0) | (got < before)
            if same is not None:
                keep &= ~same | (taken[1, pi] < 0) | (got < taken[1, pi])
            taken[z, pi] = got
            idx = np.flatnonzero(keep)
            if not len(idx):
                continue
            rows = {c: v[idx] for c, v in g.items()}
            rows[COLUMN] = got[idx]
            pk = memory(rows)
            # the host holds what left the device: the device saving (with the allocator's fragmentation
            # budget on those bytes, so an upper bound) within the device's share of host memory, less
            # what an offloaded optimizer keeps there (SwitchPlan.host)
            on_host = plain[idx] - pk + switches.host(rows) <= host_bytes
            taken[z, pi][idx[~on_host]] = -1  # no offload row there (it dominates nothing)
            idx, pk, rows = idx[on_host], pk[on_host], {c: v[on_host] for c, v in rows.items()}
            if not len(idx):
                continue
            peaks_all.append(pk)
            rows_all.append(rows)
            rungs_all.append(np.full(len(idx), pi, dtype=np.int64))
            offloaded[idx] = True
        rescued += int((offloaded & ~none_fits).sum())
    if not rows_all:
        return empty, np.zeros(0), np.zeros(0, dtype=np.int64), 0
    cols = rows_all[0].keys()
    return ({c: np.concatenate([r[c] for r in rows_all]) for c in cols}, np.concatenate(peaks_all),
            np.concatenate(rungs_all), rescued)


def fewer_layers_up_the_ladder(spec: ModelSpec, cand: dict, peaks: np.ndarray, rung: np.ndarray,
                               switches: SwitchPlan, memory, limit: float, engine=None,
                               run_switches: dict | None = None) -> tuple[dict, np.ndarray]:
    """``cand`` with, for each row under full recompute of some layers (:func:`fewest_recomputed_layers`)
    at a rung of the last-resort ladder (``rung``: its pass), the row one rung up where that
    replays strictly fewer layers per chunk and an engine runs it: the switch adds time and the
    fewer replayed layers take some off, so neither is faster by the models and both are timed
    (at the same layer count the row without the switch is; :class:`SwitchPlan`)."""
    passes = switches.passes()
    rows_all, peaks_all = [cand], [peaks]
    at, at_peaks, at_rung = cand, peaks, rung
    for k in range(1, len(passes)):
        every = chunk_layers(spec, at["pp"], at["vpp"]) if len(at_peaks) else np.zeros(0, dtype=np.int64)
        now = np.where(at["recompute_layers"] > 0, at["recompute_layers"], every)
        pick = np.flatnonzero((at_rung == k - 1) & (at["recompute"] == FULL) & (now > 1))
        if not len(pick):
            break
        up = {c: v[pick] for c, v in at.items()}
        up.update({s: np.full(len(pick), v, dtype=np.int64) for s, v in passes[k].items()})
        runs = _engine_runs(engine, up, run_switches)
        up, pick = {c: v[runs] for c, v in up.items()}, pick[runs]
        if not len(pick):
            break
        before = now[pick]
        probe = {**up, "recompute_layers": np.zeros(len(pick), dtype=np.int64)}  # every layer: fits (fewer
        col, pk = fewest_recomputed_layers(spec, probe, np.full(len(pick), -np.inf), memory, limit)  # switches did)
        n_new = np.where(col > 0, col, chunk_layers(spec, up["pp"], up["vpp"]))
        keep = n_new < before
        up = {c: v[keep] for c, v in up.items()}
        up["recompute_layers"] = col[keep]
        rows_all.append(up)
        peaks_all.append(pk[keep])
        at, at_peaks, at_rung = up, pk[keep], np.full(int(keep.sum()), k, dtype=np.int64)
    if len(rows_all) == 1:
        return cand, peaks
    return {c: np.concatenate([r[c] for r in rows_all]) for c in cand}, np.concatenate(peaks_all)


def switch_plan(spec: ModelSpec, cluster: Cluster, options: PerfOptions, memory_options,
                space: SearchSpace) -> SwitchPlan:
    """How this search sets each memory switch (:mod:`dayzero.planner.search.switches`): forced on by the
    user's flag, kept off by ``space.no_switches``, else by its kind on this cluster."""
    from dayzero.planner.search import switches as sw
    bad = [n for n in space.no_switches if n not in sw.BY_NAME and n != OFFLOAD]
    if bad:
        raise LayoutError(f"search space: no switch {', '.join(bad)}; the switches are "
                          f"{', '.join((*sw.BY_NAME, OFFLOAD))}")
    kinds = sw.kinds(cluster, options)
    forced = tuple(s.name for s in sw.SWITCHES if s.forced(memory_options, options))
    free = [s.name for s in sw.SWITCHES if s.name not in forced and s.name not in space.no_switches]
    ladder = tuple(n for n in free if kinds[n] == "last_resort")
    drops = [()]
    for k in range(1, len(ladder) + 1):
        terms = [sw.BY_NAME[n].drops for n in ladder[:k]]
        drops.append(tuple(t for ts in terms for t in ts) if all(terms) else None)
    return SwitchPlan(saves=tuple(n for n in free if kinds[n] == "saves"), ladder=ladder, forced=forced,
                      rule_ok=sw.rule_mask(spec, cluster.devices), drops=tuple(drops),
                      host_bytes=None if memory_options is None else switch_host_bytes(spec, memory_options),
                      host_limit=cluster.host.memory_bytes)


def switch_host_bytes(spec: ModelSpec, memory_options):
    """``grid -> (rows,)`` host bytes per device the rows' switches keep in host memory: an offloaded
    optimizer's FP32 master, moments and gradient copy (:func:`dayzero.planner.memory.memory.optimizer_host_batch`)
    where the row (or the run, MemoryOptions.optimizer_offload) offloads it. Activation offload,
    a count searched apart, adds its own bytes (:func:`offloaded_variants`)."""
    from dayzero.planner.memory.memory import optimizer_host_batch
    from dayzero.specs.grid import flag

    def host(grid: dict) -> np.ndarray:
        on = (flag(grid, "optimizer_offload") > 0) | bool(memory_options.optimizer_offload)
        out = np.zeros(len(grid["tp"]))
        if on.any():
            rows = {k: np.asarray(v)[on] for k, v in grid.items()}
            # a base before its recompute level is set (SwitchPlan.held): the optimizer reads no level
            rows.setdefault("recompute", np.full(int(on.sum()), RECOMPUTES.index("none"), dtype=np.int64))
            out[on] = optimizer_host_batch(spec, rows, memory_options)
        return out
    return host

