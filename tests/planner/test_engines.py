"""Engine feasibility: each engine's limits, the labels on every plan, and --engine in the search."""

import numpy as np
import pytest

from dayzero.errors import ConfigError
from dayzero.planner.engines import ENGINES, engine_mask, engine_problems, engines_for, get_engine
from dayzero.specs.grid import encode
from dayzero.specs.parallel import ParallelConfig as P


@pytest.mark.parametrize("layout, engine, says", [
    # DeepSpeed's PipelineEngine asserts ZeRO < 2 (deepspeed/runtime/pipe/engine.py)
    (P(pp=4, dp=2, zero=2, gbs=8), "deepspeed", "pipeline engine runs only with ZeRO-0/1"),
    # Megatron FSDP composes with TP, EP and CP, not PP (Megatron-Core guide, Megatron FSDP)
    (P(tp=2, pp=2, dp=2, zero=3, gbs=4), "megatron", "Megatron FSDP"),
    (P(pp=2, dp=2, schedule="gpipe", gbs=4), "megatron", "not GPipe"),
    # torchtitan: FSDP2 or DDP, no ZeRO-1; ETP only 1 or tp
    (P(dp=8, zero=1), "torchtitan", "no optimizer-only sharding"),
    (P(tp=4, dp=2, ep=2, etp=2, sequence_parallel=True), "torchtitan", "etp 1 or etp = tp"),
    (P(tp=2, dp=4, zero=0, sequence_parallel=True), "torchtitan", "DDP (ZeRO-0) does not combine"),
    (P(dp=4, cp=2), "deepspeed", "Ulysses"),
    (P(dp=2, cp=2), "dayzero", "ring attention (cp_comm p2p) is not in it: use --cp-comm a2a"),
    # torch.distributed.pipelining keeps FSDP gradients unsharded until the step's last backward
    # (PipelineStage.backward_maybe_with_nosync), so ZeRO-2 under pp > 1 is not what it runs
    (P(tp=8, pp=16, dp=128, vpp=8, zero=2, sequence_parallel=True, gbs=2048), "torchtitan", "defers FSDP"),
    (P(pp=2, dp=4, zero=2, gbs=8), "dayzero", "defers FSDP"),
])
def test_each_limit_names_the_degrees_and_the_reason(layout, engine, says):
    problems = engine_problems(engine, layout)
    assert any(says in p for p in problems), problems
    assert engine not in engines_for(layout)


def test_a_plain_data_parallel_layout_runs_everywhere():
    # MindSpeed shards the optimizer only (ZeRO-1, --use-distributed-optimizer)
    assert engines_for(P(dp=64, zero=3)) == [e for e in ENGINES if e != "mindspeed"]
    assert engines_for(P(dp=64, zero=1)) == ["megatron", "mindspeed", "deepspeed", "dayzero"]
    assert engines_for(P(tp=8, pp=16, dp=128, vpp=8, zero=1, sequence_parallel=True)) == ["megatron", "mindspeed",
                                                                                         "dayzero"]
    assert "torchtitan" in engines_for(P(dp=8, zero=2)) and "dayzero" in engines_for(P(dp=8, zero=2))  # pp 1


def test_the_mask_agrees_with_the_problems_on_random_layouts():
    rng = np.random.default_rng(0)
    layouts = [P(tp=int(rng.choice([1, 2, 4])), pp=int(rng.choice([1, 2])), dp=int(rng.choice([1, 2])),
                 cp=int(rng.choice([1, 2])), ep=1, etp=1, vpp=1, zero=int(rng.integers(0, 4)),
                 sequence_parallel=bool(rng.integers(0, 2)), gbs=8,
                 precision=str(rng.choice(["bf16", "fp8", "fp4"]))) for _ in range(200)]
    grid = encode(layouts)
    for name in ENGINES:
        m = engine_mask(name, grid)
        assert m.tolist() == [not engine_problems(name, p) for p in layouts], name


def test_engine_names_resolve_and_an_unknown_one_is_refused():
    assert get_engine("Megatron-Core").name == "megatron" and get_engine("TorchTitan").name == "torchtitan"
    with pytest.raises(ConfigError, match="unknown engine 'nemo2'"):
        get_engine("nemo2")


def test_the_runtime_refuses_what_its_engine_label_refuses():
    from dayzero.runtime.checks import runtime_problems
    from dayzero.specs.registry import load_model

    spec = load_model("tiny-moe")
    for layout in (P(cp=2, seq=64), P(tp=2, etp=2), P(precision="fp8")):
        label = engine_problems("dayzero", layout)
        assert label and set(label) <= set(runtime_problems(spec, layout, layout.world))


def test_search_with_an_engine_returns_only_what_it_runs():
    from dayzero.planner.search.search import SearchSpace, plan
    from dayzero.specs.cluster import build_cluster
    from dayzero.specs.registry import load_model

    spec, cl = load_model("llama-3.1-8b"), build_cluster("h100", 64, 8)
    for engine in ("megatron", "torchtitan", "deepspeed"):
        obj = plan(spec, cl, 256, 4096, top_k=3, space=SearchSpace(engine=engine))
        assert obj["plans"] and all(engine in p["engines"] for p in obj["plans"]), engine
        assert obj["rejected"]["engine"] > 0
    assert "engine" not in plan(spec, cl, 256, 4096, top_k=1)["rejected"]
