"""The option groups of ``dayzero train`` (:mod:`dayzero.cli.option_groups`): each group's flags as
declared on the verb, and the :mod:`dayzero.runtime.config` section they state."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Optional

import typer

from dayzero.runtime.checkpoint.manifest import CHECKSUMS, DEFAULT_CHECKSUM


@dataclass(frozen=True)
class ProxyOptions:
    """--layers, --hidden, --experts, --vocab: the proxy's size (runtime.config.ModelSection)."""

    layers: Annotated[Optional[int], typer.Option("--layers", min=1, help="Proxy: shrink to this many layers.")] = None
    hidden: Annotated[Optional[int], typer.Option("--hidden", min=8, help="Proxy: shrink to this width (heads scale "
                                                                          "along).")] = None
    experts: Annotated[Optional[int], typer.Option("--experts", min=1, help="Proxy: shrink to this many routed "
                                                                            "experts.")] = None
    vocab: Annotated[Optional[int], typer.Option("--vocab", min=257, help="Proxy: shrink the vocabulary (>= 257 for "
                                                                          "the byte tokenizer).")] = None

    def section(self, model: str, hf_weights: Path | None):
        from dayzero.runtime.config import ModelSection

        return ModelSection(model, layers=self.layers, hidden=self.hidden, experts=self.experts, vocab=self.vocab,
                            hf_weights=str(hf_weights) if hf_weights else None)


@dataclass(frozen=True)
class DataOptions:
    """--data, --reset-attention-mask: the text the run reads, and whether its packed documents attend
    only within themselves (runtime.config.TrainConfig.data / reset_attention_mask)."""

    data: Annotated[Optional[str], typer.Option("--data", help="Text file, directory or glob (default: the built-in "
                                                               "corpus).")] = None
    reset_attention_mask: Annotated[bool, typer.Option(
        "--reset-attention-mask", help="Packed documents: a token attends only within its document (documents end "
        "at the end-of-document token after each file; Megatron --reset-attention-mask); pp 1, cp 1.")] = False


@dataclass(frozen=True)
class OptimizerOptions:
    """--lr, --warmup, --grad-clip (runtime.config.OptimizerSection)."""

    lr: Annotated[float, typer.Option("--lr", help="Peak learning rate (AdamW).")] = 1e-3
    warmup: Annotated[Optional[int], typer.Option("--warmup", min=0, help="Warmup steps (default 10 % of --steps, at "
                                                                          "most 100).")] = None
    grad_clip: Annotated[float, typer.Option("--grad-clip", help="Clip the global gradient norm to this (0: "
                                                                 "off).")] = 1.0

    def section(self):
        from dayzero.runtime.config import OptimizerSection

        return OptimizerSection(lr=self.lr, warmup=self.warmup, grad_clip=self.grad_clip)


@dataclass(frozen=True)
class CheckpointOptions:
    """--ckpt-dir ... --ckpt-checksum (runtime.config.CheckpointSection)."""

    ckpt_dir: Annotated[Optional[Path], typer.Option("--ckpt-dir", help="Checkpoint directory: resume from its newest "
                                                                        "good version, save into it.")] = None
    ckpt_every: Annotated[Optional[int], typer.Option(
        "--ckpt-every", min=0, help="Save every N steps (0: only at the end; default: the interval --plan derived, "
                                    "else 0).")] = None
    keep: Annotated[int, typer.Option("--keep", min=1, help="Complete checkpoints of this run's lineage to keep (the "
                                                            "newest is never deleted).")] = 3
    prune_other_lineages: Annotated[bool, typer.Option("--ckpt-prune-other-lineages", help="Let retention also delete "
                                                                                           "the versions of other "
                                                                                           "lineages (runs or "
                                                                                           "branches) in "
                                                                                           "--ckpt-dir.")] = False
    resume: Annotated[str, typer.Option("--resume", help="auto (most recently written good version) | never | a step "
                                                         "(an older one starts a branch) | a version "
                                                         "directory.")] = "auto"
    async_save: Annotated[bool, typer.Option("--async-save", help="Write checkpoints in the background (only the copy "
                                                                  "to CPU memory blocks).")] = False
    ckpt_checksum: Annotated[str, typer.Option("--ckpt-checksum", help="Per-file checksum in checkpoint manifests: "
                                                                       f"{' | '.join(CHECKSUMS)}.")] = DEFAULT_CHECKSUM

    def section(self, every: int):
        """The section, saving every ``every`` steps (``ckpt_every``, or the interval a plan derived)."""
        from dayzero.runtime.config import CheckpointSection

        return CheckpointSection(dir=str(self.ckpt_dir) if self.ckpt_dir else None, every=every, keep=self.keep,
                                 prune_other_lineages=self.prune_other_lineages, resume=self.resume,
                                 async_save=self.async_save, checksum=self.ckpt_checksum)


