"""``dayzero train MODEL [parallel flags]``: train a layout for real on PyTorch's distributed engine."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import Annotated, Optional

import typer

from dayzero.cli.app import app
from dayzero.cli.common import (
    BackendOpt,
    DeviceOpt,
    JsonOpt,
    PrecisionOpt,
    console,
    emit_json,
    err_console,
    takes_layout,
)
from dayzero.cli.option_groups import takes_groups
from dayzero.cli.train_options import (
    CheckpointOptions,
    DataOptions,
    FaultOptions,
    MoEOptions,
    MonitorOptions,
    OptimizerOptions,
    ProxyOptions,
)
from dayzero.specs.layout_options import LayoutOptions


def derived_dimensions(cfg) -> list[str]:
    """A model derived from its own code trains as transformers' module: what applies (refused otherwise)."""
    from dayzero.runtime.parallel.hf_plan import check_derived

    return check_derived(cfg)


@app.command("train")
@takes_layout(seq_default=256)
@takes_groups(proxy=ProxyOptions, data=DataOptions, optimizer=OptimizerOptions, checkpoint=CheckpointOptions,
              faults=FaultOptions, monitor=MonitorOptions, moe=MoEOptions)
def train_cmd(
    model: Annotated[str, typer.Argument(help="Preset name (dayzero models), config.json, or a directory holding "
                                              "one.")],
    layout: LayoutOptions = LayoutOptions(), precision: PrecisionOpt = "bf16",
    plan: Annotated[Optional[Path], typer.Option("--plan", help="Take the layout from a `dayzero plan/predict --json` "
                                                                "file (its best plan), on --nproc ranks.")] = None,
    steps: Annotated[int, typer.Option("--steps", min=1, help="Optimizer steps.")] = 100,
    seed: Annotated[int, typer.Option("--seed", help="Seeds the weights and the data order.")] = 0,
    metrics: Annotated[Optional[Path], typer.Option("--metrics", help="Write one JSON record per step here "
                                                                      "(JSONL).")] = None,
    compute_dtype: Annotated[str, typer.Option("--compute-dtype", help=(
        "bf16 (fp32 master weights and reductions) | fp32 | auto (bf16 on an accelerator, fp32 on CPU, where bf16 "
        "matmuls are slow)."))] = "auto",
    device: DeviceOpt = None, backend: BackendOpt = None,
    nproc: Annotated[Optional[int], typer.Option("--nproc", min=1, help="Spawn this many local ranks with torchrun "
                                                                        "(default 1; ignored under torchrun).")] = None,
    data: DataOptions = DataOptions(),
    proxy: ProxyOptions = ProxyOptions(),
    hf_weights: Annotated[Optional[Path], typer.Option("--hf-weights", help="Start from a Hugging Face safetensors "
                                                                            "checkpoint directory.")] = None,
    optimizer: OptimizerOptions = OptimizerOptions(),
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar (also off when CI=true).")] = False,
    checkpoint: CheckpointOptions = CheckpointOptions(), faults: FaultOptions = FaultOptions(),
    monitor: MonitorOptions = MonitorOptions(), moe: MoEOptions = MoEOptions(),
    skip_memory_check: Annotated[bool, typer.Option("--skip-memory-check", help=(
        "Start even when the planner's peak memory exceeds what this machine has free."))] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help=(
        "Pre-flight: run every check the run makes (flags, config, layout, memory, write paths, checkpoint "
        "directory and resume), print what would run, start nothing, write nothing."))] = False,
    json_out: JsonOpt = False,
) -> None:
    """Train MODEL with a parallel layout on torch.distributed (CPU: gloo; an accelerator: its vendor's backend, see
    docs/devices.md).

    Spawns [bold]--nproc[/bold] local ranks with torchrun, or runs as one rank of an existing torchrun
    job. Writes one JSONL record per step (loss, grad_norm, lr, tokens, step_time_s, tokens_per_s,
    peak_mem_bytes, comm_time_s; MoE runs add moe and expert_loads) and a final end record.

    Example: [bold]dayzero train tiny-llama --tp 2 --pp 2 --dp 2 --nproc 8 --steps 20 --seq 128 --gbs 8 --metrics
    runs/tiny-llama/metrics.jsonl[/bold]

    Checkpoints and faults: [bold]dayzero train tiny-llama --nproc 4 --tp 2 --steps 100 --ckpt-dir runs/tiny-llama/ckpt
    --ckpt-every 10 --max-restarts 2 --async-save[/bold]
    """
    from dayzero.outputs import prepare_output

    if metrics:
        prepare_output(metrics, "--metrics", dry=dry_run)
    from dayzero.runtime.config import TrainConfig
    from dayzero.runtime.device import compute_dtype as default_dtype
    from dayzero.runtime.device import resolve
    from dayzero.runtime.parallel.hf_stages import proxy_layer_split
    from dayzero.runtime.preflight import preflight_train
    from dayzero.runtime.train_entry import launch_world

    acc = resolve(device, backend)
    torchrun, world = launch_world(nproc)
    quiet = quiet or json_out or os.environ.get("CI", "").lower() in ("1", "true", "yes")
    metrics, tmp = _metrics_path(metrics, json_out and not dry_run)
    cfg = TrainConfig(model=proxy.section(model, hf_weights),
                      parallel=layout.resolve(world, precision, plan, fill_pipeline=True),
                      optimizer=optimizer.section(), moe=moe.section(),
                      checkpoint=checkpoint.section(_checkpoint_every(checkpoint, plan)), faults=faults.section(),
                      monitor=monitor.section(bool(faults.on_alert)), steps=steps, seed=seed,
                      compute_dtype=default_dtype(acc, compute_dtype), data=data.data,
                      reset_attention_mask=data.reset_attention_mask, metrics=str(metrics) if metrics else None,
                      quiet=quiet)
    cfg, split_note = proxy_layer_split(cfg)
    parallel = cfg.parallel
    # everything checkable is checked here, before any rank starts: one line, exit 2, no hung ranks
    pre = preflight_train(cfg, world, cpu=acc.is_cpu, torchrun=torchrun, skip_memory_check=skip_memory_check,
                          dry=dry_run)
    applies = derived_dimensions(cfg) if pre.spec.extra.get("derived") else None
    notes = [n for n in (layout.gbs_note(parallel), split_note) if n]
    if dry_run:  # --dry-run: what would run, and nothing started
        _print_dry_run(pre, notes, json_out)
        return
    _announce(pre.spec, parallel, notes, world, torchrun, applies, quiet or json_out)
    _run_and_report(acc, cfg, world, torchrun, applies, json_out, tmp)


