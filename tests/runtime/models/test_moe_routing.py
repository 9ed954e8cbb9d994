"""MoE routing options, grouped expert GEMMs, load telemetry and the placed dispatcher's split,
in one process (no process group): numerics against hand-written references."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest

torch = pytest.importorskip("torch")

from dayzero.cli.app import main  # noqa: E402
from dayzero.runtime.config import MoESection, TrainConfig  # noqa: E402
from dayzero.runtime.models.grouped_gemm import _grouped_mm, grouped_linear  # noqa: E402
from dayzero.runtime.models.model import Transformer, initial_value  # noqa: E402
from dayzero.runtime.models.moe import GroupedExperts, Routing  # noqa: E402
from dayzero.runtime.parallel.expert_placement import PlacedDispatch  # noqa: E402
from dayzero.runtime.train import ExpertLoads, routing_of  # noqa: E402
from dayzero.specs.model import MLPSpec  # noqa: E402
from dayzero.specs.registry import load_model  # noqa: E402

COUNTS = [5, 0, 3, 9, 1, 0, 6, 2]  # experts with no rows included


def _experts(seed=0):
    ex = GroupedExperts(8, 16, MLPSpec(intermediate=24, activation="silu", gated=True))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in ex.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.2)
    return ex


def _einsum_reference(ex, x, counts):
    """Per row: silu(x W1[e]^T) * (x W3[e]^T) W2[e]^T with e the row's expert, via gathered weights."""
    e = torch.repeat_interleave(torch.arange(len(counts)), torch.tensor(counts))
    h = torch.nn.functional.silu(torch.einsum("nh,nih->ni", x, ex.w1[e])) * torch.einsum("nh,nih->ni", x, ex.w3[e])
    return torch.einsum("ni,nhi->nh", h, ex.w2[e])


@pytest.mark.parametrize("impl", ["loop", "grouped"])
def test_grouped_experts_match_an_einsum_reference_forward_and_backward(impl):
    if impl == "grouped" and _grouped_mm() is None:
        pytest.skip("this torch has no grouped_mm")
    ex, ref = _experts(), _experts()
    ex.impl = impl
    x = torch.randn(sum(COUNTS), 16, generator=torch.Generator().manual_seed(1), requires_grad=True)
    xr = x.detach().clone().requires_grad_()
    gy = torch.randn(sum(COUNTS), 16, generator=torch.Generator().manual_seed(2))
    y, want = ex(x, COUNTS), _einsum_reference(ref, xr, COUNTS)
    assert (y - want).abs().max() < 1e-5
    (y * gy).sum().backward()
    (want * gy).sum().backward()
    assert (x.grad - xr.grad).abs().max() < 1e-5
    for a, b in zip(ex.parameters(), ref.parameters()):
        assert (a.grad - b.grad).abs().max() < 1e-5


def test_grouped_and_loop_paths_agree_and_auto_takes_the_loop_on_cpu():
    if _grouped_mm() is None:
        pytest.skip("this torch has no grouped_mm")
    x = torch.randn(sum(COUNTS), 16, generator=torch.Generator().manual_seed(3))
    w = torch.randn(8, 12, 16, generator=torch.Generator().manual_seed(4))
    a, b = grouped_linear(x, COUNTS, w, "loop"), grouped_linear(x, COUNTS, w, "grouped")
    assert a.shape == (sum(COUNTS), 12) and (a - b).abs().max() < 1e-5
    assert torch.equal(grouped_linear(x, COUNTS, w, "auto"), a)  # CPU fp32: the loop, bit for bit


def _moe(routing: Routing, seed: int = 0, experts: int | None = None):
    spec = load_model("tiny-moe").shrink(layers=2, hidden=32)
    m = Transformer(spec, 16)
    with torch.no_grad():
        for n, p in m.named_parameters():
            p.copy_(initial_value(n, tuple(p.shape), seed))
    moe = m.layers["1"].moe
    moe.routing = routing
    moe.reset_counts()
    return moe, spec


