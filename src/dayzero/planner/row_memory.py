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
3. selective recompute (core attention), then full recompute (Korthikanti et al. 2022: +1 forward).

A stated setting is never changed. When no allowed setting fits, the row keeps the stated (or
default) settings and is reported as not fitting: the memory model, not the run, is then wrong.
"""

from __future__ import annotations

from dataclasses import dataclass

from dayzero.planner.memory import estimate_memory
from dayzero.planner.memory_options import MemoryOptions
from dayzero.specs.cluster import Cluster
from dayzero.specs.model import ModelSpec
from dayzero.specs.parallel import RECOMPUTES, ParallelConfig, zero_shards

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
    kw = {"sharded_params_are_master": not engine.megatron and zero_shards(zero, "weights")}
    if engine.fused_loss:
        kw["logits_bytes"] = FUSED_LOSS_LOGITS_BYTES
    if grad_bytes is not None:
        kw["grad_bytes"] = grad_bytes
    return MemoryOptions.for_run(cluster.accelerator, engine.attention_kernel, **kw)


def _ladder(parallel: ParallelConfig, engine: Engine, recompute_stated: bool) -> list[tuple[str, int | None]]:
    modes = [parallel.recompute] if recompute_stated else list(RECOMPUTES)
    grads = [None, BF16_GRAD_BYTES] if engine.megatron else [None]
    return [(rc, g) for rc in modes for g in grads]


def settle(spec: ModelSpec, parallel: ParallelConfig, cluster: Cluster, engine: Engine,
           recompute_stated: bool) -> Settled:
    """The row's layout with its blank memory settings chosen (module docstring) and its peak fraction."""
    first: Settled | None = None
    for rc, grads in _ladder(parallel, engine, recompute_stated):
        p = parallel.with_(recompute=rc)
        opts = engine_memory(cluster, engine, p.zero, grads)
        frac = estimate_memory(spec, p, cluster.memory_bytes, opts).utilization
        notes = []
        if not recompute_stated:
            notes.append(f"recompute blank: {rc}")
        if grads is not None:
            notes.append("gradient buffer in bf16 (grad_reduce_in_fp32 off, the performance recipes' setting)")
        s = Settled(p, opts, frac, tuple(notes))
        if first is None:
            first = s
        if s.fits:
            return s
    assert first is not None
    return Settled(first.parallel, first.memory, first.fraction,
                   first.assumed + ("no setting the recipe allows fits the predicted peak",))
