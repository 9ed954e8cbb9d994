"""The search tries the memory switches (issue #16; planner.search.switches): FP8 parameter gather where an
engine runs it, optimizer offload only where nothing fits without it; pruning exact by brute force."""

from __future__ import annotations

from itertools import product

import numpy as np
import pytest

from dayzero.errors import LayoutError
from dayzero.planner.engines import ENGINES, engine_mask, engines_for
from dayzero.planner.memory.memory import MemoryOptions, estimate_memory, peak_memory_batch
from dayzero.planner.perf.perf import evaluate
from dayzero.planner.search.search import SearchSpace, enumerate_layouts, plan, search, searched_memory
from dayzero.specs.cluster import Cluster, build_cluster, cluster_from_dict
from dayzero.specs.counting import params_total
from dayzero.specs.grid import DUALPIPE, SWITCHES, decode, encode
from dayzero.specs.layout_rules import mask
from dayzero.specs.parallel import ParallelConfig
from dayzero.specs.registry import load_model
from helpers.variants import at_every_level

TINY = load_model("tiny-llama")
ONE = build_cluster("h100", 1)
# one layout (tp1 pp1 dp1, ZeRO-1, mbs 1), no recompute or full recompute
SPACE = SearchSpace(mbs=(1,), zero=(1,), recompute=("none", "full"))


def _peak(**kw) -> int:
    p = ParallelConfig(tp=1, pp=1, dp=1, zero=1, mbs=1, gbs=8, seq=4096, **kw)
    return estimate_memory(TINY, p, ONE.memory_bytes, MemoryOptions.for_accelerator(ONE.accelerator)).peak_bytes


def test_offload_moves_exactly_the_optimizer_states_off_the_device():
    """tiny-llama (3,213,568 parameters, specs.counting) on one H100, ZeRO-1 over dp 1: the offload
    takes the FP32 master (4 B) and the two FP32 AdamW moments (8 B) off the device, 12 B per
    parameter (MemoryOptions defaults, Megatron-LM distributed-optimizer docs: "12/dp"), whatever
    the recompute."""
    assert params_total(TINY) == 3_213_568
    for rc in ("none", "full"):
        assert _peak(recompute=rc) - _peak(recompute=rc, optimizer_offload=True) == 12 * 3_213_568


def test_the_search_offloads_the_optimizer_only_where_nothing_fits_without_it():
    """With the limit between the full-recompute peaks with and without the offload
    (hand-checked above), the only fitting layout is full recompute with the optimizer on the host,
    and the search returns it at that peak; with the limit above the no-recompute peak, nothing
    takes the offload (the same layout without it fits and is faster); in between (no recompute
    fits only offloaded, full recompute fits without), both are timed and no row without recompute
    is there without the offload."""
    full_off, full_on = _peak(recompute="full"), _peak(recompute="full", optimizer_offload=True)
    none_off, none_on = _peak(recompute="none"), _peak(recompute="none", optimizer_offload=True)
    assert full_on < full_off < none_on < none_off
    run = lambda limit: search(TINY, ONE, 8, 4096, space=SPACE, max_memory=limit / ONE.memory_bytes,  # noqa: E731
                               top_k=100)
    tight = run((full_on + full_off) / 2)
    best = decode(tight.candidates)[0]
    assert best.optimizer_offload and best.recompute == "full" and best.recompute_layers is None
    assert tight.peak_bytes[0] == pytest.approx(full_on, abs=1)  # estimate_memory rounds each term
    assert tight.candidates["optimizer_offload"].all()
    roomy = run(none_off * 1.01)
    assert not roomy.candidates["optimizer_offload"].any()
    assert decode(roomy.candidates)[0].recompute == "none"
    between = run((none_on + none_off) / 2)
    got = {(p.recompute, p.optimizer_offload, p.activation_offload_layers > 0) for p in decode(between.candidates)}
    # no recompute without the optimizer offloaded only with activations offloaded (search.offloaded_variants)
    assert ("none", True, False) in got and ("full", False, False) in got and ("none", False, False) not in got
    # full recompute offloaded appears only replaying fewer layers than without (fewer_layers_up_the_ladder)
    for p in decode(between.candidates):
        if p.recompute == "full" and p.optimizer_offload:
            assert p.recompute_layers is not None


