"""``dayzero calibrate``: microbenchmark this machine into a hardware profile (a cluster YAML)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.markup import escape

from dayzero.cli.app import app
from dayzero.cli.common import BackendOpt, DeviceOpt, JsonOpt, console, emit_json
from dayzero.cli.next_steps import Step, print_next
from dayzero.cli.render import FitTable


@app.command("calibrate")
def calibrate_cmd(
    nproc: Annotated[int, typer.Option("--nproc", min=1, help="Ranks to measure with (as many as training will "
                                                              "use).")] = 1,
    out: Annotated[Optional[Path], typer.Option("--out", "-o", help="Write the profile here (YAML; use as --cluster "
                                                                    "FILE).")] = None,
    name: Annotated[Optional[str], typer.Option("--name", help="Profile name (default: host-Nxdevice).")] = None,
    quick: Annotated[bool, typer.Option("--quick", help="Fewer sizes and shorter timings (tests, smoke "
                                                        "checks).")] = False,
    nccl_tests: Annotated[Optional[list[Path]], typer.Option("--import-nccl-tests", help="Import nccl-tests output "
                                                                                         "file(s) instead of "
                                                                                         "measuring (repeat the "
                                                                                         "option per file).")] = None,
    accelerator: Annotated[Optional[str], typer.Option("--accelerator", "-a", help="With --import-nccl-tests: catalog "
                                                                                   "accelerator (default: from the "
                                                                                   "device name).")] = None,
    base: Annotated[Optional[str], typer.Option("--base", help="With --import-nccl-tests: a profile or preset to "
                                                               "extend.")] = None,
    runs: Annotated[Optional[list[Path]], typer.Option("--runs", help="Refit the planner's efficiency constants on "
                                                                     "your own measured runs (CSV files with the "
                                                                     "published-runs columns, or the --metrics "
                                                                     "JSONL of a finished dayzero train run; "
                                                                     "repeatable); --out "
                                                                     "FILE.json is then a --calibration file whose "
                                                                     "band is the runs' leave-one-out error.")] = None,
    device: DeviceOpt = None, backend: BackendOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Measure GEMM throughput by shape and dtype, memory bandwidth, attention and collective bandwidth by message and
    group size on N ranks (gloo on CPU, the vendor's backend on an accelerator), fit them with the planner's own
    formulas, and write a hardware profile the planner accepts as [bold]--cluster FILE[/bold].

    Example: [bold]dayzero calibrate --nproc 8 --out runs/host.yaml[/bold], then [bold]dayzero predict tiny-llama
    --cluster runs/host.yaml --dp 8[/bold].
    Your own runs: [bold]dayzero calibrate --runs runs.csv --out runs/calibration.json[/bold], then
    [bold]dayzero plan MODEL --calibration runs/calibration.json[/bold].
    Import nccl-tests: [bold]dayzero calibrate --import-nccl-tests all_reduce_perf.txt --import-nccl-tests
    all_gather_perf.txt --accelerator h100 --out runs/h100.yaml[/bold]
    """
    from dayzero.outputs import prepare_output

    if out:
        prepare_output(out, "--out")
    from dayzero.errors import ConfigError

    if runs:
        _calibrate_runs(runs, out, json_out)
        return
    if nccl_tests:
        _import_nccl_tests(nccl_tests, accelerator, base, name, out, json_out)
        return
    if accelerator or base:
        raise ConfigError("--accelerator/--base", None, "only apply with --import-nccl-tests")
    from dayzero.runtime.device import resolve
    from dayzero.validate.calibrate import calibrate

    with resolve(device, backend).exported():
        result = calibrate(nproc, out, quick, name)
    if json_out:
        emit_json(result)
        return
    print_summary(result)
    path = result.get("path")
    print_next(console, [
        Step.of("dayzero", "validate", "tiny-llama", "--cluster", path, "--nproc", nproc, "--steps", 12, "--out",
                "runs/validate/tiny-llama", why="measured vs predicted on this machine") if path else
        Step.of("dayzero", "calibrate", "--nproc", nproc, *(["--quick"] if quick else []), "--out",
                "runs/host.yaml", why="keep the profile")])


def _import_nccl_tests(files: list[Path], accelerator: str | None, base: str | None, name: str | None,
                       out: Path | None, json_out: bool) -> None:
    """--import-nccl-tests: a profile from nccl-tests output (validate.nccl_tests.import_runs), written to
    --out, and its fitted tier, bandwidth, latency and fit error."""
    from dayzero.validate.nccl_tests import import_runs
    from dayzero.validate.profile import write_profile

    profile = import_runs([str(p) for p in files], accelerator, base, name)
    path = write_profile(profile, out) if out else None
    meta = profile["measurements"]["nccl_tests"]
    if json_out:
        emit_json({"profile": profile, "path": None if path is None else str(path)})
        return
    f = meta["fit"]
    console.print(f"[bold]{profile['name']}[/bold]: {meta['tier']} tier from {len(meta['rows'])} rows on "
                  f"{len(meta['hosts'])} host(s) ({meta['device']}): {f['bw_gbytes_per_s']:.1f} GB/s, "
                  f"latency {f['alpha_us']:.1f} us; fit error " +
                  ", ".join(f"{k} {v:.0%}" for k, v in f["mape"].items()), highlight=False)
    if path:
        console.print(f"wrote {path}")
    print_next(console, [_next(path, files, accelerator, base, name)])


