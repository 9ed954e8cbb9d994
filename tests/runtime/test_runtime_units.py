"""Runtime pieces that need no spawned world: data stream, LR schedule, clipping, init, recompute
names, support checks, and mesh arithmetic at 64 ranks on the fake backend."""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from dayzero.errors import LayoutError  # noqa: E402
from dayzero.runtime.checks import check_runtime, runtime_problems  # noqa: E402
from dayzero.runtime.data import EOS, DataError, TokenStream, default_corpus, resolve_data  # noqa: E402
from dayzero.runtime.models.model import build_model, initial_value  # noqa: E402
from dayzero.runtime.models.recompute import apply_activation_checkpointing  # noqa: E402
from dayzero.runtime.optim import clip_grad_norm_, lr_lambda  # noqa: E402
from dayzero.runtime.parallel.mesh import MeshShape  # noqa: E402
from dayzero.specs.parallel import ParallelConfig  # noqa: E402
from dayzero.specs.registry import load_model  # noqa: E402

# -- data ----------------------------------------------------------------------------------------

@pytest.fixture
def two_files(tmp_path):
    (tmp_path / "a.txt").write_bytes(b"hello world, " * 20)
    (tmp_path / "b.txt").write_bytes(bytes(range(200)))
    return resolve_data(str(tmp_path / "*.txt"))


def test_default_corpus_is_shipped_and_small():
    files = default_corpus()
    assert len(files) >= 5
    total = sum(f.stat().st_size for f in files)
    assert 20_000 < total < 2_000_000


def test_stream_is_the_files_with_eos_between(two_files):
    s = TokenStream(two_files, seq=16, seed=0, vocab=512)
    flat = np.concatenate([s._window(j)[:-1] for j in range(s.windows)])
    a, b = two_files[0].read_bytes(), two_files[1].read_bytes()
    want = np.array(list(a) + [EOS] + list(b) + [EOS])
    assert (flat == want[:len(flat)]).all()


def test_dp_shards_reassemble_the_global_batch(two_files):
    ref = TokenStream(two_files, seq=16, seed=3, vocab=512)
    shards = [TokenStream(two_files, seq=16, seed=3, vocab=512) for _ in range(4)]
    for _ in range(5):  # crosses an epoch boundary
        x, y = ref.batch(8)
        parts = [s.batch(8, dp_rank=d, dp=4) for d, s in enumerate(shards)]
        assert (np.concatenate([p[0] for p in parts]) == x).all()
        assert (np.concatenate([p[1] for p in parts]) == y).all()
        assert (x[:, 1:] == y[:, :-1]).all()


def test_resume_continues_the_same_stream(two_files):
    a = TokenStream(two_files, seq=16, seed=1, vocab=512)
    first = [a.batch(4)[0] for _ in range(7)]
    b = TokenStream(two_files, seq=16, seed=1, vocab=512)
    for _ in range(3):
        b.batch(4)
    c = TokenStream(two_files, seq=16, seed=1, vocab=512)
    c.restore(b.position().to_dict())
    assert all((c.batch(4)[0] == first[i]).all() for i in range(3, 7))
    with pytest.raises(DataError, match="same --data, --seq and --seed"):
        TokenStream(two_files, seq=8, seed=1, vocab=512).restore(b.position())


def test_data_errors_are_one_line(tmp_path, two_files):
    with pytest.raises(DataError, match="no such file"):
        resolve_data(str(tmp_path / "missing" / "*.txt"))
    with pytest.raises(DataError, match="vocab >= 257"):
        TokenStream(two_files, seq=16, seed=0, vocab=256)
    with pytest.raises(DataError, match="fewer than one sequence"):
        TokenStream(two_files, seq=100_000, seed=0, vocab=512)


# -- optimizer pieces ----------------------------------------------------------------------------

def test_warmup_cosine():
    f = lr_lambda(warmup=10, total=110, min_ratio=0.1)
    assert f(0) == pytest.approx(0.1) and f(9) == pytest.approx(1.0)
    assert f(10) == pytest.approx(1.0)
    assert f(60) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert f(110) == pytest.approx(0.1) and f(500) == pytest.approx(0.1)


def test_clip_matches_torch_single_process():
    torch.manual_seed(0)
    a = [torch.nn.Parameter(torch.randn(5, 3)) for _ in range(3)]
    b = [torch.nn.Parameter(p.detach().clone()) for p in a]
    for p, q in zip(a, b):
        g = torch.randn_like(p) * 3
        p.grad, q.grad = g.clone(), g.clone()
    want = torch.nn.utils.clip_grad_norm_(b, 1.0)
    got = clip_grad_norm_(a, 1.0, stage_size=1)
    torch.testing.assert_close(got, want.float())
    for p, q in zip(a, b):
        torch.testing.assert_close(p.grad, q.grad)


