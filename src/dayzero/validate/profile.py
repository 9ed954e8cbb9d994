"""From microbenchmark tables to a hardware profile: the cluster YAML ``--cluster`` accepts.

Every number the planner needs is fitted with the planner's own formulas, so the profile makes
the planner reproduce the measurements it came from:

* **GEMM**: the planner runs a GEMM at ``peak x eff x d / (d + half_dim)``, ``d`` its smallest
  dimension (planner/perf/compute.py); the asymptotic rate ``R`` and ``half_dim`` of each dtype
  minimise the mean squared log error of ``R d / (d + half_dim)`` over the measured shapes.
  Where the rate is still rising at the largest size measured, ``R`` and ``half_dim`` are not
  both determined (only their ratio is) and the free fit runs off to absurd asymptotes; the fit
  is then bounded: ``R`` = ``EXTRAPOLATION`` x the fastest GEMM measured, ``half_dim``
  fitted under it, and the profile records ``bounded`` (a warning says so when it is written).
* **Links**: one (bandwidth, latency) pair for the scale-up tier that best reproduces every
  measured collective through ``planner.perf.collectives`` (mean squared log error over all kinds,
  sizes and group sizes, each kind weighted equally), and the point-to-point bandwidth from
  send/recv.
* **Memory bandwidth**: the triad's bytes per second. **Attention**: the planner counts
  forward b h s (s + 1) (d + dv) FLOPs and backward 2.5 x forward time, so the fused-attention
  rate is 3.5 x forward FLOPs / measured forward+backward seconds.

Profiles of catalog hardware keep the catalog's peak and record what was measured as
efficiencies (``efficiency.gemm_bf16`` = measured rate / peak); a machine the catalog lacks (a
CPU host) gets an inline accelerator whose peaks are the fitted asymptotic rates.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from dayzero.errors import ConfigError
from dayzero.planner.perf.collectives import Link, group_collective
from dayzero.planner.perf.minimize import nelder_mead
from dayzero.runtime.device import auto_compute_dtype
from dayzero.specs.hardware import HBM_GB

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")
EXTRAPOLATION = 2.0  # largest GEMM asymptote a fit may claim, x the fastest GEMM measured (validate.sanity)


def gemm_rate(row: dict) -> float:
    """FLOP/s of one measured GEMM row (keys m, k, n, seconds)."""
    return 2.0 * row["m"] * row["k"] * row["n"] / row["seconds"]


@dataclass(frozen=True)
class GemmFit:
    dtype: str
    peak_flops: float  # asymptotic FLOP/s of a large GEMM
    half_dim: float  # smallest dimension at which a GEMM reaches half of it
    mape: float  # mean |fit - measured| / measured over the points
    points: int
    bounded: bool = False  # the rate never levelled off: the asymptote is capped (module docstring)


def fit_gemm(rows: list[dict], dtype: str) -> GemmFit:
    """Fit ``rate = R d / (d + h)`` to the rows of one dtype (keys m, k, n, seconds)."""
    pts = [r for r in rows if r["dtype"] == dtype]
    if not pts:
        raise ConfigError("calibration", f"gemm.{dtype}", "no GEMM measurements for this dtype")
    d = np.array([min(r["m"], r["k"], r["n"]) for r in pts], dtype=float)
    rate = np.array([gemm_rate(r) for r in pts])

    def err(x) -> float:  # mean squared log error of R d / (d + h)
        return float(np.mean(np.log(np.exp(x[0]) * d / (d + np.exp(x[1])) / rate) ** 2))

    x0 = np.log([rate.max() * 1.2, float(np.median(d))])
    x, _ = nelder_mead(err, x0, 200, step=0.5)
    peak, half = float(np.exp(x[0])), float(np.exp(x[1]))
    cap = EXTRAPOLATION * float(rate.max())
    bounded = peak > cap
    if bounded:  # still rising at the largest size: fit half_dim under the largest asymptote allowed
        y, _ = nelder_mead(lambda y: float(np.mean(np.log(cap * d / (d + np.exp(y[0])) / rate) ** 2)),
                           np.log([float(np.median(d))]), 200, step=0.5)
        peak, half = cap, float(np.exp(y[0]))
    if half < 1e-3:  # no size effect in range
        half = 0.0
    fit = peak * d / (d + half)
    return GemmFit(dtype, float(peak), float(half), float(np.mean(np.abs(fit - rate) / rate)), len(pts), bounded)


@dataclass(frozen=True)
class LinkFit:
    bw: float  # bytes/s per device per direction, as the collectives achieve it
    p2p_bw: float  # bytes/s of one send/recv pair
    alpha: float  # seconds per algorithm step
    mape: dict  # collective -> mean |fit - measured| / measured
    points: int

    def link(self) -> Link:
        return Link(self.bw, self.p2p_bw, self.alpha, "switch")


def collective_time(kind: str, nbytes, group, link: Link, per_domain=None, intra: Link | None = None):
    """The planner's time for one collective: inside one scale-up domain over ``link``, or, with
    ``intra``, over ``group / per_domain`` domains joined by ``link`` (the scale-out tier)."""
    g = np.asarray(group, dtype=float)
    if intra is None:
        return group_collective(kind, nbytes, g, g, np.ones_like(g), link, None)
    per = np.minimum(g, np.asarray(per_domain, dtype=float))
    return group_collective(kind, nbytes, g, per, np.ceil(g / per), intra, link)


def fit_link(rows: list[dict], per_domain: int | None = None, intra: Link | None = None) -> LinkFit:
    """Fit one tier's (bw, alpha) to collective rows and its p2p bandwidth to send/recv rows
    (keys collective, group, bytes, seconds). With ``intra`` (and ``per_domain`` ranks per
    node) the rows span nodes and the fitted tier is the scale-out one."""
    coll = [r for r in rows if r["collective"] in COLLECTIVES and r["group"] > 1]
    p2p = [r for r in rows if r["collective"] == "send_recv"]
    if not coll:
        raise ConfigError("calibration", "collectives", "no collective measurements (calibrate with --nproc >= 2)")
    by_kind = {k: [r for r in coll if r["collective"] == k] for k in COLLECTIVES}
    by_kind = {k: v for k, v in by_kind.items() if v}
    arrays = {k: (np.array([r["bytes"] for r in v], float), np.array([r["group"] for r in v], float),
                  np.array([r["seconds"] for r in v], float)) for k, v in by_kind.items()}

    def times(k, link):
        b, g, _ = arrays[k]
        return collective_time(k, b, g, link, per_domain, intra)

    def err(x) -> float:
        link = Link(float(np.exp(x[0])), float(np.exp(x[0])), float(np.exp(x[1])), "switch")
        return float(np.mean([np.mean(np.log(times(k, link) / t) ** 2) for k, (_, _, t) in arrays.items()]))

    # start: bandwidth from the largest messages, latency from the smallest
    big = max(coll, key=lambda r: r["bytes"])
    small = min(coll, key=lambda r: r["bytes"])
    x0 = np.log([max(big["bytes"] / big["seconds"], 1.0), max(small["seconds"] / max(small["group"] - 1, 1), 1e-7)])
    best = min((nelder_mead(err, x0 + np.array(d), 120, step=0.5) for d in ((0, 0), (1, -1), (-1, 1))),
               key=lambda r: r[1])
    bw, alpha = float(np.exp(best[0][0])), float(np.exp(best[0][1]))
    p2p_bw = bw
    if p2p:
        b = np.array([r["bytes"] for r in p2p], float)
        t = np.array([r["seconds"] for r in p2p], float)
        # t = alpha + B / p2p_bw with the tier's alpha: mean squared log error in log p2p_bw
        res = nelder_mead(lambda x: float(np.mean(np.log((alpha + b / np.exp(x[0])) / t) ** 2)),
                          np.log([bw]), 80, step=0.5)
        p2p_bw = float(np.exp(res[0][0]))
    link = Link(bw, p2p_bw, alpha, "switch")
    mape = {k: float(np.mean(np.abs(times(k, link) - t) / t)) for k, (_, _, t) in arrays.items()}
    if p2p:
        b = np.array([r["bytes"] for r in p2p], float)
        t = np.array([r["seconds"] for r in p2p], float)
        mape["send_recv"] = float(np.mean(np.abs(alpha + b / p2p_bw - t) / t))
    return LinkFit(bw, p2p_bw, alpha, mape, len(coll) + len(p2p))


@dataclass(frozen=True)
class AttentionFit:
    dtype: str
    flops: float  # FLOP/s of causal fused attention as the planner counts it
    points: int


def fit_attention(rows: list[dict], dtype: str) -> AttentionFit | None:
    pts = [r for r in rows if r["dtype"] == dtype]
    if not pts:
        return None
    rates = [3.5 * r["fwd_flops"] / r["fwd_bwd_s"] for r in pts]
    return AttentionFit(dtype, float(statistics.median(rates)), len(pts))


# -- merging ranks ---------------------------------------------------------------------------

def merge_ranks(results: list[dict]) -> dict:
    """One table per benchmark: local figures are the median over ranks (every rank measured
    at the same time), collective rows are already the slowest rank's (rank 0's copy)."""
    first = results[0]
    out = {"machine": first["machine"], "plan": first["plan"]}
    out["memory_overhead"] = {k: int(statistics.median(r["memory_overhead"][k] for r in results))
                              for k in first["memory_overhead"]}
    for table, key in (("gemm", "seconds"), ("memory_bandwidth", "seconds"), ("attention", "fwd_bwd_s")):
        if table not in first:
            continue
        rows = []
        for i, row in enumerate(first[table]):
            merged = dict(row)
            for k, v in row.items():
                if k.endswith("_s") or k == "seconds":
                    merged[k] = float(statistics.median(r[table][i][k] for r in results))
            if "tflops" in merged:
                merged["tflops"] = 2 * merged["m"] * merged["k"] * merged["n"] / merged["seconds"] / 1e12
            if "gbytes_per_s" in merged:
                merged["gbytes_per_s"] = merged["bytes"] / merged["seconds"] / 1e9
            rows.append(merged)
        out[table] = rows
    if "collectives" in first:
        out["collectives"] = first["collectives"]
    return out


# -- the profile -----------------------------------------------------------------------------

def build_profile(m: dict, name: str | None = None, catalog_accelerator=None) -> dict:
    """The cluster YAML mapping for merged measurements ``m`` (see :func:`merge_ranks`).

    ``catalog_accelerator``: the catalog entry of the measured device (GPU profiles keep its
    peaks and record efficiencies); None defines the accelerator inline from the fits."""
    info = m["machine"]
    ranks = int(info["ranks"])
    fits = {}
    gemm = {dt: fit_gemm(m["gemm"], dt) for dt in sorted({r["dtype"] for r in m.get("gemm", [])})}
    att = {dt: fit_attention(m.get("attention", []), dt) for dt in gemm}
    for dt, gf in gemm.items():
        fits[dt] = {"peak_tflops": gf.peak_flops / 1e12, "half_dim": gf.half_dim, "gemm_fit_mape": gf.mape,
                    "bounded": gf.bounded,
                    "attention_tflops": None if att[dt] is None else att[dt].flops / 1e12}
    if "bf16" not in gemm:
        raise ConfigError("calibration", "gemm.bf16", "a profile needs bf16 GEMM measurements")
    hbm_bw = statistics.median(r["bytes"] / r["seconds"] for r in m["memory_bandwidth"])
    link = fit_link(m["collectives"]) if m.get("collectives") else None
    over = m["memory_overhead"]
    efficiency = {"gemm_half_dim": round(gemm["bf16"].half_dim, 3)}
    profile: dict = {"name": name or f"{info['hostname']}-{ranks}x{info['device']}",
                     "description": f"measured by dayzero calibrate: {ranks} {info['backend']} rank(s) on "
                                    f"{info.get('name') or info['cpu']}",
                     "nodes": 1}
    if catalog_accelerator is not None:
        acc = catalog_accelerator
        profile["accelerator"] = acc.id
        profile["devices_per_node"] = ranks
        for dt, gf in gemm.items():
            if dt in ("bf16", "fp8") and dt in acc.peak_flops:
                # a rate above the datasheet (a boost clock; sanity.CATALOG_SLACK bounds it) counts as the peak
                efficiency[f"gemm_{dt}"] = _sig(min(1.0, gf.peak_flops / acc.peak(dt)))
        profile["gemm_tflops_measured"] = {dt: round(gf.peak_flops / 1e12, 3) for dt, gf in gemm.items()}
        profile["hbm_tbytes_per_s"] = round(hbm_bw / 1e12, 4)
        profile["runtime_context_mib"] = round(over["runtime_context_bytes"] / 2**20, 1)
        if ranks > 1:
            profile["comm_buffer_mib"] = round(over["comm_buffer_bytes"] / 2**20, 1)
        if link is not None:
            profile.update(intra_node_gbytes_per_s=round(link.bw / 1e9, 3),
                           intra_node_p2p_gbytes_per_s=round(link.p2p_bw / 1e9, 3),
                           intra_latency_us=round(link.alpha * 1e6, 3))
        peak_bf16 = acc.peak("bf16")
    else:
        mem = int(info.get("memory_bytes") or 0)
        accelerator = {
            "id": f"{info['device']}-host", "name": f"{info.get('name') or info['cpu']} ({ranks} ranks, "
                                                    f"{info['threads_per_rank']} thread(s) each)",
            "vendor": info["device"], "peak_tflops": {dt: round(gf.peak_flops / 1e12, 6) for dt, gf in gemm.items()},
            "hbm_gb": host_rank_memory_gb(mem, ranks), "hbm_tbytes_per_s": round(hbm_bw / 1e12, 6),
            "devices_per_node": ranks, "topology": "switch",
            "runtime_context_mib": round(over["runtime_context_bytes"] / 2**20, 1),
            "comm_buffer_mib": round(over["comm_buffer_bytes"] / 2**20, 1),
            "sources": ["dayzero calibrate (this machine)"],
        }
        if link is not None:
            accelerator.update(intra_node_gbytes_per_s=round(link.bw / 1e9, 6),
                               intra_node_p2p_gbytes_per_s=round(link.p2p_bw / 1e9, 6),
                               intra_latency_us=round(link.alpha * 1e6, 3))
        else:  # one rank: no links measured; a placeholder the planner never uses (no groups)
            accelerator.update(intra_node_gbytes_per_s=1.0)
        profile["accelerator"] = accelerator
        efficiency["gemm_bf16"] = 1.0  # the peak is the fitted asymptote itself
        peak_bf16 = gemm["bf16"].peak_flops
    if att.get("bf16") is not None:
        efficiency["attention"] = _sig(min(1.0, att["bf16"].flops / peak_bf16))
    if link is not None:
        efficiency["intra"] = 1.0  # the fitted bandwidth is already what collectives achieve
    profile["efficiency"] = efficiency
    profile["measurements"] = {
        "machine": info, "compute_dtype": auto_compute_dtype(info["device"]), "fits": fits,
        "link_fit": None if link is None else {**asdict(link), "bw_gbytes_per_s": link.bw / 1e9,
                                               "p2p_gbytes_per_s": link.p2p_bw / 1e9, "alpha_us": link.alpha * 1e6},
        "memory_overhead": over, "gemm": m.get("gemm", []), "memory_bandwidth": m.get("memory_bandwidth", []),
        "attention": m.get("attention", []), "collectives": m.get("collectives", []),
    }
    return profile


def host_rank_memory_gb(memory_bytes: int, ranks: int) -> float:
    """A CPU host profile's memory per rank: the host's memory split evenly over its ranks (1 GB
    when the host does not say)."""
    return round(memory_bytes / ranks / HBM_GB, 3) if memory_bytes else 1.0


def write_profile(profile: dict, path: str | Path) -> Path:
    """Write the profile YAML (and check that it loads as a cluster)."""
    import yaml

    from dayzero.specs.cluster import cluster_from_dict

    cluster_from_dict(profile, str(path))
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    header = ("# Hardware profile written by `dayzero calibrate` (docs/validation.md). Use it as\n"
              "# --cluster FILE; `measurements` holds the raw tables the fits came from.\n")
    p.write_text(header + yaml.safe_dump(_plain(profile), sort_keys=False, width=110))
    return p


def _sig(x: float, digits: int = 5) -> float:
    """``x`` rounded to ``digits`` significant digits (readable YAML, no lost precision)."""
    return float(f"{x:.{digits}g}")


def _plain(x):
    """numpy scalars and tuples -> plain YAML types."""
    if isinstance(x, dict):
        return {str(k): _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    if hasattr(x, "item"):
        return x.item()
    return x
