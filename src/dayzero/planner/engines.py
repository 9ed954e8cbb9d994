"""Which training engines can run a layout as laid out, written once for one layout and for many.

Each engine is a list of :class:`Limit` s in the style of :mod:`dayzero.specs.layout_rules`: a
predicate over grid columns (plain arithmetic, so it takes the ints of one layout or the arrays
of a whole search space) and the reason it gives when the layout breaks it, with the source the
limit comes from. ``dayzero plan`` labels every plan with the engines that run it
(:func:`engines_for`) and ``--engine NAME`` restricts the search to them (:func:`engine_mask`).

A limit reads layout columns, and the run's switches where they are given as columns too
(:data:`RUN_SWITCHES`: ``activation_offload_layers``, PerfOptions.switches; the larger of the
layout's own value and the run's is read, :func:`with_run`); a limit reading a column
that is not given is not applied. What an engine cannot do for a *model* (an attention variant, a
layer type) is the model's verdict (``dayzero ops``), not the layout's.

Vendors: each engine names the accelerator vendors it runs on (:attr:`Engine.vendors`, empty: any
PyTorch device) and :data:`FEATURES` the CUDA-only options of the Megatron stack. A vendor with an
engine of its own (Huawei: MindSpeed, :func:`default_engine`) is planned pinned to it; the
unpinned search of any other cluster keeps a layout some engine of :data:`ENGINES` runs, and
:data:`ALL_ENGINES` labels plans (:func:`engines_for` with the cluster's vendor).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from dayzero.errors import ConfigError
from dayzero.specs.grid import A2A, DUALPIPE, DUALPIPEV, GPIPE, MODULE_BIT, ONE_F_ONE_B, P2P, SELECTIVE, code, columns
from dayzero.specs.parallel import DENSE_ORDER, ParallelConfig

BF16 = code("precision", "bf16")
FP4 = code("precision", "fp4")
DENSE = code("rank_order", DENSE_ORDER)
# Megatron's --use-tp-pp-dp-mapping numbers ranks tp, cp, pp, dp (fastest first)
TP_PP_DP = code("rank_order", "tp-cp-pp-dp")
CORE_ATTN = MODULE_BIT["core_attn"]
NO_RECOMPUTE = code("recompute", "none")
# run-wide options (PerfOptions.switches) limits read as columns (0: off); each is also a layout
# field, whose value the run's raises (not the memory switches of specs.grid.SWITCHES)
RUN_SWITCHES = ("activation_offload_layers",)
OFFLOAD = "activation_offload_layers"


def with_run(cols: dict, switches: dict | None) -> dict:
    """``cols`` (one layout's ints or a grid's arrays) with the run's ``switches`` read in: a
    column the layout has takes the larger of its value and the run's (the run's
    ``--activation-offload N`` is a floor, planner.memory.activation_offload.offload_layers_of), one it
    lacks the run's where on (a switch that is off reads as absent: no limit forbids it off)."""
    out = dict(cols)
    n = len(next(iter(cols.values()))) if cols and np.ndim(next(iter(cols.values()))) else None
    for k, v in (switches or {}).items():
        if k in out:
            out[k] = np.maximum(out[k], v) if n is not None else max(int(out[k]), int(v))
        elif v:
            out[k] = np.full(n, v) if n is not None else v
    return out


def _no_activation_offload(engine: str, how: str, source: str) -> Limit:
    return Limit((OFFLOAD,), lambda c: c[OFFLOAD] == 0, f"{engine} {how}", source)


def _modules_limit(engine: str, source: str) -> Limit:
    """Selective recompute of other modules than the attention core is Megatron-Core's
    (--recompute-modules, transformer_config.py recompute_modules)."""
    return Limit(("recompute", "recompute_modules"),
                 lambda c: (c["recompute"] != SELECTIVE) | (c["recompute_modules"] == CORE_ATTN),
                 f"{engine} recomputes whole blocks or the attention core, not Megatron's recompute modules",
                 source)


def _no_switch(name: str, engine: str, says: str, source: str) -> Limit:
    """``engine`` has no equivalent of the memory switch ``name`` (a ParallelConfig flag,
    planner.search.switches) as the planner models it."""
    return Limit((name,), lambda c: c[name] == 0, f"{engine} {says}", source)