# -- model ---------------------------------------------------------------------------------------

def test_initial_value_is_a_function_of_name_and_seed():
    a = initial_value("layers.0.attention.wq.weight", (8, 4), seed=1)
    assert torch.equal(a, initial_value("layers.0.attention.wq.weight", (8, 4), seed=1))
    assert not torch.equal(a, initial_value("layers.1.attention.wq.weight", (8, 4), seed=1))
    assert not torch.equal(a, initial_value("layers.0.attention.wq.weight", (8, 4), seed=2))
    assert torch.equal(initial_value("layers.0.ffn_norm.weight", (4,), 0), torch.ones(4))
    assert torch.equal(initial_value("layers.0.attention.wq.bias", (4,), 0), torch.zeros(4))
    assert abs(float(initial_value("output.weight", (256, 256), 0).std()) - 0.02) < 0.002


def test_recompute_of_the_first_n_blocks_wraps_only_those():
    """--recompute full --recompute-layers N checkpoints the first N blocks of the chunk and leaves
    the rest as they are (Megatron's block method)."""
    spec = load_model("tiny-llama").shrink(layers=3, hidden=64)
    model = build_model(spec, 16)
    assert apply_activation_checkpointing(model, "full", 2) == 2
    # the checkpointed call replaces forward on the instance (recompute._checkpoint_forward)
    assert ["forward" in vars(b) for b in model.layers.values()] == [True, True, False]


@pytest.mark.parametrize("mode", ["full", "selective"])
def test_recompute_keeps_parameter_names_and_values(mode):
    spec = load_model("tiny-llama").shrink(layers=2, hidden=64)
    torch.manual_seed(0)
    ref = build_model(spec, 16).to_empty(device="cpu")
    ref.init_buffers()
    for name, p in ref.named_parameters():
        p.data.copy_(initial_value(name, tuple(p.shape), 0))
    ac = build_model(spec, 16).to_empty(device="cpu")
    ac.init_buffers()
    ac.load_state_dict(ref.state_dict())
    assert apply_activation_checkpointing(ac, mode) == 2
    assert [n for n, _ in ac.named_parameters()] == [n for n, _ in ref.named_parameters()]
    x = torch.randint(0, spec.vocab, (2, 16))
    ref(x).square().mean().backward()
    ac(x).square().mean().backward()
    for (n, p), q in zip(ref.named_parameters(), ac.parameters()):
        torch.testing.assert_close(q.grad, p.grad, msg=n)


# -- what the runtime accepts ----------------------------------------------------------------------

def test_checks_print_every_problem_with_numbers():
    spec = load_model("tiny-llama")
    with pytest.raises(LayoutError) as e:
        check_runtime(spec, ParallelConfig(tp=16, dp=1), 2)
    msg = str(e.value)
    assert "\n" not in msg and "16*1*1*1 = 16 must equal the 2 devices" in msg and "heads (8)" in msg
    assert runtime_problems(spec, ParallelConfig(tp=2, pp=2, dp=2, gbs=8), 8) == []
    moe = load_model("tiny-moe")
    assert any("cp 2" in p for p in runtime_problems(moe, ParallelConfig(cp=2, seq=64), 2))
    assert any("etp 2" in p for p in runtime_problems(moe, ParallelConfig(tp=2, etp=2, ep=1), 2))
    assert any("micro-batches for pp 2" in p for p in runtime_problems(spec, ParallelConfig(pp=2), 2))
    for prec in ("fp8", "fp4"):
        assert any(f"precision {prec}: the runtime computes in bf16" in p
                   for p in runtime_problems(spec, ParallelConfig(precision=prec), 1))
    assert any("rank order tp-dp-cp-pp: the runtime's device mesh" in p
               for p in runtime_problems(spec, ParallelConfig(dp=2, rank_order="tp-dp-cp-pp"), 2))


# -- mesh arithmetic at scale (fake backend: no communication, one process) ------------------------

