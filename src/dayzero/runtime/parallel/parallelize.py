"""``parallelize``: the whole parallel system in one function, applied in a fixed order.

    pipeline split -> tensor/sequence parallel (+ expert parallel) -> context parallel
    -> activation checkpointing -> FSDP2 (ZeRO + mixed precision)
    -> materialize (to_empty + deterministic weights)

The model arrives on the meta device and knows nothing about parallelism; each ``apply_*``
lives in its own module. Weights are written last, shard by shard, from a function of the
parameter's name, so every layout starts from exactly the same model.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch
from torch import nn
from torch.distributed.tensor import DTensor, distribute_tensor

from dayzero.runtime.models.model import Transformer, initial_value
from dayzero.runtime.models.recompute import apply_activation_checkpointing
from dayzero.runtime.parallel.context_parallel import apply_context_parallel
from dayzero.runtime.parallel.data_parallel import apply_fsdp
from dayzero.runtime.parallel.expert_parallel import apply_expert_parallel
from dayzero.runtime.parallel.mesh import Meshes
from dayzero.runtime.parallel.pipeline import split_stages
from dayzero.runtime.parallel.tensor_parallel import apply_tensor_parallel

# fqn, full shape -> the full tensor (fp32, any device)
WeightSource = Callable[[str, tuple[int, ...]], torch.Tensor]


@dataclass
class ParallelModel:
    """This rank's share of the model: one part per (virtual) pipeline stage it runs."""

    parts: list[nn.Module]
    stage_indices: list[int]
    fsdp_units: list
    # a derived model's input/output matrix shared across its pipeline stages: the copy each part holds
    # (runtime.parallel.hf_stages.reduce_tied sums their gradients over the pipeline ranks)
    tied: list = field(default_factory=list)

    def parameters(self):
        for p in self.parts:
            yield from p.parameters()

    def named_parameters(self):
        for p in self.parts:
            yield from p.named_parameters()

    def train(self, mode: bool = True):
        for p in self.parts:
            p.train(mode)


def parallelize(model: Transformer, meshes: Meshes, device: torch.device, param_dtype: torch.dtype,
                weights: WeightSource, buffers: WeightSource | None = None, placement=None) -> ParallelModel:
    """``placement``: a ``dayzero.specs.placement.Placement`` for the expert-parallel dispatcher."""
    parallel, spec = meshes.parallel, model.spec
    if parallel.pp > 1:
        staged = split_stages(model, spec, parallel, meshes.pp_rank)
    else:
        staged = [(0, model)]
    units = []
    for _, part in staged:
        if parallel.tp > 1:
            apply_tensor_parallel(part, meshes.tp, parallel.sequence_parallel)
        if spec.is_moe:
            apply_expert_parallel(part, meshes.ep, placement)
        if parallel.cp > 1:
            apply_context_parallel(part, meshes, parallel.seq)
        apply_activation_checkpointing(part, parallel.recompute, parallel.recompute_layers)
        # FSDP2 has nothing to do when no rank of the stage shares a parameter and no dtype is
        # cast (one rank per stage, fp32): skipping it there saves copying every parameter and
        # gradient through one-rank collectives each step
        if meshes.shape.stage > 1 or param_dtype != torch.float32:
            units += apply_fsdp(part, meshes, param_dtype, parallel.zero, gloo=device.type == "cpu")
        materialize(part, device, weights, buffers)
    return ParallelModel([p for _, p in staged], [v for v, _ in staged], units)


def seeded_weights(seed: int, device: torch.device) -> WeightSource:
    return lambda fqn, shape: initial_value(fqn, shape, seed, device)


@torch.no_grad()
def materialize(part: Transformer, device: torch.device, weights: WeightSource,
                buffers: WeightSource | None = None) -> None:
    """Allocate this rank's shards and fill each with its slice of the full tensor."""
    part.to_empty(device=device)
    part.init_buffers()
    for fqn, p in part.named_parameters():
        write_full(p, weights(fqn, tuple(p.shape)))
    if buffers is not None:
        for fqn, b in part.named_buffers():
            if fqn.endswith("e_score_correction_bias"):
                b.copy_(buffers(fqn, tuple(b.shape)))


def write_full(param: torch.Tensor, full: torch.Tensor) -> None:
    """Copy this rank's shard of ``full`` into ``param`` (a DTensor of any placements, or a plain
    tensor). No communication: every rank computes the same full tensor."""
    if isinstance(param, DTensor):
        local = distribute_tensor(full.to(param.device, param.dtype), param.device_mesh, param.placements,
                                  src_data_rank=None).to_local()
        param.to_local().copy_(local)
    else:
        param.copy_(full)
