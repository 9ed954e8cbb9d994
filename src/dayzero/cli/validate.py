"""``dayzero validate``: run a plan on the runtime at proxy scale, compare with the prediction,
judge it by the Day-0 targets, and calibrate the planner to this machine."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer

from dayzero.cli.app import app
from dayzero.cli.common import (BackendOpt, ClusterOpt, DeviceOpt, CpOpt, DpOpt, EpOpt, EtpOpt, GbsOpt, JsonOpt, MbsOpt, PpOpt, RecomputeOpt,
                                ScheduleOpt, SplitOpt, SpOpt, TpOpt, VppOpt, ZeroOpt, console, emit_json,
                                parallel_from_options)
from dayzero.cli.next_steps import Step, layout_flags, print_next
from dayzero.cli.render import FitTable


@app.command("validate")
def validate_cmd(
    model: Annotated[Optional[str], typer.Argument(help="Preset name, config.json or directory (omit with --calibrate --runs).")] = None,
    plan: Annotated[Optional[Path], typer.Option("--plan", help="Take the layout from a `dayzero plan/predict --json` file (its best plan).")] = None,
    tp: TpOpt = 1, pp: PpOpt = 1, dp: DpOpt = None, cp: CpOpt = 1, ep: EpOpt = 1, etp: EtpOpt = 1, vpp: VppOpt = 1,
    mbs: MbsOpt = 1, gbs: GbsOpt = None,
    seq: Annotated[int, typer.Option("--seq", help="Sequence length of the proxy run (tokens).")] = 256,
    zero: ZeroOpt = 1, recompute: RecomputeOpt = "none", sequence_parallel: SpOpt = False,
    schedule: ScheduleOpt = None, layer_split: SplitOpt = None,
    steps: Annotated[int, typer.Option("--steps", min=4, help="Optimizer steps (the first is not timed).")] = 12,
    nproc: Annotated[int, typer.Option("--nproc", min=1, help="Local ranks to run on.")] = 1,
    cluster: ClusterOpt = None,
    layers: Annotated[Optional[int], typer.Option("--layers", min=1, help="Proxy: this many layers.")] = None,
    hidden: Annotated[Optional[int], typer.Option("--hidden", min=8, help="Proxy: this width (heads scale along).")] = None,
    experts: Annotated[Optional[int], typer.Option("--experts", min=1, help="Proxy: this many routed experts.")] = None,
    vocab: Annotated[Optional[int], typer.Option("--vocab", min=257, help="Proxy: this vocabulary (>= 257).")] = None,
    compute_dtype: Annotated[str, typer.Option("--compute-dtype", help="bf16 | fp32 | auto (bf16 on an accelerator, fp32 on CPU, as dayzero train).")] = "auto",
    device: DeviceOpt = None, backend: BackendOpt = None,
    lr: Annotated[float, typer.Option("--lr", help="Peak learning rate (AdamW).")] = 1e-3,
    grad_clip: Annotated[float, typer.Option("--grad-clip", help="Gradient-norm clip (0: off).")] = 1.0,
    seed: Annotated[int, typer.Option("--seed", help="Weights and data order.")] = 0,
    tolerance: Annotated[float, typer.Option("--step-tolerance", help="Step-time prediction error that passes.")] = 0.20,
    out: Annotated[Optional[Path], typer.Option("--out", "-o", help="Directory for validation.json and validation.md.")] = None,
    calibrate: Annotated[bool, typer.Option("--calibrate", help="Fit the profile's efficiency constants to the stored runs (this one included) and save them.")] = False,
    runs: Annotated[Optional[list[Path]], typer.Option("--runs", help="With --calibrate: validation.json files to fit on (repeatable).")] = None,
    fit_keys: Annotated[str, typer.Option("--fit-keys", help="With --calibrate: efficiency keys to fit, comma-separated.")] = "gemm_bf16,layer_overhead_s,intra,memory_scale",
    profile_out: Annotated[Optional[Path], typer.Option("--profile-out", help="With --calibrate: write the calibrated profile here (default: update --cluster in place).")] = None,
    strict: Annotated[bool, typer.Option("--strict", help="Exit with code 1 when a target fails (CI gates).")] = False,
    json_out: JsonOpt = False,
) -> None:
    """Run a layout on the runtime at proxy scale (same layout, model shrunk to fit this machine), measure MFU, peak memory per rank, communication ratio (profiler), step time and the loss trend (Mann-Kendall + Theil-Sen), and print the targets table: target, measured, predicted, prediction error, pass. Writes validation.json and validation.md with --out.

    Example: [bold]dayzero calibrate --nproc 8 --out runs/host.yaml; dayzero validate tiny-llama --cluster runs/host.yaml --nproc 8 --tp 2 --pp 2 --gbs 16 --mbs 2 --steps 12 --out runs/validate/a[/bold]

    Calibrate: [bold]dayzero validate --calibrate --cluster runs/host.yaml --runs runs/validate/a/validation.json --runs runs/validate/b/validation.json[/bold]
    """
    from dayzero.errors import ConfigError

    keys = tuple(k.strip() for k in fit_keys.split(",") if k.strip())
    if model is None:
        if not calibrate:
            raise ConfigError("MODEL", None, "give a model to validate (or --calibrate --runs FILE... to fit stored runs)")
        result = {"calibration": _calibrate(cluster, [], runs or [], keys, profile_out)}
        _finish(result, out, json_out, strict, cluster, runs or [])
        return
    if runs and not calibrate:
        raise ConfigError("--runs", None, "only applies with --calibrate")
    from dayzero.cli.common import require_runtime_family
    from dayzero.specs.registry import load_model

    require_runtime_family(load_model(model), "validate")
    from dayzero.validate.run import ValidationRequest, local_cluster, proxy_shrink, validate

    from dayzero.runtime.device import resolve

    acc = resolve(device, backend)
    dtype = _compute_dtype(compute_dtype, acc)
    cl = _cluster(cluster, nproc, acc)
    if plan:
        from dayzero.specs.plan_layout import plan_layout

        par = plan_layout(plan, nproc, seq, gbs)
    else:
        par = parallel_from_options(nproc, tp, pp, dp, cp, ep, etp, vpp, mbs, gbs, seq, zero, recompute,
                                    sequence_parallel, "bf16", schedule, layer_split)
    from dayzero.specs.registry import load_model

    shrink = proxy_shrink(load_model(model), par, dict(layers=layers, hidden=hidden, experts=experts, vocab=vocab),
                          local_cluster(cl, nproc).memory_bytes)
    req = ValidationRequest(model=model, parallel=par, steps=steps, shrink=shrink, compute_dtype=dtype, seed=seed,
                            lr=lr, grad_clip=grad_clip)
    if not json_out:
        console.print(f"[bold]{req.spec().name}[/bold] ({', '.join(f'{k} {v}' for k, v in shrink.items()) or 'full size'}): "
                      f"{par.describe()} on {nproc} rank(s), {steps} steps in {dtype}; profile {cl.name}", highlight=False)
    with acc.exported():
        result = validate(req, cl, nproc, tolerance)
    if calibrate:
        result["calibration"] = _calibrate(cluster, [result["record"]], runs or [], keys, profile_out)
    _finish(result, out, json_out, strict, cluster, runs or [])


def _compute_dtype(value: str, acc) -> str:
    from dayzero.errors import ConfigError

    if value not in ("bf16", "fp32", "auto"):
        raise ConfigError("--compute-dtype", None, f"must be bf16, fp32 or auto, got {value!r}")
    if value == "auto":
        from dayzero.runtime.device import compute_dtype

        return compute_dtype(acc)
    return value


def _cluster(path: str | None, nproc: int, acc):
    """The profile to predict with: --cluster, or on an accelerator the catalog entry of its name."""
    from dayzero.errors import ConfigError
    from dayzero.specs.cluster import build_cluster, get_cluster

    if path:
        return get_cluster(path)
    if not acc.is_cpu:
        import torch

        from dayzero.runtime.device import device_name
        from dayzero.specs.hardware import resolve_accelerator

        entry = resolve_accelerator(device_name(torch.device(acc.type, 0)))
        if entry is not None:
            return build_cluster(entry, nproc, nproc)
    raise ConfigError("--cluster", None, f"no hardware profile for this machine; run `dayzero calibrate --nproc {nproc} "
                      "--out host.yaml` and pass --cluster host.yaml")


def _calibrate(cluster_path: str | None, records: list[dict], run_files: list[Path], keys, profile_out: Path | None) -> dict:
    from dayzero.errors import ConfigError
    from dayzero.validate.calibration_store import calibrate_profile

    if not cluster_path or not Path(cluster_path).exists():
        raise ConfigError("--cluster", None, "--calibrate updates a profile file: pass --cluster FILE.yaml "
                          "(from dayzero calibrate)")
    for f in run_files:
        try:
            obj = json.loads(Path(f).read_text())
        except (OSError, ValueError) as e:
            raise ConfigError(str(f), None, f"cannot read a validation result: {str(e).splitlines()[0]}") from None
        if "record" not in obj:
            raise ConfigError(str(f), "record", "not a dayzero validate result (no 'record')")
        records.append(obj["record"])
    return calibrate_profile(cluster_path, records, keys, profile_out)


def _finish(result: dict, out: Path | None, json_out: bool, strict: bool = False, cluster: str | None = None,
            runs: list[Path] | None = None) -> None:
    from dayzero.report.validation import write_report

    paths = write_report(result, out) if out else None
    if json_out:
        emit_json(result)
    else:
        print_result(result)
        if paths:
            console.print(f"wrote {paths[0]} and {paths[1]}")
        print_next(console, _next(result, paths[0] if paths else None, cluster, runs or []))
    if strict and result.get("summary") and not result["summary"]["all_pass"]:
        raise typer.Exit(1)


def _rerun(record: dict, cluster: str, ranks: int) -> list[str]:
    """``dayzero validate`` of a stored run: its model, proxy shrink and layout."""
    shrink = [w for k, v in (record.get("shrink") or {}).items() if v is not None for w in (f"--{k}", str(v))]
    return ["dayzero", "validate", record["model"], *shrink, "--cluster", cluster, "--nproc", str(ranks),
            *layout_flags(record["parallel"], precision=False)]


def _next(result: dict, written: Path | None, cluster: str | None, runs: list[Path]) -> list[Step]:
    """After a run: fit the profile to it. After a fit: a run with the fitted profile."""
    cal = result.get("calibration")
    if cal:
        record = result.get("record")
        if record is None and runs:
            record = json.loads(Path(runs[-1]).read_text())["record"]
        ranks = result.get("run", {}).get("ranks") or record["parallel"]["world"]
        return [Step.of(*_rerun(record, cal["profile"], ranks), why="the fitted profile against a new run")]
    run = result["run"]
    if not cluster or not Path(cluster).exists():
        return [Step.of("dayzero", "calibrate", "--nproc", run["ranks"], "--out", "runs/host.yaml",
                        why="a profile of this machine, to calibrate against runs")]
    if written:
        return [Step.of("dayzero", "validate", "--calibrate", "--cluster", cluster, "--runs", written,
                        why="fit the profile's constants to this run")]
    return [Step.of(*_rerun(result["record"], cluster, run["ranks"]), "--calibrate", "--out",
                    f"runs/validate/{run['model']}", why="run again, keep it, fit the profile to it")]


def print_result(result: dict) -> None:
    if "checks" in result:
        t = FitTable(title="Day-0 targets", compact=True)
        for col in ("metric", "target", "measured", "predicted", "error", "pass"):
            t.add_column(col, num=col not in ("metric", "target"))
        for c in result["checks"]:
            unit = c.get("unit", "")
            fmt = (lambda x: "—" if x is None else (f"{x:.1%}" if unit == "fraction" else
                                                   f"{x:+.1%}" if unit == "relative change" else f"{x:.3g} s"))
            err = "—" if c["rel_error"] is None else f"{c['rel_error']:+.0%}"
            t.add_row(c["metric"], c["target"], fmt(c["measured"]), fmt(c["predicted"]), err,
                      "[green]pass[/green]" if c["pass"] else "[red]fail[/red]")
        console.print(t)
        for c in result["checks"]:
            if c["metric"] in ("loss_trend", "peak_memory"):
                console.print(f"  {c['metric']}: {c['detail']}", highlight=False)
    cal = result.get("calibration")
    if cal:
        b, a = cal["before"], cal["after"]
        console.print(f"calibration on {cal['runs']} run(s), fitted {', '.join(cal['keys'])}: median |error| "
                      f"{b['median_abs_rel_error']:.1%} -> {a['median_abs_rel_error']:.1%}, MAPE {b['mape']:.1%} -> "
                      f"{a['mape']:.1%}; saved to {cal['profile']}", highlight=False)
        mem = cal.get("memory")
        if mem:
            console.print(f"memory: runtime context {mem['runtime_context_bytes_before'] / 2**20:,.0f} -> "
                          f"{mem['runtime_context_bytes_after'] / 2**20:,.0f} MiB; median |error| "
                          f"{mem['before']['median_abs_rel_error']:.1%} -> {mem['after']['median_abs_rel_error']:.1%}",
                          highlight=False)
