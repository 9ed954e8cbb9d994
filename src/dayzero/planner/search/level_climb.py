"""The climb of the recompute levels for one group of base layouts in one pass of the search
(:func:`dayzero.planner.search.search_fit._fitting_variants`): the gates (full recompute, every
selective module at once) first, then the levels layer by layer, each checked only on the bases no
level below it fits, with the memory calls of the pass shared by its groups (:class:`PassProbe`)
and the floor of the levels below a gate (memory_terms.RECOMPUTE_EXCESS) ruling out the bases that
can fit nowhere."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dayzero.planner.memory.memory_terms import RECOMPUTE_EXCESS
from dayzero.planner.search.search_space import _with
from dayzero.specs.grid import MODULE_BIT
from dayzero.specs.parallel import RECOMPUTES


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
    (:meth:`PassProbe.check`, with that bound: (indices, peak, fits, may fit)); ``drops(mask)``:
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


@dataclass
class PassProbe:
    """The memory calls of one pass of one ZeRO stage (``zb``: the bases with the stage and the
    pass's switches set), shared by its groups of bases. ``ahead``: pass -> {(recompute code, module
    mask): (bases,) peaks an earlier pass's memory calls gave (nan: none)}; ``excess_at``: {(recompute
    code, module mask): (bases,) their bytes above the floor (memory_terms.RECOMPUTE_EXCESS), nan: not
    known}, read with ahead's peaks: the passes ahead reads off only drop model states."""

    zb: dict
    pi: int
    n: int
    n_passes: int
    switches: object  # search_fit.SwitchPlan: its drops per pass
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


def climb_group(probe: PassProbe, rows: np.ndarray, allowed, levels, below: np.ndarray,
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
