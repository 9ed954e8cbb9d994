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
from dayzero.planner.memory.memory_terms import RECOMPUTE_EXCESS
from dayzero.planner.perf.perf import PerfOptions
from dayzero.planner.search.search_space import SearchSpace, _with, dropped_terms
from dayzero.specs.cluster import Cluster
from dayzero.specs.grid import (
    DUALPIPE,
    FULL,
    MODULE_BIT,
)
from dayzero.specs.grid import SWITCHES as SWITCH_COLUMNS
from dayzero.specs.host import HOST_MEMORY_PER_DEVICE
from dayzero.specs.model import ModelSpec
from dayzero.specs.parallel import RECOMPUTES, model_split


def _layers(below: np.ndarray) -> list[list[int]]:
    """The level indices in layers: each level after every level strictly below it (the length of
    the longest chain under it), so no two levels of a layer are ordered."""
    n = len(below)
    depth = [0] * n
    for j in range(n):  # levels come in an order where those below come first (SearchSpace.levels)
        under = [i for i in range(j) if below[i, j] and not below[j, i]]
        depth[j] = 1 + max((depth[i] for i in under), default=-1)
    return [[j for j in range(n) if depth[j] == d] for d in range(max(depth, default=-1) + 1)]


def _needs(levels, allowed, union: int, where: np.ndarray, check, drops) -> np.ndarray:
    """Which of the ``allowed`` levels each base may fit at, from the module sets one module short
    of level ``union`` (the gate above every selective level): where the least any level dropping
    only tensors such a short set drops can hold does not fit (a level dropping fewer saves more,
    and every level keeps the largest saved tensor's transient: memory_terms.RECOMPUTE_EXCESS; not
    the short set's own peak, whose rebuilt module can outweigh what it drops beyond a subset's),
    the base is not checked there. Probes the bases in ``where`` (flags) with ``check``
    (:meth:`_PassProbe.check`, with that bound: (indices, peak, fits, may fit)); ``drops(mask)``:
    the tensors a module set drops (:func:`dropped_terms`). Returns (bases, allowed levels) flags."""
    rc = levels[allowed[union]][0]
    may = np.ones((len(where), len(allowed)), dtype=bool)
    selective = [i for i, a in enumerate(allowed) if RECOMPUTES[levels[a][0]] == "selective"]
    whole = int(np.bitwise_or.reduce([levels[allowed[i]][1] for i in selective])) if selective else 0
    # the short sets that drop less than the union (only those can fail where the union fits)
    shorts = [whole & ~b for b in MODULE_BIT.values() if whole & b and whole & ~b]
    shorts = [m for m in shorts if drops(m) < drops(whole)]
    if RECOMPUTES[rc] != "selective" or not where.any() or not shorts:
        return may
    for short, (picked, _, _, may_fit) in zip(shorts, check([((rc, m), where) for m in shorts])):
        inside = [i for i in selective if drops(levels[allowed[i]][1]) <= drops(short)]
        may[np.ix_(picked[~may_fit], inside)] = False
    return may


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