@dataclass(frozen=True)
class Limit:
    reads: tuple[str, ...]
    ok: Callable[[dict], Any]  # columns -> bool (ints) or bool array (arrays)
    says: str  # why the engine cannot run a layout that breaks it
    source: str


@dataclass(frozen=True)
class Engine:
    name: str
    title: str
    limits: tuple[Limit, ...]
    # how its MoE layers send tokens to the experts (planner.perf.comm.CommOptions.ep_dispatcher): "dedup" sends a
    # token once per rank (and once per remote node) it reaches, "all_to_all" every routed copy
    ep_dispatcher: str = "all_to_all"
    # FSDP under torch.distributed.pipelining: with pp > 1 a ZeRO-2/3 stage keeps its parameters
    # gathered and its gradients unsharded until the step's end (MemoryOptions.pipelined_fsdp,
    # planner.schedule.held_zero), so its memory is priced that way (:func:`pipelined_fsdp`)
    pipelined_fsdp: bool = False
    # overlaps the TP collectives with the GEMMs (planner.perf.comm.tp_overlapped): Megatron-Core's
    # --tp-comm-overlap (Transformer Engine userbuffers), torchtitan's async TP
    # (parallelism.enable_async_tensor_parallel, with torch.compile); a search pinned to an engine
    # without it prices none (:func:`with_engine_overlaps`)
    tp_comm_overlap: bool = False
    # overlaps the EP all-to-all with another micro-batch's compute outside DualPipe (planner.perf.comm.
    # ep_overlapped): True (Megatron-Core --overlap-moe-expert-parallel-comm), False (it has none: a
    # search pinned to it prices none), None (not established here: the model's rule stands)
    ep_overlap: bool | None = None
    # the accelerator vendors it runs on (catalog ``vendor``, lower case); empty: any vendor with a
    # PyTorch device backend (:func:`runs_on_vendor`)
    vendors: tuple[str, ...] = ()


def runs_on_vendor(engine: Engine | str, vendor: str | None) -> bool:
    """Whether ``engine`` runs on ``vendor``'s accelerators (no vendor given: yes)."""
    e = get_engine(engine) if isinstance(engine, str) else engine
    v = (vendor or "").strip().lower()
    return not (v and e.vendors) or any(v.startswith(x) for x in e.vendors)


@dataclass(frozen=True)
class Feature:
    """An engine option the planner prices or an export writes, with the vendors whose stack has it."""

    name: str
    flag: str  # what the engine's launch writes
    vendors: tuple[str, ...]  # catalog vendors (lower case) whose software stack runs it
    source: str


# CUDA-only features of the Megatron stack: none is in MindSpeed / torch_npu, so a plan on another
# vendor's accelerators neither prices nor exports them (export.megatron substitutes or refuses, with a note)
FEATURES: dict[str, Feature] = {f.name: f for f in (
    Feature("deepep_dispatcher", "--moe-token-dispatcher-type flex --moe-flex-dispatcher-backend deepep", ("nvidia",),
            "github.com/deepseek-ai/DeepEP README (NVLink + RDMA kernels for Hopper/Blackwell GPUs); Megatron-Core "
            "transformer_config.py moe_flex_dispatcher_backend"),
    Feature("tp_comm_overlap", "--tp-comm-overlap", ("nvidia",),
            "Megatron-LM megatron/training/arguments.py --tp-comm-overlap: Transformer Engine userbuffers "
            "(transformer_engine.pytorch.module.base initialize_ub, CUDA IPC / NVLink)"),
    Feature("megatron_fsdp", "--use-megatron-fsdp", ("nvidia", "amd"),
            "Megatron-Core megatron/core/distributed/fsdp (Megatron FSDP); not among MindSpeed's features "
            "(github.com/Ascend/MindSpeed docs/features; MindSpeed-LLM trains FSDP through its own fsdp2 backend)"),
)}


def feature_runs_on(name: str, vendor: str | None) -> bool:
    """Whether :data:`FEATURES` ``name`` runs on ``vendor`` (no vendor given: yes)."""
    v = (vendor or "").strip().lower()
    return not v or any(v.startswith(x) for x in FEATURES[name].vendors)


