"""What a published run kept in device memory, and the settings a row leaves blank, chosen so the run fits.

Every published run ran, so its peak fitted. :func:`settle` predicts the peak of a row's layout
with the memory options the run's engine implies (:func:`engine_memory`), and, where the row
does not state a memory-relevant setting, takes the cheapest one the engine's recipes use that
fits, cheapest meaning least step time:

1. the engine's default gradient buffer, no recompute;
2. Megatron family only: a BF16 gradient buffer (``grad_reduce_in_fp32 = False``), which the
   NeMo and Megatron-Bridge performance scripts set (NVIDIA/NeMo ``scripts/performance``:
   ``recipe.trainer.plugins.grad_reduce_in_fp32 = False``; NVIDIA-NeMo/Megatron-Bridge
   ``scripts/performance/configs/deepseek/deepseek_llm_pretrain.py``: ``cfg.ddp.grad_reduce_in_fp32
   = False``); it costs no time;
3. recompute: of the recompute settings the engine runs that fit, the one with the least predicted
   step time (:func:`recompute_levels`, timed by :func:`dayzero.planner.perf.perf.evaluate` with the
   shipped constants): selective recompute of the attention core, full recompute (Korthikanti et
   al. 2022: +1 forward), and in the Megatron family selective recompute of any set of Megatron-Core's
   recompute modules (``recompute_modules``: moe_act, layernorm, mla_up_proj, mlp, moe, shared_experts,
   core_attn). Megatron-Bridge's MoE performance presets recompute modules, not whole layers
   (NVIDIA-NeMo/Megatron-Bridge ``scripts/performance/configs/deepseek/deepseek_workload_base_configs.py``:
   ``recompute_modules=["mla_up_proj"]`` on GB200, ``["mlp", "moe_act"]`` on GB300 FP8-CS;
   ``kimi/kimi_workload_base_configs.py``: ``["mla_up_proj"]``; ``scripts/moe_model_zoo/examples/qwen3/
   launch_qwen235b.sh``: ``recompute_modules="moe_act layernorm"``), so a run that does not fit
   without recompute pays for the modules it drops, not for a whole forward.

A stated setting is never changed. When no allowed setting fits, the row keeps the stated (or
default) settings and is reported as not fitting: the memory model, not the run, is then wrong.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dayzero.planner.memory.activations import recompute_modules_sets
from dayzero.planner.memory.memory import estimate_memory
from dayzero.planner.memory.memory_options import MemoryOptions
from dayzero.specs.cluster import Cluster
from dayzero.specs.model import ModelSpec
from dayzero.specs.parallel import ParallelConfig, zero_shards

FUSED_LOSS_LOGITS_BYTES = 2  # BF16 logits, gradient in place (Engine.fused_loss)
BF16_GRAD_BYTES = 2  # the engine default is MemoryOptions.grad_bytes: FP32 (Megatron-LM: bf16 implies fp32 grad reduce)


@dataclass(frozen=True)
class Engine:
    """What the framework that ran a row keeps, as far as memory goes."""

    megatron: bool  # Megatron-Core (NeMo, Megatron-Bridge, Megatron-LM): contiguous grad buffer, distributed optimizer
    attention_kernel: str  # the kernel the step runs (PerfOptions.attention_kernel)
    # the loss is a fused cross-entropy on BF16 logits that writes its gradient in place over them
    # (flash-attn's xentropy kernel, "works for bfloat16 and supports in-place backward to save
    # memory": Dao-AILab/flash-attention csrc/xentropy/README.md), so no FP32 copy of the logits;
    # llm-foundry's default (ComposerMPTCausalLM loss_fn='fused_crossentropy',
    # llmfoundry/models/mpt/modeling_mpt.py). Megatron upcasts the logits to FP32 instead.
    fused_loss: bool = False
    # FSDP2 under torch.distributed.pipelining (torchtitan): with pp > 1 ZeRO-2/3 hold gathered
    # parameters and unsharded gradients until the step's end (MemoryOptions.pipelined_fsdp)
    pipelined_fsdp: bool = False


@dataclass(frozen=True)
class Settled:
    parallel: ParallelConfig
    memory: MemoryOptions
    fraction: float  # predicted peak / device memory
    assumed: tuple[str, ...]  # the blank settings chosen, in words

    @property
    def fits(self) -> bool:
        return self.fraction <= 1.0


def engine_memory(cluster: Cluster, engine: Engine, zero: int, grad_bytes: int | None = None) -> MemoryOptions:
    """Memory options of a run: the accelerator's runtime figures, the attention kernel's saved
    tensors, and, outside Megatron, PyTorch FSDP's and MaxText's sharded FP32 parameters that are
    the master weights (torch.distributed.fsdp MixedPrecision docs: the sharded parameters stay in
    full precision, low-precision copies are all-gathered for compute; MaxText ``weight_dtype``
    float32). Megatron's distributed optimizer keeps a separate BF16 working copy."""
    kw = {"sharded_params_are_master": not engine.megatron and zero_shards(zero, "weights"),
          "pipelined_fsdp": (1, 2, 3) if engine.pipelined_fsdp else ()}
    if engine.fused_loss:
        kw["logits_bytes"] = FUSED_LOSS_LOGITS_BYTES
    if grad_bytes is not None:
        kw["grad_bytes"] = grad_bytes
    return MemoryOptions.for_run(cluster.accelerator, engine.attention_kernel, **kw)


