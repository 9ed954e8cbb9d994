"""Accelerators, from the shipped catalog (``presets/data/hardware_catalog.json``).

Units inside dayzero are SI base units: bytes, bytes/s, FLOP/s, seconds. The catalog's TB/s,
GB/s, Gbit/s and TFLOP/s are converted once, here. Every number keeps the catalog's sources
(``dayzero hardware NAME --json`` shows them).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Literal

from dayzero.errors import ConfigError
from dayzero.specs.presets import reference_data

Topology = Literal["switch", "mesh", "torus"]
PRECISIONS = ("fp32", "tf32", "fp16", "bf16", "fp8", "fp4")

# Latencies when the catalog has none: NVLink-class 10 us, InfiniBand/RoCE 20 us (Calculon's
# a100_80g.json / h100_80g_nvl8.json values as quoted in the catalog's simulator_params).
DEFAULT_INTRA_LATENCY_S = 10e-6
DEFAULT_INTER_LATENCY_S = 20e-6
# Device-memory "GB" are binary: HBM stacks come in powers of two of GiB, and nvidia-smi reports
# 81559 MiB on an "H100 80GB HBM3" (80 GiB = 81920 MiB, less 361 MiB the driver keeps; nvidia-smi
# output in many public issue reports). ``hbm_gb`` in the catalog, cluster files and profiles is GiB.
HBM_GB = 2**30


@dataclass(frozen=True)
class Accelerator:
    id: str
    name: str
    vendor: str
    peak_flops: dict[str, float]  # precision -> dense FLOP/s
    hbm_bytes: int
    hbm_bw: float | None  # bytes/s (None: not published)
    devices_per_node: int
    scaleup_domain: int  # devices behind one scale-up fabric (72 for GB200 NVL72)
    topology: Topology
    intra_node_bw: float | None  # bytes/s per device per direction, aggregate over its links
    intra_node_p2p_bw: float | None  # bytes/s per direction to one peer (mesh: one link)
    inter_node_bw: float | None  # bytes/s per device per direction (scale-out NIC)
    tdp_w: float | None = None
    gemm_flops_measured: dict[str, float] = field(default_factory=dict)  # best measured GEMM FLOP/s
    allreduce_busbw_intra: float | None = None  # measured intra-node all-reduce bus bandwidth, bytes/s
    intra_latency_s: float = DEFAULT_INTRA_LATENCY_S
    inter_latency_s: float = DEFAULT_INTER_LATENCY_S
    assumptions: tuple[str, ...] = ()
    sources: tuple[str, ...] = ()
    # measured memory overheads of a profiled machine (dayzero calibrate); None: the planner's defaults
    runtime_context_bytes: int | None = None
    comm_buffer_bytes: int | None = None
    dies_per_package: int = 1  # compute dies a device packages (the catalog's dies_per_package; 910C: 2)

    def peak(self, precision: str = "bf16") -> float:
        """Dense peak FLOP/s; FP8 falls back to BF16 on cards without FP8 units, FP4 (NVFP4/MXFP4)
        to FP8, then BF16."""
        p = self.peak_flops.get(precision)
        if p is None and precision == "fp4":
            p = self.peak_flops.get("fp8")
        if p is None and precision in ("fp8", "fp4"):
            p = self.peak_flops.get("bf16")
        if p is None:
            raise ConfigError(self.id, f"{precision}_tflops", "no peak throughput known for this precision")
        return p

    def require_native(self, precision: str, flag: str = "--precision") -> None:
        """Refuse a GEMM precision this card has no units for: :meth:`peak` would fall back to a
        slower one and label its times with the precision asked for."""
        if precision != "bf16" and precision not in self.peak_flops:
            have = ", ".join(p for p in ("bf16", "fp8", "fp4") if p in self.peak_flops or p == "bf16")
            raise ConfigError(flag, None, f"{precision}: {self.name} has no {precision.upper()} units (catalog peaks: "
                              f"{have}); use --precision {'fp8' if 'fp8' in self.peak_flops else 'bf16'} or another "
                              "card")

    def gemm_efficiency(self, precision: str = "bf16") -> float | None:
        """Measured best GEMM throughput over peak, where the catalog has a measurement."""
        m = self.gemm_flops_measured.get(precision)
        return None if m is None else m / self.peak(precision)

    def summary(self) -> dict:
        return {"id": self.id, "name": self.name, "vendor": self.vendor,
                "peak_tflops": {k: v / 1e12 for k, v in self.peak_flops.items()},
                "hbm_gib": self.hbm_bytes / HBM_GB,
                "hbm_tbytes_per_s": None if self.hbm_bw is None else self.hbm_bw / 1e12,
                "devices_per_node": self.devices_per_node, "scaleup_domain": self.scaleup_domain,
                "topology": self.topology,
                "intra_node_gbytes_per_s": _g(self.intra_node_bw),
                "intra_node_p2p_gbytes_per_s": _g(self.intra_node_p2p_bw),
                "inter_node_gbytes_per_s": _g(self.inter_node_bw), "tdp_w": self.tdp_w,
                "gemm_tflops_measured": {k: v / 1e12 for k, v in self.gemm_flops_measured.items()},
                "allreduce_busbw_intra_gbytes_per_s": _g(self.allreduce_busbw_intra),
                "assumptions": list(self.assumptions), "sources": list(self.sources)}


def _g(x: float | None) -> float | None:
    return None if x is None else x / 1e9


# -- catalog -----------------------------------------------------------------------------------

# Short names users type, mapped to catalog ids (matching is case-insensitive, '_' == '-' == ' ').
ALIASES = {
    "a100": "nvidia_a100_80gb_sxm", "a100-80gb": "nvidia_a100_80gb_sxm", "a100-40gb": "nvidia_a100_40gb_sxm",
    "h100": "nvidia_h100_sxm", "h100-sxm": "nvidia_h100_sxm", "h800": "nvidia_h800_sxm", "h200": "nvidia_h200_sxm",
    "b200": "nvidia_b200_hgx", "gb200": "nvidia_gb200_per_gpu", "b300": "nvidia_b300_hgx",
    "gb300": "nvidia_gb300_per_gpu",
    "mi250x": "amd_mi250x", "mi300x": "amd_mi300x", "mi325x": "amd_mi325x", "mi355x": "amd_mi355x",
    "gaudi2": "intel_gaudi2", "gaudi3": "intel_gaudi3",
    "tpu-v4": "google_tpu_v4", "tpu-v5e": "google_tpu_v5e", "tpu-v5p": "google_tpu_v5p", "tpu-v6e": "google_tpu_v6e",
    "910b": "huawei_ascend_910b", "ascend-910b": "huawei_ascend_910b", "910b3": "huawei_ascend_910b",
    "910b2": "huawei_ascend_910b2", "910b4": "huawei_ascend_910b4", "910c": "huawei_ascend_910c",
    "910c-die": "huawei_ascend_910c_die",
    "ascend-910c": "huawei_ascend_910c", "mlu370": "cambricon_mlu370_x8", "mlu290": "cambricon_mlu290_m5",
    "br100": "biren_br100", "s4000": "moorethreads_mtt_s4000", "mtt-s4000": "moorethreads_mtt_s4000",
}


def _norm(name: str) -> str:
    return re.sub(r"[\s_]+", "-", name.strip().lower())


def _topology(text: str) -> Topology:
    t = (text or "").lower()
    if "torus" in t:
        return "torus"
    if "mesh" in t:
        return "mesh"
    return "switch"


def _from_entry(e: dict) -> Accelerator:
    peak = {p: e[f"{p}_tflops"] * 1e12 for p in PRECISIONS if e.get(f"{p}_tflops")}
    assumptions = []
    if "bf16" not in peak and "fp16" in peak:
        peak["bf16"] = peak["fp16"]
        assumptions.append("bf16 peak taken equal to the published fp16 peak (no bf16 figure published)")
    intra = e.get("intra_node_gbytes_per_s_unidir")
    p2p = e.get("intra_node_p2p_gbytes_per_s_unidir")
    if intra is None and e["id"] == "huawei_ascend_910b":
        # Catalog note: 7 HCCS links, 392 GB/s aggregate, 56 GB/s per peer; direction unstated.
        intra, p2p = 392.0, 56.0
        assumptions.append("HCCS 392 GB/s aggregate / 56 GB/s per peer taken as per direction (catalog note)")
    if p2p is None and intra is not None:
        p2p = intra
    measured = e.get("measured") or {}
    gemm = {}
    if measured.get("mamf_bf16_tflops"):
        gemm["bf16"] = measured["mamf_bf16_tflops"] * 1e12
    if measured.get("mamf_fp8_tflops"):
        gemm["fp8"] = measured["mamf_fp8_tflops"] * 1e12
    busbw = measured.get("allreduce_busbw_intra_node_ring_gbytes_per_s")
    inter = e.get("inter_node_gbits_per_s_per_device")
    dpn = e.get("devices_per_node") or 8
    return Accelerator(
        id=e["id"], name=e["name"], vendor=e.get("vendor", ""), peak_flops=peak,
        hbm_bytes=int(e["hbm_gb"] * HBM_GB),
                       hbm_bw=None if e.get("hbm_tbytes_per_s") is None else e["hbm_tbytes_per_s"] * 1e12,
                       devices_per_node=dpn,
        scaleup_domain=e.get("scaleup_domain_devices") or dpn, topology=_topology(e.get("topology", "")),
        intra_node_bw=None if intra is None else intra * 1e9, intra_node_p2p_bw=None if p2p is None else p2p * 1e9,
        inter_node_bw=None if inter is None else inter * 1e9 / 8, tdp_w=e.get("tdp_w"),
        gemm_flops_measured=gemm, allreduce_busbw_intra=None if busbw is None else busbw * 1e9,
        assumptions=tuple(assumptions), sources=tuple(e.get("sources", [])),
        dies_per_package=int(e.get("dies_per_package") or 1))


@lru_cache(maxsize=1)
def catalog() -> dict[str, Accelerator]:
    """All accelerators, by catalog id."""
    entries = json.loads(reference_data("hardware_catalog.json").read_text())
    return {e["id"]: _from_entry(e) for e in entries}


def get_accelerator(name: str) -> Accelerator:
    """Find an accelerator by catalog id, alias (``h100``, ``910b``, ...) or its full name."""
    cat = catalog()
    key = _norm(name)
    for acc_id, acc in cat.items():
        if key in (_norm(acc_id), _norm(acc.name)):
            return acc
    if key in ALIASES:
        return cat[ALIASES[key]]
    found = resolve_accelerator(name)
    if found is not None:
        return found
    from dayzero.names import nearest

    near = accelerator_names(nearest(name, [*ALIASES, *cat], n=6))[:3]
    known = f"did you mean {', '.join(near)}?" if near else f"known: {', '.join(sorted(ALIASES))}"
    raise ConfigError("--accelerator", None, f"unknown accelerator {name!r}; {known} ('dayzero hardware' lists "
                      "every catalog id)")


def accelerator_names(names: list[str]) -> list[str]:
    """``names`` (aliases and catalog ids) with one name per accelerator, the first given."""
    seen: set[str] = set()
    out = []
    for n in names:
        acc_id = ALIASES.get(n, n)
        if acc_id not in seen:
            seen.add(acc_id)
            out.append(n)
    return out


def resolve_accelerator(text: str) -> Accelerator | None:
    """Best-effort mapping of free text ("H100 80GB SXM5 (DGX H100)", "GB200 (DGX-GB200)") to
    the catalog: the longest alias that appears as a whole token wins; memory size decides
    between variants (A100 40GB vs 80GB)."""
    t = _norm(text)
    tokens = set(re.split(r"[^a-z0-9]+", t))
    best = None
    for alias, acc_id in ALIASES.items():
        parts = alias.split("-")
        if all(p in tokens for p in parts) or alias.replace("-", "") in tokens:
            if best is None or len(alias) > len(best[0]):
                best = (alias, acc_id)
    if best is None:
        return None
    acc = catalog()[best[1]]
    if acc.id.startswith("nvidia_a100") and "40gb" in tokens:
        acc = catalog()["nvidia_a100_40gb_sxm"]
    return acc
