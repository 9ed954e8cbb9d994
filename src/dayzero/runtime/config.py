"""TrainConfig: everything one training run needs, as a plain document.

Written next to the run's outputs (``<metrics>.config.json``) and handed to every rank, so the
run that happened can always be read back and repeated.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from dayzero.runtime.checkpoint.manifest import DEFAULT_CHECKSUM
from dayzero.specs.parallel import ParallelConfig

COMPUTE_DTYPES = ("bf16", "fp32")


@dataclass(frozen=True)
class TrainConfig:
    model: str  # preset name, config.json or a directory holding one
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    steps: int = 100
    seed: int = 0
    compute_dtype: str = "bf16"
    data: str | None = None  # file, directory or glob; None: the built-in corpus
    metrics: str | None = None  # JSONL path (rank 0 writes)
    quiet: bool = False
    # time inside collectives through the profiler (comm_time_s); costs a few % of step time
    measure_comm: bool = True
    # proxy sizing: keep the architecture, shrink the size (ModelSpec.shrink)
    layers: int | None = None
    hidden: int | None = None
    experts: int | None = None
    vocab: int | None = None
    hf_weights: str | None = None  # start from a HF safetensors checkpoint instead of random init
    # optimizer (defaults: a small-model pretraining recipe; see optim.py for sources)
    lr: float = 1e-3
    min_lr_ratio: float = 0.1  # cosine floor as a fraction of lr (Llama: 10 %, Touvron et al. 2023)
    warmup: int | None = None  # steps; None: 10 % of the run, at most 100
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    # DeepSeek-V3's bias update speed gamma for auxiliary-loss-free balancing (DeepSeek-AI 2024, sec. 4.2)
    expert_bias_rate: float = 1e-3
    # checkpoints and fault recovery (see dayzero.runtime.resilience.loop and docs/checkpoints.md)
    ckpt_dir: str | None = None
    ckpt_every: int = 0  # steps between saves (0: only at the end)
    keep: int = 3  # versions of the run's own lineage kept by retention
    ckpt_prune_other_lineages: bool = False  # retention also deletes other lineages' versions
    resume: str = "auto"  # auto | never | a step | a version directory
    async_save: bool = False
    ckpt_checksum: str = DEFAULT_CHECKSUM  # per-file checksum in the manifest (manifest.CHECKSUMS)
    max_restarts: int = 0  # torchrun restarts when dayzero spawns the ranks (--nproc)
    inject_faults: tuple[str, ...] = ()  # drills: "step=N,rank=R,kind=kill|exception|hang[,at=save]"
    watchdog: float = 0.0  # seconds without a finished step before a rank aborts (0: off)
    # seconds a checkpoint save (or resume, rollback) may take before the watchdog aborts the rank;
    # None: 600 with --watchdog, else not timed (resilience.DEFAULT_SAVE_TIMEOUT_S)
    save_timeout: float | None = None
    on_bad_loss: str | None = None  # skip | rollback on a NaN/Inf or spiking loss (None: no guard)
    spike_factor: float = 0.0  # a loss > this x the running mean is a spike (0: NaN/Inf only)

    @property
    def warmup_steps(self) -> int:
        return self.warmup if self.warmup is not None else max(1, min(100, self.steps // 10))

    def spec(self):
        from dayzero.specs.registry import load_model

        return load_model(self.model).shrink(layers=self.layers, hidden=self.hidden, experts=self.experts,
                                             vocab=self.vocab)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["parallel"] = self.parallel.to_dict()
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "TrainConfig":
        d = dict(d)
        d["parallel"] = ParallelConfig.from_dict(d.get("parallel", {}))
        d["inject_faults"] = tuple(d.get("inject_faults") or ())
        return cls(**{k: v for k, v in d.items() if k in cls.__dataclass_fields__})

    def save(self, path: str | Path) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(self.to_dict(), indent=1) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> "TrainConfig":
        return cls.from_dict(json.loads(Path(path).read_text()))

    def with_(self, **kw) -> "TrainConfig":
        return replace(self, **kw)
