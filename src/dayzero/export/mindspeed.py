"""MindSpeed-LLM: the ``pretrain_gpt.py`` argument list of a plan for Ascend NPUs, its launch script
for an Atlas A2/A3 node, and the reverse (a MindSpeed-LLM launch script -> ParallelConfig).

MindSpeed-LLM runs Megatron-LM's ``pretrain_gpt.py`` with MindSpeed-Core's patches for torch_npu,
so its arguments are Megatron's (the model hyperparameters come from
:func:`dayzero.export.megatron.model_args`, the same completeness as ``--to megatron``) plus
MindSpeed's. Every MindSpeed flag written here was read in its definition (github.com/Ascend/
MindSpeed at 028de58, gitcode.com/Ascend/MindSpeed upstream) and in MindSpeed-LLM's recipes
(github.com/Ascend/MindSpeed-LLM at c77308a, examples/mcore/*):

* the token dispatcher ``--moe-token-dispatcher-type alltoall`` (no DeepEP) and the EP overlap
  ``--moe-fb-overlap`` (mindspeed/features_manager/moe/fb_overlap.py: ep > 1, etp 1, and no
  pipeline, a virtual pipeline or DualPipeV), priced as the planner priced it
  (planner.comm.ep_overlapped; DualPipeV overlaps by construction);
* DualPipeV ``--schedules-method dualpipev`` (features_manager/pipeline_parallel/dualpipev_feature.py);
* context parallelism ``--context-parallel-algo ulysses_cp_algo`` (a2a) or ``megatron_cp_algo``
  (the ring, p2p; mindspeed/arguments.py _add_cp_args);
* the fused kernels ``--use-fused-rmsnorm``, ``--use-fused-swiglu``, ``--use-fused-rotary-pos-emb``
  (mindspeed/arguments.py _add_network_size_args) and ``--use-flash-attn`` (Megatron-LM's flag,
  which MindSpeed serves with torch_npu's fused attention), written where the model has the op;
* memory: ``--swap-optimizer`` for the whole-optimizer offload (features_manager/optimizer/
  swap_optimizer_feature.py, with ``--use-distributed-optimizer``), ``--recompute-activation-function``
  and ``--recompute-norm`` for selective recompute of the activation and the norms
  (mindspeed/arguments.py _add_recompute_args).

The launch (``pretrain_mindspeed.sh``) follows MindSpeed-LLM's A3 recipe
(examples/mcore/deepseek3/pretrain_deepseek3_671b_4k_A3_ptd.sh): the CANN toolkit's ``set_env.sh``,
its HCCL timeouts and task-queue settings, torchrun with 16 ranks per A3 node (one per 910C die) or
8 per A2 node, and an HCCL rank table where one is given.
"""

from __future__ import annotations

import argparse
import functools
import re
import shlex
from pathlib import Path

from dayzero.errors import ConfigError
from dayzero.export.common import Export, integer_setting, require_engine
from dayzero.export.megatron import MODEL_FLAGS, model_args
from dayzero.export.quoting import Ref, argument_lines, comment, shell_line, shell_word
from dayzero.planner.perf.comm import CommOptions, ep_overlapped
from dayzero.specs.grid import columns
from dayzero.specs.model import ModelSpec
from dayzero.specs.parallel import ParallelConfig

ARGS_FILE = "mindspeed_args.txt"
SCRIPT_FILE = "pretrain_mindspeed.sh"
CP_ALGO = {"a2a": "ulysses_cp_algo", "p2p": "megatron_cp_algo"}  # mindspeed/arguments.py _add_cp_args
# selective recompute: dayzero's module -> MindSpeed's flag (mindspeed/arguments.py _add_recompute_args);
# the attention core is Megatron's --recompute-granularity selective
RECOMPUTE_FLAGS = {"moe_act": "--recompute-activation-function", "layernorm": "--recompute-norm"}
# the environment of MindSpeed-LLM's A3 recipe (pretrain_deepseek3_671b_4k_A3_ptd.sh): one device
# connection per stream as Megatron asks, CPU binding, the task-queue level, the expandable allocator,
# HCCL timeouts of an hour for a large job's start and its longest collective
ENV = (("CUDA_DEVICE_MAX_CONNECTIONS", "1"), ("CPU_AFFINITY_CONF", "1"), ("TASK_QUEUE_ENABLE", "2"),
       ("PYTORCH_NPU_ALLOC_CONF", "expandable_segments:True"), ("HCCL_CONNECT_TIMEOUT", "3600"),
       ("HCCL_EXEC_TIMEOUT", "3600"))
