"""Efficiency constants of the performance model and the hardware rates they produce.

Two kinds of numbers turn FLOPs and bytes into seconds:

* **Measured hardware figures** from the catalog: peak FLOP/s per precision, best measured GEMM
  throughput (MAMF), intra-node all-reduce bus bandwidth, HBM bandwidth, link bandwidths and
  latencies. Where the catalog has no measurement the median ratio over the catalog's measured
  accelerators is used (GEMM: 0.78 of peak; scale-up collectives: 0.78 of nominal), and the
  scale-out efficiency is Calculon's 0.9 for InfiniBand (catalog ``simulator_params``).
* **A few fitted constants** (:class:`PerfConstants`): how much of the best measured GEMM rate
  a training step achieves, per precision; the GEMM size at which efficiency halves; FlashAttention's
  fraction of peak; the ratio of real to counted bytes in memory-bound kernels; a fixed cost
  per layer and micro-batch (kernel launches). Their defaults are fitted by
  ``benchmarks/fit_backtest.py`` on the fit half of ``published_runs_dev.csv`` (see
  docs/performance.md); a calibration file (JSON or YAML with the same field names) or a cluster
  file's ``efficiency`` mapping overrides them.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from functools import lru_cache
from pathlib import Path

import numpy as np

from dayzero.errors import ConfigError
from dayzero.inputs import parse_json, parse_yaml, read_text
from dayzero.planner.perf.collectives import Link
from dayzero.planner.perf.topology import scaleup_domain
from dayzero.specs.cluster import Cluster
from dayzero.specs.hardware import catalog
from dayzero.specs.parallel import PRECISIONS

DEFAULT_INTER_EFF = 0.9  # Calculon systems/h100_80g_nvl8.json: IB tier efficiency 0.9 (catalog simulator_params)


@dataclass(frozen=True)
class PerfConstants:
    """Fitted efficiency constants. Defaults: fit on the even-id half of published_runs_dev.csv
    (benchmarks/fit_backtest.py, inside the physical bounds of CONSTANT_BOUNDS; rows predicted with
    the fastest recompute their memory allows, Megatron's recompute modules included
    (planner.backtest.row_memory), and the MoE dispatch's host sync (``moe_sync_s``), 447 rows: fit-half
    MAPE 8.2%, held-out half 7.7%; 300 Nelder-Mead steps, 2026-12-03). ``memory_scale`` 1.85:
    elementwise kernels move their bytes at about 54 % of the HBM peak."""

    gemm_scale_bf16: float = 0.8787  # training GEMM rate / best measured GEMM rate (MAMF), BF16
    gemm_scale_fp8: float = 0.9989  # same for FP8 GEMMs (Transformer Engine, MXFP8)
    gemm_scale_fp4: float = 0.6517  # same for NVFP4 GEMMs, relative to the measured-ratio FP4 peak
    moe_gemm_scale: float = 0.7801  # routed-expert (grouped) GEMM rate / dense GEMM rate
    gemm_half_dim: float = 36.26  # GEMM efficiency = d / (d + half_dim), d its smallest dimension
    attention_eff: float = 0.3359  # fused attention forward+backward, fraction of the BF16 peak
    memory_scale: float = 1.85  # real / counted bytes of memory-bound kernels (norms, casts, permutes)
    layer_overhead_s: float = 0.001429  # per layer per micro-batch, forward+backward (kernel launches)
    moe_expert_overhead_s: float = 0.0002286  # per local expert per MoE layer per micro-batch: per-expert
    #                                      kernels (weight casts, GEMM setup, gradient buffers)
    # per MoE layer per forward (and per recomputed forward of the MoE module), with the EP split-size
    # exchange (planner.perf.comm): the host round trip before the dispatch. A dropless dispatcher needs
    # the per-rank row counts on the host before the EP all-to-all and the grouped GEMM (split sizes,
    # tokens_per_expert as a host list): Megatron-Core MoEAlltoAllTokenDispatcher.preprocess copies
    # them device-to-host and synchronises at its cuda_sync_point ("before_ep_alltoall" when
    # dropless with ep > 1, megatron/core/transformer/moe/token_dispatcher.py), which drains the
    # CPU's launch queue: the kernels after it start only as fast as the host launches them, unless
    # another micro-batch's work is queued (EP overlap), which then hides it as it hides the all-to-all
    moe_sync_s: float = 0.0006195
    flash2_max_tflops: float = 170.3  # FlashAttention-2 kernels (pre-Hopper MMA) saturate near this;
    #                                   the FA3 paper (Shah et al. 2024) measures FA2 at 35-40 % of an H100
    intra_eff: float | None = None  # scale-up collective efficiency (None: catalog busbw / nominal)
    inter_eff: float = DEFAULT_INTER_EFF  # scale-out collective efficiency
    optimizer_bytes_per_param: float = 30.0  # Adam: read/write fp32 master, m, v (24) + fp32 grad (4) + bf16 param (2)
    # every GEMM's rate times this, after the cluster's measured efficiencies (1: none); the
    # sensitivity table's +-10 % GEMM efficiency (planner/search/sensitivity.py)
    gemm_eff_scale: float = 1.0
    # share of the SMs the EP dispatch/combine kernels hold while they overlap compute (the
    # overlapped compute runs at 1 - this, planner.perf.comm.overlapped_exposed): DeepSeek-V3 (arXiv
    # 2412.19437) sec. 3.2.2, 20 of the H800's 132 SMs; DeepEP's kernels take 20 SMs by default
    # (deepseek-ai/DeepEP deep_ep/buffer.py Buffer.num_sms = 20; Megatron-Core moe_deepep_num_sms = 20).
    # A cluster file sets its own as efficiency.comm_sm_fraction (its SMs over the device's).
    comm_sm_fraction: float = 20 / 132
    # relative std of one rank's step time, independent across ranks: the step waits for the slowest
    # rank at the gradient sync (planner.perf.scale_effects.straggler_factor); calibrated on the backtest
    # (benchmarks/bench_straggler.py, docs/performance.md "Effects of scale")
    step_jitter: float = 0.0

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def with_overrides(self, overrides: dict, source: str, fraction_max: float = 1.0) -> "PerfConstants":
        known = {f.name for f in fields(self)}
        bad = sorted(set(overrides) - known)
        if bad:
            raise ConfigError(source, bad[0], f"unknown efficiency constant; known: {', '.join(sorted(known))}")
        clean = {}
        for k, v in overrides.items():
            if v is None and k == "intra_eff":  # None: derive from the catalog
                clean[k] = None
                continue
            lo, hi, lo_open = CONSTANT_BOUNDS[k]
            clean[k] = check_bound(v, (lo, fraction_max if (lo, hi, lo_open) == FRACTION else hi, lo_open), source, k)
        return replace(self, **clean)


# Physical range of every constant (lo, hi, lo_open): efficiencies are fractions of a peak or of a
# measured rate, in (0, 1]; overheads are seconds, [0, 1]; half-dim a GEMM size; memory_scale a
# ratio of real to counted bytes; optimizer bytes per parameter a positive size.
FRACTION = (0.0, 1.0, True)
# A measured profile's peaks are fitted asymptotes of microbenchmarks, not datasheet figures: a
# training step may beat them (fused kernels, better shapes), up to this factor; beyond it is not
# physical (validate/fit.py bounds its search by the same factor).
MEASURED_FRACTION_MAX = 4.0
CONSTANT_BOUNDS = {
    "gemm_scale_bf16": FRACTION, "gemm_scale_fp8": FRACTION, "gemm_scale_fp4": FRACTION, "moe_gemm_scale": FRACTION,
    "attention_eff": FRACTION, "intra_eff": FRACTION, "inter_eff": FRACTION,
    "gemm_half_dim": (0.0, 1e5, False), "memory_scale": (0.0, 20.0, True),
    "layer_overhead_s": (0.0, 1.0, False), "moe_expert_overhead_s": (0.0, 1.0, False),
    "moe_sync_s": (0.0, 1.0, False),
    "flash2_max_tflops": (0.0, 1e5, True), "optimizer_bytes_per_param": (0.0, 1000.0, True),
    "gemm_eff_scale": (0.0, MEASURED_FRACTION_MAX, True), "comm_sm_fraction": (0.0, 1.0, False),
    "step_jitter": (0.0, 1.0, False),
}


def check_bound(v, bound: tuple[float, float, bool], source: str, key: str) -> float:
    """``v`` as a float inside ``bound`` (lo, hi, lo_open); a ConfigError naming the range otherwise."""
    import math

    lo, hi, lo_open = bound
    ok = not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v) and \
        (v > lo if lo_open else v >= lo) and v <= hi
    if not ok:
        raise ConfigError(source, key, f"expected a number in {'(' if lo_open else '['}{lo:g}, {hi:g}], got {v!r}")
    return float(v)


# Cluster YAML ``efficiency`` keys -> PerfConstants fields. ``gemm``/``gemm_bf16``/``gemm_fp8``/
# ``gemm_fp4`` are handled in :func:`rates`: there they are the large-GEMM fraction of the dense
# peak a calibration measured on this cluster, replacing catalog measurement x fitted scale.
CLUSTER_KEYS = {"moe_gemm": "moe_gemm_scale", "attention": "attention_eff", "memory_scale": "memory_scale",
                "intra": "intra_eff", "inter": "inter_eff", "layer_overhead_s": "layer_overhead_s",
                "moe_expert_overhead_s": "moe_expert_overhead_s", "moe_sync_s": "moe_sync_s",
                "gemm_half_dim": "gemm_half_dim",
                "optimizer_bytes_per_param": "optimizer_bytes_per_param", "comm_sm_fraction": "comm_sm_fraction",
                "step_jitter": "step_jitter"}
GEMM_KEYS = ("gemm", "gemm_bf16", "gemm_fp8", "gemm_fp4")


def load_calibration(path: str | Path, base: PerfConstants | None = None) -> PerfConstants:
    """Read a calibration file: a JSON or YAML mapping of PerfConstants fields (a ``constants``
    sub-mapping is accepted too, as ``dayzero backtest --fit`` writes)."""
    p = Path(path)
    text = read_text(p, "pass a calibration file: JSON or YAML efficiency constants")
    data = parse_yaml(text, str(p)) if p.suffix in (".yaml", ".yml") else parse_json(text, str(p))
    if isinstance(data, dict) and isinstance(data.get("constants"), dict):
        data = data["constants"]
    if not isinstance(data, dict):
        raise ConfigError(str(p), None, "expected a mapping of efficiency constants")
    return (base or PerfConstants()).with_overrides(data, str(p))


def constants_for(cluster: Cluster, base: PerfConstants | None = None) -> PerfConstants:
    """The constants with the cluster file's ``efficiency`` overrides applied."""
    base = base or PerfConstants()
    unknown = sorted(set(cluster.efficiency) - set(CLUSTER_KEYS) - set(GEMM_KEYS))
    if unknown:
        raise ConfigError(f"cluster {cluster.name}", f"efficiency.{unknown[0]}",
                          f"unknown efficiency key; known: {', '.join(sorted([*CLUSTER_KEYS, *GEMM_KEYS]))}")
    top = MEASURED_FRACTION_MAX if cluster.measurements else 1.0
    for k in GEMM_KEYS:  # fractions of the dense peak a calibration measured
        if k in cluster.efficiency:
            check_bound(cluster.efficiency[k], (0.0, top, True), f"cluster {cluster.name}", f"efficiency.{k}")
    over = {CLUSTER_KEYS[k]: v for k, v in cluster.efficiency.items() if k in CLUSTER_KEYS}
    return base.with_overrides(over, f"cluster {cluster.name}: efficiency", top) if over else base