def recompute_levels(spec: ModelSpec, parallel: ParallelConfig, engine: Engine) -> list[ParallelConfig]:
    """The recompute settings of ``parallel`` the engine runs, beyond none: selective recompute of
    the attention core, of every
    :func:`~dayzero.planner.memory.activations.recompute_modules_sets` set (Megatron family only:
    ``recompute_modules`` is Megatron-Core's), and full recompute."""
    sets = recompute_modules_sets(spec) if engine.megatron else []
    if ("core_attn",) not in sets:
        sets = [("core_attn",), *sets]
    return [parallel.with_(recompute="selective", recompute_modules=ms) for ms in sets] + \
        [parallel.with_(recompute="full", recompute_modules=())]


def _grads(engine: Engine) -> list[int | None]:
    return [None, BF16_GRAD_BYTES] if engine.megatron else [None]


def _fitting(spec: ModelSpec, p: ParallelConfig, cluster: Cluster, engine: Engine,
             recompute_stated: bool) -> Settled | None:
    """``p`` with the first gradient buffer of the engine's that fits, or None."""
    for grads in _grads(engine):
        opts = engine_memory(cluster, engine, p.zero, grads)
        frac = estimate_memory(spec, p, cluster.memory_bytes, opts).utilization
        if frac <= 1.0:
            return Settled(p, opts, frac, _notes(p, grads, recompute_stated))
    return None


def _notes(p: ParallelConfig, grads: int | None, recompute_stated: bool) -> tuple[str, ...]:
    notes = []
    if not recompute_stated:
        words = p.recompute if p.recompute != "selective" else "selective (" + ", ".join(p.recompute_modules) + ")"
        notes.append(f"recompute blank: {words}")
    if grads is not None:
        notes.append("gradient buffer in bf16 (grad_reduce_in_fp32 off, the performance recipes' setting)")
    return tuple(notes)


def _fastest_first(spec: ModelSpec, layouts: list[ParallelConfig], cluster: Cluster, options) -> list[ParallelConfig]:
    """``layouts`` (one layout under several recompute settings) by predicted step time, fastest
    first (shipped constants; a tie keeps the given order)."""
    from dayzero.planner.perf.perf import PerfOptions, evaluate
    from dayzero.specs.grid import encode

    ev = evaluate(spec, encode(layouts), cluster, options or PerfOptions(), layer_split=layouts[0].layer_split,
                  inventory=False)
    return [layouts[i] for i in np.argsort(ev.step_s, kind="stable")]


def settle(spec: ModelSpec, parallel: ParallelConfig, cluster: Cluster, engine: Engine,
           recompute_stated: bool, options=None) -> Settled:
    """The row's layout with its blank memory settings chosen (module docstring) and its peak
    fraction; ``options``: the row's PerfOptions, which time the recompute settings."""
    first = parallel if recompute_stated else parallel.with_(recompute="none", recompute_modules=())
    found = _fitting(spec, first, cluster, engine, recompute_stated)
    if found is None and not recompute_stated:
        for p in _fastest_first(spec, recompute_levels(spec, parallel, engine), cluster, options):
            found = _fitting(spec, p, cluster, engine, recompute_stated)
            if found is not None:
                break
    if found is not None:
        return found
    opts = engine_memory(cluster, engine, first.zero)
    frac = estimate_memory(spec, first, cluster.memory_bytes, opts).utilization
    return Settled(first, opts, frac,
                   _notes(first, None, recompute_stated) + ("no setting the recipe allows fits the predicted peak",))