def default_engine(vendor: str | None) -> str | None:
    """The engine a plan on ``vendor``'s accelerators is searched and priced for when no ``--engine``
    is given: the only engine in the table made for that vendor (Huawei: MindSpeed), else None
    (every engine, the search's default)."""
    v = (vendor or "").strip().lower()
    own = [e.name for e in ALL_ENGINES.values() if e.vendors and v and any(v.startswith(x) for x in e.vendors)
           and not any(x == "nvidia" for x in e.vendors)]
    return own[0] if len(own) == 1 else None


def with_engine_overlaps(options, engine: str | None):
    """``options`` (PerfOptions) for a search pinned to ``engine``: an overlap left to the search
    (CommOptions.tp_overlap / ep_overlap None) is off where that engine has none (Engine.tp_comm_overlap
    False, Engine.ep_overlap False); unchanged otherwise (DualPipe schedules overlap EP by construction)."""
    from dataclasses import replace

    if not engine:
        return options
    e, comm = get_engine(engine), options.comm
    if comm.tp_overlap is None and not e.tp_comm_overlap:
        comm = replace(comm, tp_overlap=False)
    if comm.ep_overlap is None and e.ep_overlap is False:
        comm = replace(comm, ep_overlap=False)
    return options if comm is options.comm else replace(options, comm=comm)


MEGATRON = Engine("megatron", "Megatron-Core", (
    Limit(("zero", "pp"), lambda c: (c["zero"] <= 1) | (c["pp"] == 1),
          "ZeRO-2/3 is Megatron FSDP, which composes with TP, EP and CP but not with pipeline parallelism "
          "(ZeRO-1 is --use-distributed-optimizer)",
          "Megatron-Core developer guide, Megatron FSDP: 'Compatible with TP, EP and CP configurations'"),
    Limit(("schedule",), lambda c: (c["schedule"] != GPIPE) & (c["schedule"] != DUALPIPE)
          & (c["schedule"] != DUALPIPEV),
          "Megatron-Core schedules are 1F1B and interleaved 1F1B (its EP overlap is "
          "--overlap-moe-expert-parallel-comm), not GPipe, DualPipe or DualPipeV",
          "megatron/core/pipeline_parallel/schedules.py get_forward_backward_func"),
    Limit(("rank_order",), lambda c: (c["rank_order"] == DENSE) | (c["rank_order"] == TP_PP_DP),
          "Megatron numbers ranks tp-cp-(ep)-dp-pp, or tp-cp-pp-dp with --use-tp-pp-dp-mapping",
          "megatron/core/parallel_state.py RankGenerator (order 'tp-cp-ep-dp-pp')"),
    Limit(("fp8_param_gather", "zero"), lambda c: (c["fp8_param_gather"] == 0) | (c["zero"] >= 1),
          "--fp8-param-gather runs with the distributed optimizer (ZeRO-1) or Megatron FSDP only",
          "Megatron-LM megatron/training/arguments.py: fp8_param_gather asserts use_distributed_optimizer or FSDP"),
    Limit(("optimizer_offload", "zero"), lambda c: (c["optimizer_offload"] == 0) | (c["zero"] >= 1),
          "--optimizer-cpu-offload is the distributed optimizer's HybridDeviceOptimizer (ZeRO-1 or more)",
          "megatron/core/optimizer/distrib_optimizer.py (HybridDeviceOptimizer); "
          "megatron/core/optimizer/cpu_offloading/README.md"),
    # --cpu-offloading --cpu-offloading-num-layers N (TransformerConfig.__post_init__ also asks
    # N < num_layers: the one-layout check, planner.memory.activation_offload.check_activation_offload)
    Limit((OFFLOAD, "pp"), lambda c: (c[OFFLOAD] == 0) | (c["pp"] == 1),
          "Megatron-Core's activation offload (--cpu-offloading) runs without pipeline parallelism",
          "megatron/core/transformer/transformer_config.py __post_init__: 'Currently there is no support for "
          "Pipeline parallelism with CPU offloading'"),
    Limit((OFFLOAD, "recompute"), lambda c: (c[OFFLOAD] == 0) | (c["recompute"] == NO_RECOMPUTE),
          "Megatron-Core's activation offload (--cpu-offloading) does not combine with activation recompute",
          "megatron/core/transformer/transformer_config.py __post_init__: 'CPU offloading does not work when "
          "activation recomputation is enabled'"),
),  # dayzero export --to megatron writes the flex dispatcher on DeepEP (transformer_config.py
    # moe_token_dispatcher_type 'flex', moe_flex_dispatcher_backend 'deepep'); --tp-comm-overlap
    # (megatron/training/arguments.py: only with --sequence-parallel, planner.perf.comm.tp_overlapped)
    # runs on NVIDIA GPUs and on AMD's through ROCm's fork (github.com/ROCm/Megatron-LM); on Ascend
    # Megatron runs patched by MindSpeed, the engine below
    ep_dispatcher="dedup", tp_comm_overlap=True, ep_overlap=True, vendors=("nvidia", "amd"))

