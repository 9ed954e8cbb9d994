"""dayzero export / import: each engine's own config classes accept the export, import(export(p)) == p,
and what an engine cannot run or express is said, never dropped."""

import json

import pytest

from dayzero.cli.app import main
from dayzero.errors import ConfigError, LayoutError
from dayzero.export import deepspeed, megatron
from dayzero.specs.parallel import ParallelConfig as P
from dayzero.specs.registry import load_model

MEGATRON_PLANS = [
    ("llama-3.1-8b", P(tp=2, pp=2, dp=2, gbs=16, sequence_parallel=True, zero=1)),  # dense
    ("mixtral-8x7b", P(tp=2, pp=1, dp=4, ep=4, gbs=16, sequence_parallel=True, zero=1)),  # MoE with EP
    ("llama-3.1-8b", P(tp=1, pp=4, dp=2, vpp=2, gbs=32, recompute="full", zero=1)),  # interleaved PP
    ("llama-3.1-8b", P(tp=2, pp=1, dp=4, cp=2, gbs=8, sequence_parallel=True, zero=3)),  # ZeRO-3 (Megatron FSDP)
    ("deepseek-v3", P(tp=1, pp=4, dp=4, ep=4, gbs=64, zero=1, precision="fp8", recompute="selective")),  # FP8, MLA
    ("llama-3.1-8b", P(tp=2, dp=2, cp=2, cp_comm="a2a", gbs=8, sequence_parallel=True, zero=1)),  # --cp-comm-type a2a
]
DEEPSPEED_PLANS = [
    ("llama-3.1-8b", P(dp=8, zero=1, gbs=32, mbs=2)),  # dense
    ("mixtral-8x7b", P(dp=8, ep=4, zero=2, gbs=16)),  # MoE with EP
    ("llama-3.1-8b", P(pp=4, dp=2, gbs=16, zero=1, recompute="full")),  # pipeline
    ("llama-3.1-8b", P(dp=8, zero=3, gbs=32, mbs=2, recompute="full")),  # ZeRO-3
    ("llama-3.1-8b", P(tp=2, dp=4, zero=2, gbs=8)),  # AutoTP
    ("llama-3.1-8b", P(dp=2, cp=4, cp_comm="a2a", zero=3, gbs=8)),  # Ulysses (sequence_parallel_size)
]


ROUND_TRIPS = ([(megatron, megatron.ARGS_FILE, m, p) for m, p in MEGATRON_PLANS]
               + [(deepspeed, deepspeed.CONFIG_FILE, m, p) for m, p in DEEPSPEED_PLANS])


@pytest.mark.parametrize("engine, written, model, p", ROUND_TRIPS,
                         ids=[f"{e.__name__.rsplit('.', 1)[-1]}-{m}-{p.describe()}" for e, _, m, p in ROUND_TRIPS])
def test_import_of_an_export_is_the_same_layout(engine, written, model, p, tmp_path):
    engine.export(load_model(model), p).write(tmp_path)
    back, notes = engine.import_file(tmp_path / written, p.world)
    assert back == p and notes == []


@pytest.mark.parametrize("model, p", MEGATRON_PLANS)
def test_megatron_cores_own_config_classes_accept_the_export(model, p):
    pytest.importorskip("megatron.core")
    cfg = megatron.core_configs(load_model(model), p)
    t = cfg["transformer"]
    assert (t.tensor_model_parallel_size, t.pipeline_model_parallel_size, t.context_parallel_size,
            t.expert_model_parallel_size) == (p.tp, p.pp, p.cp, p.ep)
    assert cfg["ddp"].use_distributed_optimizer == (p.zero >= 1)


@pytest.mark.parametrize("model, p", DEEPSPEED_PLANS)
def test_deepspeeds_own_config_class_parses_the_export(model, p, monkeypatch):
    dsc = pytest.importorskip("deepspeed.runtime.config")
    monkeypatch.setattr(dsc.dist, "get_rank", lambda *a, **k: 0)  # it asks only to pick the world size

    class MPU:  # the data-parallel size DeepSpeed divides the batch by
        def get_data_parallel_world_size(self):
            return p.dp

    c = dsc.DeepSpeedConfig(deepspeed.config(p), mpu=MPU())
    assert (c.zero_optimization_stage, c.train_batch_size, c.train_micro_batch_size_per_gpu,
            c.gradient_accumulation_steps) == (p.zero, p.gbs, p.mbs, p.microbatches)


