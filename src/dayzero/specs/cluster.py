"""Clusters: nodes of accelerators joined by interconnect tiers.

A cluster is ``nodes x devices_per_node`` devices of one accelerator. Its interconnect is a list
of tiers, innermost first: the scale-up fabric (NVLink/NVSwitch, HCCS full mesh, Infinity
Fabric, an NVL72 rack) and the scale-out network (InfiniBand / RoCE). A process group that spans
only devices inside one scale-up domain uses tier 0; anything wider crosses tier 1.

YAML schema (``--cluster FILE.yaml``; every field but ``accelerator`` and ``nodes`` optional)::

    name: my-cluster
    accelerator: h100            # catalog id or alias (dayzero hardware)
    nodes: 128
    devices_per_node: 8          # default: the accelerator's
    scaleup_domain: 8            # devices sharing the scale-up fabric (default: the accelerator's)
    topology: switch             # switch | mesh | torus (scale-up fabric)
    intra_node_gbytes_per_s: 450 # per device per direction (aggregate of its links)
    intra_node_p2p_gbytes_per_s: 450  # per direction to one peer (mesh: one link)
    inter_node_gbytes_per_s: 50  # per device per direction (its NIC)
    intra_latency_us: 10
    inter_latency_us: 20
    peak_tflops: {bf16: 989}     # override per precision
    hbm_gb: 80
    efficiency: {gemm: 0.8, intra: 0.8, inter: 0.9}   # calibrated factors (dayzero calibrate)
    runtime_context_mib: 520     # measured memory a rank holds before its first tensor
    comm_buffer_mib: 300         # measured memory per communicator
    host:                        # the host side (default: the accelerator's system, specs/host.py)
      memory_gb: 250             # host memory per device, decimal GB (or memory_gb_per_node: 2000)
      link_gbytes_per_s: 63      # device <-> host memory per device per direction (PCIe Gen5 x16)
      memory_gbytes_per_s: 76.8  # the device's share of host DRAM bandwidth (host Adam)

A machine the catalog does not know (a CPU host, a new card) is defined inline: ``accelerator``
may be a mapping (:class:`AcceleratorFile`) instead of a catalog name. ``dayzero calibrate``
writes such profiles, with its raw microbenchmark tables under ``measurements`` (kept for
reports, not read by the planner)::

    accelerator:
      id: cpu-host
      name: "AMD EPYC, 2 cores shared by 8 gloo ranks"
      peak_tflops: {fp32: 0.012, bf16: 0.002}   # per rank, measured (dayzero calibrate)
      hbm_gb: 3.0                                # memory per rank
      hbm_tbytes_per_s: 0.004
      devices_per_node: 8
      intra_node_gbytes_per_s: 0.4
      runtime_context_mib: 310                   # resident bytes of a rank before any tensor
    nodes: 1
    measurements: {...}
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from dayzero.errors import ConfigError
from dayzero.inputs import load_yaml
from dayzero.specs.hardware import HBM_GB, Accelerator, get_accelerator
from dayzero.specs.host import FALLBACK, HostSpec, default_host, with_overrides

MAX_DEVICES = 2**20  # a cluster of a million devices is beyond any built; larger is a typo, not a plan
# Upper bounds of a cluster file's figures, each ~1,000x beyond today's hardware (GB200 NVL72: 2.5
# PFLOP/s BF16 dense, 192 GB HBM at 8 TB/s, 900 GB/s NVLink per direction): larger is a unit error.
PositiveFloat = Annotated[float, Field(gt=0, le=1e7)]  # TFLOP/s, GB/s: at most 10 EFLOP/s or 10 PB/s
BANDWIDTH = dict(gt=0, le=1e6)  # GB/s per device per direction
MIN_HBM_GB = 2**-10  # 1 MiB: no accelerator has less, and a smaller figure rounds to zero bytes of memory
LATENCY = dict(ge=0, le=1e6)  # microseconds
MIB = dict(ge=0, le=1e9)  # MiB per device


@dataclass(frozen=True)
class Tier:
    """One level of the interconnect."""

    name: str  # "scale-up" | "scale-out"
    size: int  # devices that share this tier's fabric (a node, an NVL72 rack, the whole cluster)
    bw: float  # bytes/s per device per direction
    p2p_bw: float  # bytes/s per direction between one pair of devices
    latency_s: float
    topology: Literal["switch", "mesh", "torus"]


@dataclass(frozen=True)
class Cluster:
    name: str
    accelerator: Accelerator
    nodes: int
    devices_per_node: int
    tiers: tuple[Tier, ...]
    efficiency: dict[str, float] = field(default_factory=dict)  # calibrated factors (gemm, intra, inter, ...)
    description: str = ""
    measurements: dict = field(default_factory=dict, compare=False)  # calibration tables of a profile
    host: HostSpec = FALLBACK  # each device's share of its host (specs/host.py; FALLBACK: all assumed)

    @property
    def devices(self) -> int:
        return self.nodes * self.devices_per_node

    @property
    def memory_bytes(self) -> int:
        return self.accelerator.hbm_bytes

    def tier_for_span(self, span: int) -> Tier:
        """The slowest tier a group crosses when its members lie within ``span`` consecutive ranks
        (ranks are packed: rank r lives on node r // devices_per_node)."""
        for tier in self.tiers:
            if span <= tier.size:
                return tier
        return self.tiers[-1]

    def summary(self) -> dict:
        return {"name": self.name, "accelerator": self.accelerator.id, "nodes": self.nodes,
                "devices_per_node": self.devices_per_node, "devices": self.devices,
                "memory_gib_per_device": self.memory_bytes / HBM_GB,
                "tiers": [{"name": t.name, "size": t.size, "gbytes_per_s": t.bw / 1e9,
                           "p2p_gbytes_per_s": t.p2p_bw / 1e9, "latency_us": t.latency_s * 1e6,
                           "topology": t.topology} for t in self.tiers],
                "efficiency": dict(self.efficiency), "description": self.description, "host": self.host.to_dict()}


class AcceleratorFile(BaseModel):
    """An accelerator defined inside a cluster YAML (units as in the catalog: TFLOP/s, GB, TB/s,
    GB/s per direction, microseconds)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True)
    id: str
    name: str = ""
    vendor: str = ""
    peak_tflops: dict[str, PositiveFloat]
    hbm_gb: float = Field(ge=MIN_HBM_GB, le=1e6)
    hbm_tbytes_per_s: float = Field(gt=0, le=1e4)
    devices_per_node: int = Field(default=1, ge=1, le=MAX_DEVICES)
    scaleup_domain: int | None = Field(default=None, ge=1, le=MAX_DEVICES)
    topology: Literal["switch", "mesh", "torus"] = "switch"
    intra_node_gbytes_per_s: float | None = Field(default=None, **BANDWIDTH)
    intra_node_p2p_gbytes_per_s: float | None = Field(default=None, **BANDWIDTH)
    inter_node_gbytes_per_s: float | None = Field(default=None, **BANDWIDTH)
    intra_latency_us: float | None = Field(default=None, **LATENCY)
    inter_latency_us: float | None = Field(default=None, **LATENCY)
    gemm_tflops_measured: dict[str, PositiveFloat] = Field(default_factory=dict)
    allreduce_busbw_intra_gbytes_per_s: float | None = Field(default=None, **BANDWIDTH)
    runtime_context_mib: float | None = Field(default=None, **MIB)
    comm_buffer_mib: float | None = Field(default=None, **MIB)
    sources: list[str] = Field(default_factory=list)

    def build(self) -> Accelerator:
        from dayzero.specs.hardware import DEFAULT_INTER_LATENCY_S, DEFAULT_INTRA_LATENCY_S

        peak = {k: v * 1e12 for k, v in self.peak_tflops.items()}
        if "bf16" not in peak:
            raise ConfigError(self.id, "peak_tflops.bf16", "an inline accelerator needs a bf16 peak (the planner's "
                              "default precision); give the measured rate of the dtype training runs in")
        mib = lambda x: None if x is None else int(x * 2**20)  # noqa: E731
        g = lambda x: None if x is None else x * 1e9  # noqa: E731
        return Accelerator(
            id=self.id, name=self.name or self.id, vendor=self.vendor, peak_flops=peak,
            hbm_bytes=int(self.hbm_gb * HBM_GB), hbm_bw=self.hbm_tbytes_per_s * 1e12,
            devices_per_node=self.devices_per_node, scaleup_domain=self.scaleup_domain or self.devices_per_node,
            topology=self.topology, intra_node_bw=g(self.intra_node_gbytes_per_s),
            intra_node_p2p_bw=g(self.intra_node_p2p_gbytes_per_s or self.intra_node_gbytes_per_s),
            inter_node_bw=g(self.inter_node_gbytes_per_s),
            gemm_flops_measured={k: v * 1e12 for k, v in self.gemm_tflops_measured.items()},
            allreduce_busbw_intra=g(self.allreduce_busbw_intra_gbytes_per_s),
            intra_latency_s=DEFAULT_INTRA_LATENCY_S if self.intra_latency_us is None else self.intra_latency_us * 1e-6,
            inter_latency_s=DEFAULT_INTER_LATENCY_S if self.inter_latency_us is None else self.inter_latency_us * 1e-6,
            runtime_context_bytes=mib(self.runtime_context_mib), comm_buffer_bytes=mib(self.comm_buffer_mib),
            sources=tuple(self.sources))


class HostFile(BaseModel):
    """A cluster file's ``host:`` section (decimal GB and GB/s per device; specs/host.py)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True)
    memory_gb: float | None = Field(default=None, gt=0, le=1e6)  # per device
    memory_gb_per_node: float | None = Field(default=None, gt=0, le=1e7)  # shared by devices_per_node
    link_gbytes_per_s: float | None = Field(default=None, **BANDWIDTH)  # per direction
    memory_gbytes_per_s: float | None = Field(default=None, **BANDWIDTH)


class ClusterFile(BaseModel):
    """The YAML schema above, validated."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True)
    name: str = "cluster"
    description: str = ""
    accelerator: str | AcceleratorFile
    nodes: int = Field(ge=1, le=MAX_DEVICES)
    devices_per_node: int | None = Field(default=None, ge=1, le=MAX_DEVICES)
    scaleup_domain: int | None = Field(default=None, ge=1, le=MAX_DEVICES)
    topology: Literal["switch", "mesh", "torus"] | None = None
    intra_node_gbytes_per_s: float | None = Field(default=None, **BANDWIDTH)
    intra_node_p2p_gbytes_per_s: float | None = Field(default=None, **BANDWIDTH)
    inter_node_gbytes_per_s: float | None = Field(default=None, **BANDWIDTH)
    intra_latency_us: float | None = Field(default=None, **LATENCY)
    inter_latency_us: float | None = Field(default=None, **LATENCY)
    peak_tflops: dict[str, PositiveFloat] | None = None
    hbm_gb: float | None = Field(default=None, ge=MIN_HBM_GB, le=1e6)
    hbm_tbytes_per_s: float | None = Field(default=None, gt=0, le=1e4)
    gemm_tflops_measured: dict[str, PositiveFloat] | None = None
    efficiency: dict[str, float] = Field(default_factory=dict)  # ranges: planner/perf/calibration.py CONSTANT_BOUNDS
    runtime_context_mib: float | None = Field(default=None, **MIB)  # measured per device (dayzero calibrate)
    comm_buffer_mib: float | None = Field(default=None, **MIB)
    measurements: dict | None = None  # raw calibration tables (dayzero calibrate); informational
    host: HostFile | None = None  # the host side; default: the accelerator's system (specs/host.py)


def build_cluster(accelerator: str | Accelerator, devices: int, devices_per_node: int | None = None,
                  inter_node_gbytes_per_s: float | None = None, name: str | None = None,
                  intra_node_gbytes_per_s: float | None = None) -> Cluster:
    """A standard cluster of ``devices`` cards (``--accelerator NAME --devices N``). A given
    ``intra_node_gbytes_per_s`` (per device per direction) replaces the scale-up fabric's rate and
    scales its per-peer rate in proportion (a mesh keeps its shape)."""
    acc = accelerator if isinstance(accelerator, Accelerator) else get_accelerator(accelerator)
    p2p = None
    if intra_node_gbytes_per_s is not None:
        if not (math.isfinite(intra_node_gbytes_per_s) and intra_node_gbytes_per_s > 0):
            raise ConfigError("intra_node_gbytes_per_s", None,
                              f"must be a positive bandwidth, got {intra_node_gbytes_per_s:g}")
        if acc.intra_node_bw and acc.intra_node_p2p_bw:
            p2p = intra_node_gbytes_per_s * acc.intra_node_p2p_bw / acc.intra_node_bw
    if devices_per_node is not None and devices_per_node < 1:
        raise ConfigError("--devices-per-node", None, f"must be >= 1, got {devices_per_node}")
    dpn = devices_per_node or acc.devices_per_node
    if not 1 <= devices <= MAX_DEVICES:
        raise ConfigError("--devices", None, f"must be in [1, {MAX_DEVICES:,}], got {devices}")
    bw = inter_node_gbytes_per_s
    if bw is not None and not (math.isfinite(bw) and 0 < bw <= BANDWIDTH["le"]):
        raise ConfigError("--inter-node-gbps", None, f"must be a positive bandwidth of at most {BANDWIDTH['le'] * 8:g} "
                          f"Gbit/s per device, got {inter_node_gbytes_per_s * 8:g}")
    if devices < dpn:
        dpn = devices
    if devices % dpn:
        raise ConfigError("--devices", None, f"{devices} devices is not a whole number of {dpn}-device nodes; "
                          f"use a multiple of {dpn} or set --devices-per-node")
    try:
        spec = ClusterFile(name=name or f"{acc.id}-{devices}", accelerator=acc.id, nodes=devices // dpn,
                           devices_per_node=dpn, inter_node_gbytes_per_s=inter_node_gbytes_per_s,
                           intra_node_gbytes_per_s=intra_node_gbytes_per_s, intra_node_p2p_gbytes_per_s=p2p)
    except ValidationError as e:  # the same bounds as a cluster file's, named as the flags that set them
        err = e.errors()[0]
        field_name = str(err["loc"][0]) if err["loc"] else ""
        flag = {"inter_node_gbytes_per_s": "--inter-node-gbps"}.get(field_name, field_name or "cluster")
        got = err.get("input")
        if field_name == "inter_node_gbytes_per_s" and isinstance(got, (int, float)):
            got = got * 8  # the flag is in Gbit/s
        raise ConfigError(flag, None, f"{err['msg']} (got {got!r})") from None
    return _from_file(spec, acc)


def with_nodes(cluster: Cluster, nodes: int) -> Cluster:
    """``cluster`` with ``nodes`` nodes of the same devices, fabrics, host and calibration: the
    scale-up domain as the cluster has it (the card's own where one node bounded it), a scale-out
    tier over all devices at the cluster's rate (the card's where it had none). ConfigError when
    the card has no scale-out rate to add a tier with, or past :data:`MAX_DEVICES`."""
    devices = nodes * cluster.devices_per_node
    if not 1 <= devices <= MAX_DEVICES:
        raise ConfigError(cluster.name, "nodes", f"{devices:,} devices is outside [1, {MAX_DEVICES:,}]")
    acc, up = cluster.accelerator, cluster.tiers[0]
    bounded = len(cluster.tiers) == 1 and up.size == cluster.devices  # one node's devices were the domain
    domain = min(max(acc.scaleup_domain, cluster.devices_per_node) if bounded else up.size, devices)
    tiers = [replace(up, size=domain)]
    if devices > domain:
        if len(cluster.tiers) > 1:
            tiers.append(replace(cluster.tiers[-1], size=devices))
        elif acc.inter_node_bw is None:
            raise ConfigError(cluster.name, "inter_node_gbytes_per_s", f"the catalog has no inter-node bandwidth "
                              f"for {acc.id}; set it in a cluster YAML (or --inter-node-gbps)")
        else:
            tiers.append(Tier("scale-out", devices, acc.inter_node_bw, acc.inter_node_bw, acc.inter_latency_s,
                              "switch"))
    return replace(cluster, nodes=nodes, tiers=tuple(tiers))


def _from_file(f: ClusterFile, acc: Accelerator | None = None) -> Cluster:
    if acc is None:
        acc = f.accelerator.build() if isinstance(f.accelerator, AcceleratorFile) else get_accelerator(f.accelerator)
    overrides = {}
    if f.peak_tflops:
        overrides["peak_flops"] = {**acc.peak_flops, **{k: v * 1e12 for k, v in f.peak_tflops.items()}}
    if f.gemm_tflops_measured:
        overrides["gemm_flops_measured"] = {**acc.gemm_flops_measured,
                                            **{k: v * 1e12 for k, v in f.gemm_tflops_measured.items()}}
    if f.hbm_gb:
        overrides["hbm_bytes"] = int(f.hbm_gb * HBM_GB)
    if f.hbm_tbytes_per_s:
        overrides["hbm_bw"] = f.hbm_tbytes_per_s * 1e12
    if f.runtime_context_mib is not None:
        overrides["runtime_context_bytes"] = int(f.runtime_context_mib * 2**20)
    if f.comm_buffer_mib is not None:
        overrides["comm_buffer_bytes"] = int(f.comm_buffer_mib * 2**20)
    if overrides:
        acc = replace(acc, **overrides)
    dpn = f.devices_per_node or acc.devices_per_node
    devices = f.nodes * dpn
    if devices > MAX_DEVICES:
        raise ConfigError(f.name, "nodes", f"{f.nodes:,} nodes x {dpn} devices = {devices:,} exceeds {MAX_DEVICES:,} "
                                           "devices")
    domain = min(f.scaleup_domain or max(acc.scaleup_domain, dpn), devices)
    intra = (f.intra_node_gbytes_per_s * 1e9) if f.intra_node_gbytes_per_s else acc.intra_node_bw
    p2p = (f.intra_node_p2p_gbytes_per_s * 1e9) if f.intra_node_p2p_gbytes_per_s else acc.intra_node_p2p_bw
    inter = (f.inter_node_gbytes_per_s * 1e9) if f.inter_node_gbytes_per_s else acc.inter_node_bw
    if intra is None:
        raise ConfigError(f.name, "intra_node_gbytes_per_s", f"the catalog has no intra-node bandwidth for "
                          f"{acc.id}; set it in a cluster YAML")
    if inter is None and devices > domain:
        raise ConfigError(f.name, "inter_node_gbytes_per_s", f"the catalog has no inter-node bandwidth for "
                          f"{acc.id}; set it in a cluster YAML (or --inter-node-gbps)")
    intra_lat = f.intra_latency_us * 1e-6 if f.intra_latency_us is not None else acc.intra_latency_s
    inter_lat = f.inter_latency_us * 1e-6 if f.inter_latency_us is not None else acc.inter_latency_s
    tiers = [Tier("scale-up", domain, intra, p2p or intra, intra_lat, f.topology or acc.topology)]
    if devices > domain:
        tiers.append(Tier("scale-out", devices, inter, inter, inter_lat, "switch"))
    host = default_host(acc.id)
    if f.host is not None:
        host = with_overrides(host, f.name, dpn, **f.host.model_dump())
    return Cluster(name=f.name, accelerator=acc, nodes=f.nodes, devices_per_node=dpn, tiers=tuple(tiers),
                   efficiency=dict(f.efficiency), description=f.description, measurements=dict(f.measurements or {}),
                   host=host)


def load_cluster_yaml(path: str | Path) -> Cluster:
    p = Path(path)
    data = load_yaml(p, "use a preset from 'dayzero hardware' or a YAML file")
    return cluster_from_dict(data, str(p))


def cluster_from_dict(data: object, source: str) -> Cluster:
    if not isinstance(data, dict):
        raise ConfigError(source, None, "expected a mapping of cluster fields (see 'dayzero hardware --help')")
    try:
        f = ClusterFile.model_validate(data)
    except ValidationError as e:
        errors = e.errors()
        if isinstance(data.get("accelerator"), dict):  # an inline accelerator: skip the "not a name" branch
            errors = [x for x in errors if tuple(x["loc"][:2]) != ("accelerator", "str")] or errors
        err = errors[0]
        loc = [str(x) for x in err["loc"] if x != "AcceleratorFile"]
        field_name = ".".join(loc) or None
        raise ConfigError(source, field_name, f"{err['msg']} (got {err.get('input')!r})") from None
    return _from_file(f)


# -- presets -----------------------------------------------------------------------------------

@lru_cache(maxsize=1)
def cluster_presets() -> dict[str, Path]:
    base = resources.files("dayzero.specs.presets") / "clusters"
    return {p.name[:-5]: Path(str(p)) for p in base.iterdir() if p.name.endswith(".yaml")}


def get_cluster(name_or_path: str) -> Cluster:
    presets = cluster_presets()
    if name_or_path in presets:
        return load_cluster_yaml(presets[name_or_path])
    p = Path(name_or_path)
    if p.suffix in (".yaml", ".yml") or p.exists():
        return load_cluster_yaml(p)
    from dayzero.names import nearest

    near = nearest(name_or_path, presets)
    known = f"did you mean {', '.join(near)}?" if near else f"presets: {', '.join(sorted(presets))}"
    raise ConfigError("--cluster", None, f"unknown cluster {name_or_path!r}; {known}; or a YAML file, or "
                      "--accelerator NAME --devices N")


def resolve_cluster(cluster: str | None, accelerator: str | None, devices: int | None,
                    devices_per_node: int | None = None, inter_node_gbps: float | None = None) -> Cluster:
    """The CLI's cluster options, in one place."""
    if accelerator:
        if not devices:
            raise ConfigError("--devices", None, "is required with --accelerator")
        return build_cluster(accelerator, devices, devices_per_node,
                             None if inter_node_gbps is None else inter_node_gbps / 8)
    if cluster:
        return get_cluster(cluster)
    raise ConfigError("--cluster", None, "give --cluster PRESET|FILE.yaml or --accelerator NAME --devices N")