# MindSpeed-LLM on MindSpeed-Core (Megatron-Core patched for torch_npu): the engine of Ascend plans.
# Sources: github.com/Ascend/MindSpeed (mindspeed/arguments.py and mindspeed/features_manager/*, read
# at commit 028de58) and github.com/Ascend/MindSpeed-LLM (examples/mcore/*, at commit c77308a);
# gitcode.com/Ascend is the upstream of both.
_MS = "github.com/Ascend/MindSpeed "
MINDSPEED = Engine("mindspeed", "MindSpeed", (
    # ZeRO-1 is --use-distributed-optimizer (swap_optimizer_feature.py validate_args asks for it); the
    # Megatron FSDP of ZeRO-2/3 is Megatron-Core's CUDA path (FEATURES megatron_fsdp)
    Limit(("zero",), lambda c: c["zero"] <= 1,
          "MindSpeed shards the optimizer with --use-distributed-optimizer (ZeRO-1); Megatron FSDP (ZeRO-2/3) "
          "is not among its features",
          _MS + "mindspeed/features_manager/optimizer/swap_optimizer_feature.py; docs/features"),
    Limit(("schedule",), lambda c: (c["schedule"] != GPIPE) & (c["schedule"] != DUALPIPE),
          "MindSpeed runs Megatron's 1F1B and interleaved 1F1B and DualPipeV (--schedules-method dualpipev), "
          "not GPipe or the bidirectional DualPipe",
          _MS + "mindspeed/features_manager/pipeline_parallel/dualpipev_feature.py (choices ['dualpipev'])"),
    # DualPipeV's V is two chunks per rank (ParallelConfig vpp 2), not a --num-layers-per-virtual-pipeline-stage
    Limit(("schedule", "cp", "vpp", "pp"), lambda c: (c["schedule"] != DUALPIPEV)
          | ((c["cp"] == 1) & (c["vpp"] == 2) & (c["pp"] > 1)),
          "MindSpeed's DualPipeV runs with pp > 1, its V's two chunks per rank, without context parallelism or "
          "another virtual pipeline",
          _MS + "dualpipev_feature.py validate_args ('The dualpipev and context_parallel are incompatible', "
          "'The dualpipev and virtual_pipeline are incompatible')"),
    Limit(("rank_order",), lambda c: c["rank_order"] == DENSE,
          "MindSpeed numbers ranks as Megatron does by default (tp-cp-ep-dp-pp)",
          "megatron/core/parallel_state.py RankGenerator, as MindSpeed patches it"),
    Limit(("ep", "etp", "tp"), lambda c: (c["etp"] == 1) | (c["etp"] == c["tp"]),
          "MindSpeed runs experts with etp 1 or etp = tp",
          "MindSpeed-LLM examples/mcore/* (--expert-tensor-parallel-size 1); " + _MS + "--moe-tp-extend-ep"),
    # selective recompute: the attention core (Megatron's), MindSpeed's --recompute-activation-function
    # (the MLP/expert activation) and --recompute-norm (the norms); mindspeed/arguments.py
    Limit(("recompute", "recompute_modules"),
          lambda c: (c["recompute"] != SELECTIVE)
          | ((c["recompute_modules"] & ~(CORE_ATTN | MODULE_BIT["moe_act"] | MODULE_BIT["layernorm"])) == 0),
          "MindSpeed recomputes whole blocks, the attention core, the MLP activation (--recompute-activation-"
          "function) and the norms (--recompute-norm), not Megatron's other recompute modules",
          _MS + "mindspeed/arguments.py _add_recompute_args; features_manager/recompute/activation_function.py, "
          "norm_function.py"),
    Limit(("precision",), lambda c: c["precision"] == BF16,
          "MindSpeed-LLM trains the 910B/910C in bf16 (its recipes give --bf16; neither chip has FP8 or FP4 cubes)",
          "MindSpeed-LLM examples/mcore/*/pretrain_*.sh (--bf16); hardware catalog huawei_ascend_910b/910c "
          "fp8_tflops null"),
    _no_switch("fp8_param_gather", "MindSpeed", "has no FP8 parameter storage on the 910B/910C",
               "MindSpeed-LLM examples/mcore/*/pretrain_*.sh (--bf16)"),
    # --swap-optimizer moves the distributed optimizer's FP32 states to the host between steps and
    # swaps them in per chunk for the update: the whole-optimizer offload the planner prices
    Limit(("optimizer_offload", "zero"), lambda c: (c["optimizer_offload"] == 0) | (c["zero"] >= 1),
          "MindSpeed's --swap-optimizer runs with the distributed optimizer (ZeRO-1)",
          _MS + "mindspeed/features_manager/optimizer/swap_optimizer_feature.py ('Swap-optimizer only support "
          "use_distributed_optimizer')"),
    _no_activation_offload("MindSpeed", "swaps the attention block's activations (--swap-attention) rather than "
                           "N whole layers' saved activations",
                           _MS + "mindspeed/arguments.py --swap-attention, --swap-modules"),
),  # MoE: --moe-token-dispatcher-type alltoall (every routed copy is sent, no DeepEP); its EP overlap is
    # --moe-fb-overlap (forward of one micro-batch against the backward of another: pp 1, a virtual
    # pipeline or DualPipeV; etp 1, ep > 1; features_manager/moe/fb_overlap.py validate_args), the
    # conditions planner.comm.ep_overlapped prices. TP: MindSpeed's MC2 (--use-ascend-mc2) fuses the TP
    # collectives into the matmuls, but its recipes do not turn it on and the export does not write it,
    # so a MindSpeed plan prices no TP overlap (Engine.tp_comm_overlap False)
    ep_dispatcher="all_to_all", tp_comm_overlap=False, ep_overlap=True, vendors=("huawei",))

