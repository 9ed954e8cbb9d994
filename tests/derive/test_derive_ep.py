"""Expert parallelism for a model derived from its own modeling code (runtime.parallel.hf_experts): the
experts found by structure (the planner's reader), split over ep ranks, tokens dispatched by
all-to-all to the module's own forward. Toy modules are built here; trainings use tiny configs of
NEW_TYPES (test_derive), fp32 on CPU; the 2-rank gloo runs are marked slow."""

from __future__ import annotations

import inspect

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from test_derive import NEW_TYPES, write_config  # noqa: E402
from test_derive_train import RUN, train_json, train_ranks  # noqa: E402
from torch import nn  # noqa: E402

from dayzero.cli.app import main  # noqa: E402
from dayzero.derive import structure as st  # noqa: E402
from dayzero.errors import LayoutError  # noqa: E402
from dayzero.runtime.models.hf_model import CausalLM  # noqa: E402
from dayzero.runtime.parallel.hf_experts import _dispatch, check_ep, site_of  # noqa: E402

H, INTER = 8, 6


class Experts(nn.Module):
    """Fused expert weights, routing from the caller (transformers' experts interface)."""

    def __init__(self, e: int):
        super().__init__()
        self.num_experts = e
        self.gate_up_proj = nn.Parameter(torch.randn(e, 2 * INTER, H) / 3)
        self.down_proj = nn.Parameter(torch.randn(e, H, INTER) / 3)

    def forward(self, x, ids, w):
        out = torch.zeros_like(x)
        for t in range(x.shape[0]):
            for j in range(ids.shape[1]):
                e = int(ids[t, j])
                if e >= self.num_experts:  # the "no expert" sentinel
                    continue
                gate, up = (self.gate_up_proj[e] @ x[t]).chunk(2)
                out[t] += w[t, j] * (self.down_proj[e] @ (torch.nn.functional.silu(gate) * up))
        return out


class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.up_proj, self.down_proj = nn.Linear(H, INTER), nn.Linear(INTER, H)


class ListMoE(nn.Module):  # the block indexes its experts itself
    def __init__(self, e: int):
        super().__init__()
        self.gate, self.experts = nn.Linear(H, e), nn.ModuleList(Mlp() for _ in range(e))


class InsideExperts(Experts):  # routes inside its own forward
    def forward(self, x):
        return x


class NormedExperts(Experts):  # a norm shared by every expert's output
    def __init__(self, e: int):
        super().__init__(e)
        self.norm = nn.LayerNorm(H)


class MoE(nn.Module):
    def __init__(self, experts: nn.Module):
        super().__init__()
        self.gate, self.experts = nn.Linear(H, experts.num_experts, bias=False), experts


class Layer(nn.Module):
    def __init__(self, mlp: nn.Module):
        super().__init__()
        self.self_attn, self.mlp = nn.Linear(H, H), mlp


class Net(nn.Module):
    def __init__(self, make):
        super().__init__()
        self.layers = nn.ModuleList(Layer(make()) for _ in range(2))


def test_the_structure_reader_finds_fused_experts_and_their_count():
    net = Net(lambda: MoE(Experts(4)))
    layer = net.layers[0]
    [(name, holder)] = st.expert_holders(layer)
    assert name == "mlp.experts" and holder is layer.mlp.experts
    assert st.routed_experts(layer.mlp, H).experts == 4  # the count the planner derives from the same module
    site = site_of("layers.0.mlp.experts", holder, 2)
    assert (site.experts, site.count_attrs) == (4, ("num_experts",))
    assert [s.name for s in check_ep(CausalLM(net), 2)] == ["layers.0.mlp.experts", "layers.1.mlp.experts"]


