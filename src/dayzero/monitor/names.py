"""The exporter's metric names: one table read by the exporter, the alert rules and the Grafana
dashboard, so a rule or a panel cannot name a metric the exporter does not serve.

Naming follows Prometheus' conventions (https://prometheus.io/docs/practices/naming/): the
``dayzero_`` prefix, base units in the name (seconds, bytes, celsius, watts, ratio), ``_total``
on counters. Every series carries ``job``, ``rank`` and ``node`` labels; MoE series add ``layer``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Kind = Literal["gauge", "counter"]
LABELS = ("job", "rank", "node")


@dataclass(frozen=True)
class MetricDef:
    name: str
    kind: Kind
    help: str
    labels: tuple[str, ...] = LABELS


def _g(name: str, help: str, labels: tuple[str, ...] = LABELS) -> MetricDef:
    return MetricDef(name, "gauge", help, labels)


def _c(name: str, help: str) -> MetricDef:
    return MetricDef(name, "counter", help)


_MOE = LABELS + ("layer",)

METRICS: tuple[MetricDef, ...] = (
    # training
    _g("dayzero_step", "Optimizer steps taken (the last finished step)."),
    _c("dayzero_steps_total", "Optimizer steps finished by this rank, over all attempts of the run."),
    _g("dayzero_loss", "Global mean training loss of the last step (NaN/Inf exported as such)."),
    _g("dayzero_grad_norm", "Global gradient norm of the last step, before clipping."),
    _g("dayzero_learning_rate", "Learning rate of the last step."),
    _g("dayzero_tokens_per_second", "Training throughput of the last step (global tokens / this rank's step time)."),
    _c("dayzero_tokens_total", "Tokens trained on, over all attempts of the run."),
    _g("dayzero_model_flops_per_second", "Model FLOP/s per device of the last step (6N + attention, no recompute)."),
    _g("dayzero_mfu_ratio", "Model FLOPs utilisation of the last step against the device peak (only with a peak)."),
    # time
    _g("dayzero_step_seconds", "This rank's last iteration: seconds between its consecutive step ends."),
    _g("dayzero_step_comm_seconds", "Seconds of this rank's last step with a collective or transfer in flight."),
    _g("dayzero_step_busy_seconds", "This rank's last iteration less its communication time (a straggler's is "
                                    "the largest)."),
    _c("dayzero_comm_seconds_total", "Seconds in communication, over all attempts of the run."),
    _g("dayzero_last_step_timestamp_seconds", "Unix time at which this rank finished its last step."),
    _c("dayzero_skipped_steps_total", "Steps whose update a loss guard dropped, over all attempts of the run."),
    _c("dayzero_restarts_total", "Restarts of the job's ranks (torchrun attempts after the first)."),
    # memory
    _g("dayzero_memory_allocated_bytes", "Bytes allocated by tensors on this rank's device now."),
    _g("dayzero_memory_peak_bytes", "Peak bytes allocated on this rank's device (CPU: peak resident set)."),
    _g("dayzero_memory_reserved_bytes", "Bytes held by the device allocator's cache on this rank."),
    _g("dayzero_memory_capacity_bytes", "Bytes of memory this rank's device has (CPU: the host's)."),
    # MoE expert load (the metrics stream's "moe" record)
    _g("dayzero_moe_load_max_mean_ratio", "Tokens of the busiest expert over the mean, per MoE layer.", _MOE),
    _g("dayzero_moe_load_cv_ratio", "Coefficient of variation of tokens per expert, per MoE layer.", _MOE),
    _g("dayzero_moe_dropped_ratio", "Share of routed slots dropped by capacity, per MoE layer.", _MOE),
    _g("dayzero_moe_rank_max_mean_ratio", "Tokens of the busiest EP rank over the mean, per MoE layer.", _MOE),
    # checkpoints
    _g("dayzero_checkpoint_last_step", "Step of the newest checkpoint saved (0 before the first save)."),
    _g("dayzero_checkpoint_save_seconds", "Duration of the last checkpoint save (async: until committed)."),
    _c("dayzero_checkpoint_saves_total", "Checkpoints saved, over all attempts of the run."),
    # device (NVML on CUDA, npu-smi on Ascend, psutil on CPU)
    _g("dayzero_device_temperature_celsius", "Device temperature (CPU: hottest host sensor)."),
    _g("dayzero_device_power_watts", "Device power draw."),
    _g("dayzero_device_utilization_ratio", "Device utilisation, 0..1 (CPU: host CPU utilisation)."),
    _g("dayzero_device_memory_used_bytes", "Device memory in use, all processes (CPU: host memory in use)."),
    _g("dayzero_device_memory_total_bytes", "Device memory in total (CPU: host memory)."),
    # this process (psutil)
    _g("dayzero_process_resident_memory_bytes", "Resident set size of this rank's process."),
    _c("dayzero_process_cpu_seconds_total", "CPU seconds (user + system) used by this rank's process."),
    _g("dayzero_process_threads", "Threads of this rank's process."),
)

BY_NAME: dict[str, MetricDef] = {m.name: m for m in METRICS}


def exported_names() -> frozenset[str]:
    """Every series name a scrape can return (counters also as ``_created``, which we disable)."""
    return frozenset(BY_NAME)
