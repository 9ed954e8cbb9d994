"""dayzero export --to torchtitan / dayzero import: torchtitan's own ConfigManager parses the overrides,
import(export(p)) == p, and what torchtitan cannot run or express is said, never dropped."""

import dataclasses
import json
import sys
import textwrap

import pytest

from dayzero.cli.app import main
from dayzero.errors import ConfigError, LayoutError
from dayzero.export import torchtitan
from dayzero.specs.parallel import ParallelConfig as P
from dayzero.specs.registry import load_model

PLANS = [
    ("llama-3.1-8b", P(tp=2, dp=4, zero=3, gbs=16, sequence_parallel=True, recompute="selective")),  # dense
    ("gpt-oss-120b", P(dp=8, ep=8, zero=3, gbs=16, recompute="full")),  # MoE with EP
    ("llama-3.1-8b", P(pp=4, dp=2, vpp=2, gbs=32, zero=3, recompute="full")),  # interleaved PP
    ("llama-3.1-8b", P(dp=4, cp=2, zero=3, gbs=8, mbs=2, seq=8192)),  # ZeRO-3 (FSDP2) with CP
    ("llama-3.1-8b", P(tp=2, dp=4, zero=3, gbs=8, sequence_parallel=True, precision="fp8")),  # FP8
    ("llama-3.1-8b", P(tp=2, dp=4, zero=2, gbs=8, sequence_parallel=True)),  # ZeRO-2: reshard never
    ("llama-3.1-8b", P(dp=8, zero=0, gbs=32)),  # DDP
    ("llama-3.1-8b", P(pp=2, dp=4, zero=3, gbs=32, schedule="gpipe")),  # GPipe
]
IDS = [f"{m}-{p.describe()}-{p.precision}" for m, p in PLANS]

# torchtitan 0.3's Trainer.Config imports its whole training stack (torchdata, triton); the test parses the
# overrides with ConfigManager into a config of torchtitan's own section classes, the types Trainer.Config holds.
REGISTRY = textwrap.dedent("""
    from dataclasses import dataclass, field
    from torchtitan.components.checkpointer.base import BaseCheckpointManager
    from torchtitan.config import CompileConfig, ParallelismConfig, TrainingConfig
    from torchtitan.distributed.activation_checkpoint import ActivationCheckpointingConfig, SelectiveAC

    @dataclass
    class Job:
        hf_assets_path: str = "."
        training: TrainingConfig = field(default_factory=TrainingConfig)
        parallelism: ParallelismConfig = field(default_factory=ParallelismConfig)
        checkpoint: BaseCheckpointManager.Config = field(default_factory=BaseCheckpointManager.Config)
        activation_checkpoint: ActivationCheckpointingConfig = field(default_factory=SelectiveAC.Config)
        compile: CompileConfig = field(default_factory=CompileConfig)

    def job():
        return Job()
""")


@pytest.fixture
def manager(tmp_path, monkeypatch):
    pytest.importorskip("torchtitan.config", reason="torchtitan is an optional extra (pip install torchtitan)")
    pytest.importorskip("torchtitan.distributed.activation_checkpoint",
                        reason="torchtitan 0.3 needs spmd_types (pip install --no-deps spmd_types)")
    from torchtitan.config import ConfigManager

    (tmp_path / "titan_job_registry.py").write_text(REGISTRY)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield lambda args: ConfigManager().parse_args(["--module", "titan_job_registry", "--config", "job", *args])
    sys.modules.pop("titan_job_registry", None)


@pytest.mark.parametrize("model, p", PLANS, ids=IDS)
def test_torchtitans_config_manager_parses_the_export(model, p, manager):
    spec = load_model(model)
    cfg = manager(torchtitan.overrides(p, spec.layers))
    par, tr = cfg.parallelism, cfg.training
    assert (par.tensor_parallel_degree, par.pipeline_parallel_degree, par.context_parallel_degree,
            par.expert_parallel_degree) == (p.tp, p.pp, p.cp, p.ep)
    assert par.data_parallel_shard_degree * par.data_parallel_replicate_degree == p.dp
    assert tr.global_batch_size == p.gbs and tr.seq_len == p.seq
    ac = type(cfg.activation_checkpoint).__qualname__ if cfg.activation_checkpoint else "none"
    assert ac == {"none": "none", "selective": "SelectiveAC.Config", "full": "FullAC.Config"}[p.recompute]
    assert cfg.checkpoint.enable and cfg.compile.enable == (p.precision == "fp8")
    if p.pp > 1:  # one step's local batch is split into pipeline micro-batches of mbs
        assert tr.local_batch_size // par.pipeline_parallel_microbatch_size == p.microbatches
        assert par.pipeline_parallel_schedule == torchtitan.SCHEDULES[p.schedule]
    if p.vpp > 1:
        assert par.pipeline_parallel_layers_per_stage * p.pp * p.vpp == spec.layers
    assert par.fsdp_reshard_after_forward == ("never" if p.zero == 2 else "default")
    assert dataclasses.is_dataclass(cfg)


