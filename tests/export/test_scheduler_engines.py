"""Slurm and Kubernetes jobs around any engine's launch (dayzero's runtime, Megatron-LM, torchtitan,
DeepSpeed) with the run's data, checkpoint directory, the plan's checkpoint interval and step count;
a layout dayzero's runtime refuses is refused at export with the runtime's own reason; and no value
a user gives can run as a command in a generated file (control characters refused with one line,
everything else quoted for its target, proven by running the script with stub launchers)."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess

import pytest
import yaml

from dayzero.cli.app import main
from dayzero.errors import ConfigError, LayoutError
from dayzero.export import kubernetes, megatron, slurm
from dayzero.export.job import ENGINES, JobOptions, schedule_of
from dayzero.runtime.checks import check_runtime
from dayzero.specs.parallel import ParallelConfig as P
from dayzero.specs.registry import load_model, model_config

# a layout every engine runs: FSDP (ZeRO-3) over 16 ranks, no tensor parallelism
FSDP = P(dp=16, zero=3, gbs=32)
MODEL = "tiny-llama"
# torchtitan runs only the models its config registry builds (export/torchtitan_models.py): the smallest one
MODELS = {"torchtitan": "llama-3.1-8b"}
DATA = "/shared/corpus"


def _job(engine: str, **kw) -> JobOptions:
    return JobOptions(**{"name": "dz", "image": "registry.example/train:1", "engine": engine, "data": DATA,
                         "run_dir": "/shared/run", "steps": 5961, "ckpt_every": 651, **kw})


def _srun_words(script: str) -> list[str]:
    """The words srun starts on every node (a DeepSpeed launch's `bash -c` line unwrapped)."""
    line = next(ln for ln in script.splitlines() if ln.startswith("srun "))
    if "bash -c" in line:
        words = shlex.split(shlex.split(line.rstrip(" &"))[-1])
    else:
        words = shlex.split(script[script.index(line):].split("\n")[1].strip().rstrip(" &"))
    return [re.sub(r"\$\{(\w+)\}", r"$\1", w) for w in words]  # "${CKPT_DIR}" as $CKPT_DIR


def _value(words: list[str], flag: str) -> str:
    return words[words.index(flag) + 1]


@pytest.mark.parametrize("engine", ENGINES)
def test_slurm_wraps_each_engine_with_data_checkpoints_interval_and_steps(engine):
    model = MODELS.get(engine, MODEL)
    spec = load_model(model)
    exp = slurm.export(spec, FSDP, job=_job(engine), model_config=model_config(model))
    words = _srun_words(exp.files[slurm.SCRIPT_FILE])
    launcher = "deepspeed" if engine == "deepspeed" else "torchrun"
    assert words[0] == launcher
    assert ("--num_gpus=8" if engine == "deepspeed" else "--nproc-per-node=8") in words
    flags = {"dayzero": ("--data", "--ckpt-dir", "--ckpt-every", "--steps"),
             "megatron": ("--data-path", "--save", "--save-interval", "--train-iters"),
             "torchtitan": ("--dataloader.dataset_path", "--checkpoint.folder", "--checkpoint.interval",
                            "--training.steps"),
             "deepspeed": ("--data-path", "--save-dir", "--save-interval", "--train-iters")}[engine]
    data, ckpt, every, steps = (_value(words, f) for f in flags)
    assert (data, ckpt, every, steps) == (DATA, "$CKPT_DIR", "651", "5961")
    if engine == "megatron":  # the arguments in the job build the planned model (Megatron-Core's own classes)
        assert _value(words, "--load") == "$CKPT_DIR"
        readback = pytest.importorskip("dayzero.export.readback")
        pytest.importorskip("megatron.core")
        from dayzero.specs.counting import params_total

        assert readback.megatron_parameters(words) == params_total(spec)
    if engine == "deepspeed":  # its JSON files are written into the run directory by the script itself
        text = exp.files[slurm.SCRIPT_FILE]
        assert 'cat > "$ENGINE_FILES/ds_config.json"' in text and 'cat > "$ENGINE_FILES/config.json"' in text
        assert _value(words, "--deepspeed_config") == "$ENGINE_FILES/ds_config.json"


@pytest.mark.parametrize("engine", ENGINES)
def test_kubernetes_wraps_each_engine_with_data_checkpoints_interval_and_steps(engine):
    model = MODELS.get(engine, MODEL)
    exp = kubernetes.export(load_model(model), FSDP, job=_job(engine), model_config=model_config(model))
    docs = list(yaml.safe_load_all(exp.files[kubernetes.MANIFEST_FILE]))
    job = docs[-1]
    command = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["command"]
    assert DATA in command and "/shared/run/ckpt" in command and "651" in command and "5961" in command
    if engine == "deepspeed":
        assert "elasticPolicy" not in job["spec"] and "--node_rank=$(RANK)" in command
        assert {d["kind"] for d in docs} >= {"ConfigMap"}
        assert "/etc/dayzero/ds_config.json" in command
    else:
        assert command[0] == "torchrun" and job["spec"]["elasticPolicy"]["rdzvBackend"] == "c10d"


def test_a_layout_the_runtime_refuses_is_refused_at_export_with_the_runtimes_reason():
    """The rule is the runtime's own check (runtime.checks.check_runtime), called by the export:
    one place per rule, the same sentence."""
    spec = load_model("qwen3-235b-a22b")
    p = P(tp=4, pp=2, dp=64, ep=8, gbs=512, recompute="selective", recompute_modules=("core_attn", "moe_act"))
    with pytest.raises(LayoutError) as runtime:
        check_runtime(spec, p, p.world)
    for writer in (slurm, kubernetes):
        with pytest.raises(LayoutError) as export:
            writer.export(spec, p, job=_job("dayzero"))
        assert str(export.value) == str(runtime.value) and "recompute modules" in str(export.value)
    # Megatron-LM runs it: the same layout wrapped around Megatron's launch is written
    assert "--recompute-modules" in slurm.export(spec, p, job=_job("megatron")).files[slurm.SCRIPT_FILE]


def test_the_plans_steps_and_checkpoint_interval_are_the_jobs(tmp_path):
    plan = {"model": MODELS["torchtitan"], "plans": [{"parallel": FSDP.to_dict(), "training": {
        "steps": 1234, "failures": {"optimal_checkpoint_interval_steps": 77}}}]}
    assert schedule_of(plan) == {"steps": 1234, "ckpt_every": 77}
    assert schedule_of({"plans": [{"training": {"steps": 10, "failures": {
        "optimal_checkpoint_interval_steps": 500}}}]}) == {"steps": 10, "ckpt_every": 10}  # at most the run
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    out = tmp_path / "job"
    assert main(["export", str(tmp_path / "plan.json"), "--to", "slurm", "--engine", "torchtitan", "--data", DATA,
                 "-o", str(out)]) == 0
    words = _srun_words((out / slurm.SCRIPT_FILE).read_text())
    assert (_value(words, "--checkpoint.interval"), _value(words, "--training.steps")) == ("77", "1234")


@pytest.mark.parametrize("flag", ["--partition", "--run-dir", "--data", "--image", "--volume-claim", "--time",
                                  "--rank-table", "--exclude", "--job-name"])
@pytest.mark.parametrize("char", ["\n", "\r", "\x1b", "\x00", "\u2028"])
def test_a_control_character_in_any_free_text_option_is_one_line(flag, char, capsys):
    to = "kubernetes" if flag in ("--image", "--volume-claim") else "slurm"
    extra = ["--device", "npu"] if flag == "--rank-table" else []
    argv = ["export", MODEL, "--to", to, "--devices", "16", "--image", "img:1", *extra, flag, f"p{char}touch X"]
    if flag == "--image":
        argv = argv[:6] + argv[8:]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"{flag}: holds the control character" in err


def test_quoting_layers_keep_shell_syntax_literal():
    from dayzero.export.quoting import Ref, container_arg, sbatch_value, shell_word

    evil = "$(touch X)`touch Y`;touch Z '\" $HOME"
    assert shlex.split(shell_word(evil)) == [evil]
    assert shell_word(Ref("$CKPT_DIR/x"), expand=frozenset({"CKPT_DIR"})) == '"${CKPT_DIR}"/x'
    assert shell_word("$CKPT_DIR/x", expand=frozenset({"CKPT_DIR"})) == "'$CKPT_DIR/x'"  # a user's text: literal
    assert container_arg("$(touch X)") == "$$(touch X)"
    assert container_arg(Ref("--node_rank=$(RANK)"), expand=frozenset({"RANK"})) == "--node_rank=$(RANK)"
    with pytest.raises(ConfigError, match="--partition"):
        sbatch_value("--partition", "gpu --wrap=id")


def _stubs(bin_dir, record):
    """srun runs its command (without its options), scontrol names this host, the launchers record
    their argv (one NUL-terminated word each) into ``record``."""
    bin_dir.mkdir()
    scripts = {
        "srun": '#!/bin/bash\nwhile [[ "$1" == --* ]]; do shift; done\nexec "$@"\n',
        "scontrol": '#!/bin/bash\n[ "$1" = show ] && echo localhost\nexit 0\n',
        "torchrun": f'#!/bin/bash\nprintf "%s\\0" "$@" > {shlex.quote(str(record))}\n',
        "deepspeed": f'#!/bin/bash\nprintf "%s\\0" "$@" > {shlex.quote(str(record))}\n',
    }
    for name, text in scripts.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)


