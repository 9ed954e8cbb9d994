"""``dayzero validate``: run a plan on the runtime at proxy scale, compare with the prediction,
judge it by the Day-0 targets, and calibrate the planner to this machine."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from dayzero.cli.app import app
from dayzero.cli.common import BackendOpt, ClusterOpt, DeviceOpt, JsonOpt, console, emit_json, err_console, takes_layout
from dayzero.cli.next_steps import Step, layout_flags, print_next
from dayzero.cli.option_groups import takes_groups
from dayzero.cli.render import FitTable, pass_fail
from dayzero.cli.train_options import DataOptions
from dayzero.cli.validate_options import CalibrationOptions, ProxySize
from dayzero.specs.layout_options import LayoutOptions


@app.command("validate")
@takes_layout(seq_default=256, seq_help="Sequence length of the proxy run (tokens).")
@takes_groups(proxy=ProxySize, data=DataOptions, calibration=CalibrationOptions)
def validate_cmd(
    model: Annotated[Optional[str], typer.Argument(help="Preset name, config.json or directory (omit with --calibrate "
                                                        "--runs).")] = None,
    plan: Annotated[Optional[Path], typer.Option("--plan", help="Take the layout from a `dayzero plan/predict --json` "
                                                                "file (its best plan).")] = None,
    layout: LayoutOptions = LayoutOptions(),
    steps: Annotated[int, typer.Option("--steps", min=4, help="Optimizer steps (the first is not timed).")] = 12,
    nproc: Annotated[int, typer.Option("--nproc", min=1, help="Local ranks to run on.")] = 1,
    cluster: ClusterOpt = None,
    proxy: ProxySize = ProxySize(),
    compute_dtype: Annotated[str, typer.Option("--compute-dtype", help="bf16 | fp32 | auto (bf16 on an accelerator, "
                                                                       "fp32 on CPU, as dayzero train).")] = "auto",
    device: DeviceOpt = None, backend: BackendOpt = None,
    lr: Annotated[float, typer.Option("--lr", help="Peak learning rate (AdamW).")] = 1e-3,
    grad_clip: Annotated[float, typer.Option("--grad-clip", help="Gradient-norm clip (0: off).")] = 1.0,
    seed: Annotated[int, typer.Option("--seed", help="Weights and data order.")] = 0,
    data: DataOptions = DataOptions(),
    tolerance: Annotated[float, typer.Option("--step-tolerance", help="Step-time prediction error that "
                                                                      "passes.")] = 0.20,
    out: Annotated[Optional[Path], typer.Option("--out", "-o", help="Directory for validation.json and "
                                                                    "validation.md.")] = None,
    calibration: CalibrationOptions = CalibrationOptions(),
    strict: Annotated[bool, typer.Option("--strict", help="Exit with code 1 when a target fails (CI gates).")] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Pre-flight: run every check the run makes (flags, layout, "
                                                        "proxy, memory, write paths, calibration inputs), print what "
                                                        "would run, start nothing, write nothing.")] = False,
    json_out: JsonOpt = False,
) -> None:
    """Run a layout on the runtime at proxy scale (same layout, model shrunk to fit this machine), measure MFU, peak
    memory per rank, communication ratio (profiler), step time and the loss trend (Mann-Kendall + Theil-Sen), and print
    the targets table: target, measured, predicted, prediction error, pass. Writes validation.json and validation.md
    with --out.

    Example: [bold]dayzero calibrate --nproc 8 --out runs/host.yaml; dayzero validate tiny-llama --cluster
    runs/host.yaml --nproc 8 --tp 2 --pp 2 --gbs 16 --mbs 2 --steps 12 --out runs/validate/a[/bold]

    Calibrate: [bold]dayzero validate --calibrate --cluster runs/host.yaml --runs runs/validate/a/validation.json --runs
    runs/validate/b/validation.json[/bold]
    """
    _prepare_outputs(out, calibration.profile_out, dry_run)
    from dayzero.errors import ConfigError
    from dayzero.validate.calibration_store import calibrate_from_files, calibration_inputs

    cal, keys, runs = calibration, calibration.keys(), calibration.runs or []
    if model is None:
        _calibrate_stored(cluster, cal, out, json_out, strict, dry_run)
        return
    if cal.runs and not cal.calibrate:
        raise ConfigError("--runs", None, "only applies with --calibrate")
    from dayzero.runtime.device import compute_dtype as resolve_dtype
    from dayzero.runtime.device import resolve
    from dayzero.validate.run import host_profile

    acc = resolve(device, backend)
    dtype = resolve_dtype(acc, compute_dtype)
    # the profile file (the cached one of this host when none is given) is what --calibrate updates
    cl, cluster = host_profile(cluster, nproc, acc, lambda text: err_console.print(f"dayzero: {text}", highlight=False),
                               measure=not dry_run)
    par = layout.resolve(nproc, plan=plan, fill_pipeline=True)
    req, shrink = _request(model, par, proxy, cl, nproc, steps, dtype, seed, lr, grad_clip, data)
    if not json_out and not dry_run:
        _announce(req, shrink, nproc, cl)
    if note := layout.gbs_note(par):
        from dayzero.runtime.checks import check_runtime

        check_runtime(req.spec(), par, nproc)  # a layout that cannot run is the one line to print
        err_console.print(f"dayzero: {note}", highlight=False)
    if cal.calibrate:  # the fit's inputs, before minutes of work
        calibration_inputs(cluster, runs, keys)
    if dry_run:  # --dry-run: the run's own pre-flight, then stop
        _print_dry_run(req, nproc, cl, cluster, note, cal, json_out)
        return
    from dayzero.validate.run import validate

    with acc.exported():
        result = validate(req, cl, nproc, tolerance)
    if cal.calibrate:
        result["calibration"] = calibrate_from_files(cluster, [result["record"]], runs, keys, cal.profile_out)
    _finish(result, out, json_out, strict, cluster, runs)


def _prepare_outputs(out: Path | None, profile_out: Path | None, dry_run: bool) -> None:
    """Check (and, not dry, make) where --out and --profile-out write, before any work."""
    from dayzero.outputs import prepare_output

    if out:
        prepare_output(out, "--out", "dir", dry=dry_run)
    if profile_out:
        prepare_output(profile_out, "--profile-out", dry=dry_run)


def _announce(req, shrink: dict, nproc: int, cl) -> None:
    """The line before the run: the proxy, its layout, ranks, steps, dtype and profile."""
    par = req.parallel
    console.print(f"[bold]{req.spec().name}[/bold] "
                  f"({', '.join(f'{k} {v}' for k, v in shrink.items()) or 'full size'}): "
                  f"{par.describe()} on {nproc} rank(s), {req.steps} steps in {req.compute_dtype}; profile "
                  f"{cl.name}", highlight=False)


def _request(model: str, par, proxy: ProxySize, cl, nproc: int, steps: int, dtype: str, seed: int, lr: float,
             grad_clip: float, data: DataOptions):
    """(the run validate makes, the proxy's shrink): the model shrunk to fit this machine's memory
    (the profile's, else what can be read unmeasured; validate.run.proxy_shrink) at the sizes asked."""
    from dayzero.runtime.config import ModelSection, OptimizerSection
    from dayzero.specs.registry import load_model
    from dayzero.validate.run import ValidationRequest, local_cluster, proxy_shrink, unmeasured_capacity

    shrink = proxy_shrink(load_model(model), par, proxy.asked(),
                          local_cluster(cl, nproc).memory_bytes if cl else unmeasured_capacity(nproc))
    req = ValidationRequest(model=ModelSection(model, **shrink), parallel=par, steps=steps, compute_dtype=dtype,
                            seed=seed, optimizer=OptimizerSection(lr=lr, grad_clip=grad_clip), data=data.data,
                            reset_attention_mask=data.reset_attention_mask)
    if req.reset_attention_mask:  # what per-document attention cannot run with, before any rank starts
        from dayzero.errors import LayoutError
        from dayzero.runtime.checks import document_problems

        if problems := document_problems(req.spec(), par):
            raise LayoutError("; ".join(problems))
    return req, shrink


def _calibrate_stored(cluster: str | None, cal: CalibrationOptions, out: Path | None, json_out: bool, strict: bool,
                      dry_run: bool) -> None:
    """``validate --calibrate --runs ...`` without a model: fit the profile to the stored runs (with
    --dry-run: the fit's inputs, nothing fitted or written)."""
    from dayzero.errors import ConfigError
    from dayzero.validate.calibration_store import calibrate_from_files, calibration_inputs

    keys, runs = cal.keys(), cal.runs or []
    if not cal.calibrate:
        raise ConfigError("MODEL", None, "give a model to validate (or --calibrate --runs FILE... to fit stored "
                                         "runs)")
    if dry_run:
        found = calibration_inputs(cluster, runs, keys)
        _checked({"ok": True, "calibration": {"profile": cluster, "runs": len(found), "keys": list(keys)}},
                 [f"calibration: would fit {', '.join(keys)} on {len(found)} stored run(s) and save them to "
                  f"{cal.profile_out or cluster}"], json_out)
        return
    result = {"calibration": calibrate_from_files(cluster, [], runs, keys, cal.profile_out)}
    _finish(result, out, json_out, strict, cluster, runs)


def _print_dry_run(req, nproc: int, cl, cluster: str | None, note: str | None, cal: CalibrationOptions,
                   json_out: bool) -> None:
    """--dry-run: the run's own pre-flight (validate.preflight), the profile it would use or measure
    first, and the fit that would follow with --calibrate."""
    from dayzero.validate.preflight import preflight_validate

    pre = preflight_validate(req, nproc)
    profile = {"name": cl.name if cl else None, "file": cluster, "measured_first": cl is None}
    text = (f"{cl.name}" + (f" ({cluster})" if cluster and cluster != cl.name else "") if cl else
            f"none cached for this host: the run measures one first (about a minute) into {cluster}")
    lines = pre.lines(text, [note] if note else [])
    if cal.calibrate:
        lines.insert(-1, f"calibration: after the run, fit {', '.join(cal.keys())} and save to "
                         f"{cal.profile_out or cluster}")
    _checked(pre.to_dict(profile, [note] if note else []), lines, json_out)

def _checked(result: dict, lines: list[str], json_out: bool) -> None:
    if json_out:
        emit_json(result)
    else:
        console.print("\n".join(lines), highlight=False, markup=False, soft_wrap=True)


def _finish(result: dict, out: Path | None, json_out: bool, strict: bool = False, cluster: str | None = None,
            runs: list[Path] | None = None) -> None:
    from dayzero.report.validation import write_report

    paths = write_report(result, out) if out else None
    if json_out:
        emit_json(result)
    else:
        print_result(result)
        run = result.get("run") or {}
        if run.get("derived_from_modeling_code"):  # the spec is the planner's description of transformers' module
            from dayzero.report.validation import share_lines

            console.print(f"{run['model']}: predicted from the spec derived from its own modeling code (proxy "
                          "described on the meta device); the approximations it makes, and how much of each difference "
                          "above they can account for:", highlight=False, soft_wrap=True)
            for a in run.get("approximations") or ["none (every term read from the modules)"]:
                console.print(f"  approximation: {a}", highlight=False, soft_wrap=True)
            for line in share_lines(run):
                console.print(f"  {line}", highlight=False, soft_wrap=True)
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
            from dayzero.inputs import load_json

            record = load_json(runs[-1])["record"]
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
            def fmt(x, unit=unit):
                if x is None:
                    return "—"
                return f"{x:.1%}" if unit == "fraction" else f"{x:+.1%}" if unit == "relative change" else f"{x:.3g} s"

            err = "—" if c["rel_error"] is None else f"{c['rel_error']:+.0%}"
            t.add_row(c["metric"], c["target"], fmt(c["measured"]), fmt(c["predicted"]), err,
                      pass_fail(c["pass"]))
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
