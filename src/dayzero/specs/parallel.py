"""ParallelConfig: the one description of a parallel layout, shared by planner and runtime.

Dense layout (Megatron order ``tp-cp-dp-pp``, tp fastest):  world = tp * cp * dp * pp.
Expert layout over the same ranks of one pipeline stage:    tp * cp * dp = etp * ep * edp,
so expert parallelism borrows ranks from dp x cp (x tp when etp < tp), and routed experts are
sharded by ZeRO over the expert-data-parallel group ``edp``.

Worked example (16 ranks, tp2 cp1 dp4 pp2, ep4 etp1): each stage has 8 ranks; dense weights are
split 2-way by tp and replicated 4-way by dp; experts are split 4-way by ep with edp = 8/4 = 2.

The rules a layout must obey are in :mod:`dayzero.specs.layout_rules` (written once, for one
layout and for numpy arrays of many); :mod:`dayzero.specs.grid` turns layouts into the numpy
columns the planner evaluates and back. The functions at the end of this module are the derived
facts both need, valid on ints and on arrays alike.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Literal, get_args

import numpy as np

from dayzero.errors import LayoutError
from dayzero.specs.model import ModelSpec

Recompute = Literal["none", "selective", "full"]
# new schedules are appended, so that the grid codes of the others never move (specs.grid)
Schedule = Literal["1f1b", "interleaved", "gpipe", "dualpipe", "dualpipev"]
Precision = Literal["bf16", "fp8", "fp4"]  # GEMM precision; fp4 (NVFP4/MXFP4) keeps fp8's memory
# How context parallelism exchanges the sequence (Megatron-LM --cp-comm-type; Transformer Engine
# transformer_engine/pytorch/attention/dot_product_attention/context_parallel.py):
#   p2p  ring attention: K/V blocks travel cp - 1 hops around the cp group, overlapped with the
#        attention core (AttnFuncWithCPAndKVP2P; Liu et al. 2023, arXiv:2310.01889)
#   a2a  DeepSpeed-Ulysses: Q, K, V all-to-all'd over the cp group before the core attention (each
#        rank then holds the whole sequence for heads / cp heads) and the output back after it
#        (AttnFuncWithCPAndQKVOA2A; Jacobs et al. 2023, arXiv:2309.14509); not overlapped
# (TE's allgather and hierarchical a2a+p2p are not modelled)
CpComm = Literal["p2p", "a2a"]
RECOMPUTES: tuple[str, ...] = get_args(Recompute)
SCHEDULES: tuple[str, ...] = get_args(Schedule)
PRECISIONS: tuple[str, ...] = get_args(Precision)
CP_COMMS: tuple[str, ...] = get_args(CpComm)
# The modules selective recompute can checkpoint (Megatron-LM ``--recompute-modules``,
# megatron/core/transformer/transformer_config.py, ``recompute_modules``): core_attn, mlp, moe and
# shared_experts use normal checkpointing (the module's inputs are kept, its insides rebuilt in
# backward); moe_act, layernorm and mla_up_proj are output-discarding checkpoints (the module's
# output is dropped and rebuilt from its kept input). "selective" alone means core_attn, Megatron's
# default. planner.memory.activations.MODULE_TERMS says which saved tensors each one drops.
RECOMPUTE_MODULES: tuple[str, ...] = ("core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe",
                                      "shared_experts")
DEFAULT_MODULES: tuple[str, ...] = ("core_attn",)

# Ranks are numbered by a dim-order string, fastest-varying dim first (Megatron's
# ``--rank-order``-style ``tp-cp-dp-pp``: tensor parallelism inside a node, pipeline outermost).
DENSE_DIMS = ("tp", "cp", "dp", "pp")
DENSE_ORDER = "tp-cp-dp-pp"


def order_dims(order: str) -> tuple[str, ...] | None:
    """``"tp-cp-dp-pp"`` -> ``("tp", "cp", "dp", "pp")``; None unless every dense dim appears once."""
    dims = tuple(d.strip() for d in str(order).lower().split("-") if d.strip())
    return dims if sorted(dims) == sorted(DENSE_DIMS) else None


def parse_order(order: str) -> tuple[str, ...]:
    """:func:`order_dims`, raising a one-line LayoutError for a malformed order."""
    dims = order_dims(order)
    if dims is None:
        raise LayoutError(f"rank order {order!r} must name each of tp, cp, dp, pp exactly once, fastest first "
                          f"(e.g. {DENSE_ORDER})")
    return dims


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
    # with "selective": the modules recomputed (RECOMPUTE_MODULES order; () given = core_attn)
    recompute_modules: tuple[str, ...] = ()
    sequence_parallel: bool = False
    precision: Precision = "bf16"
    schedule: Schedule = "1f1b"
    layer_split: tuple[int, ...] | None = None  # layers per (virtual) stage, first to last
    rank_order: str = DENSE_ORDER  # dense dims, fastest-varying first (the expert order is etp-ep-edp)
    # The memory switches (planner.search.switches: which the search tries, where): FP8 parameter storage
    # and FP8 ZeRO parameter all-gathers under an FP8 recipe (Megatron-LM --fp8-param-gather;
    # planner.memory.memory_options.MemoryOptions.fp8_params), and the optimizer states + FP32 master on
    # the host with Adam on the CPU (Megatron-Core --optimizer-cpu-offload; planner.memory.offload)
    fp8_param_gather: bool = False
    optimizer_offload: bool = False
    # the saved activations of the first N layers of each model chunk in host memory between their
    # forward and backward (Megatron-Core --cpu-offloading --cpu-offloading-num-layers N;
    # planner.memory.activation_offload), a count the search sets per layout where nothing fits without
    # it (planner.search.search_fit.offloaded_variants); 0: off. The run's --activation-offload N is a floor
    # over it (planner.memory.activation_offload.offload_layers_of)
    activation_offload_layers: int = 0
    # how context parallelism exchanges the sequence (CpComm above); cp 1 exchanges nothing: p2p
    cp_comm: CpComm = "p2p"

    def __post_init__(self):
        if not self.gbs:
            object.__setattr__(self, "gbs", self.mbs * self.dp)
        if self.layer_split is not None:
            object.__setattr__(self, "layer_split", tuple(int(x) for x in self.layer_split))
        if self.vpp > 1 and self.schedule == "1f1b":
            object.__setattr__(self, "schedule", "interleaved")
        if self.vpp == 1 and self.schedule == "dualpipev":  # DualPipeV's V: two chunks per rank
            object.__setattr__(self, "vpp", 2)
        dims = order_dims(self.rank_order)
        if dims is not None:  # canonical spelling; a malformed order is kept for layout_rules.problems to name
            object.__setattr__(self, "rank_order", "-".join(dims))
        object.__setattr__(self, "recompute_modules", canonical_modules(self.recompute, self.recompute_modules))
        if self.cp == 1 and self.cp_comm in CP_COMMS:  # nothing is exchanged: one spelling
            object.__setattr__(self, "cp_comm", "p2p")

    # -- derived ---------------------------------------------------------------------------
    @property
    def world(self) -> int:
        return self.tp * self.cp * self.dp * self.pp

    @property
    def edp(self) -> int:
        """Expert-data-parallel degree: replicas of each expert shard within a stage."""
        return int(expert_data_parallel(self.tp, self.cp, self.dp, self.ep, self.etp))

    @property
    def microbatches(self) -> int:
        return int(microbatches(self.gbs, self.mbs, self.dp))

    def describe(self) -> str:
        s = f"tp{self.tp} pp{self.pp} dp{self.dp}"
        if self.cp > 1:
            s += f" cp{self.cp}" + (f"({self.cp_comm})" if self.cp_comm != "p2p" else "")
        if self.ep > 1:
            s += f" ep{self.ep}"
        if self.etp > 1:
            s += f" etp{self.etp}"
        if self.vpp > 1:
            s += f" vpp{self.vpp}"
        words = recompute_words(self.recompute, self.recompute_modules, self.recompute_layers)
        s += f" zero{self.zero} mbs{self.mbs} gbs{self.gbs} {words}"
        if self.sequence_parallel:
            s += " sp"
        if self.schedule in ("dualpipe", "dualpipev"):  # the others follow from vpp (gpipe is never searched)
            s += f" {self.schedule}"
        if self.fp8_param_gather:
            s += " fp8-gather"
        if self.optimizer_offload:
            s += " opt-offload"
        if self.activation_offload_layers:
            s += f" act-offload({self.activation_offload_layers})"
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
        if fields.get("recompute_modules") is not None:
            fields["recompute_modules"] = tuple(fields["recompute_modules"])
        return cls(**fields)

    def with_(self, **kw) -> "ParallelConfig":
        return replace(self, **kw)

    # -- layer assignment ------------------------------------------------------------------
    def stage_layers(self, spec: ModelSpec) -> list[range]:
        """Decoder layers of each virtual stage, in model order (the ranks holding each:
        :func:`stage_ranks`). Embedding sits on the first stage, final norm + head + loss on the last."""
        stages = self.pp * self.vpp
        split = self.layer_split or model_split(spec.layers, stages, spec.mtp_layers)
        out, start = [], 0
        for n in split:
            out.append(range(start, start + n))
            start += n
        return out

    def rank_layers(self, spec: ModelSpec) -> list[list[int]]:
        """Decoder layers held by each pipeline rank (all its virtual stages)."""
        per_rank: list[list[int]] = [[] for _ in range(self.pp)]
        placed = stage_ranks(self.schedule, self.pp, self.vpp)
        for v, rng in enumerate(self.stage_layers(spec)):
            for r in placed[v]:
                per_rank[r].extend(rng)
        return per_rank


def canonical_modules(recompute: str, modules) -> tuple[str, ...]:
    """The module set of a layout, in one spelling: selective recompute without modules is
    core_attn (Megatron's default); known names in :data:`RECOMPUTE_MODULES` order, once each, and
    unknown names after them (kept for ``layout_rules.problems`` to name); a comma/plus-separated string is split."""
    if isinstance(modules, str):
        modules = [m for m in modules.replace("+", ",").split(",") if m.strip()]
    names = [str(m).strip() for m in (modules or ())]
    if recompute == "selective" and not names:
        return DEFAULT_MODULES
    known = tuple(m for m in RECOMPUTE_MODULES if m in names)
    return known + tuple(dict.fromkeys(m for m in names if m not in RECOMPUTE_MODULES))


def recompute_words(recompute: str, modules: tuple[str, ...], layers: int | None = None) -> str:
    """``full``, ``full(2)`` (the first 2 layers of each chunk: ``recompute_layers``), ``none``,
    ``selective`` (core_attn alone) or ``selective(core_attn+moe_act)``."""
    if recompute == "full" and layers is not None:
        return f"full({layers})"
    if recompute != "selective" or tuple(modules) in ((), DEFAULT_MODULES):
        return str(recompute)
    return f"selective({'+'.join(modules)})"
def stage_ranks(schedule: str, pp: int, vpp: int) -> tuple[tuple[int, ...], ...]:
    """The pipeline ranks holding each of the pp x vpp (virtual) stages, first to last.

    - 1F1B, GPipe, interleaved 1F1B: virtual stage s on rank s % pp (Megatron's interleaving).
    - DualPipe (DeepSeek-V3, arXiv 2412.19437 sec. 3.2.1; deepseek-ai/DualPipe dualpipe.py): pp
      stages, rank r holds stage r and stage pp - 1 - r, feeding micro-batches from both ends, so
      every stage's parameters are held twice ("Parameter 2x", the README's table).
    - DualPipeV (deepseek-ai/DualPipe dualpipev.py; torch.distributed.pipelining
      ScheduleDualPipeV, stage-to-rank style "v"): 2 pp stages, rank r holds stage r and stage
      2 pp - 1 - r (a V: rank 0 holds the first and the last stage), each once."""
    stages = pp * vpp
    if schedule == "dualpipe":
        return tuple((s, pp - 1 - s) if pp - 1 - s != s else (s,) for s in range(stages))
    if schedule == "dualpipev":
        return tuple((s if s < pp else 2 * pp - 1 - s,) for s in range(stages))
    return tuple((s % pp,) for s in range(stages))


def even_split_fills(layers, stages):
    """Whether the near-even split of ``layers`` over ``stages`` leaves no stage but the first
    (embedding) and the last (head and loss) without decoder layers: Megatron counts those two as
    one layer each when splitting (account_for_embedding/loss_in_pipeline_split), so 126 layers
    fill 128 stages. Ints or arrays."""
    return layers >= stages - 2


def model_split(layers: int, stages: int, mtp: int = 0) -> tuple[int, ...]:
    """Decoder layers per stage when the last stage also runs ``mtp`` multi-token-prediction
    modules: the near-even split of layers + mtp with the MTP modules' share taken off the last
    stage(s), so that each counts as one layer of the last stage (Megatron-Bridge's DeepSeek
    layouts end "...tmL": the last stage's decoder layer, the MTP layer and the loss, e.g.
    "Et*4|(t*4|)*14tmL"). Without MTP, :func:`even_split`."""
    if not mtp or stages <= 1:
        return even_split(layers, stages)
    split = list(even_split(layers + mtp, stages))
    need, i = mtp, stages - 1
    while need and i >= 0:
        d = min(split[i], need)
        split[i] -= d
        need -= d
        i -= 1
    return tuple(split)


def with_even_split(spec: ModelSpec, p: ParallelConfig) -> ParallelConfig:
    """The layout with an explicit near-even layer split when pp x vpp does not divide the layers
    and the split fills every stage (Megatron's rule, ``even_split_fills``); otherwise the layout
    as given, which validation then refuses (no prediction with empty stages)."""
    stages = p.pp * p.vpp
    if stages >= 1 and p.layer_split is None and spec.layers % stages and even_split_fills(spec.layers, stages):
        return p.with_(layer_split=model_split(spec.layers, p.pp * p.vpp, spec.mtp_layers))
    return p


def even_split(layers: int, stages: int) -> tuple[int, ...]:
    """Layers per stage as even as possible; the remainder goes to the middle stages, keeping the
    first (embedding) and last (head + loss) stages light."""
    base, rem = divmod(layers, stages)
    split = [base] * stages
    order = list(range(1, stages - 1)) + [0, stages - 1] if stages > 2 else list(range(stages))
    for i in order[:rem]:
        split[i] += 1
    return tuple(split)


# -- derived facts, for one layout (ints) or many (numpy arrays) ------------------------------------

def microbatches(gbs, mbs, dp):
    """Micro-batches per step and pipeline: gbs / (mbs * dp)."""
    return gbs // (mbs * dp)


def expert_data_parallel(tp, cp, dp, ep, etp):
    """edp: replicas of each expert shard within a stage, tp*cp*dp / (ep*etp)."""
    return np.maximum(1, (tp * cp * dp) // (ep * etp))


# The ZeRO stage from which each model state is sharded (Rajbhandari et al. 2020, Fig. 1): ZeRO-1
# shards the optimizer states, ZeRO-2 also the gradients, ZeRO-3 also the parameters.
ZERO_SHARDS_FROM = {"optimizer": 1, "gradients": 2, "weights": 3}


def zero_shards(zero, state: str):
    """Whether ZeRO stage ``zero`` shards model state ``state`` (weights, gradients, optimizer)."""
    return zero >= ZERO_SHARDS_FROM[state]


def zero_sharded(x, state: str, zero, group):
    """``x`` bytes or elements of model state ``state`` per rank once ZeRO ``zero`` shards it over
    ``group`` ranks (dp*cp for dense parameters, edp for routed experts)."""
    return x / np.where(zero_shards(zero, state), group, 1)