# torch.distributed.pipelining (torchtitan's and dayzero's pipelines) defers FSDP's gradient
# reduce-scatter to the step's last backward (PipelineStage.backward_maybe_with_nosync:
# set_requires_gradient_sync(False) until last_backward), so under pp > 1 gradients stay unsharded
# between micro-batches: ZeRO-2 as laid out (sharded between micro-batches, reduce-scattered per
# backward window, schedule.gradient_windows) is not what they run
_PIPELINED_FSDP = ("torch.distributed.pipelining defers FSDP's gradient reduce-scatter to the last backward of the "
                   "step, so ZeRO-2's gradients stay unsharded between micro-batches under pp > 1 (plan zero 3, "
                   "priced as it holds memory under pp > 1)",
                   "torch/distributed/pipelining/stage.py PipelineStage.backward_maybe_with_nosync")


def _pipelined_fsdp_limit() -> Limit:
    return Limit(("zero", "pp"), lambda c: (c["zero"] != 2) | (c["pp"] == 1), *_PIPELINED_FSDP)


TORCHTITAN = Engine("torchtitan", "torchtitan", (
    _pipelined_fsdp_limit(),
    Limit(("zero",), lambda c: c["zero"] != 1,
          "torchtitan shards with FSDP2 (ZeRO-3; ZeRO-2 with fsdp_reshard_after_forward=never) or replicates "
          "with DDP; it has no optimizer-only sharding (ZeRO-1)",
          "torchtitan docs/fsdp.md; config parallelism.fsdp_reshard_after_forward"),
    Limit(("zero", "tp", "pp", "cp", "ep"), lambda c: (c["zero"] != 0) | (c["tp"] * c["pp"] * c["cp"] * c["ep"] == 1),
          "torchtitan's DDP (ZeRO-0) does not combine with other parallelism",
          "torchtitan parallelize: apply_ddp raises 'DDP has not supported > 1D parallelism'"),
    Limit(("cp", "cp_comm"), lambda c: (c["cp"] == 1) | (c["cp_comm"] == P2P),
          "torchtitan's context parallelism is ring attention (K/V shards rotated by all-gather or all-to-all, "
          "parallelism.context_parallel_rotate_method), not Ulysses' all-to-all over heads (cp_comm p2p)",
          "torch.distributed.tensor.experimental.context_parallel (set_rotate_method 'allgather' | 'alltoall'); "
          "PyTorch tutorial 'Introduction to Context Parallel'"),
    Limit(("ep", "etp", "tp"), lambda c: (c["etp"] == 1) | (c["etp"] == c["tp"]),
          "torchtitan runs experts with etp 1 or etp = tp",
          "torchtitan ParallelDims: 'Currently we only support ETP=TP or ETP=1'"),
    Limit(("tp", "sequence_parallel"), lambda c: (c["tp"] == 1) | (c["sequence_parallel"] == 1),
          "torchtitan's tensor-parallel plans always shard norms along the sequence (SequenceParallel)",
          "torchtitan models/llama3/infra/parallelize.py apply_tp"),
    Limit(("precision",), lambda c: c["precision"] != FP4,
          "torchtitan trains in bf16 or float8 (torchao); it has no fp4 training recipe",
          "torchtitan docs/float8.md"),
    Limit(("rank_order",), lambda c: c["rank_order"] == DENSE,
          "torchtitan's device mesh is [pp, dp_replicate, dp_shard, cp, tp] (tp fastest)",
          "torchtitan distributed/parallel_dims.py build_mesh"),
    _modules_limit("torchtitan", "torchtitan activation_checkpoint.mode full | selective (layer or op policy)"),
    Limit(("schedule",), lambda c: c["schedule"] != DUALPIPE,
          "torchtitan runs torch.distributed.pipelining's schedules: DualPipeV (ScheduleDualPipeV), not the "
          "bidirectional DualPipe", "torch/distributed/pipelining/schedules.py ScheduleDualPipeV"),
    # its float8 FSDP all-gather casts the high-precision sharded weight to float8 for the gather only:
    # FP8 gathers without FP8 parameter storage, which is not what the switch models (memory and comm)
    _no_switch("fp8_param_gather", "torchtitan", "keeps its weights in high precision; "
               "quantize.linear.float8.enable_fsdp_float8_all_gather only sends the FSDP all-gather in float8",
               "torchtitan docs/float8.md (enable_fsdp_float8_all_gather: 'cast Float8Linear.weight from high "
               "precision to float8 before FSDP all-gather')"),
    _no_switch("optimizer_offload", "torchtitan", "offloads parameters, gradients and optimizer states together "
               "(FSDP2 CPUOffloadPolicy, training.enable_cpu_offload), not the optimizer alone",
               "torchtitan parallelize apply_fsdp: CPUOffloadPolicy when cpu_offload"),
    _no_activation_offload("torchtitan", "offloads FSDP parameters, gradients and optimizer states to the CPU "
                           "(training.enable_cpu_offload), not saved activations",
                           "torchtitan/config/job_config.py Training.enable_cpu_offload"),
),  # FSDP2 under torch.distributed.pipelining, which it keeps gathered after forward too (models/llama3/
    # infra/parallelize.py apply_fsdp: reshard_after_forward_policy "default" is False when pp_enabled);
    # async TP (parallelism.enable_async_tensor_parallel: torch's micro-pipelined all-gather/reduce-scatter
    # matmuls, torch/distributed/_symmetric_memory, with torch.compile) overlaps the TP collectives
    pipelined_fsdp=True, tp_comm_overlap=True)