@pytest.mark.parametrize("model, p", PLANS, ids=IDS)
def test_import_of_an_export_is_the_same_layout(model, p, tmp_path):
    torchtitan.export(load_model(model), p).write(tmp_path)
    back, notes = torchtitan.import_file(tmp_path / torchtitan.ARGS_FILE, p.world)
    assert back == p and notes == []


def test_import_of_a_whole_launch_line(tmp_path):
    p = P(tp=2, pp=2, dp=2, zero=3, gbs=16, sequence_parallel=True)
    exp = torchtitan.export(load_model("llama-3.1-8b"), p)
    line = tmp_path / "launch.sh"
    line.write_text(" ".join(exp.command) + "\n")
    back, notes = torchtitan.import_file(line, p.world)
    assert back == p and any("precision bf16 assumed" in n for n in notes)


def test_what_torchtitan_cannot_express_is_listed():
    un = torchtitan.export(load_model("llama-3.1-8b"), P(tp=2, dp=4, zero=3, sequence_parallel=True,
                                                         precision="fp8", recompute="full", recompute_layers=2,
                                                         )).unexpressed
    assert any("Float8LinearConverter" in u for u in un) and any("recompute of 2 layers" in u for u in un)
    split = torchtitan.export(load_model("llama-3.1-8b"), P(pp=2, dp=4, zero=3, layer_split=(15, 17))).unexpressed
    assert any("layer split (15, 17)" in u for u in split)
    # a model torchtitan has no module for is refused (tests/export/test_torchtitan_models.py), not listed
    with pytest.raises(ConfigError, match="no model module for model_type 'mixtral'"):
        torchtitan.export(load_model("mixtral-8x7b"), P(dp=8, ep=8, zero=3))


@pytest.mark.parametrize("p, says", [
    (P(dp=8, zero=1), "no optimizer-only sharding"),
    (P(tp=2, dp=4, zero=0, sequence_parallel=True), r"DDP \(ZeRO-0\) does not combine"),
    (P(tp=2, dp=4, zero=3), "SequenceParallel"),
    (P(tp=2, dp=4, zero=3, sequence_parallel=True, precision="fp4"), "no fp4"),
])
def test_what_torchtitan_cannot_run_is_refused_with_the_reason(p, says):
    with pytest.raises(LayoutError, match=says):
        torchtitan.export(load_model("llama-3.1-8b"), p)


def test_cli_export_then_import_is_the_same_layout(tmp_path, capsys):
    out = tmp_path / "tt"
    assert main(["export", "llama-3.1-8b", "--to", "torchtitan", "--devices", "16", "--tp", "2", "--pp", "2",
                 "--vpp", "2", "--sequence-parallel", "--zero", "3", "--gbs", "32", "-o", str(out), "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    # the model is torchtitan's own llama3_8b, so nothing is left unexpressed
    assert "torchtitan.train" in got["command"] and "llama3_8b" in got["command"] and got["unexpressed"] == []
    assert main(["import", str(out / torchtitan.ARGS_FILE), "--devices", "16", "--json"]) == 0
    back = json.loads(capsys.readouterr().out)
    assert back["engine"] == "torchtitan" and back["parallel"] == got["parallel"]


@pytest.mark.parametrize("argv, text, says", [
    (["export", "llama-3.1-8b", "--to", "torchtitan", "--devices", "8", "--zero", "1"], None,
     "torchtitan cannot run"),
    (["import", "{f}", "--devices", "8"], "--parallelism.tensor_parallel_degree 3\n", "not divisible"),
    (["import", "{f}", "--devices", "8"], "--parallelism.tensor_parallel_degree two\n", "expected an integer"),
    (["import", "{f}", "--devices", "8"], "--parallelism.data_parallel_shard_degree 8\nactivation_checkpoint:"
     "memory-budget\n", "no dayzero equivalent"),
    (["import", "{f}", "--devices", "8"], "--parallelism.pipeline_parallel_degree 2 "
     "--parallelism.pipeline_parallel_schedule ZeroBubble\n", "pipeline_parallel_schedule"),
])
def test_bad_input_is_one_line(argv, text, says, tmp_path, capsys):
    f = tmp_path / "args.txt"
    if text:
        f.write_text(text)
    assert main([a.replace("{f}", str(f)) for a in argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("dayzero: error: ") and says in err[0]
