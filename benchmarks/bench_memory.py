"""Benchmark the memory planner: vectorised peak_memory_batch throughput (target >= 100,000
configurations/s on a 2-core CPU), the scalar estimate_memory, the allocator replay and balancing.

    PYTHONPATH=src python benchmarks/bench_memory.py [--n 200000] [--out benchmarks/RESULTS_memory.md]

Candidates are drawn uniformly from a planner-sized search space per model (tp, pp, dp, cp, ep, etp,
vpp, mbs, gbs, seq, zero, recompute, sequence_parallel, precision: the planner's grid,
dayzero.specs.grid); before timing, a sample is checked against
estimate_memory (agreement is a precondition of the number). Writes a Markdown table to --out and, when
$OUT is set, a copy to $OUT/RESULTS_memory.md.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import time
from pathlib import Path

import numpy as np

from dayzero.planner.memory.balance import balance_layers
from dayzero.planner.memory.memory import estimate_memory, peak_memory_batch
from dayzero.planner.memory.replay import simulate_step
from dayzero.specs import layout_rules
from dayzero.specs.grid import decode, default_schedule
from dayzero.specs.parallel import ParallelConfig, even_split
from dayzero.specs.registry import load_model

MODELS = ("llama-3.1-8b", "dense-3t", "deepseek-v3", "mixtral-8x22b")
CAP = 64 * 10**9


def grid(spec, n: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    moe = spec.moe is not None
    pick = lambda values: rng.choice(np.array(values), n)  # noqa: E731
    g = dict(tp=pick([1, 2, 4, 8]), pp=pick([1, 2, 4, 8, 16, 32, 64]), cp=pick([1, 2, 4]), dp=pick([1, 2, 4, 8, 16, 32,
                                                                                                    64, 128]),
             ep=pick([1, 2, 4, 8, 16, 32, 64]) if moe else np.ones(n, int), vpp=pick([1, 2, 4]), mbs=pick([1, 2, 4]),
             seq=pick([2048, 4096, 8192]), zero=pick([0, 1, 2, 3]), recompute=pick([0, 1, 2]),
             sequence_parallel=pick([0, 1]),
             precision=pick([0, 1]), rank_order=np.zeros(n, int))
    g["etp"] = np.minimum(pick([1, 2]) if moe else 1, g["tp"])
    g["vpp"] = np.where(g["pp"] > 1, g["vpp"], 1)
    g["gbs"] = g["mbs"] * g["dp"] * g["pp"] * pick([1, 2, 8])
    g["schedule"] = default_schedule(g["vpp"])
    return {k: np.asarray(v, dtype=np.int64) for k, v in g.items()}


def configs(spec, g, idx):
    """ParallelConfigs of grid rows; the even split is given explicitly so that layer counts that do
    not divide pp*vpp compare too (peak_memory_batch always uses the even split)."""
    for p in decode(g, idx):
        yield p.with_(layer_split=even_split(spec.layers, p.pp * p.vpp))


def best_of(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=200_000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--out", default=str(Path(__file__).with_name("RESULTS_memory.md")))
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    rows = []
    for name in MODELS:
        spec = load_model(name)
        g = grid(spec, args.n, rng)
        peaks = peak_memory_batch(spec, g, CAP)
        checked = 0
        for i, p in zip(range(2000), configs(spec, g, range(2000))):
            if layout_rules.problems(p, spec) or checked >= 200:
                continue
            want = estimate_memory(spec, p, CAP).peak_bytes
            assert abs(peaks[i] - want) <= 8 + 1e-12 * want, (name, p.describe(), peaks[i], want)
            checked += 1
        dt = best_of(lambda: peak_memory_batch(spec, g, CAP), args.repeat)
        valid = [p for p in configs(spec, g, range(500)) if not layout_rules.problems(p, spec)][:50]
        scalar = best_of(lambda: [estimate_memory(spec, p, CAP) for p in valid], 3) / len(valid)
        rows.append((name, args.n, dt, args.n / dt, checked, scalar * 1e3))
        print(f"{name}: {args.n / dt:,.0f} configurations/s (checked {checked} against estimate_memory); "
              f"estimate_memory {scalar * 1e3:.2f} ms")
    seed = ParallelConfig(tp=8, pp=16, dp=64, zero=3, recompute="full")
    spec = load_model("dense-3t")
    sim_s = best_of(lambda: simulate_step(spec, seed, CAP), 3)
    big = seed.with_(zero=1, recompute="selective", sequence_parallel=True, gbs=64 * 32)
    sim_big = best_of(lambda: simulate_step(spec, big, CAP), 3)
    bal = best_of(lambda: balance_layers(spec, big, CAP), 3)
    stamp = datetime.date.today().isoformat()
    try:
        mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError, AttributeError):
        mem_gib = float("nan")
    try:
        from importlib.metadata import version

        torch_v = version("torch")
    except Exception:  # the planner never needs torch
        torch_v = "not installed"
    lines = [
        "# Memory planner benchmark", "",
        f"Date {stamp}; machine: {os.cpu_count()}-core CPU ({platform.processor() or platform.machine()}), "
        f"{mem_gib:.0f} GiB, Python {platform.python_version()}, numpy {np.__version__}, torch {torch_v} (unused: "
        "the planner is numpy only); no GPU involved. The machine is shared with other jobs: repeated runs "
        "vary by about 2x, the table is one run. "
        "Command: `PYTHONPATH=src python benchmarks/bench_memory.py` (best of "
        f"{args.repeat} runs, {args.n:,} random candidates per model, seed 0).", "",
        "## Vectorised `peak_memory_batch` (target >= 100,000 configurations/s)", "",
        "| model | candidates | seconds | configurations/s | checked vs estimate_memory | estimate_memory ms/call |",
        "|---|---:|---:|---:|---:|---:|",
        *[f"| {n} | {c:,} | {t:.3f} | {r:,.0f} | {k} | {s:.2f} |" for n, c, t, r, k, s in rows], "",
        "## Allocator replay and balancing (dense-3t)", "",
        "| what | seconds |", "|---|---:|",
        f"| simulate_step, seed layout (tp8 pp16 dp64 zero3 full, 1 micro-batch) | {sim_s:.3f} |",
        f"| simulate_step, tp8 pp16 dp64 zero1 selective sp, 32 micro-batches (replays 32) | {sim_big:.3f} |",
        f"| balance_layers, same layout (16 stages x 192 layers) | {bal:.3f} |", "",
    ]
    text = "\n".join(lines)
    Path(args.out).write_text(text)
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "RESULTS_memory.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