@lru_cache(maxsize=1)
def catalog_medians() -> tuple[float, float]:
    """(median measured-GEMM / peak, median measured all-reduce busbw / nominal) over the catalog."""
    gemm, busbw = [], []
    for acc in catalog().values():
        for prec, flops in acc.gemm_flops_measured.items():
            if prec == "bf16":
                gemm.append(flops / acc.peak(prec))
        if acc.allreduce_busbw_intra and acc.intra_node_bw:
            busbw.append(acc.allreduce_busbw_intra / acc.intra_node_bw)
    return float(np.median(gemm)), float(np.median(busbw))


@dataclass(frozen=True)
class Rates:
    """What one device of a cluster achieves, with the constants applied."""

    peak: dict  # precision -> dense FLOP/s actually available (fallbacks applied)
    gemm_eff: dict  # precision -> fraction of that peak a large training GEMM reaches
    attention_flops: float  # FLOP/s of the fused attention kernel (BF16)
    flash2_flops: float  # FLOP/s of FlashAttention-2 (capped on Hopper and newer)
    hbm_bw: float  # bytes/s
    intra: Link
    inter: Link | None
    domain: int  # ranks per scale-up domain the job fills
    native: tuple[bool, bool, bool] = (True, True, True)  # bf16, fp8, fp4 units exist (else GEMMs fall back)
    comm_sm_fraction: float = 20 / 132  # PerfConstants.comm_sm_fraction
    moe_sync_s: float = 0.0  # PerfConstants.moe_sync_s
    fp8_scaling: str = "tensor"  # the FP8 recipe's scaling (planner.perf.fp8_scaling): tensor | block

    def gemm_rate(self, code):
        """Large-GEMM FLOP/s for precision codes (the grid's: 0 bf16, 1 fp8, 2 fp4; array in, array out)."""
        r = np.array([self.peak[p] * self.gemm_eff[p] for p in PRECISIONS])
        return r[np.asarray(code, dtype=int)]


