"""DeepSpeed: the config JSON of a plan (what ``deepspeed.runtime.config.DeepSpeedConfig`` parses)
and its launch line, and the reverse.

The JSON holds the batch (``train_batch_size`` = micro-batch x accumulation x dp), ZeRO, bf16,
clipping, AutoTP (``tensor_parallel.autotp_size``), the pipeline stages and the Ulysses degree
(``sequence_parallel_size``, context parallelism by all-to-all: DeepSpeed-Ulysses, Jacobs et al.
2023; the key DeepSpeed's own Ulysses/ALST tests set, tests/unit/ulysses_alst); what DeepSpeed sets
in the model's code instead, the expert-parallel size of ``deepspeed.moe.layer.MoE(ep_size=...)``,
the Ulysses attention wrapper (``deepspeed.sequence.layer.DistributedAttention``, or
``UlyssesSPAttentionHF`` for Hugging Face models) and the sequence length, travels as arguments of
the training script in the launch line.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from dayzero.errors import ConfigError
from dayzero.export.common import Export, integer_setting, require_engine
from dayzero.export.quoting import shell_line
from dayzero.specs.model import ModelSpec
from dayzero.specs.parallel import ParallelConfig

CONFIG_FILE = "ds_config.json"
LAUNCH_FILE = "launch.sh"
MODEL_FILE = "config.json"  # the model's Hugging Face config, for train.py's AutoModelForCausalLM.from_config
TRAIN_SCRIPT = "train.py"


def config(parallel: ParallelConfig, grad_clip: float = 1.0) -> dict:
    p = parallel
    cfg: dict = {
        "train_batch_size": p.gbs, "train_micro_batch_size_per_gpu": p.mbs,
        "gradient_accumulation_steps": p.microbatches, "gradient_clipping": grad_clip,
        "bf16": {"enabled": True},
        # reduce in FP32 as the other engines do for BF16 (DeepSpeed's default communication dtype is the model's)
        "communication_data_type": "fp32",
        "zero_optimization": {"stage": p.zero, "overlap_comm": True, "contiguous_gradients": True},
    }
    if p.tp > 1:
        cfg["tensor_parallel"] = {"autotp_size": p.tp}
    if p.cp > 1:  # Ulysses (cp_comm a2a, the only context parallelism DeepSpeed runs: planner.engines)
        cfg["sequence_parallel_size"] = p.cp
    if p.pp > 1:
        cfg["pipeline"] = {"stages": p.pp, "partition": "parameters",
                           "activation_checkpoint_interval": 1 if p.recompute == "full" else 0}
    elif p.recompute == "full":
        cfg["activation_checkpointing"] = {"partition_activations": False, "contiguous_memory_optimization": False}
    if p.optimizer_offload:  # ZeRO-Offload (planner.memory.offload): the optimizer states and Adam on the CPU
        cfg["zero_optimization"]["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    return cfg


def export(spec: ModelSpec, parallel: ParallelConfig, nodes: int | None = None, devices_per_node: int = 8,
           model_config: dict | None = None) -> Export:
    """The DeepSpeed launch of ``parallel``; ``model_config``: the model's Hugging Face config
    (:func:`dayzero.specs.registry.model_config`), written as ``config.json`` for the training
    script to build with ``AutoModelForCausalLM.from_config`` (DeepSpeed itself has no model
    configuration: it wraps the model the script builds)."""
    require_engine("deepspeed", parallel)
    missing = []
    if parallel.recompute == "selective":
        missing.append("selective recompute (DeepSpeed checkpoints whole layers: recompute full or none)")
    if parallel.layer_split:
        missing.append(f"layer split {parallel.layer_split} (PipelineModule partitions by 'parameters' or 'uniform')")
    if parallel.cp > 1:  # the JSON sets the group; the script wraps its attention and shards the batch
        missing.append(f"Ulysses attention over sequence_parallel_size {parallel.cp}: train.py must wrap its core "
                       "attention in deepspeed.sequence.layer.DistributedAttention (Hugging Face models: "
                       "deepspeed.runtime.sequence_parallel.ulysses_sp.UlyssesSPAttentionHF) and feed each rank "
                       "its 1/cp of every sequence")
    files = {CONFIG_FILE: json.dumps(config(parallel), indent=1) + "\n"}
    if model_config is not None:
        files[MODEL_FILE] = json.dumps(model_config, indent=1) + "\n"
        model = ["--model-config", MODEL_FILE]
    else:
        model = ["--model", spec.name]
        missing.append(f"the model: no Hugging Face config of {spec.name} was given; train.py must build it")
    nnodes = nodes or max(1, parallel.world // devices_per_node)
    command = ["deepspeed", f"--num_nodes={nnodes}", f"--num_gpus={parallel.world // nnodes}",
               *script_args(parallel, model)]
    files[LAUNCH_FILE] = ("#!/bin/sh\n# train.py: your DeepSpeed script; --ep-size goes to "
                          "deepspeed.moe.layer.MoE(ep_size=...)\n" + shell_line(command, "a DeepSpeed argument") + "\n")
    return Export("deepspeed", files, command, missing)


def script_args(parallel: ParallelConfig, model: list[str]) -> list[str]:
    """The training script and its arguments: the config, the sequence length and the EP size DeepSpeed
    sets in the model's code, and the model."""
    return [TRAIN_SCRIPT, "--deepspeed_config", CONFIG_FILE, "--seq-length", str(parallel.seq),
            "--ep-size", str(parallel.ep), *model]