def test_forbidding_or_forcing_the_offload():
    """``no_switches`` keeps the offload off (nothing fits then: FitError); the user's flag
    (MemoryOptions.optimizer_offload) puts it on every row, fitting or not without it."""
    from dayzero.errors import FitError

    limit = (_peak(recompute="full", optimizer_offload=True) + _peak(recompute="full")) / 2 / ONE.memory_bytes
    with pytest.raises(FitError, match="--no-optimizer-offload"):
        search(TINY, ONE, 8, 4096, space=SearchSpace(mbs=(1,), zero=(1,), recompute=("none", "full"),
                                                       no_switches=("optimizer_offload",)), max_memory=limit)
    forced = search(TINY, ONE, 8, 4096, space=SPACE, top_k=100,
                    memory_options=MemoryOptions.for_accelerator(ONE.accelerator, optimizer_offload=True))
    assert forced.candidates["optimizer_offload"].all()
    with pytest.raises(LayoutError, match="no switch"):
        search(TINY, ONE, 8, 4096, space=SearchSpace(no_switches=("offload",)))


@pytest.mark.parametrize("precision,engine,on", [("fp8", "megatron", True), ("bf16", "megatron", False),
                                                 ("fp8", "torchtitan", False), ("fp8", None, True)])
def test_fp8_param_gather_is_on_where_the_engine_runs_it(precision, engine, on):
    """FP8 parameter gather keeps no more memory and takes no more time, so the search turns it on
    in every row an engine runs it in: under FP8 with Megatron (ZeRO >= 1, its distributed-optimizer
    assert), never under bf16 (no FP8 weights: the layout rule) nor with torchtitan (whose float8
    all-gather keeps high-precision weights: engines.py); unpinned, in the rows Megatron runs."""
    cl = build_cluster("h100", 8)
    result = search(TINY, cl, 64, 4096, precision, space=SearchSpace(mbs=(1,), engine=engine), top_k=10**6)
    layouts = decode(result.candidates)
    for p in layouts:
        megatron_runs = "megatron" in engines_for(p.with_(fp8_param_gather=True))
        want = on and p.zero >= 1 and megatron_runs
        assert p.fp8_param_gather == want, p.describe()
    if on:
        assert any(p.fp8_param_gather for p in layouts)
        assert all(engines_for(p) for p in layouts)  # a row with it on is one an engine runs


def test_fp8_param_gather_saves_what_the_memory_model_says():
    """tp1 pp1 dp8 ZeRO-1 under FP8: FP8 parameter storage keeps each decoder-layer weight in 1 B
    instead of 2 and the FP8 weight cache only its 1 B transpose instead of the 2 B copy
    (MemoryOptions.fp8_params docstring): 2 B per decoder-layer parameter off the peak, the same as
    the global flag gives."""
    from dayzero.specs.counting import layer_count

    cl = build_cluster("h100", 8)
    p = ParallelConfig(tp=1, pp=1, dp=8, zero=1, gbs=64, seq=4096, precision="fp8")
    opts = MemoryOptions.for_accelerator(cl.accelerator)
    off = estimate_memory(TINY, p, cl.memory_bytes, opts).peak_bytes
    on = estimate_memory(TINY, p.with_(fp8_param_gather=True), cl.memory_bytes, opts).peak_bytes
    flag = estimate_memory(TINY, p, cl.memory_bytes, opts.with_(fp8_params=True)).peak_bytes
    layers = sum(layer_count(TINY, i).total for i in range(TINY.layers))  # the decoder layers' parameters
    assert off - on == 2 * layers and on == flag


