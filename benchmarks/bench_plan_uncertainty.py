"""Time of ``dayzero plan`` with its error band and sensitivity table (issue 16).

Usage:  PYTHONPATH=src python benchmarks/bench_plan_uncertainty.py [--repeat N]

For ``dayzero plan`` (dense-3t on ascend910b-8192; target < 2 s) and ``dayzero plan moe-3t
--cluster dgx-h100-16384`` (target < 5 s): a fresh CLI process with ``--json``, wall clock and the
child's CPU seconds, best of N; and in-process, :func:`dayzero.planner.search.search.plan` with and
without ``uncertainty`` (the extra cost of the band and the re-timed perturbations), CPU seconds.
The machine is shared: the load average is printed with each timing, and CPU seconds are what a
quiet machine would take.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCENARIOS = ((["plan"], "dense-3t", "ascend910b-8192", 2.0),
             (["plan", "moe-3t", "--cluster", "dgx-h100-16384"], "moe-3t", "dgx-h100-16384", 5.0))


def cli(args: list[str]) -> tuple[float, float, dict]:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "dayzero", *args, "--json"], env=env, capture_output=True, text=True,
                         check=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, json.loads(out.stdout)


def in_process(model: str, cluster: str, uncertainty: bool) -> float:
    from dayzero.planner.search.search import plan
    from dayzero.specs.cluster import get_cluster
    from dayzero.specs.registry import load_model

    spec, cl = load_model(model), get_cluster(cluster)
    c0 = time.process_time()
    plan(spec, cl, 4096, 4096, uncertainty=uncertainty)
    return time.process_time() - c0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT / "src"))
    for argv, model, cluster, target in SCENARIOS:
        runs = [cli(argv) for _ in range(args.repeat)]
        wall, cpu = min(r[0] for r in runs), min(r[1] for r in runs)
        obj = runs[0][2]
        in_process(model, cluster, False)  # warm caches
        base = min(in_process(model, cluster, False) for _ in range(args.repeat))
        full = min(in_process(model, cluster, True) for _ in range(args.repeat))
        moved = [r["perturbation"] for r in obj["sensitivity"]["rows"] if r["best_plan_changes"]]
        print(f"dayzero {' '.join(argv)}: CLI wall {wall:.2f} s, CPU {cpu:.2f} s (best of {args.repeat}, target "
              f"< {target} s wall, load {os.getloadavg()[0]:.1f}); in process plan() CPU {base:.2f} s, with the band "
              f"and sensitivity {full:.2f} s (+{full - base:.2f} s); {obj['considered']:,} layouts; band "
              f"{obj['error_band']['key']} MAPE {obj['error_band']['mape']:.1%}; best plan changes under: "
              f"{', '.join(moved) or 'none'}")


if __name__ == "__main__":
    main()
