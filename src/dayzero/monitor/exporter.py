"""The Prometheus exporter: serves the newest :class:`Snapshot` of one or more ranks over HTTP.

Built on ``prometheus-client`` (its registry, text exposition and HTTP server): a custom
collector turns the snapshot into metric families named in :mod:`dayzero.monitor.names` at
scrape time, so a training step only swaps one reference (no locks, no per-metric calls on the
hot path). Needs the ``runtime`` extra; imports no torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator

from dayzero.errors import DayzeroError
from dayzero.monitor.names import METRICS
from dayzero.monitor.rank_values import RankValues


class ExporterError(DayzeroError):
    """The exporter cannot start (library missing, port taken)."""


@dataclass(frozen=True)
class JobValues:
    """The job-wide values of the newest step (the same on every rank)."""

    step: int = 0
    loss: float | None = None
    grad_norm: float | None = None
    lr: float | None = None
    model_flops_per_s: float | None = None  # per device
    mfu: float | None = None
    checkpoint_step: int | None = None  # None: the run does not checkpoint
    checkpoint_save_s: float | None = None
    moe: dict | None = None  # the metrics stream's "moe" record


@dataclass(frozen=True)
class Snapshot:
    job: str
    values: JobValues = field(default_factory=JobValues)
    ranks: tuple[RankValues, ...] = ()
    nodes: dict = field(default_factory=dict)  # rank -> node name


def series(snap: Snapshot) -> Iterator[tuple[str, dict, float]]:
    """(metric name, labels, value) for every series of ``snap``; unknown values are left out."""
    v = snap.values
    moe = v.moe or {}
    for r in snap.ranks:
        base = {"job": snap.job, "rank": str(r.rank), "node": str(snap.nodes.get(r.rank, ""))}
        per = {
            "dayzero_step": v.step, "dayzero_steps_total": r.steps_total, "dayzero_loss": v.loss,
            "dayzero_grad_norm": v.grad_norm, "dayzero_learning_rate": v.lr,
            "dayzero_tokens_per_second": r.tokens_per_s, "dayzero_tokens_total": r.tokens_total,
            "dayzero_model_flops_per_second": v.model_flops_per_s, "dayzero_mfu_ratio": v.mfu,
            "dayzero_step_seconds": r.step_s, "dayzero_step_comm_seconds": r.comm_s,
            "dayzero_step_busy_seconds": r.busy_s, "dayzero_comm_seconds_total": r.comm_s_total,
            "dayzero_last_step_timestamp_seconds": r.time_s, "dayzero_skipped_steps_total": r.skipped_total,
            "dayzero_restarts_total": r.restarts_total,
            "dayzero_memory_allocated_bytes": r.mem_allocated_bytes, "dayzero_memory_peak_bytes": r.mem_peak_bytes,
            "dayzero_memory_reserved_bytes": r.mem_reserved_bytes,
            "dayzero_memory_capacity_bytes": r.mem_capacity_bytes,
            "dayzero_checkpoint_last_step": v.checkpoint_step, "dayzero_checkpoint_save_seconds": v.checkpoint_save_s,
            "dayzero_checkpoint_saves_total": r.saves_total if r.checkpoint_step is not None else None,
            "dayzero_device_temperature_celsius": r.temperature_c, "dayzero_device_power_watts": r.power_w,
            "dayzero_device_utilization_ratio": r.utilization,
            "dayzero_device_memory_used_bytes": r.device_mem_used_bytes,
            "dayzero_device_memory_total_bytes": r.device_mem_total_bytes,
            "dayzero_process_resident_memory_bytes": r.rss_bytes, "dayzero_process_cpu_seconds_total": r.cpu_s_total,
            "dayzero_process_threads": r.threads,
        }
        for name, value in per.items():
            if value is not None:
                yield name, base, float(value)
        layers = moe.get("layers") or []
        for name, key in (("dayzero_moe_load_max_mean_ratio", "max_mean"), ("dayzero_moe_load_cv_ratio", "cv"),
                          ("dayzero_moe_dropped_ratio", "dropped"),
                          ("dayzero_moe_rank_max_mean_ratio", "rank_max_mean")):
            for layer, x in zip(layers, moe.get(key) or []):
                if x is not None:
                    yield name, {**base, "layer": str(layer)}, float(x)


class Exporter:
    """``Exporter(port).start()`` serves on 127.0.0.1-and-all-interfaces ``port``; ``update(snap)``
    replaces what the next scrape returns; ``close()`` stops the server."""

    def __init__(self, port: int, addr: str = "0.0.0.0"):
        try:
            from prometheus_client import CollectorRegistry
        except ImportError:
            raise ExporterError("--metrics-port needs prometheus-client (pip install 'dayzero[runtime]' or "
                                "pip install prometheus-client)") from None
        self.port, self.addr = port, addr
        self._snap: Snapshot | None = None
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_Collector(self))
        self._server = self._thread = None

    def start(self) -> "Exporter":
        from prometheus_client import start_http_server

        try:
            self._server, self._thread = start_http_server(self.port, addr=self.addr, registry=self.registry)
        except OSError as e:
            raise ExporterError(f"--metrics-port: cannot serve on port {self.port} ({e.strerror or e}); choose "
                                "another (rank r serves on PORT + its local rank)") from None
        return self

    def update(self, snap: Snapshot) -> None:
        self._snap = snap

    @property
    def snapshot(self) -> Snapshot | None:
        return self._snap

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._thread.join(timeout=5)
            self._server = self._thread = None


class _Collector:
    def __init__(self, exporter: Exporter):
        self._exporter = exporter

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        snap = self._exporter.snapshot
        if snap is None:
            return
        by_name: dict[str, list] = {}
        for name, labels, value in series(snap):
            by_name.setdefault(name, []).append((labels, value))
        for m in METRICS:
            rows = by_name.get(m.name)
            if not rows:
                continue
            fam_cls = CounterMetricFamily if m.kind == "counter" else GaugeMetricFamily
            fam = fam_cls(m.name, m.help, labels=list(m.labels))
            for labels, value in rows:
                fam.add_metric([labels[k] for k in m.labels], value)
            yield fam