def test_what_an_engine_cannot_run_is_refused_with_the_reason():
    with pytest.raises(LayoutError, match="DeepSpeed's pipeline engine runs only with ZeRO-0/1"):
        deepspeed.export(load_model("llama-3.1-8b"), P(pp=2, dp=4, zero=3, gbs=8))
    with pytest.raises(LayoutError, match="not GPipe"):
        megatron.export(load_model("llama-3.1-8b"), P(pp=2, dp=4, schedule="gpipe", gbs=8))


def test_what_an_engine_cannot_express_is_listed():
    exp = deepspeed.export(load_model("llama-3.1-8b"), P(dp=8, recompute="selective"))
    assert any("selective recompute" in u for u in exp.unexpressed)
    oss = megatron.export(load_model("gpt-oss-120b"), P(dp=8, ep=8))
    assert "--quick-geglu" in oss.files[megatron.ARGS_FILE]  # its clamped SwiGLU, as Megatron spells it
    assert any("yarn rope scaling" in u for u in oss.unexpressed)  # no pretrain_gpt.py flags for GQA + yarn
    assert "--softmax-type learnable" in oss.files[megatron.ARGS_FILE]  # the sinks, as Megatron spells them


def test_context_parallel_exchanges_are_written_as_each_engine_spells_them():
    """Megatron: --cp-comm-type a2a (the ring is its default, p2p, left unwritten); DeepSpeed: the
    Ulysses degree as sequence_parallel_size, and what the training script must add said; a mix of
    types per layer, or allgather, is refused on import (one exchange per layout is modelled)."""
    llama = load_model("llama-3.1-8b")
    a2a = P(tp=2, dp=2, cp=2, cp_comm="a2a", gbs=8, sequence_parallel=True, zero=1)
    assert "--cp-comm-type a2a" in "".join(megatron.export(llama, a2a).files.values()).replace("\n", " ")
    assert "--cp-comm-type" not in "".join(megatron.export(llama, P(tp=2, dp=2, cp=2, gbs=8)).files.values())
    ulysses = deepspeed.export(llama, P(dp=2, cp=4, cp_comm="a2a", zero=3, gbs=8))
    assert json.loads(ulysses.files[deepspeed.CONFIG_FILE])["sequence_parallel_size"] == 4
    assert any("DistributedAttention" in u for u in ulysses.unexpressed)
    with pytest.raises(LayoutError, match="not ring attention"):
        deepspeed.export(llama, P(dp=2, cp=4, zero=3, gbs=8))
    from dayzero.export import torchtitan

    with pytest.raises(LayoutError, match="not Ulysses"):
        torchtitan.export(llama, P(dp=2, cp=4, cp_comm="a2a", zero=3, gbs=8))
    with pytest.raises(ConfigError, match="allgather"):
        megatron.parallel_from_args(["--context-parallel-size", "2", "--cp-comm-type", "allgather"], 8)
    with pytest.raises(ConfigError, match="mix"):
        megatron.parallel_from_args(["--context-parallel-size", "2", "--cp-comm-type", "p2p", "a2a"], 8)


