"""Helpers shared by the CLI verbs: output, formatting and the option types every verb uses."""

from __future__ import annotations

import math
import sys
from typing import Annotated, Any, Optional

import typer
from rich.console import Console

from dayzero.report.jsonable import dumps
from dayzero.specs.cluster import Cluster, resolve_cluster

console = Console()
err_console = Console(stderr=True)


def emit_json(obj: Any) -> None:
    """Print one JSON document on stdout (no rich markup, no wrapping)."""
    sys.stdout.write(dumps(obj) + "\n")


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

DeviceOpt = Annotated[Optional[str], typer.Option("--device", help="Device type to run on, e.g. cpu or npu (default: the current accelerator, else cpu).")]
BackendOpt = Annotated[Optional[str], typer.Option("--backend", help="Process-group backend, e.g. gloo (default: PyTorch's for the device: gloo on cpu, the vendor's on an accelerator).")]
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


# -- parallel layout options (memory, predict, train, validate) -------------------------------

TpOpt = Annotated[int, typer.Option("--tp", help="Tensor-parallel degree.")]
PpOpt = Annotated[int, typer.Option("--pp", help="Pipeline-parallel degree.")]
DpOpt = Annotated[Optional[int], typer.Option("--dp", help="Data-parallel degree (default: devices / (tp*pp*cp)).")]
CpOpt = Annotated[int, typer.Option("--cp", help="Context-parallel degree.")]
EpOpt = Annotated[int, typer.Option("--ep", help="Expert-parallel degree (folded over dp x cp).")]
EtpOpt = Annotated[int, typer.Option("--etp", help="Tensor-parallel degree inside experts.")]
VppOpt = Annotated[int, typer.Option("--vpp", help="Virtual pipeline stages per rank (interleaved 1F1B).")]
MbsOpt = Annotated[int, typer.Option("--mbs", help="Micro-batch size (sequences).")]
GbsOpt = Annotated[Optional[int], typer.Option("--gbs", help="Global batch size (sequences; default mbs*dp).")]
SeqOpt = Annotated[int, typer.Option("--seq", help="Sequence length (tokens).")]
ZeroOpt = Annotated[int, typer.Option("--zero", min=0, max=3, help="ZeRO stage: 0 none, 1 optimizer, 2 +gradients, 3 +parameters.")]
RecomputeOpt = Annotated[str, typer.Option("--recompute", help="Activation recompute: none | selective | full.")]
SpOpt = Annotated[bool, typer.Option("--sequence-parallel/--no-sequence-parallel", help="Megatron sequence parallelism with TP.")]
PrecisionOpt = Annotated[str, typer.Option("--precision", help="Compute precision: bf16 | fp8.")]
ScheduleOpt = Annotated[Optional[str], typer.Option("--schedule", help="Pipeline schedule: 1f1b | interleaved | gpipe.")]
SplitOpt = Annotated[Optional[str], typer.Option("--layer-split", help="Layers per (virtual) stage, comma-separated, e.g. 5,6,6,5.")]


def parallel_from_options(devices: int | None, tp: int = 1, pp: int = 1, dp: int | None = None, cp: int = 1,
                          ep: int = 1, etp: int = 1, vpp: int = 1, mbs: int = 1, gbs: int | None = None,
                          seq: int = 4096, zero: int = 1, recompute: str = "none", sequence_parallel: bool = False,
                          precision: str = "bf16", schedule: str | None = None, layer_split: str | None = None,
                          rank_order: str | None = None):
    """Build a ParallelConfig from CLI options; ``--dp`` defaults to devices / (tp*pp*cp). The
    layout is checked where it is used (``ParallelConfig.validate``)."""
    from dayzero.errors import LayoutError
    from dayzero.specs.parallel import ParallelConfig

    if dp is None:
        if devices is None:
            dp = 1
        else:
            denom = tp * pp * cp
            if denom < 1 or devices % denom:
                raise LayoutError(f"{devices} devices are not divisible by tp*pp*cp = {tp}*{pp}*{cp} = {denom}; "
                                  "choose degrees whose product divides the device count, or give --dp")
            dp = devices // denom
    split = None
    if layer_split:
        try:
            split = tuple(int(x) for x in layer_split.split(","))
        except ValueError:
            raise LayoutError(f"--layer-split {layer_split!r}: expected comma-separated integers, e.g. 5,6,6,5") from None
    extra = {"schedule": schedule} if schedule else {}  # ParallelConfig's default: interleaved when vpp > 1
    if rank_order:
        extra["rank_order"] = rank_order
    return ParallelConfig(tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, etp=etp, vpp=vpp, mbs=mbs, gbs=gbs or 0, seq=seq,
                          zero=zero, recompute=recompute, sequence_parallel=sequence_parallel, precision=precision,
                          layer_split=split, **extra)
