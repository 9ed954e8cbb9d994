"""Leave-one-source-group-out error of the backtest (the honest figure) and the memory check.

Usage:  PYTHONPATH=src python benchmarks/bench_holdout.py [CSV] [--iterations N] [--out FILE.json]

For every source group of the published-runs CSV, the efficiency constants are fitted on the
other groups' rows (Nelder-Mead warm-started from the shipped constants, N steps) and the held-out
group is predicted with them. Prints MAPE per held-out group, per family (dense/MoE), per
precision and overall, next to the in-sample figures and the share of rows predicted to fit
their device; writes the whole result as JSON.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from dayzero.planner.backtest import leave_one_group_out, run_backtest
from dayzero.planner.published import default_runs

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("csv", nargs="?", default=str(default_runs()))
    ap.add_argument("--iterations", type=int, default=20)
    ap.add_argument("--out", default=None, help="write the JSON here")
    args = ap.parse_args()
    t0 = time.time()
    full = run_backtest(args.csv)
    t1 = time.time()
    h = leave_one_group_out(args.csv, iterations=args.iterations)
    t2 = time.time()
    s = full["summary"]
    out = {"in_sample": {"mape": s["mape"], "fit_half": full["halves"]["fit"]["mape"],
                         "held_half": full["halves"]["held"]["mape"], "n": s["n"]},
           "memory": {"fits_share": s["fits_share"], "fits_share_recompute_stated": s["fits_share_recompute_stated"],
                      "recompute_stated": s["recompute_stated"], "not_fitting": s["not_fitting"]},
           "holdout": {k: h[k] for k in ("overall", "by_group", "by_family", "by_precision", "unconstrained",
                                         "iterations")},
           "seconds": {"backtest": round(t1 - t0, 1), "holdout": round(t2 - t1, 1)}, "csv": str(args.csv)}
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    pct = lambda x: "-" if x is None else f"{100 * x:.1f} %"  # noqa: E731
    print(f"in-sample MAPE {pct(s['mape'])} (fit half {pct(out['in_sample']['fit_half'])}, held half "
          f"{pct(out['in_sample']['held_half'])}), {s['n']} rows")
    print(f"leave-one-source-group-out MAPE {pct(h['overall']['mape'])} ({args.iterations} steps per group)")
    for key in ("by_group", "by_family", "by_precision"):
        for g, v in h[key].items():
            print(f"  {key[3:]:9s} {g:28s} n {v['n']:4d}  MAPE {pct(v['mape']):>8s}  bias {100 * v['bias']:+.1f} %")
    print(f"memory: {pct(s['fits_share'])} of rows fit, {pct(s['fits_share_recompute_stated'])} of the "
          f"{s['recompute_stated']} stating recompute; not fitting: {', '.join(s['not_fitting'])}")
    print(f"seconds: backtest {out['seconds']['backtest']}, leave-one-group-out {out['seconds']['holdout']}")


if __name__ == "__main__":
    main()
