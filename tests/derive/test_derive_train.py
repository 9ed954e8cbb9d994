"""Training the proxy of a model derived from its own modeling code: transformers' module itself on
dayzero's runtime (runtime.models.hf_model, runtime.parallel.hf_plan). Tiny configs built from
NEW_TYPES (test_derive), fp32 on CPU; multi-rank runs use gloo with 2 ranks and are marked slow."""

from __future__ import annotations

import contextlib
import io
import json

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from test_derive import NEW_TYPES, write_config  # noqa: E402

from dayzero.cli.app import main  # noqa: E402
from dayzero.errors import DayzeroError  # noqa: E402
from dayzero.runtime.config import ModelSection  # noqa: E402
from dayzero.runtime.models.hf_model import CausalLM, _build, build_proxy, proxy_config, shrink_config  # noqa: E402
from dayzero.runtime.parallel.hf_plan import layer_plan  # noqa: E402

TRAINED = ("olmo2", "qwen3_next", "phimoe", "gemma3_text")
RUN = ["--steps", "8", "--seq", "32", "--gbs", "4", "--compute-dtype", "fp32", "--quiet"]


def config_dir(tmp_path, model_type: str) -> str:
    return write_config(tmp_path, model_type, dict(NEW_TYPES[model_type], vocab_size=512))


