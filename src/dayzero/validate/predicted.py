"""What the planner predicts for a run of the runtime: the same layout, the runtime's dtypes.

The planner counts BF16 elements (2 bytes) for activations, parameters gathered and
memory-bound kernels. The runtime computes in ``compute_dtype`` (bf16 on GPUs, fp32 on CPUs by
default) and always reduces gradients in fp32 (FSDP2 ``reduce_dtype``). A run in fp32 is
predicted exactly by the **fp32 view** of a profile: every bandwidth halved (each counted
2-byte element really moves 4 bytes; the alpha-beta model is linear in bytes, latencies stay),
the bf16 GEMM peak, size effect and attention rate replaced by the measured fp32 ones (the
profile keeps both in ``measurements.fits``), gradients reduced at 2 counted bytes (4 real at
half bandwidth), and the optimizer's 28 real bytes per parameter (AdamW reads parameter,
gradient and two moments, writes three) counted as 14.

Memory follows FSDP2 with the runtime's own bytes and layout (:mod:`dayzero.runtime.planner_view`).
"""

from __future__ import annotations

from dataclasses import replace

from dayzero.errors import ConfigError
from dayzero.planner.engines import DAYZERO
from dayzero.planner.perf.comm import CommOptions
from dayzero.planner.perf.perf import PerfOptions
from dayzero.runtime.memory_check import ACCELERATOR
from dayzero.runtime.planner_view import BYTES, memory_options, runtime_layout
from dayzero.specs.cluster import Cluster

ADAMW_FP32_BYTES = 28  # read param, grad, exp_avg, exp_avg_sq (4 x 4 B); write param, exp_avg, exp_avg_sq (3 x 4 B)


def compute_view(cluster: Cluster, compute_dtype: str) -> Cluster:
    """The cluster as the planner must see it to predict a run computing in ``compute_dtype``."""
    if compute_dtype not in BYTES:
        raise ConfigError("compute dtype", None, f"expected fp32 or bf16, got {compute_dtype!r}")
    eff = dict(cluster.efficiency)
    eff.setdefault("optimizer_bytes_per_param", ADAMW_FP32_BYTES * 2 / BYTES[compute_dtype])
    if compute_dtype == "bf16":
        return replace(cluster, efficiency=eff)
    fits = (cluster.measurements or {}).get("fits", {})
    fp32 = fits.get("fp32")
    if not fp32:
        raise ConfigError(f"cluster {cluster.name}", "measurements.fits.fp32",
                          "predicting an fp32 run needs a profile with fp32 GEMM measurements (dayzero calibrate)")
    acc = cluster.accelerator
    peak = fp32["peak_tflops"] * 1e12
    # efficiency.gemm_bf16 is the bf16 rate over the bf16 peak; over the measured bf16 asymptote it
    # is the fraction of the microbenchmark a training step reaches (1 until a fit says otherwise),
    # which carries over to the fp32 asymptote
    bf16_fit = fits.get("bf16", {}).get("peak_tflops")
    measured_frac = bf16_fit * 1e12 / acc.peak("bf16") if bf16_fit else 1.0
    train_frac = eff.get("gemm_bf16", measured_frac) / measured_frac
    acc = replace(acc, peak_flops={**acc.peak_flops, "bf16": peak}, hbm_bw=acc.hbm_bw / 2 if acc.hbm_bw else None)
    tiers = tuple(replace(t, bw=t.bw / 2, p2p_bw=t.p2p_bw / 2) for t in cluster.tiers)
    eff.update(gemm_bf16=train_frac, gemm_half_dim=fp32["half_dim"])
    if fp32.get("attention_tflops"):
        eff["attention"] = min(1.0, fp32["attention_tflops"] * 1e12 / peak)
    return replace(cluster, accelerator=acc, tiers=tiers, efficiency=eff, name=f"{cluster.name} (fp32 view)")


def perf_options(compute_dtype: str, constants=None, **comm) -> PerfOptions:
    """Gradients are reduced in fp32: 4 bytes, or 2 counted bytes in the fp32 view; MoE tokens go
    through the runtime's plain all-to-all (planner.engines.DAYZERO.ep_dispatcher); its TP
    and EP collectives overlap nothing (DAYZERO.tp_comm_overlap, DAYZERO.ep_overlap)."""
    grad = 2 if compute_dtype == "fp32" else 4
    comm = {"ep_dispatcher": DAYZERO.ep_dispatcher, "tp_overlap": DAYZERO.tp_comm_overlap,
            "ep_overlap": DAYZERO.ep_overlap, **comm}
    return PerfOptions(comm=CommOptions(grad_reduce_bytes=grad, **comm), constants=constants)


def predict_run(spec, parallel, cluster: Cluster, compute_dtype: str, constants=None,
                device: str | None = None) -> dict:
    """The planner's prediction (the ``dayzero predict --json`` object) for the runtime running ``parallel``
    on ``cluster`` in ``compute_dtype``; memory is per device at the cluster's capacity."""
    from dayzero.planner.predict import predict

    if device is None:
        device = ACCELERATOR if compute_dtype == "bf16" and cluster.accelerator.vendor != "cpu" else "cpu"
    view = compute_view(cluster, compute_dtype)
    eff = runtime_layout(parallel)
    return predict(spec, eff, view, perf_options(compute_dtype, constants),
                   memory_options(cluster, compute_dtype, spec, eff, device))
