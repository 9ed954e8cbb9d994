"""``dayzero hardware``: accelerators in the catalog and cluster presets."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from dayzero.cli.app import app
from dayzero.cli.common import JsonOpt, console, emit_json
from dayzero.cli.next_steps import Step, print_next, starter_devices
from dayzero.cli.render import Field, FitTable, sheet, value_text

PER_DIRECTION = "GB/s per direction"
ACCELERATOR_FIELDS = (
    Field("id", "Identity", "id"), Field("name", "Identity", "name"), Field("vendor", "Identity", "vendor"),
    Field("peak_tflops", "Compute", "dense peak", "TFLOP/s"),
    Field("gemm_tflops_measured", "Compute", "best measured GEMM", "TFLOP/s"),
    Field("tdp_w", "Compute", "TDP", "W"),
    Field("hbm_gib", "Memory", "HBM capacity", "GiB"), Field("hbm_tbytes_per_s", "Memory", "HBM bandwidth", "TB/s"),
    Field("devices_per_node", "Interconnect", "devices per node"),
    Field("scaleup_domain", "Interconnect", "scale-up domain", "devices"),
    Field("topology", "Interconnect", "intra-node topology"),
    Field("intra_node_gbytes_per_s", "Interconnect", "intra-node, all links of a device", PER_DIRECTION),
    Field("intra_node_p2p_gbytes_per_s", "Interconnect", "intra-node, to one peer", PER_DIRECTION),
    Field("inter_node_gbytes_per_s", "Interconnect", "inter-node (scale-out NIC)", PER_DIRECTION),
    Field("allreduce_busbw_intra_gbytes_per_s", "Interconnect", "intra-node all-reduce bus bandwidth, measured",
          "GB/s"),
    Field("assumptions", "Assumptions", "assumptions"), Field("sources", "Sources", "sources"),
)
CLUSTER_FIELDS = (
    Field("name", "Cluster", "name"), Field("description", "Cluster", "description"),
    Field("accelerator", "Cluster", "accelerator"), Field("nodes", "Cluster", "nodes"),
    Field("devices_per_node", "Cluster", "devices per node"), Field("devices", "Cluster", "devices"),
    Field("memory_gib_per_device", "Cluster", "memory per device", "GiB"),
    Field("tiers", "Network tiers (GB/s per direction per device)", "network tiers", columns=(
        ("name", "tier"), ("size", "devices"), ("gbytes_per_s", "GB/s"), ("p2p_gbytes_per_s", "to one peer GB/s"),
        ("latency_us", "latency us"), ("topology", "topology"))),
    Field("efficiency", "Efficiency constants (— : the planner's defaults)", "efficiency"),
    Field("host", "Host side per device (GB, GB/s per direction; assumed: a DGX H100's)", "host"),
)


def _accelerator(name: str):
    """The accelerator ``name``, or one line naming the nearest accelerators and cluster presets."""
    from dayzero.errors import ConfigError
    from dayzero.names import nearest
    from dayzero.specs.cluster import cluster_presets
    from dayzero.specs.hardware import ALIASES, accelerator_names, catalog, get_accelerator

    try:
        return get_accelerator(name)
    except ConfigError:
        near = accelerator_names(nearest(name, [*ALIASES, *catalog(), *cluster_presets()], n=6))[:3]
        raise ConfigError(name, None, "no such accelerator or cluster preset" + (
            f" (did you mean {', '.join(near)}?)" if near else "") + "; 'dayzero hardware' lists them all") from None


@app.command("hardware")
def hardware_cmd(
    name: Annotated[Optional[str], typer.Argument(help="An accelerator (h100, 910b, ...) or cluster preset to show in "
                                                       "full.")] = None,
    json_out: JsonOpt = False,
) -> None:
    """List accelerators and cluster presets, or show one in full with its sources.

    Example: [bold]dayzero hardware 910b --json[/bold]; [bold]dayzero hardware ascend910b-8192[/bold]
    """
    from dayzero.cli.plan import DEFAULT_MODEL
    from dayzero.specs.cluster import cluster_presets, get_cluster
    from dayzero.specs.hardware import catalog, get_accelerator
    from dayzero.specs.registry import load_model

    if name:
        is_cluster = name in cluster_presets()
        obj = get_cluster(name).summary() if is_cluster else _accelerator(name).summary()
        if json_out:
            emit_json(obj)
            return
        if is_cluster:
            console.print(sheet(obj["name"], obj, CLUSTER_FIELDS))
            print_next(console, [Step.of("dayzero", "plan", "--cluster", obj["name"],
                                         why=f"plan {DEFAULT_MODEL} on it"),
                                 Step.of("dayzero", "hardware", obj["accelerator"], why="its accelerator in full")])
        else:
            acc = get_accelerator(name)
            console.print(sheet(obj["name"], obj, ACCELERATOR_FIELDS))
            n = starter_devices(load_model(DEFAULT_MODEL), acc)
            print_next(console, [Step.of("dayzero", "plan", DEFAULT_MODEL, "--accelerator", acc.id, "--devices", n,
                                         why="the Day-0 model on enough of them")])
        return
    accs = [a.summary() for a in catalog().values()]
    clusters = [get_cluster(c).summary() for c in sorted(cluster_presets())]
    if json_out:
        emit_json({"accelerators": accs, "clusters": clusters})
        return

    def f(x) -> str:
        return value_text(x)

    t = FitTable(title="Accelerators: compute and memory (dense peak)")
    for col in ("id", "vendor", "bf16 TFLOP/s", "fp8 TFLOP/s", "HBM GiB", "HBM TB/s", "TDP W"):
        t.add_column(col, num=col not in ("id", "vendor"))
    for a in accs:
        pk = a["peak_tflops"]
        t.add_row(a["id"], a["vendor"], f(pk.get("bf16")), f(pk.get("fp8")), f(a["hbm_gib"]),
                  f(a["hbm_tbytes_per_s"]), f(a["tdp_w"]))
    console.print(t)
    n = FitTable(title=f"Accelerators: interconnect ({PER_DIRECTION})")
    for col in ("id", "per node", "scale-up", "topology", "intra-node", "per peer", "inter-node"):
        n.add_column(col, num=col not in ("id", "topology"))
    for a in accs:
        n.add_row(a["id"], f(a["devices_per_node"]), f(a["scaleup_domain"]), a["topology"],
                  f(a["intra_node_gbytes_per_s"]), f(a["intra_node_p2p_gbytes_per_s"]), f(a["inter_node_gbytes_per_s"]))
    console.print(n)
    c = FitTable(title="Cluster presets (--cluster NAME)")
    for col in ("name", "devices", "accelerator", "description"):
        c.add_column(col, num=col == "devices")
    for cl in clusters:
        c.add_row(cl["name"], f(cl["devices"]), cl["accelerator"], cl["description"])
    console.print(c)
    print_next(console, [Step.of("dayzero", "hardware", accs[0]["id"], why="one in full, with sources"),
                         Step.of("dayzero", "plan", "--cluster", clusters[0]["name"],
                                 why="the Day-0 model on a preset")])
