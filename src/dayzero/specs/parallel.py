"""ParallelConfig: the one description of a parallel layout, shared by planner and runtime.

Dense layout (Megatron order ``tp-cp-dp-pp``, tp fastest):  world = tp * cp * dp * pp.
Expert layout over the same ranks of one pipeline stage:    tp * cp * dp = etp * ep * edp,
so expert parallelism borrows ranks from dp x cp (x tp when etp < tp), and routed experts are
sharded by ZeRO over the expert-data-parallel group ``edp``.

Worked example (16 ranks, tp2 cp1 dp4 pp2, ep4 etp1): each stage has 8 ranks; dense weights are
split 2-way by tp and replicated 4-way by dp; experts are split 4-way by ep with edp = 8/4 = 2.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Literal

from dayzero.errors import LayoutError
from dayzero.specs.model import ModelSpec

Recompute = Literal["none", "selective", "full"]
Schedule = Literal["1f1b", "interleaved", "gpipe"]
Precision = Literal["bf16", "fp8"]


@dataclass(frozen=True)
class ParallelConfig:
    tp: int = 1
    pp: int = 1
    dp: int = 1
    cp: int = 1
    ep: int = 1
    etp: int = 1  # tensor parallel inside each expert (<= tp)
    vpp: int = 1  # virtual (interleaved) stages per pipeline rank
    mbs: int = 1  # micro-batch size, sequences
    gbs: int = 0  # global batch size, sequences (0: mbs * dp, one micro-batch per step)
    seq: int = 4096
    zero: int = 1  # 0: none, 1: optimizer states, 2: + gradients, 3: + parameters (FSDP)
    recompute: Recompute = "none"
    recompute_layers: int | None = None  # with "full": recompute only this many layers per stage
    sequence_parallel: bool = False
    precision: Precision = "bf16"
    schedule: Schedule = "1f1b"
    layer_split: tuple[int, ...] | None = None  # layers per (virtual) stage, first to last

    def __post_init__(self):
        if not self.gbs:
            object.__setattr__(self, "gbs", self.mbs * self.dp)
        if self.layer_split is not None:
            object.__setattr__(self, "layer_split", tuple(int(x) for x in self.layer_split))
        if self.vpp > 1 and self.schedule == "1f1b":
            object.__setattr__(self, "schedule", "interleaved")

    # -- derived ---------------------------------------------------------------------------
    @property
    def world(self) -> int:
        return self.tp * self.cp * self.dp * self.pp

    @property
    def edp(self) -> int:
        """Expert-data-parallel degree: replicas of each expert shard within a stage."""
        return max(1, (self.tp * self.cp * self.dp) // (self.ep * self.etp))

    @property
    def microbatches(self) -> int:
        return self.gbs // (self.mbs * self.dp)

    @property
    def tokens_per_step(self) -> int:
        return self.gbs * self.seq

    def describe(self) -> str:
        s = f"tp{self.tp} pp{self.pp} dp{self.dp}"
        if self.cp > 1:
            s += f" cp{self.cp}"
        if self.ep > 1:
            s += f" ep{self.ep}"
        if self.etp > 1:
            s += f" etp{self.etp}"
        if self.vpp > 1:
            s += f" vpp{self.vpp}"
        s += f" zero{self.zero} mbs{self.mbs} gbs{self.gbs} {self.recompute}"
        if self.sequence_parallel:
            s += " sp"
        return s

    def to_dict(self) -> dict:
        d = asdict(self)
        d["world"] = self.world
        d["edp"] = self.edp
        d["microbatches"] = self.microbatches
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "ParallelConfig":
        fields = {k: v for k, v in d.items() if k in cls.__dataclass_fields__}
        if fields.get("layer_split") is not None:
            fields["layer_split"] = tuple(fields["layer_split"])
        return cls(**fields)

    def with_(self, **kw) -> "ParallelConfig":
        return replace(self, **kw)

    # -- validation ------------------------------------------------------------------------
    def validate(self, spec: ModelSpec | None = None, devices: int | None = None) -> "ParallelConfig":
        """Raise LayoutError (one line, all degrees printed) if the layout is impossible."""
        problems = self.problems(spec, devices)
        if problems:
            raise LayoutError(f"invalid parallel layout ({self.describe()}, world {self.world}): "
                              + "; ".join(problems))
        return self

    def problems(self, spec: ModelSpec | None = None, devices: int | None = None) -> list[str]:
        p: list[str] = []
        for name in ("tp", "pp", "dp", "cp", "ep", "etp", "vpp", "mbs", "seq"):
            if getattr(self, name) < 1:
                p.append(f"{name} must be >= 1, got {getattr(self, name)}")
        if p:
            return p
        if self.zero not in (0, 1, 2, 3):
            p.append(f"zero must be 0-3, got {self.zero}")
        if self.recompute not in ("none", "selective", "full"):
            p.append(f"recompute must be none|selective|full, got {self.recompute!r}")
        if self.schedule not in ("1f1b", "interleaved", "gpipe"):
            p.append(f"schedule must be 1f1b|interleaved|gpipe, got {self.schedule!r}")
        if self.precision not in ("bf16", "fp8"):
            p.append(f"precision must be bf16|fp8, got {self.precision!r}")
        if devices is not None and self.world != devices:
            p.append(f"tp*cp*dp*pp = {self.tp}*{self.cp}*{self.dp}*{self.pp} = {self.world} must equal the "
                     f"{devices} devices; adjust --dp (default: devices / (tp*pp*cp))")
        if self.gbs % (self.mbs * self.dp):
            p.append(f"gbs {self.gbs} must be divisible by mbs*dp = {self.mbs}*{self.dp}")
        if self.etp > self.tp:
            p.append(f"etp {self.etp} must be <= tp {self.tp}")
        if (self.tp * self.cp * self.dp) % (self.ep * self.etp):
            p.append(f"ep*etp = {self.ep}*{self.etp} must divide tp*cp*dp = {self.tp * self.cp * self.dp}")
        if self.vpp > 1 and self.pp == 1:
            p.append("vpp > 1 needs pp > 1")
        if self.schedule == "interleaved" and self.vpp > 1 and self.microbatches % self.pp:
            p.append(f"interleaved schedule needs micro-batches ({self.microbatches}) divisible by pp ({self.pp})")
        if self.cp > 1 and self.seq % (2 * self.cp):
            p.append(f"seq {self.seq} must be divisible by 2*cp = {2 * self.cp} (load-balanced causal CP)")
        if self.sequence_parallel and self.tp > 1 and self.seq % (self.tp * self.cp):
            p.append(f"seq {self.seq} must be divisible by tp*cp = {self.tp * self.cp} with sequence parallelism")
        if spec is not None:
            p += self._model_problems(spec)
        return p

    def _model_problems(self, spec: ModelSpec) -> list[str]:
        p: list[str] = []
        a = spec.attention
        if a.heads % self.tp:
            p.append(f"attention heads ({a.heads}) must be divisible by tp ({self.tp})")
        if a.kind == "gqa" and a.kv_heads % self.tp and self.tp % a.kv_heads:
            p.append(f"kv heads ({a.kv_heads}) and tp ({self.tp}) must divide one another")
        if self.ep > 1:
            if spec.moe is None:
                p.append(f"ep {self.ep} > 1 but {spec.name} has no experts")
            elif spec.moe.experts % self.ep:
                p.append(f"experts ({spec.moe.experts}) must be divisible by ep ({self.ep})")
        stages = self.pp * self.vpp
        if self.layer_split is not None:
            if len(self.layer_split) != stages:
                p.append(f"layer_split has {len(self.layer_split)} entries, expected pp*vpp = {stages}")
            elif sum(self.layer_split) != spec.layers:
                p.append(f"layer_split sums to {sum(self.layer_split)}, the model has {spec.layers} layers")
            elif min(self.layer_split) < 0:
                p.append("layer_split entries must be >= 0")
        elif spec.layers % stages:
            p.append(f"layers ({spec.layers}) must be divisible by pp*vpp = {self.pp}*{self.vpp} "
                     f"(or give an explicit layer split)")
        return p

    # -- layer assignment ------------------------------------------------------------------
    def stage_layers(self, spec: ModelSpec) -> list[range]:
        """Decoder layers of each virtual stage, in model order (virtual stage v*pp + r runs on
        pipeline rank r, as in Megatron's interleaved schedule). Embedding sits on the first
        stage, final norm + head + loss on the last."""
        stages = self.pp * self.vpp
        split = self.layer_split or even_split(spec.layers, stages)
        out, start = [], 0
        for n in split:
            out.append(range(start, start + n))
            start += n
        return out

    def rank_layers(self, spec: ModelSpec) -> list[list[int]]:
        """Decoder layers held by each pipeline rank (all its virtual stages)."""
        per_rank: list[list[int]] = [[] for _ in range(self.pp)]
        for v, rng in enumerate(self.stage_layers(spec)):
            per_rank[v % self.pp].extend(rng)
        return per_rank


def even_split(layers: int, stages: int) -> tuple[int, ...]:
    """Layers per stage as even as possible; the remainder goes to the middle stages, keeping the
    first (embedding) and last (head + loss) stages light."""
    base, rem = divmod(layers, stages)
    split = [base] * stages
    order = list(range(1, stages - 1)) + [0, stages - 1] if stages > 2 else list(range(stages))
    for i in order[:rem]:
        split[i] += 1
    return tuple(split)
