"""The whole ``dayzero day0`` sweep, timed: every preset on a card of each catalog family (CUDA
h100, ROCm mi300x, Ascend 910b) on 1,024 devices, with and without torch, and a model with its
own modeling code (tests/data/remote_tinyx) on h100 and 910b; each run checked by
tests/helpers/day0_sweep.py (no traceback, exit 0, every section in report.json, report.md and
report.html, no line over 80 columns). The slow lane of tests/cli/test_day0_sweep.py runs the
same cases.

    PYTHONPATH=src python benchmarks/bench_day0_sweep.py [--out DIR]

Prints one line per run (seconds, problems) and a summary; exit 1 when any run has a problem.
"""

from __future__ import annotations

import argparse
import importlib.util
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "tests")]

from helpers import day0_sweep as sweep  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None, help="report directories (default: a temporary one)")
    args = ap.parse_args()
    torch = all(importlib.util.find_spec(m) is not None for m in ("torch", "transformers"))
    root = args.out or Path(tempfile.mkdtemp(prefix="day0-sweep-"))
    cases = sweep.full_grid(torch)
    if torch:
        model = root / "tinyx"
        shutil.copytree(ROOT / "tests" / "data" / "remote_tinyx", model, dirs_exist_ok=True)
        cases += [sweep.Case(str(model), acc, True, devices=8, extra=("--gbs", "64", "--trust-remote-code"))
                  for acc in ("h100", "910b")]
    print(f"{len(cases)} runs; torch {'present' if torch else 'absent'}; {platform.processor() or platform.machine()}, "
          f"Python {platform.python_version()}", flush=True)
    t0 = time.perf_counter()
    failed = 0
    with sweep.shared_work():
        for c in cases:
            t = time.perf_counter()
            bad = sweep.problems(sweep.run(c, root / c.name))
            failed += bool(bad)
            print(f"{time.perf_counter() - t:6.1f} s  {c.name:40s} {'ok' if not bad else '; '.join(bad)[:300]}",
                  flush=True)
    print(f"{len(cases) - failed} of {len(cases)} runs ended in a complete report; 0 tracebacks expected, "
          f"{failed} run(s) with problems; {time.perf_counter() - t0:.0f} s in all")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
