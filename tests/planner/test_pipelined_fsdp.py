"""FSDP under torch.distributed.pipelining (torchtitan, dayzero's runtime): with pp > 1 a ZeRO-2/3
stage holds gathered parameters and unsharded gradients until the step's end (planner.schedule.
held_zero, MemoryOptions.pipelined_fsdp), priced per engine (planner.engines.pipelined_fsdp)."""

import numpy as np
import pytest

from dayzero.planner.engines import ENGINES, Engine, pipelined_fsdp
from dayzero.planner.memory.memory import estimate_memory
from dayzero.planner.memory.memory_options import MemoryOptions
from dayzero.planner.schedule import held_zero
from dayzero.specs.parallel import ParallelConfig as P
from dayzero.specs.registry import load_model

# tiny-llama (h 256, 8 heads of 32, 4 kv heads, ffn 704, 4 layers, vocab 512): a decoder layer is
# q + o 2 x 256^2, k + v 2 x 256 x 128, SwiGLU 3 x 256 x 704, two norms 2 x 256 = 737,792 params;
# pp 2 puts layers 0-1 (1,475,584) and the 512 x 256 embedding (131,072) on stage 0
STAGE0_LAYERS, EMBEDDING = 2 * 737_792, 512 * 256
LAYOUT = P(pp=2, dp=2, zero=3, gbs=8, mbs=1, seq=256)


def test_held_zero_is_zero_1_only_for_sharded_stages_under_pp():
    """stage.py backward_maybe_with_nosync: no reshard or gradient sync until REDUCE_GRAD, so
    ZeRO-2/3 hold ZeRO-1's weights and gradients when pp > 1; pp 1, ZeRO-0/1 and engines that
    shard as laid out keep their stage."""
    zero = np.array([0, 1, 2, 3, 3, 3])
    pp = np.array([2, 2, 4, 2, 1, 2])
    assert held_zero(zero, pp, (1, 2, 3)).tolist() == [0, 1, 1, 1, 3, 1]
    assert held_zero(zero, pp, ()).tolist() == zero.tolist()
    assert held_zero(zero, pp, (3,)).tolist() == [0, 1, 2, 1, 3, 1]


def test_zero3_under_pipelining_holds_the_stage_gathered_and_its_gradients_unsharded():
    """Stage 0 of tiny-llama at pp 2, dp 2, ZeRO-3, Megatron-style bytes (2 B weights, 4 B
    gradients, 12 B optimizer): pipelined FSDP keeps 2 B x 1,475,584 gathered layer weights and
    4 B x 1,475,584 unsharded layer gradients (the embedding's 4 B x 131,072 too), no ZeRO-3
    gather buffers; the optimizer stays sharded over dp 2: (4 + 8) B x 1,606,656 / 2. As laid out,
    ZeRO-3 shards the layers over dp (2 B x 1,475,584 / 2) and gathers two layers (2 x 2 B x 737,792)."""
    spec = load_model("tiny-llama")
    held = estimate_memory(spec, LAYOUT, 80 * 2**30, MemoryOptions(pipelined_fsdp=(1, 2, 3))).stages[0].terms
    laid = estimate_memory(spec, LAYOUT, 80 * 2**30, MemoryOptions()).stages[0].terms
    assert held["weights:layers"] == 2 * STAGE0_LAYERS == 2_951_168
    assert held["gradients:layers"] == 4 * STAGE0_LAYERS
    assert held["gradients:embedding"] == 4 * EMBEDDING
    assert held["temporary:zero3_gather"] == 0
    assert held["optimizer:master"] + held["optimizer:moments"] == 12 * (STAGE0_LAYERS + EMBEDDING) // 2
    assert laid["weights:layers"] == 2 * STAGE0_LAYERS // 2
    assert laid["temporary:zero3_gather"] == 2 * 2 * 737_792
    assert laid["optimizer:master"] == held["optimizer:master"]


def test_pp1_and_zero1_are_unchanged():
    spec = load_model("tiny-llama")
    for p in (LAYOUT.with_(pp=1, dp=4), LAYOUT.with_(zero=1)):
        a = estimate_memory(spec, p, 80 * 2**30, MemoryOptions(pipelined_fsdp=(1, 2, 3)))
        b = estimate_memory(spec, p, 80 * 2**30, MemoryOptions())
        assert [s.terms for s in a.stages] == [s.terms for s in b.stages]