@dataclass(frozen=True)
class FaultOptions:
    """--max-restarts ... --on-rank-failure: restarts, drills, the watchdog, loss guards and alert
    actions (runtime.config.FaultSection)."""

    max_restarts: Annotated[int, typer.Option("--max-restarts", min=0, help="Restart all ranks this often after a "
                                                                            "failure (with --nproc; under torchrun "
                                                                            "use its own flag).")] = 0
    inject_fault: Annotated[Optional[list[str]], typer.Option(
        "--inject-fault", help="Drill: step=N,rank=R,kind=kill|exception|hang|straggler[,sleep=S][,at=step|save]"
                               "[,attempt=A] (repeatable; straggler: sleep S s every step from N on).")] = None
    watchdog: Annotated[float, typer.Option("--watchdog", min=0, help="Abort a rank with no finished step for this "
                                                                      "many seconds, so torchrun restarts (0: "
                                                                      "off).")] = 0.0
    save_timeout: Annotated[Optional[float], typer.Option("--save-timeout", help="Watchdog budget in seconds for one "
                                                                                 "checkpoint save (async: until "
                                                                                 "committed), resume or rollback; a "
                                                                                 "longer one is a hang (default 600 "
                                                                                 "with --watchdog; alone: only "
                                                                                 "checkpoint I/O is timed).")] = None
    on_bad_loss: Annotated[Optional[str], typer.Option("--on-bad-loss", help="On a NaN/Inf loss or a spike: skip "
                                                                             "(drop the step) | rollback (reload the "
                                                                             "last checkpoint, skip the "
                                                                             "batch).")] = None
    spike_factor: Annotated[float, typer.Option("--spike-factor", min=0, help="With --on-bad-loss: a loss above this "
                                                                              "x the running mean is a spike (0: "
                                                                              "NaN/Inf only).")] = 0.0
    on_alert: Annotated[Optional[list[str]], typer.Option(
        "--on-alert", help="NAME=log|checkpoint|restart|exclude: act on an in-process alert (repeatable; "
                           "all=ACTION for the rest; default log). restart/exclude save a checkpoint and relaunch, "
                           "exclude without the offending ranks (docs/runtime.md).")] = None
    spares: Annotated[int, typer.Option("--spares", min=0, help="With --nproc: keep this many more local ranks idle "
                                                                "to replace excluded ones.")] = 0
    on_rank_failure: Annotated[str, typer.Option("--on-rank-failure", help="restart (default) | exclude: restart "
                                                                           "without a rank that crashed or was "
                                                                           "killed on its own (with --nproc, "
                                                                           "--max-restarts, --ckpt-dir).")] = "restart"

    def section(self):
        from dayzero.runtime.config import FaultSection

        return FaultSection(max_restarts=self.max_restarts, inject_faults=tuple(self.inject_fault or ()),
                            watchdog=self.watchdog, save_timeout=self.save_timeout, on_bad_loss=self.on_bad_loss,
                            spike_factor=self.spike_factor, on_alert=tuple(self.on_alert or ()), spares=self.spares,
                            on_rank_failure=self.on_rank_failure)


