"""Benchmarks of the performance planner: search speed and backtest accuracy.

Usage:  PYTHONPATH=src python benchmarks/bench_perf.py [--repeat N] [--out benchmarks/RESULTS_perf.md]

Measures, on this machine:

1. ``dayzero plan moe-3t --cluster dgx-h100-16384`` end to end (a fresh CLI process, wall clock,
   best of N) and the search alone in-process (wall and CPU seconds, layouts considered):
   target >= 200,000 layouts considered in < 5 s wall.
2. ``dayzero plan`` (dense-3t on ascend910b-8192) the same way: target < 2 s wall.
3. ``dayzero backtest`` on the shipped published_runs_dev.csv: MAPE overall, on the fit half
   (even ids, used to fit the constants) and on the held-out half (odd ids): targets <= 10 %
   MAPE and <= 15 % rows skipped.

The machine is shared; the load average is recorded with each timing, and CPU seconds are
reported next to wall seconds because CPU time is what a quiet machine would take.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def cli(args: list[str]) -> tuple[float, dict]:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "dayzero", *args, "--json"], env=env, capture_output=True, text=True,
                         check=True)
    return time.perf_counter() - t0, json.loads(out.stdout)


def in_process(model: str, cluster: str, gbs: int, seq: int) -> dict:
    from dayzero.planner.search.search import search
    from dayzero.specs.cluster import get_cluster
    from dayzero.specs.registry import load_model

    spec, cl = load_model(model), get_cluster(cluster)
    t0, c0 = time.perf_counter(), time.process_time()
    r = search(spec, cl, gbs, seq)
    return {"wall_s": time.perf_counter() - t0, "cpu_s": time.process_time() - c0, "considered": r.considered,
            "timed": r.timed, "rejected": r.rejected, "best_step_s": float(r.evaluation.step_s[0])}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "RESULTS_perf.md"))
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT / "src"))
    rows = []
    for label, model, cluster, cli_args in (
            ("moe-3t on dgx-h100-16384", "moe-3t", "dgx-h100-16384", ["plan", "moe-3t", "--cluster", "dgx-h100-16384"]),
            ("dense-3t on ascend910b-8192 (dayzero plan)", "dense-3t", "ascend910b-8192", ["plan"])):
        walls, obj = [], None
        for _ in range(args.repeat):
            load = os.getloadavg()[0]
            w, obj = cli(cli_args)
            walls.append((w, load))
        search = min((in_process(model, cluster, 4096, 4096) for _ in range(args.repeat)), key=lambda r: r["wall_s"])
        best = min(walls)
        rows.append((label, " ".join(["dayzero", *cli_args]), best[0], best[1], search, obj["considered"],
                     obj["plans"][0]["parallel"], obj["plans"][0]["throughput"]["mfu"]))
        print(label, best, search)

    from dayzero.planner.backtest.backtest import run_backtest

    t0 = time.perf_counter()
    bt = run_backtest()
    bt_s = time.perf_counter() - t0
    s, h = bt["summary"], bt["halves"]
    lines = [f"# Performance planner benchmarks ({date.today().isoformat()})", "",
             f"Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPU cores (shared with other "
             f"sessions; load average shown per timing), Python {platform.python_version()}, numpy "
             f"{__import__('numpy').__version__}; planner is pure numpy (no torch).", "",
             "## Search speed", "",
             "| scenario | command | CLI wall s (best of %d) | load avg | search wall s | search CPU s | considered | "
             "timed | best plan | MFU |" % args.repeat,
             "|---|---|---|---|---|---|---|---|---|---|"]
    for label, cmd, wall, load, srch, considered, par, mfu in rows:
        layout = (f"tp{par['tp']} pp{par['pp']} dp{par['dp']} cp{par['cp']} ep{par['ep']} vpp{par['vpp']} "
                  f"zero{par['zero']} mbs{par['mbs']} {par['recompute']}")
        lines.append(f"| {label} | `{cmd}` | {wall:.2f} | {load:.1f} | {srch['wall_s']:.2f} | {srch['cpu_s']:.2f} | "
                     f"{considered:,} | {srch['timed']:,} | {layout} | {mfu:.1%} |")
    lines += ["", "Targets: moe-3t >= 200,000 layouts in < 5 s wall; `dayzero plan` < 2 s wall.", "",
              "## Backtest (`dayzero backtest`, the shipped published_runs_dev.csv)", "",
              f"{s['n']} rows predicted, {s['skipped']} skipped ({s['skipped_fraction']:.1%}); {bt_s:.1f} s.", "",
              "| rows | n | MAPE | p90 abs error |", "|---|---|---|---|",
              f"| all | {s['n']} | {s['mape']:.1%} | {s['p90_abs_rel_error']:.1%} |",
              f"| fit half (even ids; constants fitted here) | {h['fit']['n']} | {h['fit']['mape']:.1%} | "
              f"{h['fit']['p90_abs_rel_error']:.1%} |",
              f"| held-out half (odd ids; never fitted) | {h['held']['n']} | {h['held']['mape']:.1%} | "
              f"{h['held']['p90_abs_rel_error']:.1%} |",
              "", "Per source:", "", "| source | n | MAPE |", "|---|---|---|"]
    for src, v in bt["by_source"].items():
        lines.append(f"| {src} | {v['n']} | {v['mape']:.1%} |")
    reasons: dict[str, int] = {}
    for sk in bt["skipped"]:
        reasons[sk["reason"]] = reasons.get(sk["reason"], 0) + 1
    lines += ["", "Skipped rows:", ""] + [f"- {n} x {r}" for r, n in reasons.items()]
    Path(args.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