def test_mesh_views_at_64_ranks():
    import torch.distributed as dist
    import torch.testing._internal.distributed.fake_pg  # noqa: F401  registers the "fake" backend
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from dayzero.runtime.parallel.mesh import build_meshes

    p = ParallelConfig(tp=4, pp=2, dp=8, ep=8, zero=1)
    s = MeshShape.of(p)
    assert (s.stage, s.world, s.edp_shard, s.mdp_shard) == (32, 64, 4, 32)
    assert MeshShape.of(p.with_(zero=0)).dp_replicate == 8
    dist.init_process_group("fake", store=FakeStore(), rank=45, world_size=64)
    try:
        m = build_meshes(p, "cpu")
        assert m.tp.mesh.tolist() == [44, 45, 46, 47]  # tp fastest
        assert m.dense["dp_shard"].mesh.tolist() == [33, 37, 41, 45, 49, 53, 57, 61]
        assert m.dense["pp"].mesh.tolist() == [13, 45]
        assert m.ep.mesh.tolist() == [40, 41, 42, 43, 44, 45, 46, 47]  # ep borrows tp x dp ranks
        assert m.expert["edp_shard"].mesh.tolist() == [37, 45, 53, 61]
        assert (m.pp_rank, m.tp_rank, m.dp_rank) == (1, 1, 3)
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("p,rank", [(ParallelConfig(tp=4, pp=2, dp=8, ep=8, zero=1), 45),
                                    (ParallelConfig(tp=2, pp=3, dp=4, cp=2, ep=4, zero=0), 29),
                                    (ParallelConfig(tp=1, pp=2, dp=16, ep=16, zero=3), 17)])
def test_device_mesh_groups_are_view_groups_and_the_planners(p, rank):
    """The DeviceMesh build_meshes makes holds the groups mesh.view_groups computes without torch,
    and those are the planner's topology.group_ranks (tested for every rank in test_topology)."""
    import torch.distributed as dist
    import torch.testing._internal.distributed.fake_pg  # noqa: F401  registers the "fake" backend
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from dayzero.planner.perf.topology import group_ranks
    from dayzero.runtime.parallel.mesh import build_meshes, view_groups

    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=p.world)
    try:
        m = build_meshes(p, "cpu")
        for view, dims, planner in (("dense", ("tp",), "tp"), ("dense", ("cp",), "cp"), ("dense", ("pp",), "pp"),
                                    ("dense", ("dp_replicate", "dp_shard"), "dp"), ("expert", ("ep",), "ep"),
                                    ("expert", ("edp_replicate", "edp_shard"), "edp"),
                                    ("moe_dp", ("mdp_replicate", "mdp_shard"), None), ("stage", ("stage",), None)):
            mesh = getattr(m, view)[dims if len(dims) > 1 else dims[0]].mesh.flatten().tolist()
            assert mesh == next(g for g in view_groups(m.shape, view, dims) if rank in g), (view, dims)
            if planner:
                assert mesh == group_ranks(rank, planner, p), planner
    finally:
        dist.destroy_process_group()


def test_comm_time_counts_overlapping_transfers_once():
    from dayzero.runtime.metrics import union_ns

    assert union_ns([]) == 0
    assert union_ns([(0, 10), (5, 15), (20, 30)]) == 25
    assert union_ns([(0, 100), (10, 20), (30, 40)]) == 100


def test_train_state_is_everything_a_resume_needs(tmp_path):
    """Stop after 3 steps, copy the TrainState's parts into a freshly built state, run 3 more:
    the losses are those of 6 uninterrupted steps (the contract a checkpoint module relies on)."""
    import copy

    import torch.distributed as dist

    from dayzero.runtime.config import ModelSection, TrainConfig
    from dayzero.runtime.train import build_state, train

    text = tmp_path / "t.txt"
    text.write_text("resume me exactly. " * 300)
    cfg = TrainConfig(model=ModelSection("tiny-llama", hidden=64, layers=2),
                      parallel=ParallelConfig(seq=32, gbs=4, mbs=2),
                      steps=6, compute_dtype="fp32", quiet=True, data=str(text), metrics=str(tmp_path / "m.jsonl"))
    try:
        full = [r.loss for r in train(cfg).history]
        first = build_state(cfg)
        train(cfg.with_(steps=3), state=first)
        saved = {"model": copy.deepcopy(first.model.parts[0].state_dict()),
                 "optimizer": copy.deepcopy(first.optimizer.state_dict()),
                 "scheduler": first.scheduler.state_dict(), "data": first.data.position().to_dict(),
                 "rng": first.rng_state(), "step": first.step}
        second = build_state(cfg)
        second.model.parts[0].load_state_dict(saved["model"])
        second.optimizer.load_state_dict(saved["optimizer"])
        second.scheduler.load_state_dict(saved["scheduler"])
        second.data.restore(saved["data"])
        second.set_rng_state(saved["rng"])
        second.step = saved["step"]
        resumed = [r.loss for r in train(cfg, state=second).history]
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    assert resumed == full[3:]
    lines = (tmp_path / "m.jsonl").read_text().splitlines()
    assert [json_step(line) for line in lines if '"step"' in line][-3:] == [4, 5, 6]


def json_step(line: str) -> int:
    import json

    return json.loads(line)["step"]