def _run_and_report(acc, cfg, world: int, torchrun: bool, applies, json_out: bool, tmp) -> None:
    """Train the ranks, then (rank 0) the result; the temporary metrics directory removed."""
    _run_ranks(acc, cfg, world, torchrun)
    if not torchrun or os.environ.get("RANK") == "0":
        _print_result(cfg, world, applies, json_out)
    if tmp is not None:
        tmp.cleanup()
    sys.stdout.flush()


def _run_ranks(acc, cfg, world: int, torchrun: bool) -> None:
    """Train on ``world`` ranks with the accelerator's environment exported; a failed run exits with
    its code (runtime.train_entry.run_train)."""
    from dayzero.runtime.train_entry import run_train

    with acc.exported():
        code = run_train(cfg, world, torchrun)
    if code:
        raise typer.Exit(code)


def _metrics_path(metrics: Path | None, temporary: bool) -> tuple[Path | None, object]:
    """--metrics, else (``temporary``: --json, which reads the steps back) a file in a temporary
    directory, returned too so it is removed after the run."""
    if metrics is not None or not temporary:
        return metrics, None
    tmp = tempfile.TemporaryDirectory(prefix="dayzero-train-")
    return Path(tmp.name) / "metrics.jsonl", tmp


def _checkpoint_every(checkpoint: CheckpointOptions, plan: Path | None) -> int:
    """Steps between saves: --ckpt-every, else the interval --plan derived (with --ckpt-dir, said on
    stderr), else 0 (only at the end)."""
    if checkpoint.ckpt_every is not None:
        return checkpoint.ckpt_every
    from dayzero.specs.plan_layout import plan_interval

    derived = plan_interval(plan) if plan and checkpoint.ckpt_dir else None
    if derived:
        err_console.print(f"dayzero: checkpoint every {derived[0]:,} steps, the plan's interval: {derived[1]}",
                          highlight=False, markup=False)
    return derived[0] if derived else 0


def _print_dry_run(pre, notes: list[str], json_out: bool) -> None:
    """--dry-run: what would run (runtime.preflight.Preflight), as JSON or lines."""
    if json_out:
        emit_json(pre.to_dict(notes))
    else:
        console.print("\n".join(pre.lines(notes)), highlight=False, markup=False, soft_wrap=True)


def _announce(spec, parallel, notes: list[str], world: int, torchrun: bool, applies, quiet: bool) -> None:
    """The lines before the ranks start (not under torchrun, where every rank would print them): the
    layout's notes (the global batch, a proxy's stage split), what the proxy kept beyond the flags,
    the layout and tokens per step, and what applies to a model trained as transformers' own module."""
    if torchrun:
        return
    for note in notes:
        err_console.print(f"dayzero: {note}", highlight=False)
    for note in spec.extra.get("proxy_notes", ()):
        err_console.print(f"{spec.name}: {note}", highlight=False, soft_wrap=True)
    if not quiet:
        console.print(f"[bold]{spec.name}[/bold]: {parallel.describe()} on {world} rank(s); "
                      f"{parallel.gbs * parallel.seq:,} tokens per step ({parallel.gbs} x {parallel.seq}), "
                      f"{parallel.microbatches} micro-batch(es) of {parallel.mbs} per data-parallel "
                      "rank", highlight=False)
    if applies and not quiet:
        err_console.print(f"{spec.name}: trained as transformers' own module (derived from its own code); "
                          + "; ".join(applies), highlight=False, soft_wrap=True)


def _print_result(cfg, world: int, applies, json_out: bool) -> None:
    """After the run (rank 0): the config, end record and steps as JSON, or the next steps (none for a
    model derived from its own code, which validate refuses)."""
    if json_out:
        from dayzero.runtime.metrics import read_metrics

        steps_out, end = read_metrics(cfg.metrics)
        emit_json({"config": cfg.to_dict(), "end": end, "steps": steps_out,
                   **({"derived_dimensions": applies} if applies else {})})
    elif not applies:
        from dayzero.cli.next_steps import after_train, print_next

        print_next(console, after_train(cfg, world))
