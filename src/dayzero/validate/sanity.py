"""Physical bounds a calibration fit must respect before its profile is written.

A fit is only as good as the range it was measured over: on an oversubscribed host (more ranks
than cores) the GEMM rate can still be rising at the largest size measured, and the fitted
asymptote ``R d / (d + h)`` then runs off to absurd peaks (1.5e14 FLOP/s and h = 6e17 were seen on
a 2-core CPU with 8 ranks). :func:`fit_problems` names every fitted number that no device could
have produced, and :func:`fit_warnings` the fits that describe their measurements poorly.

Bounds and their sources:

* GEMM peak per rank <= the device's catalog peak x ``CATALOG_SLACK`` (GPUs with a catalog entry).
  On a CPU, the whole host's fitted rate <= cores x ``MAX_CPU_HZ`` x FLOP per cycle and core:
  64 for fp32/fp64 (two 512-bit FMA units: 2 x 16 lanes x 2 FLOP, Intel 64 and IA-32
  Architectures Optimization Reference Manual, AVX-512 chapter) and 1024 for bf16/fp16 (AMX
  tiles: 1,024 BF16 operations per cycle and core, Intel AMX product brief).
* The fitted GEMM asymptote <= ``EXTRAPOLATION`` x the fastest GEMM measured: beyond that the
  measurements never approached the asymptote and the fit is extrapolation. ``profile.fit_gemm``
  caps its fit there (``bounded``, written with a warning), so this bound guards profiles built
  any other way.
* Link bandwidth: on a CPU host a transfer between ranks is a copy through memory, so the fitted
  bandwidth <= the host's measured memory bandwidth (per rank x ranks); on a GPU <= the catalog's
  intra-node bandwidth x ``CATALOG_SLACK``. Latencies and bandwidths finite and positive.
"""

from __future__ import annotations

import math

from dayzero.errors import DayzeroError
from dayzero.validate.profile import EXTRAPOLATION, gemm_rate

CATALOG_SLACK = 1.10  # measured may exceed a datasheet figure by clock boost and rounding, not more
MAX_CPU_HZ = 6.0e9  # no shipping CPU core sustains more (the fastest boost clocks are ~6.2 GHz)
CPU_FLOP_PER_CYCLE = {"fp32": 64, "fp64": 64, "bf16": 1024, "fp16": 1024}
MAX_FIT_ERROR = 0.5  # mean |fit - measured| / measured above which a fit is reported as poor


class CalibrationRejected(DayzeroError):
    """The measured fits break a physical bound; the profile is not written."""


def _finite_positive(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x) and x > 0