def test_capacity_factor_drops_lowest_weight_slots_and_counts_them():
    x = torch.randn(2, 16, 32, generator=torch.Generator().manual_seed(5))
    dropless, _ = _moe(Routing())
    y0 = dropless(x)
    assert dropless.dropped_slots.item() == 0
    roomy, _ = _moe(Routing(capacity_factor=8.0))  # capacity >= every routed slot: nothing dropped
    assert torch.allclose(roomy(x), y0, atol=1e-6) and roomy.dropped_slots.item() == 0
    tight, spec = _moe(Routing(capacity_factor=0.5))
    tight(x)
    routed = tight.tokens_per_expert
    cap = math.ceil(32 * spec.moe.top_k / spec.moe.experts * 0.5)
    assert tight.dropped_slots.item() == (routed - routed.clamp(max=cap)).sum().item() > 0
    assert routed.sum().item() == 32 * spec.moe.top_k  # telemetry counts routed slots, before dropping
    # the kept slots of an expert are its highest-weight ones
    w, idx, _ = tight.router(x.reshape(-1, 32))
    order, counts = tight._dispatch_order(idx.reshape(-1), w, torch.bincount(idx.reshape(-1), minlength=8), 2)
    assert counts.max().item() <= cap
    flat_w, flat_e = w.reshape(-1), idx.reshape(-1)
    kept = set(order.tolist())
    for e in range(8):
        rows = (flat_e == e).nonzero().flatten().tolist()
        if len(rows) > cap:
            kept_w = [flat_w[r].item() for r in rows if r in kept]
            dropped_w = [flat_w[r].item() for r in rows if r not in kept]
            assert min(kept_w) >= max(dropped_w)


def test_sequence_wise_loss_and_z_loss_equal_their_formulas():
    moe, spec = _moe(Routing("seq", 1e-4, z_loss=1e-3))
    x = torch.randn(3, 16, 32, generator=torch.Generator().manual_seed(6))
    xf = x.reshape(-1, 32)
    w, idx, probs, logits = moe.router(xf, with_logits=True)
    e, k = spec.moe.experts, spec.moe.top_k
    want = 0.0
    for b in range(3):  # DeepSeek-V3 eq. 17-20, one sequence at a time
        p, ids = probs[b * 16:(b + 1) * 16], idx[b * 16:(b + 1) * 16]
        f = torch.stack([(ids == i).sum() for i in range(e)]).float() * e / (k * 16)
        pn = (p / p.sum(-1, keepdim=True)).mean(0)
        want += 1e-4 * (f * pn).sum().item() / 3
    want += 1e-3 * (torch.logsumexp(logits, -1) ** 2).mean().item()
    got = moe._router_loss(probs, torch.bincount(idx.reshape(-1), minlength=e), idx, logits, 3)
    assert abs(got.item() - want) < 1e-9
    # the loss reaches the router's gradient (and only through the router)
    moe.train()
    moe(x).sum().backward()
    g_with = moe.router.gate.weight.grad.clone()
    moe2, _ = _moe(Routing())
    moe2.train()
    moe2(x).sum().backward()
    assert (g_with - moe2.router.gate.weight.grad).abs().max() > 0
    assert torch.allclose(moe.experts.w1.grad, moe2.experts.w1.grad)


def test_micro_loss_keeps_the_previous_balance_loss():
    moe, spec = _moe(Routing("micro", 0.01))
    x = torch.randn(2, 16, 32, generator=torch.Generator().manual_seed(7)).reshape(-1, 32)
    _, idx, probs = moe.router(x)
    counts = torch.bincount(idx.reshape(-1), minlength=8).float()
    f = counts / (32 * 2)
    want = 0.01 * 8 * (f * probs.mean(0)).sum()
    assert abs(moe._router_loss(probs, counts, idx, None, 2).item() - want.item()) < 1e-9


