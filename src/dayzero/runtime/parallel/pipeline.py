"""Pipeline parallelism with ``torch.distributed.pipelining``: the model is cut into
``pp * vpp`` virtual stages by the plan's layer split (uneven splits allowed); virtual stage ``v``
runs on pipeline rank ``v % pp`` (Megatron's interleaved placement, Narayanan et al. 2021).

    schedule     vpp == 1           vpp > 1
    1f1b         Schedule1F1B       ScheduleInterleaved1F1B
    interleaved  Schedule1F1B       ScheduleInterleaved1F1B
    gpipe        ScheduleGPipe      ScheduleLoopedBFS (GPipe order over looped stages)
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from torch import nn
from torch.distributed.pipelining import (
    PipelineStage,
    Schedule1F1B,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
    ScheduleLoopedBFS,
)

from dayzero.runtime.models.model import Transformer
from dayzero.specs.model import ModelSpec
from dayzero.specs.parallel import ParallelConfig


def split_stages(model: Transformer, spec: ModelSpec, parallel: ParallelConfig,
                 pp_rank: int) -> list[tuple[int, Transformer]]:
    """(virtual stage index, stage module) for every virtual stage on ``pp_rank``. Each stage is
    a copy of the (meta) model keeping only its layers; the first keeps the embedding, the last
    the final norm and head. Parameter names are unchanged."""
    ranges = parallel.stage_layers(spec)
    last = len(ranges) - 1
    parts = []
    for v in range(pp_rank, len(ranges), parallel.pp):
        part = copy.deepcopy(model)
        keep = {str(i) for i in ranges[v]}
        for name in list(part.layers.keys()):
            if name not in keep:
                del part.layers[name]
        if v != 0:
            part.tok_embeddings = part.pos_embeddings = None
        if v != last:
            part.norm = part.output = None
        parts.append((v, part))
    return parts


@dataclass
class Pipeline:
    schedule: object
    has_first: bool  # this rank runs stage 0 (feeds token ids)
    has_last: bool  # this rank runs the last stage (computes the loss)

    def step(self, inputs: torch.Tensor, labels: torch.Tensor) -> list:
        """One forward+backward over all micro-batches; returns the last stage's per-micro-batch
        losses (empty elsewhere)."""
        losses: list = []
        args = (inputs,) if self.has_first else ()
        target = labels if self.has_last else None
        self.schedule.step(*args, target=target, losses=losses, return_outputs=False)
        return losses


def build_pipeline(parts: list[tuple[int, nn.Module]], parallel: ParallelConfig, pp_group,
                   device: torch.device, loss_fn) -> Pipeline:
    stages_total = parallel.pp * parallel.vpp
    stages = [PipelineStage(m, v, stages_total, device, group=pp_group) for v, m in parts]
    n = parallel.microbatches
    # loss_fn already divides by the micro-batch count, as the non-pipelined loop does
    if parallel.vpp == 1:
        cls = ScheduleGPipe if parallel.schedule == "gpipe" else Schedule1F1B
        schedule = cls(stages[0], n, loss_fn=loss_fn, scale_grads=False)
    else:
        cls = ScheduleLoopedBFS if parallel.schedule == "gpipe" else ScheduleInterleaved1F1B
        schedule = cls(stages, n, loss_fn=loss_fn, scale_grads=False)
    indices = [v for v, _ in parts]
    return Pipeline(schedule, 0 in indices, stages_total - 1 in indices)
