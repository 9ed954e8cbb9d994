"""``dayzero compare MODEL``: the best plan on each of several cards or clusters, side by side."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from dayzero.cli.app import app
from dayzero.cli.common import (
    DEFAULT_TOKENS,
    DevicesOpt,
    ElectricityOpt,
    FailuresOpt,
    HostOverheadOpt,
    JsonOpt,
    PriceOpt,
    PueOpt,
    TokensOpt,
    TrustRemoteCodeOpt,
    console,
    cost_options,
    emit_json,
)
from dayzero.cli.next_steps import Step, print_next
from dayzero.cli.plan import DEFAULT_GBS, DEFAULT_MODEL, ScenarioGbsOpt, ScenarioSeqOpt
from dayzero.cli.predict import PrecisionOpt, check_precision
from dayzero.cli.render import MISSING, FitTable
from dayzero.report.layout_text import describe

DEFAULT_ACCELERATORS = "910b,h100,h200,b200,mi300x"


def _names(text: str, flag: str) -> list[str]:
    from dayzero.errors import ConfigError

    names = [x.strip() for x in text.split(",") if x.strip()]
    if not names:
        raise ConfigError(flag, None, f"expected comma-separated names, got {text!r}")
    return names


@app.command("compare")
def compare_cmd(
    model: Annotated[str, typer.Argument(help="Preset name (dayzero models), config.json, or a directory holding "
                                              "one.")] = DEFAULT_MODEL,
    accelerators: Annotated[Optional[str], typer.Option("--accelerators", help="Cards, comma-separated (default "
                                                                               f"{DEFAULT_ACCELERATORS}), each with "
                                                                               "--devices.")] = None,
    devices: DevicesOpt = None,
    clusters: Annotated[Optional[str], typer.Option("--clusters", help="Cluster presets or YAML files, "
                                                                       "comma-separated (instead of "
                                                                       "--accelerators).")] = None,
    gbs: ScenarioGbsOpt = DEFAULT_GBS, seq: ScenarioSeqOpt = 4096,
    precision: PrecisionOpt = "bf16",
    tokens: TokensOpt = DEFAULT_TOKENS, price_per_device_hour: PriceOpt = None, pue: PueOpt = None,
    host_overhead: HostOverheadOpt = None, trust_remote_code: TrustRemoteCodeOpt = False,
    electricity_price: ElectricityOpt = None, failures: FailuresOpt = None,
    rank_by: Annotated[str, typer.Option("--rank-by", help="Order the cards by days, mwh, cost or tokens-per-joule "
                                                           "(facility energy).")] = "days",
    json_out: JsonOpt = False,
) -> None:
    """The best plan of MODEL on each card (or cluster), side by side: HBM capacity and bandwidth, interconnect
    bandwidth and topology, step time, MFU, wall days, energy, TFLOP/s per W and cost of training --tokens tokens.

    Example: [bold]dayzero compare dense-3t --accelerators 910b,h100,h200,b200,mi300x --devices 8192[/bold];
    [bold]dayzero compare llama-3.1-70b --clusters dgx-h100-1024,my-cluster.yaml --tokens 15T --json[/bold]
    """
    from dayzero.cli.common import model_notes, print_model_notes
    from dayzero.errors import ConfigError
    from dayzero.planner.perf.perf import PerfOptions
    from dayzero.report.compare import RANK_BY, compare, ranked
    from dayzero.specs.cluster import build_cluster, get_cluster
    from dayzero.specs.registry import load_model

    if rank_by not in RANK_BY:
        raise ConfigError("--rank-by", None, f"expected one of {', '.join(RANK_BY)}, got {rank_by!r}")
    copt = cost_options(tokens, price_per_device_hour, pue, host_overhead, electricity_price, failures)
    if clusters and (accelerators or devices):
        raise ConfigError("--clusters", None, "give either --clusters or --accelerators with --devices, not both")
    if clusters:
        names = _names(clusters, "--clusters")
        cls = [get_cluster(c) for c in names]
    else:
        if not devices:
            raise ConfigError("--devices", None, "is required with --accelerators (or give --clusters)")
        names = _names(accelerators or DEFAULT_ACCELERATORS, "--accelerators")
        cls = [build_cluster(a, devices) for a in names]
    for cl in cls:
        check_precision(precision, cl)
    spec = load_model(model, trust_remote_code)
    obj = compare(spec, cls, gbs, seq, precision, copt,
                  perf_for=PerfOptions.for_run)
    print_model_notes(spec)  # after the work: an error stays one line
    order = ranked(obj["rows"], rank_by)
    obj = {**obj, "rank_by": rank_by, "rows": [obj["rows"][i] for i in order]}
    names = [names[i] for i in order]
    if json_out:
        emit_json({**obj, **model_notes(spec)})
        return
    print_comparison(obj, names)
    key = RANK_BY[rank_by][0]
    fit = [(n, r) for n, r in zip(names, obj["rows"]) if r["fits"] and r.get(key) is not None]
    if fit:
        name, best = fit[0]
        where = ["--cluster", name] if clusters else ["--accelerator", name, "--devices", best["devices"]]
        print_next(console, [Step.of("dayzero", "day0", model, *where, "--tokens", tokens,
                                     why=f"the full Day-0 report on the best by {rank_by}")])


def _v(x, fmt: str) -> str:
    return MISSING if x is None else format(x, fmt)


# (label, row -> text); a card that does not fit shows only the card's own lines
CARD_LINES = (
    ("devices", lambda r: f"{r['devices']:,}"),
    ("HBM GiB", lambda r: _v(r["hbm_gib"], ",.4g")),
    ("HBM TB/s", lambda r: _v(r["hbm_tbytes_per_s"], ".3g")),
    ("scale-up GB/s", lambda r: _v(r["scaleup_gbytes_per_s"], ",.0f")),
    ("scale-up", lambda r: f"{r['scaleup_topology']} x{r['scaleup_size']}"),
    ("scale-out GB/s", lambda r: _v(r["scaleout_gbytes_per_s"], ",.0f")),
    ("bf16 TFLOP/s", lambda r: _v(r["peak_tflops_bf16"], ",.0f")),
    ("TDP W", lambda r: _v(r["tdp_w"], ",.0f")),
)
PLAN_LINES = (
    ("layout", lambda r: describe(r["parallel"])),
    ("step s", lambda r: f"{r['step_s']:.4g}"),
    ("MFU", lambda r: f"{r['mfu']:.1%}"),
    ("memory", lambda r: f"{r['memory_utilization']:.0%}"),
    ("wall days", lambda r: f"{r['wall_days']:,.1f}"),
    ("MWh", lambda r: _v(r["mwh"], ",.0f")),
    ("TFLOP/s per W", lambda r: _v(r["model_tflops_per_w"], ".3f")),
    ("tokens per J", lambda r: _v(r["tokens_per_joule"], ".3g")),
    ("price /h", lambda r: MISSING if r.get("price_per_device_hour") is None
     else f"{r['price_per_device_hour']:.3g} {r['price_offer']}"),
    ("cost", lambda r: _v(r["cost"], ",.0f")),
)


def print_comparison(obj: dict, names: list[str]) -> None:
    """One column per card, headed by the name it was given as."""
    from dayzero.report.training import count_text

    t = FitTable(title=f"{obj['model']}: best plan per card, {count_text(obj['tokens'])} tokens, gbs {obj['gbs']} x "
                       f"seq {obj['seq']}", compact=True)
    t.add_column("", wrap=False)
    for n in names:
        t.add_column(n)
    for label, f in CARD_LINES:
        t.add_row(label, *[f(r) for r in obj["rows"]])
    for label, f in PLAN_LINES:
        t.add_row(label, *[f(r) if r["fits"] else ("does not fit" if label == "layout" else MISSING)
                           for r in obj["rows"]])
    console.print(t)
    from dayzero.report.compare import mixed_prices

    if note := mixed_prices(obj["rows"]):
        console.print(f"note: {note}", highlight=False, markup=False)
    for r in obj["rows"]:
        if not r["fits"]:
            console.print(f"{r['cluster']}: {r['reason']}", highlight=False, markup=False)