@dataclass(frozen=True)
class MonitorOptions:
    """--metrics-port ... --alert-threshold: the Prometheus exporter and in-process alerts
    (runtime.config.MonitorSection)."""

    metrics_port: Annotated[Optional[int], typer.Option("--metrics-port", min=1, max=65535, help="Serve Prometheus "
                                                        "metrics: rank r on PORT + its local rank (or rank 0 alone "
                                                        "with --metrics-aggregate).")] = None
    metrics_aggregate: Annotated[bool, typer.Option("--metrics-aggregate", help="Rank 0 serves every rank's "
                                                                                "series on --metrics-port.")] = False
    metrics_linger: Annotated[float, typer.Option("--metrics-linger", min=0, help="Keep serving metrics this many "
                                                                                  "seconds after the last "
                                                                                  "step.")] = 0.0
    metrics_job: Annotated[Optional[str], typer.Option("--metrics-job", help="The job label of every series "
                                                                             "(default: the model's name).")] = None
    peak_tflops: Annotated[Optional[float], typer.Option("--peak-tflops", min=0, help="Device peak TFLOP/s, for the "
                                                                                      "exported MFU.")] = None
    alerts: Annotated[bool, typer.Option("--alerts", help="Evaluate the alert rules in process each step and log "
                                                          "alert events (dayzero monitor --rules lists "
                                                          "them).")] = False
    alert_threshold: Annotated[Optional[list[str]], typer.Option(
        "--alert-threshold", help="KEY=VALUE override of an alert threshold, e.g. straggler_ratio=0.3 "
                                  "(repeatable).")] = None

    def section(self, on_alert: bool):
        """The section; alerts are evaluated also where an action acts on them (``on_alert``)."""
        from dayzero.monitor.rules import threshold_overrides
        from dayzero.runtime.config import MonitorSection

        return MonitorSection(port=self.metrics_port, aggregate=self.metrics_aggregate, alerts=self.alerts or on_alert,
                              thresholds=threshold_overrides(self.alert_threshold or []),
                              linger_s=self.metrics_linger, job=self.metrics_job, peak_tflops=self.peak_tflops)


@dataclass(frozen=True)
class MoEOptions:
    """--moe-bias-rate ... --placement: routing balance, expert-load telemetry and the expert placement
    (runtime.config.MoESection)."""

    moe_bias_rate: Annotated[float, typer.Option("--moe-bias-rate", min=0, help="MoE: auxiliary-loss-free balancing "
                                                                            "bias update speed gamma for routers with "
                                                                            "a score-correction bias (DeepSeek-V3: "
                                                                            "0.001; 0: off).")] = 1e-3
    moe_aux_loss: Annotated[str, typer.Option("--moe-aux-loss", help="MoE balance loss: model (the model config's) | "
                                                                     "none | seq (DeepSeek-V3 sequence-wise) | global "
                                                                     "(global-batch) | micro (Switch, per "
                                                                     "micro-batch).")] = "model"
    moe_aux_coef: Annotated[Optional[float], typer.Option("--moe-aux-coef", min=0, help="MoE balance loss coefficient "
                                                                                        "(default: DeepSeek-V3's alpha "
                                                                                        "1e-4; with 'model' the "
                                                                                        "config's).")] = None
    moe_z_loss: Annotated[float, typer.Option("--moe-z-loss", min=0, help="MoE router z-loss coefficient (ST-MoE "
                                                                          "recommends 1e-3; 0: off).")] = 0.0
    moe_capacity_factor: Annotated[Optional[float], typer.Option("--moe-capacity-factor", help="MoE: drop routed slots "
                                                                                               "beyond this x the even "
                                                                                               "share per expert "
                                                                                               "(default: "
                                                                                               "dropless).")] = None
    moe_loads_every: Annotated[int, typer.Option("--moe-loads-every", min=1, help="MoE: write the full per-expert load "
                                                                                  "vector to the metrics every N steps "
                                                                                  "(and on the last).")] = 10
    placement: Annotated[Optional[str], typer.Option("--placement", help="MoE: expert placement file (`dayzero moe "
                                                                          "place --out`): slots per EP rank, hot "
                                                                          "experts replicated.")] = None

    def section(self):
        from dayzero.runtime.config import MoESection

        return MoESection(bias_rate=self.moe_bias_rate, aux_loss=self.moe_aux_loss, aux_coef=self.moe_aux_coef,
                          z_loss=self.moe_z_loss, capacity_factor=self.moe_capacity_factor,
                          loads_every=self.moe_loads_every, placement=str(self.placement) if self.placement else None)
