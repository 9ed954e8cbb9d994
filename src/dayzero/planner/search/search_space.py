"""The search space: what the search enumerates and how.

:class:`SearchSpace` holds the per-dim options (tp, pp, cp, ep, etp, vpp, schedule, mbs, ZeRO,
recompute levels, sequence parallelism, rank order) and the pins; :func:`enumerate_layouts` expands
them into the planner's grid (:mod:`dayzero.specs.grid`) dim by dim, ANDing every layout rule
(:mod:`dayzero.specs.layout_rules`) whose columns are present, so a rejected prefix is counted
without being materialised; :func:`why_none` names the rules that left nothing. The recompute
levels' partial order (:func:`level_order`: a level above recomputes more) is what the memory
pruning in :mod:`dayzero.planner.search.search_fit` relies on.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from dayzero.errors import LayoutError
from dayzero.planner.memory.activation_offload import COLUMN as OFFLOAD
from dayzero.specs.grid import (
    BOOLS,
    DUALPIPEV,
    FIELDS,
    INTERLEAVED,
    MODULE_BIT,
    ONE_F_ONE_B,
    TABLES,
    code,
    default_schedule,
    module_mask,
    module_names,
)
from dayzero.specs.grid import SWITCHES as SWITCH_COLUMNS
from dayzero.specs.layout_fields import search_fields, with_fields
from dayzero.specs.layout_rules import DEGREES, Where, field_problems, mask, rules_reading
from dayzero.specs.model import ModelSpec
from dayzero.specs.parallel import RECOMPUTES, ParallelConfig, even_split_fills

STAGES = (("tp", "sequence_parallel", "rank_order"), ("pp",), ("cp",), ("ep",), ("etp",), ("vpp", "schedule"),
          ("mbs",))
VARIANTS = ("zero", "recompute")  # the recompute variants are its levels: SearchSpace.levels
VARIANT_COLUMNS = ("zero", "recompute", "recompute_modules", "recompute_layers",
                   *SWITCH_COLUMNS, OFFLOAD)  # set per base by the search
# The selective recompute module sets the search tries by default: every set of Megatron-Core's
# recompute modules (megatron/core/transformer/transformer_config.py ``recompute_modules``) that
# drops a different set of the model's saved tensors (planner.memory.activations.recompute_modules_sets, the
# rule the backtest settles blank recompute with), not a nested ladder: Megatron-Bridge's presets
# recompute mla_up_proj alone on DeepSeek-V3 and Kimi-K2, mlp + moe_act on GB300
# (scripts/performance/configs/deepseek/deepseek_workload_base_configs.py), which no ladder holds.


def dropped_terms(spec: ModelSpec, mask: int) -> frozenset:
    """The saved tensors of ``spec``'s layers that selective recompute of the module set ``mask``
    drops (:func:`dayzero.planner.memory.activations.module_terms`)."""
    from dayzero.planner.memory.activations import Dims, layer_terms, module_terms
    from dayzero.planner.memory.memory_options import MemoryOptions

    names = set()
    for k in set(spec.layer_types):
        names |= set(layer_terms(spec, k, MemoryOptions(), Dims(seq=1, mbs=1, tp=1, cp=1)))
    return frozenset(t for m in module_names(mask) for t in module_terms(spec, m, names))


def level_order(spec: ModelSpec, levels) -> np.ndarray:
    """``below[i, j]``: recompute level ``j`` recomputes everything level ``i`` does (i == j
    included): no recompute is below every level, full recompute above every level, and selective
    ``i`` below selective ``j`` when ``j`` drops every saved tensor ``i`` drops. Where ``i`` is below
    ``j``, ``j`` takes no less time (it replays a superset of the forward work), so once ``i`` fits,
    ``j`` is never the faster choice. It usually keeps no more memory, but not always (its replay's
    transient can outweigh what it drops: planner.memory.memory_terms.RECOMPUTE_EXCESS), so the search
    never infers that ``j`` fits from ``i`` fitting."""
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
@with_fields(search_fields())
class SearchSpace:
    """Options per dim, in ParallelConfig's terms: one tuple per searched field, its default list
    declared with the field (dayzero.specs.layout_fields.FIELDS, ``Search.default``; None: the
    default list :meth:`resolve` derives from the model and the cluster). So tp, pp, dp (pinned
    degrees: only layouts whose dp = devices / (tp pp cp) is one of them), cp, cp_comm (None:
    every exchange the engine runs, the faster per row: planner.search.cp_choice), ep, etp, vpp,
    mbs, zero, recompute, recompute_modules (module sets selective recompute is tried with; None:
    every distinct set that applies), sequence_parallel (with tp > 1: it only removes work and
    memory; a tp = 1 layout is one layout, without it), schedule (None: interleaved 1F1B with
    vpp > 1, else 1F1B; 1f1b keeps vpp 1, interleaved vpp > 1, gpipe any vpp) and rank_order."""

    engine: str | None = None  # only layouts this engine runs as laid out (planner.engines)
    # memory switches the search keeps off (planner.search.switches: --no-fp8-param-gather, --no-optimizer-offload;
    # activation_offload_layers: --no-activation-offload, planner.search.search.offloaded_variants)
    no_switches: tuple[str, ...] = ()

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
        something on ``spec``: :func:`dayzero.planner.memory.activations.recompute_modules_sets`), fewest
        dropped tensors first, full; only the recompute modes in ``self.recompute``."""
        from dayzero.planner.memory.activations import recompute_modules_sets

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
    # the ring exchange for context parallelism; the search gives a2a where it runs and is the faster
    # (planner.search.cp_choice)
    for name, value in (("gbs", gbs), ("seq", seq), ("precision", code("precision", precision)),
                        ("cp_comm", code("cp_comm", "p2p"))):
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

