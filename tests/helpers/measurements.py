"""Synthetic ``dayzero validate`` measurement files, fitted exactly by the planner's own formulas."""

from dayzero.planner.perf.collectives import Link
from dayzero.validate.profile import collective_time


def gemm_rows(dtype, peak, half, dims=(64, 128, 256, 512, 1024)):
    rows = []
    for d in dims:
        for m, k, n in ((d, d, d), (4 * d, d, 2 * d)):
            rate = peak * d / (d + half)
            rows.append({"dtype": dtype, "m": m, "k": k, "n": n, "seconds": 2 * m * k * n / rate})
    return rows


def coll_rows(link, groups=(2, 4, 8)):
    rows = []
    for g in groups:
        for b in (2**12, 2**16, 2**20, 2**24):
            for kind in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all"):
                rows.append({"collective": kind, "group": g, "bytes": b,
                             "seconds": float(collective_time(kind, b, g, link))})
            if g == 2:
                rows.append({"collective": "send_recv", "group": 2, "bytes": b,
                             "seconds": link.alpha + b / link.p2p_bw})
    return rows


def measurements(device="cpu", ranks=8):
    link = Link(0.5e9, 0.8e9, 400e-6)
    return {
        "machine": {"hostname": "host", "device": device, "backend": "gloo", "ranks": ranks, "threads_per_rank": 1,
                    "cpu": "Test CPU", "cores": 2, "memory_bytes": 24e9, "name": "NVIDIA H100 80GB HBM3"},
        "plan": {}, "memory_overhead": {"runtime_context_bytes": 300 * 2**20, "comm_buffer_bytes": 2**20},
        "gemm": gemm_rows("fp32", 20e9, 40) + gemm_rows("bf16", 35e9, 90),
        "memory_bandwidth": [{"op": "triad", "bytes": 3e8, "seconds": 0.1, "gbytes_per_s": 3.0}],
        "attention": [{"dtype": dt, "batch": 1, "heads": 4, "seq": 256, "head_dim": 64, "fwd_flops": 1e9,
                       "fwd_s": 0.1, "fwd_bwd_s": 0.35} for dt in ("fp32", "bf16")],
        "collectives": coll_rows(link),
    }
