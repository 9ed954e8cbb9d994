"""Exporter overhead on step time (target <= 1 %).

One process trains a tiny-llama proxy with the monitor off, with the exporter on (a scraper thread
pulling /metrics every --scrape-s seconds, more often than Prometheus' usual 15 s), and with the
exporter plus the in-process alert rules, in interleaved rounds (so load changes on a shared
machine hit every mode alike). Per round it records the iteration time (wall between consecutive
step ends, which includes the monitor's own per-step work) and the process CPU time per step (all
threads: the HTTP server's and the telemetry reader's too; steadier than wall time when other jobs
share the cores) after a warm-up, the time spent inside ``Monitor.after_step`` and each scrape's
round trip. Reports the median over rounds per mode and the overhead vs off.

    PYTHONPATH=src python benchmarks/bench_monitor.py --rounds 5 --steps 40
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

# polls /metrics every interval and prints each round trip in ms (flushed: it is killed at the end)
SCRAPER = """
import sys, time, urllib.request
port, every = sys.argv[1], float(sys.argv[2])
while True:
    time.sleep(every)
    t0 = time.perf_counter()
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read()
        print(round(1e3 * (time.perf_counter() - t0), 3), flush=True)
    except OSError:
        pass
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--scrape-s", type=float, default=1.0)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    args = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")

    import torch

    torch.set_num_threads(1)
    from dayzero.monitor.ports import free_port_range
    from dayzero.runtime import monitoring
    from dayzero.runtime.config import ModelSection, MonitorSection, TrainConfig
    from dayzero.runtime.distributed import destroy_process_group, init_distributed
    from dayzero.runtime.train import build_state, train
    from dayzero.specs.parallel import ParallelConfig

    device = init_distributed()
    inside: list[float] = []
    orig = monitoring.Monitor.after_step

    def timed(self, *a, **kw):
        t0 = time.perf_counter()
        try:
            return orig(self, *a, **kw)
        finally:
            inside.append(time.perf_counter() - t0)

    monitoring.Monitor.after_step = timed
    port = free_port_range(1)
    modes = {"off": MonitorSection(), "exporter": MonitorSection(port=port),
             "exporter+alerts": MonitorSection(port=port, alerts=True)}
    results: dict[str, list[float]] = {m: [] for m in modes}
    cpu: dict[str, list[float]] = {m: [] for m in modes}
    scrape_ms: dict[str, list[float]] = {m: [] for m in modes}
    inside_by: dict[str, list[float]] = {m: [] for m in modes}
    scrapes = {m: 0 for m in modes}
    for _ in range(args.rounds):
        for name, mon in modes.items():
            cfg = TrainConfig(model=ModelSection("tiny-llama", layers=args.layers, hidden=args.hidden, vocab=512),
                              parallel=ParallelConfig(gbs=4, mbs=4, seq=128), monitor=mon, steps=args.steps,
                              compute_dtype="fp32", quiet=True, measure_comm=False)
            ends: list[tuple[float, float]] = []
            scraper = None
            if mon.port is not None:  # another process, as Prometheus is: its CPU is not the trainer's
                scraper = subprocess.Popen([sys.executable, "-c", SCRAPER, str(port), str(args.scrape_s)],
                                           stdout=subprocess.PIPE, text=True)
            inside.clear()

            def mark(state, rec, ends=ends):
                ends.append((time.perf_counter(), time.process_time()))

            train(cfg, hooks=(mark,), state=build_state(cfg, device))
            if scraper is not None:
                scraper.terminate()
                lines = scraper.communicate(timeout=30)[0].split()
                scrape_ms[name].extend(float(x) for x in lines)
                scrapes[name] += len(lines)
            steady = ends[args.warmup:]
            results[name].append((steady[-1][0] - steady[0][0]) / (len(steady) - 1))
            cpu[name].append((steady[-1][1] - steady[0][1]) / (len(steady) - 1))
            inside_by[name].extend(inside[args.warmup:])
    destroy_process_group()
    collect_ms = _collect_ms()
    base = statistics.median(results["off"])
    base_cpu = statistics.median(cpu["off"])
    out = {"date": time.strftime("%Y-%m-%d"), "rounds": args.rounds, "steps": args.steps,
           "scrape_s": args.scrape_s, "load_avg": os.getloadavg()[0], "collect_ms_per_scrape": collect_ms,
           "modes": {}}
    for name in modes:
        med = statistics.median(results[name])
        out["modes"][name] = {"iteration_s_median": round(med, 5), "overhead_pct": round(100 * (med / base - 1), 2),
                              "after_step_ms_median": round(1e3 * statistics.median(inside_by[name]), 4)
                              if inside_by[name] else 0.0,
                              "after_step_pct_of_step": round(100 * statistics.median(inside_by[name]) / base, 3)
                              if inside_by[name] else 0.0,
                              "cpu_s_per_step_median": round(statistics.median(cpu[name]), 5),
                              "cpu_overhead_pct": round(100 * (statistics.median(cpu[name]) / base_cpu - 1), 2),
                              "scrape_ms_median": round(statistics.median(scrape_ms[name]), 3)
                              if scrape_ms[name] else None,
                              "scrapes": scrapes[name], "cpu_per_round_s": [round(x, 5) for x in cpu[name]],
                              "per_round_s": [round(x, 5) for x in results[name]]}
    print(json.dumps(out, indent=1))


def _collect_ms(n: int = 200) -> float:
    """CPU ms the exporter spends rendering one scrape of one rank (median of ``n``)."""
    from prometheus_client import generate_latest

    from dayzero.monitor.exporter import Exporter, JobValues, Snapshot
    from dayzero.monitor.rank_values import RankValues

    ex = Exporter(0)
    row = RankValues(rank=0, step_s=1.0, comm_s=0.1, tokens_per_s=1e3, mem_peak_bytes=1e9, mem_capacity_bytes=8e10,
                     temperature_c=60.0, power_w=500.0, utilization=0.9, rss_bytes=1e9, cpu_s_total=10.0, time_s=1e9)
    moe = {"layers": list(range(8)), "max_mean": [1.5] * 8, "cv": [0.2] * 8, "dropped": [0.0] * 8,
           "rank_max_mean": [1.1] * 8}
    ex.update(Snapshot("bench", JobValues(step=1, loss=2.0, grad_norm=1.0, lr=1e-3, checkpoint_step=0, moe=moe),
                       (row,), {0: "n"}))
    times = []
    for _ in range(n):
        t0 = time.process_time()
        generate_latest(ex.registry)
        times.append(time.process_time() - t0)
    return round(1e3 * statistics.median(times), 4)


if __name__ == "__main__":
    main()