def _every_state(spec, cluster, gbs, seq, space, limit, precision):
    """Brute force: every (base, ZeRO stage, recompute level) at every switch state the layout rules
    allow and some engine runs (activation offload: every count of layers without recompute); per
    base the fastest fitting step time, and the layouts (base, ZeRO stage, level) that fit in some
    state."""
    bases, *_ = enumerate_layouts(spec, cluster.devices, gbs, seq, space, 8, precision)
    n = len(bases["tp"])
    full, base_of = at_every_level(bases, space.zero, space.levels(spec))
    opts = searched_memory(MemoryOptions.for_accelerator(cluster.accelerator), space)  # as the search prices it
    fits, best = np.zeros(len(base_of), dtype=bool), np.full(n, np.inf)
    # activation offload: every count of layers 1 .. layers - 1 on the rows without recompute
    for state, off in product(product((0, 1), repeat=len(SWITCHES)), range(spec.layers)):
        sel = np.flatnonzero((full["recompute"] == 0) if off else np.ones(len(base_of), dtype=bool))
        g = {**{k: v[sel] for k, v in full.items()},
             **{s: np.full(len(sel), v, dtype=np.int64) for s, v in zip(SWITCHES, state)},
             "activation_offload_layers": np.full(len(sel), off, dtype=np.int64)}
        runs = np.logical_or.reduce([engine_mask(e, g) for e in ENGINES]) | (g["schedule"] == DUALPIPE)
        ok = runs & mask(g, spec, cluster.devices) & (peak_memory_batch(spec, g, cluster.memory_bytes, opts) <= limit)
        fits[sel[ok]] = True
        if ok.any():
            step = evaluate(spec, {k: v[ok] for k, v in g.items()}, cluster).step_s
            np.minimum.at(best, base_of[sel[ok]], step)
    return bases, best, int(fits.sum())


def test_switch_pruning_is_exact_against_the_brute_force():
    """Mixtral 8x7B on 32 H100 under FP8 with 35 % of the memory (where many layouts fit only with
    the optimizer offloaded): for every base the search's fastest layout is the brute force's over
    every switch state, ZeRO stage and recompute level (a base whose full recompute it cut to fewer
    layers, which the brute force does not enumerate, may only be faster), and the fitting count is
    the brute force's; the best plan itself takes both switches. One exception the models allow:
    with TP comm overlap on (tp 8, sequence parallel: planner.perf.comm.tp_overlapped), a replayed
    module's GEMMs widen the window the TP collectives overlap while the same compute hides ZeRO-3
    traffic over another link, so in a comm-bound step a recompute level above a fitting one can be
    faster, and the search, which times only the lowest fitting level, misses it: here 1 base of
    784, by 0.048 % (tp8 dp4 etp2 ZeRO-3 mbs1: selective(moe) 55.690 s against none 55.717 s);
    the bound asserted is 0.1 % on at most 1 % of the bases, the best plan exact."""
    spec, cl = load_model("mixtral-8x7b"), build_cluster("h100", 32)
    space, limit = SearchSpace(mbs=(1, 2), cp=(1,)), 0.35 * cl.memory_bytes
    result = search(spec, cl, 256, 4096, "fp8", space=space, max_memory=0.35, top_k=10**6)
    bases, want, n_fit = _every_state(spec, cl, 256, 4096, space, limit, "fp8")
    total = result.considered - result.rejected["indivisible"] - result.rejected["no engine"]
    assert result.rejected["does not fit"] == total - n_fit
    key = {tuple(int(bases[c][i]) for c in bases): i for i in range(len(bases["tp"]))}
    got, fewer = np.full(len(want), np.inf), set()
    cand = result.candidates
    for i, t in enumerate(result.evaluation.step_s):
        b = key[tuple(int(cand[c][i]) for c in bases)]
        got[b] = min(got[b], float(t))
        if cand["recompute_layers"][i] > 0:
            fewer.add(b)
    assert np.isfinite(want).sum() == np.isfinite(got).sum() > 50
    missed = 0
    for b in np.flatnonzero(np.isfinite(want)):
        if b in fewer:
            assert got[b] <= want[b] * (1 + 1e-12), b
        else:
            assert want[b] * (1 - 1e-12) <= got[b] <= want[b] * (1 + 1e-3), b
            missed += got[b] > want[b] * (1 + 1e-12)
    assert missed <= 0.01 * np.isfinite(want).sum()
    assert got[np.isfinite(got)].min() == pytest.approx(want[np.isfinite(want)].min(), rel=1e-12)
    best = decode(cand)[0]
    assert best.optimizer_offload and best.fp8_param_gather
    assert cand["optimizer_offload"].any() and not cand["optimizer_offload"].all()