DEEPSPEED = Engine("deepspeed", "DeepSpeed", (
    Limit(("zero", "pp"), lambda c: (c["pp"] == 1) | (c["zero"] <= 1),
          "DeepSpeed's pipeline engine runs only with ZeRO-0/1",
          "deepspeed/runtime/pipe/engine.py: 'ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism'"),
    Limit(("vpp", "schedule"), lambda c: (c["vpp"] == 1) & (c["schedule"] == ONE_F_ONE_B),
          "DeepSpeed's pipeline engine has one schedule (1F1B, no interleaving)",
          "deepspeed/runtime/pipe/schedule.py TrainSchedule"),
    Limit(("cp", "cp_comm"), lambda c: (c["cp"] == 1) | (c["cp_comm"] == A2A),
          "DeepSpeed splits sequences with Ulysses (cp_comm a2a: all-to-all over heads), not ring attention",
          "DeepSpeed-Ulysses, Jacobs et al. 2023, arXiv:2309.14509; deepspeed/sequence/layer.py DistributedAttention"),
    Limit(("tp", "pp", "zero"), lambda c: (c["tp"] == 1) | ((c["pp"] == 1) & (c["zero"] <= 2)),
          "DeepSpeed's AutoTP training composes with ZeRO-0/1/2, without pipeline parallelism",
          "DeepSpeed AutoTP training tutorial (tensor parallel training with ZeRO-1/2)"),
    Limit(("tp", "sequence_parallel"), lambda c: (c["tp"] == 1) | (c["sequence_parallel"] == 0),
          "DeepSpeed's AutoTP has no Megatron-style sequence parallelism", "DeepSpeed AutoTP training tutorial"),
    Limit(("etp",), lambda c: c["etp"] == 1, "DeepSpeed-MoE splits experts by ep only (etp 1)",
          "DeepSpeed-MoE, Rajbhandari et al. 2022, arXiv:2201.05596"),
    Limit(("precision",), lambda c: c["precision"] == BF16, "DeepSpeed's engine trains in bf16/fp16, not fp8 or fp4",
          "DeepSpeed config reference: bf16 / fp16 sections"),
    Limit(("rank_order",), lambda c: c["rank_order"] == DENSE, "DeepSpeed's topology numbers ranks data-fastest "
          "within a pipe stage", "deepspeed/runtime/pipe/topology.py PipeModelDataParallelTopology"),
    _modules_limit("DeepSpeed", "DeepSpeed activation checkpointing (whole layers)"),
    _no_switch("fp8_param_gather", "DeepSpeed", "has no FP8 parameter storage (it trains bf16/fp16)",
               "DeepSpeed config reference: bf16 / fp16 sections"),
    # ZeRO-Offload (Ren et al. 2021, arXiv 2101.06840): zero_optimization.offload_optimizer, stages 1-3
    Limit(("optimizer_offload", "zero"), lambda c: (c["optimizer_offload"] == 0) | (c["zero"] >= 1),
          "DeepSpeed offloads the optimizer (ZeRO-Offload, zero_optimization.offload_optimizer) under ZeRO-1/2/3",
          "DeepSpeed config reference: zero_optimization.offload_optimizer (valid for ZeRO stage 1, 2, 3)"),
    _no_activation_offload("DeepSpeed", "offloads the activation checkpoints of every layer (activation_checkpointing."
                           "cpu_checkpointing, with partition_activations), not N layers' saved activations",
                           "DeepSpeed config JSON reference, activation_checkpointing.cpu_checkpointing"),
))

