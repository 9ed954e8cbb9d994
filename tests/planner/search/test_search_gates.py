"""The search's recompute gates rule a base out only where no level below them can fit.

Full recompute is not the memory-minimal level when its replay's transient (the whole layer
rebuilt, activations.full_recompute_transient) outweighs the activations it saves: on a rank with
one layer and one micro-batch in flight it saves that layer's none - full bytes once and adds
recomputing - largest to the transient. Every selective set at once can likewise hold more than
a subset (its largest rebuilt module, LayerActivation.rebuilding). The search kills a base under a
gate only where the floor (memory_terms.RECOMPUTE_EXCESS left out) does not fit.
"""

from __future__ import annotations

import numpy as np
import pytest

from dayzero.planner.memory.activations import Dims, layer_activation
from dayzero.planner.memory.memory import MemoryOptions, estimate_memory, peak_memory_batch
from dayzero.planner.memory.memory_terms import RECOMPUTE_EXCESS
from dayzero.planner.search.search import SearchSpace, enumerate_layouts, level_order, search
from dayzero.planner.search.search_fit import _fitting_variants
from dayzero.specs.cluster import build_cluster
from dayzero.specs.grid import encode
from dayzero.specs.parallel import ParallelConfig
from dayzero.specs.registry import load_model
from helpers.variants import at_every_level

LLAMA = load_model("tiny-llama")  # 4 dense layers
FOUR = build_cluster("h100", 4)
OPTS = MemoryOptions.for_accelerator(FOUR.accelerator)
# one layer per rank, one micro-batch in flight (gbs = mbs x dp = 1): full recompute saves one layer's
# none - full bytes once
SHORT = dict(tp=1, pp=4, dp=1, gbs=1, mbs=1, seq=4096)


def _layer():
    return layer_activation(LLAMA, "dense", OPTS, Dims(seq=4096, mbs=1, tp=1, cp=1))


def test_full_recompute_can_hold_more_than_no_recompute():
    """On every rank (one dense layer, one micro-batch) full recompute minus no recompute is
    (1 + fragmentation budget) x (max(largest, recomputing) - largest - (none - full)): tiny-llama's
    layer at seq 4,096 saves 30.625 MiB, keeps 2 MiB (its input) under full recompute, and its
    replay peaks at 43.625 MiB against an 11 MiB largest tensor: 4 MiB more than it saves."""
    a = _layer()
    mib = 2**20
    assert (float(a.none), float(a.full), float(a.largest), float(a.recomputing)) == (
        30.625 * mib, 2 * mib, 11 * mib, 43.625 * mib)
    delta = (1 + OPTS.fragmentation_budget) * 4 * mib
    none, full = (estimate_memory(LLAMA, ParallelConfig(**SHORT, recompute=r), FOUR.memory_bytes, OPTS)
                  for r in ("none", "full"))
    for s_none, s_full in zip(none.stages, full.stages):
        assert s_full.total - s_none.total == pytest.approx(delta, abs=2)


def test_the_floor_bounds_every_level_below_and_is_exact_for_no_recompute():
    """``without=((RECOMPUTE_EXCESS,),)``: under full recompute the peak less (1 + budget) x the
    replay's transient above the largest tensor (the layer input being the least any level saves);
    under selective recompute the peak less the rebuilt module's bytes; without recompute the peak
    itself. Each is at most the peak of every level below its own."""
    a = _layer()
    b = OPTS.fragmentation_budget
    space = SearchSpace(recompute=("none", "selective", "full"))
    levels = space.levels(LLAMA)
    rows = [ParallelConfig(**SHORT, recompute="none"), ParallelConfig(**SHORT, recompute="full")]
    grid = encode(rows)
    grid, _ = at_every_level(grid, (int(grid["zero"][0]),), levels)
    peak, (low,) = peak_memory_batch(LLAMA, grid, FOUR.memory_bytes, OPTS, without=((RECOMPUTE_EXCESS,),))
    peak, low = peak[:len(levels)], low[:len(levels)]
    below = level_order(LLAMA, levels)
    for j, (rc, m) in enumerate(levels):
        assert low[j] <= peak[below[:, j]].min() * (1 + 1e-12)
        if rc == 0:
            assert low[j] == pytest.approx(peak[j], rel=1e-12)
        elif rc == 2:
            assert peak[j] - low[j] == pytest.approx((1 + b) * float(a.recomputing - a.largest), rel=1e-9)
        else:
            assert peak[j] - low[j] == pytest.approx((1 + b) * float(a.rebuilding(m)), rel=1e-9)


def test_a_dynamic_term_left_out_takes_its_fragmentation_share():
    """peak_memory_batch's ``without``: leaving out the logits (a temporary) removes them and the
    budget's share of them; leaving out the optimizer states (model states, allocated once) only them."""
    p = ParallelConfig(tp=1, pp=1, dp=4, gbs=4, mbs=1, seq=4096)
    terms = estimate_memory(LLAMA, p, FOUR.memory_bytes, OPTS).stages[0].terms
    peak, (no_logits, no_master) = peak_memory_batch(LLAMA, encode([p]), FOUR.memory_bytes, OPTS,
                                                     without=(("temporary:logits",), ("optimizer:master",)))
    b = OPTS.fragmentation_budget
    assert peak[0] - no_logits[0] == pytest.approx((1 + b) * terms["temporary:logits"], abs=2)
    assert peak[0] - no_master[0] == pytest.approx(terms["optimizer:master"], abs=2)