def parallel_from_config(cfg: dict, world: int, seq: int = 4096, ep: int = 1) -> ParallelConfig:
    """A DeepSpeed config (and the launch line's sequence length and expert-parallel size) on
    ``world`` ranks -> ParallelConfig."""
    def num(key, sub=None, default=None):
        where = f"{sub + '.' if sub else ''}{key}"
        section = cfg.get(sub) if sub else cfg
        if section is None or section is False:
            return default
        if not isinstance(section, dict):
            raise ConfigError("deepspeed config", sub, f"expected an object, got {section!r}")
        v = section.get(key, default)
        if v == "auto" or v is None:
            return default
        return integer_setting("deepspeed config", where, v, minimum=0)

    tp = num("autotp_size", "tensor_parallel", 1) or 1  # 0: DeepSpeed's "no tensor parallelism"
    pp = num("stages", "pipeline", 1) or 1
    cp = num("sequence_parallel_size", None, 1) or 1  # Ulysses: context parallelism by all-to-all
    if world % (tp * pp * cp):
        raise ConfigError("deepspeed config", None, f"{world} ranks are not divisible by tp*pp*sequence_parallel_size "
                                                    f"= {tp * pp * cp}")
    dp = world // (tp * pp * cp)
    mbs = num("train_micro_batch_size_per_gpu", None, 1)
    gbs = num("train_batch_size", None, None) or mbs * dp * num("gradient_accumulation_steps", None, 1)
    full = ("activation_checkpointing" in cfg) or num("activation_checkpoint_interval", "pipeline", 0) > 0
    offload = (cfg.get("zero_optimization") or {}).get("offload_optimizer") or {}
    return ParallelConfig(tp=tp, pp=pp, dp=dp, cp=cp, cp_comm="a2a", ep=ep, mbs=mbs, gbs=gbs, seq=seq,
                          zero=num("stage", "zero_optimization", 0), recompute="full" if full else "none",
                          optimizer_offload=isinstance(offload, dict) and offload.get("device") == "cpu")


def import_file(path: str | Path, world: int) -> tuple[ParallelConfig, list[str]]:
    """``ds_config.json`` (with ``launch.sh`` beside it, when there, for --seq-length and --ep-size)."""
    from dayzero.inputs import load_json, read_text

    cfg = load_json(path, "a DeepSpeed config JSON")
    if not isinstance(cfg, dict) or "zero_optimization" not in cfg and "train_batch_size" not in cfg:
        raise ConfigError(str(path), None, "not a DeepSpeed config (no zero_optimization or train_batch_size)")
    seq, ep, notes = 4096, 1, []
    launch = Path(path).with_name(LAUNCH_FILE)
    if launch.exists():
        words = shlex.split(read_text(launch), comments=True)
        for flag in ("--seq-length", "--ep-size"):
            if flag in words and words.index(flag) + 1 < len(words):
                value = int(words[words.index(flag) + 1])
                seq, ep = (value, ep) if flag == "--seq-length" else (seq, value)
    else:
        notes.append(f"no {LAUNCH_FILE} beside it: seq 4096 and ep 1 assumed")
    known = {"train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "gradient_clipping",
             "bf16", "fp16", "communication_data_type", "zero_optimization", "tensor_parallel", "pipeline",
             "activation_checkpointing", "sequence_parallel_size"}
    notes += [f"{k}: not a layout setting, not read" for k in cfg if k not in known]
    return parallel_from_config(cfg, world, seq, ep), notes
