"""TrainConfig: everything one training run needs, as a plain document in sections.

Like torchtitan's job config, the run is a few small sections plus run-level fields:
``model`` (:class:`ModelSection`: what to build, at which proxy size, from which weights),
``parallel`` (the :class:`~dayzero.specs.parallel.ParallelConfig`), ``optimizer``
(:class:`OptimizerSection`), ``moe`` (:class:`MoESection`: routing balance, expert-load
telemetry, the expert placement), ``checkpoint`` (:class:`CheckpointSection`), ``faults``
(:class:`FaultSection`: restarts, drills, the watchdog, loss guards, alert actions) and ``monitor``
(:class:`MonitorSection`: the Prometheus exporter and in-process alerts).

Written next to the run's outputs (``<metrics>.config.json``) and handed to every rank, so the
run that happened can always be read back and repeated. ``from_dict`` also reads the flat
documents older versions wrote (:func:`upgrade_flat`), and moves ``optimizer.expert_bias_rate`` of
documents written before the ``moe`` section to ``moe.bias_rate``.
"""

from __future__ import annotations

import json
from dataclasses import MISSING, asdict, dataclass, field, fields, replace
from pathlib import Path

from dayzero.errors import DayzeroError
from dayzero.runtime.checkpoint.manifest import DEFAULT_CHECKSUM
from dayzero.specs.model import SHRINK_KEYS
from dayzero.specs.parallel import ParallelConfig

COMPUTE_DTYPES = ("bf16", "fp32")


@dataclass(frozen=True)
class ModelSection:
    name: str  # preset name, config.json or a directory holding one
    # proxy sizing: keep the architecture, shrink the size (ModelSpec.shrink)
    layers: int | None = None
    hidden: int | None = None
    experts: int | None = None
    vocab: int | None = None
    hf_weights: str | None = None  # start from a HF safetensors checkpoint instead of random init

    @property
    def shrink(self) -> dict:
        """The proxy sizes given (``ModelSpec.shrink`` keywords; none: full size)."""
        return {k: getattr(self, k) for k in SHRINK_KEYS if getattr(self, k) is not None}

    def spec(self):
        from dayzero.specs.registry import load_model

        spec = load_model(self.name)
        if spec.extra.get("derived"):  # trained as transformers' own module: its proxy config, described
            from dayzero.runtime.models.hf_model import proxy_spec

            return proxy_spec(self)
        return spec.shrink(**{k: getattr(self, k) for k in SHRINK_KEYS})

    def recipe(self) -> dict:
        """What rebuilds the ModelSpec, as checkpoint manifests record it (``model.recipe``):
        the model (a path made absolute, as ``load_model`` resolves it) and the proxy sizes."""
        model = str(Path(self.name).resolve()) if Path(self.name).exists() else self.name
        return {"model": model, **{k: getattr(self, k) for k in SHRINK_KEYS}}

    @classmethod
    def from_recipe(cls, recipe: dict) -> "ModelSection":
        return cls(name=recipe["model"], **{k: recipe.get(k) for k in SHRINK_KEYS})