def test_the_plan_names_the_switches_and_the_engines_that_run_them():
    """The plan object's layout carries the switches (``parallel``), its layout words name them, and
    its engines are those that run them (Megatron-Core and DeepSpeed offload the optimizer; only
    Megatron keeps FP8 parameters)."""
    limit = (_peak(recompute="full", optimizer_offload=True) + _peak(recompute="full")) / 2 / ONE.memory_bytes
    obj = plan(TINY, ONE, 8, 4096, space=SPACE, max_memory=limit, top_k=1)
    best = obj["plans"][0]
    assert best["parallel"]["optimizer_offload"] is True
    assert ParallelConfig.from_dict(best["parallel"]).describe().endswith("opt-offload")
    assert set(best["engines"]) == {"megatron", "deepspeed"}
    assert len(best["memory_switches"]) == 1 and "nothing fits without it" in best["memory_switches"][0]
    assert "dayzero" not in engines_for(ParallelConfig(optimizer_offload=True))
    assert encode([ParallelConfig(fp8_param_gather=True, precision="fp8")])["fp8_param_gather"].tolist() == [1]


@pytest.mark.parametrize("precision,seq,quantile", [("bf16", 512, 0.3), ("bf16", 2048, 0.6), ("fp8", 2048, 0.6)])
def test_switch_pruning_keeps_every_bases_fastest_module_set(precision, seq, quantile):
    """tiny-moe (81 recompute levels, most not nested) on 8 H100 at short sequences (the optimizer
    states weigh more against the activations) with the limit at a quantile of the no-recompute
    ZeRO-1 peaks: for every base the search's fastest layout over switch states, ZeRO stages and
    module sets is the brute force's (the offload pass reuses the first pass's probes and peaks, so
    a wrong reuse shows here); a base cut to fewer replayed layers may only be faster. (At seq 512
    and 1,024 under FP8 some bases fit at a selective set but not under full recompute, whose
    replay transient is larger there: the full-recompute gate, older than the switches, misses
    those; these cases have none.)"""
    spec, cl = load_model("tiny-moe"), build_cluster("h100", 8)
    space = SearchSpace(mbs=(1, 4), cp=(1,), pp=(1, 2), vpp=(1,))
    bases, *_ = enumerate_layouts(spec, cl.devices, 64, seq, space, 8, precision)
    n = len(bases["tp"])
    g = {**bases, "zero": np.ones(n, dtype=np.int64), "recompute": np.zeros(n, dtype=np.int64)}
    opts = MemoryOptions.for_accelerator(cl.accelerator)
    limit = float(np.quantile(peak_memory_batch(spec, g, cl.memory_bytes, opts), quantile))
    result = search(spec, cl, 64, seq, precision, space=space, max_memory=limit / cl.memory_bytes, top_k=10**6)
    _, want, _ = _every_state(spec, cl, 64, seq, space, limit, precision)
    key = {tuple(int(bases[c][i]) for c in bases): i for i in range(n)}
    got, fewer, cand = np.full(n, np.inf), set(), result.candidates
    for i, t in enumerate(result.evaluation.step_s):
        b = key[tuple(int(cand[c][i]) for c in bases)]
        got[b] = min(got[b], float(t))
        if cand["recompute_layers"][i] > 0:
            fewer.add(b)
    assert cand["optimizer_offload"].any() and np.isfinite(want).sum() == np.isfinite(got).sum() > 20
    for b in np.flatnonzero(np.isfinite(want)):
        assert got[b] <= want[b] * (1 + 1e-12) if b in fewer else got[b] == pytest.approx(want[b], rel=1e-12), b


