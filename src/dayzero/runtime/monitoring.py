"""The training loop's monitor: per-step values for the Prometheus exporter and the in-process
alert rules (:mod:`dayzero.monitor`), from ``config.monitor`` (``dayzero train --metrics-port``,
``--alerts``).

Each rank measures its own step: its iteration time (between consecutive step ends, so time a rank
spends outside the timed step, e.g. a sleeping straggler, shows), its own communication time (before
the step record's max over ranks), its memory, and device and host telemetry read by a background
thread every ``telemetry_interval_s`` (never on the step). With ``--alerts`` or
``--metrics-aggregate`` the ranks all-gather these rows once per step; every rank then evaluates
the same rules on the same rows, so every rank sees the same alerts (an action that needs a
collective, such as a checkpoint, can follow on all ranks without another exchange).
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
from dataclasses import replace
from typing import Callable

import torch
import torch.distributed as dist

from dayzero.monitor.counters import Counters, counters_path
from dayzero.monitor.evaluator import Alert, RuleEvaluator
from dayzero.monitor.exporter import Exporter, JobValues, Snapshot
from dayzero.monitor.rank_values import RankValues, ranks_event, step_sample, vector_size
from dayzero.runtime import device as devices
from dayzero.runtime.telemetry import TelemetryReader


class TelemetrySampler:
    """Reads device telemetry and this process's figures every ``interval_s`` on a daemon thread;
    ``latest`` is the newest reading (empty until the first)."""

    def __init__(self, device, interval_s: float):
        self.device, self.interval_s = device, max(0.05, interval_s)
        self.latest: dict = {}
        self._stop = threading.Event()
        self._reader = TelemetryReader(device)
        self._thread = threading.Thread(target=self._run, name="dayzero-telemetry", daemon=True)

    def start(self) -> "TelemetrySampler":
        self.read_now()
        self._thread.start()
        return self

    def read_now(self) -> None:
        out = dict(self._reader.read())
        try:
            import psutil

            p = psutil.Process()
            ct = p.cpu_times()
            out.update(rss_bytes=float(p.memory_info().rss), threads=float(p.num_threads()),
                       cpu_s=float(ct.user + ct.system), host_total_bytes=float(psutil.virtual_memory().total))
        except ImportError:  # the telemetry reader has said psutil is missing
            pass
        self.latest = out

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.read_now()

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)


class HangWatch:
    """The rules no step evaluates: a daemon thread ticks the evaluator every ``interval_s`` and
    reports each alert that starts firing between steps (the hang rule: no step for ``hang_s``).

    It only reports (``on_alert``): the training thread is stuck in exactly this case, so any
    action that needs the ranks (a checkpoint, a restart) is the hang watchdog's
    (:mod:`dayzero.runtime.resilience.watchdog`), which aborts the process group and lets the
    launcher restart. ``lock`` is the one the training thread holds around ``observe``."""

    def __init__(self, evaluator: RuleEvaluator, lock: threading.Lock, active: Callable[[], dict],
                 on_alert: Callable[[Alert], None], interval_s: float, clock: Callable[[], float] = time.time):
        self.evaluator, self.lock, self.active, self.on_alert = evaluator, lock, active, on_alert
        self.interval_s, self.clock = interval_s, clock
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="dayzero-hang-watch", daemon=True)

    def start(self) -> "HangWatch":
        self._thread.start()
        return self

    def check(self) -> list[Alert]:
        """One tick: the alerts that fire now and were not firing at the last step (reported)."""
        with self.lock:
            new = [a for a in self.evaluator.tick(self.clock()) if a.name not in self.active()]
            for a in new:
                self.on_alert(a)
        return new

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.check()

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)


class Monitor:
    """``after_step(state, record, skipped)`` -> the alerts firing (``[]`` without ``--alerts``)."""

    def __init__(self, config, state, continuing: bool, emit: Callable[[dict], None]):
        m = config.monitor
        self.cfg, self.emit = m, emit
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self.device = state.device
        self.job = m.job or state.spec.name
        self.node = socket.gethostname()
        self.gather = self.world > 1 and (m.alerts or m.aggregate)
        self.evaluator = RuleEvaluator(thresholds=m.thresholds) if m.alerts else None
        self.active: dict[str, Alert] = {}
        self._counters_path = counters_path(config.metrics, self.rank)
        self.counters = Counters.load(self._counters_path) if continuing else Counters()
        if continuing:
            self.counters.restarts += 1
        self._cpu_base = self.counters.cpu_s
        from dayzero.specs.counting import flops_per_token

        p = config.parallel
        self._flops_per_token = flops_per_token(state.spec, p.seq, causal=True).train
        # checkpoint events reach rank 0 only: the other ranks learn the step from its gathered row
        self._ckpt_step = 0 if config.checkpoint.dir and self.rank == 0 else None
        self._ckpt_save_s: float | None = None
        self._last_end = None
        self.nodes = {self.rank: self.node}
        if self.gather or m.aggregate:
            names: list = [None] * self.world
            dist.all_gather_object(names, self.node)
            self.nodes = dict(enumerate(names))
        self.sampler = TelemetrySampler(self.device, m.telemetry_interval_s).start()
        self._lock = threading.Lock()  # the evaluator and the active alerts, shared with the hang watch
        self.hang_watch = None
        if self.evaluator is not None:
            tick = min(10.0, max(0.5, self.evaluator.thresholds["hang_s"] / 10))
            self.hang_watch = HangWatch(self.evaluator, self._lock, lambda: self.active, self._fire, tick).start()
        self.exporter = None
        if m.port is not None and (not m.aggregate or self.rank == 0):
            self.exporter = Exporter(m.port + (0 if m.aggregate else self.local_rank)).start()

    def resumed_at(self, step: int) -> None:
        """The loop resumed from a checkpoint at ``step``: that is the newest checkpoint."""
        if self._ckpt_step is not None:
            self._ckpt_step = step

    def on_event(self, ev: dict) -> None:
        if ev.get("event") == "checkpoint_saved":
            self._ckpt_step = int(ev["step"])
            self._ckpt_save_s = float(ev.get("seconds", 0.0))
            self.counters.saves += 1
        elif ev.get("event") == "rollback" and "to_step" in ev and self._ckpt_step is not None:
            self._ckpt_step = int(ev["to_step"])

    def after_step(self, state, rec, skipped: bool = False) -> list[Alert]:
        now_perf, now = time.perf_counter(), time.time()
        step_s = rec.step_time_s if self._last_end is None else now_perf - self._last_end
        self._last_end = now_perf
        c = self.counters
        c.steps += 1
        c.tokens += rec.tokens
        c.comm_s += state.local_comm_s
        c.skipped += 1 if skipped else 0
        row = self._row(state, rec, step_s, now)
        rows = self._gather(row) if self.gather else [row]
        c.save(self._counters_path)
        if self.gather:  # every rank's row in the stream, for `dayzero monitor RUN_DIR`
            self.emit(ranks_event(rec.step, rows))
        alerts = self._evaluate(rec, rows) if self.evaluator is not None else []
        if self.exporter is not None:
            self.exporter.update(self._snapshot(rec, rows if self.cfg.aggregate else [row]))
        return alerts

    def _row(self, state, rec, step_s: float, now: float) -> RankValues:
        t = self.sampler.latest
        stats = devices.memory_stats(self.device)
        cap = devices.device_total_bytes(self.device) or t.get("host_total_bytes")
        util = t.get("utilization_pct")
        cpu = t.get("cpu_s")
        c = self.counters
        return RankValues(
            rank=self.rank, step_s=step_s, comm_s=state.local_comm_s, tokens_per_s=rec.tokens_per_s,
            mem_peak_bytes=float(state.local_peak_bytes), mem_allocated_bytes=stats.allocated,
            mem_reserved_bytes=stats.reserved, mem_capacity_bytes=cap, temperature_c=t.get("temperature_c"),
            power_w=t.get("power_w"), utilization=None if util is None else util / 100.0,
            device_mem_used_bytes=t.get("memory_used_bytes"), device_mem_total_bytes=t.get("memory_total_bytes"),
            rss_bytes=t.get("rss_bytes"), threads=t.get("threads"), steps_total=c.steps, tokens_total=c.tokens,
            comm_s_total=c.comm_s, skipped_total=c.skipped, saves_total=c.saves, restarts_total=c.restarts,
            cpu_s_total=None if cpu is None else self._cpu_base + cpu, time_s=now, checkpoint_step=self._ckpt_step)

    def _gather(self, row: RankValues) -> list[RankValues]:
        mine = torch.tensor(row.to_vector(), dtype=torch.float64, device=self.device)
        out = [torch.empty(vector_size(), dtype=torch.float64, device=self.device) for _ in range(self.world)]
        dist.all_gather(out, mine)
        return [RankValues.from_vector(t.cpu().tolist()) for t in out]

    def _evaluate(self, rec, rows: list[RankValues]) -> list[Alert]:
        # every rank has the same rows: the newest time is the same everywhere, so are the alerts
        sample = step_sample(rec.step, rec.loss, rows)
        with self._lock:
            alerts = self.evaluator.observe(sample)
            now = {a.name: a for a in alerts}
            for name, a in now.items():
                if name not in self.active:
                    self._fire(a)
            for name, a in self.active.items():
                if name not in now:
                    self.emit({"event": "alert", "state": "resolved", **replace(a, step=rec.step).to_dict()})
            self.active = now
        return alerts

    def _fire(self, a: Alert) -> None:
        """An alert starts firing: a stream event, and a line on rank 0's terminal. Between steps
        (the hang watch) it also joins the active set, so the next step reports it resolved."""
        self.emit({"event": "alert", "state": "firing", **a.to_dict()})
        if self.rank == 0:
            print(f"dayzero: alert {a.name} ({a.severity}) at step {a.step}: {a.message}", file=sys.stderr,
                  flush=True)
        self.active = {**self.active, a.name: a}

    def _snapshot(self, rec, rows: list[RankValues]) -> Snapshot:
        per_device = self._flops_per_token * rec.tokens_per_s / self.world
        peak = self.cfg.peak_tflops
        moe = getattr(rec, "moe", None)
        values = JobValues(step=rec.step, loss=rec.loss, grad_norm=rec.grad_norm, lr=rec.lr,
                           model_flops_per_s=per_device, mfu=per_device / (peak * 1e12) if peak else None,
                           checkpoint_step=self._ckpt_step if self._ckpt_step is not None else
                           (None if rows[0].checkpoint_step is None else int(rows[0].checkpoint_step)),
                           checkpoint_save_s=self._ckpt_save_s,
                           moe=moe if isinstance(moe, dict) else None)
        return Snapshot(self.job, values, tuple(rows), self.nodes)

    def close(self, linger: bool = True) -> None:
        if self.hang_watch is not None:
            self.hang_watch.close()
        self.sampler.close()
        self.sampler.read_now()
        self.counters.cpu_s = self._cpu_base + (self.sampler.latest.get("cpu_s") or 0.0)
        self.counters.save(self._counters_path)
        if self.exporter is not None:
            if linger and self.cfg.linger_s > 0:
                time.sleep(self.cfg.linger_s)
            self.exporter.close()