DAYZERO = Engine("dayzero", "dayzero runtime", (
    _pipelined_fsdp_limit(),
    Limit(("cp", "cp_comm"), lambda c: (c["cp"] == 1) | (c["cp_comm"] == A2A),
          "the runtime's context parallelism is the all-to-all of heads (DeepSpeed-Ulysses); ring attention "
          "(cp_comm p2p) is not in it: use --cp-comm a2a, or --cp 1",
          "dayzero/runtime/parallel/context_parallel.py"),
    Limit(("etp",), lambda c: c["etp"] == 1,
          "the runtime runs routed experts without tensor parallelism; use --etp 1 (experts are split by --ep "
          "instead)", "dayzero runtime"),
    Limit(("precision",), lambda c: c["precision"] == BF16,
          "the runtime computes in bf16 or fp32; use --precision bf16 (or --compute-dtype fp32)", "dayzero runtime"),
    Limit(("schedule",), lambda c: (c["schedule"] != DUALPIPE) & (c["schedule"] != DUALPIPEV),
          "the runtime's pipeline runs 1F1B, interleaved 1F1B and GPipe", "dayzero/runtime/parallel/pipeline.py"),
    Limit(("rank_order",), lambda c: c["rank_order"] == DENSE,
          f"the runtime's device mesh numbers ranks {DENSE_ORDER}", "dayzero runtime"),
    _modules_limit("the runtime", "dayzero runtime models/recompute.py"),
    _no_switch("fp8_param_gather", "the runtime", "has no FP8 parameter storage", "dayzero runtime"),
    _no_switch("optimizer_offload", "the runtime", "keeps the optimizer on the device", "dayzero runtime"),
    _no_activation_offload("the runtime", "keeps saved activations on the device (no activation offload)",
                           "dayzero runtime"),
),  # FSDP2 (runtime/parallel/data_parallel.py apply_fsdp) under torch.distributed.pipelining
    # (runtime/parallel/pipeline.py); its MoE layers send tokens with a plain all-to-all and nothing
    # overlaps it (runtime/parallel/all_to_all.py, expert_parallel.py)
    pipelined_fsdp=True, ep_overlap=False)

