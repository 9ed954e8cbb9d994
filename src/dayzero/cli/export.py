"""``dayzero export`` and ``dayzero import``: a plan as an engine's launch, and an engine's launch
as a layout dayzero can judge."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from dayzero.cli.app import app
from dayzero.cli.common import JsonOpt, console, emit_json, takes_layout
from dayzero.cli.next_steps import Step, layout_flags, print_next
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
    device: Annotated[Optional[str], typer.Option("--device", help="Scheduler: the ranks' device, cuda | npu | cpu "
                                                                   "(default cuda).")] = None,
    job_name: Annotated[Optional[str], typer.Option("--job-name", help="Scheduler: the job's name (Kubernetes: also "
                                                                       "its namespace; default dayzero).")] = None,
    run_dir: Annotated[Optional[str], typer.Option("--run-dir", help="Scheduler: the run directory on the shared file "
                                                                     "system: ckpt/, metrics.jsonl, logs (default "
                                                                     "runs/dayzero).")] = None,
    engine: Annotated[Optional[str], typer.Option("--engine", help="Scheduler: what every node launches, dayzero | "
                                                                   "megatron | torchtitan | deepspeed (default "
                                                                   "dayzero, its runtime).")] = None,
    data: Annotated[Optional[str], typer.Option("--data", help="Scheduler: the training corpus on the shared file "
                                                               "system (dayzero train --data, Megatron --data-path, "
                                                               "torchtitan dataset_path, train.py "
                                                               "--data-path).")] = None,
    rank_table: Annotated[Optional[str], typer.Option("--rank-table", help="Scheduler with --device npu, or --to "
                                                                           "mindspeed: the HCCL rank "
                                                                           "table (JSON) on every node, for "
                                                                           "RANK_TABLE_FILE (default: torchrun's "
                                                                           "rendezvous).")] = None,
    steps: Annotated[Optional[int], typer.Option("--steps", min=1, help="Scheduler: optimizer steps (default: the "
                                                                        "plan file's steps for its tokens, else "
                                                                        "100).")] = None,
    ckpt_every: Annotated[Optional[int], typer.Option("--ckpt-every", min=1, help="Scheduler: checkpoint every N "
                                                      "steps (default: the plan file's optimal interval, else "
                                                      "50).")] = None,
    max_requeues: Annotated[Optional[int], typer.Option("--max-requeues", min=0, help="Scheduler: requeues (Slurm) "
                                                        "or restarts (Kubernetes) after a failure (default "
                                                        "3).")] = None,
    partition: Annotated[Optional[str], typer.Option("--partition", help="Slurm partition.")] = None,
    time_limit: Annotated[Optional[str], typer.Option("--time", help="Scheduler: time limit, Slurm's format "
                                                                     "(minutes, HH:MM:SS, D-HH:MM:SS).")] = None,
    exclude_from: Annotated[Optional[Path], typer.Option("--exclude-from", help="Scheduler: keep off the hosts of this "
                                                         "file (a run's exclusions.json, JSON {\"hosts\": [...]}, a "
                                                         "JSON list, or one per line).")] = None,
    exclude: Annotated[Optional[str], typer.Option("--exclude", help="Scheduler: hosts to keep off, "
                                                                     "comma-separated.")] = None,
    cpus_per_node: Annotated[Optional[int], typer.Option("--cpus-per-node", min=1, help="Scheduler: cores per node "
                                                         "(default: Slurm the whole node, Kubernetes 4 per "
                                                         "device).")] = None,
    mem_per_node: Annotated[Optional[int], typer.Option("--mem-per-node", min=1, help="Scheduler: GiB of memory per "
                                                        "node (default: Slurm the whole node, Kubernetes 32 per "
                                                        "device).")] = None,
    image: Annotated[Optional[str], typer.Option("--image", help="Kubernetes: the container image with dayzero "
                                                                 "installed.")] = None,
    volume_claim: Annotated[Optional[str], typer.Option("--volume-claim", help="Kubernetes: the ReadWriteMany "
                                                        "PersistentVolumeClaim holding --run-dir (default "
                                                        "JOB-NAME-run).")] = None,
    fp8_params: Annotated[bool, typer.Option("--fp8-param-gather", help="Megatron: FP8 parameter storage and "
                                             "all-gathers under --precision fp8 (as planned with the same "
                                             "flag).")] = False,
    optimizer_offload: Annotated[bool, typer.Option("--optimizer-offload", help="Megatron: the optimizer on the "
                                                    "host (--optimizer-cpu-offload, as planned with the same "
                                                    "flag).")] = False,
    activation_offload: Annotated[int, typer.Option("--activation-offload", metavar="N", min=0,
                                                    help="Megatron: the saved activations of the first N layers on "
                                                         "the host (--cpu-offloading --cpu-offloading-num-layers N, "
                                                         "as planned with the same flag).")] = 0,
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
    from dayzero.specs.plan_layout import parallel_from_plan
    from dayzero.specs.registry import load_model

    if out:
        prepare_output(out, "--out", "dir")
    if to not in WRITERS:
        from dayzero.names import did_you_mean

        raise ConfigError("--to", None, f"must be {', '.join(WRITERS)}, got {to!r}{did_you_mean(to, WRITERS)}")
    found = _plan_source(source, model)
    schedule: dict[str, int] = {}
    vendor = None  # the plan's accelerators' vendor: a Megatron export leaves out what their stack lacks
    if found:
        from dayzero.export.job import schedule_of

        name, pdict, plan_obj = found
        schedule = schedule_of(plan_obj)
        vendor = plan_obj.get("vendor") if isinstance(plan_obj.get("vendor"), str) else None
        given = layout.pinned()
        if given:
            raise ConfigError("--plan", None, f"the plan file sets the layout; drop {', '.join(given)}")
        if not name:
            raise ConfigError("--model", None, "the plan file names no model; give --model")
        spec, config_of = load_model(name), name
        parallel = parallel_from_plan(pdict, f"{source}: parallel", spec)
    else:
        if devices is None:
            raise ConfigError("--devices", None, "give the rank count with a model (dp fills it)")
        spec, parallel, config_of = load_model(source), layout.parallel(devices, precision), source
        layout_rules.validate(parallel, spec, devices)
    given = {"--device": device, "--job-name": job_name, "--run-dir": run_dir, "--steps": steps,
             "--ckpt-every": ckpt_every, "--max-requeues": max_requeues, "--partition": partition, "--time": time_limit,
             "--exclude-from": exclude_from, "--exclude": exclude, "--cpus-per-node": cpus_per_node,
             "--mem-per-node": mem_per_node, "--image": image, "--volume-claim": volume_claim,
             "--rank-table": rank_table, "--engine": engine, "--data": data}
    if optimizer_offload and to == "mindspeed":  # MindSpeed offloads the optimizer with --swap-optimizer
        parallel = parallel.with_(optimizer_offload=True)
    for flag, on, writers in (("--fp8-param-gather", fp8_params, ("megatron",)),
                              ("--optimizer-offload", optimizer_offload, ("megatron", "mindspeed")),
                              ("--activation-offload", activation_offload, ("megatron",))):
        if on and to not in writers:
            raise ConfigError(flag, None, f"only --to {' or '.join(writers)} writes it, not {to}")
    writer = _writer(to)
    from dayzero.specs.registry import model_config

    # the Hugging Face config DeepSpeed's train.py builds the model from (DeepSpeed has no model configuration)
    hf = model_config(config_of) if "deepspeed" in (to, engine) else None
    defaults = []
    if to in SCHEDULERS:
        from dayzero.export.job import JobOptions, hosts_to_exclude

        hosts = (hosts_to_exclude(exclude_from) if exclude_from else ()) + tuple(
            h.strip() for h in (exclude or "").split(",") if h.strip())
        steps = steps or schedule.get("steps")
        ckpt_every = ckpt_every or schedule.get("ckpt_every")
        if steps is None or ckpt_every is None:
            defaults.append(f"{'steps' if steps is None else 'checkpoint interval'} from dayzero's defaults "
                            f"({'--steps 100' if steps is None else '--ckpt-every 50'}), not a plan's: export a "
                            "`dayzero plan --tokens N --json` file, or give --steps and --ckpt-every")
        job = JobOptions(**{k: v for k, v in dict(
            name=job_name, devices_per_node=devices_per_node, device=device, run_dir=run_dir, steps=steps,
            ckpt_every=ckpt_every, max_requeues=max_requeues, partition=partition, time_limit=time_limit,
            exclude=tuple(dict.fromkeys(hosts)), memory_gb=mem_per_node, cpus_per_node=cpus_per_node, image=image,
            volume_claim=volume_claim, rank_table=rank_table, engine=engine, data=data, model=config_of).items()
            if v not in (None, ())})
        result = writer.export(spec, parallel, job=job, model_config=hf)
    else:
        unused = [k for k, v in given.items() if v is not None and not (to == "mindspeed" and k == "--rank-table")]
        if unused:
            raise ConfigError(unused[0], None, f"is a scheduler option (--to {' | '.join(SCHEDULERS)}), not {to}'s")
        extra = {k: True for k, on in (("fp8_param_gather", fp8_params), ("optimizer_offload", optimizer_offload))
                 if on and to == "megatron"}  # mindspeed reads the offload from the layout (set above)
        if activation_offload:
            extra["activation_offload_layers"] = activation_offload
        if to == "deepspeed":
            extra["model_config"] = hf
        if to == "megatron" and vendor:
            extra["vendor"] = vendor
        if to == "mindspeed":  # an Atlas A3 node runs 16 ranks (one per 910C die), an A2 node 8
            extra["rank_table"] = rank_table
        result = writer.export(spec, parallel, devices_per_node=devices_per_node or (16 if to == "mindspeed" else 8),
                               **extra)
    paths = result.write(out) if out else []
    if json_out:
        emit_json({**result.to_dict(), "parallel": parallel.to_dict(), "written": [str(p) for p in paths],
                   "assumed": defaults})
        return
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
    if paths:
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
