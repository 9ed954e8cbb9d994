"""``dayzero moe place|loads``: expert placement from measured loads, and the expert-load report."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from dayzero.cli.app import app
from dayzero.cli.common import JsonOpt, console, emit_json
from dayzero.cli.next_steps import Step, print_next
from dayzero.cli.render import FitTable

moe_app = typer.Typer(help="MoE load balancing: expert-load reports and EPLB expert placement.", no_args_is_help=True)
app.add_typer(moe_app, name="moe")

POLICIES = ("hierarchical", "global")


@moe_app.command("place")
def place_cmd(
    loads: Annotated[str, typer.Option("--loads", help="A run's metrics.jsonl (its expert_loads records summed) or "
                                       "a layer x expert JSON matrix: a list of rows (layers 0..L-1) or {\"layers\": "
                                       "{\"<global layer>\": row}}.")],
    ep: Annotated[int, typer.Option("--ep", "--expert-model-parallel-size", min=1,
                                    help="Expert-parallel ranks to place the experts on.")] = 1,
    nodes: Annotated[int, typer.Option("--nodes", min=1, help="Nodes the EP ranks span (must divide --ep).")] = 1,
    redundant: Annotated[int, typer.Option("--redundant", min=0, help="Spare expert slots in total (replicas of hot "
                                           "experts); --ep must divide experts + redundant.")] = 0,
    groups: Annotated[Optional[int], typer.Option("--groups", min=1, help="Expert groups of group-limited routing "
                                                  "(DeepSeek-V3 n_group); default: one per expert.")] = None,
    policy: Annotated[Optional[str], typer.Option("--policy", help="hierarchical (groups to nodes, replicate in each "
                                                  "node, pack onto its ranks) | global (replicate and pack over all "
                                                  "ranks); default: hierarchical when --nodes divides --groups.")]
    = None,
    out: Annotated[Optional[Path], typer.Option("--out", "-o", help="Write the placement file "
                                                "(dayzero-expert-placement/1) here.")] = None,
    json_out: JsonOpt = False,
) -> None:
    """Place experts on EP ranks from measured loads with DeepSeek's EPLB policies (replicas of hot experts in the
    --redundant spare slots) and print the placement with the predicted busiest-rank load (max/mean) before (expert e
    on rank e // (experts / ep)) and after.

    Example: [bold]dayzero moe place --loads runs/moe/metrics.jsonl --ep 8 --nodes 2 --redundant 8 --out
    runs/moe/placement.json[/bold]
    """
    from dayzero.jsonable import dumps
    from dayzero.outputs import prepare_output
    from dayzero.planner.perf.eplb import rebalance_loads
    from dayzero.specs.expert_loads import read_expert_loads

    if policy is not None and policy not in POLICIES:
        raise typer.BadParameter(f"{policy!r}; one of: {', '.join(POLICIES)}", param_hint="--policy")
    target = prepare_output(out, "--out") if out else None
    result = rebalance_loads(read_expert_loads(loads), ep, nodes, redundant, groups, policy)
    doc = result.to_json()
    if target is not None:
        target.write_text(dumps(doc["placement"]) + "\n")
        doc["out"] = str(target)
    if json_out:
        emit_json(doc)
        return
    _print_place(doc)
    steps = [Step.of("dayzero", "predict", "MODEL", "--ep", ep, "--expert-loads", loads,
                     *(("--placement", str(target)) if target else ()),
                     why="the step time with this imbalance")]
    print_next(console, steps)


def _ratio(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def _print_place(doc: dict) -> None:
    src = doc["loads"]
    console.print(f"{doc['policy']} EPLB: {doc['experts']} experts on ep={doc['ep']} ranks ({doc['nodes']} node(s), "
                  f"{doc['groups']} groups), {doc['redundant']} redundant -> {doc['slots_per_rank']} slots per rank; "
                  f"loads from {src['source']} ({src['snapshots']} snapshot(s))", highlight=False)
    t = FitTable(title="Busiest EP rank, tokens over the mean rank")
    for col in ("layer", "before (contiguous)", "after (EPLB)", "busiest rank load cut"):
        t.add_column(col, num=True)
    for x in doc["layers"]:
        cut = x["max_rank_load_reduction"]
        t.add_row(str(x["layer"]), _ratio(x["max_mean_before"]), _ratio(x["max_mean_after"]),
                  "-" if cut is None else f"{cut:.1%}")
    console.print(t)
    b, a = doc["max_mean_before"], doc["max_mean_after"]
    console.print(f"worst layer: {_ratio(b['worst'])} -> {_ratio(a['worst'])}; mean over layers: {_ratio(b['mean'])} "
                  f"-> {_ratio(a['mean'])}", highlight=False)
    for layer, ranks in list(doc["placement"]["layers"].items())[:4]:
        text = " | ".join(f"r{r}: {' '.join(map(str, ids))}" for r, ids in enumerate(ranks))
        console.print(f"layer {layer}: {text}", highlight=False, soft_wrap=True)
    if len(doc["placement"]["layers"]) > 4:
        console.print(f"... {len(doc['placement']['layers']) - 4} more layers (--out or --json for all)")
    if doc.get("out"):
        console.print(f"placement written to [bold]{doc['out']}[/bold]")


@moe_app.command("loads")
def loads_cmd(
    metrics: Annotated[Path, typer.Argument(help="A run's metrics.jsonl (dayzero train --metrics).")],
    out: Annotated[Optional[Path], typer.Option("--out", "-o", help="Write the layer x expert heat map PNG here "
                                               "(needs matplotlib).")] = None,
    json_out: JsonOpt = False,
) -> None:
    """Per MoE layer: expert max/mean, coefficient of variation, dropped share and EP rank max/mean (the overloaded
    card) over the steps, the hottest experts of the expert_loads snapshots, and a layer x expert heat map (--out).

    Example: [bold]dayzero moe loads runs/moe/metrics.jsonl --out runs/moe/loads.png[/bold]
    """
    from dayzero.outputs import prepare_output
    from dayzero.report.moe_loads import loads_report, write_heatmap
    from dayzero.specs.expert_loads import read_telemetry

    target = prepare_output(out, "--out") if out else None
    tel = read_telemetry(metrics)
    doc = loads_report(tel)
    if target is not None:
        skipped = write_heatmap(tel, target)
        doc["heatmap"] = {"path": None if skipped else str(target), "skipped": skipped}
    if json_out:
        emit_json(doc)
        return
    console.print(f"{metrics}: {doc['steps']} steps with MoE summaries, {len(doc['snapshots'])} expert_loads "
                  f"snapshot(s)", highlight=False)
    t = FitTable(title="Per MoE layer (mean / worst over steps)")
    for col in ("layer", "expert max/mean", "CV", "dropped", "rank max/mean", "hottest experts (share)"):
        t.add_column(col, num=col != "hottest experts (share)")
    pair = lambda s, f: "-" if s["mean"] is None else f"{s['mean']:{f}} / {s['worst']:{f}}"  # noqa: E731
    for x in doc["layers"]:
        hot = ", ".join(f"{h['expert']} ({h['share']:.0%})" for h in x.get("hottest", [])) or "-"
        t.add_row(str(x["layer"]), pair(x["max_mean"], ".2f"), pair(x["cv"], ".2f"), pair(x["dropped"], ".1%"),
                  pair(x["rank_max_mean"], ".2f"), hot)
    console.print(t)
    if target is not None:
        h = doc["heatmap"]
        console.print(f"heat map written to [bold]{h['path']}[/bold]" if h["path"]
                      else f"heat map skipped: {h['skipped']}")
    if doc["snapshots"]:
        print_next(console, [Step.of("dayzero", "moe", "place", "--loads", metrics, "--ep", "N", "--redundant", "R",
                                     why="re-place the hot experts")])