SET_ENV = "/usr/local/Ascend/ascend-toolkit/set_env.sh"  # the CANN toolkit's default install path (export.job)


def fb_overlap(p: ParallelConfig) -> bool:
    """Whether the export writes ``--moe-fb-overlap``: the EP overlap the planner priced
    (planner.comm.ep_overlapped; DualPipeV by construction) under MindSpeed's conditions
    (fb_overlap.py validate_args: ep > 1, etp 1, pp 1 or a virtual pipeline or DualPipeV)."""
    if p.ep <= 1 or p.etp != 1:
        return False
    if p.schedule == "dualpipev":
        return True
    return (p.pp == 1 or p.vpp > 1) and ep_overlapped(columns(p), CommOptions())[()] > 0


def layout_args(p: ParallelConfig, layers: int) -> tuple[list[str], list[str]]:
    """The flags that state the layout, batch, precision and memory options, and what they cannot say."""
    a: list = ["--tensor-model-parallel-size", p.tp, "--pipeline-model-parallel-size", p.pp,
               "--context-parallel-size", p.cp, "--expert-model-parallel-size", p.ep,
               "--expert-tensor-parallel-size", p.etp, "--micro-batch-size", p.mbs, "--global-batch-size", p.gbs,
               "--seq-length", p.seq, "--bf16", "--use-distributed-optimizer" if p.zero == 1 else None]
    missing = []
    if p.cp > 1:
        a += ["--context-parallel-algo", CP_ALGO[p.cp_comm]]
    if p.schedule == "dualpipev":
        a += ["--schedules-method", "dualpipev"]
    elif p.vpp > 1:  # Megatron-LM 0.12 (MindSpeed-LLM's base): layers per virtual stage
        if layers % (p.pp * p.vpp):
            missing.append(f"{layers} layers over {p.pp * p.vpp} virtual stages unevenly (MindSpeed-LLM takes "
                           "--num-layers-per-virtual-pipeline-stage, one count for every stage)")
        a += ["--num-layers-per-virtual-pipeline-stage", max(1, layers // (p.pp * p.vpp))]
    if p.sequence_parallel:
        a.append("--sequence-parallel")
    if p.recompute == "selective":
        mods = tuple(p.recompute_modules) or ("core_attn",)
        if "core_attn" in mods:
            a += ["--recompute-granularity", "selective"]
        a += [RECOMPUTE_FLAGS[m] for m in mods if m in RECOMPUTE_FLAGS]
    elif p.recompute == "full":
        a += ["--recompute-granularity", "full", "--recompute-method",
              "block" if p.recompute_layers is not None else "uniform", "--recompute-num-layers",
              p.recompute_layers if p.recompute_layers is not None else 1]
    if p.optimizer_offload:
        a.append("--swap-optimizer")
    if p.layer_split:
        missing.append(f"layer split {p.layer_split} (MindSpeed-LLM splits evenly; its --noop-layers pad a "
                       "stage instead)")
    return [str(x) for x in a if x is not None], missing


def kernel_args(spec: ModelSpec) -> list[str]:
    """MindSpeed's fused kernels for the ops the model has (mindspeed/arguments.py
    _add_network_size_args) and flash attention (torch_npu's fused attention behind Megatron's
    ``--use-flash-attn``)."""
    a = ["--use-flash-attn"]
    if spec.norm == "rmsnorm":
        a.append("--use-fused-rmsnorm")
    if spec.mlp.gated and spec.mlp.activation == "silu":
        a.append("--use-fused-swiglu")
    if spec.position == "rope":
        a.append("--use-fused-rotary-pos-emb")
    return a


def arguments(spec: ModelSpec, parallel: ParallelConfig) -> tuple[list[str], list[str]]:
    """(the ``pretrain_gpt.py`` argument list, what it cannot say), without a search: the one list
    both the export and the no-CUDA-flag test build."""
    require_engine("mindspeed", parallel)
    margs, missing = model_args(spec, parallel, vendor="huawei", ep_overlap_flag=None)
    largs, lmissing = layout_args(parallel, spec.layers)
    args = margs + largs + kernel_args(spec)
    if spec.is_moe and fb_overlap(parallel):
        args.append("--moe-fb-overlap")
    return args, missing + lmissing


def script(args: list[str], nnodes: int, per_node: int, rank_table: str | None = None) -> str:
    """The launch of one node: CANN's environment, HCCL's settings, torchrun over the node's ranks."""
    lines = ["#!/bin/bash", comment("MindSpeed-LLM pretraining (dayzero export --to mindspeed); run from "
                                    "MindSpeed-LLM's checkout on every node with NODE_RANK and MASTER_ADDR set"),
             "set -euo pipefail",
             f'source "${{CANN_SET_ENV:-{SET_ENV}}}"']
    lines += [f"export {k}={shell_word(v)}" for k, v in ENV]
    if rank_table:
        lines.append(f"export RANK_TABLE_FILE={shell_word(rank_table, '--rank-table')}")
    lines += [f"NNODES={nnodes}", f"NPUS_PER_NODE={per_node}", ': "${NODE_RANK:?set NODE_RANK}"',
              ': "${MASTER_ADDR:?set MASTER_ADDR}"', 'MASTER_PORT="${MASTER_PORT:-6000}"']
    launch = ["torchrun", Ref("--nproc-per-node=$NPUS_PER_NODE"), Ref("--nnodes=$NNODES"),
              Ref("--node-rank=$NODE_RANK"), Ref("--master-addr=$MASTER_ADDR"), Ref("--master-port=$MASTER_PORT"),
              "pretrain_gpt.py"]
    expand = frozenset(("NPUS_PER_NODE", "NNODES", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT"))
    body = argument_lines(args, "a MindSpeed argument").rstrip("\n").split("\n")
    lines.append(shell_line(launch, "the launch", expand) + " \\")
    lines += [f"    {x} \\" for x in body[:-1]] + [f"    {body[-1]}"]
    return "\n".join(lines) + "\n"


def export(spec: ModelSpec, parallel: ParallelConfig, nodes: int | None = None, devices_per_node: int = 16,
           rank_table: str | None = None) -> Export:
    """``devices_per_node``: 16 on an Atlas A3 node (one rank per 910C die), 8 on an Atlas 800T A2."""
    args, missing = arguments(spec, parallel)
    nnodes = nodes or max(1, parallel.world // devices_per_node)
    per_node = parallel.world // nnodes
    command = ["bash", SCRIPT_FILE]
    return Export("mindspeed", {ARGS_FILE: argument_lines(args, "a MindSpeed argument"),
                                SCRIPT_FILE: script(args, nnodes, per_node, rank_table)}, command, missing)


# -- import -------------------------------------------------------------------------------------

class _Parser(argparse.ArgumentParser):
    def error(self, message: str):
        raise ConfigError("mindspeed arguments", None, f"{message}; fix the launch script") from None


def _parser() -> argparse.ArgumentParser:
    ap = _Parser(add_help=False, allow_abbrev=False)
    integer = functools.partial(integer_setting, "mindspeed arguments")
    for flag, default in (("--tensor-model-parallel-size", 1), ("--pipeline-model-parallel-size", 1),
                          ("--context-parallel-size", 1), ("--expert-model-parallel-size", 1),
                          ("--expert-tensor-parallel-size", None), ("--micro-batch-size", 1),
                          ("--global-batch-size", None), ("--seq-length", 4096), ("--num-layers", None),
                          ("--num-layers-per-virtual-pipeline-stage", None), ("--recompute-num-layers", None)):
        ap.add_argument(flag, type=functools.partial(integer, flag), default=default)
    for flag in ("--sequence-parallel", "--use-distributed-optimizer", "--swap-optimizer",
                 "--recompute-activation-function", "--recompute-norm", "--bf16", "--fp16"):
        ap.add_argument(flag, action="store_true")
    ap.add_argument("--recompute-granularity", default=None)
    ap.add_argument("--recompute-method", default=None)
    ap.add_argument("--context-parallel-algo", default="ulysses_cp_algo")
    ap.add_argument("--schedules-method", default=None)
    ap.add_argument("--noop-layers", default=None)
    return ap


def parallel_from_args(argv: list[str], world: int) -> tuple[ParallelConfig, list[str]]:
    """A MindSpeed-LLM argument list -> (ParallelConfig on ``world`` ranks, notes on what was not read)."""
    ns, rest = _parser().parse_known_args(argv)
    tp, pp, cp = ns.tensor_model_parallel_size, ns.pipeline_model_parallel_size, ns.context_parallel_size
    if world % (tp * pp * cp):
        raise ConfigError("mindspeed arguments", "world", f"{world} ranks are not divisible by tp*pp*cp = "
                                                          f"{tp * pp * cp}")
    comm = {v: k for k, v in CP_ALGO.items()}.get(ns.context_parallel_algo)
    if cp > 1 and comm is None:
        raise ConfigError("mindspeed arguments", "--context-parallel-algo", f"{ns.context_parallel_algo}: dayzero "
                          "models ulysses_cp_algo (a2a) and megatron_cp_algo (the ring); give one of them")
    notes = []
    if ns.fp16:
        notes.append("--fp16: read as bf16 (dayzero prices 16-bit GEMMs alike)")
    if ns.noop_layers:
        notes.append(f"--noop-layers {ns.noop_layers}: empty layers padding a pipeline stage, not priced")
    schedule, vpp = "1f1b", 1
    if ns.schedules_method == "dualpipev":
        schedule, vpp = "dualpipev", 2
    elif ns.schedules_method is not None:
        raise ConfigError("mindspeed arguments", "--schedules-method", f"{ns.schedules_method}: MindSpeed's only "
                          "schedule method is dualpipev")
    elif ns.num_layers_per_virtual_pipeline_stage:
        if not ns.num_layers:
            raise ConfigError("mindspeed arguments", "--num-layers", "the virtual pipeline's chunk count needs "
                              "--num-layers with --num-layers-per-virtual-pipeline-stage")
        vpp = max(1, ns.num_layers // (pp * ns.num_layers_per_virtual_pipeline_stage))
        schedule = "interleaved" if vpp > 1 else "1f1b"
    recompute, modules, layers = "none", (), None
    if ns.recompute_granularity == "full":
        recompute = "full"
        layers = ns.recompute_num_layers if ns.recompute_method == "block" else None
    elif ns.recompute_granularity == "selective" or ns.recompute_activation_function or ns.recompute_norm:
        recompute = "selective"
        modules = tuple(m for m, on in (("core_attn", ns.recompute_granularity == "selective"),
                                        ("moe_act", ns.recompute_activation_function),
                                        ("layernorm", ns.recompute_norm)) if on)
    p = ParallelConfig(tp=tp, pp=pp, dp=world // (tp * pp * cp), cp=cp, cp_comm=comm or "p2p",
                       ep=ns.expert_model_parallel_size, etp=ns.expert_tensor_parallel_size or 1, vpp=vpp,
                       schedule=schedule, mbs=ns.micro_batch_size, gbs=ns.global_batch_size or 0, seq=ns.seq_length,
                       zero=1 if ns.use_distributed_optimizer else 0, recompute=recompute,
                       recompute_modules=modules, recompute_layers=layers, sequence_parallel=ns.sequence_parallel,
                       precision="bf16", optimizer_offload=ns.swap_optimizer)
    unread = [w for w in rest if w.startswith("--") and w not in MODEL_FLAGS and w not in MINDSPEED_ONLY]
    return p, notes + [f"{flag}: not a layout or architecture flag, not read" for flag in unread]


# flags the importer knows and deliberately leaves (kernels and overlaps: the engine's, not the layout's;
# --use-mcore-models: MindSpeed-LLM builds Megatron-Core models unless --use-legacy-models,
# mindspeed_llm/features_manager/megatron_basic/training_basic.py)
MINDSPEED_ONLY = frozenset(("--use-flash-attn", "--use-fused-rmsnorm", "--use-fused-swiglu",
                            "--use-fused-rotary-pos-emb", "--use-mcore-models", "--moe-fb-overlap",
                            "--num-layers"))

_ASSIGN = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$", re.S)
_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}|\$([A-Za-z_][A-Za-z0-9_]*)")


def script_arguments(text: str) -> list[str]:
    """The ``pretrain_gpt.py`` arguments of a MindSpeed-LLM launch script: its ``NAME=value``
    assignments (the recipes' TP=2, GPT_ARGS="...") expanded into the words after the script, up to
    a pipe; a bare argument file (flags only) is read as it is."""
    words = shlex.split(text, comments=True)
    env: dict[str, str] = {}

    def expand(w: str) -> str:
        return _REF.sub(lambda m: env.get(m.group(1) or m.group(2), m.group(0)), w)

    for i, w in enumerate(words):
        m = _ASSIGN.match(w)
        if m and not w.startswith("--"):
            env[m.group(1)] = expand(m.group(2))
        elif w.endswith(".py"):
            out = []
            for x in words[i + 1:]:
                if x in ("|", "||", "&&", ";", "&"):
                    break
                out += expand(x).split() if x.startswith("$") else [expand(x)]
            return out
    return [expand(w) for w in words]


def import_file(path: str | Path, world: int | None = None) -> tuple[ParallelConfig, list[str]]:
    from dayzero.inputs import read_text

    if world is None:
        raise ConfigError("mindspeed arguments", "world", "the data-parallel degree needs the world size; give "
                          "--devices N (the ranks the job runs on)")
    argv = script_arguments(read_text(path, "a MindSpeed-LLM launch script or argument list"))
    return parallel_from_args(argv, world)