def test_routing_defaults_follow_the_model_and_deepseek_v3():
    spec = load_model("tiny-moe")
    cfg = TrainConfig.from_dict({"model": {"name": "tiny-moe"}})
    assert cfg.moe.bias_rate == 1e-3 and cfg.moe.capacity_factor is None  # gamma 0.001, dropless
    assert routing_of(cfg, spec) == Routing.of_spec(spec.moe)
    seq = cfg.with_(moe={"aux_loss": "seq"})
    assert routing_of(seq, spec) == Routing("seq", 1e-4)  # DeepSeek-V3's alpha
    z = cfg.with_(moe={"aux_loss": "none", "aux_coef": 0.5, "z_loss": 1e-3, "capacity_factor": 1.25})
    assert routing_of(z, spec) == Routing("none", 0.0, 1e-3, 1.25)
    aux = replace(spec, moe=replace(spec.moe, aux_loss_coef=0.003))
    assert routing_of(cfg, aux) == Routing("micro", 0.003)
    with pytest.raises(Exception, match="--moe-aux-loss"):
        MoESection(aux_loss="sinkhorn").check()


def test_old_configs_move_the_bias_rate_into_the_moe_section():
    old = {"model": {"name": "tiny-moe"}, "optimizer": {"lr": 0.01, "expert_bias_rate": 0.0}}
    cfg = TrainConfig.from_dict(old)
    assert cfg.moe.bias_rate == 0.0 and cfg.optimizer.lr == 0.01
    assert TrainConfig.from_dict({"model": "tiny-moe", "expert_bias_rate": 0.002}).moe.bias_rate == 0.002
    assert TrainConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg


def test_load_summary_numbers():
    c = torch.tensor([[10.0, 10, 10, 10], [40, 0, 0, 0]], dtype=torch.float64)
    loads = ExpertLoads((1, 3), c, torch.tensor([0.0, 8.0], dtype=torch.float64),
                        torch.tensor([[20.0, 20], [40, 0]], dtype=torch.float64))
    s = loads.summary()
    assert s == {"layers": [1, 3], "max_mean": [1.0, 4.0], "cv": [0.0, round(math.sqrt(3), 6)],
                 "dropped": [0.0, 0.2], "rank_max_mean": [1.0, 2.0]}
    assert loads.expert_lists() == [[10, 10, 10, 10], [40, 0, 0, 0]]


def test_placed_split_is_deterministic_balanced_and_complete():
    slots = ((0, 1, 2, 3, 6), (4, 5, 6, 7, 0))  # experts 0 and 6 replicated
    counts = torch.tensor([7, 2, 0, 1, 3, 0, 4, 5])
    for rank in (0, 1):
        d = PlacedDispatch(None, rank, slots, 8)
        rows = d.slot_rows(counts)
        assert rows.sum().item() == counts.sum().item()
        by_expert = torch.zeros(8, dtype=rows.dtype).index_add_(0, torch.tensor([e for r in slots for e in r]), rows)
        assert torch.equal(by_expert, counts)  # every row goes to a slot of its own expert
        # expert 0 (7 rows, slots 0 and 9): 4 to the replica the rank starts at, 3 to the other
        first, second = (0, 9) if rank == 0 else (9, 0)
        assert (rows[first].item(), rows[second].item()) == (4, 3)
        assert d.rank_rows(counts).tolist() == rows.view(2, 5).sum(1).tolist()
    # weight exchange: rank 0 sends rank 1 its home copy of expert 0; receives expert 6 from rank 1
    d0 = PlacedDispatch(None, 0, slots, 8)
    assert d0.w_send == [[0, 1, 2, 3], [0]] and d0.w_recv_splits == [4, 1]


