"""Leave-one-source-group-out error of the backtest (the honest figure) and the memory check.

Usage:  PYTHONPATH=src python benchmarks/bench_holdout.py [CSV] [--iterations N] [--jobs J] [--out FILE.json]
        [--table]

For every source group of the published-runs CSV, the efficiency constants are fitted on the
other groups' rows (Nelder-Mead warm-started from the shipped constants, N steps) and the held-out
group is predicted with them. Prints MAPE per held-out group, per family (dense/MoE), per
precision and overall, next to the in-sample figures and the share of rows predicted to fit
their device; writes the whole result as JSON. With ``--table`` it also writes the error table
the plan's error band reads (``src/dayzero/specs/presets/data/backtest_error.json``, see
:mod:`dayzero.planner.search.error_band`).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from dayzero.planner.backtest.backtest import leave_one_group_out, run_backtest
from dayzero.planner.backtest.published import default_runs
from dayzero.planner.search.error_band import TABLE_FILE, error_table

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("csv", nargs="?", default=str(default_runs()))
    ap.add_argument("--iterations", type=int, default=20)
    ap.add_argument("--jobs", type=int, default=1, help="fit the held-out groups in this many processes")
    ap.add_argument("--out", default=None, help="write the JSON here")
    ap.add_argument("--table", action="store_true", help=f"write the shipped error table presets/data/{TABLE_FILE}")
    args = ap.parse_args()
    t0 = time.time()
    full = run_backtest(args.csv)
    t1 = time.time()
    h = leave_one_group_out(args.csv, iterations=args.iterations, jobs=args.jobs)
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
    if args.table:
        command = " ".join(["PYTHONPATH=src python benchmarks/bench_holdout.py", *sys.argv[1:]])
        table = error_table(h["rows"], args.iterations, command, datetime.now(timezone.utc).strftime("%Y-%m-%d"))
        table["machine"] = "2-core CPU container"
        dest = ROOT / "src" / "dayzero" / "specs" / "presets" / "data" / TABLE_FILE
        dest.write_text(json.dumps(table, indent=1) + "\n")
        print(f"wrote {dest.relative_to(ROOT)}")
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