@dataclass(frozen=True)
class OptimizerSection:
    # defaults: a small-model pretraining recipe; see optim.py for sources
    lr: float = 1e-3
    min_lr_ratio: float = 0.1  # cosine floor as a fraction of lr (Llama: 10 %, Touvron et al. 2023)
    warmup: int | None = None  # steps; None: 10 % of the run, at most 100
    weight_decay: float = 0.1
    grad_clip: float = 1.0

    def warmup_steps(self, steps: int) -> int:
        return self.warmup if self.warmup is not None else max(1, min(100, steps // 10))


AUX_LOSSES = ("model", "none", "seq", "global", "micro")  # runtime.models.moe.AUX_LOSSES + "model"


@dataclass(frozen=True)
class MoESection:
    """Routing balance and expert-load telemetry of MoE runs (docs/moe.md)."""

    # DeepSeek-V3's bias update speed gamma for auxiliary-loss-free balancing (arXiv 2412.19437, sec. 4.2: 0.001)
    bias_rate: float = 1e-3
    # model: what the model's config asks for (its aux_loss_coef as a micro-batch loss, or none)
    aux_loss: str = "model"
    # None: DeepSeek-V3's sequence-wise alpha 1e-4 (arXiv 2412.19437, sec. 4.2) for seq | global | micro
    aux_coef: float | None = None
    z_loss: float = 0.0  # router z-loss coefficient (ST-MoE recommends 1e-3, arXiv 2202.08906 sec. 3.1)
    capacity_factor: float | None = None  # None: dropless (DeepSeek-V3 drops no tokens)
    loads_every: int = 10  # steps between full expert-load vectors in the metrics (and the last step)
    placement: str | None = None  # expert placement file (dayzero-expert-placement/1)

    def problems(self) -> list[str]:
        out = []
        if self.aux_loss not in AUX_LOSSES:
            out.append(f"--moe-aux-loss {self.aux_loss!r}: expected one of {', '.join(AUX_LOSSES)}")
        for name, v in (("--moe-bias-rate", self.bias_rate), ("--moe-aux-coef", self.aux_coef),
                        ("--moe-z-loss", self.z_loss)):
            if v is not None and not v >= 0:
                out.append(f"{name} {v}: must be >= 0")
        if self.capacity_factor is not None and not 0 < self.capacity_factor < float("inf"):
            out.append(f"--moe-capacity-factor {self.capacity_factor}: must be a finite number > 0 (omit it for "
                       "dropless routing)")
        if self.loads_every < 1:
            out.append(f"--moe-loads-every {self.loads_every}: must be >= 1")
        return out

    def check(self) -> None:
        problems = self.problems()
        if problems:
            raise DayzeroError("; ".join(problems))


@dataclass(frozen=True)
class CheckpointSection:
    # see dayzero.runtime.resilience.loop and docs/checkpoints.md
    dir: str | None = None
    every: int = 0  # steps between saves (0: only at the end)
    keep: int = 3  # versions of the run's own lineage kept by retention
    prune_other_lineages: bool = False  # retention also deletes other lineages' versions
    resume: str = "auto"  # auto | never | a step | a version directory
    async_save: bool = False
    checksum: str = DEFAULT_CHECKSUM  # per-file checksum in the manifest (manifest.CHECKSUMS)


@dataclass(frozen=True)
class FaultSection:
    max_restarts: int = 0  # torchrun restarts when dayzero spawns the ranks (--nproc)
    # drills: "step=N,rank=R,kind=kill|exception|hang|straggler[,sleep=S][,at=save]"
    inject_faults: tuple[str, ...] = ()
    watchdog: float = 0.0  # seconds without a finished step before a rank aborts (0: off)
    # seconds a checkpoint save (or resume, rollback) may take before the watchdog aborts the rank;
    # None: 600 with --watchdog, else not timed (resilience.DEFAULT_SAVE_TIMEOUT_S)
    save_timeout: float | None = None
    on_bad_loss: str | None = None  # skip | rollback on a NaN/Inf or spiking loss (None: no guard)
    spike_factor: float = 0.0  # a loss > this x the running mean is a spike (0: NaN/Inf only)
    # in-process alerts: "NAME=log|checkpoint|restart|exclude" (resilience.actions; none: alerts off)
    on_alert: tuple[str, ...] = ()
    spares: int = 0  # idle local ranks (--nproc) that replace excluded ones on a restart
    on_rank_failure: str = "restart"  # restart | exclude: a rank that fails on its own is left out of the restart


@dataclass(frozen=True)
class MonitorSection:
    # see dayzero.runtime.monitoring and docs/monitoring.md
    port: int | None = None  # serve Prometheus metrics on port + local rank (aggregate: rank 0 on port)
    aggregate: bool = False  # rank 0 serves every rank's series (one all_gather per step)
    alerts: bool = False  # evaluate the alert rules in process (one all_gather per step), log alert events
    thresholds: dict = field(default_factory=dict)  # alert threshold overrides (dayzero.monitor.rules)
    linger_s: float = 0.0  # keep serving this long after the last step (a final scrape)
    job: str | None = None  # the job label (default: the model's name)
    telemetry_interval_s: float = 5.0  # device and host telemetry is read this often, off the step
    peak_tflops: float | None = None  # device peak, for dayzero_mfu_ratio

    @property
    def enabled(self) -> bool:
        return self.port is not None or self.alerts


SECTIONS = {"model": ModelSection, "optimizer": OptimizerSection, "moe": MoESection,
            "checkpoint": CheckpointSection, "faults": FaultSection, "monitor": MonitorSection}


@dataclass(frozen=True)
class TrainConfig:
    model: ModelSection
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    optimizer: OptimizerSection = field(default_factory=OptimizerSection)
    moe: MoESection = field(default_factory=MoESection)
    checkpoint: CheckpointSection = field(default_factory=CheckpointSection)
    faults: FaultSection = field(default_factory=FaultSection)
    monitor: MonitorSection = field(default_factory=MonitorSection)
    steps: int = 100
    seed: int = 0
    compute_dtype: str = "bf16"
    data: str | None = None  # file, directory or glob; None: the built-in corpus
    # packed documents: attention within each document of a window (Megatron --reset-attention-mask;
    # runtime.models.attention.document_ids), documents ending at the data's end-of-document token
    reset_attention_mask: bool = False
    metrics: str | None = None  # JSONL path (rank 0 writes)
    quiet: bool = False
    # time inside collectives through the profiler (comm_time_s); costs a few % of step time
    measure_comm: bool = True

    @property
    def warmup_steps(self) -> int:
        return self.optimizer.warmup_steps(self.steps)

    def spec(self):
        return self.model.spec()

    def to_dict(self) -> dict:
        d = asdict(self)
        d["parallel"] = self.parallel.to_dict()
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "TrainConfig":
        d = upgrade_flat(d) if not isinstance(d.get("model"), dict) else upgrade_bias_rate(d)
        d["parallel"] = ParallelConfig.from_dict(d.get("parallel", {}))
        for name, section in SECTIONS.items():
            d[name] = _section(section, d.get(name) or {}, name)
        d["faults"] = replace(d["faults"], inject_faults=tuple(d["faults"].inject_faults or ()),
                              on_alert=tuple(d["faults"].on_alert or ()))
        return cls(**{k: v for k, v in d.items() if k in cls.__dataclass_fields__})

    def save(self, path: str | Path) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(self.to_dict(), indent=1) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> "TrainConfig":
        from dayzero.inputs import load_json

        obj = load_json(path, "a train config JSON (dayzero train --save-config writes one)")
        if not isinstance(obj, dict):
            from dayzero.errors import ConfigError

            raise ConfigError(str(path), None, f"expected a JSON object, got {type(obj).__name__}")
        return cls.from_dict(obj)

    def with_(self, **kw) -> "TrainConfig":
        """A copy with run-level fields or whole sections replaced, and ``section={field: value}``
        dicts merged into that section (``cfg.with_(faults={"watchdog": 30})``)."""
        kw = {k: replace(getattr(self, k), **v) if k in SECTIONS and isinstance(v, dict) else v for k, v in kw.items()}
        return replace(self, **kw)


def _section(cls, d: dict, name: str):
    unknown = sorted(set(d) - {f.name for f in fields(cls)})
    if unknown:
        raise DayzeroError(f"train config section {name!r}: unknown field(s) {', '.join(unknown)}; "
                           f"expected some of {', '.join(f.name for f in fields(cls))}")
    missing = [f.name for f in fields(cls) if f.name not in d and f.default is MISSING
               and f.default_factory is MISSING]
    if missing:
        raise DayzeroError(f"train config section {name!r}: missing field(s) {', '.join(missing)}")
    return cls(**d)


# the flat documents TrainConfig was before it had sections: old field -> (section, field)
_FLAT = {"model": ("model", "name"), **{k: ("model", k) for k in (*SHRINK_KEYS, "hf_weights")},
         **{k: ("optimizer", k) for k in ("lr", "min_lr_ratio", "warmup", "weight_decay", "grad_clip")},
         "expert_bias_rate": ("moe", "bias_rate"),
         "ckpt_dir": ("checkpoint", "dir"), "ckpt_every": ("checkpoint", "every"), "keep": ("checkpoint", "keep"),
         "ckpt_prune_other_lineages": ("checkpoint", "prune_other_lineages"), "resume": ("checkpoint", "resume"),
         "async_save": ("checkpoint", "async_save"), "ckpt_checksum": ("checkpoint", "checksum"),
         **{k: ("faults", k) for k in ("max_restarts", "inject_faults", "watchdog", "save_timeout", "on_bad_loss",
                                      "spike_factor")}}


def upgrade_flat(d: dict) -> dict:
    """A flat TrainConfig document (every field at the top level, as ``<metrics>.config.json``
    files written before sections) in the sectioned shape ``TrainConfig.from_dict`` reads."""
    out: dict = {}
    for k, v in d.items():
        if k in _FLAT:
            section, name = _FLAT[k]
            out.setdefault(section, {})[name] = v
        else:
            out[k] = v
    return out


def upgrade_bias_rate(d: dict) -> dict:
    """A sectioned document written before the ``moe`` section: ``optimizer.expert_bias_rate``
    becomes ``moe.bias_rate``."""
    d = dict(d)
    opt = d.get("optimizer")
    if isinstance(opt, dict) and "expert_bias_rate" in opt:
        opt = dict(opt)
        rate = opt.pop("expert_bias_rate")
        d["optimizer"] = opt
        d["moe"] = {"bias_rate": rate, **(d.get("moe") or {})}
    return d