def test_offload_is_a_last_resort_because_the_host_step_is_slower():
    """Per optimizer-shard parameter the offloaded step costs 28 B of host Adam traffic over
    76.8 GB/s plus 4 + 2 B over PCIe Gen5 x16 (63.0 GB/s) = 0.4598 ns (planner.memory.offload), the device
    update 30 B (PerfConstants.optimizer_bytes_per_param) over an H100's 3.35 TB/s = 0.00896 ns:
    the offload only adds time, so it is tried last; were the host faster, it would be a saving
    switch (switches.kinds)."""
    from dataclasses import replace

    from dayzero.planner.memory.offload import offloaded_optimizer_s
    from dayzero.planner.perf.perf import PerfOptions
    from dayzero.planner.search import switches

    cl = build_cluster("h100", 8)
    assert float(offloaded_optimizer_s(1.0, 4)) == pytest.approx(28 / 76.8e9 + 6 / (32e9 * 16 * 128 / 130 / 8))
    from dayzero.planner.perf.calibration import constants_for, rates

    consts = constants_for(cl)
    assert consts.optimizer_bytes_per_param / rates(cl, consts).hbm_bw == pytest.approx(30 / 3.35e12)
    assert switches.adds_time(cl, PerfOptions())
    assert switches.kinds(cl, PerfOptions())["optimizer_offload"] == "last_resort"
    never = replace(switches.BY_NAME["optimizer_offload"], slower=lambda cluster, options: False)
    original = switches.SWITCHES
    try:
        switches.SWITCHES = (original[0], never)
        assert switches.kinds(cl, PerfOptions())["optimizer_offload"] == "saves"
    finally:
        switches.SWITCHES = original


def test_optimizer_offload_must_fit_the_hosts_share():
    """Offloaded, tiny-llama's whole optimizer (ZeRO-1 over dp 1) keeps 16 B per parameter in host
    memory (FP32 master, two FP32 moments, the FP32 gradient copy: planner.memory.offload.host_bytes),
    3,213,568 x 16 = 51,417,088 B. With the limit where only full recompute offloaded fits (above),
    a cluster whose host gives each device 52 MB (``host: memory_gb`` in its file, Cluster.host)
    takes it; 51 MB does not (nothing fits then), nor forced on; 104 MB per node of 2 devices is
    52 MB each."""
    from dayzero.errors import FitError

    assert params_total(TINY) * 16 == 51_417_088
    limit = (_peak(recompute="full", optimizer_offload=True) + _peak(recompute="full")) / 2 / ONE.memory_bytes
    roomy = _with_host(memory_gb=0.052)
    assert roomy.host.memory_bytes == 52e6 and roomy.host.assumed == ()
    assert decode(search(TINY, roomy, 8, 4096, space=SPACE, max_memory=limit).candidates)[0].optimizer_offload
    pair = cluster_from_dict({"accelerator": "h100", "nodes": 1, "devices_per_node": 2,
                              "host": {"memory_gb_per_node": 0.104}}, "two")
    assert pair.host.memory_bytes == pytest.approx(52e6)
    short = _with_host(memory_gb=0.051)
    with pytest.raises(FitError, match=r"fit the device only with more in host memory than the 0.051 GB per device "
                                       r"of host memory \(the cluster file's\)"):
        search(TINY, short, 8, 4096, space=SPACE, max_memory=limit)
    # forced on (--optimizer-offload): no row fits the host, however roomy the device
    forced = searched_memory(MemoryOptions.for_accelerator(ONE.accelerator).with_(optimizer_offload=True), SPACE)
    with pytest.raises(FitError, match="host memory"):
        search(TINY, short, 8, 4096, space=SPACE, max_memory=0.9, memory_options=forced)


def _with_host(**host) -> Cluster:
    """One H100 whose cluster file sets ``host:`` (specs/host.py)."""
    return cluster_from_dict({"accelerator": "h100", "nodes": 1, "devices_per_node": 1, "host": host}, "test")
