"""``dayzero calibrate``: measure this machine on N ranks and write its hardware profile.

    results  = run_ranks(microbench.run_rank, nproc)      every rank measures at once
    merged   = merge_ranks(results)                        medians over ranks
    profile  = build_profile(merged)                       fits with the planner's formulas
    check_fits(profile)                                    physical bounds (validate/sanity.py)
    write_profile(profile, out)                            a cluster YAML (--cluster FILE)

The report compares every measurement with what the planner now predicts for it (GEMM by
shape, each collective by size and group), so the fit error of the profile is visible.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from dayzero.validate.profile import (
    COLLECTIVES,
    build_profile,
    collective_time,
    fit_link,
    gemm_rate,
    merge_ranks,
    write_profile,
)
from dayzero.validate.sanity import check_fits


def measure(nproc: int, quick: bool = False, skip: tuple[str, ...] = ()) -> dict:
    """Run the microbenchmarks on ``nproc`` local ranks; the merged tables."""
    from dayzero.validate.launch import run_ranks

    results = run_ranks("dayzero.validate.microbench:run_rank", {"quick": quick, "skip": list(skip)}, nproc)
    return merge_ranks(results)


def catalog_entry(machine: dict):
    """The catalog accelerator an accelerator's reported name maps to (None on CPU or when unknown)."""
    if machine.get("device", "cpu") == "cpu":
        return None
    from dayzero.specs.hardware import resolve_accelerator

    return resolve_accelerator(machine.get("name", ""))


def calibrate(nproc: int, out: str | Path | None = None, quick: bool = False, name: str | None = None) -> dict:
    """Measure, fit, and (with ``out``) write the profile. Returns ``{"profile", "path", "summary"}``."""
    merged = measure(nproc, quick)
    acc = catalog_entry(merged["machine"])
    profile = build_profile(merged, name, acc)
    warnings = check_fits(profile, acc)  # raises, writing nothing, when a fit breaks a physical bound
    path = write_profile(profile, out) if out else None
    return {"profile": profile, "path": None if path is None else str(path), "summary": summarize(profile),
            "warnings": warnings}


def summarize(profile: dict) -> dict:
    """Per-benchmark fit quality: every measurement next to the profile's prediction."""
    m = profile["measurements"]
    out: dict = {"compute_dtype": m["compute_dtype"], "fits": m["fits"], "gemm": [], "collectives": []}
    for dt, f in m["fits"].items():  # the profile's own fits (build_profile ran fit_gemm)
        for r in (r for r in m["gemm"] if r["dtype"] == dt):
            d = min(r["m"], r["k"], r["n"])
            pred = f["peak_tflops"] * d / (d + f["half_dim"])
            measured = gemm_rate(r) / 1e12
            out["gemm"].append({"dtype": dt, "shape": [r["m"], r["k"], r["n"]], "measured_tflops": measured,
                                "fitted_tflops": pred, "rel_error": (pred - measured) / measured})
    if m.get("collectives"):
        link = fit_link(m["collectives"]).link()
        for r in m["collectives"]:
            if r["collective"] in COLLECTIVES:
                pred = float(collective_time(r["collective"], r["bytes"], r["group"], link))
            else:
                pred = link.alpha + r["bytes"] / link.p2p_bw
            out["collectives"].append({**r, "fitted_seconds": pred, "rel_error": (pred - r["seconds"]) / r["seconds"],
                                       "busbw_gbytes_per_s": busbw(r) / 1e9})
        out["link_fit"] = m["link_fit"]
    bw = [r["gbytes_per_s"] for r in m["memory_bandwidth"]]
    out["memory_gbytes_per_s"] = float(np.median(bw)) if bw else None
    out["memory_overhead"] = m["memory_overhead"]
    return out


def busbw(row: dict) -> float:
    """nccl-tests' bus bandwidth of a measured row (doc/PERFORMANCE.md factors)."""
    n, algbw = row["group"], row["bytes"] / row["seconds"]
    factor = {"all_reduce": 2 * (n - 1) / n, "all_gather": (n - 1) / n, "reduce_scatter": (n - 1) / n,
              "all_to_all": (n - 1) / n}.get(row["collective"], 1.0)
    return algbw * factor