@pytest.mark.parametrize("make, ep, expect", [
    (lambda: ListMoE(4), 2, "layers.0.mlp.experts: experts held as a list of 4 modules that the MoE block indexes"),
    (lambda: MoE(InsideExperts(4)), 2, "layers.0.mlp.experts: InsideExperts.forward takes 1 positional input(s), "
                                       "not (hidden_states, expert ids, routing weights)"),
    (lambda: MoE(NormedExperts(4)), 2, "layers.0.mlp.experts: parameter 'norm.weight' is shared by all 4 experts"),
    (lambda: MoE(Experts(3)), 2, "layers.0.mlp.experts: 3 experts do not split over ep 2"),
    (lambda: Mlp(), 2, "ep 2: Net has no routed experts"),
])
def test_what_expert_parallelism_cannot_split_is_refused_naming_the_module(make, ep, expect):
    with pytest.raises(LayoutError, match="^" + expect.replace("(", r"\(").replace(")", r"\)")):
        check_ep(CausalLM(Net(make)), ep)


def _gpt_oss_experts():
    from transformers import AutoConfig
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssExperts

    config = AutoConfig.for_model("gpt_oss", hidden_size=H, intermediate_size=INTER, num_local_experts=4)
    config._experts_implementation = "eager"
    mod = GptOssExperts(config)
    for p in mod.parameters():
        nn.init.normal_(p, std=0.3)
    return mod


@pytest.mark.parametrize("make", [lambda: Experts(4), _gpt_oss_experts], ids=["toy", "gpt_oss_biases"])
def test_the_dispatch_at_one_rank_is_the_module_forward_with_its_gradients(make):
    """The exchange's bookkeeping (rows grouped by expert, one slot per row, summed back per token;
    sentinel ids dropped) reproduces the module's own forward and every gradient, router weights included."""
    import torch.distributed as dist

    torch.manual_seed(0)
    mod = make()
    x = torch.randn(5, H, requires_grad=True)
    ids = torch.tensor([[0, 3], [2, 2], [1, 0], [3, 0], [2, 1]])
    if isinstance(mod, Experts):
        ids[2, 1] = ids[4, 0] = 4  # the "no expert" sentinel: adds nothing
    w = torch.rand(5, 2, requires_grad=True)
    leaves = (x, w, *mod.parameters())
    want = mod(x, ids, w)
    want.square().sum().backward()
    grads = [t.grad.clone() for t in leaves]
    for t in leaves:
        t.grad = None
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        site = site_of("toy", mod, 1)
        names = list(inspect.signature(type(mod).forward).parameters)
        got = _dispatch(mod, type(mod).forward, site, None, 1, x, ids, **{names[3]: w})  # by position or name
        got.square().sum().backward()
    finally:
        dist.destroy_process_group()
    assert torch.allclose(got, want, atol=1e-6)
    for a, t in zip(grads, leaves):
        assert torch.allclose(t.grad, a, atol=1e-5)


def test_experts_that_route_inside_their_forward_refuse_ep_in_one_line(tmp_path, capsys):
    """Llama-4's experts take the tokens already laid out per expert by the block: nothing to dispatch."""
    path = write_config(tmp_path, "llama4_text", dict(NEW_TYPES["llama4_text"], vocab_size=512))
    assert main(["train", path, *RUN, "--nproc", "2", "--dp", "2", "--ep", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "model.layers.1.feed_forward.experts: Llama4TextExperts.forward takes 1 positional" \
        in err[0] and "use --dp" in err[0], err


@pytest.mark.slow  # a 2-rank gloo run and a single-process one per type
@pytest.mark.parametrize("model_type", ["minimax", "glm4_moe_lite"])  # fused experts; MLA with a shared expert
def test_ep2_matches_single_process(model_type, tmp_path, capsys):
    """Experts split over 2 ranks, tokens exchanged by all-to-all: the single process's losses."""
    path = write_config(tmp_path, model_type, dict(NEW_TYPES[model_type], vocab_size=512))
    obj = train_json(path, capsys)
    single = [s["loss"] for s in obj["steps"]]
    assert single[-1] < single[0] - 0.2, single
    assert any(d.startswith("ep: routed experts found by structure") for d in obj["derived_dimensions"])
    ep = [r["loss"] for r in train_ranks(path, tmp_path, capsys, "--dp", "2", "--ep", "2")]
    assert len(ep) == len(single) == 8
    assert max(abs(a - b) for a, b in zip(ep, single)) < 5e-6, (ep, single)