@pytest.mark.slow
@pytest.mark.parametrize("engine, device", [(e, "cuda") for e in ENGINES] + [("dayzero", "npu")])
def test_hostile_values_run_no_payload_in_the_sbatch_script(engine, device, tmp_path):
    """Every free-text option holds shell syntax; the script passes `bash -n`, then runs with srun,
    scontrol and the launchers replaced by stubs: the launcher receives each value as one literal
    word and no payload file appears."""
    bash = shutil.which("bash")
    if not bash:
        pytest.skip("no bash")
    t = str(tmp_path)
    run_dir = f"{t}/run$(touch${{IFS}}{t}/P1)`touch${{IFS}}{t}/P2`;touch${{IFS}}{t}/P3"
    data = f"{t}/data $(touch {t}/P4) \"'; touch {t}/P5 `touch {t}/P6` $HOME"
    extra = {"device": "npu", "rank_table": f"{t}/table $(touch {t}/P8)`touch {t}/P9`.json"} if device == "npu" else {}
    job = _job(engine, run_dir=run_dir, data=data, partition=f"p;touch${{IFS}}{t}/P7", name="dz", **extra)
    model = MODELS.get(engine, MODEL)
    exp = slurm.export(load_model(model), FSDP, job=job, model_config=model_config(model))
    script = tmp_path / "job.sbatch"
    script.write_text(exp.files[slurm.SCRIPT_FILE])
    assert subprocess.run([bash, "-n", str(script)], capture_output=True).returncode == 0
    _stubs(tmp_path / "bin", tmp_path / "argv")
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}", "SLURM_JOB_NODELIST": "localhost",
           "SLURM_JOB_ID": "1", "SLURM_NNODES": "1", "SLURM_NODEID": "0", "TORCHTITAN_CONFIG": "llama3_debugmodel",
           "MEGATRON_LM": "/opt/megatron", "CANN_SET_ENV": f"{t}/no-such-set_env.sh"}
    done = subprocess.run([bash, str(script)], cwd=t, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith("P")]
    argv = (tmp_path / "argv").read_text().split("\0")[:-1]
    assert data in argv  # one literal word, quotes and $(...) included
    assert f"{run_dir}/ckpt" in argv or f"--checkpoint.folder={run_dir}/ckpt" in argv
    assert (tmp_path / run_dir.removeprefix(t + "/") / "ckpt").is_dir()  # the literal directory was made