def test_bad_placement_is_one_line_exit_2(tmp_path, capsys):
    base = ["train", "tiny-moe", "--layers", "2", "--hidden", "64", "--seq", "32", "--gbs", "4", "--dp", "2",
            "--ep", "2", "--nproc", "2", "--steps", "1", "--skip-memory-check", "--placement"]
    cases = [({"experts": 8, "ep": 2, "default": [[0, 1, 2, 3], [4, 5, 6, 0]]}, "expert 7 placed on no rank"),
             ({"experts": 8, "ep": 2, "default": [[0, 1, 2], [3, 4, 5], [6, 7, 0]]}, "outside"),
             ({"experts": 8, "ep": 4, "default": [[0, 1], [2, 3], [4, 5], [6, 7]]}, "ep=2")]
    for i, (obj, needle) in enumerate(cases):
        f = tmp_path / f"p{i}.json"
        f.write_text(json.dumps({"format": "dayzero-expert-placement/1", **obj}))
        code = main(base + [str(f)])
        out, err = capsys.readouterr()
        lines = [ln for ln in err.strip().splitlines() if ln]
        assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
        assert needle in lines[0] or (needle == "outside" and "rank 2" in lines[0]), lines[0]


class _Block(torch.nn.Module):
    """A stand-in transformer block holding one MoE layer (what the train loop's layer walk reads)."""

    def __init__(self, moe):
        super().__init__()
        self.moe = moe


def test_bias_update_follows_the_global_loads_and_balances_a_fixed_skew():
    """b_i += gamma * sign(mean - load_i) from the summed loads; with fixed router scores favouring
    two experts the bias alone brings max/mean from ~4 to below 1.3 (the benchmark's mechanism,
    without training)."""
    from types import SimpleNamespace

    from dayzero.runtime.train import expert_loads, update_expert_bias

    moe, spec = _moe(Routing())
    moe.eval()
    part = torch.nn.Module()
    part.layers = torch.nn.ModuleDict({"1": _Block(moe)})
    state = SimpleNamespace(spec=spec, device=torch.device("cpu"), model=SimpleNamespace(parts=[part]),
                            config=SimpleNamespace(parallel=SimpleNamespace(ep=1), moe=MoESection(bias_rate=1e-3)))
    with torch.no_grad():
        moe.router.gate.weight[:2] += 0.02  # tokens' mean direction is not zero: favour two experts
    x = torch.randn(8, 64, 32, generator=torch.Generator().manual_seed(8))
    x = x + x.mean((0, 1), keepdim=True).sign()
    ratios = []
    for _ in range(150):
        with torch.no_grad():
            moe(x)
        loads = expert_loads(state)
        ratios.append(loads.summary()["max_mean"][0])
        before = moe.router.e_score_correction_bias.clone()
        update_expert_bias(state, loads)
        c = loads.experts[0]
        step = (torch.sign(c.mean() - c) * 1e-3).float()
        assert torch.allclose(moe.router.e_score_correction_bias - before, step, atol=1e-8, rtol=0)
        moe.reset_counts()
    assert ratios[0] > 2 and min(ratios[-20:]) < 1.3 and max(ratios[-20:]) < 1.5, ratios[::10]


@pytest.mark.slow
def test_the_bias_balances_a_skewed_router_on_deepseek_v3s_schedule(tmp_path):
    """Issue 18 done-means (a), shortened: ``benchmarks/moe_balance.py`` (tiny-moe, the router's
    selection bias of experts 0 and 1 raised by 0.05, DeepSeek-V3's gamma 0.001 and its 2K-step
    linear warm-up, arXiv 2412.19437 sec. 4.2) for 70 steps: with the bias update the per-step
    max/mean falls below 1.3 (the full 200-step run: first at step 51, RESULTS.md) and the last 20
    steps average below 1.3 (the counting-noise floor of one step is 1.13); without it, above 3
    throughout; the losses agree within 0.5 %."""
    import subprocess
    import sys

    from helpers.paths import REPO

    out = tmp_path / "balance.json"
    r = subprocess.run([sys.executable, str(REPO / "benchmarks" / "moe_balance.py"), "--steps", "70", "--out",
                        str(out)], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads(out.read_text())
    bias, none = res["bias"], res["no_bias"]
    assert bias["max_mean_first"] > 3 and bias["first_step_below_1.3"] is not None
    assert sum(bias["max_mean"][-20:]) / 20 < 1.3
    assert min(none["max_mean"]) > 3 and none["first_step_below_1.3"] is None
    assert abs(bias["loss_tail_mean"] - none["loss_tail_mean"]) < 0.005 * none["loss_tail_mean"]
