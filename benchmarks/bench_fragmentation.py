"""Benchmark: the allocator replay's fragmentation on every shipped published run, per allocator mode.

For each published run the backtest reads (``dayzero backtest``'s cases, with the memory settings
it settles on) whose schedule the replay orders (1F1B, interleaved 1F1B, GPipe), replay one step of
the busiest stage (:func:`dayzero.planner.memory.replay.simulate_step`) with PyTorch's caching allocator
and with expandable segments (:mod:`dayzero.planner.memory.allocator`), and report the slack the
reservation carries at its peak (reserved - allocated then) as a fraction of the stage's
activation and temporary bytes: the quantity ``MemoryOptions.fragmentation`` budgets. The mean
over all layouts is the budget of each mode (``memory_options.FRAGMENTATION``); the split by
recompute / ZeRO-3 shows where the slack comes from.

Run: ``PYTHONPATH=src python benchmarks/bench_fragmentation.py [--json out.json]``.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from dayzero.planner.backtest.published import load_cases
from dayzero.planner.memory.memory import estimate_memory
from dayzero.planner.memory.memory_options import FRAGMENTATION
from dayzero.planner.memory.replay import simulate_step

MODES = ("caching", "expandable")


def slack(case, allocator: str) -> float:
    p, opts = case.parallel, case.memory.with_(allocator=allocator)
    sim = simulate_step(case.spec, p, case.cluster.memory_bytes, opts)
    st = estimate_memory(case.spec, p, case.cluster.memory_bytes, opts).stages[sim.rank]
    return sim.peak_reserved * sim.fragmentation / max(1, st.activations + st.temporary)


def stats(values: list[float]) -> dict:
    v = np.asarray(values)
    return {"n": len(v), "mean": float(v.mean()), "median": float(np.median(v)), "p90": float(np.quantile(v, 0.9)),
            "max": float(v.max())}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", help="write the summary here")
    args = ap.parse_args()
    t0 = time.perf_counter()
    cases = [c for c in load_cases()[0] if c.parallel.schedule in ("1f1b", "interleaved", "gpipe")]
    churn = [c.parallel.recompute != "none" or c.parallel.zero == 3 for c in cases]
    out = {}
    for mode in MODES:
        s = [slack(c, mode) for c in cases]
        out[mode] = {"all": stats(s), "no recompute, ZeRO < 3": stats([x for x, k in zip(s, churn) if not k]),
                     "recompute or ZeRO-3": stats([x for x, k in zip(s, churn) if k]), "budget": FRAGMENTATION[mode]}
    for mode, groups in out.items():
        print(f"{mode} (budget {groups['budget']:.1%} of activations + temporaries):")
        for g, st in groups.items():
            if g != "budget":
                print(f"  {g:24s} n={st['n']:3d}  mean {st['mean']:6.1%}  median {st['median']:6.1%}  "
                      f"p90 {st['p90']:6.1%}  max {st['max']:6.1%}")
    print(f"{time.perf_counter() - t0:.1f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
