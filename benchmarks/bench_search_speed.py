"""Search speed in process: CPU seconds of ``planner.search.search`` for the two Day-0 scenarios
and for every published run with a full layout (the searches tests/planner/search/test_search_published.py
runs), best of N.

Usage:  PYTHONPATH=src python benchmarks/bench_search_speed.py [--repeat N] [--published-repeat N]

CPU seconds (``time.process_time``) rather than wall: the machine is shared, and the search is
single-threaded numpy. Run it with PYTHONPATH pointing at two source trees, back to back, to compare
a change (benchmarks/RESULTS.md records one such pair). ``bench_perf.py`` times the CLI end to end.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

SCENARIOS = (("moe-3t", "dgx-h100-16384"), ("dense-3t", "ascend910b-8192"))


def _published_cases() -> list:
    """One case per distinct (model, cluster, layout, options), as the published-search test picks them."""
    from dayzero.planner.backtest.published import load_cases
    from dayzero.specs.presets import reference_data

    seen = {}
    for case in load_cases(reference_data("published_runs_dev.csv"))[0]:
        if case.full_layout:
            seen.setdefault((case.spec, case.cluster.name, case.cluster.devices, case.parallel, case.options), case)
    return list(seen.values())


def _published_pass(cases: list) -> float:
    """CPU seconds of one search per case, at the memory limit of the published layout's own peak."""
    from dayzero.planner.memory.memory import MemoryOptions, peak_memory_batch
    from dayzero.planner.search.search import search
    from dayzero.specs.grid import encode

    cpu = 0.0
    for case in cases:
        p = case.parallel
        opts = MemoryOptions.for_run(case.cluster.accelerator, case.options.attention_kernel)
        peak = float(peak_memory_batch(case.spec, encode([p]), case.cluster.memory_bytes, opts)[0])
        limit = peak / case.cluster.memory_bytes * (1 + 1e-9)
        c0 = time.process_time()
        search(case.spec, case.cluster, p.gbs, p.seq, p.precision, case.options, top_k=1, max_memory=limit)
        cpu += time.process_time() - c0
    return cpu


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--published-repeat", type=int, default=1)
    args = ap.parse_args()
    from dayzero.planner.search.search import search
    from dayzero.specs.cluster import get_cluster
    from dayzero.specs.registry import load_model

    out = {"load_avg": os.getloadavg()[0], "scenarios": {}}
    for model, cluster in SCENARIOS:
        spec, cl = load_model(model), get_cluster(cluster)
        best, r = float("inf"), None
        for _ in range(args.repeat):
            c0 = time.process_time()
            r = search(spec, cl, 4096, 4096)
            best = min(best, time.process_time() - c0)
        out["scenarios"][f"{model} on {cluster}"] = {"search_cpu_s": round(best, 3), "considered": r.considered,
                                                     "best_step_s": float(r.evaluation.step_s[0])}
    cases = _published_cases()
    out["published"] = {"searches": len(cases),
                        "cpu_s": round(min(_published_pass(cases) for _ in range(args.published_repeat)), 2)}
    out["load_avg_end"] = os.getloadavg()[0]
    json.dump(out, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
