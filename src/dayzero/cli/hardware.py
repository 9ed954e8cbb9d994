"""``dayzero hardware``: accelerators in the catalog and cluster presets."""

from __future__ import annotations

from typing import Annotated, Optional

import typer
from rich.table import Table

from dayzero.cli.app import app
from dayzero.cli.common import JsonOpt, console, emit_json


@app.command("hardware")
def hardware_cmd(
    name: Annotated[Optional[str], typer.Argument(help="An accelerator (h100, 910b, ...) or cluster preset to show in full.")] = None,
    json_out: JsonOpt = False,
) -> None:
    """List accelerators and cluster presets, or show one in full with its sources.

    Example: [bold]dayzero hardware 910b --json[/bold]; [bold]dayzero hardware ascend910b-8192[/bold]
    """
    from dayzero.specs.cluster import cluster_presets, get_cluster
    from dayzero.specs.hardware import catalog, get_accelerator

    if name:
        obj = get_cluster(name).summary() if name in cluster_presets() else get_accelerator(name).summary()
        if json_out:
            emit_json(obj)
        else:
            t = Table(title=obj["name"], show_header=False)
            t.add_column("field")
            t.add_column("value")
            for k, v in obj.items():
                t.add_row(k, "\n".join(map(str, v)) if isinstance(v, list) else str(v))
            console.print(t)
        return
    accs = [a.summary() for a in catalog().values()]
    clusters = [get_cluster(c).summary() for c in sorted(cluster_presets())]
    if json_out:
        emit_json({"accelerators": accs, "clusters": clusters})
        return
    t = Table(title="Accelerators (dense peak; GB/s per direction)")
    for col in ("id", "bf16 TF", "fp8 TF", "HBM GB", "HBM TB/s", "per node", "topology", "intra GB/s", "per-peer GB/s", "inter GB/s"):
        t.add_column(col, justify="left" if col in ("id", "topology") else "right", no_wrap=col == "id")

    def f(x, fmt="{:g}"):
        return "—" if x is None else fmt.format(x)

    for a in accs:
        pk = a["peak_tflops"]
        t.add_row(a["id"], f(pk.get("bf16")), f(pk.get("fp8")), f(a["hbm_gb"]), f(a["hbm_tbytes_per_s"]),
                  str(a["devices_per_node"]), a["topology"], f(a["intra_node_gbytes_per_s"]),
                  f(a["intra_node_p2p_gbytes_per_s"]), f(a["inter_node_gbytes_per_s"]))
    console.print(t)
    c = Table(title="Cluster presets (--cluster NAME)")
    for col in ("name", "devices", "accelerator", "description"):
        c.add_column(col)
    for cl in clusters:
        c.add_row(cl["name"], f"{cl['devices']:,}", cl["accelerator"], cl["description"])
    console.print(c)
