"""``dayzero day0 [MODEL]``: from a config.json to a Day-0 decision, in one report."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from dayzero.cli.app import app
from dayzero.cli.common import (
    DEFAULT_TOKENS,
    AcceleratorOpt,
    ClusterOpt,
    DevicesOpt,
    DevicesPerNodeOpt,
    ElectricityOpt,
    FailuresOpt,
    HostOverheadOpt,
    InterNodeOpt,
    JsonOpt,
    PriceOpt,
    PueOpt,
    TokensOpt,
    TrustRemoteCodeOpt,
    cluster_from_options,
    console,
    cost_options,
    emit_json,
    err_console,
)
from dayzero.cli.compare import DEFAULT_ACCELERATORS
from dayzero.cli.next_steps import Step, for_model, print_next, run_step
from dayzero.cli.plan import DEFAULT_CLUSTER, DEFAULT_GBS, DEFAULT_MODEL, ScenarioGbsOpt, ScenarioSeqOpt
from dayzero.cli.predict import PrecisionOpt, check_precision
from dayzero.cli.render import FitTable, pass_fail


@app.command("day0")
def day0_cmd(
    model: Annotated[str, typer.Argument(help="Preset name (dayzero models), config.json, or a directory holding "
                                              "one.")] = DEFAULT_MODEL,
    cluster: ClusterOpt = None, accelerator: AcceleratorOpt = None, devices: DevicesOpt = None,
    devices_per_node: DevicesPerNodeOpt = None, inter_node_gbps: InterNodeOpt = None,
    gbs: ScenarioGbsOpt = DEFAULT_GBS, seq: ScenarioSeqOpt = 4096,
    precision: PrecisionOpt = "bf16",
    tokens: TokensOpt = DEFAULT_TOKENS, price_per_device_hour: PriceOpt = None, pue: PueOpt = None,
    host_overhead: HostOverheadOpt = None,
    electricity_price: ElectricityOpt = None, failures: FailuresOpt = None,
    ops: Annotated[bool, typer.Option("--ops/--no-ops", help="Trace the modeling code for operator coverage (needs "
                                                             "torch and transformers).")] = True,
    trust_remote_code: TrustRemoteCodeOpt = False,
    out: Annotated[Optional[Path], typer.Option("--out", "-o", help="Report directory (default: "
                                                                    "runs/day0-MODEL-CLUSTER).")] = None,
    validate: Annotated[bool, typer.Option("--validate", help="Run the best plan at proxy scale on this machine "
                                                              "(dayzero validate): measured vs predicted, loss "
                                                              "curve.")] = False,
    validate_nproc: Annotated[Optional[int], typer.Option("--validate-nproc", min=1, help="With --validate: local "
                                                          "ranks (default: this host's cores, at most 4).")] = None,
    validate_steps: Annotated[Optional[int], typer.Option("--validate-steps", min=4, help="With --validate: "
                                                          "optimizer steps (default 8).")] = None,
    validate_profile: Annotated[Optional[Path], typer.Option("--validate-profile", help="With --validate: this host's "
                                                             "profile (default: the cached measured one).")] = None,
    json_out: JsonOpt = False,
) -> None:
    """The Day-0 answer for a model on a cluster: can it train, how must it be split, how long will it take, what energy
    and cost, and which checks pass. Writes report.json, report.md and report.html (charts as inline SVG: opens
    offline).

    With no arguments: [bold]dense-3t[/bold] on [bold]ascend910b-8192[/bold], as [bold]dayzero plan[/bold].

    Example: [bold]dayzero day0[/bold]; [bold]dayzero day0 ./my-model/config.json -a h100 -n 1024 --tokens 15T
    --price-per-device-hour 2.5 --out runs/my-day0[/bold]; [bold]dayzero day0 tiny-llama -a h100 -n 64
    --validate[/bold]
    """
    from dayzero.report.day0 import Day0Request, ProxyOptions, default_dir, finished, write

    _check_validate_flags(validate, validate_nproc, validate_steps, validate_profile)
    copt = cost_options(tokens, price_per_device_hour, pue, host_overhead, electricity_price, failures)
    cl = cluster_from_options(cluster, accelerator, devices, devices_per_node, inter_node_gbps, default=DEFAULT_CLUSTER)
    check_precision(precision, cl)
    from dayzero.cli.predict import dispatcher_option
    from dayzero.planner.engines import default_engine, with_engine_overlaps
    from dayzero.planner.perf.perf import PerfOptions

    own = default_engine(cl.accelerator.vendor)  # Huawei: planned and priced as MindSpeed runs it
    perf = with_engine_overlaps(PerfOptions.for_run(cl, ep_dispatcher=dispatcher_option(None, own)), own)
    req = Day0Request(model=model, cluster=cl, gbs=gbs, seq=seq, precision=precision, cost=copt,
                      perf=perf, operators=ops, trust_remote_code=trust_remote_code,
                      validate=ProxyOptions(validate_nproc, validate_steps,
                                            str(validate_profile) if validate_profile else None) if validate else None,
                      announce=lambda text: err_console.print(f"dayzero: {text}", highlight=False, markup=False))
    out_dir = out or default_dir(model, cl)
    report = _run_steps(req)
    paths = write(finished(report), out_dir)
    if json_out:
        emit_json({**report, "files": {k: str(v) for k, v in paths.items()}})
        return
    _print_report(report, model, cl, paths)


def _check_validate_flags(validate: bool, nproc: int | None, steps: int | None, profile: Path | None) -> None:
    """The --validate-* flags only with --validate (a one-line ConfigError), and a bad --validate-profile
    refused now, not as a note after the search."""
    from dayzero.errors import ConfigError

    if not validate:
        given = [f for f, v in (("--validate-nproc", nproc), ("--validate-steps", steps),
                                ("--validate-profile", profile)) if v is not None]
        if given:
            raise ConfigError(given[0], None, "only applies with --validate")
    if profile is not None:
        from dayzero.specs.cluster import get_cluster

        get_cluster(str(profile))


def _run_steps(req) -> dict:
    """The report of ``req``, its steps (report.day0.steps) run in order with their progress on stderr
    (stdout stays the report summary, or the JSON)."""
    from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from dayzero.report.day0 import steps

    report: dict = {}
    todo = steps(req)
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(),
                  console=err_console, transient=True) as progress:
        task = progress.add_task("day0", total=len(todo))
        for label, run in todo:
            progress.update(task, description=label)
            run(report)
            progress.advance(task)
    return report


def _print_report(report: dict, model: str, cl, paths: dict) -> None:
    """The report's summary table (headline, checks, operator coverage, claims), the files written and
    the next steps that run for this model."""
    from dayzero.report.day0_render import headline

    t = FitTable(show_header=False, title=f"Day 0: {report['model']['name']} on {cl.name}", compact=True)
    t.add_column("", wrap=False)
    t.add_column("")
    for label, value in headline(report):
        t.add_row(label, value)
    for c in report["checks"]:
        t.add_row(f"  {c['metric']}", pass_fail(c["pass"]) + f" {c['value']:.1%} (target {c['target']})")
    op = report["operators"]
    t.add_row("operators", f"{op['coverage']:.1%} of calls on {op['manifest']}, "
                           f"{len(op['needs_kernel'])} need a kernel" if "coverage" in op else op["note"])
    for c in report.get("claims", ()):
        if c["formula"].startswith("Day-0 target"):
            continue  # the checks above
        t.add_row("  claim", pass_fail(c["holds"], "holds", "does not hold") + f" {c['claim']}: {c['text']}")
    console.print(t)
    console.print(f"wrote {paths['json']}, {paths['md'].name}, {paths['html'].name}")
    todo, left_out = for_model(next_steps(report, model, cl, paths["json"]), report["model"])
    print_next(console, todo)
    for line in left_out:
        console.print(line, highlight=False)


def next_steps(report: dict, model: str, cl, report_json: Path) -> list[Step]:
    """Validate the best plan at proxy scale on this machine (the layout the proxy run had, or would
    have: dayzero.validate.proxy_plan), train it, and ask what other cards would change. Every step
    as for a parsed model: :func:`dayzero.cli.next_steps.for_model` keeps those that run for this one."""
    from dayzero.cli.next_steps import layout_flags
    from dayzero.specs.plan_layout import layout_of
    from dayzero.validate.proxy_plan import PROXY_SEQ, default_ranks, proxy_parallel

    p = report["plans"][0]["parallel"]
    ran = report.get("validation", {}).get("run")
    if ran:
        ranks, proxy = ran["ranks"], ran["parallel"]
    else:
        ranks = default_ranks()
        proxy = layout_of(proxy_parallel(p, ranks), ranks, PROXY_SEQ).to_dict()
    return [Step.of("dayzero", "validate", model, "--nproc", ranks, *layout_flags(proxy, precision=False),
                    why="the plan at proxy scale here, measured vs predicted"),
            run_step(model, p, report["plans"][0].get("engines"), cl.devices, cl.devices_per_node, why="train it"),
            Step.of("dayzero", "compare", model, "--accelerators", DEFAULT_ACCELERATORS, "--devices", cl.devices,
                    why="the best plan on other cards")]
