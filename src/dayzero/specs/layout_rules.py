"""The rules a parallel layout must obey, written once for one layout and for many.

Each :class:`Rule` is a predicate over the grid's columns (:mod:`dayzero.specs.grid`): plain
arithmetic and comparisons, so the same expression takes Python ints (one layout) or numpy
arrays (a whole search space). ``problems(p)`` turns the failures into messages that
print the degrees involved (:func:`problems`); the search ANDs the predicates into a mask
(:func:`mask`), applying each rule as soon as the columns it reads are expanded.

Worked example: ``ParallelConfig(tp=4, etp=3, dp=3)`` breaks "etp divides tp" (each expert's
tensor-parallel group must nest inside a tp group), so ``problems(p)`` names it and the search
never builds that layout.

Rules that read ``layer_split`` apply to one layout only: a grid row stands for the near-even
split, which always exists.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from dayzero.errors import LayoutError
from dayzero.specs.grid import (
    A2A,
    BF16,
    DUALPIPE,
    DUALPIPEV,
    FIELDS,
    FULL,
    INTERLEAVED,
    RANK_ORDERS,
    SELECTIVE,
    TABLES,
    columns,
    pick,
)
from dayzero.specs.model import ModelSpec
from dayzero.specs.parallel import DENSE_ORDER, RECOMPUTE_MODULES, ParallelConfig, microbatches

DEGREES = ("tp", "pp", "dp", "cp", "ep", "etp", "vpp", "mbs", "gbs", "seq")


@dataclass(frozen=True)
class Where:
    """What a layout is checked against: the model and the device count, when known."""

    spec: ModelSpec | None = None
    devices: int | None = None


@dataclass(frozen=True)
class Rule:
    reads: tuple[str, ...]  # the columns the predicate reads
    ok: Callable[[dict, Where], Any]  # columns -> bool (ints) or bool array (arrays)
    says: Callable[[Any, Where], str]  # ParallelConfig -> the message when ok is False
    needs: str = ""  # "spec" or "devices": skipped when that is not known
    degree: bool = False  # a degree >= 1: the other rules assume these hold


def _cp_dp_adjacent(order: str) -> bool:
    dims = order.split("-")
    return abs(dims.index("cp") - dims.index("dp")) == 1


CP_DP_ADJACENT = tuple(_cp_dp_adjacent(o) for o in RANK_ORDERS)


def _in_table(field: str) -> Rule:
    names = "|".join(TABLES[field])
    return Rule((field,), lambda c, w: (c[field] >= 0) & (c[field] < len(TABLES[field])),
                lambda p, w: f"{field} must be {names}, got {getattr(p, field)!r}")


# every degree and size at most 2^24 (16.7 M: no run has that many sequences per batch, tokens per
# sequence or ranks per group), so the products the planner forms (gbs x seq x hidden x ...) stay
# inside int64 and float64's exact integers
MAX_DEGREE = 2**24


def _degree(name: str) -> Rule:
    return Rule((name,), lambda c, w: (c[name] >= 1) & (c[name] <= MAX_DEGREE),
                lambda p, w: f"{name} must be >= 1, got {getattr(p, name)}" if getattr(p, name) < 1 else
                f"{name} must be <= {MAX_DEGREE:,}, got {getattr(p, name)}", degree=True)


def _kv_heads_ok(c, w):
    a = w.spec.attention
    return (a.kind != "gqa") | (a.kv_heads % c["tp"] == 0) | (c["tp"] % a.kv_heads == 0)


# what the a2a heads rule suggests (an engine without ring attention says the rest: runtime.checks)
A2A_HEADS_FIX = "use --cp-comm p2p, or a smaller cp or tp"


def ulysses_heads_ok(spec: ModelSpec, tp, cp):
    """Whether the all-to-all context parallelism (cp_comm a2a) can split ``spec``'s heads over
    ``cp``: each of the cp ranks takes heads / cp of the query heads and of the key/value heads a
    tp rank holds (Transformer Engine AttnFuncWithCPAndQKVOA2A asserts ``q.shape[-2] % cp_size == 0
    and k.shape[-2] % cp_size == 0``, "The number of attention heads needs to be divisible by CP
    size!"; DeepSpeed-Ulysses, Jacobs et al. 2023 sec. 3.1, the same). A tp rank holds heads / tp
    query heads and kv_heads / tp key heads, one whole replicated key head when tp > kv_heads
    (which a2a then cannot split); MLA decompresses a key per query head. Ints or arrays."""
    a = spec.attention
    kv = a.heads if a.kind == "mla" else a.kv_heads // np.minimum(tp, a.kv_heads)
    return ((a.heads // tp) % cp == 0) & (kv % cp == 0)


def _local_heads(spec: ModelSpec, tp: int) -> str:
    a = spec.attention
    kv = a.heads if a.kind == "mla" else a.kv_heads // min(tp, a.kv_heads)
    return f"{a.heads // tp} query heads and {kv} key/value heads (heads {a.heads}, kv heads {a.kv_heads}, tp {tp})"


def _largest_chunk(c, w):
    """Layers of the largest model chunk: of the layer split when one is given, else of the near-even
    split (ceil(layers / (pp x vpp)))."""
    split = c.get("layer_split")
    return max(split) if split else -(-w.spec.layers // (c["pp"] * c["vpp"]))


def _split_problem(split: tuple[int, ...] | None, pp: int, vpp: int, spec: ModelSpec) -> str | None:
    """What is wrong with one layout's layer split (None: nothing)."""
    stages = pp * vpp
    if split is None:
        if spec.layers % stages:
            return f"layers ({spec.layers}) must be divisible by pp*vpp = {pp}*{vpp} (or give an explicit layer split)"
        return None
    if len(split) != stages:
        return f"layer_split has {len(split)} entries, expected pp*vpp = {stages}"
    if sum(split) != spec.layers:
        return f"layer_split sums to {sum(split)}, the model has {spec.layers} layers"
    if min(split) < 0:
        return "layer_split entries must be >= 0"
    return None


RULES: tuple[Rule, ...] = (
    *(_degree(d) for d in DEGREES),
    Rule(("zero",), lambda c, w: (c["zero"] >= 0) & (c["zero"] <= 3), lambda p, w: f"zero must be 0-3, got {p.zero}"),
    *(_in_table(f) for f in ("recompute", "schedule", "precision", "cp_comm")),
    Rule(("recompute_modules",), lambda c, w: c["recompute_modules"] >= 0,
         lambda p, w: f"recompute modules must be among {', '.join(RECOMPUTE_MODULES)}, got "
                      f"{','.join(p.recompute_modules)}"),
    # Megatron reads --recompute-modules only with --recompute-granularity selective
    Rule(("recompute", "recompute_modules"), lambda c, w: (c["recompute"] == SELECTIVE) | (c["recompute_modules"] == 0),
         lambda p, w: f"recompute modules ({','.join(p.recompute_modules)}) need recompute selective, got "
                      f"{p.recompute}"),
    # FP8 parameter storage keeps the GEMM weights as FP8 copies: without an FP8 (or FP4) recipe there
    # are none (Megatron-LM arguments.py: --fp8-param-gather "Keep the compute param in fp8")
    Rule(("fp8_param_gather", "precision"), lambda c, w: (c["fp8_param_gather"] == 0) | (c["precision"] != BF16),
         lambda p, w: "fp8 parameter gather needs an FP8 recipe (--precision fp8 or fp4), got bf16"),
    # Megatron reads --recompute-num-layers under --recompute-granularity full (with --recompute-method)
    Rule(("recompute_layers",), lambda c, w: c["recompute_layers"] >= 0,
         lambda p, w: f"recompute layers must be at least 1, got {p.recompute_layers}"),
    Rule(("recompute", "recompute_layers"), lambda c, w: (c["recompute"] == FULL) | (c["recompute_layers"] == 0),
         lambda p, w: f"recompute layers ({p.recompute_layers}) need recompute full, got {p.recompute}"),
    # the first N layers of each model chunk: N beyond the largest chunk is every layer, said as plain full
    Rule(("recompute_layers", "pp", "vpp"), lambda c, w: c["recompute_layers"] <= _largest_chunk(c, w),
         lambda p, w: f"recompute layers ({p.recompute_layers}) exceed the "
                      f"{_largest_chunk({'pp': p.pp, 'vpp': p.vpp, 'layer_split': p.layer_split}, w)} layers of a "
                      f"model chunk (pp {p.pp} x vpp {p.vpp} chunks of {w.spec.layers}); give fewer, or full "
                      "recompute without a count", needs="spec"),
    Rule(("rank_order",), lambda c, w: (c["rank_order"] >= 0) & (c["rank_order"] < len(RANK_ORDERS)),
         lambda p, w: f"rank order {p.rank_order!r} must name each of tp, cp, dp, pp exactly once, fastest first "
                      f"(e.g. {DENSE_ORDER})"),
    Rule(("tp", "cp", "dp", "pp"), lambda c, w: c["tp"] * c["cp"] * c["dp"] * c["pp"] == w.devices,
         lambda p, w: f"tp*cp*dp*pp = {p.tp}*{p.cp}*{p.dp}*{p.pp} = {p.world} must equal the {w.devices} devices; "
                      f"adjust --dp (default: devices / (tp*pp*cp))", needs="devices"),
    Rule(("gbs", "mbs", "dp"), lambda c, w: c["gbs"] % (c["mbs"] * c["dp"]) == 0,
         lambda p, w: f"gbs {p.gbs} must be divisible by mbs*dp = {p.mbs}*{p.dp}"),
    Rule(("tp", "etp"), lambda c, w: c["tp"] % c["etp"] == 0,
         lambda p, w: f"etp {p.etp} must divide tp {p.tp} (each expert's tensor-parallel group lies inside a tp "
                      "group)"),
    Rule(("tp", "cp", "dp", "ep", "etp"), lambda c, w: (c["tp"] * c["cp"] * c["dp"]) % (c["ep"] * c["etp"]) == 0,
         lambda p, w: f"ep*etp = {p.ep}*{p.etp} must divide tp*cp*dp = {p.tp * p.cp * p.dp}"),
    Rule(("vpp", "pp"), lambda c, w: (c["vpp"] == 1) | (c["pp"] > 1), lambda p, w: "vpp > 1 needs pp > 1"),
    Rule(("schedule", "vpp", "pp", "gbs", "mbs", "dp"),
         lambda c, w: ((c["schedule"] != INTERLEAVED) | (c["vpp"] == 1)
                       | (microbatches(c["gbs"], c["mbs"], c["dp"]) % c["pp"] == 0)),
         lambda p, w: f"interleaved schedule needs micro-batches ({p.microbatches}) divisible by pp ({p.pp})"),
    # DualPipe: dualpipe.py DualPipe.step asserts num_ranks % 2 == 0 and num_chunks % 2 == 0 and
    # num_chunks >= num_ranks * 2; DualPipeV: dualpipev.py asserts num_chunks >= num_ranks * 2
    # (torch.distributed.pipelining ScheduleDualPipeV: n_microbatches >= the 2 pp stages, exactly 2
    # stages per rank)
    Rule(("schedule", "vpp", "pp"),
         lambda c, w: ((c["schedule"] != DUALPIPE) | ((c["vpp"] == 1) & (c["pp"] % 2 == 0)))
         & ((c["schedule"] != DUALPIPEV) | ((c["vpp"] == 2) & (c["pp"] > 1))),
         lambda p, w: f"{p.schedule} needs " + ("an even pp > 1 and vpp 1 (each rank holds its stage and the "
                                                "mirror one)" if p.schedule == "dualpipe" else
                                                "pp > 1 and vpp 2 (the V's two chunks per rank)")
         + f", got pp {p.pp} vpp {p.vpp}"),
    Rule(("schedule", "pp", "gbs", "mbs", "dp"),
         lambda c, w: (((c["schedule"] != DUALPIPE) & (c["schedule"] != DUALPIPEV))
                       | ((microbatches(c["gbs"], c["mbs"], c["dp"]) >= 2 * c["pp"])
                          & ((c["schedule"] != DUALPIPE) | (microbatches(c["gbs"], c["mbs"], c["dp"]) % 2 == 0)))),
         lambda p, w: f"{p.schedule} needs at least 2 pp = {2 * p.pp} micro-batches"
                      + (", an even number" if p.schedule == "dualpipe" else "") + f", got {p.microbatches}"),
    Rule(("cp", "seq"), lambda c, w: (c["cp"] == 1) | (c["seq"] % (2 * c["cp"]) == 0),
         lambda p, w: f"seq {p.seq} must be divisible by 2*cp = {2 * p.cp} (load-balanced causal CP)"),
    Rule(("sequence_parallel", "tp", "cp", "seq"),
         lambda c, w: (c["sequence_parallel"] == 0) | (c["tp"] == 1) | (c["seq"] % (c["tp"] * c["cp"]) == 0),
         lambda p, w: f"seq {p.seq} must be divisible by tp*cp = {p.tp * p.cp} with sequence parallelism"),
    Rule(("rank_order",), lambda c, w: pick(CP_DP_ADJACENT, c["rank_order"], default=True),
         lambda p, w: f"rank order {p.rank_order!r}: cp and dp must be adjacent (gradients are reduced over dp x cp)"),
    # -- the model ------------------------------------------------------------------------------
    Rule(("tp",), lambda c, w: (not w.spec.has_attention) | (w.spec.attention.heads % c["tp"] == 0),
         lambda p, w: f"attention heads ({w.spec.attention.heads}) must be divisible by tp ({p.tp})", needs="spec"),
    Rule(("tp",), _kv_heads_ok,
         lambda p, w: f"kv heads ({w.spec.attention.kv_heads}) and tp ({p.tp}) must divide one another", needs="spec"),
    Rule(("cp_comm", "tp", "cp"), lambda c, w: (c["cp_comm"] != A2A) | (c["cp"] == 1) | (not w.spec.has_attention)
         | ulysses_heads_ok(w.spec, c["tp"], c["cp"]),
         lambda p, w: f"cp_comm a2a splits each tp rank's heads over cp {p.cp}: its {_local_heads(w.spec, p.tp)} "
                      f"must be divisible by cp; {A2A_HEADS_FIX}", needs="spec"),
    # recurrent mixers: Megatron-Core's MambaMixer splits the heads and the B/C groups over tp
    # (megatron/core/ssm/mamba_mixer.py asserts nheads % tp == 0 and ngroups % tp == 0)
    Rule(("tp",), lambda c, w: (w.spec.recurrent is None) or ((w.spec.recurrent.heads % c["tp"] == 0)
                                                            & (w.spec.recurrent.qk_heads % c["tp"] == 0)),
         lambda p, w: f"recurrent mixer heads ({w.spec.recurrent.heads}) and key/B-C groups "
                      f"({w.spec.recurrent.qk_heads}) must be divisible by tp ({p.tp})", needs="spec"),
    # Megatron-Core splits a Mamba mixer's sequence over cp by an all-to-all to heads
    # (megatron/core/ssm/mamba_context_parallel.py); dayzero models ring attention only
    Rule(("cp",), lambda c, w: (c["cp"] == 1) | (not w.spec.has_recurrent),
         lambda p, w: f"cp {p.cp} > 1: {w.spec.name} has recurrent (state-space / linear-attention) layers, whose "
                      "context parallelism (Megatron-Core's all-to-all of heads) dayzero does not model; use cp 1",
         needs="spec"),
    Rule(("ep",), lambda c, w: (c["ep"] == 1) | (w.spec.moe is not None),
         lambda p, w: f"ep {p.ep} > 1 but {w.spec.name} has no experts", needs="spec"),
    Rule(("ep",), lambda c, w: (w.spec.moe is None) or (w.spec.moe.experts % c["ep"] == 0),
         lambda p, w: f"experts ({w.spec.moe.experts}) must be divisible by ep ({p.ep})", needs="spec"),
    Rule(("layer_split", "pp", "vpp"), lambda c, w: _split_problem(c["layer_split"], c["pp"], c["vpp"], w.spec) is None,
         lambda p, w: _split_problem(p.layer_split, p.pp, p.vpp, w.spec), needs="spec"),
)


def _applies(rule: Rule, where: Where) -> bool:
    return not rule.needs or getattr(where, rule.needs) is not None


def problems(p: ParallelConfig, spec: ModelSpec | None = None, devices: int | None = None) -> list[str]:
    """Every reason the layout ``p`` is invalid (for ``spec`` on ``devices`` when given), each with the
    degrees involved, in table order; empty when it is valid. Only the degree rules when a degree is
    below 1 (the others would divide by it)."""
    where = Where(spec, devices)
    c = {**columns(p), "layer_split": p.layer_split}
    out = [r.says(p, where) for r in RULES if r.degree and not r.ok(c, where)]
    if out:
        return out
    return [r.says(p, where) for r in RULES if not r.degree and _applies(r, where) and not bool(r.ok(c, where))]


def validate(p: ParallelConfig, spec: ModelSpec | None = None, devices: int | None = None) -> ParallelConfig:
    """``p``, or one LayoutError (one line, all degrees printed) with every message of
    :func:`problems` when the layout is impossible (for ``spec`` on ``devices`` when given)."""
    found = problems(p, spec, devices)
    if found:
        raise LayoutError(f"invalid parallel layout ({p.describe()}, world {p.world}): " + "; ".join(found))
    return p


def rules_reading(present, spec: ModelSpec | None = None, devices: int | None = None) -> tuple[Rule, ...]:
    """The rules that can be evaluated on columns ``present`` (with what is known)."""
    where = Where(spec, devices)
    return tuple(r for r in RULES if set(r.reads) <= set(present) and _applies(r, where))


def mask(grid: dict, spec: ModelSpec | None = None, devices: int | None = None, rules=None) -> np.ndarray:
    """True for each row of ``grid`` that breaks none of ``rules`` (default: every rule whose
    columns the grid has)."""
    where = Where(spec, devices)
    rules = rules_reading(grid, spec, devices) if rules is None else rules
    n = len(next(iter(grid.values())))
    ok = np.ones(n, dtype=bool)
    for r in rules:
        if r.degree:
            ok &= np.asarray(r.ok(grid, where), dtype=bool)
    # rows with a degree below 1 are already rejected; give them 1 so the other rules never divide by 0
    safe = grid if ok.all() else {k: (np.where(ok, v, 1) if k in DEGREES else v) for k,
                                  v in grid.items() if k in FIELDS}
    for r in rules:
        if not r.degree:
            ok &= np.broadcast_to(np.asarray(r.ok(safe, where), dtype=bool), (n,))
    return ok


def field_problems(field: str, value) -> list[str]:
    """Messages of the rules that read ``field`` alone, for a layout whose ``field`` is ``value``
    (how the search checks its option lists)."""
    p = ParallelConfig(**{field: value})
    where = Where()
    c = columns(p)
    return [r.says(p, where) for r in RULES if r.reads == (field,) and not r.needs and not bool(r.ok(c, where))]
