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
from dayzero.runtime.checkpoint.manifest import CHECKSUMS, DEFAULT_CHECKSUM
from dayzero.specs.layout_options import LayoutOptions


def derived_dimensions(cfg) -> list[str]:
    """A model derived from its own code trains as transformers' module: what applies (refused otherwise)."""
    from dayzero.runtime.parallel.hf_plan import check_derived

    return check_derived(cfg)


@app.command("train")
@takes_layout(seq_default=256)
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
    compute_dtype: Annotated[str, typer.Option("--compute-dtype", help="bf16 (fp32 master weights and reductions) | "
                                                                       "fp32 | auto (bf16 on an accelerator, fp32 on "
                                                                       "CPU, where bf16 matmuls are slow).")] = "auto",
    device: DeviceOpt = None, backend: BackendOpt = None,
    nproc: Annotated[Optional[int], typer.Option("--nproc", min=1, help="Spawn this many local ranks with torchrun "
                                                                        "(default 1; ignored under torchrun).")] = None,
    data: Annotated[Optional[str], typer.Option("--data", help="Text file, directory or glob (default: the built-in "
                                                               "corpus).")] = None,
    layers: Annotated[Optional[int], typer.Option("--layers", min=1, help="Proxy: shrink to this many layers.")] = None,
    hidden: Annotated[Optional[int], typer.Option("--hidden", min=8, help="Proxy: shrink to this width (heads scale "
                                                                          "along).")] = None,
    experts: Annotated[Optional[int], typer.Option("--experts", min=1, help="Proxy: shrink to this many routed "
                                                                            "experts.")] = None,
    vocab: Annotated[Optional[int], typer.Option("--vocab", min=257, help="Proxy: shrink the vocabulary (>= 257 for "
                                                                          "the byte tokenizer).")] = None,
    hf_weights: Annotated[Optional[Path], typer.Option("--hf-weights", help="Start from a Hugging Face safetensors "
                                                                            "checkpoint directory.")] = None,
    lr: Annotated[float, typer.Option("--lr", help="Peak learning rate (AdamW).")] = 1e-3,
    warmup: Annotated[Optional[int], typer.Option("--warmup", min=0, help="Warmup steps (default 10 % of --steps, at "
                                                                          "most 100).")] = None,
    grad_clip: Annotated[float, typer.Option("--grad-clip", help="Clip the global gradient norm to this (0: "
                                                                 "off).")] = 1.0,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar (also off when CI=true).")] = False,
    ckpt_dir: Annotated[Optional[Path], typer.Option("--ckpt-dir", help="Checkpoint directory: resume from its newest "
                                                                        "good version, save into it.")] = None,
    ckpt_every: Annotated[Optional[int], typer.Option(
        "--ckpt-every", min=0, help="Save every N steps (0: only at the end; default: the interval --plan derived, "
                                    "else 0).")] = None,
    keep: Annotated[int, typer.Option("--keep", min=1, help="Complete checkpoints of this run's lineage to keep (the "
                                                            "newest is never deleted).")] = 3,
    prune_other_lineages: Annotated[bool, typer.Option("--ckpt-prune-other-lineages", help="Let retention also delete "
                                                                                           "the versions of other "
                                                                                           "lineages (runs or "
                                                                                           "branches) in "
                                                                                           "--ckpt-dir.")] = False,
    resume: Annotated[str, typer.Option("--resume", help="auto (most recently written good version) | never | a step "
                                                         "(an older one starts a branch) | a version "
                                                         "directory.")] = "auto",
    async_save: Annotated[bool, typer.Option("--async-save", help="Write checkpoints in the background (only the copy "
                                                                  "to CPU memory blocks).")] = False,
    ckpt_checksum: Annotated[str, typer.Option("--ckpt-checksum", help="Per-file checksum in checkpoint manifests: "
                                                                       f"{' | '.join(CHECKSUMS)}.")] = DEFAULT_CHECKSUM,
    max_restarts: Annotated[int, typer.Option("--max-restarts", min=0, help="Restart all ranks this often after a "
                                                                            "failure (with --nproc; under torchrun "
                                                                            "use its own flag).")] = 0,
    inject_fault: Annotated[Optional[list[str]], typer.Option(
        "--inject-fault", help="Drill: step=N,rank=R,kind=kill|exception|hang|straggler[,sleep=S][,at=step|save]"
                               "[,attempt=A] (repeatable; straggler: sleep S s every step from N on).")] = None,
    watchdog: Annotated[float, typer.Option("--watchdog", min=0, help="Abort a rank with no finished step for this "
                                                                      "many seconds, so torchrun restarts (0: "
                                                                      "off).")] = 0.0,
    save_timeout: Annotated[Optional[float], typer.Option("--save-timeout", help="Watchdog budget in seconds for one "
                                                                                 "checkpoint save (async: until "
                                                                                 "committed), resume or rollback; a "
                                                                                 "longer one is a hang (default 600 "
                                                                                 "with --watchdog; alone: only "
                                                                                 "checkpoint I/O is timed).")] = None,
    on_bad_loss: Annotated[Optional[str], typer.Option("--on-bad-loss", help="On a NaN/Inf loss or a spike: skip "
                                                                             "(drop the step) | rollback (reload the "
                                                                             "last checkpoint, skip the "
                                                                             "batch).")] = None,
    spike_factor: Annotated[float, typer.Option("--spike-factor", min=0, help="With --on-bad-loss: a loss above this "
                                                                              "x the running mean is a spike (0: "
                                                                              "NaN/Inf only).")] = 0.0,
    on_alert: Annotated[Optional[list[str]], typer.Option(
        "--on-alert", help="NAME=log|checkpoint|restart|exclude: act on an in-process alert (repeatable; "
                           "all=ACTION for the rest; default log). restart/exclude save a checkpoint and relaunch, "
                           "exclude without the offending ranks (docs/runtime.md).")] = None,
    spares: Annotated[int, typer.Option("--spares", min=0, help="With --nproc: keep this many more local ranks idle "
                                                                "to replace excluded ones.")] = 0,
    on_rank_failure: Annotated[str, typer.Option("--on-rank-failure", help="restart (default) | exclude: restart "
                                                                           "without a rank that crashed or was "
                                                                           "killed on its own (with --nproc, "
                                                                           "--max-restarts, --ckpt-dir).")] = "restart",
    metrics_port: Annotated[Optional[int], typer.Option("--metrics-port", min=1, max=65535, help="Serve Prometheus "
                                                        "metrics: rank r on PORT + its local rank (or rank 0 alone "
                                                        "with --metrics-aggregate).")] = None,
    metrics_aggregate: Annotated[bool, typer.Option("--metrics-aggregate", help="Rank 0 serves every rank's "
                                                                                "series on --metrics-port.")] = False,
    metrics_linger: Annotated[float, typer.Option("--metrics-linger", min=0, help="Keep serving metrics this many "
                                                                                  "seconds after the last "
                                                                                  "step.")] = 0.0,
    metrics_job: Annotated[Optional[str], typer.Option("--metrics-job", help="The job label of every series "
                                                                             "(default: the model's name).")] = None,
    peak_tflops: Annotated[Optional[float], typer.Option("--peak-tflops", min=0, help="Device peak TFLOP/s, for the "
                                                                                      "exported MFU.")] = None,
    alerts: Annotated[bool, typer.Option("--alerts", help="Evaluate the alert rules in process each step and log "
                                                          "alert events (dayzero monitor --rules lists "
                                                          "them).")] = False,
    alert_threshold: Annotated[Optional[list[str]], typer.Option(
        "--alert-threshold", help="KEY=VALUE override of an alert threshold, e.g. straggler_ratio=0.3 "
                                  "(repeatable).")] = None,
    moe_bias_rate: Annotated[float, typer.Option("--moe-bias-rate", min=0, help="MoE: auxiliary-loss-free balancing "
                                                                            "bias update speed gamma for routers with "
                                                                            "a score-correction bias (DeepSeek-V3: "
                                                                            "0.001; 0: off).")] = 1e-3,
    moe_aux_loss: Annotated[str, typer.Option("--moe-aux-loss", help="MoE balance loss: model (the model config's) | "
                                                                     "none | seq (DeepSeek-V3 sequence-wise) | global "
                                                                     "(global-batch) | micro (Switch, per "
                                                                     "micro-batch).")] = "model",
    moe_aux_coef: Annotated[Optional[float], typer.Option("--moe-aux-coef", min=0, help="MoE balance loss coefficient "
                                                                                        "(default: DeepSeek-V3's alpha "
                                                                                        "1e-4; with 'model' the "
                                                                                        "config's).")] = None,
    moe_z_loss: Annotated[float, typer.Option("--moe-z-loss", min=0, help="MoE router z-loss coefficient (ST-MoE "
                                                                          "recommends 1e-3; 0: off).")] = 0.0,
    moe_capacity_factor: Annotated[Optional[float], typer.Option("--moe-capacity-factor", help="MoE: drop routed slots "
                                                                                               "beyond this x the even "
                                                                                               "share per expert "
                                                                                               "(default: "
                                                                                               "dropless).")] = None,
    moe_loads_every: Annotated[int, typer.Option("--moe-loads-every", min=1, help="MoE: write the full per-expert load "
                                                                                  "vector to the metrics every N steps "
                                                                                  "(and on the last).")] = 10,
    placement: Annotated[Optional[str], typer.Option("--placement", help="MoE: expert placement file (`dayzero moe "
                                                                          "place --out`): slots per EP rank, hot "
                                                                          "experts replicated.")] = None,
    skip_memory_check: Annotated[bool, typer.Option("--skip-memory-check", help="Start even when the planner's peak "
                                                                                "memory exceeds what this machine has "
                                                                                "free.")] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Pre-flight: run every check the run makes (flags, config, "
                                                        "layout, memory, write paths, checkpoint directory and "
                                                        "resume), print what would run, start nothing, write "
                                                        "nothing.")] = False,
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
    from dayzero.monitor.rules import threshold_overrides
    from dayzero.runtime.config import (
        CheckpointSection,
        FaultSection,
        ModelSection,
        MoESection,
        MonitorSection,
        OptimizerSection,
        TrainConfig,
    )
    from dayzero.runtime.device import compute_dtype as default_dtype
    from dayzero.runtime.device import resolve
    from dayzero.runtime.train_entry import launch_world, run_train

    acc = resolve(device, backend)
    compute_dtype = default_dtype(acc, compute_dtype)
    torchrun, world = launch_world(nproc)
    parallel = layout.resolve(world, precision, plan, fill_pipeline=True)
    if ckpt_every is None:
        from dayzero.specs.plan_layout import plan_interval

        derived = plan_interval(plan) if plan and ckpt_dir else None
        ckpt_every = derived[0] if derived else 0
        if derived:
            err_console.print(f"dayzero: checkpoint every {derived[0]:,} steps, the plan's interval: {derived[1]}",
                              highlight=False, markup=False)
    quiet = quiet or json_out or os.environ.get("CI", "").lower() in ("1", "true", "yes")
    tmp = None
    if metrics is None and json_out and not dry_run:
        tmp = tempfile.TemporaryDirectory(prefix="dayzero-train-")
        metrics = Path(tmp.name) / "metrics.jsonl"
    cfg = TrainConfig(
        model=ModelSection(model, layers=layers, hidden=hidden, experts=experts, vocab=vocab,
                           hf_weights=str(hf_weights) if hf_weights else None),
        parallel=parallel,
        optimizer=OptimizerSection(lr=lr, warmup=warmup, grad_clip=grad_clip),
        moe=MoESection(bias_rate=moe_bias_rate, aux_loss=moe_aux_loss, aux_coef=moe_aux_coef, z_loss=moe_z_loss,
                       capacity_factor=moe_capacity_factor, loads_every=moe_loads_every,
                       placement=str(placement) if placement else None),
        checkpoint=CheckpointSection(dir=str(ckpt_dir) if ckpt_dir else None, every=ckpt_every, keep=keep,
                                     prune_other_lineages=prune_other_lineages, resume=resume, async_save=async_save,
                                     checksum=ckpt_checksum),
        faults=FaultSection(max_restarts=max_restarts, inject_faults=tuple(inject_fault or ()), watchdog=watchdog,
                            save_timeout=save_timeout, on_bad_loss=on_bad_loss, spike_factor=spike_factor,
                            on_alert=tuple(on_alert or ()), spares=spares, on_rank_failure=on_rank_failure),
        monitor=MonitorSection(port=metrics_port, aggregate=metrics_aggregate, alerts=alerts or bool(on_alert),
                               thresholds=threshold_overrides(alert_threshold or []),
                               linger_s=metrics_linger, job=metrics_job, peak_tflops=peak_tflops),
        steps=steps, seed=seed, compute_dtype=compute_dtype, data=data, metrics=str(metrics) if metrics else None,
        quiet=quiet)
    # everything checkable is checked here, before any rank starts: one line, exit 2, no hung ranks
    from dayzero.runtime.preflight import preflight_train

    pre = preflight_train(cfg, world, cpu=acc.is_cpu, torchrun=torchrun, skip_memory_check=skip_memory_check,
                          dry=dry_run)
    spec = pre.spec
    applies = derived_dimensions(cfg) if spec.extra.get("derived") else None
    if dry_run:  # --dry-run: what would run, and nothing started
        notes = [n for n in (layout.gbs_note(parallel),) if n]
        if json_out:
            emit_json(pre.to_dict(notes))
        else:
            console.print("\n".join(pre.lines(notes)), highlight=False, markup=False, soft_wrap=True)
        return
    if (note := layout.gbs_note(parallel)) and not torchrun:
        err_console.print(f"dayzero: {note}", highlight=False)
    for note in spec.extra.get("proxy_notes", ()) if not torchrun else ():  # what the proxy kept beyond the flags
        err_console.print(f"{spec.name}: {note}", highlight=False, soft_wrap=True)
    if not torchrun and not quiet and not json_out:
        console.print(f"[bold]{spec.name}[/bold]: {parallel.describe()} on {world} rank(s); "
                      f"{parallel.gbs * parallel.seq:,} tokens per step ({parallel.gbs} x {parallel.seq}), "
                      f"{parallel.microbatches} micro-batch(es) of {parallel.mbs} per data-parallel "
                      "rank", highlight=False)
    if applies and not torchrun and not quiet and not json_out:
        err_console.print(f"{spec.name}: trained as transformers' own module (derived from its own code); "
                          + "; ".join(applies), highlight=False, soft_wrap=True)

    with acc.exported():
        code = run_train(cfg, world, torchrun)
    if code:
        raise typer.Exit(code)
    if json_out and (not torchrun or os.environ.get("RANK") == "0"):
        from dayzero.runtime.metrics import read_metrics

        steps_out, end = read_metrics(cfg.metrics)
        emit_json({"config": cfg.to_dict(), "end": end, "steps": steps_out,
                   **({"derived_dimensions": applies} if applies else {})})
    if not json_out and not applies and (not torchrun or os.environ.get("RANK") == "0"):  # validate refuses derived
        from dayzero.cli.next_steps import after_train, print_next

        print_next(console, after_train(cfg, world))
    if tmp is not None:
        tmp.cleanup()
    sys.stdout.flush()