def test_each_engine_prices_its_own_memory(monkeypatch):
    """torchtitan and dayzero run FSDP2 under torch.distributed.pipelining; Megatron and DeepSpeed
    do not run ZeRO-2/3 with pp > 1. Unpinned: ZeRO-3 with pp > 1 is run by torchtitan and dayzero
    only, so it is priced pipelined; ZeRO-1 is also Megatron's (as laid out), ZeRO-2 nobody's. One
    engine running ZeRO-3 with pp > 1 sharded as laid out takes ZeRO-3 out."""
    assert pipelined_fsdp("torchtitan") == pipelined_fsdp("dayzero") == (1, 2, 3)
    assert pipelined_fsdp("megatron") == pipelined_fsdp("deepspeed") == ()
    assert pipelined_fsdp(None) == (3,)
    monkeypatch.setitem(ENGINES, "sharded-pp", Engine("sharded-pp", "Sharded PP", ()))
    assert pipelined_fsdp(None) == ()


def test_for_run_and_the_search_take_the_engine():
    from dayzero.planner.search.search import SearchSpace, searched_memory
    from dayzero.specs.hardware import get_accelerator

    acc = get_accelerator("h100")
    assert MemoryOptions.for_run(acc).pipelined_fsdp == ()  # a bare layout: as laid out (the ZeRO paper)
    assert MemoryOptions.for_run(acc, engine="torchtitan").pipelined_fsdp == (1, 2, 3)
    assert MemoryOptions.for_run(acc, engine="megatron").pipelined_fsdp == ()
    assert searched_memory(MemoryOptions(), SearchSpace(engine="megatron")).pipelined_fsdp == ()
    assert searched_memory(MemoryOptions(), SearchSpace(engine="torchtitan")).pipelined_fsdp == (1, 2, 3)
    assert searched_memory(MemoryOptions(), None).pipelined_fsdp == (3,)


def test_a_torchtitan_search_reports_zero3_pp_memory_as_torchtitan_holds_it():
    """Pinned to ZeRO-3 with pp 2, --engine torchtitan's plans carry the pipelined peak, above the
    as-laid-out ZeRO-3 peak of the same layout (its gradients are not sharded)."""
    from dayzero.planner.search.search import SearchSpace, plan
    from dayzero.specs.cluster import build_cluster

    spec, cl = load_model("llama-3.1-8b"), build_cluster("h100", 16, 8)
    obj = plan(spec, cl, 64, 4096, top_k=1, space=SearchSpace(engine="torchtitan", pp=(2,), zero=(3,), vpp=(1,)))
    best = obj["plans"][0]
    p = P(**{k: v for k, v in best["parallel"].items() if k in P.__dataclass_fields__})
    assert (p.pp, p.zero) == (2, 3) and "torchtitan" in best["engines"]
    held = estimate_memory(spec, p, cl.memory_bytes, MemoryOptions.for_run(cl.accelerator, engine="torchtitan"))
    laid = estimate_memory(spec, p, cl.memory_bytes, MemoryOptions.for_run(cl.accelerator, engine="megatron"))
    assert best["memory"]["peak_bytes"] == held.peak_bytes > laid.peak_bytes


@pytest.mark.slow
def test_the_runtime_holds_what_the_planner_prices():
    """memory --exact (the runtime's model, one rank per stage under fake tensors, the pipeline's
    set_reshard_after_backward / set_requires_gradient_sync calls): tiny-llama, pp 2, dp 2,
    ZeRO-3. Its gradients at their largest are the unsharded fp32 ones the pipelined price counts
    (as laid out they would be half), and its peak is within 5 % of the pipelined model-state +
    activation + temporary bytes (benchmarks/RESULTS_exact_memory.md, benchmarks/pipelined_fsdp_memory.py)."""
    from dayzero.runtime.planner_view import memory_options, runtime_spec
    from dayzero.validate.exact_memory import CATEGORIES, exact_memory

    spec = runtime_spec(load_model("tiny-llama"))
    ex = exact_memory(spec, LAYOUT, "bf16")
    opts = memory_options(None, "bf16", spec, LAYOUT, "cpu")
    assert opts.pipelined_fsdp == (1, 2, 3)
    held = estimate_memory(spec, LAYOUT, 10**15, opts)
    laid = estimate_memory(spec, LAYOUT, 10**15, opts.with_(pipelined_fsdp=()))
    for e in ex:
        s, s0 = held.stages[e.stage], laid.stages[e.stage]
        assert abs(s.gradients - e.categories["gradients"]) <= 0.01 * e.categories["gradients"]
        assert s0.gradients < 0.6 * e.categories["gradients"]
        counted = sum(getattr(s, c) for c in CATEGORIES if c != "overhead")
        assert abs(counted - e.peak_bytes) <= 0.05 * e.peak_bytes


