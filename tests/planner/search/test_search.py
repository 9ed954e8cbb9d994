"""The layout search: exact pruning (same best plan as brute force), honest counts, errors."""

from __future__ import annotations

import numpy as np
import pytest

from dayzero.errors import FitError
from dayzero.planner.engines import ENGINES, engine_mask
from dayzero.planner.memory.memory import MemoryOptions, peak_memory_batch
from dayzero.planner.perf.perf import evaluate
from dayzero.planner.search.search import SearchSpace, enumerate_layouts, plan, search, searched_memory
from dayzero.specs.cluster import build_cluster
from dayzero.specs.grid import DUALPIPE
from dayzero.specs.registry import load_model
from helpers.variants import at_every_level

MIXTRAL = load_model("mixtral-8x7b")
CLUSTER = build_cluster("h100", 32)


def brute_force(spec, cluster, gbs, seq, space, limit, options=None, precision="bf16"):
    """Every layout (base x ZeRO stage x recompute level) at every state of the memory switches
    (FP8 parameter gather, optimizer offload; activation offload of every count of layers without
    recompute) the layout rules allow and some engine runs: the
    fastest of all, how many layouts fit in some state, and the counts the search reports."""
    from itertools import product

    from dayzero.specs.grid import SWITCHES
    from dayzero.specs.layout_rules import mask

    bases, considered, indivisible, variants = enumerate_layouts(spec, cluster.devices, gbs, seq, space, 8, precision)
    n = len(bases["tp"])
    # every ZeRO stage x recompute level (none, selective with each module set, full)
    full, _ = at_every_level(bases, space.zero, space.levels(spec))
    # priced as the engines that run each layout hold memory (ZeRO-3 + pp: pipelined FSDP, search.searched_memory)
    opts = searched_memory(MemoryOptions.for_accelerator(cluster.accelerator), space)
    fits, best = np.zeros(len(full["tp"]), dtype=bool), np.inf
    runs_any = np.zeros(len(full["tp"]), dtype=bool)
    # and at every count of offloaded activation layers, 1 .. layers - 1, without recompute
    # (planner.memory.activation_offload)
    for state, off in product(product((0, 1), repeat=len(SWITCHES)), range(spec.layers)):
        sel = np.flatnonzero((full["recompute"] == 0) if off else np.ones(len(full["tp"]), dtype=bool))
        g = {**{k: v[sel] for k, v in full.items()},
             **{s: np.full(len(sel), v, dtype=np.int64) for s, v in zip(SWITCHES, state)},
             "activation_offload_layers": np.full(len(sel), off, dtype=np.int64)}
        # an unpinned search keeps a layout only where some engine runs it (DualPipe, which none runs,
        # is not enumerated unpinned)
        runs = np.logical_or.reduce([engine_mask(e, g) for e in ENGINES]) | (g["schedule"] == DUALPIPE)
        runs &= mask(g, spec, cluster.devices)
        if not any(state) and not off:
            runs_any = runs
        ok = runs & (peak_memory_batch(spec, g, cluster.memory_bytes, opts) <= limit)
        fits[sel[ok]] = True
        if ok.any():
            best = min(best, float(evaluate(spec, {k: v[ok] for k, v in g.items()}, cluster, options).step_s.min()))
    no_engine = int((~runs_any).sum())
    return best, int(fits.sum()), considered, indivisible, n * variants - no_engine


