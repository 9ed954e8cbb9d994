"""The search tries activation offload (planner.search.search.offloaded_variants): the fewest offloaded layers
that fit, only where no recompute does not fit, only where an engine runs it (Megatron-Core: pp 1,
recompute none), timed against the recompute levels that fit; the plan carries its own N.

Hand count (tests/planner/memory/test_activation_offload.py docstring): Llama 3.1 8B, tp 1, one sequence of
4,096 tokens saves LAYER = 570,949,632 B per layer, X = 9.0605 ms per copy over PCIe Gen5 x16; on an
H100 a layer's forward takes 3.954 ms and its backward 8.114 ms, so each offloaded layer exposes
(X - fwd) + (X - bwd) = 6.053 ms per micro-batch. At pp 1 one micro-batch is in flight, so offloading
N layers lowers the peak by N x LAYER plus the 10 % fragmentation budget (MemoryOptions: caching
allocator), 1.1 x N x LAYER.
"""

from __future__ import annotations

import numpy as np
import pytest

from dayzero.planner.engines import engines_for
from dayzero.planner.memory.activation_offload import COLUMN
from dayzero.planner.memory.memory import MemoryOptions, estimate_memory
from dayzero.planner.memory.offload import PCIE_GEN5_X16_BW
from dayzero.planner.perf.perf import PerfOptions, evaluate
from dayzero.planner.search.search import SearchSpace, plan, search
from dayzero.specs.cluster import build_cluster, cluster_from_dict
from dayzero.specs.grid import decode, encode
from dayzero.specs.parallel import ParallelConfig
from dayzero.specs.registry import load_model

SPEC = load_model("llama-3.1-8b")
H100 = build_cluster("h100", 8)
LAYER = 2 * 4096 * (6 * 4096 + 2 * 1024 + 3 * 14336) + 4 * 4096 * 32  # saved bytes of one layer (docstring)
X = LAYER / PCIE_GEN5_X16_BW
P1 = ParallelConfig(tp=1, pp=1, dp=8, mbs=1, gbs=16, seq=4096, zero=1)  # 2 micro-batches of one sequence
# the one base (tp 1, pp 1, dp 8), ZeRO-1, no recompute or full recompute
SPACE = SearchSpace(tp=(1,), pp=(1,), cp=(1,), mbs=(1,), zero=(1,), recompute=("none", "full"))
MO = MemoryOptions.for_accelerator(H100.accelerator)


def _peak(p: ParallelConfig) -> int:
    return estimate_memory(SPEC, p, H100.memory_bytes, MO).peak_bytes


def _per_layer_exposed() -> float:
    """(X - fwd) + (X - bwd): 6.053 ms (docstring), from the compute model's forward and backward."""
    from dayzero.planner.perf.calibration import constants_for, rates
    from dayzero.planner.perf.compute import compute_costs

    consts = constants_for(H100)
    c = compute_costs(SPEC, encode([P1]), rates(H100, consts), consts, 1.0, "fused")
    return (X - float(c.fwd[0, 0])) + (X - float(c.bwd[0, 0]))


def _search(short: float, cluster=H100, **kw):
    """The search with the limit ``short`` layers' saved bytes (with the 10 % budget) under the
    no-recompute peak: nothing without recompute fits."""
    limit = _peak(P1) - 1.1 * short * LAYER
    return search(SPEC, cluster, 16, 4096, space=kw.pop("space", SPACE), max_memory=limit / H100.memory_bytes,
                  top_k=10, **kw)


def test_offloading_n_layers_saves_n_layers_at_pp1():
    """1.1 x N x LAYER per N (docstring), and 6.053 ms per layer and micro-batch."""
    for n in (1, 2, 3):
        assert _peak(P1) - _peak(P1.with_(activation_offload_layers=n)) == pytest.approx(1.1 * n * LAYER, abs=4)
    assert _per_layer_exposed() == pytest.approx(6.053e-3, rel=1e-3)


