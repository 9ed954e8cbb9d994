"""Benchmark: EPLB placement (planner/perf/eplb.py) on a DeepSeek-V3-shaped load matrix.

58 MoE layers x 256 routed experts in 8 groups (DeepSeek-V3: 61 layers, the first 3 dense,
n_group 8; arXiv:2412.19437 section 4.2), EP 64 over 8 nodes, 64 redundant slots (one spare
per rank, as DeepSeek-V3's prefill deployment, section 3.4). The loads are synthetic and skewed:
Zipf(1.6) token counts, capped at 200 x the smallest, fixed seed; no published matrix exists.
Reports the wall time of the placement (in process, best of --repeat) and the busiest rank's load
over the mean before (contiguous) and after, worst and mean over layers.

Run: PYTHONPATH=src python benchmarks/bench_eplb.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

from dayzero.planner.perf.eplb import rebalance


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    rng = np.random.default_rng(7)
    loads = rng.zipf(1.6, size=(58, 256)).clip(max=200) * 100.0
    layers = tuple(range(3, 61))
    print(f"load average {os.getloadavg()[0]:.1f}; 58 layers x 256 experts, ep 64, 8 nodes, 64 redundant")
    for policy, groups in (("hierarchical", 8), ("global", 8)):
        best, res = float("inf"), None
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            res = rebalance(layers, loads, ep=64, nodes=8, redundant=64, groups=groups, policy=policy)
            best = min(best, time.perf_counter() - t0)
        doc = res.to_json()
        b, a = doc["max_mean_before"], doc["max_mean_after"]
        print(f"{policy:12s} {best:.2f} s (best of {args.repeat}); busiest/mean rank load: worst layer "
              f"{b['worst']:.3f} -> {a['worst']:.3f}, mean over layers {b['mean']:.3f} -> {a['mean']:.3f}")


if __name__ == "__main__":
    main()