def test_a_bad_zero_stage_list_is_one_line():
    from dayzero.errors import ConfigError

    with pytest.raises(ConfigError, match="pipelined_fsdp"):
        MemoryOptions(pipelined_fsdp=(4,))


def test_the_label_drops_an_engine_whose_memory_the_layout_does_not_fit():
    """Llama-3.1-70B at pp 2, dp 32, ZeRO-3 on 64 H100: as laid out (a bare predict) a stage's model
    states are ~35 G params x 18 B / 32 (~20 GB) and fit; torchtitan and the runtime hold 35 G x
    (2 + 4) B of gathered weights and unsharded gradients (~210 GB) and do not, so the prediction is
    labelled with no engine; priced as torchtitan holds it, it does not fit (and keeps the layout's
    labels)."""
    from dayzero.planner.predict import predict
    from dayzero.specs.cluster import build_cluster

    spec, cl = load_model("llama-3.1-70b"), build_cluster("h100", 64, 8)
    p = P(pp=2, dp=32, zero=3, gbs=64, mbs=1, seq=4096, recompute="full")
    laid = predict(spec, p, cl)
    assert laid["fits"] and laid["engines"] == []
    held = predict(spec, p, cl, memory_options=MemoryOptions.for_run(cl.accelerator, engine="torchtitan"))
    assert not held["fits"] and held["engines"] == ["torchtitan", "dayzero"]


def test_the_allocator_replay_holds_what_the_memory_model_holds():
    """The replay (planner.memory.replay.simulate_step) of ZeRO-3 + pp 2 under pipelined FSDP allocates
    ZeRO-1's weights and gradients, as held_zero says: the same events as the ZeRO-1 layout, more
    than ZeRO-3 as laid out (its gradients are unsharded)."""
    from dayzero.planner.memory.replay import simulate_step

    spec, held = load_model("tiny-llama"), MemoryOptions(pipelined_fsdp=(1, 2, 3))
    ours = simulate_step(spec, LAYOUT, 80 * 2**30, held)
    assert ours.peak_allocated == simulate_step(spec, LAYOUT.with_(zero=1), 80 * 2**30, held).peak_allocated
    assert ours.peak_allocated > simulate_step(spec, LAYOUT, 80 * 2**30, MemoryOptions()).peak_allocated


def test_memory_says_what_the_engines_that_run_the_layout_hold(capsys):
    """``dayzero memory`` of a bare ZeRO-3 + pp 2 layout prices it as laid out and adds one line
    with the peak torchtitan and the runtime hold (the pipelined estimate, device memory in GiB)."""
    from dayzero.cli.app import main
    from dayzero.specs.cluster import build_cluster

    args = ["memory", "llama-3.1-70b", "-a", "h100", "-n", "64", "--pp", "2", "--dp", "32", "--zero", "3",
            "--gbs", "64", "--seq", "4096", "--recompute", "full", "--no-simulate"]
    assert main(args) == 0
    out = " ".join(capsys.readouterr().out.split())
    cl = build_cluster("h100", 64, 8)
    p = P(pp=2, dp=32, zero=3, gbs=64, mbs=1, seq=4096, recompute="full")
    held = estimate_memory(load_model("llama-3.1-70b"), p, cl.memory_bytes,
                           MemoryOptions.for_run(cl.accelerator, engine="torchtitan"))
    assert f"torchtitan and dayzero runtime hold {held.peak_bytes / 2**30:.2f} GiB" in out
    assert main(args[:-1] + ["--zero", "1", "--no-simulate"]) == 0
    assert "torch.distributed.pipelining keeps" not in " ".join(capsys.readouterr().out.split())