def _calibrate_runs(runs: list[Path], out: Path | None, json_out: bool) -> None:
    import json

    from dayzero.planner.backtest.own_runs import calibrate_runs

    result = calibrate_runs(runs)
    doc = {"constants": result["constants"].to_dict(), "error_band": result["error_band"]}
    if out:
        out.write_text(json.dumps(doc, indent=1) + "\n")
    if json_out:
        emit_json({**doc, "in_sample_mape": result["in_sample_mape"], "leave_one_out": result["leave_one_out"],
                   "rows": result["rows"], "skipped": result["skipped"], "path": None if out is None else str(out)})
        return
    loo = result["leave_one_out"]
    console.print(f"fitted on [bold]{loo['n']}[/bold] runs of {escape(', '.join(map(str, runs)))} (in-sample MAPE "
                  f"{result['in_sample_mape']:.1%}); leave-one-out MAPE [bold]{loo['mape']:.1%}[/bold], 80 % band "
                  f"+-{loo['p80_abs_rel_error']:.1%}, bias {loo['bias']:+.1%}", highlight=False)
    for sk in result["skipped"]:
        console.print(f"  skipped {escape(sk['id'])}: {escape(sk['reason'])}", highlight=False)
    if out:
        console.print(f"wrote {out} (use as --calibration {out})")
        print_next(console, [Step.of("dayzero", "plan", "--calibration", out, why="plan with your runs' constants "
                                     "and their error band")])


def _next(path, nccl_tests, accelerator, base, name) -> Step:
    if path:
        return Step.of("dayzero", "plan", "--cluster", path, why="plan the Day-0 model with this profile")
    again = ["dayzero", "calibrate"] + [w for f in nccl_tests for w in ("--import-nccl-tests", f)]
    for flag, v in (("--accelerator", accelerator), ("--base", base), ("--name", name)):
        if v:
            again += [flag, v]
    return Step.of(*again, "--out", "runs/nccl-profile.yaml", why="keep the profile")


def print_summary(result: dict) -> None:
    prof, s = result["profile"], result["summary"]
    m = prof["measurements"]["machine"]
    console.print(f"[bold]{prof['name']}[/bold]: {m['ranks']} {m['backend']} rank(s) on {m.get('name') or m['cpu']}, "
                  f"{m['threads_per_rank']} thread(s) per rank; training computes in "
                  f"{s['compute_dtype']}", highlight=False)
    t = FitTable(title="GEMM (per rank, all ranks at once)", compact=True)
    for col in ("dtype", "peak TFLOP/s", "half-dim", "fit error", "attention TFLOP/s"):
        t.add_column(col, num=col != "dtype")
    for dt, f in s["fits"].items():
        att = f["attention_tflops"]
        t.add_row(dt, f"{f['peak_tflops']:.4g}", f"{f['half_dim']:.0f}", f"{f['gemm_fit_mape']:.0%}",
                  "—" if att is None else f"{att:.3g}")
    console.print(t)
    console.print(f"memory bandwidth {s['memory_gbytes_per_s']:.3g} GB/s per rank; runtime context "
                  f"{s['memory_overhead']['runtime_context_bytes'] / 2**20:,.0f} MiB per rank")
    if s.get("collectives"):
        lf = s["link_fit"]
        console.print(f"links: {lf['bw_gbytes_per_s']:.3g} GB/s per rank, latency {lf['alpha_us']:.0f} us, "
                      f"send/recv {lf['p2p_gbytes_per_s']:.3g} GB/s; fit error " +
                      ", ".join(f"{k} {v:.0%}" for k, v in lf["mape"].items()), highlight=False)
        c = FitTable(title="Collectives (largest message per group)", compact=True)
        for col in ("collective", "group", "MB", "ms", "busbw GB/s", "fit ms"):
            c.add_column(col, num=col != "collective")
        biggest: dict = {}
        for r in s["collectives"]:
            k = (r["collective"], r["group"])
            if k not in biggest or r["bytes"] > biggest[k]["bytes"]:
                biggest[k] = r
        for r in biggest.values():
            c.add_row(r["collective"], str(r["group"]), f"{r['bytes'] / 1e6:.3g}", f"{r['seconds'] * 1e3:.3g}",
                      f"{r['busbw_gbytes_per_s']:.3g}", f"{r['fitted_seconds'] * 1e3:.3g}")
        console.print(c)
    for w in result.get("warnings", []):
        console.print(f"[yellow]warning:[/yellow] {escape(w)}", highlight=False)
    if result.get("path"):
        console.print(f"wrote {result['path']} (use as --cluster {result['path']})")