def test_hostile_values_stay_literal_in_the_kubernetes_manifest():
    data = "/d $(touch X) `id` \"q\" 'q' #c: {a: 1}"
    job = _job("megatron", data=data, image="img:1 $(touch X)", volume_claim="claim")
    exp = kubernetes.export(load_model(MODEL), FSDP, job=job)
    docs = list(yaml.safe_load_all(exp.files[kubernetes.MANIFEST_FILE]))
    container = docs[-1]["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
    assert container["image"] == "img:1 $(touch X)"  # YAML keeps the text whole; no shell reads an image name
    assert "/d $$(touch X) `id` \"q\" 'q' #c: {a: 1}" in container["command"]  # Kubernetes reads $$ as $
    assert "$(MEGATRON_LM)/pretrain_gpt.py" in container["command"]  # the launch's own reference expands


def test_megatron_argument_file_quotes_a_hostile_model_name(tmp_path):
    d = tmp_path / "m;touch X $(id)"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(dict(
        model_type="llama", hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=128, vocab_size=512, max_position_embeddings=128)))
    spec = load_model(str(d))
    text = slurm.export(spec, FSDP, job=_job("dayzero")).files[slurm.SCRIPT_FILE]
    assert shlex.quote(spec.name) in text
    assert megatron.export(spec, P(dp=8, gbs=8)).files[megatron.ARGS_FILE]


def test_the_runtimes_ranks_load_the_model_as_it_was_given(tmp_path):
    """A model from a config directory is trained from that directory, not from a preset of the
    same base name."""
    d = tmp_path / "llama-3.1-8b"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(dict(
        model_type="llama", hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=128, vocab_size=512, max_position_embeddings=128)))
    out = tmp_path / "job"
    assert main(["export", str(d), "--to", "slurm", "--devices", "16", "--zero", "3", "-o", str(out)]) == 0
    words = _srun_words((out / slurm.SCRIPT_FILE).read_text())
    assert words[words.index("train") + 1] == str(d)
