"""Benchmark: wall time of `dayzero inspect moe-3t` as a user runs it (fresh process each time).

Target: under 1 s wall on the 2-core CI machine. Also asserts that inspect
never imports torch. Run: python benchmarks/bench_inspect.py [--runs 10]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--model", default="moe-3t")
    args = ap.parse_args()
    cmd = [sys.executable, "-m", "dayzero", "inspect", args.model, "--json"]
    times = []
    for _ in range(args.runs):
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        times.append(time.perf_counter() - t0)
    probe = subprocess.run([sys.executable, "-c", "import sys; from dayzero.cli.app import main; "
                            f"main(['inspect', '{args.model}', '--json']); print('torch' in sys.modules, "
                            "file=sys.stderr)"],
                           capture_output=True, text=True, check=True)
    torch_loaded = probe.stderr.strip().splitlines()[-1]
    print(f"dayzero inspect {args.model}: median {statistics.median(times):.3f} s, max {max(times):.3f} s "
          f"over {args.runs} runs; torch imported: {torch_loaded}")


if __name__ == "__main__":
    main()
