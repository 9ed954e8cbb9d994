"""The runtime as the planner sees it: the ZeRO stage FSDP2 really has for a layout, the model the
runtime builds, and the bytes it keeps (the planner's MemoryOptions for a run of the runtime).
:mod:`dayzero.runtime.memory_check` checks a run's fit with them before any process starts;
:mod:`dayzero.validate.predicted` times the run with them. No torch import.

Memory follows FSDP2 as ``runtime.parallel.data_parallel`` applies it: sharded parameters in fp32
(the master weights, counted in ``optimizer``), gathered parameters in the compute dtype
(``weights``), fp32 gradients, AdamW moments in fp32, logits upcast to fp32 for the loss.
"""

from __future__ import annotations

from dataclasses import replace

from dayzero.planner.engines import DAYZERO, pipelined_fsdp
from dayzero.planner.memory.memory_options import MemoryOptions
from dayzero.planner.memory.params import layer_params
from dayzero.planner.schedule import held_zero
from dayzero.specs.cluster import Cluster
from dayzero.specs.model import ModelSpec
from dayzero.specs.parallel import ParallelConfig

BYTES = {"fp32": 4, "bf16": 2}  # bytes per element of the runtime's compute dtypes


def runtime_layout(parallel: ParallelConfig) -> ParallelConfig:
    """The ZeRO stage whose memory and traffic the runtime's FSDP2 really has for this layout.

    * Pipelining (torch.distributed.pipelining) runs every backward without gradient sync or
      reshard and reduces once at the end: full gradients and gathered parameters, as ZeRO-1
      (:func:`dayzero.planner.schedule.held_zero`, the rule the memory model applies under
      MemoryOptions.pipelined_fsdp; here for the traffic too: no per-micro-batch reduce-scatter).
    * ZeRO-1 with a single micro-batch syncs on that micro-batch: sharded gradients, as ZeRO-2.
    """
    held = int(held_zero(parallel.zero, parallel.pp, pipelined_fsdp(DAYZERO)))
    if held != parallel.zero:
        return parallel.with_(zero=held)
    if parallel.zero == 1 and parallel.microbatches == 1:
        return parallel.with_(zero=2)
    return parallel


def runtime_spec(spec: ModelSpec) -> ModelSpec:
    """The model the runtime builds: no multi-token-prediction modules (runtime.models.model
    trains the decoder stack and one head), so the planner's MTP layer, embedding copy and second
    head (ModelSpec.mtp_layers) are dropped before comparing with it."""
    return replace(spec, mtp_layers=0) if spec.mtp_layers else spec


def largest_unit(spec: ModelSpec, parallel: ParallelConfig) -> float:
    """Parameters of the largest FSDP2 unit (a decoder block) on one rank: what one
    reduce-scatter of gradients carries."""
    kv = spec.attention.kv_heads
    return max(layer_params(spec, k).local_dense(parallel.tp, kv) + layer_params(spec, k).local_expert(parallel.ep,
                                                                                                       parallel.etp)
               for k in set(spec.layer_kinds))


def memory_options(cluster: Cluster | None, compute_dtype: str, spec: ModelSpec | None = None,
                   parallel: ParallelConfig | None = None, device: str = "cpu") -> MemoryOptions:
    """The runtime's bytes: FSDP2 mixed precision, eager kernels, per-block gradient reduce-scatter.
    SDPA's CPU flash kernel needs equal q/k and v head dims; MLA (v narrower) falls back to the
    math kernel, which saves the score matrix."""
    b = BYTES[compute_dtype]
    kw = dict(param_bytes=b, master_bytes=4, grad_bytes=4, optim_bytes=8, act_bytes=b, fp8_act_bytes=b,
              logits_bytes=4, kernels="eager", sharded_params_are_master=True,
              pipelined_fsdp=pipelined_fsdp(DAYZERO))
    if spec is not None:
        a = spec.attention
        if device == "cpu" and a.head_dim != a.v_head_dim:
            kw["attention"] = "eager"
        if parallel is not None:
            kw["grad_bucket_params"] = int(largest_unit(spec, parallel))
    return MemoryOptions.for_accelerator(cluster.accelerator, **kw) if cluster is not None else MemoryOptions(**kw)