def test_cli_export_then_import_is_the_same_layout(tmp_path, capsys):
    out = tmp_path / "mg"
    assert main(["export", "llama-3.1-8b", "--to", "megatron", "--devices", "16", "--tp", "2", "--pp", "2",
                 "--vpp", "2", "--gbs", "32", "-o", str(out), "--json"]) == 0
    exported = json.loads(capsys.readouterr().out)["parallel"]
    assert main(["import", str(out / megatron.ARGS_FILE), "--devices", "16", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["parallel"] == exported


def test_cli_export_of_a_plan_file(tmp_path, capsys):
    assert main(["plan", "llama-3.1-8b", "-a", "h100", "-n", "16", "--gbs", "64", "--engine", "megatron", "--top", "1",
                 "--json"]) == 0
    plan = tmp_path / "plan.json"
    plan.write_text(capsys.readouterr().out)
    assert main(["export", str(plan), "--to", "megatron", "--json"]) == 0
    assert "--tensor-model-parallel-size" in json.loads(capsys.readouterr().out)["command"]


@pytest.mark.parametrize("argv, says", [
    (["import", "{bad}", "--devices", "8"], "unknown launch format"),
    (["export", "llama-3.1-8b", "--to", "nemo", "--devices", "8"], "--to"),
    (["export", "llama-3.1-8b", "--to", "deepspeed", "--devices", "8", "--pp", "2", "--zero", "3", "--gbs", "8"],
     "DeepSpeed cannot run"),
])
def test_bad_input_is_one_line(argv, says, tmp_path, capsys):
    bad = tmp_path / "x.toml"
    bad.write_text("[job]\nname = 'x'\n")
    assert main([a.replace("{bad}", str(bad)) for a in argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("dayzero: error: ") and says in err[0]


def test_megatron_dispatches_tokens_the_way_the_planner_priced_them():
    """The planner prices Megatron's MoE layers with the deduplicating dispatcher
    (planner.engines.MEGATRON.ep_dispatcher): the export writes the flex dispatcher on DeepEP when
    experts span ranks, the plain all-to-all when every expert is local."""
    from dayzero.planner.engines import MEGATRON

    assert MEGATRON.ep_dispatcher == "dedup"
    spec = load_model("mixtral-8x7b")
    text = megatron.export(spec, P(tp=2, dp=8, ep=8, gbs=32)).files[megatron.ARGS_FILE]
    assert "--moe-token-dispatcher-type flex" in text and "--moe-flex-dispatcher-backend deepep" in text
    text = megatron.export(spec, P(tp=2, dp=8, gbs=32)).files[megatron.ARGS_FILE]
    assert "--moe-token-dispatcher-type alltoall" in text and "deepep" not in text


def test_megatron_writes_and_reads_full_recompute_of_n_layers_as_the_block_method():
    """recompute_layers N: Megatron-LM's --recompute-method block --recompute-num-layers N (the first
    N layers of each chunk, transformer_block.py _checkpointed_forward); the import reads it back,
    and plain full recompute stays uniform over 1-layer groups (every layer)."""
    p = P(tp=2, pp=4, dp=2, vpp=2, gbs=32, recompute="full", recompute_layers=2)
    args = [str(a) for a in megatron.layout_args(p)]
    i = args.index("--recompute-method")
    assert args[i:i + 3] == ["--recompute-method", "block", "--recompute-num-layers"] and args[i + 3] == "2"
    back, _ = megatron.parallel_from_args(args, world=16)
    assert back.recompute == "full" and back.recompute_layers == 2
    plain = [str(a) for a in megatron.layout_args(p.with_(recompute_layers=None))]
    assert plain[plain.index("--recompute-method") + 1] == "uniform"
    assert megatron.parallel_from_args(plain, world=16)[0].recompute_layers is None


def test_the_train_step_of_a_full_n_plan_trains_full_n():
    """A plan's full(N) (recompute_layers) is a dayzero train flag: the runtime checkpoints the first
    N blocks of each chunk (runtime.models.recompute.apply_activation_checkpointing), so the
    suggested train command carries it as the memory command does."""
    from dayzero.cli.next_steps import layout_flags, train_step

    p = P(tp=2, pp=4, dp=8, gbs=64, recompute="full", recompute_layers=3).to_dict()
    words = [str(w) for w in train_step("llama-3.1-8b", p, 64, 8, "train it").argv]
    assert words[words.index("--recompute-layers") + 1] == "3" and "full" in words
    assert "--recompute-layers" in layout_flags(p)


def test_the_run_step_exports_what_the_runtime_does_not_run():
    """A plan the dayzero runtime runs is trained with `dayzero train`; one it does not (cp 8 and
    the optimizer offloaded: planner.engines, DAYZERO's limits) is exported to the first engine
    that runs it, every layout flag kept (the switch included), and that command parses and writes
    the engine's launch with the same layout."""
    from typer.testing import CliRunner

    from dayzero.cli.app import app
    from dayzero.cli.next_steps import run_step
    from dayzero.planner.predict import predict
    from dayzero.specs.cluster import build_cluster

    spec, cl = load_model("llama-3.1-8b"), build_cluster("h100", 64)
    plain = P(tp=2, pp=4, dp=8, gbs=64)
    assert "dayzero" in predict(spec, plain, cl)["engines"]
    assert run_step("llama-3.1-8b", plain.to_dict(), ["dayzero", "megatron"], 64, 8, "train it").argv[:5] == (
        "torchrun", "--nnodes", "8", "--nproc-per-node", "8")
    far = P(tp=2, pp=2, dp=2, cp=8, gbs=64, seq=8192, optimizer_offload=True)
    engines = predict(spec, far, cl)["engines"]
    assert "dayzero" not in engines and engines[0] == "megatron"
    step = run_step("llama-3.1-8b", far.to_dict(), engines, 64, 8, "train it")
    words = list(step.argv)
    assert words[:5] == ["dayzero", "export", "llama-3.1-8b", "--to", "megatron"] and "--optimizer-offload" in words
    assert "megatron" in step.why and "runtime does not run it" in step.why
    out = CliRunner().invoke(app, [*words[1:words.index("-o")], "--json"])
    assert out.exit_code == 0, out.output
    assert "--context-parallel-size 8" in out.output and "--optimizer-cpu-offload" in out.output
