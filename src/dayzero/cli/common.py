"""Helpers shared by the CLI verbs: output, formatting and the option types every verb uses."""

from __future__ import annotations

import json
import math
import sys
from typing import Annotated, Any, Optional

import typer
from rich.console import Console

from dayzero.specs.cluster import Cluster, resolve_cluster

console = Console()
err_console = Console(stderr=True)


def emit_json(obj: Any) -> None:
    """Print one JSON document on stdout (no rich markup, no wrapping)."""
    sys.stdout.write(json.dumps(obj, indent=1, default=_default) + "\n")


def _default(o: Any):
    if hasattr(o, "to_dict"):
        return o.to_dict()
    if hasattr(o, "item"):
        return o.item()
    if isinstance(o, (set, tuple)):
        return list(o)
    return str(o)


def human(n: float, unit: str = "") -> str:
    """1234567 -> '1.23 M'; keeps three significant digits."""
    if n is None or (isinstance(n, float) and math.isnan(n)):
        return "—"
    for div, suffix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(n) >= div:
            return f"{n / div:.3g} {suffix}{unit}"
    return f"{n:.3g} {unit}".rstrip()


def gib(n: float) -> str:
    return f"{n / 2**30:,.2f} GiB"


def commas(n: int) -> str:
    return f"{n:,}"


# -- shared options ----------------------------------------------------------------------------

JsonOpt = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON instead of tables.")]
ClusterOpt = Annotated[Optional[str], typer.Option("--cluster", "-c", help="Cluster preset (dayzero hardware) or YAML file.")]
AcceleratorOpt = Annotated[Optional[str], typer.Option("--accelerator", "-a", help="Accelerator name, e.g. h100, 910b, mi300x.")]
DevicesOpt = Annotated[Optional[int], typer.Option("--devices", "-n", help="Device count with --accelerator.")]
DevicesPerNodeOpt = Annotated[Optional[int], typer.Option("--devices-per-node", help="Devices per node with --accelerator.")]
InterNodeOpt = Annotated[Optional[float], typer.Option("--inter-node-gbps", help="Scale-out Gbit/s per device with --accelerator.")]


def cluster_from_options(cluster: str | None, accelerator: str | None, devices: int | None,
                         devices_per_node: int | None = None, inter_node_gbps: float | None = None,
                         default: str | None = None) -> Cluster:
    if not cluster and not accelerator and default:
        cluster = default
    return resolve_cluster(cluster, accelerator, devices, devices_per_node, inter_node_gbps)