def test_search_finds_the_brute_force_optimum_and_counts_every_layout():
    space = SearchSpace(mbs=(1, 2), cp=(1, 2))
    result = search(MIXTRAL, CLUSTER, 256, 4096, space=space, max_memory=0.6, top_k=3)
    best, n_fit, considered, indivisible, total = brute_force(MIXTRAL, CLUSTER, 256, 4096, space,
                                                              0.6 * CLUSTER.memory_bytes)
    assert 0.05 * total < n_fit < 0.95 * total  # the memory limit really prunes
    assert result.evaluation.step_s[0] == pytest.approx(best, rel=1e-12)
    assert result.considered == considered
    assert result.rejected["indivisible"] == indivisible
    assert result.rejected["does not fit"] == total - n_fit
    assert sum(result.rejected.values()) + len(result.evaluation.step_s) == result.considered
    assert np.all(np.diff(result.evaluation.step_s) >= 0)
    assert np.all(result.peak_bytes <= 0.6 * CLUSTER.memory_bytes)


def test_plan_object_follows_the_contract():
    obj = plan(MIXTRAL, CLUSTER, 256, 4096, space=SearchSpace(mbs=(1,), cp=(1,)), top_k=2)
    assert set(obj) >= {"plans", "considered", "rejected"}
    assert set(obj["rejected"]) - {"no engine"} == {"indivisible", "does not fit", "worse"}
    assert len(obj["plans"]) == 2
    first = obj["plans"][0]
    assert set(first) >= {"parallel", "fits", "memory", "time", "throughput", "comm_ratio", "checks"}
    assert set(first["time"]) >= {"step_s", "compute_s", "comm_exposed_s", "bubble_s"}
    assert set(first["throughput"]) >= {"tokens_per_s", "tokens_per_s_per_device", "model_tflops_per_device", "mfu"}
    assert first["fits"] and first["memory"]["utilization"] <= 0.85
    assert [c["metric"] for c in first["checks"]] == ["mfu", "peak_memory_fraction", "comm_ratio"]
    assert first["time"]["step_s"] <= obj["plans"][1]["time"]["step_s"]


def test_nothing_fits_is_one_clear_error():
    with pytest.raises(FitError, match="no layout of dense-3t fits"):
        search(load_model("dense-3t"), build_cluster("h100", 8), 64, 4096)


def test_default_scenario_space_is_large():
    spec = load_model("dense-3t")
    bases, considered, indivisible, variants = enumerate_layouts(spec, 8192, 4096, 4096, SearchSpace(), 8)
    assert considered > 100_000
    assert considered == indivisible + len(bases["tp"]) * variants
    # every base is divisor-consistent
    assert np.all(8192 % (bases["tp"] * bases["pp"] * bases["cp"]) == 0)
    assert np.all(4096 % (bases["mbs"] * bases["dp"]) == 0)
    assert np.all(spec.attention.heads % bases["tp"] == 0)


