"""Search the whole parallel space: enumerate, reject the indivisible, prune by memory, rank by
predicted step time.

The space is the cartesian product of per-dim options (tp, pp, cp, ep, etp, vpp, pipeline schedule,
mbs, zero, recompute, sequence parallelism, rank order; dp = devices / (tp pp cp), kept only where it
is one of the pinned dp degrees when those are given), held as the planner's grid
(:mod:`dayzero.specs.grid`). Enumeration is staged with numpy so a rejected prefix is counted
(times the size of the dims not yet expanded) without being materialised: after each dim is
expanded, every layout rule (:mod:`dayzero.specs.layout_rules`, the rules ParallelConfig.problems
reports) whose columns are now present is ANDed into a mask, together with the few limits that
define the space itself (:func:`space_mask`). Survivors are checked against device memory in one
vectorised call (:func:`dayzero.planner.memory.peak_memory_batch`), and only layouts that fit are
timed, in one vectorised call of the step-time model (:func:`dayzero.planner.perf.evaluate`).
Every layout considered ends in exactly one bucket: a plan, or rejected as ``indivisible``,
``does not fit`` or ``worse``. When no layout passes the rules, the error names the rules (and
pins) that rejected them, with how many layouts each rejected (:func:`why_none`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

import numpy as np

from dayzero.errors import FitError, LayoutError
from dayzero.planner.activation_offload import COLUMN as OFFLOAD
from dayzero.planner.engines import ENGINES, engine_mask, pipelined_fsdp, with_run
from dayzero.planner.explain import binding, family
from dayzero.planner.offload import HOST_MEMORY_PER_DEVICE
from dayzero.planner.perf import PerfOptions, evaluate
from dayzero.planner.targets import MEMORY_TARGET
from dayzero.planner.topology import scaleup_domain
from dayzero.specs.cluster import Cluster
from dayzero.specs.grid import (
    BOOLS,
    DUALPIPE,
    DUALPIPEV,
    FIELDS,
    FULL,
    INTERLEAVED,
    MODULE_BIT,
    ONE_F_ONE_B,
    TABLES,
    code,
    decode,
    default_schedule,
    module_mask,
    module_names,
)
from dayzero.specs.grid import SWITCHES as SWITCH_COLUMNS
from dayzero.specs.layout_rules import DEGREES, Where, field_problems, mask, rules_reading
from dayzero.specs.model import ModelSpec
from dayzero.specs.parallel import DENSE_ORDER, RECOMPUTES, ParallelConfig, even_split_fills, model_split

CHUNK = 100_000  # bases per vectorised batch (bounds memory)
# the order dims are expanded in (a base is every dim but zero and recompute)
STAGES = (("tp", "sequence_parallel", "rank_order"), ("pp",), ("cp",), ("ep",), ("etp",), ("vpp", "schedule"),
          ("mbs",))
VARIANTS = ("zero", "recompute")  # the recompute variants are its levels: SearchSpace.levels
VARIANT_COLUMNS = ("zero", "recompute", "recompute_modules", "recompute_layers",
                   *SWITCH_COLUMNS, OFFLOAD)  # set per base by the search
# The selective recompute module sets the search tries by default: every set of Megatron-Core's
# recompute modules (megatron/core/transformer/transformer_config.py ``recompute_modules``) that
# drops a different set of the model's saved tensors (planner.row_memory.recompute_modules_sets, the
# rule the backtest settles blank recompute with), not a nested ladder: Megatron-Bridge's presets
# recompute mla_up_proj alone on DeepSeek-V3 and Kimi-K2, mlp + moe_act on GB300
# (scripts/performance/configs/deepseek/deepseek_workload_base_configs.py), which no ladder holds.


def searched_memory(memory_options, space: SearchSpace | None):
    """``memory_options`` as the search's engine holds memory (:func:`dayzero.planner.engines.
    pipelined_fsdp`; unpinned, as the engines that run the layouts it changes)."""
    return memory_options.with_(pipelined_fsdp=pipelined_fsdp(space.engine if space else None))


def dropped_terms(spec: ModelSpec, mask: int) -> frozenset:
    """The saved tensors of ``spec``'s layers that selective recompute of the module set ``mask``
    drops (:func:`dayzero.planner.activations.module_terms`)."""
    from dayzero.planner.activations import Dims, layer_terms, module_terms
    from dayzero.planner.memory_options import MemoryOptions

    names = set()
    for k in set(spec.layer_types):
        names |= set(layer_terms(spec, k, MemoryOptions(), Dims(seq=1, mbs=1, tp=1, cp=1)))
    return frozenset(t for m in module_names(mask) for t in module_terms(spec, m, names))


def level_order(spec: ModelSpec, levels) -> np.ndarray:
    """``below[i, j]``: recompute level ``j`` recomputes everything level ``i`` does (i == j
    included): no recompute is below every level, full recompute above every level, and selective
    ``i`` below selective ``j`` when ``j`` drops every saved tensor ``i`` drops. Where ``i`` is below
    ``j``, ``j`` keeps no more memory and takes no less time (it replays a superset of the forward
    work), so once ``i`` fits, ``j`` fits but is never the faster choice."""
    n = len(levels)
    drops = [frozenset() if RECOMPUTES[rc] == "none" else None if RECOMPUTES[rc] == "full" else dropped_terms(spec, m)
             for rc, m in levels]
    below = np.zeros((n, n), dtype=bool)
    for i, a in enumerate(drops):
        for j, b in enumerate(drops):
            below[i, j] = b is None or (a is not None and a <= b)
    return below


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


@dataclass(frozen=True)
class SearchSpace:
    """Options per dim, in ParallelConfig's terms; None means the default list derived from the
    model and cluster."""

    tp: tuple[int, ...] | None = None
    pp: tuple[int, ...] | None = None
    cp: tuple[int, ...] | None = None
    ep: tuple[int, ...] | None = None
    etp: tuple[int, ...] | None = None
    vpp: tuple[int, ...] | None = None
    mbs: tuple[int, ...] = (1, 2, 4, 8)
    zero: tuple[int, ...] = (0, 1, 2, 3)
    recompute: tuple[str, ...] = RECOMPUTES
    # module sets selective recompute is tried with (None: every distinct set that applies)
    recompute_modules: tuple[tuple[str, ...], ...] | None = None
    # with tp > 1 (it only removes work and memory); a tp = 1 layout is one layout, without it
    sequence_parallel: tuple[bool, ...] = (True,)
    rank_order: tuple[str, ...] = (DENSE_ORDER,)
    engine: str | None = None  # only layouts this engine runs as laid out (planner.engines)
    # pinned data-parallel degrees: only layouts whose dp = devices / (tp pp cp) is one of them
    dp: tuple[int, ...] | None = None
    # memory switches the search keeps off (planner.switches: --no-fp8-param-gather, --no-optimizer-offload;
    # activation_offload_layers: --no-activation-offload, planner.search.offloaded_variants)
    no_switches: tuple[str, ...] = ()
    # pinned pipeline schedules (None: interleaved 1F1B with vpp > 1, else 1F1B); 1f1b keeps vpp 1,
    # interleaved vpp > 1 (with one chunk per rank it runs as 1F1B), gpipe any vpp
    schedule: tuple[str, ...] | None = None

    def pins(self) -> str:
        """The options set away from the defaults, as the plan flags that set them (``--tp 4,8
        --dp 16``; empty when none is)."""
        out = []
        for f in fields(self):
            value = getattr(self, f.name)
            if value == f.default:
                continue
            if f.name == "no_switches":  # --no-fp8-param-gather ...; --no-activation-offload
                out += ["--no-activation-offload" if name == OFFLOAD else f"--no-{name.replace('_', '-')}"
                        for name in value]
                continue
            if isinstance(value, tuple):
                value = ",".join(("on" if v else "off") if isinstance(v, (bool, np.bool_)) else str(v) for v in value)
            out.append(f"--{f.name.replace('_', '-')} {value}")
        return " ".join(out)

    def levels(self, spec: ModelSpec, switches: dict | None = None) -> list[tuple[int, int]]:
        """The recompute variants as (recompute code, module bitmask), in an order where a level
        comes after every level it recomputes less than (:func:`level_order`): none, selective with
        each module set (``self.recompute_modules``, by default every distinct set that drops
        something on ``spec``: :func:`dayzero.planner.row_memory.recompute_modules_sets`), fewest
        dropped tensors first, full; only the recompute modes in ``self.recompute``."""
        from dayzero.planner.row_memory import recompute_modules_sets

        out = []
        for rc in sorted(code("recompute", r) for r in self.recompute):
            if RECOMPUTES[rc] != "selective":
                out.append((rc, 0))
                continue
            sets = recompute_modules_sets(spec) if self.recompute_modules is None else self.recompute_modules
            masks = []
            for ms in sets:
                bad = [m for m in ms if m not in MODULE_BIT]
                if bad or not ms:
                    raise LayoutError(f"search space: recompute modules {'+'.join(ms) or '(none)'}: must be a "
                                      f"non-empty set of {', '.join(MODULE_BIT)}")
                mask = module_mask(ms)
                if mask not in masks:
                    masks.append(mask)
            # fewest dropped tensors first: a set comes after every set that drops less (level_order)
            out += [(rc, m) for m in sorted(masks, key=lambda m: len(dropped_terms(spec, m)))]
        if self.engine:  # an engine without Megatron's recompute modules: those layouts are not in the space
            from dayzero.planner.engines import engine_mask

            ok = engine_mask(self.engine, {"recompute": np.array([rc for rc, _ in out]),
                                           "recompute_modules": np.array([m for _, m in out])}, switches)
            out = [lv for lv, keep in zip(out, ok) if keep]
        return out

    def resolve(self, spec: ModelSpec, devices: int, seq: int, domain: int) -> dict[str, tuple[int, ...]]:
        """Grid codes per dim. Default lists: tp divides the heads and stays inside one scale-up
        domain (a per-layer all-reduce over the scale-out network is never competitive); pp up to
        layers + 2 (embedding and loss may take a stage each); cp up to 32; ep any divisor of the
        experts; etp up to 8; vpp up to 8 or any count splitting the layers evenly. An option no
        layout could use (a degree below 1, an unknown name) is a LayoutError."""
        a, L = spec.attention, spec.layers
        tp = self.tp or tuple(d for d in _divisors(a.heads) if d <= min(64, domain) and devices % d == 0)
        pp = self.pp or tuple(d for d in _divisors(devices) if d <= min(L + 2, 128))
        cp = self.cp or tuple(d for d in (1, 2, 4, 8, 16, 32) if devices % d == 0 and (d == 1 or seq % (2 * d) == 0))
        if spec.moe is not None and spec.is_moe:
            ep = self.ep or tuple(d for d in _divisors(spec.moe.experts) if d <= devices)
            etp = self.etp or tuple(d for d in tp if d <= 8)
        else:
            ep, etp = self.ep or (1,), self.etp or (1,)
        vpp = self.vpp or tuple(sorted(set(range(1, 9)) | {v for p in pp for v in range(9, 33)
                                                          if L % (p * v) == 0 or (L + 2) % (p * v) == 0}))
        sp = tuple(sorted(set(self.sequence_parallel)))
        if self.engine and sp == (True,):  # the default: let an engine without SP keep its TP layouts
            sp = (False, True)
        if not sp or any(not isinstance(x, (bool, np.bool_)) and x not in (0, 1) for x in sp):
            raise LayoutError(f"sequence-parallel options must be a non-empty subset of (False, True), got "
                              f"{self.sequence_parallel}")
        # without pinned schedules one placeholder, replaced by the default per vpp (enumerate_layouts)
        schedule = self.schedule if self.schedule is not None else ("1f1b",)
        opts = dict(tp=tp, pp=pp, cp=cp, ep=ep, etp=etp, vpp=vpp, schedule=schedule, mbs=self.mbs, zero=self.zero,
                    recompute=self.recompute, sequence_parallel=tuple(bool(x) for x in sp), rank_order=self.rank_order)
        if self.dp is not None:
            opts["dp"] = self.dp
        for dim, values in opts.items():
            if not values:
                raise LayoutError(f"search space: no {dim} options")
            for v in values:
                bad = field_problems(dim, v)
                if bad:
                    raise LayoutError(f"search space: {dim} option {v!r}: {'; '.join(bad)}")
        return {dim: tuple(code(dim, v) if dim in TABLES else int(v) for v in values) for dim, values in opts.items()}


def space_mask(g: dict, spec: ModelSpec) -> np.ndarray:
    """The limits that define the space beyond the layout rules, on the columns present: the
    layers split near-evenly with every middle stage holding some (Megatron's embedding/loss
    accounting), and more than 8 virtual stages only where they split the layers exactly."""
    ok = np.ones(len(g["tp"]), dtype=bool)
    if "vpp" in g:
        L, stages = spec.layers, g["pp"] * g["vpp"]
        ok &= even_split_fills(L, stages)
        ok &= (g["vpp"] <= 8) | (L % stages == 0) | ((L + 2) % stages == 0)
    return ok


def _layout_at(g: dict, i: int) -> ParallelConfig:
    """Row ``i`` of a partly expanded grid as a ParallelConfig (columns not expanded yet: defaults)."""
    kw = {}
    for f in FIELDS:
        if f in g:
            v = int(g[f][i])
            kw[f] = TABLES[f][v] if f in TABLES and 0 <= v < len(TABLES[f]) else v
    kw.update({b: bool(kw.get(b, 0)) for b in BOOLS})
    kw["recompute_modules"] = module_names(max(kw.get("recompute_modules", 0), 0))
    kw["recompute_layers"] = kw.get("recompute_layers") or None
    return ParallelConfig(**kw)


def pin_checks(g: dict, space: SearchSpace, devices: int) -> list[tuple[np.ndarray, object]]:
    """The pins that are not a dim's own option list, on the columns present: (rows inside, the
    message for row i). dp is derived (devices / (tp pp cp)), so a pinned dp keeps the rows that
    derive one of its values; a pinned schedule is kept only with the vpp it runs as (1F1B one
    model chunk per rank, interleaved several)."""
    out = []
    if space.dp is not None and "dp" in g:
        pinned = ",".join(map(str, space.dp))
        out.append((np.isin(g["dp"], space.dp),
                    lambda i: f"dp {int(g['dp'][i])} = {devices} devices / (tp*pp*cp = {int(g['tp'][i])}*"
                              f"{int(g['pp'][i])}*{int(g['cp'][i])}) is not among --dp {pinned}"))
    if space.schedule is not None and "schedule" in g:
        out.append(((g["schedule"] != ONE_F_ONE_B) | (g["vpp"] == 1),
                    lambda i: f"the 1f1b schedule runs one model chunk per rank, got vpp {int(g['vpp'][i])} "
                              "(with virtual stages it is the interleaved schedule)"))
        out.append(((g["schedule"] != INTERLEAVED) | (g["vpp"] > 1),
                    lambda i: f"the interleaved schedule needs vpp > 1, got vpp {int(g['vpp'][i])} (with one "
                              "model chunk per rank it runs as 1f1b)"))
    return out


def why_none(g: dict, spec: ModelSpec, devices: int, rules, pins, later: int, space: SearchSpace) -> str:
    """Why no row of ``g`` passes: every row is put down to the first check it fails (the
    device-count rule, the pins, the degree rules, the other rules, the space's own limits, in that
    order), and the checks that rejected most are named with one example each and the number of
    layouts (rows x ``later``) they rejected."""
    where = Where(spec, devices)
    device_rule = [r for r in rules if r.reads == ("tp", "cp", "dp", "pp")]
    rest = [r for r in rules if r.degree] + [r for r in rules if not r.degree and r not in device_rule]
    checks = [*((r, None) for r in device_rule), *((None, pin) for pin in pins), *((r, None) for r in rest)]
    alive = np.ones(len(g["tp"]), dtype=bool)
    safe = {k: (np.maximum(v, 1) if k in DEGREES else v) for k, v in g.items()}
    counts = []
    with np.errstate(all="ignore"):
        for rule, pin in checks:
            if pin is not None:
                ok, says = pin
            else:
                ok = np.broadcast_to(np.asarray(rule.ok(g if rule.degree else safe, where), dtype=bool), alive.shape)
                says = (lambda r: lambda i: r.says(_layout_at(g, i), where))(rule)
            bad = alive & ~ok
            if bad.any():
                counts.append((int(bad.sum()) * later, says(int(np.argmax(bad)))))
            alive &= ok
        bad = alive & ~space_mask(g, spec)
    if bad.any():
        i = int(np.argmax(bad))
        counts.append((int(bad.sum()) * later, f"pp*vpp = {int(g['pp'][i])}*{int(g['vpp'][i])} stages do not split "
                                               f"the {spec.layers} layers near-evenly with every middle stage holding "
                                               "some (more than 8 virtual stages must split them exactly)"))
    counts.sort(key=lambda c: -c[0])
    pins_text = space.pins()
    head = (f"no layout of {spec.name} on {devices:,} devices passes the layout rules"
            + (f" with {pins_text}" if pins_text else ""))
    shown = "; ".join(f"{n:,} rejected: {msg}" for n, msg in counts[:3])
    more = f"; {len(counts) - 3} more reasons" if len(counts) > 3 else ""
    return f"{head}: {shown}{more}" + ("; change or drop those options" if pins_text else "")


@dataclass
class SearchResult:
    candidates: dict  # grid of the top plans, best first
    evaluation: object  # perf Evaluation of the top plans
    peak_bytes: np.ndarray
    considered: int
    rejected: dict = field(default_factory=dict)
    timed: int = 0  # layouts whose step time was evaluated


def _mesh(**opts) -> dict[str, np.ndarray]:
    names = list(opts)
    grids = np.meshgrid(*[np.asarray(opts[n], dtype=np.int64) for n in names], indexing="ij")
    return {n: g.ravel() for n, g in zip(names, grids)}


def _take(g: dict, mask: np.ndarray) -> dict:
    return {k: v[mask] for k, v in g.items()}


def _cross(g: dict, name: str, values) -> dict:
    """Every row of ``g`` combined with every value of ``values`` for ``name``."""
    vals = np.asarray(values, dtype=np.int64)
    n = len(next(iter(g.values()))) if g else 1
    out = {k: np.repeat(v, len(vals)) for k, v in g.items()}
    out[name] = np.tile(vals, n)
    return out


def searched_schedules(g: dict) -> dict:
    """The rows the search adds beside each vpp's default schedule: DualPipeV for every two-chunk
    pipeline (vpp 2, pp > 1) whose tp, pp, cp, ep and etp passed, which torchtitan runs (torch.distributed.pipelining
    ScheduleDualPipeV); the rows no engine runs at their ZeRO stage are dropped later
    (:func:`_fitting_variants`). DualPipe, which no engine of planner.engines runs, is tried only
    when ``--schedule`` pins it."""
    rows = (g["vpp"] == 2) & (g["pp"] > 1)
    out = _take(g, rows)
    out["schedule"] = np.full(int(rows.sum()), DUALPIPEV, dtype=np.int64)
    return out


def enumerate_layouts(spec: ModelSpec, devices: int, gbs: int, seq: int, space: SearchSpace,
                      domain: int = 8, precision: str = "bf16") -> tuple[dict, int, int, int]:
    """All valid *bases* (every dim but zero and recompute), as a grid.

    Returns (bases, considered, indivisible, variants): ``considered`` and ``indivisible`` count
    full layouts (a base times its ``variants`` = |zero| x |recompute levels| options,
    SearchSpace.levels); layouts outside the
    pins (:func:`pin_checks`) are not considered. Raises LayoutError, naming why
    (:func:`why_none`), when no layout passes."""
    for name, value in (("gbs", gbs), ("seq", seq), ("precision", precision)):
        bad = field_problems(name, value)
        if bad:
            raise LayoutError(f"search: {'; '.join(bad)}")
    o = space.resolve(spec, devices, seq, domain)
    if space.dp is not None and not any(devices % d == 0 for d in space.dp):
        raise LayoutError(f"--dp {','.join(map(str, space.dp))}: dp must divide the {devices:,} devices "
                          "(tp*cp*dp*pp = devices)")
    variants = len(o["zero"]) * len(space.levels(spec))

    def later(i: int) -> int:  # full layouts behind one row after stage i
        return variants * int(np.prod([len(o[d]) for stage in STAGES[i + 1:] for d in stage]))

    g = _mesh(**{d: o[d] for d in STAGES[0]})
    # sequence parallelism exists only with tp > 1: a tp = 1 layout is one layout, sp off
    sp = g["sequence_parallel"]
    g = _take(g, (g["tp"] > 1) | (sp == np.min(o["sequence_parallel"])))
    g["sequence_parallel"] = np.where(g["tp"] > 1, g["sequence_parallel"], 0)
    n = len(g["tp"])
    for name, value in (("gbs", gbs), ("seq", seq), ("precision", code("precision", precision))):
        g[name] = np.full(n, value, dtype=np.int64)
    considered = n * later(0)
    indivisible = 0
    applied: set = set()
    for i, stage in enumerate(STAGES):
        if i:
            for d in stage:
                g = _cross(g, d, o[d])
        if "cp" in stage:
            g["dp"] = devices // (g["tp"] * g["pp"] * g["cp"])  # the device-count rule rejects a remainder
        if "vpp" in stage and space.schedule is None:
            g["schedule"] = default_schedule(g["vpp"])
            # DualPipeV beside every two-chunk row whose earlier dims passed (its own rules follow)
            extra = searched_schedules(g)
            considered += len(extra["tp"]) * later(i)
            g = {k: np.concatenate([g[k], extra[k]]) for k in g}
        rules = tuple(r for r in rules_reading(g, spec, devices) if r not in applied)
        applied.update(rules)
        pins = pin_checks(g, space, devices)
        inside = np.logical_and.reduce([ok for ok, _ in pins]) if pins else np.ones(len(g["tp"]), dtype=bool)
        ok = inside & mask(g, spec, devices, rules) & space_mask(g, spec)
        considered -= int((~inside).sum()) * later(i)
        indivisible += int((inside & ~ok).sum()) * later(i)
        if not ok.any():
            raise LayoutError(why_none(g, spec, devices, rules, pins, later(i), space))
        g = _take(g, ok)
    return g, considered, indivisible, variants


def _with(g: dict, **cols) -> dict:
    n = len(g["tp"])
    return {**g, **{k: np.full(n, v, dtype=np.int64) if np.ndim(v) == 0 else v for k, v in cols.items()}}


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
    of level ``union`` (the gate above every selective level): where such a short set does not fit,
    no level dropping only tensors it drops fits either (memory falls only with the tensors
    dropped), so the base is not checked there. Probes the bases in ``where`` (flags) with ``check``
    (_fitting_variants' memory probe); ``drops(mask)``: the tensors a module set drops
    (:func:`dropped_terms`). Returns (bases, allowed levels) flags."""
    rc = levels[allowed[union]][0]
    may = np.ones((len(where), len(allowed)), dtype=bool)
    selective = [i for i, a in enumerate(allowed) if RECOMPUTES[levels[a][0]] == "selective"]
    whole = int(np.bitwise_or.reduce([levels[allowed[i]][1] for i in selective])) if selective else 0
    # the short sets that drop less than the union (only those can fail where the union fits)
    shorts = [whole & ~b for b in MODULE_BIT.values() if whole & b and whole & ~b]
    shorts = [m for m in shorts if drops(m) < drops(whole)]
    if RECOMPUTES[rc] != "selective" or not where.any() or not shorts:
        return may
    for short, (picked, _, ok) in zip(shorts, check([((rc, m), where) for m in shorts])):
        inside = [i for i in selective if drops(levels[allowed[i]][1]) <= drops(short)]
        may[np.ix_(picked[~ok], inside)] = False
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


def _runs_at_levels(g: dict, levels, run_switches: dict | None = None) -> np.ndarray:
    """(rows, levels): some engine of planner.engines runs row i of ``g`` at recompute level j
    (``engine_mask`` of every row at every level, with each engine's limits split into those that
    read only the rows' columns, only the level's, or both: the first two are evaluated once; the
    run's switches read as columns where on, as engine_mask reads them)."""
    n, width = len(g["tp"]), len(levels)
    g = with_run(g, run_switches)
    lv = {"recompute": np.array([rc for rc, _ in levels], dtype=np.int64),
          "recompute_modules": np.array([m for _, m in levels], dtype=np.int64)}
    out = np.zeros((n, width), dtype=bool)
    for e in ENGINES.values():
        row_ok, level_ok, both = np.ones(n, dtype=bool), np.ones(width, dtype=bool), []
        for lim in e.limits:
            reads = set(lim.reads)
            if not reads & set(LEVEL_COLUMNS):
                if reads <= set(g):
                    row_ok &= np.broadcast_to(np.asarray(lim.ok(g), dtype=bool), (n,))
            elif reads <= set(LEVEL_COLUMNS):
                level_ok &= np.broadcast_to(np.asarray(lim.ok(lv), dtype=bool), (width,))
            elif reads <= set(g) | set(LEVEL_COLUMNS):
                both.append(lim)
        runs = row_ok[:, None] & level_ok[None, :]
        for lim in both:
            for j, (rc, m) in enumerate(levels):
                runs[:, j] &= np.broadcast_to(np.asarray(lim.ok(_with(g, recompute=rc, recompute_modules=m)),
                                                         dtype=bool), (n,))
        out |= runs
    return out


@dataclass(frozen=True)
class SwitchPlan:
    """How the search sets the memory switches (:mod:`dayzero.planner.switches`): ``saves`` on
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

    def held(self, bases: dict, z: int, engine, run_switches: dict | None = None) -> dict[str, np.ndarray]:
        """The switch columns every pass of ZeRO stage ``z`` shares (the ladder's start off)."""
        n = len(bases["tp"])
        cols = {s: np.zeros(n, dtype=np.int64) for s in SWITCH_COLUMNS}
        zb = _with(bases, zero=z)
        for name in self.forced:
            cols[name] = self.rule_ok({**zb, **cols, name: np.ones(n, dtype=np.int64)}).astype(np.int64)
        for name in self.saves:
            trial = {**zb, **cols, name: np.ones(n, dtype=np.int64)}
            cols[name] = (self.rule_ok(trial) & _engine_runs(engine, trial, run_switches)).astype(np.int64)
        return cols

    def passes(self) -> list[dict[str, int]]:
        """The ladder's passes: none of it, then one more last-resort switch on each."""
        return [{name: 1 for name in self.ladder[:k]} for k in range(len(self.ladder) + 1)]


def _fitting_variants(spec, bases: dict, zeros, levels, memory, limit, engine=None,
                      searched_dual: bool = False, below: np.ndarray | None = None,
                      switches: SwitchPlan | None = None, memory_less=None,
                      run_switches: dict | None = None) -> tuple[list, int, int]:
    """For each base and ZeRO stage, the recompute levels (``levels``: SearchSpace.levels) that fit
    with no fitting level below them (``below``: :func:`level_order`, default a chain in the given
    order): a level above a fitting one keeps less memory but only adds time, so it is never the
    fastest; the search times the rest and keeps the fastest. Memory falls as recompute grows (but
    not always as ZeRO grows: ZeRO-3's gathered layers and ZeRO-2's buckets can cost more than they
    save), so each ZeRO stage is checked under a level above all the others first (full recompute;
    a base that does not fit there fits nowhere), and the rest go up the levels in order, each
    checked only on the bases that no level below it fits. ZeRO-2 is kept only at levels where
    ZeRO-1 does not fit (it adds a reduce-scatter per micro-batch and nothing else).

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
    everything = tuple(range(len(levels)))
    out, n_fit, n_engine = [], 0, 0
    fits_at = {}  # (ZeRO stage, pass) -> (bases, levels) fitting by that pass, a level above a fitting one included
    held_at = {}  # ZeRO stage -> the switch columns held
    known: dict[int, frozenset] = {}

    def drops(mask: int) -> frozenset:
        if mask not in known:
            known[mask] = dropped_terms(spec, mask)
        return known[mask]
    for z in sorted(zeros):
        held_at[z] = held = switches.held(bases, z, engine, run_switches)
        fitting = np.zeros((n, len(levels)), dtype=bool)  # fits (or a level below does), by some pass so far
        found = []
        # pass -> {(recompute code, module mask): (bases,) peaks an earlier pass's memory calls gave (nan: none)}
        ahead: dict[int, dict] = {}
        passes = switches.passes()
        for pi, on in enumerate(passes):
            zb = _with(bases, zero=z, **{**held, **on})
            groups = [(np.arange(n), everything)]  # (rows, the level indices they may take)
            if engine:
                runs = engine_mask(engine, zb, run_switches)
                n_engine += int((~runs).sum()) * len(levels) * (pi == 0)
                groups = [(np.flatnonzero(runs), everything)]
            elif searched_dual:  # an unpinned search: each row only at the ZeRO stages and levels some engine
                # runs it with (a plan is a layout an engine can run); DualPipe, which none runs, is only
                # tried when pinned, so it is not filtered
                dual = np.flatnonzero(bases["schedule"] != DUALPIPE)
                if len(dual):
                    runs = _runs_at_levels({k: v[dual] for k, v in zb.items()}, levels, run_switches)  # (rows, levels)
                    n_engine += int((~runs).sum()) * (pi == 0)
                    groups = [(np.flatnonzero(bases["schedule"] == DUALPIPE), everything)]
                    which = _row_patterns(runs)  # rows with the same levels allowed share a number
                    for k in np.unique(which):
                        allowed = np.flatnonzero(runs[np.argmax(which == k)])
                        if len(allowed):
                            groups.append((dual[which == k], tuple(allowed.tolist())))
            if pi:  # a last-resort switch only where an engine runs it
                ok_rows = _engine_runs(engine, zb, run_switches)
                groups = [(rows[ok_rows[rows]], allowed) for rows, allowed in groups]
            for rows, allowed in groups:
                if not len(rows):
                    continue
                allowed = np.asarray(allowed)
                sub = below[np.ix_(allowed, allowed)]
                # fits, or a level below it does (by an earlier pass: with fewer switches, so faster)
                fit = fitting[np.ix_(rows, allowed)]
                alive = ~fit.all(axis=1)

                def check(asked):
                    """[((recompute code, module mask), bases)] -> [(the bases' indices, peak, fits)], in
                    one memory call (the peaks an earlier pass read off for this one not asked again)."""
                    if not asked:
                        return []
                    picks = [np.flatnonzero(where) for _, where in asked]
                    at = np.concatenate(picks)
                    if not len(at):
                        return [(p, np.zeros(0), np.zeros(0, dtype=bool)) for p in picks]
                    rc = np.concatenate([np.full(len(p), lv[0]) for (lv, _), p in zip(asked, picks)]).astype(np.int64)
                    mods = np.concatenate([np.full(len(p), lv[1]) for (lv, _), p in zip(asked, picks)]).astype(np.int64)
                    known = ahead.get(pi, {})
                    peak = np.concatenate([known[lv][rows[p]] if lv in known else np.full(len(p), np.nan)
                                           for (lv, _), p in zip(asked, picks)])
                    todo = np.flatnonzero(np.isnan(peak))
                    if len(todo):
                        grid = _with({k: v[rows[at[todo]]] for k, v in zb.items()}, recompute=rc[todo],
                                     recompute_modules=mods[todo])
                        later = [k for k in range(pi + 1, len(passes)) if switches.drops[k] is not None]
                        if later and memory_less is not None:
                            peak[todo], less = memory_less(grid, tuple(switches.drops[k] for k in later))
                            for k, pk in zip(later, less):  # the peaks of the later passes, for when they ask
                                for lv in set(zip(rc[todo].tolist(), mods[todo].tolist())):
                                    here = (rc[todo] == lv[0]) & (mods[todo] == lv[1])
                                    col = ahead.setdefault(k, {}).setdefault(lv, np.full(n, np.nan))
                                    col[rows[at[todo[here]]]] = pk[here]
                        else:
                            peak[todo] = memory(grid)
                    cuts = np.cumsum([len(p) for p in picks])[:-1]
                    return [(p, pk, pk <= limit) for p, pk in zip(picks, np.split(peak, cuts))]

                def record(j, picked, peak):
                    fit[np.ix_(picked, np.flatnonzero(sub[j]))] = True  # j and every level above it fit
                    found.append((rows[picked], allowed[j], peak, pi))

                # gates: a level above all others (full recompute), then one above all but it (every
                # selective module at once); a base that does not fit under a gate fits at none of the
                # levels below it, so it takes the gate above (or nothing) without the climb
                gates, rest = [], list(range(len(allowed)))
                for _ in range(2):
                    top = [j for j in rest if sub[np.ix_(rest, [j])].all()]
                    if not top or len(rest) < 3:
                        break
                    gates.append(top[0])
                    rest.remove(top[0])
                layers = [[j for j in layer if j not in gates] for layer in _layers(sub)]
                gate_rows = gate_peak = None  # the bases under the latest gate that fit there, their peaks

                may = np.ones_like(fit)  # the levels a base may still fit at (needs: below)

                def climb(layer):
                    todo = [(j, alive & ~fit[:, j] & may[:, j]) for j in layer]  # the bases no level below j fits
                    todo = [(j, where) for j, where in todo if where.any()]
                    for j, (picked, peak, ok) in zip([j for j, _ in todo],
                                                     check([(levels[allowed[j]], where) for j, where in todo])):
                        record(j, picked[ok], peak[ok])

                def settle_gate(j):
                    """The bases that fit under gate ``j`` and at no level below it found so far take it."""
                    left = gate_rows[alive[gate_rows] & ~fit[gate_rows, j]]
                    record(j, left, gate_peak[np.searchsorted(gate_rows, left)])
                    alive[left] = False

                if gates:  # a base an earlier pass fits under the gate fits there now (memory only fell)
                    (picked, peak, ok), = check([(levels[allowed[gates[0]]], alive & ~fit[:, gates[0]])])
                    alive[picked[~ok]] = False
                    gate_rows, gate_peak = picked[ok], peak[ok]
                climb(layers[0])  # no recompute (the least), before the second gate
                if len(gates) == 2:
                    (picked, peak, ok), = check([(levels[allowed[gates[1]]], alive & ~fit[:, gates[1]])])
                    alive[picked[ok]] = False  # held back from settle_gate: they fit under the second gate
                    settle_gate(gates[0])  # fit under full recompute only
                    alive[picked[ok]] = True
                    gate_rows, gate_peak = picked[ok], peak[ok]
                    # the bases under the second gate: those that fit there now, and (a later pass) before
                    under = np.isin(np.arange(len(rows)), picked[ok]) | (alive & fit[:, gates[1]])
                    may &= _needs(levels, allowed, gates[1], under, check, drops)
                for layer in layers[1:]:
                    climb(layer)
                if gates:
                    settle_gate(gates[-1])
                fitting[np.ix_(rows, allowed)] = fit
            fits_at[z, pi] = fitting.copy()
        n_fit += int(fitting.sum())
        for idx, j, peak, pi in found:
            if z == 2 and (1, pi) in fits_at:  # ZeRO-2 only where ZeRO-1 (with no more switches) does not fit
                # there: ZeRO-1 then takes no more time (ZeRO-2 adds a reduce-scatter per micro-batch)
                same = np.logical_and.reduce([held_at[1][s][idx] >= held[s][idx] for s in SWITCH_COLUMNS])
                keep = ~(fits_at[1, pi][idx, j] & same)
                idx, peak = idx[keep], peak[keep]
            cols = {s: np.full(len(idx), 0, dtype=np.int64) + held[s][idx] for s in SWITCH_COLUMNS}
            for s, v in switches.passes()[pi].items():
                cols[s] = np.full(len(idx), v, dtype=np.int64)
            out.append((idx, z, np.full(len(idx), j, dtype=np.int64), peak, cols, pi))
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
    offload: fewer than it, planner.activation_offload.check_activation_offload)."""
    stages = np.asarray(pp) * np.asarray(vpp)
    out = np.zeros(len(stages), dtype=np.int64)
    for s in np.unique(stages):
        split = [x for x in model_split(spec.layers, int(s), spec.mtp_layers) if x > 0]
        out[stages == s] = min(split) if split else 0
    return out


def offloaded_variants(spec: ModelSpec, bases: dict, zeros, levels, memory, limit: float,
                       switches: SwitchPlan, engine=None, run_switches: dict | None = None,
                       host_bytes: float | None = None) -> tuple[dict, np.ndarray, np.ndarray, int]:
    """The activation-offload rows (:mod:`dayzero.planner.activation_offload`) the search times beside
    :func:`_fitting_variants`' levels: for each base, ZeRO stage and pass of the last-resort ladder
    where no recompute does not fit and an engine runs the base with offload there (Megatron-Core:
    pp 1, recompute none; planner.engines), the fewest offloaded layers per chunk that fit
    (:func:`dayzero.planner.activation_offload.fewest_offloaded_layers`). Offload trades memory for
    PCIe time as recompute trades it for compute, so neither is faster by the models and both are
    timed; where no recompute fits, offload only adds time and is not tried. Pruning stays exact:
    a row is left out where one that takes no more time and no less of it fits: the same ZeRO stage
    one rung down the ladder (fewer switches) with at most as many layers offloaded, and for ZeRO-2
    the ZeRO-1 row of the same pass with at most as many (ZeRO-2 adds a reduce-scatter per
    micro-batch and nothing else; planner.activation_offload: time grows with the layers offloaded).
    The offloaded bytes must fit the device's share of host memory (``host_bytes``, default
    :data:`dayzero.planner.offload.HOST_MEMORY_PER_DEVICE`): the fewest layers hold the least, so a
    row whose fewest do not fit there is dropped.

    Returns (the rows as a grid with every variant column set, their peaks, their rungs, the (base,
    ZeRO stage) layouts without recompute that only offload makes fit, which the caller counts as
    fitting)."""
    from dayzero.planner.activation_offload import COLUMN, fewest_offloaded_layers

    host_bytes = HOST_MEMORY_PER_DEVICE if host_bytes is None else host_bytes
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
            got = np.full(n, -1, dtype=np.int64)  # layers offloaded; 0: fits without; -1: no offload row
            idx = np.flatnonzero(cand)
            if len(idx):  # first at the most layers offloaded: a row that does not fit there fits at none
                sub = {k: v[idx] for k, v in g.items()}
                most = memory({**sub, COLUMN: top[idx] - 1}) <= limit
                idx, sub = idx[most], {k: v[most] for k, v in sub.items()}
            if len(idx):
                plain[idx] = memory({**sub, COLUMN: np.zeros(len(idx), dtype=np.int64)})
                fits = plain[idx] <= limit
                none_fits[idx[fits]] = True
                idx, sub = idx[~fits], {k: v[~fits] for k, v in sub.items()}
                if len(idx):
                    k = fewest_offloaded_layers(memory, sub, limit, top[idx])
                    got[idx] = np.where(k > 0, k, -1)
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
            # budget on those bytes, so an upper bound) within the device's share of host memory
            on_host = plain[idx] - pk <= host_bytes
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
    """How this search sets each memory switch (:mod:`dayzero.planner.switches`): forced on by the
    user's flag, kept off by ``space.no_switches``, else by its kind on this cluster."""
    from dayzero.planner import switches as sw

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
                      rule_ok=sw.rule_mask(spec, cluster.devices), drops=tuple(drops))


def search(spec: ModelSpec, cluster: Cluster, gbs: int, seq: int, precision: str = "bf16",
           options: PerfOptions | None = None, top_k: int = 5, max_memory: float = MEMORY_TARGET,
           space: SearchSpace | None = None, memory_fn=None, memory_options=None) -> SearchResult:
    """Best ``top_k`` layouts by predicted step time among those whose peak memory is at most
    ``max_memory`` x device capacity, with GEMMs in ``precision`` (bf16 | fp8 | fp4). Raises
    FitError when none fits.

    Pruning is exact under the models: for each ZeRO stage only the recompute levels that fit with
    no fitting level below them are timed (:func:`level_order`: a level above recomputes more and
    only adds time), the fastest of them ranked, and ZeRO-2 only at levels where ZeRO-1 does not fit
    (ZeRO-2 adds a reduce-scatter per micro-batch and nothing else). The memory switches
    (:mod:`dayzero.planner.switches`) are set per row: FP8 parameter gather wherever an engine runs
    it (it only saves), optimizer offload only at the (base, ZeRO, level)s where nothing at or below
    that level fits without it (it only adds time), and, for a row under full recompute of N
    layers, offloaded with fewer replayed layers (:func:`fewer_layers_up_the_ladder`)."""
    default_memory = memory_fn is None
    if memory_fn is None:
        from dayzero.planner.memory import MemoryOptions
        from dayzero.planner.memory import peak_memory_batch as memory_fn  # noqa: N813

        options = options or PerfOptions()
        memory_options = searched_memory(memory_options or MemoryOptions.for_run(cluster.accelerator,
                                                                                 options.attention_kernel), space)
    options = options or PerfOptions()
    space = space or SearchSpace()
    devices, domain = cluster.devices, scaleup_domain(cluster)
    bases, considered, indivisible, variants = enumerate_layouts(spec, devices, gbs, seq, space, domain, precision)
    engine_bases = engine_zero = 0  # full layouts the engine cannot run: by their base, by their ZeRO stage
    if space.engine:  # the engine's limits on every column but zero (applied per ZeRO stage below)
        runs = engine_mask(space.engine, bases, options.switches())  # with the run's switches (engines.RUN_SWITCHES)
        engine_bases = int((~runs).sum()) * variants
        bases = _take(bases, runs)
    n = len(bases["tp"])
    codes = space.resolve(spec, devices, seq, domain)
    capacity = cluster.memory_bytes
    limit = max_memory * capacity

    def memory(grid: dict) -> np.ndarray:
        if memory_options is None:
            return np.asarray(memory_fn(spec, grid, capacity), dtype=float)
        return np.asarray(memory_fn(spec, grid, capacity, memory_options), dtype=float)

    memory_less = None
    if default_memory:  # peak_memory_batch prices the term-dropping switches in the same call
        def memory_less(grid: dict, without):
            return memory_fn(spec, grid, capacity, memory_options, without=without)

    zeros, levels = codes["zero"], space.levels(spec, options.switches())
    if not levels:  # the engine runs none of the recompute modes asked for with the run's switches
        from dayzero.errors import ConfigError

        raise ConfigError("--engine", None, f"{space.engine} runs none of the recompute modes "
                          f"{', '.join(space.recompute)} with "
                          f"{', '.join(f'{k} {v}' for k, v in options.switches().items() if v)}; widen --recompute")
    switches = switch_plan(spec, cluster, options, memory_options, space)
    # activation offload (planner.activation_offload): pinned by the run's --activation-offload N, kept off
    # by --no-activation-offload (SearchSpace.no_switches), else tried where nothing fits without it
    pinned = max(options.activation_offload_layers, getattr(memory_options, "activation_offload_layers", 0) or 0)
    offload_searched = not pinned and OFFLOAD not in space.no_switches
    below = level_order(spec, levels)
    level_rc = np.array([rc for rc, _ in levels], dtype=np.int64)
    level_modules = np.array([m for _, m in levels], dtype=np.int64)
    best_rows, best_step, best_peak = [], [], []
    n_fit = n_timed = 0
    for start in range(0, n, CHUNK):
        chunk = {k: v[start:start + CHUNK] for k, v in bases.items()}
        found, fit_here, engine_here = _fitting_variants(spec, chunk, zeros, levels, memory, limit, space.engine,
                                                         searched_dual=space.schedule is None, below=below,
                                                         switches=switches, memory_less=memory_less,
                                                         run_switches=options.switches())
        n_fit += fit_here
        engine_zero += engine_here
        off = None
        if offload_searched:  # activation offload where no recompute does not fit (offloaded_variants)
            off, off_peaks, _, rescued = offloaded_variants(spec, chunk, zeros, levels, memory, limit, switches,
                                                            space.engine, options.switches())
            n_fit += rescued
        found = [p for p in found if len(p[0])]
        if not found and (off is None or not len(off_peaks)):
            continue
        if found:
            idx = np.concatenate([p[0] for p in found])
            cand = {k: v[idx] for k, v in chunk.items()}
            cand["zero"] = np.concatenate([np.full(len(p[0]), p[1]) for p in found]).astype(np.int64)
            level = np.concatenate([p[2] for p in found]).astype(np.int64)
            cand["recompute"], cand["recompute_modules"] = level_rc[level], level_modules[level]
            peaks = np.concatenate([p[3] for p in found])
            for s in SWITCH_COLUMNS:
                cand[s] = np.concatenate([p[4][s] for p in found]).astype(np.int64)
            rung = np.concatenate([np.full(len(p[0]), p[5]) for p in found]).astype(np.int64)
            cand["recompute_layers"], peaks = fewest_recomputed_layers(spec, cand, peaks, memory, limit)
            cand, peaks = fewer_layers_up_the_ladder(spec, cand, peaks, rung, switches, memory, limit, space.engine,
                                                     options.switches())
            # the layout's own offloaded layers: the user's pin (capped per layout at its chunk's layers - 1,
            # planner.activation_offload.offloaded_layers), else 0 (the searched rows are off's)
            cand[OFFLOAD] = np.minimum(pinned, np.maximum(smallest_chunk(spec, cand["pp"], cand["vpp"]) - 1, 0))
            if off is not None and len(off_peaks):
                cand = {k: np.concatenate([cand[k], off[k]]) for k in cand}
                peaks = np.concatenate([peaks, off_peaks])
        else:
            cand, peaks = off, off_peaks
        n_timed += len(peaks)
        ev = evaluate(spec, cand, cluster, options)
        order = np.argsort(ev.step_s, kind="stable")[:top_k]
        best_rows.append({k: v[order] for k, v in cand.items()})
        best_step.append(ev.step_s[order])
        best_peak.append(peaks[order])
    if n_fit == 0:
        left_out = f" ({engine_bases + engine_zero:,} layouts {space.engine} cannot run were left out)"
        raise FitError(f"no layout of {spec.name} fits in {max_memory:.0%} of {capacity / 2**30:.1f} GiB per device on "
                       f"{devices} devices (gbs {gbs}, seq {seq}; {considered:,} layouts considered); add devices, "
                       f"lower --seq, or raise --max-memory" + (left_out if space.engine else "")
                       + (f"; or change the pinned {space.pins()}" if space.pins() else ""))
    allrows = {k: np.concatenate([b[k] for b in best_rows]) for k in best_rows[0]}
    steps, peaks = np.concatenate(best_step), np.concatenate(best_peak)
    order = np.argsort(steps, kind="stable")[:top_k]
    top = {k: v[order] for k, v in allrows.items()}
    ev = evaluate(spec, top, cluster, options)
    # a fitting layout can be timed in several rows (a switch, fewer replayed or offloaded layers): never
    # fewer worse than none
    rejected = {"indivisible": indivisible, "does not fit": n * variants - n_fit - engine_zero,
                "worse": max(0, n_fit - len(order))}
    if space.engine:
        rejected["engine"] = engine_bases + engine_zero
    elif engine_zero:  # searched DualPipeV rows at ZeRO stages no engine runs them with
        rejected["no engine"] = engine_zero
    return SearchResult(candidates=top, evaluation=ev, peak_bytes=peaks[order], considered=considered,
                        rejected=rejected, timed=n_timed)


FAMILY_POOL = 20  # layouts timed per plan shown, so that the runner-ups can come from other families


def best_of_families(layouts: list[ParallelConfig], k: int) -> list[int]:
    """Indices of the best layout of each of the ``k`` best families (:func:`explain.family`),
    best first; when fewer families exist, the next best layouts fill the list."""
    chosen, seen = [], set()
    for i, p in enumerate(layouts):
        if family(p) not in seen:
            seen.add(family(p))
            chosen.append(i)
            if len(chosen) == k:
                return chosen
    rest = [i for i in range(len(layouts)) if i not in chosen]
    return sorted(chosen + rest[:k - len(chosen)], key=lambda i: i)


def candidate_layouts(result: SearchResult) -> list[ParallelConfig]:
    """The top plans' layouts, best first."""
    return decode(result.candidates)


def plan(spec: ModelSpec, cluster: Cluster, gbs: int, seq: int, precision: str = "bf16",
         options: PerfOptions | None = None, top_k: int = 5, max_memory: float = MEMORY_TARGET,
         space: SearchSpace | None = None, memory_options=None, cloud: int = 0, uncertainty: bool = False) -> dict:
    """The DESIGN.md plan object: the best layouts as full predictions, best first, with how
    many layouts were considered and why the others were rejected. With ``cloud`` > 0 it also
    holds ``candidates``: the step time and peak memory of the best ``cloud`` fitting layouts
    (the search's own vectorised figures, no extra prediction), the plans among them. With
    ``uncertainty`` it also holds ``error_band`` (the backtest's cross-source error for the best
    plan's family and precision, :mod:`dayzero.planner.error_band`) and ``sensitivity`` (the best
    plan under perturbed inputs, :mod:`dayzero.planner.sensitivity`)."""
    import time

    from dayzero.planner.memory_options import MemoryOptions
    from dayzero.planner.predict import predict
    from dayzero.planner.sensitivity import POOL

    options = options or PerfOptions()
    t0 = time.perf_counter()
    want = max(top_k * FAMILY_POOL, cloud)
    result = search(spec, cluster, gbs, seq, precision, options, max(want, POOL) if uncertainty else want, max_memory,
                    space, memory_options=memory_options)
    t_search = time.perf_counter() - t0
    pool = candidate_layouts(result)
    layouts = pool[:want]
    chosen = best_of_families(layouts, top_k)
    mopts = searched_memory(memory_options or MemoryOptions.for_run(cluster.accelerator, options.attention_kernel),
                            space)
    plans = [predict(spec, layouts[i], cluster, options, mopts) for i in chosen]
    best = plans[0]["time"]["step_s"]
    from dayzero.planner.switches import why_words

    for p, i in zip(plans, chosen):
        p["family"] = family(layouts[i])
        p["memory_switches"] = why_words(layouts[i])  # the memory switches on, and why (planner.switches)
        p["vs_best"] = p["time"]["step_s"] / best - 1.0
    plans[0]["binding"] = binding(plans[0], max_memory)
    rejected = dict(result.rejected)
    rejected["worse"] += max(0, len(pool) - len(plans))  # timed (runner-ups of a family, the cloud), not plans
    extra = {}
    if uncertainty:
        from dayzero.planner.error_band import error_band, load_table
        from dayzero.planner.sensitivity import sensitivity

        kind = "moe" if spec.is_moe else "dense"
        extra["error_band"] = error_band(load_table(), kind, precision, plans[0]["throughput"]["mfu"]).to_dict()
        extra["sensitivity"] = sensitivity(spec, cluster, options, result.candidates)
    if cloud:
        extra["candidates"] = [{"layout": p.to_dict(), "step_s": float(t), "peak_bytes": float(m)}
                               for p, t, m in zip(layouts, result.evaluation.step_s, result.peak_bytes)]
    return {"model": spec.name, "cluster": cluster.name, "devices": cluster.devices, "gbs": gbs, "seq": seq,
            "precision": precision, "max_memory": max_memory, "plans": plans, "considered": result.considered,
            "rejected": rejected, "timed": result.timed,
            "seconds": {"search": t_search, "total": time.perf_counter() - t0}, **extra}