def test_the_search_finds_a_layout_that_fits_only_below_full_recompute():
    """With the limit halfway between no recompute's and full recompute's peak (4 MiB apart, above),
    the one base fits without recompute: the search plans it (the full-recompute gate used to rule
    it out: no layout fit)."""
    space = SearchSpace(tp=(1,), pp=(4,), cp=(1,), vpp=(1,), mbs=(1,), zero=(0,),
                        no_switches=("optimizer_offload", "activation_offload_layers"))
    none, full = (estimate_memory(LLAMA, ParallelConfig(**SHORT, recompute=r), FOUR.memory_bytes, OPTS).peak_bytes
                  for r in ("none", "full"))
    assert full > none
    limit = (none + full) / 2
    result = search(LLAMA, FOUR, 1, 4096, space=space, max_memory=limit / FOUR.memory_bytes, top_k=5,
                    memory_options=OPTS)
    assert result.candidates["recompute"][0] == 0 and result.peak_bytes[0] == pytest.approx(none, abs=2)
    assert result.rejected["does not fit"] < len(space.levels(LLAMA))


def _brute_force_levels(spec, bases, zeros, levels, peak_of, limit, below) -> set:
    """(base, ZeRO stage, level) with the level fitting and no level strictly below it fitting (a
    level above a fitting one only adds time), ZeRO-2 only where ZeRO-1 fits at no level at or
    below (ZeRO-2 adds a reduce-scatter and nothing else): what _fitting_variants must return."""
    strictly = (below & ~np.eye(len(levels), dtype=bool)).astype(int)
    out = set()
    for z in zeros:
        fits = peak_of[z] <= limit
        keep = fits & ~(fits.astype(int) @ strictly > 0)
        if z == 2 and 1 in zeros:
            keep &= ~((peak_of[1] <= limit).astype(int) @ below.astype(int) > 0)
        out |= {(int(b), z, int(j)) for b, j in zip(*np.nonzero(keep))}
    return out


@pytest.mark.parametrize("name, devices, gbs, space, quantiles", [
    # 81 recompute levels (MLA, routed + shared experts, one dense layer); limits where the gates
    # used to drop 8, 13 and 10 of the fitting levels
    ("tiny-moe", 8, 8, SearchSpace(mbs=(1, 2), cp=(1,), pp=(1, 2, 4), vpp=(1,)), (0.56, 0.64, 0.76)),
    ("tiny-llama", 4, 1, SearchSpace(mbs=(1,), cp=(1,), vpp=(1,)), (0.4, 0.6)),
])
def test_the_pruned_levels_are_the_brute_force_levels(name, devices, gbs, space, quantiles):
    """Every (base, ZeRO stage, recompute level) priced one by one: at each limit the pruned
    search's variants are exactly the fitting levels with no fitting level below them, with their
    peaks."""
    spec, cl = load_model(name), build_cluster("h100", devices)
    opts = MemoryOptions.for_accelerator(cl.accelerator)
    bases, *_ = enumerate_layouts(spec, cl.devices, gbs, 4096, space, 8)
    levels = space.levels(spec)
    below = level_order(spec, levels)
    n, nl = len(bases["tp"]), len(levels)

    def memory(g):
        return peak_memory_batch(spec, g, cl.memory_bytes, opts)

    def memory_less(g, without):
        return peak_memory_batch(spec, g, cl.memory_bytes, opts, without=without)

    peak_of = {}
    for z in space.zero:
        g, _ = at_every_level(bases, (z,), levels)
        peak_of[z] = memory(g).reshape(n, nl)
    every = np.concatenate([p.ravel() for p in peak_of.values()])
    for q in quantiles:
        limit = float(np.quantile(every, q))
        want = _brute_force_levels(spec, bases, space.zero, levels, peak_of, limit, below)
        found, _, _ = _fitting_variants(spec, bases, space.zero, levels, memory, limit, below=below,
                                        memory_less=memory_less)
        got = set()
        for idx, z, js, peaks, _, _ in found:
            for b, j, pk in zip(idx, js, peaks):
                got.add((int(b), z, int(j)))
                assert pk == pytest.approx(peak_of[z][b, j], rel=1e-12)
        assert got == want, (q, sorted(want - got)[:5], sorted(got - want)[:5])


@pytest.mark.parametrize("offload", [False, True])
def test_the_levels_an_engine_runs_each_row_at_are_engine_mask_at_every_level(offload):
    """search_fit._runs_at_levels (the distinct rows of the (rows, levels) matrix, and each row's
    index among them) against planner.engines.engine_mask of every row at every level; with an
    activation-offload column a limit reads a row and its level (Megatron-Core: offload without
    recompute), the path that evaluates every level."""
    from dayzero.planner.engines import ENGINES, engine_mask
    from dayzero.planner.search.search_fit import _runs_at_levels
    from dayzero.planner.search.search_space import _with

    spec = load_model("tiny-moe")
    space = SearchSpace(mbs=(1, 2), cp=(1, 2), pp=(1, 2, 4))
    bases, *_ = enumerate_layouts(spec, 8, 8, 4096, space, 8)
    levels = space.levels(spec)
    g = _with(bases, zero=np.resize([0, 1, 2, 3], len(bases["tp"])))
    if offload:
        g["activation_offload_layers"] = np.resize([0, 1], len(bases["tp"]))
    table, which = _runs_at_levels(g, levels)
    want = np.stack([np.logical_or.reduce([engine_mask(e, _with(g, recompute=rc, recompute_modules=m))
                                           for e in ENGINES]) for rc, m in levels], axis=1)
    assert np.array_equal(table[which], want)
    assert len(np.unique(table, axis=0)) == len(table) < len(which)  # distinct rows, fewer than the rows