def test_every_base_gets_its_fastest_fitting_module_set():
    """tiny-moe (MLA, routed and shared experts, one dense layer: 81 recompute levels, most of them
    not nested) on 8 H100 at seq 4,096, with memory limits where some bases fit without recompute,
    some only under full recompute and many only under some module sets: for every (base, ZeRO stage)
    the search times a layout exactly as fast as the fastest fitting level of the brute force over
    all levels, and its fitting count is the brute force's (the gates, the one-module-short probes
    and the layered climb skip only levels that cannot fit or cannot be faster)."""
    spec = load_model("tiny-moe")
    cl = build_cluster("h100", 8)
    # the module sets alone: optimizer and activation offload (the brute force over switches:
    # test_switch_search.py) kept off
    space = SearchSpace(mbs=(1, 4), cp=(1,), pp=(1, 2), vpp=(1,),
                        no_switches=("optimizer_offload", "activation_offload_layers"))
    opts = MemoryOptions.for_accelerator(cl.accelerator)
    bases, *_ = enumerate_layouts(spec, cl.devices, 64, 4096, space, 8)
    levels = space.levels(spec)
    assert len(levels) == 81
    n = len(bases["tp"])
    full, base_of = at_every_level(bases, space.zero, levels)
    runs = np.logical_or.reduce([engine_mask(e, full) for e in ENGINES])
    peak = peak_memory_batch(spec, full, cl.memory_bytes, opts)
    step = evaluate(spec, full, cl).step_s
    none_peak, full_peak = peak[full["recompute"] == 0], peak[full["recompute"] == 2]
    cut = set()
    for q in (0.3, 0.6):
        limit = float(np.quantile(full_peak, q) + (np.quantile(none_peak, q) - np.quantile(full_peak, q)) * 0.5)
        ok = runs & (peak <= limit)
        needs = ok & (full["recompute"] == 1)
        assert needs.any() and (ok & (full["recompute"] == 0)).any()
        result = search(spec, cl, 64, 4096, space=space, max_memory=limit / cl.memory_bytes, top_k=10**6,
                        memory_options=opts)
        assert result.rejected["does not fit"] == int((runs & ~ok).sum())
        want = {}
        for b, z, t in zip(base_of[ok], full["zero"][ok], step[ok]):
            want[b, z] = min(want.get((b, z), np.inf), t)
        key = {tuple(int(bases[c][i]) for c in bases): i for i in range(n)}
        got, fewer = {}, set()
        cand = result.candidates
        for i, t in enumerate(result.evaluation.step_s):
            b = key[tuple(int(cand[c][i]) for c in bases)]
            z = int(cand["zero"][i])
            got[b, z] = min(got.get((b, z), np.inf), float(t))
            if cand["recompute_layers"][i] > 0:
                fewer.add(b)
        # ZeRO-2 is timed only where ZeRO-1 does not fit at its level: compare the best of ZeRO 1 and 2;
        # a base whose full recompute the search cut to fewer layers (recompute_layers, not among the
        # brute force's levels) may only be faster
        for b, z in want:
            if z == 2:
                continue
            w = min(want[b, z], want.get((b, 2), np.inf)) if z == 1 else want[b, z]
            g = min(got.get((b, z), np.inf), got.get((b, 2), np.inf)) if z == 1 else got[b, z]
            if b in fewer:
                assert g <= w * (1 + 1e-12), (b, z)
            else:
                assert g == pytest.approx(w, rel=1e-12), (b, z)
        cut |= fewer
    assert cut  # the limits leave some bases fitting only under full recompute, of fewer layers


def test_the_search_takes_the_fewest_recomputed_layers_that_fit():
    """tiny-llama on one stage (a chunk of 4 identical layers): with the memory limit between the
    peaks of full recompute of 1 and of 2 layers, 2 of 4 is the least that fits (memory falls by
    one layer's none - full activation per layer replayed: test_memory), so the row takes
    recompute_layers 2 with that peak; a limit only every layer meets keeps 0 (every layer), and a
    row without full recompute is left alone."""
    from dayzero.planner.memory.memory import peak_memory_batch
    from dayzero.planner.search.search import fewest_recomputed_layers
    from dayzero.specs.grid import encode
    from dayzero.specs.parallel import ParallelConfig
    from dayzero.specs.registry import load_model

    spec = load_model("tiny-llama")
    base = dict(pp=1, dp=1, gbs=1)
    cand = encode([ParallelConfig(**base, recompute="full"), ParallelConfig(**base, recompute="none")])
    memory = lambda g: peak_memory_batch(spec, g, 80 * 10**9)  # noqa: E731
    by_n = memory(encode([ParallelConfig(**base, recompute="full", recompute_layers=n) for n in (1, 2, 3)]))
    assert by_n[0] > by_n[1] > by_n[2]
    full_peak, none_peak = memory(cand)
    col, peaks = fewest_recomputed_layers(spec, cand, np.array([full_peak, none_peak]), memory,
                                          (by_n[0] + by_n[1]) / 2)
    assert col.tolist() == [2, 0] and peaks.tolist() == [by_n[1], none_peak]
    col, peaks = fewest_recomputed_layers(spec, cand, np.array([full_peak, none_peak]), memory,
                                          (by_n[2] + full_peak) / 2)
    assert col.tolist() == [0, 0] and peaks[0] == full_peak