@dataclass
class _PassProbe:
    """The memory calls of one pass of one ZeRO stage (``zb``: the bases with the stage and the
    pass's switches set), shared by its groups of bases. ``ahead``: pass -> {(recompute code, module
    mask): (bases,) peaks an earlier pass's memory calls gave (nan: none)}; ``excess_at``: {(recompute
    code, module mask): (bases,) their bytes above the floor (memory_terms.RECOMPUTE_EXCESS), nan: not
    known}, read with ahead's peaks: the passes ahead reads off only drop model states."""

    zb: dict
    pi: int
    n: int
    n_passes: int
    switches: SwitchPlan
    memory: object
    memory_less: object
    limit: float
    ahead: dict
    excess_at: dict

    def check(self, rows: np.ndarray, asked, floor: bool = False):
        """[((recompute code, module mask), bases)] -> [(the bases' indices, peak, fits, may fit)], in
        one memory call (the peaks an earlier pass read off for this one not asked again). ``rows``:
        the group's base indices the flags of ``asked`` index. May fit (with ``floor``): the least any
        level below the asked one can hold (memory_terms.RECOMPUTE_EXCESS) fits, all True where that
        bound is not known."""
        if not asked:
            return []
        picks = [np.flatnonzero(where) for _, where in asked]
        at = np.concatenate(picks)
        if not len(at):
            return [(p, np.zeros(0), np.zeros(0, dtype=bool), np.zeros(0, dtype=bool)) for p in picks]
        rc = np.concatenate([np.full(len(p), lv[0]) for (lv, _), p in zip(asked, picks)]).astype(np.int64)
        mods = np.concatenate([np.full(len(p), lv[1]) for (lv, _), p in zip(asked, picks)]).astype(np.int64)
        floor = floor and self.memory_less is not None  # else no bound: every base may fit
        known = self.ahead.get(self.pi, {})
        peak = np.concatenate([known[lv][rows[p]] if lv in known else np.full(len(p), np.nan)
                               for (lv, _), p in zip(asked, picks)])
        # the bytes above the floor, with ahead's peaks (the same then: SwitchPlan.drops)
        above = np.concatenate([self.excess_at[lv][rows[p]] if floor and lv in known and lv in self.excess_at
                                else np.full(len(p), np.nan) for (lv, _), p in zip(asked, picks)])
        todo = np.flatnonzero(np.isnan(peak) | (np.isnan(above) if floor else False))
        if len(todo):
            self._measure(rows[at[todo]], rc[todo], mods[todo], floor, peak, above, todo)
        # a bound that does not fit by more than rounding (the floor is the peak less some terms)
        may = (peak - above <= self.limit * (1 + 1e-12)) if floor else np.ones(len(peak), dtype=bool)
        cuts = np.cumsum([len(p) for p in picks])[:-1]
        return [(p, pk, pk <= self.limit, mf)
                for p, pk, mf in zip(picks, np.split(peak, cuts), np.split(may, cuts))]

    def _measure(self, bases_at, rc, mods, floor: bool, peak, above, todo) -> None:
        """Fill ``peak`` (and ``above`` with ``floor``) at ``todo`` with one memory call on the bases
        ``bases_at`` at levels (``rc``, ``mods``), keeping the later passes' peaks it also gives."""
        grid = _with({k: v[bases_at] for k, v in self.zb.items()}, recompute=rc, recompute_modules=mods)
        later = [k for k in range(self.pi + 1, self.n_passes) if self.switches.drops[k] is not None]
        sets = [self.switches.drops[k] for k in later] if self.memory_less is not None else []
        if not (sets or floor):
            peak[todo] = self.memory(grid)
            return
        peak[todo], less = self.memory_less(grid, tuple(sets) + (((RECOMPUTE_EXCESS,),) if floor else ()))
        for lv in set(zip(rc.tolist(), mods.tolist())):
            here = (rc == lv[0]) & (mods == lv[1])
            for k, pk in zip(later, less):  # the peaks of the later passes, for when they ask
                col = self.ahead.setdefault(k, {}).setdefault(lv, np.full(self.n, np.nan))
                col[bases_at[here]] = pk[here]
            if floor:
                col = self.excess_at.setdefault(lv, np.full(self.n, np.nan))
                col[bases_at[here]] = (peak[todo] - less[-1])[here]
        if floor:
            above[todo] = peak[todo] - less[-1]