# every engine dayzero knows: labels (engines_for), --engine, exports
ALL_ENGINES: dict[str, Engine] = {e.name: e for e in (MEGATRON, MINDSPEED, TORCHTITAN, DEEPSPEED, DAYZERO)}
# the engines an unpinned search keeps a layout for ("some engine runs it"): every one but those made for one
# vendor's accelerators, whose clusters are searched pinned to them (default_engine: Huawei -> MindSpeed)
ENGINES: dict[str, Engine] = {n: e for n, e in ALL_ENGINES.items() if not e.vendors or "nvidia" in e.vendors}


def get_engine(name: str) -> Engine:
    key = name.strip().lower().replace("-core", "").replace("_", "").replace("-", "")
    for e in ALL_ENGINES.values():
        if key in (e.name, e.title.lower().replace("-core", "").replace(" ", "").replace("-", "")):
            return e
    from dayzero.names import did_you_mean

    raise ConfigError("--engine", None, f"unknown engine {name!r}{did_you_mean(name, ALL_ENGINES)}; one of "
                      f"{', '.join(ALL_ENGINES)}")


def engine_problems(engine: Engine | str, parallel: ParallelConfig, switches: dict | None = None) -> list[str]:
    """Why ``engine`` cannot run ``parallel`` as laid out with the run's ``switches`` (:data:`RUN_SWITCHES`
    -> value, :func:`with_run`); empty: it can."""
    e = get_engine(engine) if isinstance(engine, str) else engine
    c = with_run(columns(parallel), switches)

    def value(k):
        return c[k] if k in RUN_SWITCHES else getattr(parallel, k) if hasattr(parallel, k) else c[k]

    return [f"{', '.join(f'{k.replace(chr(95), chr(32))} {value(k)}' for k in lim.reads)}: {lim.says}"
            for lim in e.limits if all(k in c for k in lim.reads) and not bool(lim.ok(c))]


def engines_for(parallel: ParallelConfig, switches: dict | None = None, vendor: str | None = None) -> list[str]:
    """The engines that run ``parallel`` as laid out (with the run's ``switches``), on ``vendor``'s
    accelerators where one is given (:func:`runs_on_vendor`)."""
    return [name for name, e in ALL_ENGINES.items()
            if runs_on_vendor(e, vendor) and not engine_problems(e, parallel, switches)]


def engine_mask(engine: Engine | str, grid: dict, switches: dict | None = None) -> np.ndarray:
    """The rows of ``grid`` ``engine`` can run, judged on the columns present (a limit reading a
    column not yet expanded is applied later, when it is); ``switches``: run-wide values of
    :data:`RUN_SWITCHES` columns (:func:`with_run`)."""
    e = get_engine(engine) if isinstance(engine, str) else engine
    n = len(next(iter(grid.values())))
    grid = with_run(grid, switches)
    ok = np.ones(n, dtype=bool)
    for lim in e.limits:
        if all(k in grid for k in lim.reads):
            ok &= np.broadcast_to(np.asarray(lim.ok(grid), dtype=bool), (n,))
    return ok


def pipelined_fsdp(engine: Engine | str | None = None) -> tuple[int, ...]:
    """The ZeRO stages whose memory under pp > 1 is priced as FSDP under torch.distributed.
    pipelining holds it (MemoryOptions.pipelined_fsdp): every stage for such an ``engine``, none
    for another; without one (an unpinned search, a ``memory`` or ``predict`` of a bare layout)
    the stages that some engine runs with pp > 1 and every engine that does is such an engine,
    so a layout is priced as the engines that run it hold it (today ZeRO-3: torchtitan and the
    runtime; no engine runs ZeRO-2 with pp > 1, Megatron and DeepSpeed run ZeRO-1 as laid out)."""
    if engine:
        return (1, 2, 3) if (get_engine(engine) if isinstance(engine, str) else engine).pipelined_fsdp else ()
    out = []
    for z in (1, 2, 3):
        runs = [e for e in ENGINES.values() if engine_mask(e, {"zero": np.array([z]), "pp": np.array([2])})[0]]
        if runs and all(e.pipelined_fsdp for e in runs):
            out.append(z)
    return tuple(out)