def test_the_search_offloads_the_fewest_layers_and_takes_it_where_it_is_faster():
    """With the limit 0.5 layer under the no-recompute peak, 1 offloaded layer fits (1.1 LAYER saved)
    but full recompute needs 2 layers (replaying 1 keeps its replay transient: more memory); the
    offload costs 1 layer x 2 micro-batches x 6.053 ms = 12.1 ms over the plain step, less than
    replaying 2 layers, so it is the plan. With 1.5 layers short, 2 offloaded layers (24.2 ms) lose to
    full recompute of 3; both are timed, and no row without recompute is there unoffloaded."""
    base = float(evaluate(SPEC, encode([P1]), H100, PerfOptions()).step_s[0])
    near = _search(0.5)
    rows = {p.describe(): float(t) for p, t in zip(decode(near.candidates), near.evaluation.step_s)}
    best = decode(near.candidates)[0]
    assert best.recompute == "none" and best.activation_offload_layers == 1 and not best.optimizer_offload
    assert float(near.evaluation.step_s[0]) - base == pytest.approx(2 * _per_layer_exposed(), rel=1e-6)
    full = [t for d, t in rows.items() if "full(2)" in d and "opt-offload" not in d]
    assert full and full[0] > float(near.evaluation.step_s[0])
    far = _search(1.5)
    best = decode(far.candidates)[0]
    assert best.recompute == "full" and best.recompute_layers == 3 and best.activation_offload_layers == 0
    off = [(p, float(t)) for p, t in zip(decode(far.candidates), far.evaluation.step_s)
           if p.recompute == "none" and not p.optimizer_offload]
    assert [p.activation_offload_layers for p, _ in off] == [2]
    assert off[0][1] - base == pytest.approx(2 * 2 * _per_layer_exposed(), rel=1e-6)


def test_never_offloaded_where_no_recompute_fits():
    """A limit above the no-recompute peak: no row offloads (it only adds time)."""
    r = search(SPEC, H100, 16, 4096, space=SPACE, max_memory=_peak(P1) * 1.01 / H100.memory_bytes, top_k=10)
    assert not r.candidates[COLUMN].any()
    assert decode(r.candidates)[0].recompute == "none"


def test_only_where_megatron_runs_it():
    """Megatron-Core offloads only with pp 1 and recompute none (engines.py): at pp 2 no row
    offloads whatever the limit; a plan that offloads is Megatron's only."""
    assert engines_for(P1.with_(activation_offload_layers=1)) == ["megatron"]
    assert engines_for(P1.with_(pp=2, dp=4, activation_offload_layers=1)) == []
    assert engines_for(P1.with_(recompute="selective", activation_offload_layers=1)) == []
    pp2 = SearchSpace(tp=(1,), pp=(2,), cp=(1,), mbs=(1,), zero=(1,), recompute=("none", "full"))
    p2 = P1.with_(pp=2, dp=4)
    r = search(SPEC, H100, 16, 4096, space=pp2, max_memory=(_peak(p2) - 1.1 * LAYER) / H100.memory_bytes,
               top_k=10)
    assert not r.candidates[COLUMN].any()


def test_pinned_or_kept_off():
    """``--activation-offload 2`` pins every row to 2 (no search of it); ``--no-activation-offload``
    (SearchSpace.no_switches) keeps it off: the plan is full recompute."""
    opts = PerfOptions(activation_offload_layers=2)
    mem = MO.with_(activation_offload_layers=2)
    limit = (_peak(P1) - 1.1 * 0.5 * LAYER) / H100.memory_bytes
    pinned = search(SPEC, H100, 16, 4096, options=opts, space=SPACE, max_memory=limit, top_k=10,
                    memory_options=mem)
    assert (pinned.candidates[COLUMN] == 2).all()
    off = _search(0.5, space=SearchSpace(tp=(1,), pp=(1,), cp=(1,), mbs=(1,), zero=(1,), recompute=("none", "full"),
                                         no_switches=("activation_offload_layers",)))
    assert not off.candidates[COLUMN].any()
    assert decode(off.candidates)[0].recompute == "full"
    assert SearchSpace(no_switches=("activation_offload_layers",)).pins() == "--no-activation-offload"


