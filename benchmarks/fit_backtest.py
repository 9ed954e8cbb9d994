"""Fit dayzero's performance-model efficiency constants on the fit half of a published-runs CSV.

Usage:  PYTHONPATH=src python benchmarks/fit_backtest.py [CSV] [--iterations N] [--out FILE.json]

The fit half is the rows with an even numeric id (see dayzero.planner.backtest.backtest.half_of); the
held half is never looked at. Prints the fitted constants, the fit-half and held-half MAPE, and
writes them as JSON (a calibration file `dayzero predict/plan/backtest --calibration` accepts).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from dayzero.planner.backtest.backtest import FIT_FIELDS, fit_constants, run_backtest
from dayzero.planner.backtest.published import default_runs
from dayzero.planner.perf.calibration import PerfConstants

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("csv", nargs="?", default=str(default_runs()))
    ap.add_argument("--iterations", type=int, default=300)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "fitted_constants.json"))
    ap.add_argument("--start", default=None, help="JSON of constants to start from")
    args = ap.parse_args()
    start = PerfConstants()
    if args.start:
        data = json.loads(Path(args.start).read_text())
        start = start.with_overrides(data.get("constants", data), args.start)
    t0 = time.time()
    constants, fit_mape = fit_constants(args.csv, start, args.iterations)
    result = run_backtest(args.csv, constants)
    out = {"constants": {f: getattr(constants, f) for f in FIT_FIELDS}, "fit_mape": result["halves"]["fit"]["mape"],
           "held_mape": result["halves"]["held"]["mape"], "all_mape": result["summary"]["mape"],
           "iterations": args.iterations, "seconds": round(time.time() - t0, 1), "csv": str(args.csv)}
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