def rates(cluster: Cluster, constants: PerfConstants) -> Rates:
    acc = cluster.accelerator
    gemm_median, busbw_median = catalog_medians()
    peak, eff = {}, {}
    scale = {"bf16": constants.gemm_scale_bf16, "fp8": constants.gemm_scale_fp8, "fp4": constants.gemm_scale_fp4}
    for p in PRECISIONS:
        used = p if p in acc.peak_flops else ("fp8" if p == "fp4" and "fp8" in acc.peak_flops else "bf16")
        peak[p] = acc.peak(used)
        measured = acc.gemm_efficiency(used) if used in acc.gemm_flops_measured else None
        if measured is None and used == "fp4":  # no FP4 GEMM measurement anywhere: use FP8's ratio
            measured = acc.gemm_efficiency("fp8") if "fp8" in acc.gemm_flops_measured else None
        eff[p] = (measured if measured is not None else gemm_median) * scale[used]
        measured_here = cluster.efficiency.get(f"gemm_{used}",
                                               cluster.efficiency.get("gemm") if used == "bf16" else None)
        if measured_here is not None:  # a calibration of this cluster: fraction of the dense peak
            eff[p] = float(measured_here)
        eff[p] *= constants.gemm_eff_scale
    if acc.hbm_bw is None:
        raise ConfigError(acc.id, "hbm_tbytes_per_s", "the catalog has no HBM bandwidth; set hbm_tbytes_per_s in a "
                                                      "cluster YAML")
    t0 = cluster.tiers[0]
    if constants.intra_eff is not None:
        intra_eff = constants.intra_eff
    elif acc.allreduce_busbw_intra and acc.intra_node_bw and t0.bw == acc.intra_node_bw:
        intra_eff = acc.allreduce_busbw_intra / acc.intra_node_bw
    else:
        intra_eff = busbw_median
    intra = Link(t0.bw * intra_eff, t0.p2p_bw * intra_eff, t0.latency_s, t0.topology)
    inter = None
    if len(cluster.tiers) > 1:
        t1 = cluster.tiers[1]
        inter = Link(t1.bw * constants.inter_eff, t1.p2p_bw * constants.inter_eff, t1.latency_s, "switch")
    fused = peak["bf16"] * constants.attention_eff
    return Rates(peak=peak, gemm_eff=eff, attention_flops=fused,
                 flash2_flops=min(fused, constants.flash2_max_tflops * 1e12),
                 hbm_bw=acc.hbm_bw, intra=intra, inter=inter, domain=scaleup_domain(cluster),
                 native=tuple(p in acc.peak_flops for p in PRECISIONS), comm_sm_fraction=constants.comm_sm_fraction,
                 moe_sync_s=constants.moe_sync_s)
