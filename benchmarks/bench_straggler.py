"""Calibrate the per-rank step-time jitter (PerfConstants.step_jitter) on the published runs.

Usage:  PYTHONPATH=src python benchmarks/bench_straggler.py [--sigmas 0,0.002,...]

For each sigma: the backtest's MAPE with every other constant at its default, and the slope of
log(predicted / published throughput) against ln(devices) (a missing straggler effect shows as a
positive slope: the model too fast at scale). The straggler factor is
planner.perf.scale_effects.straggler_factor (1 + sigma sqrt(2 ln N), N the job's devices).
"""

from __future__ import annotations

import argparse
from dataclasses import replace

import numpy as np

from dayzero.planner.backtest.backtest import run_backtest
from dayzero.planner.backtest.published import default_runs
from dayzero.planner.perf.calibration import PerfConstants


def size_trend(rows) -> tuple[float, float]:
    """(slope, correlation) of log(predicted / published) against ln(devices) over ``rows``."""
    x = np.log([r["devices"] for r in rows])
    y = np.log([r["predicted"] / r["published"] for r in rows])
    return float(np.polyfit(x, y, 1)[0]), float(np.corrcoef(x, y)[0, 1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sigmas", default="0,0.002,0.004,0.006,0.008,0.01,0.015,0.02")
    args = ap.parse_args()
    base = PerfConstants()
    print("sigma   mape    slope/ln(N)  corr    devices<=16 / >=1024 mean log(pred/pub)")
    for s in (float(v) for v in args.sigmas.split(",")):
        res = run_backtest(str(default_runs()), replace(base, step_jitter=s))
        rows = res["rows"]
        slope, corr = size_trend(rows)
        y = np.log([r["predicted"] / r["published"] for r in rows])
        d = np.array([r["devices"] for r in rows])
        print(f"{s:<7g} {res['summary']['mape']:.4f}  {slope:+.4f}      {corr:+.3f}  "
              f"{y[d <= 16].mean():+.4f} / {y[d >= 1024].mean():+.4f}")


if __name__ == "__main__":
    main()