def fit_problems(profile: dict, catalog_accelerator=None) -> list[str]:
    """Every fitted number of ``profile`` (from :func:`dayzero.validate.profile.build_profile`) that
    breaks a bound of this module's docstring, as one sentence each; empty when all hold."""
    m = profile["measurements"]
    info = m["machine"]
    ranks = int(info.get("ranks") or 1)
    cores = int(info.get("cores") or 0)
    out: list[str] = []
    for dt, f in m["fits"].items():
        peak = f["peak_tflops"] * 1e12
        if not _finite_positive(peak) or not (f["half_dim"] >= 0 and math.isfinite(f["half_dim"])):
            out.append(f"{dt} GEMM fit is not a number (peak {f['peak_tflops']}, half-dim {f['half_dim']})")
            continue
        rates = [gemm_rate(r) for r in m["gemm"] if r["dtype"] == dt]
        fastest = max(rates, default=0.0)
        if peak > EXTRAPOLATION * fastest * (1 + 1e-9):
            out.append(f"{dt} GEMM peak {peak / 1e12:.3g} TFLOP/s is {peak / fastest:.3g}x the fastest GEMM "
                       f"measured ({fastest / 1e12:.3g} TFLOP/s; half-dim {f['half_dim']:.3g}): the rate was still "
                       "rising at the largest size, so the asymptote is extrapolated")
        if catalog_accelerator is not None and dt in catalog_accelerator.peak_flops:
            limit = catalog_accelerator.peak(dt) * CATALOG_SLACK
            if peak > limit:
                out.append(f"{dt} GEMM peak {peak / 1e12:.4g} TFLOP/s exceeds {catalog_accelerator.name}'s "
                           f"datasheet {catalog_accelerator.peak(dt) / 1e12:.4g} TFLOP/s")
        elif info.get("device") == "cpu" and cores > 0 and dt in CPU_FLOP_PER_CYCLE:
            limit = cores * MAX_CPU_HZ * CPU_FLOP_PER_CYCLE[dt]
            if peak * ranks > limit:
                out.append(f"{dt} GEMM: {ranks} rank(s) x {peak / 1e12:.3g} TFLOP/s exceeds what {cores} CPU "
                           f"core(s) can compute ({limit / 1e12:.3g} TFLOP/s at {MAX_CPU_HZ / 1e9:.0f} GHz, "
                           f"{CPU_FLOP_PER_CYCLE[dt]} FLOP/cycle)")
    bw = [r["bytes"] / r["seconds"] for r in m.get("memory_bandwidth", []) if r.get("seconds")]
    mem_bw = max(bw, default=None)
    link = m.get("link_fit")
    if link is not None:
        for key, label in (("bw", "collective bandwidth"), ("p2p_bw", "send/recv bandwidth"), ("alpha", "latency")):
            if not _finite_positive(link[key]):
                out.append(f"link fit: {label} {link[key]} is not a positive number")
        if info.get("device") == "cpu" and mem_bw and _finite_positive(link["bw"]):
            limit = mem_bw * ranks
            for key, label in (("bw", "collective"), ("p2p_bw", "send/recv")):
                if _finite_positive(link[key]) and link[key] > limit:
                    out.append(f"link fit: {label} bandwidth {link[key] / 1e9:.3g} GB/s exceeds the host's memory "
                               f"bandwidth ({limit / 1e9:.3g} GB/s over {ranks} rank(s)), through which every copy "
                               "between ranks passes")
        acc_bw = getattr(catalog_accelerator, "intra_node_bw", None)
        if acc_bw and _finite_positive(link["bw"]) and link["bw"] > acc_bw * CATALOG_SLACK:
            out.append(f"link fit: {link['bw'] / 1e9:.4g} GB/s exceeds {catalog_accelerator.name}'s intra-node "
                       f"{acc_bw / 1e9:.4g} GB/s per direction")
    if mem_bw is not None and not _finite_positive(mem_bw):
        out.append(f"memory bandwidth {mem_bw} is not a positive number")
    return out


def fit_warnings(profile: dict) -> list[str]:
    """Fits that describe their measurements poorly (mean error above ``MAX_FIT_ERROR``): written,
    but the planner's figures for those operations inherit the error."""
    m = profile["measurements"]
    out = [f"{dt} GEMM fit error {f['gemm_fit_mape']:.0%}" for dt, f in m["fits"].items()
           if f["gemm_fit_mape"] > MAX_FIT_ERROR]
    link = m.get("link_fit") or {}
    out += [f"{k} fit error {v:.0%}" for k, v in (link.get("mape") or {}).items() if v > MAX_FIT_ERROR]
    if out:
        out = [", ".join(out) + f" (above {MAX_FIT_ERROR:.0%}): the measurements scatter around the model, "
               "as on a loaded machine; calibrate again on a quiet one for tighter figures"]
    out += [f"{dt} GEMM rate still rising at the largest size measured: its asymptote is capped at "
            f"{EXTRAPOLATION:g}x the fastest GEMM measured ({f['peak_tflops']:.3g} TFLOP/s, half-dim "
            f"{f['half_dim']:.3g}); GEMMs larger than measured may run faster than the profile says "
            "(calibrate without --quick for larger sizes)" for dt, f in m["fits"].items() if f.get("bounded")]
    return out


def check_fits(profile: dict, catalog_accelerator=None) -> list[str]:
    """Raise :class:`CalibrationRejected` naming every broken bound; otherwise the warnings."""
    problems = fit_problems(profile, catalog_accelerator)
    if problems:
        raise CalibrationRejected("calibration not written: " + "; ".join(problems) +
                                  ". Calibrate with --nproc at most the device count (cores on a CPU), on a quiet "
                                  "machine, or without --quick")
    return fit_warnings(profile)
