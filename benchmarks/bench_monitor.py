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
import threading
import time
import urllib.request


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
            stop = threading.Event()

            def scraper(stop=stop, name=name):
                while not stop.wait(args.scrape_s):
                    try:
                        t0 = time.perf_counter()
                        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read()
                        scrape_ms[name].append(1e3 * (time.perf_counter() - t0))
                        scrapes[name] += 1
                    except OSError:
                        pass

            th = threading.Thread(target=scraper, daemon=True)
            if mon.port is not None:
                th.start()
            inside.clear()
            def mark(state, rec, ends=ends):
                ends.append((time.perf_counter(), time.process_time()))

            train(cfg, hooks=(mark,), state=build_state(cfg, device))
            stop.set()
            steady = ends[args.warmup:]
            results[name].append((steady[-1][0] - steady[0][0]) / (len(steady) - 1))
            cpu[name].append((steady[-1][1] - steady[0][1]) / (len(steady) - 1))
            inside_by[name].extend(inside[args.warmup:])
    destroy_process_group()
    base = statistics.median(results["off"])
    base_cpu = statistics.median(cpu["off"])
    out = {"date": time.strftime("%Y-%m-%d"), "rounds": args.rounds, "steps": args.steps,
           "scrape_s": args.scrape_s, "load_avg": os.getloadavg()[0], "modes": {}}
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
                              "scrapes": scrapes[name], "per_round_s": [round(x, 5) for x in results[name]]}
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