def test_the_plan_carries_its_own_n():
    """The plan's layout is ``act-offload(1)``: its JSON ``parallel`` has the count, its why line
    names it, the step names the exposed copies, its engines are Megatron's, the Megatron export
    writes N from the layout (and its import reads it back), the next-step flags carry it and
    ``dayzero train`` (no offload) does not."""
    from dayzero.cli.next_steps import layout_flags, train_layout
    from dayzero.export.megatron import layout_args, parallel_from_args

    limit = (_peak(P1) - 1.1 * 0.5 * LAYER) / H100.memory_bytes
    obj = plan(SPEC, H100, 16, 4096, space=SPACE, max_memory=limit, top_k=1)
    best = obj["plans"][0]
    assert best["parallel"]["activation_offload_layers"] == 1
    assert best["engines"] == ["megatron"]
    assert len(best["memory_switches"]) == 1 and "(--activation-offload 1;" in best["memory_switches"][0]
    assert best["time"]["activation_offload_s"] == pytest.approx(2 * _per_layer_exposed(), rel=1e-6)
    p = ParallelConfig.from_dict(best["parallel"])
    assert p.describe().endswith("act-offload(1)")
    args = layout_args(p)
    assert args[args.index("--cpu-offloading-num-layers") + 1] == "1"
    back, _ = parallel_from_args(args, world=8)  # the import reads it back
    assert back.activation_offload_layers == 1
    assert parallel_from_args(layout_args(P1), 8)[0].activation_offload_layers == 0
    flags = layout_flags(best["parallel"])
    assert flags[flags.index("--activation-offload") + 1] == "1"
    assert "--activation-offload" not in layout_flags(train_layout(best["parallel"]))
    assert np.isclose(best["memory"]["peak_bytes"], _peak(p), atol=2)


def test_the_offloaded_bytes_must_fit_the_hosts_share():
    """With the device's share of host memory at 1.5 x LAYER (a cluster file's ``host: memory_gb``;
    Cluster.host, a DGX H100's 250 GB by default), 1 offloaded layer (a 1.1 x LAYER saving, the bound
    the search checks) fits the host: half a layer short the plan offloads 1. With that host memory
    halved (0.75 x LAYER) it no longer fits: no row offloads and full recompute is the plan."""
    share, halved = (cluster_from_dict({"accelerator": "h100", "nodes": 1, "host": {"memory_gb": k * LAYER / 1e9}},
                                       "test") for k in (1.5, 0.75))
    assert halved.host.memory_bytes == pytest.approx(share.host.memory_bytes / 2)
    assert decode(_search(0.5, cluster=share).candidates)[0].activation_offload_layers == 1
    far = _search(0.5, cluster=halved)
    assert not far.candidates[COLUMN].any() and decode(far.candidates)[0].recompute == "full"


def test_the_copies_run_over_the_clusters_host_link():
    """The copies run at the cluster's host link (``host: link_gbytes_per_s``): halved, one layer's
    copy X doubles, and so the exposed time of offloading 4 layers of P1, 2 micro-batches x 4 x
    ((X - fwd) + (X - bwd)) with X = LAYER / link, grows by X per copy: 2 x 4 x 2 x X = 144.97 ms."""
    half = cluster_from_dict({"accelerator": "h100", "nodes": 1, "host": {"link_gbytes_per_s": PCIE_GEN5_X16_BW / 2e9}},
                             "test")
    assert half.host.link_bw == pytest.approx(PCIE_GEN5_X16_BW / 2)
    p = P1.with_(activation_offload_layers=4)
    full_s = float(evaluate(SPEC, encode([p]), H100).offload_s[0])
    half_s = float(evaluate(SPEC, encode([p]), half).offload_s[0])
    assert full_s == pytest.approx(2 * 4 * _per_layer_exposed(), rel=1e-6)
    assert half_s - full_s == pytest.approx(2 * 4 * 2 * X, rel=1e-6)
    assert 16 * X == pytest.approx(0.14497, rel=1e-4)
