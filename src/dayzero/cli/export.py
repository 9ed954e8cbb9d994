"""``dayzero export`` and ``dayzero import``: a plan as an engine's launch, and an engine's launch
as a layout dayzero can judge."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from dayzero.cli.app import app
from dayzero.cli.common import JsonOpt, console, emit_json, takes_layout
from dayzero.cli.export_options import MemorySwitches, SchedulerOptions
from dayzero.cli.next_steps import Step, layout_flags, print_next
from dayzero.cli.option_groups import takes_groups
from dayzero.specs import layout_rules
from dayzero.specs.layout_options import LayoutOptions

WRITERS = ("megatron", "mindspeed", "torchtitan", "deepspeed", "slurm", "kubernetes")
SCHEDULERS = ("slurm", "kubernetes")


def _plan_source(source: str, model: str | None) -> tuple[str, dict, dict] | None:
    """(model, parallel dict, the file's contents) of a ``dayzero plan/predict --json`` file, or None
    for a model."""
    from dayzero.inputs import load_json
    from dayzero.specs.plan_layout import read_plan

    path = Path(source)
    if path.suffix != ".json" or not path.is_file():
        return None
    obj = load_json(path)
    if isinstance(obj, dict) and "model_type" in obj:
        return None  # a config.json: the model itself
    name, parallel = read_plan(path, obj)
    return model or name, parallel, obj


@app.command("export")
@takes_layout()
@takes_groups(scheduler=SchedulerOptions, switches=MemorySwitches)
def export_cmd(
    source: Annotated[str, typer.Argument(help="A `dayzero plan/predict --json` file (its best plan), or a model "
                                               "(preset, config.json, directory) with layout flags.")],
    to: Annotated[str, typer.Option("--to", help=f"Engine: {' | '.join(WRITERS)} (mindspeed: MindSpeed-LLM's "
                                                 "pretrain_gpt.py arguments and an Atlas A2/A3 node's launch).")],
    layout: LayoutOptions = LayoutOptions(),
    precision: Annotated[str, typer.Option("--precision", help="GEMM precision with a model: bf16 | fp8 | "
                                                               "fp4.")] = "bf16",
    devices: Annotated[Optional[int], typer.Option("--devices", "-n", min=1, help="Ranks, with a model (dp fills "
                                                                                  "them).")] = None,
    model: Annotated[Optional[str], typer.Option("--model", help="With a plan file: the model, when the plan's name is "
                                                 "not a preset.")] = None,
    devices_per_node: Annotated[Optional[int], typer.Option("--devices-per-node", min=1, help="Ranks per node in the "
                                                            "launch (default 8).")] = None,
    out: Annotated[Optional[Path], typer.Option("--out", "-o", help="Write the engine's files into this "
                                                                    "directory.")] = None,
    scheduler: SchedulerOptions = SchedulerOptions(), switches: MemorySwitches = MemorySwitches(),
    json_out: JsonOpt = False,
) -> None:
    """Write a plan as an engine's launch: Megatron-LM's pretrain_gpt.py arguments, torchtitan's config overrides, a
    DeepSpeed config JSON and its launch line, a Slurm sbatch script or a Kubernetes PyTorchJob manifest (both run
    dayzero train, requeue or restart after a failure and resume from the checkpoint), with every setting the target
    cannot express listed. A layout the
    target cannot run is refused with the reason.

    Example: [bold]dayzero plan llama-3.1-70b -a h100 -n 64 --engine megatron --json > plan.json; dayzero export
    plan.json --to megatron -o runs/export/megatron[/bold]
    """
    from dayzero.errors import ConfigError
    from dayzero.outputs import prepare_output

    if out:
        prepare_output(out, "--out", "dir")
    if to not in WRITERS:
        from dayzero.names import did_you_mean

        raise ConfigError("--to", None, f"must be {', '.join(WRITERS)}, got {to!r}{did_you_mean(to, WRITERS)}")
    spec, parallel, config_of, schedule, vendor = _source_layout(source, model, layout, devices, precision)
    if switches.optimizer_offload and to == "mindspeed":  # MindSpeed offloads the optimizer with --swap-optimizer
        parallel = parallel.with_(optimizer_offload=True)
    switches.refuse_unwritten(to)
    writer = _writer(to)
    from dayzero.specs.registry import model_config

    # the Hugging Face config DeepSpeed's train.py builds the model from (DeepSpeed has no model configuration)
    hf = model_config(config_of) if "deepspeed" in (to, scheduler.engine) else None
    defaults, job = [], None
    if to in SCHEDULERS:
        job, defaults = scheduler.job(schedule, config_of, devices_per_node)
        result = writer.export(spec, parallel, job=job, model_config=hf)
    else:
        extra = _engine_extra(to, scheduler, switches, hf, vendor)
        result = writer.export(spec, parallel, devices_per_node=devices_per_node or (16 if to == "mindspeed" else 8),
                               **extra)
    paths = result.write(out) if out else []
    if json_out:
        emit_json({**result.to_dict(), "parallel": parallel.to_dict(), "written": [str(p) for p in paths],
                   "assumed": defaults})
        return
    _print_export(spec, parallel, to, result, defaults, paths, job)


def _source_layout(source: str, model: str | None, layout: LayoutOptions, devices: int | None, precision: str):
    """(spec, layout, the model name a config is read from, the plan file's schedule, its accelerators'
    vendor) of a plan file (which sets the layout: layout flags refused) or of a model with layout
    flags and --devices (checked by the layout rules). The vendor: a Megatron export leaves out what
    their stack lacks."""
    from dayzero.errors import ConfigError
    from dayzero.specs.plan_layout import parallel_from_plan
    from dayzero.specs.registry import load_model

    found = _plan_source(source, model)
    if not found:
        if devices is None:
            raise ConfigError("--devices", None, "give the rank count with a model (dp fills it)")
        spec, parallel = load_model(source), layout.parallel(devices, precision)
        layout_rules.validate(parallel, spec, devices)
        return spec, parallel, source, {}, None
    from dayzero.export.job import schedule_of

    name, pdict, plan_obj = found
    schedule = schedule_of(plan_obj)
    vendor = plan_obj.get("vendor") if isinstance(plan_obj.get("vendor"), str) else None
    given = layout.pinned()
    if given:
        raise ConfigError("--plan", None, f"the plan file sets the layout; drop {', '.join(given)}")
    if not name:
        raise ConfigError("--model", None, "the plan file names no model; give --model")
    spec = load_model(name)
    return spec, parallel_from_plan(pdict, f"{source}: parallel", spec), name, schedule, vendor


def _engine_extra(to: str, scheduler: SchedulerOptions, switches: MemorySwitches, hf, vendor: str | None) -> dict:
    """An engine writer's keyword arguments beyond the layout: the memory switches Megatron writes
    (MindSpeed reads the optimizer offload from the layout), DeepSpeed's model config, the accelerators'
    vendor for Megatron, MindSpeed's rank table. A scheduler flag is refused with a one-line ConfigError."""
    from dayzero.errors import ConfigError

    unused = [k for k, v in scheduler.given().items()
              if v is not None and not (to == "mindspeed" and k == "--rank-table")]
    if unused:
        raise ConfigError(unused[0], None, f"is a scheduler option (--to {' | '.join(SCHEDULERS)}), not {to}'s")
    extra = {k: True for k, on in (("fp8_param_gather", switches.fp8_params),
                                   ("optimizer_offload", switches.optimizer_offload)) if on and to == "megatron"}
    if switches.activation_offload:
        extra["activation_offload_layers"] = switches.activation_offload
    if to == "deepspeed":
        extra["model_config"] = hf
    if to == "megatron" and vendor:
        extra["vendor"] = vendor
    if to == "mindspeed":  # an Atlas A3 node runs 16 ranks (one per 910C die), an A2 node 8
        extra["rank_table"] = scheduler.rank_table
    return extra


def _print_export(spec, parallel, to: str, result, defaults: list[str], paths: list, job) -> None:
    """The export as text: each file as written, the launch line, what the target cannot express, what
    was assumed, and the next step for what was written."""
    console.print(f"[bold]{spec.name}[/bold] {parallel.describe()} for {to}:", highlight=False)
    for name, text in result.files.items():
        console.print(f"--- {name}", highlight=False)
        # as written, never wrapped: a script copied from the terminal must run (lines wider than it stay whole)
        console.print(text, end="", highlight=False, markup=False, soft_wrap=True)
    console.print("launch: " + " ".join(result.command), highlight=False, markup=False, soft_wrap=True)
    for item in result.unexpressed:
        console.print(f"  not expressible in {to}: {item}", highlight=False)
    for item in defaults:
        console.print(f"  assumed: {item}", highlight=False)
    if not paths:
        return
    console.print(f"wrote {', '.join(str(p) for p in paths)}")
    if to == "slurm":
        step = Step.of("sbatch", paths[0], why=f"submit it (create {job.run_dir} on the shared file system first)")
    elif to == "kubernetes":
        step = Step.of("kubectl", "apply", "-f", paths[0], why=f"create the namespace, its quota and the job "
                       f"(the volume claim {job.volume_claim or job.name + '-run'} must exist)")
    else:
        step = Step.of("dayzero", "import", paths[0], "--devices", parallel.world,
                       why="read it back: the same layout")
    print_next(console, [step])

def _writer(engine: str):
    import importlib

    return importlib.import_module(f"dayzero.export.{engine}")


# An engine's launch file is kilobytes (a Megatron argument list of ~100 flags is ~4 KB): these
# bounds refuse a 40 MB line before the shell-word splitter walks it character by character.
LAUNCH_FILE_BYTES = 1 << 20
LAUNCH_LINE_CHARS = 1 << 16


def _launch_text(path: Path) -> str:
    from dayzero.inputs import read_lines

    return "\n".join(read_lines(path, "an engine's launch file", LAUNCH_LINE_CHARS, LAUNCH_FILE_BYTES))


def _import(engine: str, file: Path, devices: int):
    """The layout of an engine's launch file (and the notes on what was assumed), checked by the same
    rules as the flags: a launch whose values no engine could run (ep -4, seq 0, ZeRO stage 7)
    is refused with the field, never returned."""
    import re
    from dataclasses import asdict

    from dayzero.errors import ConfigError, DayzeroError, one_line
    from dayzero.specs.parallel import ParallelConfig
    from dayzero.specs.plan_layout import checked_fields, checked_layout

    if engine == "deepspeed":
        from dayzero.export.deepspeed import LAUNCH_FILE

        launch = file.with_name(LAUNCH_FILE)
        if launch.exists() or launch.is_symlink():
            _launch_text(launch)  # a special file or a bomb beside the config: refused before it is split
    try:
        parallel, notes = _writer(engine).import_file(file, devices)
    except DayzeroError as e:
        if "functools.partial(" not in str(e):
            raise
        # argparse quotes its type converter's repr: say the value was refused, not which Python object refused it
        raise DayzeroError(re.sub(r"invalid functools\.partial\(.*?\) value:", "invalid value", str(e))) from None
    except (ValueError, TypeError, KeyError, AttributeError, IndexError, ArithmeticError) as e:
        raise ConfigError(str(file), None, f"cannot be read as a {engine} launch: {one_line(e, 200)}") from None
    d = asdict(parallel)  # not to_dict: it divides by mbs, which the rules check first
    checked_fields(d, str(file))
    try:
        checked_layout(ParallelConfig.from_dict(d), str(file), devices=devices)
    except (TypeError, ValueError, ArithmeticError) as e:
        if isinstance(e, DayzeroError):
            raise
        raise ConfigError(str(file), None, f"holds values no layout has: {one_line(e, 200)}") from None
    if parallel.microbatches < 1:
        raise ConfigError(str(file), "microbatches", f"gives {parallel.microbatches} micro-batches per step; "
                          "the global batch must hold at least mbs x dp sequences")
    return parallel, notes
# words only a MindSpeed-LLM launch holds: its flags (github.com/Ascend/MindSpeed mindspeed/arguments.py,
# features_manager) and the CANN environment script
MINDSPEED_MARKS = ("--use-fused-rmsnorm", "--use-fused-swiglu", "--use-fused-rotary-pos-emb", "--swap-optimizer",
                   "--moe-fb-overlap", "--schedules-method", "--context-parallel-algo", "--use-mcore-models",
                   "set_env.sh")


def _detect(path: Path) -> str:
    from dayzero.errors import ConfigError
    from dayzero.inputs import parse_json

    text = _launch_text(path)
    if path.suffix == ".json":
        obj = parse_json(text, str(path))
        if isinstance(obj, dict) and ("zero_optimization" in obj or "train_batch_size" in obj):
            return "deepspeed"
    elif any(w in text for w in MINDSPEED_MARKS):
        return "mindspeed"
    elif "--tensor-model-parallel-size" in text or "--pipeline-model-parallel-size" in text:
        return "megatron"
    elif "--parallelism." in text or "torchtitan.train" in text:
        return "torchtitan"
    raise ConfigError(str(path), None, "unknown launch format: expected a DeepSpeed config JSON, a MindSpeed-LLM "
                      "launch script, a Megatron argument list (--tensor-model-parallel-size ...) or torchtitan "
                      "overrides (--parallelism.* ...)")


@app.command("import")
def import_cmd(
    file: Annotated[Path, typer.Argument(help="A Megatron argument list, a MindSpeed-LLM launch script, torchtitan "
                                              "overrides or a DeepSpeed config JSON.")],
    devices: Annotated[int, typer.Option("--devices", "-n", min=1, help="Ranks the job runs on (the launcher's world "
                                                                        "size).")],
    model: Annotated[Optional[str], typer.Option("--model", help="The model, for the next step's command.")] = None,
    json_out: JsonOpt = False,
) -> None:
    """Read an engine's launch (a Megatron argument list, torchtitan overrides, a DeepSpeed config JSON) into a
    dayzero layout, so predict and memory can judge a launch a team already has.

    Example: [bold]dayzero import runs/export/megatron/megatron_args.txt --devices 64[/bold]
    """
    engine = _detect(file)
    parallel, notes = _import(engine, file, devices)
    if json_out:
        emit_json({"engine": engine, "parallel": parallel.to_dict(), "notes": notes})
        return
    console.print(f"{file} ({engine}): [bold]{parallel.describe()}[/bold] on {devices} ranks", highlight=False)
    for n in notes:
        console.print(f"  {n}", highlight=False)
    print_next(console, [Step.of("dayzero", "predict", model or "MODEL", "--accelerator", "ACCELERATOR", "--devices",
                                 devices,
                                 *layout_flags(parallel.to_dict()), why="its step time and memory")])