def _climb_group(probe: _PassProbe, rows: np.ndarray, allowed, levels, below: np.ndarray,
                 fitting: np.ndarray, found: list, drops) -> None:
    """One group's climb of the recompute levels it may take (``allowed``) in one pass: the gates
    first, then the levels layer by layer, each checked only on the bases no level below it fits.
    Appends (bases, level index, peak, pass) to ``found`` and marks ``fitting`` (bases, levels)."""
    pi = probe.pi
    allowed = np.asarray(allowed)
    sub = below[np.ix_(allowed, allowed)]
    # fits, or a level below it does (by an earlier pass: with fewer switches, so faster)
    fit = fitting[np.ix_(rows, allowed)]
    alive = ~fit.all(axis=1)

    def check(asked, floor: bool = False):
        return probe.check(rows, asked, floor)

    def record(j, picked, peak):
        # j fits; the levels above it are never faster, so they count as fitting (not checked)
        fit[np.ix_(picked, np.flatnonzero(sub[j]))] = True
        found.append((rows[picked], allowed[j], peak, pi))

    # gates: a level above all others (full recompute), then one above all but it (every
    # selective module at once). Neither holds the least memory (its replay's transient can
    # outweigh what it saves: activations.full_recompute_transient, LayerActivation.rebuilding),
    # so a base that does not fit under a gate still climbs the levels below it unless the
    # least any of them can hold does not fit either (check's "may fit")
    gates, rest = [], list(range(len(allowed)))
    for _ in range(2):
        top = [j for j in rest if sub[np.ix_(rest, [j])].all()]
        if not top or len(rest) < 3:
            break
        gates.append(top[0])
        rest.remove(top[0])
    layers = [[j for j in layer if j not in gates] for layer in _layers(sub)]
    under = {}  # gate -> (the bases that fit under it, their peaks)

    may = np.ones_like(fit)  # the levels a base may still fit at (needs: below)

    def climb(layer):
        # (levels, bases): the bases no level below the level fits, that may fit there
        open_ = np.ascontiguousarray((~fit[:, layer] & may[:, layer] & alive[:, None]).T)
        todo = [(j, where) for j, where, any_ in zip(layer, open_, open_.any(axis=1)) if any_]
        for j, (picked, peak, ok, _) in zip([j for j, _ in todo],
                                            check([(levels[allowed[j]], where) for j, where in todo])):
            record(j, picked[ok], peak[ok])

    def gate(j):
        """Check gate ``j`` on the live bases not yet fitting at or below it; the bases where
        no level at or below it can fit are no longer live (those under full recompute
        alone that fit there take it)."""
        (picked, peak, ok, may_fit), = check([(levels[allowed[j]], alive & ~fit[:, j])], floor=True)
        under[j] = picked[ok], peak[ok]
        if j != gates[0]:  # fits at none of the selective levels: full recompute, if it fits
            settle_gate(gates[0], picked[~may_fit])
        alive[picked[~may_fit]] = False

    def settle_gate(j, among=None):
        """The bases (of ``among``) that fit under gate ``j`` and at no level below it found so
        far take it."""
        rows_j, peak_j = under[j]
        left = rows_j[alive[rows_j] & ~fit[rows_j, j]]
        if among is not None:
            left = left[np.isin(left, among)]
        record(j, left, peak_j[np.searchsorted(rows_j, left)])

    if gates:  # a base an earlier pass fits under the gate fits there now (memory only fell)
        gate(gates[0])
    climb(layers[0])  # no recompute (below every level: the fastest), before the second gate
    if len(gates) == 2:
        gate(gates[1])
        may &= _needs(levels, allowed, gates[1], alive & ~fit.all(axis=1),
                      lambda asked: check(asked, floor=True), drops)
    for layer in layers[1:]:
        climb(layer)
    for j in gates[::-1]:  # the selective gate, then full recompute where none fits
        settle_gate(j)
    fitting[np.ix_(rows, allowed)] = fit


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
        found, ahead, excess_at = [], {}, {}  # the last two: _PassProbe's, shared by the passes
        for pi, on in enumerate(passes):
            zb = _with(bases, zero=z, **{**held, **on})
            groups, ruled_out = _row_groups(bases, zb, levels, engine, searched_dual, pi, run_switches)
            n_engine += ruled_out
            probe = _PassProbe(zb, pi, n, len(passes), switches, memory, memory_less, limit, ahead, excess_at)
            for rows, allowed in groups:
                if len(rows):
                    _climb_group(probe, rows, allowed, levels, below, fitting, found, drops)
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