def train_json(path: str, capsys, *extra: str) -> dict:
    code = main(["train", path, *RUN, *extra, "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    return json.loads(out)


def train_ranks(path: str, tmp_path, capsys, *extra: str) -> list[dict]:
    metrics = tmp_path / "ranks.jsonl"
    code = main(["train", path, *RUN, "--nproc", "2", *extra, "--metrics", str(metrics)])
    assert code == 0, capsys.readouterr().err
    return [json.loads(line) for line in metrics.read_text().splitlines() if '"step"' in line and "event" not in line]


def falling(losses: list[float]) -> bool:
    return losses[-1] < losses[0] - 0.2 and sum(losses[4:]) < sum(losses[:4])


@pytest.mark.slow  # long-running: eight steps of transformers' own module in this process
@pytest.mark.parametrize("model_type", TRAINED)
def test_a_proxy_trains_single_process_with_falling_loss(model_type, tmp_path, capsys):
    obj = train_json(config_dir(tmp_path, model_type), capsys)
    steps = obj["steps"]
    assert len(steps) == 8 and obj["end"]["event"] == "end" and obj["end"]["steps"] == 8
    for key in ("loss", "grad_norm", "lr", "tokens", "step_time_s", "tokens_per_s", "peak_mem_bytes"):
        assert key in steps[0], key
    assert steps[0]["tokens"] == 4 * 32
    assert falling([s["loss"] for s in steps]), [s["loss"] for s in steps]
    assert any(d.startswith("dp/zero: FSDP2") for d in obj["derived_dimensions"])


@pytest.mark.slow
@pytest.mark.parametrize("model_type", ["olmo2", "phimoe"])  # dense and MoE; FSDP2 wraps any decoder layer alike
def test_dp2_under_fsdp2_matches_single_process(model_type, tmp_path, capsys):
    path = config_dir(tmp_path, model_type)
    single = [s["loss"] for s in train_json(path, capsys)["steps"]]
    dp = [r["loss"] for r in train_ranks(path, tmp_path, capsys, "--dp", "2")]
    assert len(dp) == 8 and falling(dp), dp
    assert abs(dp[0] - single[0]) < 1e-5, (dp[0], single[0])


@pytest.mark.slow
@pytest.mark.parametrize("model_type", ["olmo2", "gemma3_text"])  # a norm over all heads; per-head norms
def test_tp2_matches_single_process(model_type, tmp_path, capsys):
    path = config_dir(tmp_path, model_type)
    single = [s["loss"] for s in train_json(path, capsys)["steps"]]
    tp = [r["loss"] for r in train_ranks(path, tmp_path, capsys, "--tp", "2")]
    assert len(tp) == 8 and falling(tp), tp
    assert abs(tp[0] - single[0]) < 1e-5 and abs(tp[-1] - single[-1]) < 1e-4, (tp, single)


@pytest.mark.slow
@pytest.mark.parametrize("model_type", ["qwen3_next", "glm4_moe_lite"])  # hybrid linear/full + shared experts; MLA
def test_pp2_matches_single_process(model_type, tmp_path, capsys):
    """Stages cut at decoder-layer boundaries: the same seed, data and losses as one process."""
    path = config_dir(tmp_path, model_type)
    single = [s["loss"] for s in train_json(path, capsys)["steps"]]
    pp = [r["loss"] for r in train_ranks(path, tmp_path, capsys, "--pp", "2")]
    assert len(pp) == 8 and falling(pp), pp
    assert abs(pp[0] - single[0]) < 1e-5 and abs(pp[-1] - single[-1]) < 1e-4, (pp, single)


SSM_HYBRIDS = {  # Mamba-2 beside attention in one layer (Falcon-H1); Mamba layers, every-k-th attention and MoE (Jamba)
    "falcon_h1": dict(hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
                      num_key_value_heads=2, mamba_d_ssm=64, mamba_n_heads=4, mamba_d_head=16, mamba_d_state=16,
                      mamba_chunk_size=16, vocab_size=512, tie_word_embeddings=False),
    "jamba": dict(hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
                  num_key_value_heads=2, num_experts=4, num_experts_per_tok=2, expert_layer_period=2,
                  expert_layer_offset=1, attn_layer_period=2, attn_layer_offset=1, mamba_dt_rank=8,
                  mamba_d_state=8, vocab_size=512, tie_word_embeddings=False),
}


def test_a_proxy_layer_count_pipeline_stages_do_not_divide_is_split_near_evenly_and_said(tmp_path, capsys):
    """The proxy's layer count is the tool's (one layer of each kind): pp splits it near evenly, earlier
    stages one layer more, and says so; a split the user gives is kept."""
    path = config_dir(tmp_path, "olmo2")
    got = train_json(path, capsys, "--layers", "3", "--pp", "2", "--nproc", "2", "--dry-run")
    assert got["parallel"]["layer_split"] == [2, 1]
    assert any("3 layers do not divide into 2 pipeline stages: layers per stage 2, 1" in n for n in got["notes"])
    got = train_json(path, capsys, "--layers", "3", "--pp", "2", "--nproc", "2", "--layer-split", "1,2", "--dry-run")
    assert got["parallel"]["layer_split"] == [1, 2] and not any("pipeline stages" in n for n in got["notes"])


@pytest.fixture(scope="module")
def ssm_single(tmp_path_factory):
    """One process's losses per SSM hybrid, trained once for both layouts (the slow lane's budget)."""
    out = {}
    for model_type, cfg in SSM_HYBRIDS.items():
        path = write_config(tmp_path_factory.mktemp("single"), model_type, cfg)
        text = io.StringIO()
        with contextlib.redirect_stdout(text), contextlib.redirect_stderr(io.StringIO()):
            assert main(["train", path, *RUN, "--json"]) == 0
        out[model_type] = [s["loss"] for s in json.loads(text.getvalue())["steps"]]
    return out


@pytest.mark.slow
@pytest.mark.parametrize("layout", [("--dp", "2"), ("--pp", "2")])
@pytest.mark.parametrize("model_type", sorted(SSM_HYBRIDS))
def test_ssm_hybrids_under_dp2_and_pp2_match_single_process(model_type, layout, ssm_single, tmp_path, capsys):
    """The hybrid SSM shapes of the CI handful: FSDP2 per decoder layer and stages cut at layer
    boundaries give one process's first loss (the same seed and data) and a falling loss."""
    path = write_config(tmp_path, model_type, SSM_HYBRIDS[model_type])
    single = ssm_single[model_type]
    ranks = [r["loss"] for r in train_ranks(path, tmp_path, capsys, *layout)]
    assert len(ranks) == 8 and falling(ranks), ranks
    assert abs(ranks[0] - single[0]) < 1e-5 and abs(ranks[-1] - single[-1]) < 1e-4, (ranks, single)


@pytest.mark.slow  # eight steps in this process
def test_recompute_full_per_decoder_layer_matches_no_recompute(tmp_path, capsys):
    path = config_dir(tmp_path, "qwen3_next")
    plain = [s["loss"] for s in train_json(path, capsys)["steps"]]
    again = [s["loss"] for s in train_json(path, capsys, "--recompute", "full")["steps"]]
    assert again == pytest.approx(plain, abs=1e-6)


def test_stages_compose_to_the_whole_model_or_pp_is_refused(tmp_path, monkeypatch):
    """Gemma 3's body picks each layer's mask and rotary table by the layer's position in the list it
    runs (config.layer_types[i]): a stage's per-layer lists are cut to its layers, and the preflight
    composes the stages against the whole model, so a forward that still reads by position is refused
    rather than trained wrong."""
    from dayzero.errors import LayoutError
    from dayzero.runtime.parallel import hf_stages

    path = config_dir(tmp_path, "gemma3_text")

    def build():  # a fresh config each time (a stage cuts its own lists), the same weights
        config, name, _ = proxy_config(ModelSection(path))
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            return CausalLM(_build(config, name, "cpu"))

    hf_stages.check_composition(build, [range(0, 2), range(2, 4)], 512)
    monkeypatch.setattr(hf_stages, "_keep_per_layer_lists", lambda *a: None)
    with pytest.raises(LayoutError, match="pipeline stages do not compute what the whole model does"):
        hf_stages.check_composition(build, [range(0, 2), range(2, 4)], 512)


@pytest.mark.slow
def test_tied_embeddings_under_pp2_match_single_process(tmp_path, capsys):
    """Gemma 3 ties its head to the input embedding: each stage holds a copy, their gradients are
    summed over the pipeline ranks and counted once in the norm, so pp2 trains as one process."""
    path = config_dir(tmp_path, "gemma3_text")
    config, name, _ = proxy_config(ModelSection(path))
    model = CausalLM(_build(config, name))
    assert model.net.get_output_embeddings().weight is model.net.get_input_embeddings().weight  # gemma ties them
    single = train_json(path, capsys)["steps"]
    pp = [r for r in train_ranks(path, tmp_path, capsys, "--pp", "2")]
    assert len(pp) == 8 and falling([r["loss"] for r in pp])
    for a, b in zip(single, pp):
        assert abs(a["loss"] - b["loss"]) <= 1e-5 * abs(a["loss"]), (a, b)
        assert abs(a["grad_norm"] - b["grad_norm"]) <= 1e-4 * a["grad_norm"], (a, b)


@pytest.mark.parametrize("extra, expect", [
    (["--recompute", "selective"], "--recompute selective is not supported for a model derived from its own code"),
    (["--tp", "2", "--nproc", "2"], "model.layers.0.mlp.experts: routed experts are not split by tp 2"),
])
def test_what_cannot_run_is_refused_in_one_line(extra, expect, tmp_path, capsys):
    path = config_dir(tmp_path, "phimoe")
    assert main(["train", path, *RUN, *extra]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and expect in err[0], err


def test_the_shrink_keeps_ratios_and_every_layer_kind(tmp_path):
    cfg = dict(NEW_TYPES["qwen3_next"], model_type="qwen3_next")
    small = shrink_config(cfg, hidden=32, experts=2, vocab=300)
    assert small["hidden_size"] == 32 and small["num_attention_heads"] == 2 and small["num_key_value_heads"] == 1
    assert small["num_experts"] == 2 and small["num_experts_per_tok"] == 2 and small["vocab_size"] == 300
    assert small["moe_intermediate_size"] == 16 and small["head_dim"] == 16
    gemma = config_dir(tmp_path, "gemma3_text")  # 3 sliding-window layers, then a full-attention one
    spec = ModelSection(gemma, hidden=32, layers=4).spec()
    assert spec.hidden == 32 and spec.layers == 4 and spec.vocab == 512
    two = ModelSection(gemma, layers=2).spec()  # below the kinds: the first sliding layer and the full one
    assert two.layers == 2 and two.extra["proxy_notes"] == ["--layers 2 keeps one layer of each of its 2 layer "
                                                            "kinds: 2 layers (of 4: 0, 3)"]


def test_the_tp_plan_is_derived_from_names_and_shapes(tmp_path):
    def plan(model_type):
        config, name, _ = proxy_config(ModelSection(config_dir(tmp_path, model_type)))
        layer = CausalLM(_build(config, name)).net.model.layers[0]
        entries, allreduce = layer_plan(layer, 2, "layers.0")
        return {e.name: e.style for e in entries}, len(allreduce)

    olmo, olmo_ar = plan("olmo2")  # q/k norms over all heads: projections gathered, o_proj splits its input
    assert olmo["self_attn.q_proj"] == "colwise_gather" and olmo["self_attn.o_proj"] == "rowwise_split"
    assert olmo["mlp.gate_proj"] == "colwise" and olmo["mlp.down_proj"] == "rowwise" and olmo_ar == 0
    gemma, gemma_ar = plan("gemma3_text")  # per-head q/k norms: heads split, norm gradients all-reduced
    assert gemma["self_attn.q_proj"] == "colwise" and gemma["self_attn.o_proj"] == "rowwise" and gemma_ar == 2
    phi3, _ = plan("phi3")  # packed projections
    assert phi3["self_attn.qkv_proj"] == "colwise_gather" and phi3["mlp.gate_up_proj"] == "colwise_gather"
    assert phi3["mlp.down_proj"] == "rowwise_split"
    with pytest.raises(DayzeroError, match=r"linear_attn\.conv1d: a Conv1d over the channels is not split"):
        config, name, _ = proxy_config(ModelSection(config_dir(tmp_path, "qwen3_next")))
        layer_plan(CausalLM(_build(config, name)).net.model.layers[0], 2, "layers.0")


def test_a_config_the_modeling_code_cannot_run_is_one_line_before_training(tmp_path):
    """MLA code repeats no key/value groups: fewer KV heads than heads fails transformers' own forward.
    The proxy's probe forward says so in one line instead of a traceback from every rank."""
    (tmp_path / "bad").mkdir()
    bad = write_config(tmp_path / "bad", "glm4_moe_lite", dict(NEW_TYPES["glm4_moe_lite"], num_key_value_heads=2))
    with pytest.raises(DayzeroError, match="the model's own code fails a forward pass of the proxy"):
        build_proxy(ModelSection(bad), seed=0)
    build_proxy(ModelSection(config_dir(tmp_path, "glm4_moe_lite")), seed=0)  # the consistent config builds


@pytest.mark.slow  # three short trainings in this process
def test_a_checkpoint_resumes_exactly_by_transformers_names(tmp_path, capsys):
    """Save at step 3 of 5, resume to 5: the same losses as the uninterrupted run."""
    path, ckpt = config_dir(tmp_path, "qwen3_next"), str(tmp_path / "ckpt")
    five = ["--steps", "5", "--seq", "32", "--gbs", "4", "--compute-dtype", "fp32", "--quiet", "--json"]
    whole = [s["loss"] for s in json.loads(_train(five + ["--ckpt-dir", ckpt, "--ckpt-every", "3"], path, capsys))
             ["steps"]]
    import shutil

    shutil.rmtree(tmp_path / "ckpt" / "step-00000005")
    resumed = [s["loss"] for s in json.loads(_train(five + ["--ckpt-dir", ckpt], path, capsys))["steps"]]
    assert resumed == pytest.approx(whole[3:], abs=1e-6)


def _train(args: list[str], path: str, capsys) -> str:
    assert main(["train", path, *args]) == 0, capsys.readouterr().err
    return capsys.readouterr().out


def test_hf_weights_load_by_transformers_names(tmp_path):
    from safetensors.torch import save_file

    from dayzero.errors import ConfigError

    path = config_dir(tmp_path, "qwen3_next")
    source = build_proxy(ModelSection(path), seed=1).net
    (tmp_path / "w").mkdir()
    save_file({k: v.contiguous() for k, v in source.state_dict().items() if "rotary" not in k},
              str(tmp_path / "w" / "model.safetensors"))
    loaded = build_proxy(ModelSection(path, hf_weights=str(tmp_path / "w")), seed=0).net
    fresh = build_proxy(ModelSection(path), seed=0).net
    name = "model.layers.0.linear_attn.in_proj_qkvz.weight"
    assert torch.equal(loaded.get_parameter(name), source.get_parameter(name))
    assert not torch.equal(fresh.get_parameter(name), source.get_parameter(name))
    with pytest.raises(ConfigError, match="a proxy .* cannot load full-size weights"):
        build_proxy(ModelSection(path, hidden=32, hf_weights=str(tmp_path / "w")), seed=0)
